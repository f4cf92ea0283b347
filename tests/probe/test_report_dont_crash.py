"""Report, don't crash: a construct TorchNeuron cannot run (sparse, nested tensors; ops the table calls
unsupported) is recorded at its line, run on the host, and the rest of the model is still probed; the exit is 1.
`--strict` stops at it as the device would, with one translated line instead of the dispatcher's 5 kB dump."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")

from .helpers import marker_lines, run_cli, run_json  # noqa: E402

pytestmark = pytest.mark.slow

MODEL = '''import torch
from torch import nn


class GraphNet(nn.Module):
    def __init__(self, n=5):
        super().__init__()
        idx = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
        self.fc = nn.Linear(4, 4)
        self.register_buffer("adj", torch.sparse_coo_tensor(idx, torch.ones(4), (n, n)))  # PROBE: adj
        self.out = nn.Linear(4, 2)

    def forward(self, x):
        h = self.fc(x)
        h = torch.sparse.mm(self.adj, h)  # PROBE: spmm
        n = torch.nested.nested_tensor([h[0], h[1, :2]])  # PROBE: nested
        pad = n.to_padded_tensor(0.0)  # PROBE: pad
        y = torch.atan2(self.out(h), torch.ones(5, 2, device=x.device))  # PROBE: after
        return y.sum() + pad.sum()  # PROBE: ret


def make():
    return GraphNet(), (torch.randn(5, 4),)
'''


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    p = tmp_path_factory.mktemp("rdc") / "graph_model.py"
    p.write_text(MODEL)
    return p


def test_sparse_and_nested_are_reported_at_their_lines_and_the_run_goes_on(model, emulator_lib):
    rc, rep, p = run_json([f"{model}:make", "--steps", "2"])
    lines = marker_lines(model)
    f = str(model)  # outside the working directory: reported with its full path
    assert rep["status"] == "ok", (rep.get("error"), p.stderr[-2000:])
    assert rc == 1 and "unsupported" in rep["failed_checks"]  # what TorchNeuron cannot run makes the exit 1
    problems = rep["problems"]
    sparse = next(x for x in problems if x.startswith("torch.sparse: unsupported on TorchNeuron"))
    assert f"buffer `adj` created at {f}:{lines['adj']}" in sparse, sparse
    assert f"{f}:{lines['spmm']}" in sparse.split("used at", 1)[1], sparse
    nested = next(x for x in problems if x.startswith("torch.nested: unsupported on TorchNeuron"))
    assert f"{f}:{lines['nested']}" in nested and f"{f}:{lines['pad']}" in nested, nested
    # the ops after the unsupported constructs were reached and reported, in both steps
    after = [o for o in rep["ops"] if o.get("line") == lines["after"] and o["phase"] == "forward"]
    assert {o["op"] for o in after} >= {"aten::atan2.default", "aten::addmm.default"}, after
    assert rep["ranks"][0]["steps"] == 2
    host = {(r["op"], r.get("line")) for r in rep["host_runs"]}
    assert ("aten::_sparse_addmm.default", lines["spmm"]) in host and \
        ("aten::_nested_tensor_from_tensor_list.default", lines["nested"]) in host, host
    # the backward of the sparse product ran on the host too, attributed to the forward line that made it
    assert ("aten::mm.default", lines["spmm"]) in host, host
    assert all(r.get("line") for r in rep["host_runs"] if r["op"] != "aten::_to_copy.default"), rep["host_runs"]
    # nothing raw from the dispatcher anywhere in the report
    assert "Could not run" not in p.stdout


def test_strict_stops_as_the_device_would_with_one_line(model, emulator_lib):
    rc, rep, p = run_json([f"{model}:make", "--steps", "1", "--strict"])
    assert rc == 2 and rep["status"] == "error"
    e = rep["error"]
    assert e["message"].startswith("torch.sparse: unsupported on TorchNeuron: "), e["message"]
    assert "\n" not in e["message"] and "Could not run" not in e["message"]
    assert "Sparseneuron" in e["dispatcher_message"] and len(e["dispatcher_message"]) <= 600
    assert "Could not run" not in e["traceback"]


def test_strict_and_keep_going_contradict(model):
    p = run_cli([f"{model}:make", "--strict", "--keep-going"])
    assert p.returncode == 2 and "contradict" in p.stderr


SCRIPT = '''import torch
dev = torch.device("neuron")
w = torch.nn.Parameter(torch.zeros(4, device=dev))
s = torch.sparse_coo_tensor(torch.tensor([[0, 2]]), torch.ones(2), (4,)).to(dev)  # PROBE: to
acc = torch.zeros(4, device=dev)
acc.add_(s)  # PROBE: add
print("acc", acc.cpu().tolist(), acc.device.type)
(w * acc).sum().backward()
print("grad", w.grad.cpu().tolist(), w.grad.device.type)
'''


def test_a_script_on_the_device_writes_host_results_back_into_device_tensors(tmp_path, emulator_lib):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    rc, rep, p = run_json([str(script)], cwd=tmp_path)
    lines = marker_lines(script)
    assert rc == 1 and rep["status"] == "ok", (rep.get("error"), p.stderr[-2000:])
    out = rep["outcome"]["stdout"]["tail"]
    assert "acc [1.0, 0.0, 1.0, 0.0] neuron" in out and "grad [1.0, 0.0, 1.0, 0.0] neuron" in out, out
    (sparse,) = [x for x in rep["problems"] if x.startswith("torch.sparse")]
    assert f"train.py:{lines['to']}" in sparse and f"train.py:{lines['add']}" in sparse, sparse
