"""End to end: the CUDA training example is rewritten with the real CLI and then trained on CPU.

- neuron style: `neuron-migrate rewrite --write --unsafe-fixes` turns it into a TorchNeuron script
  (`neuron` device, `neuron` process-group backend, `torch.autocast("neuron")`); it then runs under
  torchrun with 2 processes on CPU through the test-only stand-in `neuron_on_cpu/sitecustomize.py`
  (neuron -> cpu, backend neuron -> gloo, compile -> eager).
- accelerator style: the rewrite is device-agnostic (`torch.accelerator`) and runs on this CPU-only machine
  with no shim at all (TORCHDYNAMO_DISABLE=1 only skips the slow Inductor compile; the code is unchanged).
Both runs must reduce the loss.
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from torchrun_util import run_torchrun

pytestmark = pytest.mark.slow  # end-to-end: trains, runs several processes or the whole corpus

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "cuda_training" / "train.py"
SHIM = Path(__file__).resolve().parent / "neuron_on_cpu"
STEPS = "40"


def _cli() -> list[str]:
    exe = Path(sys.executable).parent / "neuron-migrate"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "neuron_migrate"]


def _rewrite(tmp_path: Path, style: str) -> str:
    script = tmp_path / "train.py"
    shutil.copy(EXAMPLE, script)
    proc = subprocess.run([*_cli(), "rewrite", str(script), "--write", "--unsafe-fixes", "--device-style", style, "--jobs", "1"],
                          capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    # exit 1 = rewritten, with findings left for a human (cudnn, NCCL env); the bf16 GradScaler is removed
    assert proc.returncode in (0, 1) and "1 of 1 file rewritten" in out, out
    for code in ("NM217", "NM218"):
        assert code in out, f"{code} not reported:\n{out}"
    text = script.read_text()
    assert text != EXAMPLE.read_text()
    return text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(tmp_path: Path, env_extra: dict) -> list[float]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TORCHDYNAMO_DISABLE")}
    env.update(OMP_NUM_THREADS="1", **env_extra)
    # --standalone picks a free port itself; run_torchrun retries torch's known gloo teardown abort
    proc = run_torchrun(["train.py", "--steps", STEPS], nproc=2, cwd=tmp_path, env=env, timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    losses = [float(m.group(1)) for m in re.finditer(r"^step \d+ loss ([0-9.]+)", proc.stdout, re.M)]
    assert len(losses) >= 3, out[-4000:]
    assert f"done {STEPS} steps" in proc.stdout and "on cpu" in proc.stdout, proc.stdout
    return losses


def test_neuron_style_rewrite_trains_on_cpu_stand_in(tmp_path):
    text = _rewrite(tmp_path, "neuron")
    # what the rewrite must have done
    assert 'init_process_group(backend="neuron")' in text
    assert 'torch.autocast("neuron", dtype=torch.bfloat16)' in text
    # the program's own device variable, as a hand migration would write
    assert "MLP().to(device)" in text and "x.to(device, non_blocking=True)" in text
    assert 'torch.device("neuron" if torch.accelerator.is_available() else "cpu")' in text
    # torch.manual_seed(args.seed) right above already seeds every device: the CUDA seed call goes (issue 38)
    assert "torch.manual_seed(args.seed)" in text and "manual_seed_all" not in text and "torch.neuron" not in text
    # NM403: a compile with no backend in CUDA code names TorchNeuron's (the issue-37 change)
    assert "DDP(model)" in text and 'torch.compile(model, mode="default", backend="neuron")' in text
    # the GradScaler next to bf16 autocast is gone, its uses unwrapped; nothing of torch.cuda is left
    assert "scaler" not in text and "loss.backward()" in text and "optimizer.step()" in text
    assert [line.strip() for line in text.splitlines() if "torch.cuda." in line] == []
    assert "set_device" not in text and "def _neuron" not in text  # no helper inserted
    losses = _train(tmp_path, {"PYTHONPATH": str(SHIM)})
    assert losses[-1] < 0.5 * losses[0], losses


def test_accelerator_style_rewrite_runs_unchanged_on_cpu(tmp_path):
    text = _rewrite(tmp_path, "accelerator")
    assert "neuron\"" not in text and "'neuron'" not in text  # device-agnostic: no neuron literal
    assert "def _accelerator_device():" not in text  # plain torch.accelerator calls, no inserted helper
    assert 'dist.get_default_backend_for_device(torch.accelerator.current_accelerator() or torch.device("cpu"))' in text
    assert "device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device(\"cpu\")" in text
    assert "torch.autocast(device.type, dtype=torch.bfloat16)" in text
    losses = _train(tmp_path, {"TORCHDYNAMO_DISABLE": "1"})  # no shim on PYTHONPATH
    assert losses[-1] < 0.5 * losses[0], losses


def test_shim_is_required_for_the_neuron_style_script(tmp_path):
    """Guards the harness itself: without the stand-in the neuron-style script must not run on CPU."""
    _rewrite(tmp_path, "neuron")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = "import torch; torch.ones(1).to('neuron')"
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    proc = subprocess.run([sys.executable, "-c", code + "; assert torch._neuron_on_cpu"], cwd=tmp_path,
                          env={**env, "PYTHONPATH": str(SHIM)}, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
