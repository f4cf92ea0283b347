"""A model zoo for the probe: tiny transformers models, two training steps each on the emulated neuron device.

Every model type of the pinned transformers (the `test` extra) with a causal LM, masked LM, sequence-to-sequence LM or
image classification head is a candidate with that head (and a type with only a sequence classification head, with
that one: see HEADS), plus hand-written entries for model kinds the issue found problems in (a time-series
transformer with a Student-t head). A candidate's config is shrunk to a tiny one without downloads (a composite
config, vision-language, audio or encoder-decoder, with each of its sub-configs shrunk the same way; OVERRIDES for the
types whose config validation the generic values break); a candidate is *buildable* when its tiny model trains one
step on the CPU; each model is probed (`neuron-migrate probe benchmarks/probe_zoo.py:<entry> --steps 2`,
one process each) and *runs* when the probe gives a complete report (status ok: exit 0, or exit 1 when it reports
something TorchNeuron cannot run). Nothing here depends on time: no timing is reported and a run's outcome does
not depend on the machine's speed (the per-model timeout only guards against a hang).

    python benchmarks/probe_zoo.py                     # all candidates, 2 probes at a time
    python benchmarks/probe_zoo.py --only causal_lm__llama,image_cls__vit --jobs 1
    python benchmarks/probe_zoo.py --out benchmarks/PROBE_ZOO.md --results benchmarks/probe_zoo.json

The module is also the probe's factory target: `probe_zoo.py:causal_lm__llama` builds the tiny llama with inputs.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach the network
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
VOCAB, SEQ, BATCH = 96, 12, 2
DEFAULT_RESULTS = REPO / "benchmarks" / "probe_zoo.json"
TV_RESULTS = REPO / "benchmarks" / "probe_zoo_torchvision.json"
MAX_PARAMS = 8_000_000  # "tiny": a config the generic shrink cannot bring under this is left out, with the reason

# Config keyword arguments that shrink a model, given only where the config class has the attribute. Passed to the
# constructor, so values it derives (head_dim, layer_types, ...) follow.
SHRINK = {
    "vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
    "num_key_value_heads": 1, "intermediate_size": 64, "max_position_embeddings": 64, "head_dim": 16,
    "n_layer": 2, "n_head": 2, "n_embd": 32, "n_positions": 64, "n_inner": 64, "n_ctx": 64, "d_model": 32,
    "num_layers": 2, "num_heads": 2, "d_ff": 64, "d_kv": 16, "ffn_dim": 64, "ffn_hidden_size": 64,
    "decoder_layers": 2, "decoder_attention_heads": 2, "decoder_ffn_dim": 64, "encoder_layers": 2,
    "encoder_attention_heads": 2, "encoder_ffn_dim": 64, "num_decoder_layers": 2,
    "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "n_shared_experts": 1,
    "num_experts_per_tok": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
    "kv_lora_rank": 16, "q_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
    "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, "embed_dim": 32, "rotary_dim": 8,
    "partial_rotary_factor": 0.5, "sliding_window": 16, "attention_window": 16, "num_codebooks": 1,
    "linear_num_key_heads": 2, "linear_num_value_heads": 2, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
    "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
}

# Types whose config validation or layer pattern the generic shrink breaks: the values that make a consistent tiny
# config (found by building each; the generic values stay for everything else).
OVERRIDES = {
    "gpt_neo": {"attention_types": [[["global", "local"], 1]]},
    "mamba2": {"num_heads": 4, "head_dim": 16, "n_groups": 1},
    # (use_cache=False: with only state-space layers in the cache, the mask code cannot ask it for a length)
    "bamba": {"mamba_n_heads": 4, "mamba_d_head": 16, "mamba_n_groups": 1, "use_cache": False},
    "granitemoehybrid": {"mamba_n_heads": 4, "mamba_d_head": 16, "mamba_n_groups": 1, "use_cache": False},
    "jamba": {"use_cache": False},
    "lfm2_moe": {"layer_types": ["full_attention", "conv"]},
    "zaya": {"num_experts_per_tok": 1},
    "diffllama": {"num_key_value_heads": 2},
    "longcat_flash": {"moe_topk": 2, "n_routed_experts": 4, "zero_expert_num": 2, "expert_ffn_hidden_size": 32,
                      "head_dim": 8, "num_key_value_heads": 2},
    "hgnet_v2": {"stem_channels": [3, 16, 16], "stage_in_channels": [16, 32, 64, 128],
                 "stage_mid_channels": [16, 16, 32, 32], "stage_out_channels": [32, 64, 128, 128],
                 "hidden_sizes": [32, 64, 128, 128], "stage_numb_of_layers": [2, 2, 2, 2]},
    "bailing_hybrid": {"num_expert_group": 1, "num_experts_per_token": 2, "linear_num_heads": 2, "linear_head_dim": 16,
                       "layer_group_size": 2},
    "cohere_compass_text": {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
    "kimi_linear": {"num_experts_per_token": 2},
    "gemma4_assistant": {"hidden_size_per_layer_input": 0},
    **{t: {"num_kv_shared_layers": 0, "vocab_size_per_layer_input": VOCAB, "hidden_size_per_layer_input": 8}
       for t in ("gemma3n_text", "gemma4", "gemma4_text")},
    "esmc": {"num_key_value_heads": 2},
    "bit": {"num_groups": 8},
    "mobilebert": {"embedding_size": 32, "intra_bottleneck_size": 32},
    "squeezebert": {"embedding_size": 32},
    "layoutlmv3": {"coordinate_size": 6, "shape_size": 4},
    "lilt": {"hidden_size": 48},  # six box embeddings of hidden_size // 6 each
    "luke": {"entity_vocab_size": 16, "entity_emb_size": 16},
    "perceiver": {"num_latents": 16, "d_latents": 32, "num_self_attends_per_block": 2, "num_self_attention_heads": 2,
                  "num_cross_attention_heads": 2, "max_position_embeddings": SEQ},  # the MLM decodes every position
    "efficientnet": {"width_coefficient": 0.25, "depth_coefficient": 0.25, "hidden_dim": 320},
    # vision models whose stages need more than 32 / 8 = 4 patches a side
    **{t: {"patch_size": 2, "window_size": 2} for t in ("swin", "swinv2", "donut-swin")},
    "convnext": {"patch_size": 2}, "convnextv2": {"patch_size": 2}, "mobilevitv2": {"image_size": 64, "patch_size": 2},
    "levit": {"image_size": 64, "patch_size": 16},
    "xlm": {"emb_dim": 32, "n_layers": 2, "n_heads": 2}, "flaubert": {"emb_dim": 32, "n_layers": 2, "n_heads": 2},
    "distilbert": {"dim": 32, "hidden_dim": 64, "n_layers": 2, "n_heads": 2},
    "roc_bert": {"pronunciation_embed_dim": 8, "shape_embed_dim": 8, "pronunciation_vocab_size": 16,
                 "shape_vocab_size": 16},
    # speech models: the audio encoder's and the projector's widths follow the shrunk ones
    "granite_speech": {"hidden_dim": 32, "dim_head": 16, "encoder_hidden_size": 32},
    "granite_speech_plus": {"hidden_dim": 32, "dim_head": 16, "encoder_hidden_size": 32},
    "nemo_speechlm": {"audio_hidden_size": 32, "blank_token_id": VOCAB - 1},
    # the hybrid layers share one transformer block, tied across them: two of them
    "zamba": {"layer_types": ["mamba", "hybrid", "mamba", "hybrid"], "num_hidden_layers": 4},
    "dots3_note": {"num_key_value_heads": 2}, "dots3_note_text": {"num_key_value_heads": 2},
    # multi-head latent attention: the rotary part is the head dimension the rotary embedding is built for, and
    # every head has its own keys and values
    **{t: {"head_dim": 8, "num_key_value_heads": 2}
       for t in ("deepseek_v3", "youtu", "axk1", "deepseek_v32", "glm_moe_dsa", "axk2")},
}
# Hybrid models whose layer pattern (layer_types) is a list for the full depth: one layer of each kind, in the order
# they first appear
LAYER_TYPES_ONE_EACH = {"zamba2", "lfm2_moe", "cohere_compass_text", "jamba", "kimi_linear", "lfm3",
                        "qwen3_5_text", "qwen3_5_moe_text", "qwen3_next", "qwen4_exp_text", "recurrent_gemma",
                        "bailing_hybrid", "qwen3_5", "qwen3_5_moe", "qwen4_exp"}


def _ids():
    import torch

    torch.manual_seed(0)
    return torch.randint(3, VOCAB, (BATCH, SEQ))


# The heads probed: entry prefix -> (the transformers auto mapping, the auto class). Every model type of the causal
# LM, masked LM, sequence-to-sequence LM and image classification mappings is a candidate with that head; a type of
# the sequence classification mapping is one only when it is in none of the others (an encoder such as DeBERTa has
# no other head here).
HEADS = {
    "causal_lm": ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "AutoModelForCausalLM"),
    "masked_lm": ("MODEL_FOR_MASKED_LM_MAPPING_NAMES", "AutoModelForMaskedLM"),
    "seq2seq_lm": ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "AutoModelForSeq2SeqLM"),
    "image_cls": ("MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES", "AutoModelForImageClassification"),
    "seq_cls": ("MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", "AutoModelForSequenceClassification"),
}
# vision configs: sizes given where the config has the attribute; a list default (one value per stage) keeps its
# length
VISION = {"image_size": 32, "patch_size": 8, "num_channels": 3, "embedding_size": 16, "window_size": 4, "num_labels": 3}
STAGES = {"depths": lambda i: 1, "hidden_sizes": lambda i: 16 * 2 ** i, "num_heads": lambda i: 2,
          "embed_dim": lambda i: 16 * 2 ** i, "mlp_ratios": lambda i: 2, "num_attention_heads": lambda i: 2}
IMAGE = 32


def head_types(head: str) -> list[str]:
    from transformers.models.auto import modeling_auto

    names = set(getattr(modeling_auto, HEADS[head][0]))
    if head == "seq_cls":
        for other in HEADS:
            if other != "seq_cls":
                names -= set(getattr(modeling_auto, HEADS[other][0]))
    return sorted(names)


def _shrink_kwargs(known: dict, head: str, vision: bool, model_type: str) -> dict:
    kwargs = {k: v for k, v in SHRINK.items() if k in known}
    if vision:
        kwargs.update({k: [v] * len(known[k]) if isinstance(known[k], (list, tuple)) else v
                       for k, v in VISION.items() if k in known and k != "num_labels"})
        for k, f in STAGES.items():
            if isinstance(known.get(k), (list, tuple)):
                kwargs[k] = [f(i) for i in range(len(known[k]))]
    kwargs.update({k: v for k, v in OVERRIDES.get(model_type, {}).items() if k in known})
    if model_type in LAYER_TYPES_ONE_EACH:
        for key in ("layer_types", "layers_block_type", "block_types"):
            if isinstance(known.get(key), list) and known[key]:
                kinds = list(dict.fromkeys(known[key]))
                kinds = kinds if len(kinds) > 1 else kinds * 2
                kwargs[key], kwargs["num_hidden_layers"] = kinds, len(kinds)
    return kwargs


def _tiny_sub_configs(cfg, head: str, model_type: str) -> dict:
    """Composite configs (a text and a vision or audio config, an encoder and a decoder, attention/FFN configs): each
    sub-config is shrunk the same way, recursively, and passed to the parent as a config object."""
    out = {}
    for name in getattr(cfg, "sub_configs", None) or {}:
        sub = getattr(cfg, name, None)
        if sub is None or not hasattr(sub, "to_dict"):
            continue
        known = sub.to_dict()
        vision = head == "image_cls" or "vision" in name or "image_size" in known
        kwargs = _shrink_kwargs(known, head, vision, model_type)
        kwargs.update(_tiny_sub_configs(sub, head, model_type))
        out[name] = type(sub)(**kwargs)
    return out


def tiny_config(model_type: str, head: str = "causal_lm"):
    from transformers import AutoConfig

    base = AutoConfig.for_model(model_type)
    kwargs = _shrink_kwargs(base.to_dict(), head, head == "image_cls", model_type)
    kwargs.update(_tiny_sub_configs(base, head, model_type))
    kwargs.update(OVERRIDES.get(model_type, {}))
    if head == "seq2seq_lm":  # labels are shifted right behind it into the decoder's inputs
        kwargs.setdefault("decoder_start_token_id", 0)
    if head == "image_cls":
        kwargs["num_labels"] = VISION["num_labels"]
    return AutoConfig.for_model(model_type, **kwargs)


def _vision_value(cfg, name: str, default):
    for c in (cfg, getattr(cfg, "vision_config", None)):
        v = getattr(c, name, None) if c is not None else None
        v = v[0] if isinstance(v, (list, tuple)) and v else v
        if isinstance(v, int):
            return v
    return default


def build(head: str, model_type: str):
    import torch
    import transformers

    cfg = tiny_config(model_type, head)
    if getattr(cfg, "architectures", []) is None:  # the auto class iterates it to pick among several classes
        cfg.architectures = []
    torch.manual_seed(0)
    model = getattr(transformers, HEADS[head][1]).from_config(cfg)
    if hasattr(model, "set_default_language"):  # X-MOD: one adapter per language, the first of the config's
        model.set_default_language(cfg.languages[0])
    n = sum(p.numel() for p in model.parameters())
    if n > MAX_PARAMS:
        raise ValueError(f"not tiny with the generic shrink ({n} parameters)")
    if head == "image_cls" and model.main_input_name == "input_ids":  # ImageGPT: images as colour-cluster ids
        g = torch.Generator().manual_seed(0)
        n = cfg.n_positions if hasattr(cfg, "n_positions") else SEQ
        return model, {"input_ids": torch.randint(0, cfg.vocab_size - 1, (BATCH, n), generator=g),
                       "labels": torch.randint(0, cfg.num_labels, (BATCH,), generator=g)}
    if head == "image_cls":
        g = torch.Generator().manual_seed(0)
        channels, size = _vision_value(cfg, "num_channels", 3), _vision_value(cfg, "image_size", IMAGE)
        return model, {"pixel_values": torch.randn(BATCH, channels, size, size, generator=g),
                       "labels": torch.randint(0, cfg.num_labels, (BATCH,), generator=g)}
    ids = _ids()
    if head == "seq_cls":
        return model, {"input_ids": ids, "labels": torch.tensor([0, 1])}
    return model, {"input_ids": ids, "labels": ids}


def time_series_student_t():
    """Issue 40, kind 1: TimeSeriesTransformer with a Student-t head (torch.distributions in the loss)."""
    import torch
    from transformers import TimeSeriesTransformerConfig, TimeSeriesTransformerForPrediction

    cfg = TimeSeriesTransformerConfig(
        prediction_length=4, context_length=8, lags_sequence=[1, 2], input_size=1, num_time_features=1, d_model=16,
        encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=16,
        decoder_ffn_dim=16, distribution_output="student_t")
    torch.manual_seed(0)
    model = TimeSeriesTransformerForPrediction(cfg)
    past = 8 + 2
    inputs = dict(past_values=torch.randn(BATCH, past), past_time_features=torch.randn(BATCH, past, 1),
                  past_observed_mask=torch.ones(BATCH, past), future_values=torch.randn(BATCH, 4),
                  future_time_features=torch.randn(BATCH, 4, 1))
    return model, inputs


HAND = {"time_series_student_t": time_series_student_t}

# torchvision: one model per classification family (weights=None, 10 classes), name -> (constructor keyword
# arguments, image size); torchvision needs its own environment (see main's --torchvision)
TORCHVISION = {
    "alexnet": ({}, 64), "convnext_tiny": ({}, 64), "densenet121": ({}, 64), "efficientnet_b0": ({}, 64),
    "efficientnet_v2_s": ({}, 64), "googlenet": ({}, 64), "inception_v3": ({"aux_logits": False}, 96), "maxvit_t": ({}, 224),
    "mnasnet0_5": ({}, 64), "mobilenet_v2": ({}, 64), "mobilenet_v3_large": ({}, 64),
    "mobilenet_v3_small": ({}, 64), "regnet_x_400mf": ({}, 64), "regnet_y_400mf": ({}, 64), "resnet18": ({}, 64),
    "resnet50": ({}, 64), "resnext50_32x4d": ({}, 64), "shufflenet_v2_x0_5": ({}, 64), "squeezenet1_0": ({}, 64),
    "swin_t": ({}, 64), "swin_v2_t": ({}, 64), "vgg11_bn": ({}, 64), "vit_b_16": ({"image_size": 32}, 32),
    "wide_resnet50_2": ({}, 64),
}


def torchvision_model(name: str):
    """A torchvision classifier with its cross-entropy loss, on a batch of random images."""
    import torch
    import torchvision

    class Classifier(torch.nn.Module):
        def __init__(self, net):
            super().__init__()
            self.net = net

        def forward(self, images, labels):
            out = self.net(images)
            logits = out if isinstance(out, torch.Tensor) else out[0]  # googlenet/inception: (logits, aux...)
            return torch.nn.functional.cross_entropy(logits, labels)

    kwargs, size = TORCHVISION[name]
    torch.manual_seed(0)
    model = Classifier(torchvision.models.get_model(name, weights=None, num_classes=10, **kwargs))
    g = torch.Generator().manual_seed(0)
    return model, {"images": torch.randn(BATCH, 3, size, size, generator=g),
                   "labels": torch.randint(0, 10, (BATCH,), generator=g)}


def __getattr__(name: str):  # factory targets: <head>__<model_type> (causal_lm__llama), or a hand-written entry
    head, sep, model_type = name.partition("__")
    if sep and head in HEADS:
        return lambda: build(head, model_type)
    if sep and head == "torchvision" and model_type in TORCHVISION:
        return lambda: torchvision_model(model_type)
    if name in HAND:
        return HAND[name]
    raise AttributeError(name)


def entries(only: set[str] | None) -> list[str]:
    out = [f"{head}__{t}" for head in HEADS for t in head_types(head)] + sorted(HAND)
    if only:
        out = [e for e in out if e.split("__")[-1] in only or e in only]
    return out


# ---------------------------------------------------------------------------------------------- phases


def cpu_check(entry: str, timeout: float = 600) -> dict:
    """Build the tiny model and train one step on the CPU, in a fresh process (a model's import can break the next)."""
    code = f"""
import json, sys, traceback
sys.path.insert(0, {str(REPO / 'benchmarks')!r})
import probe_zoo, torch
from neuron_migrate.probe.steps import forward_backward
try:
    model, inputs = getattr(probe_zoo, {entry!r})()
    n = sum(p.numel() for p in model.parameters())
    forward_backward(model, (), inputs, train=True)  # the probe's step, on the CPU
    print(json.dumps({{"buildable": True, "params": n}}))
except Exception as exc:
    msg = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
    print(json.dumps({{"buildable": False, "why": (type(exc).__name__ + ": " + msg)[:300]}}))
"""
    try:
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, cwd=REPO)
    except subprocess.TimeoutExpired:
        return {"buildable": False, "why": f"CPU check did not finish in {timeout:.0f} s"}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return {"buildable": False, "why": f"CPU check crashed (rc {p.returncode}): {p.stderr.strip()[-300:]}"}
    return json.loads(lines[-1])


def probe(entry: str, timeout: float) -> dict:
    cmd = [sys.executable, "-m", "neuron_migrate", "probe", f"benchmarks/probe_zoo.py:{entry}", "--steps", "2",
           "--format", "json", "--timeout", str(timeout)]
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout + 120)
    try:
        rep = json.loads(p.stdout)
    except ValueError:
        return {"rc": p.returncode, "status": "no report", "error": p.stderr.strip()[-400:]}
    err = rep.get("error") or {}
    return {
        "rc": p.returncode, "status": rep.get("status"), "steps": (rep.get("ranks") or [{}])[0].get("steps"),
        "error": err.get("message", "").splitlines()[0][:300] if err else None,
        "error_site": f"{err.get('lib_file') or err.get('file')}:{err.get('lib_line') or err.get('line')}" if err else None,
        "problems": rep.get("problems") or [],
        "fallback_ops": len(rep.get("cpu_fallback") or []),
        "upcast_ops": (rep.get("measured") or {}).get("upcast_ops") or [],
        "host_runs": [r["op"] for r in rep.get("host_runs") or []],
    }


def runs(r: dict) -> bool:
    return (r.get("probe") or {}).get("status") == "ok"


def render(results: dict[str, dict], versions: dict, total: int | None = None) -> str:
    built = {k: v for k, v in results.items() if v.get("buildable")}
    probed = {k: v for k, v in built.items() if v.get("probe")}
    ok = [k for k, v in probed.items() if runs(v)]
    L = ["# Probe zoo: tiny transformers models on the emulated neuron device\n",
         f"Generated by `python benchmarks/probe_zoo.py` (torch {versions.get('torch')}, transformers "
         f"{versions.get('transformers')}). Each buildable model ran `neuron-migrate probe ... --steps 2` (two training "
         "steps: forward, loss, backward, AdamW) on the emulated device; it *runs* when the probe gave a complete "
         "report (exit 0, or exit 1 when it reports what TorchNeuron cannot run).\n",
         "Candidates: every model type of the pinned transformers' causal LM, masked LM, sequence-to-sequence LM and "
         "image classification auto mappings, with that head, and the types of the sequence classification mapping "
         "that are in none of those, with that head; plus hand-written entries (a time-series transformer with a "
         "Student-t head). A candidate is *buildable* when its tiny config (no download; config values shrunk where "
         "the config has them, at most 8 M parameters; composite configs (vision-language, audio, encoder-decoder, "
         "attention/FFN sub-configs) with every sub-config shrunk the same way; `OVERRIDES` and "
         "`LAYER_TYPES_ONE_EACH` for the types whose config validation the generic values break) trains one step on "
         "the CPU with token ids (images for the image heads); one that is not is left out of the pass rate with the "
         "reason. torchvision's models: see the last section.\n",
         f"- candidates done: {len(results)}" + (f" of {total}" if total else "")
         + " (run in a fixed order, hand-written entries first, then by the sha1 of the name)",
         f"- buildable (tiny config trains a step on the CPU): {len(built)}",
         f"- probed: {len(probed)}; **run on the emulated device: {len(ok)} of {len(probed)}"
         + (f" ({100 * len(ok) / len(probed):.0f} %)**" if probed else "**"),
         f"- of them composite (a config built from sub-configs, each shrunk): {composite(probed)}, "
         f"{composite(ok)} run",
         "",
         "| head | candidates done | buildable | run |", "|---|---:|---:|---:|"]
    for head in [*HEADS, "hand-written"]:
        keys = [k for k in results if (k.split("__")[0] if "__" in k else "hand-written") == head]
        b = [k for k in keys if results[k].get("buildable")]
        L.append(f"| {head} | {len(keys)} | {len(b)} | {sum(runs(results[k]) for k in b)} |")
    L.append("")
    upcast = [k for k, v in probed.items() if (v["probe"].get("upcast_ops"))]
    if upcast:
        L.append(f"{len(upcast)} models (mixture-of-experts: transformers casts the expert ids with `.int()` before "
                 "`torch.histc` on an accelerator) run an op the table calls native on a dtype the host kernel lacks; "
                 "the emulated device runs it upcast and reports it (`upcast`). Before issue 40's fix these failed with "
                 "`\"histogram_cpu\" not implemented for 'Int'`.\n")
    L.append("## Probed\n\n| model | result | exit | reported (TorchNeuron cannot run / upcast / host runs) |")
    L.append("|---|---|---:|---|")
    for k in sorted(probed):
        v = probed[k]
        pr = v["probe"]
        res = "runs" if runs(v) else f"FAILS: {pr.get('error') or pr.get('status')} ({pr.get('error_site')})"
        notes = "; ".join(pr.get("problems") or [])
        if pr.get("upcast_ops"):
            notes += ("; " if notes else "") + "upcast: " + ", ".join(pr["upcast_ops"])
        if pr.get("host_runs"):
            notes += ("; " if notes else "") + f"{len(pr['host_runs'])} ops run on the host"
        L.append(f"| {k} | {res.replace('|', '/')} | {pr.get('rc')} | "
                 f"{notes.replace('|', '/')[:400]} |")
    left = {k: v for k, v in results.items() if not v.get("buildable")}
    if left:
        L.append("\n## Not buildable with the generic tiny config (left out of the pass rate)\n")
        kinds: dict[str, int] = {}
        for k in left:
            kind = why_kind(left[k].get("why", ""), k)
            kinds[kind] = kinds.get(kind, 0) + 1
        L += [f"- {n}: {kind}" for kind, n in sorted(kinds.items(), key=lambda kv: -kv[1])]
        L.append("\n| model | kind | why |\n|---|---|---|")
        for k in sorted(left):
            why = left[k].get("why", "")
            L.append(f"| {k} | {why_kind(why, k)} | {why.replace('|', '/')[:200]} |")
    L += render_torchvision()
    return "\n".join(L) + "\n"


def composite(entries) -> int:
    from transformers import AutoConfig

    return sum(bool(getattr(AutoConfig.for_model(e.split("__")[1]), "sub_configs", None))
               for e in entries if "__" in e)


def why_kind(why: str, entry: str = "") -> str:
    """What kind of reason keeps a candidate out of the pass rate (none of them is the emulated device: a candidate
    is buildable or not on the CPU alone)."""
    if why.startswith("ImportError"):
        return "needs a package outside the test extra"
    if why.startswith("ValueError: not tiny"):
        return "too large with the generic shrink"
    # (siglip2 takes its images as patch sequences with their spatial shapes; git's loss needs the image tokens)
    if entry == "image_cls__siglip2" or any(w in why for w in ("input_features", "inputs_embeds", "batch_size (0)")):
        return "needs inputs other than token ids or an image batch"
    if "has no attribute 'dropout'" in why:
        return "transformers 5.24 maps the type to a causal LM class that takes another (the decoder's) config"
    if entry == "causal_lm__gemma4_assistant":  # AutoConfig.for_model("gemma4_assistant") raises as it is
        return "transformers 5.24's default config for it fails its own validation"
    if "rope_theta" in why:
        return "transformers 5.24 cannot build it (the model reads an attribute its config lacks)"
    return "the generic tiny config is inconsistent for it"


def render_torchvision() -> list[str]:
    """The torchvision section, from the results of a `--torchvision` run in torchvision's own environment."""
    L = ["\n## torchvision's classification models\n"]
    if not TV_RESULTS.is_file():
        return L + ["Not run (no results file)."]
    doc = json.loads(TV_RESULTS.read_text())
    v, results = doc["versions"], doc["results"]
    built = {k: r for k, r in results.items() if r.get("buildable")}
    ok = [k for k, r in built.items() if runs(r)]
    L += [f"PyPI's torchvision does not import beside the project's torch 2.13.0 ('operator torchvision::nms does not "
          f"exist'), so these ran in a separate virtual environment with torch {v['torch']} and torchvision "
          f"{v['torchvision']} (the CUDA build, run on the CPU; the emulated device is built against that torch by "
          "the same `build.py`): `pip install torch==2.14.1 torchvision==0.29.1` and `pip install -e .`, then "
          "`python benchmarks/probe_zoo.py --torchvision`. One model per torchvision classification family "
          "(`TORCHVISION`), `weights=None`, 10 classes, cross-entropy loss, a batch of 2 random images (64x64; "
          "inception_v3 96 without its auxiliary head, maxvit_t 224, vit_b_16 built for 32); each ran `probe --steps 2` (AdamW) on the "
          "emulated device.\n",
          f"- models done: {len(results)} of {len(TORCHVISION)}; buildable: {len(built)}; "
          f"**run on the emulated device: {len(ok)} of {len(built)}**\n",
          "| model | result | exit | reported |", "|---|---|---:|---|"]
    for k in sorted(results):
        r = results[k]
        pr = r.get("probe") or {}
        if not r.get("buildable"):
            res = f"not buildable: {r.get('why')}"
        else:
            res = "runs" if runs(r) else f"FAILS: {pr.get('error') or pr.get('status')} ({pr.get('error_site')})"
        notes = "; ".join(pr.get("problems") or [])
        if pr.get("upcast_ops"):
            notes += ("; " if notes else "") + "upcast: " + ", ".join(pr["upcast_ops"])
        L.append(f"| {k.split('__')[-1]} | {res.replace('|', '/')} | {pr.get('rc')} | {notes.replace('|', '/')[:300]} |")
    return L


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--only", default="", help="comma-separated model types (or entries)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=900, help="per probe; guards against a hang only")
    ap.add_argument("--results", default=str(DEFAULT_RESULTS),
                    help="JSON results, read first: entries already done are not run again")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "PROBE_ZOO.md"))
    ap.add_argument("--fresh", action="store_true", help="ignore earlier results")
    ap.add_argument("--render", action="store_true", help="only write the page from the results file")
    ap.add_argument("--torchvision", action="store_true",
                    help=f"torchvision's models instead (results in {TV_RESULTS.name}; the page is written by --render "
                         "where transformers is installed)")
    a = ap.parse_args(argv)
    import torch

    if a.torchvision:
        import torchvision

        versions = {"torch": torch.__version__, "torchvision": torchvision.__version__}
        if a.results == str(DEFAULT_RESULTS):
            a.results = str(TV_RESULTS)
    else:
        import transformers

        versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    res_path = Path(a.results)
    results: dict[str, dict] = {}
    if res_path.is_file() and not a.fresh:
        doc = json.loads(res_path.read_text())
        if doc.get("versions") == versions:
            results = doc["results"]
    # hand-written entries first, then a fixed spread over the alphabet (a run cut short is still a fair sample)
    if a.render:
        Path(a.out).write_text(render(results, versions, len(entries(None))))
        return 0
    only = {x.strip() for x in a.only.split(",") if x.strip()} or None
    listed = [f"torchvision__{n}" for n in TORCHVISION if not only or n in only] if a.torchvision else entries(only)
    todo = [e for e in listed
            if not (e in results and (not results[e].get("buildable") or results[e].get("probe")))]
    todo.sort(key=lambda e: ("__" in e, hashlib.sha1(e.encode()).hexdigest()))

    lock = threading.Lock()

    def save():
        with lock:
            _save()

    def _save():
        tmp = res_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"versions": versions, "results": results}, indent=1, sort_keys=True))
        os.replace(tmp, res_path)
        if not a.torchvision:
            Path(a.out).write_text(render(results, versions, len(entries(None))))

    def one(entry: str) -> None:
        # the probe first (its child builds the model on the CPU); only a model that does not run is checked on the
        # CPU alone, to tell a model the generic tiny config cannot build from one the device fails on
        pr = probe(entry, a.timeout)
        if pr.get("status") == "ok":
            r = {"buildable": True, "probe": pr}
        else:
            r = cpu_check(entry, a.timeout)
            if r.get("buildable"):
                r["probe"] = pr
        with lock:
            results[entry] = r
        print(f"{entry}: {'runs' if runs(r) else (r.get('why') or (r.get('probe') or {}).get('error'))}", flush=True)
        save()

    from neuron_migrate.probe.emulator.build import library_path

    library_path(log=lambda m: print(m, file=sys.stderr))  # build once, before the probes (each finds it)
    with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        list(pool.map(one, todo))
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
