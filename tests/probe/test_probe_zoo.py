"""A fixed sample of the probe zoo (benchmarks/probe_zoo.py; results in benchmarks/PROBE_ZOO.md): tiny transformers
models run two training steps on the emulated device and give a complete report. The sample holds the kinds issue 40
found failing: a mixture-of-experts model (histc on int32 expert ids: a host kernel without the dtype) and a
time-series transformer with a Student-t head (a CPU scalar in `1 - x` made the gradient land on the host)."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from .helpers import run_json  # noqa: E402

pytestmark = pytest.mark.slow

SAMPLE = ["causal_lm__llama", "causal_lm__gpt2", "causal_lm__mixtral", "causal_lm__qwen2_moe",
          "time_series_student_t"]


@pytest.fixture(scope="module")
def reports(emulator_lib):
    out = {}

    def get(entry):
        if entry not in out:
            out[entry] = run_json([f"benchmarks/probe_zoo.py:{entry}", "--steps", "2"], timeout=900)
        return out[entry]

    return get


@pytest.mark.parametrize("entry", SAMPLE)
def test_zoo_model_runs_two_steps_with_a_complete_report(reports, entry):
    rc, rep, p = reports(entry)
    assert rep["status"] == "ok", (rep.get("error"), p.stderr[-2000:])
    assert rc in (0, 1) and rep["ranks"][0]["steps"] == 2
    assert rep["device_kind"] == "emulated"
    if rc == 1:  # exit 1 only for what TorchNeuron cannot run, each with its line
        assert rep["problems"] and rep["failed_checks"] == ["unsupported"]


@pytest.mark.parametrize("entry", ["causal_lm__mixtral", "causal_lm__qwen2_moe"])
def test_moe_histc_on_int_runs_upcast_and_is_reported(reports, entry):
    _, rep, _ = reports(entry)
    assert "aten::histc:Int->Double" in rep["measured"]["upcast_ops"]


def test_time_series_student_t_reports_distributions_at_its_line(reports):
    rc, rep, _ = reports("time_series_student_t")
    assert rc == 1
    dist = next(x for x in rep["problems"] if x.startswith("torch.distributions: unsupported on TorchNeuron"))
    assert "time_series" in dist
