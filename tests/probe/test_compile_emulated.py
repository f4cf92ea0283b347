"""`torch.compile(backend="neuron")` under the probe on the emulated device: a torch_xla script is rewritten
(`backend="openxla"` -> `"neuron"`), then probed with `--compile`; the emulated backend compiles it (dynamo +
aot_autograd, graphs run on the emulated device) and the report lists its graph break with the user's line."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

from .helpers import REPO, marker_lines, run_cli  # noqa: E402

XLA_SCRIPT = textwrap.dedent('''\
    import torch
    import torch_xla.core.xla_model as xm
    from torch import nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(8, 8)
            self.b = nn.Linear(8, 4)

        def forward(self, x):
            h = torch.relu(self.a(x))  # PROBE: first
            if h.sum() > 0:  # PROBE: break
                h = h * 2
            return self.b(h)  # PROBE: second


    device = xm.xla_device()
    model = torch.compile(Net().to(device), backend="openxla")  # PROBE: compile
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        loss = model(torch.randn(4, 8, device=device)).sum()
        loss.backward()
        opt.step()
        xm.mark_step()
    assert next(model.parameters()).device.type == "neuron"
''')

FULLGRAPH_SCRIPT = textwrap.dedent('''\
    import torch
    from torch import nn

    model = torch.compile(nn.Sequential(nn.Linear(8, 8), nn.ReLU()).to("neuron"), backend="neuron", fullgraph=True)
    model(torch.randn(2, 8, device="neuron")).sum().backward()
''')


def _probe(script, *extra):
    p = run_cli([str(script), "--format", "json", "--compile", *extra], cwd=script.parent, timeout=600)
    try:
        return p.returncode, json.loads(p.stdout), p
    except ValueError as exc:
        raise AssertionError(f"no JSON (rc={p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}") from exc


def test_rewritten_script_compiles_on_the_emulated_backend_and_reports_its_graph_break(tmp_path, emulator_lib):
    script = tmp_path / "train.py"
    script.write_text(XLA_SCRIPT, encoding="utf-8")
    rw = subprocess.run([sys.executable, "-m", "neuron_migrate", "rewrite", str(script), "--write", "--unsafe-fixes"],
                        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert rw.returncode == 0, rw.stderr[-2000:]
    text = script.read_text(encoding="utf-8")
    assert 'backend="neuron"' in text and "torch_xla" not in text, text
    lines = marker_lines(script)

    rc, rep, p = _probe(script, "--fail-on", "graph-break")
    assert rep["status"] == "ok" and rep["device_kind"] == "emulated", p.stderr[-3000:]
    assert rc == 1 and "graph-break" in rep["failed_checks"]  # the break fails the gate
    c = rep["compile"]
    assert "emulated" in c["backend"]
    assert [(x["file"], x["line"]) for x in c["calls"]] == [(str(script), lines["compile"])]
    ex = c["explain"]
    assert ex["graph_break_count"] == len(ex["breaks"]) == 1
    brk = ex["breaks"][0]
    assert (brk["file"], brk["line"]) == ("train.py", lines["break"]) and brk["site"] == f"train.py:{lines['break']}"
    assert ex["graph_count"] >= 2  # the graph before the break and the one after it
    kinds = {g["kind"] for g in c["graphs"]}
    assert kinds == {"forward", "backward"}
    fw_ops = {(o["op"], o["line"]) for g in c["graphs"] if g["kind"] == "forward" for o in g["ops"]}
    assert ("aten::addmm.default", lines["first"]) in fw_ops and ("aten::addmm.default", lines["second"]) in fw_ops
    # the recorder saw what the compiled graphs ran on the device (it is off while dynamo traces)
    run_ops = {o["op"] for o in rep["ops"] if o["phase"] == "forward"}
    assert {"aten::addmm.default", "aten::relu.default"} <= run_ops


def test_fullgraph_script_has_no_break(tmp_path, emulator_lib):
    script = tmp_path / "fullgraph.py"
    script.write_text(FULLGRAPH_SCRIPT, encoding="utf-8")
    rc, rep, p = _probe(script, "--fail-on", "graph-break")
    assert rc == 0 and rep["status"] == "ok", p.stderr[-3000:]
    ex = rep["compile"]["explain"]
    assert ex["graph_break_count"] == 0 and ex["breaks"] == [] and ex["graph_count"] == 1
    assert {g["kind"] for g in rep["compile"]["graphs"]} == {"forward", "backward"}
