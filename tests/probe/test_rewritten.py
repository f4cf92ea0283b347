"""The natural flow: `rewrite` a torch_xla project, then `probe` the rewritten scripts unchanged on the
emulated neuron device, single process and under torchrun with 2 ranks (backend `neuron` -> gloo)."""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from .helpers import REPO, run_json  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def rewritten(tmp_path_factory, emulator_lib):
    d = tmp_path_factory.mktemp("rewritten") / "xla_project"
    shutil.copytree(REPO / "examples" / "xla_project", d)
    p = subprocess.run([sys.executable, "-m", "neuron_migrate", "rewrite", "--write", str(d)], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode in (0, 1), p.stderr[-2000:]
    for name in ("single_device.py", "torchrun_ddp.py"):
        text = (d / name).read_text()
        assert 'torch.device("neuron")' in text and "torch_xla" not in text
    return d


def _line(path, needle: str) -> int:
    return next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if needle in ln)


def test_rewritten_script_runs_unchanged(rewritten):
    rc, rep, p = run_json(["single_device.py", "--", "--epochs", "1"], cwd=rewritten)
    assert rc == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert rep["status"] == "ok" and rep["device"] == "neuron" and rep["device_kind"] == "emulated"
    assert "FINAL_LOSS" in rep["outcome"]["stdout"]["tail"]
    loss_line = _line(rewritten / "single_device.py", "loss = loss_fn(model(data), target)")
    at = [o for o in rep["ops"] if o["file"] == "single_device.py" and o["line"] == loss_line]
    assert any(o["phase"] == "forward" and "nll_loss" in o["op"] for o in at)
    assert any(o["phase"] == "backward" and o["attributed"] for o in at)
    # ops inside the user's own model file carry that file's lines
    assert any(o["file"] == "common.py" and o["op"] == "aten::addmm.default" for o in rep["ops"])
    assert rep["measured"]["emulated"] and "aten::addmm" in rep["measured"]["executed_ops"]


def test_rewritten_torchrun_script_two_ranks(rewritten, tmp_path):
    rc, rep, p = run_json(["torchrun_ddp.py", "--nproc", "2", "--timeout", "400"], cwd=rewritten,
                          env_extra={"CKPT_DIR": str(tmp_path)}, timeout=600)
    assert rc == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert rep["world_size"] == 2 and rep["device_kind"] == "emulated"
    assert [(r["rank"], r["status"]) for r in rep["ranks"]] == [(0, "ok"), (1, "ok")]
    assert rep["ranks"][0]["steps"] == rep["ranks"][1]["steps"] > 0
    out = rep["outcome"]["stdout"]["tail"]
    assert "rank 0 of 2" in out  # dist.get_world_size() == 2: both ranks joined one group
    first = float(out.split("INITIAL_LOSS ")[1].split()[0])
    last = float(out.split("FINAL_LOSS ")[1].split()[0])
    assert last < first
    assert (tmp_path / "ddp.pt").is_file()
    # DDP's gradient all-reduce ran on the device tensors of both ranks, through the `neuron` backend
    ar = [o for o in rep["ops"] if o["op"].startswith("c10d::allreduce_") and o["phase"] == "backward"]
    assert ar and sorted({r for o in ar for r in o["ranks"]}) == [0, 1]
