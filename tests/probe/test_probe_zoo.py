"""A fixed sample of the probe zoo (benchmarks/probe_zoo.py; results in benchmarks/PROBE_ZOO.md): tiny transformers
models run two training steps on the emulated device and give a complete report.

The sample (51 models, fixed) is spread over the zoo's families, so that each kind of model that needed something of
the emulated device is in it: dense decoders, state-space and hybrid models (linear attention, one layer of each
kind), mixture-of-experts models (histc on int32 expert ids: a host kernel without the dtype, run upcast),
multi-head latent attention, composite models built from sub-configs (vision-language, audio, encoder-decoder),
encoders with a decoder head and with a masked LM head, encoder-decoders (the decoder's causal LM head and the
sequence-to-sequence head), sequence classification, vision models, and a time-series transformer with a Student-t
head (a CPU scalar in `1 - x` made the gradient land on the host; torch.distributions is reported) and T5Gemma 2
(transformers builds its masks with torch.vmap: torch.func is reported). Each model is
one probe (`probe benchmarks/probe_zoo.py:<entry> --steps 2`); they spread over pytest-xdist's workers (a probe is
about 4 s of CPU)."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from .helpers import REPO, run_json  # noqa: E402

pytestmark = pytest.mark.slow

FAMILIES = {
    "dense decoder": ["llama", "gpt2", "gemma2", "phi3", "falcon", "bloom", "opt", "starcoder2"],
    "state-space / hybrid": ["mamba", "mamba2", "rwkv", "falcon_h1", "nemotron_h", "jamba", "bamba", "qwen3_next"],
    "mixture of experts": ["mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "gpt_oss", "olmoe", "jetmoe", "phimoe"],
    "multi-head latent attention": ["deepseek_v3"],
    "composite (vision-language)": ["gemma3", "mllama", "qwen3_5"],
    "encoder with a decoder head": ["bert", "xlnet", "big_bird"],
    "encoder-decoder (decoder head)": ["bart", "prophetnet", "whisper", "trocr"],
}
SAMPLE = [f"causal_lm__{t}" for types in FAMILIES.values() for t in types] + [
    "seq2seq_lm__longt5", "seq2seq_lm__t5", "seq2seq_lm__switch_transformers",  # encoder-decoders, seq2seq head
    "seq2seq_lm__qwen2_audio", "seq2seq_lm__encoder-decoder",  # composite: audio + text, two sub-configs
    "seq2seq_lm__t5gemma2",  # composite (encoder and decoder configs); its masks use torch.vmap: exit 1, at its lines
    "masked_lm__mra", "masked_lm__deberta", "masked_lm__albert",  # encoders, masked LM head
    "seq_cls__mistral4",  # a type with only a sequence classification head
    "image_cls__dinov2_with_registers", "image_cls__pvt_v2", "image_cls__swin", "image_cls__convnextv2",
    "image_cls__clip",  # vision (clip: a composite config)
    "time_series_student_t",  # torch.distributions in the loss: exit 1, reported at its lines
]
# transformers' grouped-experts path casts the expert ids with .int() before torch.histc on an accelerator (JetMoE
# routes its own way)
HISTC_UPCAST = {f"causal_lm__{t}" for t in FAMILIES["mixture of experts"]} - {"causal_lm__jetmoe"}
# the entries that use what the table calls unsupported: the namespace and a file the report names for it
EXIT_1 = {"time_series_student_t": ("torch.distributions", "time_series"),
          "seq2seq_lm__t5gemma2": ("torch.func", "transformers/masking_utils.py")}


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
    if entry in EXIT_1:  # what TorchNeuron cannot run (the compatibility table), reported at its lines
        namespace, where = EXIT_1[entry]
        assert rc == 1
        found = next(x for x in rep["problems"] if x.startswith(f"{namespace}: unsupported on TorchNeuron"))
        assert where in found
    else:
        assert rc == 0, rep["problems"]
