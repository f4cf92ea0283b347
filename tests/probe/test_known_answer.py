"""Known answers: a model using torch.linalg.qr, atan2, an rfft and a float64 buffer; a clean MLP."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from neuron_migrate.table import load_table  # noqa: E402

from .helpers import MODELS, marker_lines, rel, run_json  # noqa: E402

FALLBACK = MODELS / "fallback_model.py"


def _table_status(op: str, api: str) -> str:
    """What the shipped table says: the op's own entry, else the rating of the Python API that reaches it."""
    t = load_table()
    e = t.op(op)
    if e is not None:
        return str(e.status.value)
    status, _ = t.worst_status_for_api(api)
    return str(getattr(status, "value", status))


@pytest.fixture(scope="module")
def fallback_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("probe")
    md, js = d / "report.md", d / "report.json"
    rc, rep, proc = run_json([f"{rel('fallback_model.py')}:make", "--steps", "2", "--compile",
                              "--shapes", "8x16,4x16", "--shapes", "2x16", "--numerics",
                              "--report", str(md), "--json-out", str(js), "--fail-on", "fallback,float64"])
    return rc, rep, proc, md, js


@pytest.mark.slow
def test_fallback_ops_and_lines(fallback_run):
    rc, rep, proc, _, _ = fallback_run
    assert rep["status"] == "ok", proc.stderr[-2000:]
    lines = marker_lines(FALLBACK)
    expected = {
        ("aten::linalg_qr.default", lines["qr"]): _table_status("aten::linalg_qr.default", "torch.linalg.qr"),
        ("aten::atan2.default", lines["atan2"]): _table_status("aten::atan2.default", "torch.atan2"),
        ("aten::_fft_r2c.default", lines["rfft"]): _table_status("aten::_fft_r2c.default", "torch.fft.rfft"),
    }
    bad = ("cpu_fallback", "unsupported", "partial")
    fwd = {(o["op"], o["line"]): o["status"] for o in rep["ops"] if o["phase"] == "forward"}
    for key, status in expected.items():
        assert fwd.get(key) == status, (key, fwd.get(key), status)
    # exactly those ops (and lines) among the forward ops the table flags
    flagged_fwd = {k for k, s in fwd.items() if s in bad}
    assert flagged_fwd == {k for k, s in expected.items() if s in bad}
    # backward ops are attributed to the forward line that made them: every flagged op points at one of those lines
    flagged_lines = {o["line"] for o in rep["ops"] if o["status"] in bad and o["phase"] != "init"}
    assert flagged_lines <= {lines["qr"], lines["atan2"], lines["rfft"]}
    assert all(o["file"] == rel("fallback_model.py") for o in rep["ops"] if o["status"] in bad and o["phase"] != "init")
    bw = [o for o in rep["ops"] if o["phase"] == "backward" and o["line"] == lines["atan2"]]
    assert bw and all(o["attributed"] for o in bw)
    grad_fns = {o["grad_fn"] for o in bw}
    assert "Atan2Backward0" in grad_fns and grad_fns <= {"Atan2Backward0", "FlipBackward0", "AddBackward0"}
    # the CPU fallback section lists the ops by calls with their call sites
    fb = {r["op"]: r for r in rep["cpu_fallback"]}
    for (op, line), status in expected.items():
        if status == "cpu_fallback":
            assert any(s["line"] == line for s in fb[op]["sites"])
            assert fb[op]["count"] == 2  # --steps 2


def test_float64_buffer_and_ops(fallback_run):
    _, rep, _, _, _ = fallback_run
    lines = marker_lines(FALLBACK)
    f64 = rep["float64"]
    assert [(t["kind"], t["name"], t["line"]) for t in f64["tensors"]] == [("buffer", "scale", lines["buffer"])]
    assert {(x["op"], x["line"]) for x in f64["ops"] if "forward" in x["phases"]} == {
        ("aten::mul.Tensor", lines["float64-use"]), ("aten::_to_copy.default", lines["float64-use"])}
    assert {x["line"] for x in f64["ops"]} == {lines["float64-use"]}
    assert any(s["op"] == "aten::linspace.default" and s["line"] == lines["buffer"] for s in f64["sources"])


def test_exit_code_reports_and_optimizer(fallback_run):
    rc, rep, _, md, js = fallback_run
    assert rc == 1 and set(rep["failed_checks"]) == {"fallback", "float64"}
    text = md.read_text()
    assert "aten::atan2.default" in text and "## float64" in text and "fallback_model.py:" in text
    assert json.loads(js.read_text())["status"] == "ok"
    assert any(o["phase"] == "optimizer" for o in rep["ops"])  # AdamW step ops were recorded
    assert rep["timing"]["steps"] == 2 and not rep["timing"]["first_call_reported"]


def test_compile_section(fallback_run):
    _, rep, _, _, _ = fallback_run
    c = rep["compile"]
    assert c["explain"]["graph_break_count"] == 0
    kinds = {g["kind"] for g in c["graphs"]}
    assert kinds == {"forward", "backward"}
    lines = marker_lines(FALLBACK)
    blocked = {(b["op"], b["line"]) for b in c["cannot_lower"] if b["kind"] == "forward"}
    for op, tag in (("aten::atan2.default", "atan2"), ("aten::linalg_qr.default", "qr")):
        if load_table().op(op) is not None and str(load_table().op(op).status.value) in ("cpu_fallback", "unsupported"):
            assert (op, lines[tag]) in blocked
    r = c["recompiles"]
    assert [s["new_compiles"] for s in r["shapes"]] == [1, 1, 1] and r["recompilations"] == 2


def test_numerics(fallback_run):
    _, rep, _, _, _ = fallback_run
    n = rep["numerics"]["float64_as_float32"]
    assert n["ops_downcast"] > 0
    assert 0 < n["worst_rel"] < 1e-3
    assert set(n["grads"]) == {"proj.weight", "proj.bias", "head.weight", "head.bias"}
    assert "loss" in n and len(n["outputs"]) == 1


def test_clean_mlp_has_no_fallback_no_float64():
    rc, rep, proc = run_json([f"{rel('mlp.py')}:make", "--fail-on", "fallback,float64,unsupported"])
    assert rc == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert rep["summary"]["by_status"]["cpu_fallback"]["ops"] == 0
    assert rep["summary"]["by_status"]["unsupported"]["ops"] == 0
    assert rep["float64"] == {"ops": [], "sources": [], "tensors": []}
    phases = {o["phase"] for o in rep["ops"]}
    assert {"forward", "backward", "optimizer"} <= phases


def test_inputs_option_module_form_and_forward_mode():
    rc, rep, proc = run_json(["mlp:make_model_only", "--inputs", "mlp:inputs", "--mode", "forward", "--steps", "1"],
                             env_extra={"PYTHONPATH": str(MODELS)})
    assert rc == 0, proc.stderr[-2000:]
    phases = {o["phase"] for o in rep["ops"]}
    assert "forward" in phases and "backward" not in phases and "optimizer" not in phases
    assert any(o["op"] == "aten::addmm.default" for o in rep["ops"])


def test_graph_breaks_are_reported_with_lines(tmp_path):
    m = tmp_path / "breaks.py"
    m.write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.fc = torch.nn.Linear(4, 4)\n"
        "    def forward(self, x):\n"
        "        y = self.fc(x)\n"
        "        if y.sum().item() > 0:\n"
        "            y = y * 2\n"
        "        return y\n"
        "def make():\n"
        "    return M(), (torch.randn(2, 4),)\n"
    )
    rc, rep, _ = run_json([f"{m}:make", "--compile", "--steps", "1", "--fail-on", "graph-break"])
    ex = rep["compile"]["explain"]
    assert ex["graph_break_count"] >= 1
    assert any(b["line"] == 8 and "item" in b["reason"] for b in ex["breaks"])
    assert rc == 1 and rep["failed_checks"] == ["graph-break"]
