"""NM148 + NM117 end to end: torch_xla's AMP-loop gradient averaging (`xm._fetch_gradients` then
`xm.all_reduce(xm.REDUCE_SUM, gradients, scale=1/world)`), rewritten, averages the gradients of 2 torchrun
processes in one process group, and leaves them alone in a single process.

The harness maps `neuron` to the CPU and the `neuron` backend to gloo (tests/integration/neuron_on_cpu, test-only).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from torchrun_util import run_torchrun

pytestmark = pytest.mark.slow  # two torchrun processes

pytest.importorskip("torch")

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "rules" / "NM148" / "amp_average.out.py"
SHIM = Path(__file__).resolve().parent / "neuron_on_cpu"


def _env():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(PYTHONPATH=str(SHIM), OMP_NUM_THREADS="1")
    return env


def test_rewritten_average_runs_in_two_processes(tmp_path):
    script = tmp_path / "amp_average.py"
    shutil.copy(FIXTURE, script)
    assert "torch_xla" not in script.read_text()
    p = run_torchrun([str(script)], nproc=2, cwd=tmp_path, env=_env(), timeout=300)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    # each rank saw the mean of both ranks' gradients (the script asserts the values), in a world of 2
    assert "rank 0 of 2: gradients averaged" in out and "rank 1 of 2: gradients averaged" in out, out


def test_rewritten_average_runs_in_one_torchrun_process(tmp_path):
    script = tmp_path / "amp_average.py"
    shutil.copy(FIXTURE, script)
    p = run_torchrun([str(script)], nproc=1, cwd=tmp_path, env=_env(), timeout=300)
    assert p.returncode == 0 and "rank 0 of 1: gradients averaged" in p.stdout, p.stdout + p.stderr


def test_rewrite_has_no_fetch_gradients_left():
    text = FIXTURE.read_text()
    assert "_fetch_gradients" not in text and "dist.all_reduce(grad)" in text
    assert subprocess.run([sys.executable, "-c", "import ast,sys; ast.parse(open(sys.argv[1]).read())", str(FIXTURE)]).returncode == 0
