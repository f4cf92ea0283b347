"""The whole-repository example (examples/xla_repo): launcher, SLURM job, Dockerfile, requirements and an
xmp.spawn script. After `rewrite --write`, `audit` finds nothing left, the rewritten launcher starts the rewritten
script under torchrun on CPU in the test harness (neuron -> cpu, backend neuron -> gloo), and the report's numbers
match what the rewrite did.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from torchrun_util import TEARDOWN_ABORT

pytestmark = pytest.mark.slow  # end-to-end: trains, runs several processes or the whole corpus

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
SHIM = Path(__file__).resolve().parent / "neuron_on_cpu"
CLI = [sys.executable, "-m", "neuron_migrate"]


def _cli(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, timeout=300)


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    base = tmp_path_factory.mktemp("whole")
    original = base / "original"
    shutil.copytree(REPO / "examples" / "xla_repo", original)
    work = base / "xla_repo"
    shutil.copytree(original, work)
    before = _cli("report", ".", "-o", str(base / "before.html"), "--json", str(base / "before.json"), cwd=original)
    assert before.returncode == 0, before.stdout + before.stderr
    p = _cli("rewrite", "--write", "--no-color", ".", cwd=work)
    assert p.returncode in (0, 1), p.stdout + p.stderr
    assert "Traceback" not in p.stderr
    return {"base": base, "original": original, "work": work, "rewrite": p.stdout}


def test_audit_finds_nothing_left(repo):
    p = _cli("audit", "-f", "json", ".", cwd=repo["work"])
    assert p.returncode == 0, p.stdout + p.stderr
    assert json.loads(p.stdout) == []


def test_launch_files_rewritten(repo):
    w = repo["work"]
    launch = (w / "launch.sh").read_text()
    assert "torchrun --nproc_per_node=2 train.py" in launch
    assert not re.search(r"PJRT_DEVICE|XLA_IR_DEBUG|XLA_HLO_DEBUG|neuron_parallel_compile|NEURONCORE_NUM_DEVICES", launch)
    assert 'export NEURON_CC_FLAGS="--model-type transformer --auto-cast=none"' in launch  # kept as written
    assert "export NEURON_RT_STOCHASTIC_ROUNDING_EN=1" in launch
    assert "srun torchrun --nproc_per_node=32 train.py" in (w / "job.slurm").read_text()
    docker = (w / "Dockerfile").read_text()
    assert 'CMD ["torchrun", "--nproc_per_node=32", "train.py"]' in docker and "PJRT_DEVICE" not in docker
    reqs = (w / "requirements.txt").read_text()
    assert "torch-xla" not in reqs and "torch-neuronx==2.13.*" in reqs and "neuronx-cc==2.*" in reqs
    # untouched lines are byte-identical
    orig = (repo["original"] / "launch.sh").read_text().splitlines()
    assert [ln for ln in launch.splitlines() if ln in orig] == [ln for ln in launch.splitlines() if not ln.startswith("torchrun")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_rewritten_launcher_trains_under_torchrun(repo):
    w = repo["work"]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SHIM), str(w)])
    # `torchrun` of this interpreter (its console script may live in another environment's bin)
    bindir = repo["base"] / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "torchrun").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m torch.distributed.run "$@"\n')
    (bindir / "torchrun").chmod(0o755)
    env["PATH"] = os.pathsep.join([str(bindir), env.get("PATH", "")])
    env["CKPT_DIR"] = str(w)
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    for _ in range(3):  # torch 2.13's gloo sometimes aborts a worker after it finished (see torchrun_util)
        env["PET_MASTER_PORT"] = str(_free_port())
        p = subprocess.run(["bash", str(w / "launch.sh")], capture_output=True, text=True, env=env, timeout=300)
        if p.returncode == 0 or TEARDOWN_ABORT not in p.stdout + p.stderr:
            break
    assert p.returncode == 0, p.stdout + p.stderr
    assert "WORLD_SIZE 2" in p.stdout, p.stdout  # both ranks joined one process group
    first = float(re.search(r"INITIAL_LOSS ([0-9.]+)", p.stdout).group(1))
    last = float(re.search(r"FINAL_LOSS ([0-9.]+)", p.stdout).group(1))
    assert last < first


def test_report_numbers_match_the_rewrite(repo):
    data = json.loads((repo["base"] / "before.json").read_text())
    changed = {f.name for f in repo["work"].iterdir() if f.is_file() and f.read_bytes() != (repo["original"] / f.name).read_bytes()}
    migrated = {Path(f["path"]).name for f in data["files"] if f["status"] == "migrated"}
    assert migrated == changed == {"train.py", "launch.sh", "job.slurm", "Dockerfile", "requirements.txt"}
    assert data["totals"]["manual"] == 0 and data["totals"]["error"] == 0 and data["totals"]["files"] == 6
    # the fix counts of the report are the rewrite's
    fixes = sum(int(n) for n in re.findall(r"^  NM\d+ [\w-]+: (\d+) fix", repo["rewrite"], re.M))
    assert data["totals"]["fixes"] == fixes > 0
    assert any("torchrun --nproc_per_node=2" in x for x in data["launch"])
    after = _cli("report", ".", "-o", str(repo["base"] / "after.html"), "--json", str(repo["base"] / "after.json"), cwd=repo["work"])
    assert after.returncode == 0
    done = json.loads((repo["base"] / "after.json").read_text())["totals"]
    assert done["clean"] == 6 and done["fixes"] == 0 and done["manual_items"] == 0
