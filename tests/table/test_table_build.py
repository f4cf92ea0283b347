"""`table build` against a backend whose PrivateUse1 registrations are known (chosen here), in a child process."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow  # end-to-end: trains, runs several processes or the whole corpus

pytest.importorskip("torch")

# Kernels the fake backend registers for PrivateUse1 from Python, as torch_neuronx does for most of its ops.
CHOSEN = ["aten::addmm", "aten::mm", "aten::relu", "aten::atan2.out", "aten::add.Tensor", "aten::_softmax",
          "aten::native_dropout"]

BACKEND = '''
import torch

_lib = torch.library.Library("aten", "IMPL", "PrivateUse1")


def _kernel(*args, **kwargs):
    raise RuntimeError("fake backend kernel: never run in this test")


for _op in {ops!r}:
    _lib.impl(_op.split("::", 1)[1], _kernel)
__version__ = "0.0.1"
'''


def _build(tmp_path: Path, ops: list[str], *extra: str) -> tuple[subprocess.CompletedProcess, Path]:
    (tmp_path / "fake_backend.py").write_text(textwrap.dedent(BACKEND.format(ops=ops)), encoding="utf-8")
    out = tmp_path / "built" / "torchneuron-0.0.1.yaml"
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    import os

    env = {**os.environ, **env}
    proc = subprocess.run([sys.executable, "-m", "neuron_migrate", "table", "build", "--backend-module", "fake_backend",
                           "--out", str(out), *extra], capture_output=True, text=True, env=env, timeout=300)
    return proc, out


def test_build_reconstructs_exactly_the_registered_kernels(tmp_path):
    proc, out = _build(tmp_path, CHOSEN)
    assert proc.returncode == 0, proc.stderr
    doc = yaml.safe_load(out.read_text(encoding="utf-8"))
    names = sorted(e["name"] for e in doc["entries"])
    assert names == sorted(CHOSEN)
    assert all(e["status"] == "native" and e["kind"] == "aten_op" for e in doc["entries"])
    assert doc["torch"].startswith("2.") and doc["version"] == "0.0.1"

    from neuron_migrate.table import Status, load_table

    t = load_table(out)
    assert t.op("aten::mm").status is Status.NATIVE
    assert t.op("aten::sin") is None  # not registered, and no dispatcher data next to the built table
    assert t.sources["installed_wheel"]["url"] is None  # a test backend has no public address


def test_build_with_a_different_kernel_set(tmp_path):
    proc, out = _build(tmp_path, ["aten::sin", "aten::cos.out"])
    assert proc.returncode == 0, proc.stderr
    assert sorted(e["name"] for e in yaml.safe_load(out.read_text(encoding="utf-8"))["entries"]) == [
        "aten::cos.out", "aten::sin"]


def test_build_without_the_backend_is_a_clear_error(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "neuron_migrate", "table", "build", "--backend-module",
                           "no_such_backend_xyz", "--out", str(tmp_path / "t.yaml")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2
    assert "no_such_backend_xyz" in proc.stderr and "Traceback" not in proc.stderr
