"""A DDP script under torchrun, 2 CPU ranks with gloo: one record per rank, merged in the report."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from .helpers import MODELS, marker_lines, rel, run_json  # noqa: E402


@pytest.mark.slow
def test_two_rank_gloo_run_is_merged():
    rc, rep, p = run_json([rel("ddp_script.py"), "--nproc-per-node", "2", "--timeout", "180"])
    assert rc == 0, p.stderr[-3000:]
    assert rep["world_size"] == 2
    assert [(r["rank"], r["status"], r["steps"]) for r in rep["ranks"]] == [(0, "ok", 3), (1, "ok", 3)]
    line = marker_lines(MODELS / "ddp_script.py")["ddp-forward"]
    fwd = [o for o in rep["ops"] if o["line"] == line and o["phase"] == "forward" and o["op"] == "aten::addmm.default"]
    assert fwd and fwd[0]["ranks"] == [0, 1] and fwd[0]["count"] == 2 * 3 * 2  # 2 ranks x 3 steps x 2 layers
    assert any(o["op"].startswith("c10d::allreduce") and o["phase"] == "backward" for o in rep["ops"])
