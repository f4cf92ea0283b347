"""The bundled PyTorch/XLA example project, rewritten by the CLI, really trains.

torch_xla is not installed here, so the original scripts cannot run; their rewrites must. The harness maps
the `neuron` device to `cpu` and the `neuron` process-group backend to `gloo` (tests/integration/
neuron_on_cpu/sitecustomize.py, test-only): the product itself writes plain TorchNeuron code.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from torchrun_util import run_torchrun

pytestmark = pytest.mark.slow  # end-to-end: trains, runs several processes or the whole corpus

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
SHIM = Path(__file__).resolve().parent / "neuron_on_cpu"


@pytest.fixture(scope="module")
def migrated(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("xla_project") / "xla_project"
    shutil.copytree(REPO / "examples" / "xla_project", work)
    cli = [sys.executable, "-m", "neuron_migrate"]
    p = subprocess.run([*cli, "rewrite", "--write", "--no-color", str(work)], capture_output=True, text=True, cwd=work)
    assert p.returncode in (0, 1), p.stdout + p.stderr
    assert "Traceback" not in p.stderr
    work.joinpath("rewrite.log").write_text(p.stdout + p.stderr)
    return work


def _env(work: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SHIM), str(work)])
    env["CKPT_DIR"] = str(work)
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    return env


def _losses(out: str) -> tuple[float, float]:
    first = re.search(r"INITIAL_LOSS ([0-9.]+)", out)
    last = re.search(r"FINAL_LOSS ([0-9.]+)", out)
    assert first and last, out
    return float(first.group(1)), float(last.group(1))


def _run(work: Path, script: str, nproc: int = 1, timeout: int = 240) -> str:
    if nproc == 1:
        p = subprocess.run([sys.executable, script], capture_output=True, text=True, cwd=work, env=_env(work), timeout=timeout)
    else:
        p = run_torchrun([script], nproc=nproc, cwd=work, env=_env(work), timeout=timeout)
    assert p.returncode == 0, f"{script} failed after migration:\n{p.stdout}\n{p.stderr}\n--- rewrite log ---\n{(work / 'rewrite.log').read_text()}"
    return p.stdout


def _xla_references(code: str) -> list[int]:
    """Lines of code (not comments or docstrings) that import or name torch_xla."""
    import ast

    lines = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "torch_xla" for a in node.names):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch_xla":
            lines.append(node.lineno)
        elif isinstance(node, ast.Name) and node.id == "torch_xla":
            lines.append(node.lineno)
    return lines


def test_no_torch_xla_left(migrated):
    for f in migrated.rglob("*.py"):
        assert not _xla_references(f.read_text()), f"{f.name} still uses torch_xla:\n{f.read_text()}"
    nb = json.loads((migrated / "explore.ipynb").read_text())
    code = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert "import torch_xla" not in code and "xm." not in code and "!pip list" in code and "%matplotlib inline" in code


def test_migrated_scripts_are_fixed_points(migrated):
    p = subprocess.run([sys.executable, "-m", "neuron_migrate", "rewrite", "--check", str(migrated)], capture_output=True, text=True)
    assert "0 of" in p.stdout, p.stdout


@pytest.mark.parametrize("script", ["single_device.py", "new_style.py"])
def test_single_process_script_trains(migrated, script):
    first, last = _losses(_run(migrated, script))
    assert last < first * 0.9


@pytest.mark.parametrize("script", ["torchrun_ddp.py", "spawn_allreduce.py"])
def test_multi_process_script_trains_under_torchrun(migrated, script):
    out = _run(migrated, script, nproc=2)
    first, last = _losses(out)
    assert last < first * 0.9
    if script == "torchrun_ddp.py":
        assert "of 2" in out  # world size seen by the script
        assert (migrated / "ddp.pt").exists()
