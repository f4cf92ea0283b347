"""The measured (Trn2/Trn3) path, exercised with a FAKE torch_neuronx (tests/probe/fake_torch_neuronx).

The fake is NOT TorchNeuron: it maps the `neuron` device to the CPU and reports op tracking from a dispatch
mode. These tests check the probe's plumbing (device detection, clear/get tracking calls, host-untracked ops,
predicted vs measured, first-call timing, neuron-vs-CPU numerics), not TorchNeuron's behaviour.
"""
from __future__ import annotations

import os

import pytest

pytest.importorskip("torch")

from .helpers import FAKE_NEURONX, rel, run_cli, run_json  # noqa: E402

ENV = {"PYTHONPATH": os.pathsep.join([str(FAKE_NEURONX), os.environ.get("PYTHONPATH", "")])}


def test_measured_path_with_fake_module():
    rc, rep, p = run_json([f"{rel('fallback_model.py')}:make", "--device", "auto", "--numerics", "--steps", "2"],
                          env_extra=ENV)
    assert rc == 0, p.stderr[-2000:]
    assert rep["device"] == "neuron"
    m = rep["measured"]
    assert "fake_torch_neuronx" in m["module_file"]
    assert m["fallback_ops"] == ["aten::_fft_r2c", "aten::atan2"]
    assert m["host_untracked"] == ["aten::linalg_qr"]
    cmp = {r["op"]: r for r in m["comparison"]}
    assert cmp["aten::atan2"]["measured"] == "cpu_fallback"
    assert cmp["aten::linalg_qr"]["measured"] == "host_untracked"
    assert cmp["aten::addmm"]["measured"] == "native" and cmp["aten::addmm"]["agree"] is True
    if cmp["aten::atan2"]["predicted"] == "cpu_fallback":
        assert cmp["aten::atan2"]["agree"] is True
    assert rep["timing"]["first_call_reported"] and "first_step_s" in rep["timing"]
    assert rep["numerics"]["neuron_vs_cpu"]["worst_rel"] == 0.0


def test_disagreement_is_reported_and_fails_fallback_check():
    # the fake now says addmm fell back, which the table predicts native
    env = dict(ENV, NM_FAKE_NEURONX_FALLBACK="aten::addmm")
    rc, rep, _ = run_json([f"{rel('mlp.py')}:make", "--device", "neuron", "--fail-on", "fallback"], env_extra=env)
    m = rep["measured"]
    assert m["fallback_ops"] == ["aten::addmm"]
    row = next(r for r in m["comparison"] if r["op"] == "aten::addmm")
    assert row["predicted"] == "native" and row["measured"] == "cpu_fallback" and row["agree"] is False
    assert m["disagreements"] >= 1
    assert rc == 1 and rep["failed_checks"] == ["fallback"]


def test_rich_output_shows_predicted_vs_measured():
    p = run_cli([f"{rel('fallback_model.py')}:make", "--device", "neuron", "--steps", "1"], env_extra=ENV)
    assert p.returncode == 0
    assert "measured on device" in p.stdout and "host_untracked" in p.stdout and "first call (compile)" in p.stdout


def test_device_neuron_without_torch_neuronx_is_an_error():
    rc, rep, _ = run_json([f"{rel('mlp.py')}:make", "--device", "neuron"])
    assert rc == 2 and "torch_neuronx not importable" in rep["error"]["message"]
