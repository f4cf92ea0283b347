"""torch.compile(backend="neuron") under the probe: a graph the backend cannot compile is a refusal, recorded with
the graph's line, and the graph runs eagerly (report, don't crash); --strict raises."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from neuron_migrate.probe.emulator import compile as cl  # noqa: E402


def _graph():
    def f(x):
        return torch.relu(x) * 2  # the graph's user line

    gm = torch.fx.symbolic_trace(f)
    line = f.__code__.co_firstlineno + 1
    for node in gm.graph.nodes:  # what dynamo records on each node of the graphs it hands a backend
        if node.op == "call_function":
            node.meta["stack_trace"] = f'  File "{__file__}", line {line}, in f\n    return torch.relu(x) * 2\n'
    return gm, line


def test_a_refused_graph_is_recorded_and_runs_eagerly(monkeypatch):
    monkeypatch.setitem(cl._log, "strict", False)
    cl.reset_log()
    gm, line = _graph()
    # example inputs that do not match the graph: aot_autograd cannot compile it
    fn = cl.neuron_backend(gm, [])
    x = torch.tensor([-1.0, 2.0])
    assert torch.equal(fn(x), torch.tensor([0.0, 4.0]))  # the graph as captured, eager
    (r,) = cl.report()["refusals"]
    assert r["graph"] == 0 and r["error"]
    assert r["file"] == __file__ and r["line"] == line


def test_strict_raises_the_refusal(monkeypatch):
    monkeypatch.setitem(cl._log, "strict", True)
    cl.reset_log()
    gm, _ = _graph()
    with pytest.raises(Exception):
        cl.neuron_backend(gm, [])
    assert cl.report()["refusals"] == []
