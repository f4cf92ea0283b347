"""The rewritten fixtures of the distributed rules (NM110-NM129) that are scripts run to the end on CPU.

Each `.out.py` runs with the test-only `neuron` stand-in (neuron -> cpu, backend neuron -> gloo) and torch_xla
absent: once as a plain `python` process and, for those that start a process group from torchrun's environment,
with the environment torchrun sets for a world of one.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # end-to-end: trains, runs several processes or the whole corpus

pytest.importorskip("torch")

FIXTURES = Path(__file__).parent / "fixtures" / "rules"
SHIM = Path(__file__).parent / "integration" / "neuron_on_cpu"
# case -> started by torchrun (its init_process_group reads RANK/WORLD_SIZE/MASTER_*)
CASES = {
    "NM110/conditional_ddp": True,
    "NM110/always_ddp": True,
    "NM112/after_init": True,
    "NM117/after_init": True,
    "NM115/single_device": False,
    "NM117/single_device": False,
    "NM121/after_init": True,
    "NM121/single_device": False,
    "NM126/dead_setup_init": True,
    "NM127/spawn": False,
    "NM127/fork_nothing_shared": False,
    "NM127/flag_guarded_init": False,
    "NM127/worker_inits": True,
    "NM129/module_top": True,
    "NM129/single_device": False,
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("case", sorted(CASES))
def test_rewritten_distributed_fixture_runs(case, tmp_path):
    out = FIXTURES / f"{case}.out.py"
    text = out.read_text()
    assert "torch_xla" not in text and "__main__" in text
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(PYTHONPATH=str(SHIM), OMP_NUM_THREADS="1")
    if CASES[case]:
        env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    proc = subprocess.run([sys.executable, str(out)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
