"""End to end: a realistic single-GPU CUDA project is rewritten with the real CLI and trained on CPU.

The project (`examples/cuda_project/`) has what real repos have: the device-choice idiom
(`torch.device("cuda" if torch.cuda.is_available() else "cpu")`) behind a `--device` option with choices, bf16
autocast with a leftover GradScaler, a float64 tensor that goes to the device, a float64 reference computed on the
host to check the device result, and a multi-backend device-utility module (cuda/xpu/mps dispatch).

Asserted: the device choice and the `--device` choices migrate together, the GradScaler is removed and its uses
unwrapped, the device-side float64 becomes float32 while the host reference stays float64, the dispatching module
keeps its dispatch code with a finding (neuron style adds one neuron branch to its device picker); then the
rewritten script trains (loss falls) and passes its own float64 reference check, in both device styles (neuron style with the test-only CPU stand-in for the `neuron` device;
accelerator style with no stand-in at all).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # end-to-end: trains, runs several processes or the whole corpus

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
PROJECT = REPO / "examples" / "cuda_project"
SHIM = Path(__file__).resolve().parent / "neuron_on_cpu"


def _cli() -> list[str]:
    exe = Path(sys.executable).parent / "neuron-migrate"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "neuron_migrate"]


def _rewrite(tmp_path: Path, style: str) -> tuple[str, str]:
    work = tmp_path / "project"
    shutil.copytree(PROJECT, work)
    proc = subprocess.run([*_cli(), "rewrite", str(work), "--write", "--unsafe-fixes", "--device-style", style, "--jobs", "1",
                           "--no-cache"], capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode in (0, 1), out
    original, migrated = (PROJECT / "devices.py").read_text(), (work / "devices.py").read_text()
    if style == "neuron":
        # the device picker gains one neuron branch before its CPU fallback; every other line is byte-identical
        assert "2 of 2 files rewritten" in out, out
        branch = ('    if torch.accelerator.is_available() and torch.accelerator.current_accelerator().type == "neuron":\n'
                  '        return torch.device("neuron")\n')
        assert migrated.replace(branch, "", 1) == original and branch in migrated, migrated
        assert migrated.index(branch) < migrated.index('    return torch.device("cpu")')
    else:
        # accelerator style: the dispatching module is left unchanged, with a finding that says so
        assert "1 of 2 files rewritten" in out, out
        assert (work / "devices.py").read_bytes() == (PROJECT / "devices.py").read_bytes()
    audit = subprocess.run([*_cli(), "audit", str(work / "devices.py"), "--no-cache"], capture_output=True, text=True, timeout=120)
    assert "dispatches over several backends" in audit.stdout, audit.stdout + audit.stderr
    return (work / "train.py").read_text(), out


def _train(tmp_path: Path, env_extra: dict, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env.update(OMP_NUM_THREADS="1", **env_extra)
    proc = subprocess.run([sys.executable, "train.py", "--steps", "60", *args], cwd=tmp_path / "project", env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    losses = [float(m.group(1)) for m in re.finditer(r"^step \d+ loss ([0-9.]+)", proc.stdout, re.M)]
    assert len(losses) >= 3 and losses[-1] < 0.5 * losses[0], proc.stdout
    # the host reference is still float64, and the script's own check against it passed
    assert "reference torch.float64 max error" in proc.stdout and "done 60 steps" in proc.stdout, proc.stdout
    assert "weights torch.float32" in proc.stdout, proc.stdout  # the device-side float64 was downcast
    return proc.stdout


def test_neuron_style_project_trains_on_cpu_stand_in(tmp_path):
    text, out = _rewrite(tmp_path, "neuron")
    assert 'choices=["cpu", "neuron"]' in text  # one value with the device choice: migrated together
    assert 'device = torch.device("neuron" if torch.accelerator.is_available() else "cpu")' in text
    assert "x, y = x.to(device), y.to(device)" in text and "model = MLP().to(device)" in text
    assert "scaler" not in text and "loss.backward()" in text and "optimizer.step()" in text
    assert "dtype=torch.float32).to(device)" in text
    # the float64 host reference is left alone
    assert text.count(".cpu().double()") == (PROJECT / "train.py").read_text().count(".cpu().double()") == 6
    assert "torch.cuda" not in text and "def _" not in text.replace("def __init__", "")
    assert "Values from the command line (--device) must now say 'neuron'" in out
    _train(tmp_path, {"PYTHONPATH": str(SHIM)})
    _train(tmp_path, {"PYTHONPATH": str(SHIM)}, "--device", "neuron")  # the migrated choice is accepted


def test_accelerator_style_project_runs_unchanged_on_cpu(tmp_path):
    text, _ = _rewrite(tmp_path, "accelerator")
    assert "_accelerator_device" not in text and "neuron" not in text.replace("choices", "")
    assert "torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device(\"cpu\")" in text
    assert "torch.autocast(device.type, dtype=torch.bfloat16)" in text
    assert text.count(".cpu().double()") == 6
    _train(tmp_path, {})  # no stand-in: plain torch.accelerator code runs on a CPU-only machine
