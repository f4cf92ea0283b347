"""The measured (Trn2/Trn3) path, exercised two ways:

- with a FAKE torch_neuronx (tests/probe/fake_torch_neuronx): NOT TorchNeuron; it maps `neuron` to the CPU and
  reports op tracking from a dispatch mode. It checks the probe's plumbing for torch_neuronx's API (device
  detection, clear/get tracking calls, host-untracked ops, first-call timing);
- on the emulated neuron device, which exposes the same tracking API from a real PrivateUse1 backend, so the
  same probe code path reads it.

Neither is TorchNeuron's behaviour; what differs between the two is asserted per backend.
"""
from __future__ import annotations

import os

import pytest

pytest.importorskip("torch")

from .helpers import FAKE_NEURONX, rel, run_cli, run_json  # noqa: E402

pytestmark = pytest.mark.slow  # end-to-end: trains, runs several processes or the whole corpus

FAKE_ENV = {"PYTHONPATH": os.pathsep.join([str(FAKE_NEURONX), os.environ.get("PYTHONPATH", "")])}


@pytest.fixture(params=["fake", "emulated"])
def backend(request):
    if request.param == "emulated":
        request.getfixturevalue("emulator_lib")
        return {"name": "emulated", "device": "emulate", "env": {}}
    return {"name": "fake", "device": "neuron", "env": FAKE_ENV}


def test_measured_path(backend):
    rc, rep, p = run_json([f"{rel('fallback_model.py')}:make", "--device", backend["device"], "--numerics",
                           "--steps", "2"], env_extra=backend["env"])
    assert rc == 0, p.stderr[-2000:]
    assert rep["device"] == "neuron"
    m = rep["measured"]
    cmp = {r["op"]: r for r in m["comparison"]}
    assert cmp["aten::atan2"]["measured"] == "cpu_fallback"
    assert cmp["aten::addmm"]["measured"] == "native" and cmp["aten::addmm"]["agree"] is True
    if cmp["aten::atan2"]["predicted"] == "cpu_fallback":
        assert cmp["aten::atan2"]["agree"] is True
    assert rep["numerics"]["neuron_vs_cpu"]["worst_rel"] == 0.0
    if backend["name"] == "fake":
        assert "fake_torch_neuronx" in m["module_file"] and not m["emulated"]
        assert m["fallback_ops"] == ["aten::_fft_r2c", "aten::atan2"]
        assert m["host_untracked"] == ["aten::linalg_qr"]
        assert cmp["aten::linalg_qr"]["measured"] == "host_untracked"
        assert rep["timing"]["first_call_reported"] and "first_step_s" in rep["timing"]
    else:
        assert m["emulated"] and rep["device_kind"] == "emulated"
        # on the emulated device every op without a device kernel is a tracked fallback, linalg included; the
        # kernel set is the table's (an op it rates native or partial gets a device kernel)
        assert {"aten::atan2", "aten::linalg_qr"} <= set(m["fallback_ops"])
        fft = cmp["aten::_fft_r2c"]
        assert fft["measured"] == ("native" if fft["predicted"] in ("native", "partial") else "cpu_fallback")
        assert m["host_untracked"] == [] and cmp["aten::linalg_qr"]["measured"] == "cpu_fallback"
        assert not rep["timing"]["first_call_reported"]  # no compile step to time on the host


def test_disagreement_is_reported_and_fails_fallback_check(backend):
    # addmm falls back although the table predicts native (fake: by its env var; emulated: no device kernel)
    env = dict(backend["env"], NM_FAKE_NEURONX_FALLBACK="aten::addmm", NM_EMULATOR_NO_KERNEL="aten::addmm")
    rc, rep, _ = run_json([f"{rel('mlp.py')}:make", "--device", backend["device"], "--fail-on", "fallback"],
                          env_extra=env)
    m = rep["measured"]
    assert "aten::addmm" in m["fallback_ops"]
    if backend["name"] == "fake":
        assert m["fallback_ops"] == ["aten::addmm"]
    row = next(r for r in m["comparison"] if r["op"] == "aten::addmm")
    assert row["predicted"] == "native" and row["measured"] == "cpu_fallback" and row["agree"] is False
    assert m["disagreements"] >= 1
    assert rc == 1 and rep["failed_checks"] == ["fallback"]


def test_rich_output_shows_predicted_vs_measured(backend):
    p = run_cli([f"{rel('fallback_model.py')}:make", "--device", backend["device"], "--steps", "1"],
                env_extra=backend["env"])
    assert p.returncode == 0
    assert "measured on device" in p.stdout
    if backend["name"] == "fake":
        assert "host_untracked" in p.stdout and "first call (compile)" in p.stdout
    else:
        assert "EMULATED" in p.stdout and "emulated neuron device" in p.stdout and "aten::atan2" in p.stdout


def test_device_neuron_without_torch_neuronx_is_an_error():
    rc, rep, _ = run_json([f"{rel('mlp.py')}:make", "--device", "neuron"])
    assert rc == 2 and "torch_neuronx not importable" in rep["error"]["message"]
