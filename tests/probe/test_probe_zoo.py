"""A fixed sample of the probe zoo (benchmarks/probe_zoo.py; results in benchmarks/PROBE_ZOO.md): tiny transformers
models run two training steps on the emulated device and give a complete report.

The sample (49 models, fixed) is spread over the zoo's families: dense decoders, state-space and hybrid models,
mixture-of-experts models, encoders with a decoder head, encoder-decoders (the decoder's causal LM head and the
sequence-to-sequence head), masked LM and sequence classification heads, vision models, and the kinds issue 40
found failing: mixture-of-experts models (histc on int32 expert ids: a host kernel without the dtype) and a
time-series transformer with a Student-t head (a CPU scalar in `1 - x` made the gradient land on the host). Each
model is one probe (`probe benchmarks/probe_zoo.py:<entry> --steps 2`); they spread over pytest-xdist's workers."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from .helpers import REPO, run_json  # noqa: E402

pytestmark = pytest.mark.slow

FAMILIES = {
    "dense decoder": ["llama", "gpt2", "gemma2", "gemma3_text", "phi3", "qwen3", "falcon", "bloom", "opt", "gptj",
                      "starcoder2", "stablelm"],
    "state-space / hybrid": ["mamba", "falcon_mamba", "rwkv", "falcon_h1", "nemotron_h", "olmo_hybrid"],
    "mixture of experts": ["mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "gpt_oss", "olmoe", "granitemoe",
                           "jetmoe", "phimoe"],
    "encoder with a decoder head": ["bert", "roberta", "electra", "xlnet", "big_bird", "megatron-bert"],
    "encoder-decoder (decoder head)": ["bart", "marian", "pegasus", "prophetnet", "whisper", "trocr"],
}
SAMPLE = [f"causal_lm__{t}" for types in FAMILIES.values() for t in types] + [
    "seq2seq_lm__longt5", "seq2seq_lm__blenderbot-small",  # encoder-decoder, sequence-to-sequence head
    "masked_lm__mra", "masked_lm__ibert", "masked_lm__roformer",  # encoders, masked LM head
    "seq_cls__mistral4",  # a type with only a sequence classification head
    "image_cls__dinov2_with_registers", "image_cls__pvt_v2", "image_cls__swiftformer",  # vision
    "time_series_student_t",  # torch.distributions in the loss: exit 1, reported at its lines
]
# transformers' grouped-experts path casts the expert ids with .int() before torch.histc on an accelerator (JetMoE
# routes its own way)
HISTC_UPCAST = {f"causal_lm__{t}" for t in FAMILIES["mixture of experts"]} - {"causal_lm__jetmoe"}


def test_the_sample_is_forty_or_more_distinct_zoo_candidates():
    import sys

    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import probe_zoo
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    assert len(set(SAMPLE)) == len(SAMPLE) >= 40
    assert set(SAMPLE) <= set(probe_zoo.entries(None))


@pytest.mark.parametrize("entry", SAMPLE)
def test_zoo_model_runs_two_steps_with_a_complete_report(emulator_lib, entry):
    rc, rep, p = run_json([f"benchmarks/probe_zoo.py:{entry}", "--steps", "2"], timeout=900)
    assert rep["status"] == "ok", (rep.get("error"), p.stderr[-2000:])
    assert rc in (0, 1) and rep["ranks"][0]["steps"] == 2
    assert rep["device_kind"] == "emulated"
    if rc == 1:  # exit 1 only for what TorchNeuron cannot run, each with its line
        assert rep["problems"] and rep["failed_checks"] == ["unsupported"]
    if entry in HISTC_UPCAST:  # run upcast on the host and reported, where it failed before issue 40's fix
        assert "aten::histc:Int->Double" in rep["measured"]["upcast_ops"]
    if entry == "time_series_student_t":
        assert rc == 1
        dist = next(x for x in rep["problems"] if x.startswith("torch.distributions: unsupported on TorchNeuron"))
        assert "time_series" in dist
    else:
        assert rc == 0, rep["problems"]
