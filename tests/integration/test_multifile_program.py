"""A training program split over files (tests/integration/multifile/), rewritten by the CLI as a whole tree, trains
in 1 and 2 processes.

The layout is the one of pytorch/xla's examples: `trainer/base.py` holds a base trainer with its own
`if __name__ == "__main__":` (one device) and a compiled training step (`torch_xla.compile(self.step_fn,
full_graph=True)`), `trainer/config.py` its configuration, `scripts/train_ddp.py` appends the project folder to
`sys.path`, subclasses the trainer with a DDP-wrapped model and runs it under `torch_xla.launch`, and `launch.sh`
starts that script. Judged one file at a time, base.py is a single-device program (its world size would become 1);
the repository model knows that a distributed program imports it.

The harness maps the `neuron` device to cpu and the `neuron` backend to gloo (neuron_on_cpu/sitecustomize.py, test
only) and records, per rank, the process group joined and the collectives called.
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

pytestmark = pytest.mark.slow  # end-to-end: trains, runs several processes

torch = pytest.importorskip("torch")

HERE = Path(__file__).resolve().parent
PROJECT = HERE / "multifile"
SHIM = HERE / "neuron_on_cpu"


@pytest.fixture(scope="module")
def migrated(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("multifile") / "multifile"
    shutil.copytree(PROJECT, work, ignore=shutil.ignore_patterns("__pycache__"))
    p = subprocess.run([sys.executable, "-m", "neuron_migrate", "rewrite", "--write", "--unsafe-fixes", "--no-color", "."],
                       capture_output=True, text=True, cwd=work)
    assert p.returncode in (0, 1), p.stdout + p.stderr
    assert "Traceback" not in p.stderr
    (work / "rewrite.log").write_text(p.stdout + p.stderr)
    return work


def _env(work: Path, log_dir: Path | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SHIM), str(work)])
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    env["OMP_NUM_THREADS"] = "1"
    if log_dir is not None:
        env["NEURON_ON_CPU_COLLECTIVES"] = str(log_dir)
    return env


def _check(p: subprocess.CompletedProcess, work: Path, what: str) -> str:
    assert p.returncode == 0, (f"{what} failed after migration:\n{p.stdout}\n{p.stderr}\n--- base.py ---\n"
                               f"{(work / 'trainer/base.py').read_text()}\n--- rewrite ---\n{(work / 'rewrite.log').read_text()}")
    return p.stdout


def _losses(out: str) -> tuple[float, float]:
    first, last = re.search(r"INITIAL_LOSS ([0-9.]+)", out), re.search(r"FINAL_LOSS ([0-9.]+)", out)
    assert first and last, out
    return float(first.group(1)), float(last.group(1))


def test_no_torch_xla_left_and_the_base_keeps_its_runtime_world_size(migrated):
    for path in migrated.rglob("*.py"):
        assert "torch_xla" not in path.read_text(), path
    base = (migrated / "trainer/base.py").read_text()
    assert "self.world = 1" not in base and "self.world = (1)" not in base, base
    assert re.search(r"self\.world = (_neuron_world_size\(\)|dist\.get_world_size\(\))", base), base
    assert not re.search(r'^ *print\(f"INITIAL_LOSS', base, re.M)  # master_print kept its rank-0 guard
    # the compiled step is a training step: compiled without fullgraph (Dynamo breaks the graph at backward())
    assert 'torch.compile(self.step_fn, backend="neuron")' in base, base
    p = subprocess.run([sys.executable, "-m", "neuron_migrate", "rewrite", "--check", "--unsafe-fixes", "."],
                       capture_output=True, text=True, cwd=migrated)
    assert "0 of" in p.stdout, p.stdout  # a fixed point


def test_the_base_trainer_trains_alone(migrated):
    out = _check(subprocess.run([sys.executable, "-m", "trainer.base"], capture_output=True, text=True, cwd=migrated,
                                env=_env(migrated), timeout=300), migrated, "python -m trainer.base")
    assert "WORLD 1 RANK 0" in out
    first, last = _losses(out)
    assert last < first * 0.9
    assert re.findall(r"STEPS (\d+)", out) == ["96"]  # 512 samples / 16 per batch, 3 epochs


def test_the_data_parallel_script_trains_in_one_process(migrated):
    out = _check(subprocess.run([sys.executable, "scripts/train_ddp.py"], capture_output=True, text=True, cwd=migrated,
                                env=_env(migrated), timeout=300), migrated, "python scripts/train_ddp.py")
    assert "WORLD 1 RANK 0" in out
    first, last = _losses(out)
    assert last < first * 0.9


def test_two_ranks_join_one_group_shard_the_data_and_average_gradients(migrated, tmp_path):
    log_dir = tmp_path / "collectives"
    log_dir.mkdir()
    p = run_torchrun(["scripts/train_ddp.py"], nproc=2, cwd=migrated, env=_env(migrated, log_dir), timeout=300)
    out = _check(p, migrated, "torchrun --nproc_per_node=2 scripts/train_ddp.py")
    logs = [json.loads(f.read_text()) for f in sorted(log_dir.glob("rank*.json"))]
    assert len(logs) == 2 and sorted(log["rank"] for log in logs) == [0, 1], logs
    assert all(log["world_size"] == 2 for log in logs)
    members = [sorted(log["members"]) for log in logs]
    assert members[0] == members[1] and len(set(members[0])) == 2, f"ranks are not in one group: {members}"
    # the base module's world size is the group's: each rank trains on its half of the data
    assert sorted(re.findall(r"WORLD (\d+) RANK (\d+)", out)) == [("2", "0"), ("2", "1")], out
    steps = [int(s) for s in re.findall(r"STEPS (\d+)", out)]
    assert steps == [48, 48], out
    for log in logs:  # DDP averaged the gradients of every step
        assert log["counts"].get("ddp_gradient_bucket", 0) >= 48, log["counts"]
    params = [float(s) for s in re.findall(r"PARAMS (-?\d+\.\d{6})", out)]
    assert len(params) == 2 and abs(params[0] - params[1]) <= 1e-3 * max(1.0, abs(params[0])), params
    assert len(re.findall(r"FINAL_LOSS", out)) == 1  # printed by rank 0 only
    first, last = _losses(out)
    assert last < first * 0.9
