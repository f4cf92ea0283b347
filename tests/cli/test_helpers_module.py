"""Issue 12: `rewrite --helpers-module PATH` puts the helpers a repository needs into one module, imported by
every rewritten file, instead of pasting the same functions into each file."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from cli_support import cli

pytest.importorskip("torch")  # the rewritten files are run: their helpers use torch.distributed

# Three library files that each need the same helpers (no process group in sight: rank and master_print stay
# guarded helpers), with first-party and relative imports, so the new import has to find its section.
FILES = {
    "train_a.py": '''"""Library A."""
import os

import torch
import torch_xla.core.xla_model as xm

from pkg import util


def report(loss):
    xm.master_print(f"A rank {xm.get_ordinal()} loss {util.twice(loss):.3f}")
    return os.sep
''',
    "train_b.py": '''import torch_xla.core.xla_model as xm


def report(step):
    xm.master_print("B step", step, "rank", xm.get_ordinal())
''',
    "pkg/__init__.py": "",
    "pkg/util.py": "def twice(x):\n    return 2 * x\n",
    "pkg/evaluate.py": '''import sys

import torch_xla.core.xla_model as xm

from . import util


def evaluate(acc):
    xm.master_print("C acc", util.twice(acc), "rank", xm.get_ordinal(), fd=sys.stdout)
''',
}

EXPECTED_A = '''"""Library A."""
import os

import torch

from nm_helpers import _neuron_master_print, _neuron_rank
from pkg import util


def report(loss):
    _neuron_master_print(f"A rank {_neuron_rank()} loss {util.twice(loss):.3f}")
    return os.sep
'''
EXPECTED_B = '''from nm_helpers import _neuron_master_print, _neuron_rank


def report(step):
    _neuron_master_print("B step", step, "rank", _neuron_rank())
'''
EXPECTED_C = '''import sys

from nm_helpers import _neuron_master_print, _neuron_rank

from . import util


def evaluate(acc):
    _neuron_master_print("C acc", util.twice(acc), "rank", _neuron_rank(), fd=sys.stdout)
'''

RUN = "import train_a, train_b; from pkg import evaluate; train_a.report(0.5); train_b.report(3); evaluate.evaluate(2)"


@pytest.fixture
def repo(tmp_path, monkeypatch):
    (tmp_path / ".git").mkdir()
    for name, text in FILES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _defined(text: str) -> Counter:
    return Counter(n.name for n in ast.parse(text).body if isinstance(n, (ast.FunctionDef, ast.ClassDef)))


def _run(repo: Path, code: str, rank: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "PYTHONPATH")}
    env.update(PYTHONPATH=str(repo), RANK=rank)
    p = subprocess.run([sys.executable, "-c", code], cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def _snapshot(repo: Path) -> dict:
    return {p.relative_to(repo).as_posix(): p.read_bytes() for p in repo.rglob("*.py")}


def test_helpers_go_into_one_module_that_every_rewritten_file_imports(repo):
    r = cli("rewrite", "--write", "--no-cache", "--no-color", "--helpers-module", "nm_helpers.py", ".")
    assert r.exit_code == 0, r.output
    assert "3 rewritten files import helpers from the shared module nm_helpers" in r.output
    assert "3 of 5 files rewritten (3 written)" in r.output

    shared = (repo / "nm_helpers.py").read_text()
    defined = _defined(shared)
    assert defined["_neuron_master_print"] == 1 and defined["_neuron_rank"] == 1 and max(defined.values()) == 1
    assert "torch_xla" not in shared
    # each file imports the helpers where isort puts a first-party import, and defines none itself
    assert (repo / "train_a.py").read_text() == EXPECTED_A
    assert (repo / "train_b.py").read_text() == EXPECTED_B
    assert (repo / "pkg/evaluate.py").read_text() == EXPECTED_C

    # the rewritten files import and run: global rank 0 prints (RANK without a process group, as torchrun sets it),
    # another rank prints nothing, as xm.master_print did
    out = _run(repo, RUN, rank="0")
    assert out.splitlines() == ["A rank 0 loss 1.000", "B step 3 rank 0", "C acc 4 rank 0"]
    assert _run(repo, RUN, rank="1") == ""

    # a second run changes nothing, the shared module included
    before = _snapshot(repo)
    again = cli("rewrite", "--write", "--no-cache", "--no-color", "--helpers-module", "nm_helpers.py", ".")
    assert again.exit_code == 0, again.output
    assert "0 of 6 files rewritten" in again.output
    assert _snapshot(repo) == before


def test_a_later_run_extends_the_module_and_the_files_import(repo):
    assert cli("rewrite", "--write", "--no-cache", "--helpers-module", "nm_helpers.py", ".").exit_code == 0
    first = (repo / "nm_helpers.py").read_text()
    # new code that needs one helper the module has and two it lacks, next to an import of the shared module
    (repo / "train_d.py").write_text('''from nm_helpers import _neuron_rank
import torch_xla.core.xla_model as xm


def sync(step):
    xm.rendezvous("step")
    return xm.xrt_world_size() * step + _neuron_rank()
''')
    r = cli("rewrite", "--write", "--no-cache", "--no-color", "--helpers-module", "nm_helpers.py", ".")
    assert r.exit_code == 0, r.output
    assert "1 rewritten file imports helpers from the shared module nm_helpers" in r.output
    shared = (repo / "nm_helpers.py").read_text()
    defined = _defined(shared)
    assert max(defined.values()) == 1, defined  # nothing defined twice
    assert {"_neuron_rank", "_neuron_master_print", "_neuron_barrier", "_neuron_world_size"} <= set(defined)
    for node in ast.parse(first).body:  # what was there stays as it was
        if isinstance(node, ast.FunctionDef):
            assert ast.get_source_segment(first, node) in shared
    assert (repo / "train_d.py").read_text().splitlines()[0] == \
        "from nm_helpers import _neuron_barrier, _neuron_rank, _neuron_world_size"  # one import, extended
    assert _run(repo, "import train_d; print(train_d.sync(5))", rank="0").strip() == "5"
