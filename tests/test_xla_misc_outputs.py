"""The rewritten fixtures of the torch_xla core/misc/env/compile rules are real programs: each `.out.py` listed
here has no torch_xla left, imports, and (a script) runs to the end on CPU with the test-only `neuron` stand-in
(`tests/integration/neuron_on_cpu`), torch_xla absent. Plus the inserted helpers checked against the behaviour
of the torch_xla utilities they replace."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures" / "rules"
SHIM = Path(__file__).parent / "integration" / "neuron_on_cpu"
# NM133/pair_unsafe: a lone xm.set_rng_state(seed) becomes torch.manual_seed only under --unsafe-fixes (it reseeds
# the CPU generator too); the safe NM133/pair keeps its torch_xla import, with a finding
CASES = ["NM107/probes", "NM133/pair_unsafe", "NM130/loops", "NM135/flag", "NM105/train_step", "NM406/train_step",
         "NM106/comments", "NM144/tracker", "NM145/generator", "NM146/mnist_style", "NM100/guarded"]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.slow
def test_rewritten_fixture_runs(case, tmp_path):
    pytest.importorskip("torch")
    out = FIXTURES / f"{case}.out.py"
    text = out.read_text()
    probe = case == "NM107/probes"  # the probe keeps its guarded `import torch_xla`, on purpose
    assert probe or not re.search(r"^\s*(import|from)\s+torch_xla", text, re.M)
    env = {**os.environ, "PYTHONPATH": str(SHIM), "OMP_NUM_THREADS": "1"}
    if "__main__" in text:
        cmd = [sys.executable, str(out)]
    else:
        cmd = [sys.executable, "-c", f"import runpy; runpy.run_path({str(out)!r}, run_name='fixture')"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    if probe:
        assert "xla installed: False False" in proc.stdout  # the probes still answer: torch_xla is not installed


def _helper(name: str, **modules):
    from neuron_migrate.rules.builtin import xla_loaders, xla_utils  # noqa: F401  (register the helpers)
    from neuron_migrate.rules.helpers import HELPERS

    spec = HELPERS[name]
    namespace = dict(modules)
    for dep in spec.requires:
        exec(HELPERS[dep].source.format(**{k: k for k in (HELPERS[dep].imports or {})}), namespace)
    exec(spec.source.format(**{k: k for k in (spec.imports or {})}), namespace)
    return namespace[name]


def test_rate_tracker_helper_smooths_like_xm_rate_tracker(monkeypatch):
    clock = types.SimpleNamespace(now=0.0)
    fake_time = types.SimpleNamespace(time=lambda: clock.now)
    tracker = _helper("_RateTracker", os=os, time=fake_time)()
    tracker.add(10)
    clock.now = 2.0
    assert tracker.rate() == pytest.approx(5.0)  # first rate: 10 examples in 2 s, nothing to smooth with
    tracker.add(30)
    clock.now = 4.0
    assert tracker.rate() == pytest.approx(0.6 * 15.0 + 0.4 * 5.0)  # default smoothing 0.4 with the previous rate
    assert tracker.global_rate() == pytest.approx(40 / 4.0)
    clock.now = 4.0
    assert tracker.rate() == 0.0  # no time passed since the last rate()
    monkeypatch.setenv("RATE_TRACKER_SMOOTHING", "0.0")
    fresh = _helper("_RateTracker", os=os, time=fake_time)()
    fresh.add(8)
    clock.now = 8.0
    fresh.rate()
    fresh.add(8)
    clock.now = 12.0
    assert fresh.rate() == pytest.approx(2.0)  # smoothing 0: the plain current rate


def test_batch_to_device_moves_nested_tensors():
    torch = pytest.importorskip("torch")
    from collections import namedtuple

    move = _helper("_batch_to_device", torch=torch)
    Pair = namedtuple("Pair", "x y")
    moved = move({"a": [torch.ones(1)], "b": Pair(torch.zeros(1), "label"), "n": 3}, torch.device("meta"))
    assert moved["a"][0].device.type == "meta" and isinstance(moved["a"], list)
    assert isinstance(moved["b"], Pair) and moved["b"].x.device.type == "meta" and moved["b"].y == "label"
    assert moved["n"] == 3
