"""Namespace use seen at run time (sparse layouts, nested tensors, torch.distributions, torch.func), reported
with the table's status and the user's line; sparse/nested ops take the namespace's status."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")

from .helpers import marker_lines, run_json  # noqa: E402

MODEL = '''import torch
from torch import nn


class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        lp = torch.distributions.Normal(h, 1.0).log_prob(x).sum()  # PROBE: dist
        v = torch.func.vmap(torch.sin)(h)  # PROBE: vmap
        s = h.detach().to_sparse()  # PROBE: sparse
        n = torch.nested.nested_tensor([h[0].detach(), h[1, :2].detach()])  # PROBE: nested
        return h.sum() + lp + v.sum() + s.to_dense().sum() * 0  # PROBE: ret


def make():
    return M(), (torch.randn(2, 4),)
'''


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    p = tmp_path_factory.mktemp("ns") / "ns_model.py"
    p.write_text(MODEL)
    return p


@pytest.mark.slow
def test_namespaces_on_the_cpu_trace(model):
    rc, rep, p = run_json([f"{model}:make", "--steps", "1", "--device", "cpu", "--fail-on", "unsupported"])
    assert rep["status"] == "ok", p.stderr[-3000:]
    lines = marker_lines(model)
    ns = {u["namespace"]: u for u in rep["namespaces"]}
    assert set(ns) == {"torch.distributions", "torch.func", "torch.sparse", "torch.nested"}
    for name, tag in (("torch.distributions", "dist"), ("torch.func", "vmap"), ("torch.sparse", "sparse"),
                      ("torch.nested", "nested")):
        assert ns[name]["status"] == "unsupported"  # what the shipped table says of each
        assert any(s["site"].endswith(f"ns_model.py:{lines[tag]}") for s in ns[name]["sites"]), (name, ns[name]["sites"])
    assert "call torch.func.vmap" in ns["torch.func"]["how"]
    # the ops on sparse/nested tensors are unsupported (not "unknown"), so --fail-on unsupported fires
    sparse_ops = [r for r in rep["unsupported"] if any(s.get("namespace") == "torch.sparse" for s in r["sites"])]
    sparse_lines = {s["line"] for r in sparse_ops for s in r["sites"]}
    assert lines["sparse"] in sparse_lines and sparse_lines <= {lines["sparse"], lines["ret"]}  # to_sparse, to_dense
    assert rep["summary"]["by_status"]["unsupported"]["ops"] > 0
    assert rc == 1 and rep["failed_checks"] == ["unsupported"]


@pytest.mark.slow
def test_sparse_is_reported_on_the_emulated_device_and_the_run_goes_on(model, emulator_lib):
    # report, don't crash (issue 40): the sparse tensor is kept on the host, its ops run there, the run completes
    rc, rep, p = run_json([f"{model}:make", "--steps", "1"])
    lines = marker_lines(model)
    assert rc == 1 and rep["status"] == "ok" and rep["device_kind"] == "emulated", (rep.get("error"), p.stderr[-2000:])
    ns = {u["namespace"]: u for u in rep["namespaces"]}
    assert {"torch.distributions", "torch.func", "torch.sparse", "torch.nested"} <= set(ns)
    assert all(ns[n]["status"] == "unsupported" for n in ("torch.sparse", "torch.nested"))
    sparse = next(x for x in rep["problems"] if x.startswith("torch.sparse: unsupported on TorchNeuron"))
    assert f"ns_model.py:{lines['sparse']}" in sparse, sparse
    assert any(r.get("line") == lines["sparse"] for r in rep["host_runs"]), rep["host_runs"]
    assert any(o["line"] == lines["ret"] for o in rep["ops"])  # the line after the sparse and nested ones ran


@pytest.mark.slow
def test_sparse_fails_on_the_emulated_device_at_its_line_with_strict(model, emulator_lib):
    rc, rep, _ = run_json([f"{model}:make", "--steps", "1", "--strict"])
    lines = marker_lines(model)
    assert rc == 2 and rep["status"] == "error" and rep["device_kind"] == "emulated"
    assert rep["error"]["line"] == lines["sparse"]  # a dense-only device raises where the sparse tensor is made
    ns = {u["namespace"]: u for u in rep["namespaces"]}
    assert ns["torch.sparse"]["status"] == "unsupported"
    assert {"torch.distributions", "torch.func"} <= set(ns)  # the uses before the failure are still reported
    assert any(o.get("raised") and o["line"] == lines["sparse"] for o in rep["ops"])
