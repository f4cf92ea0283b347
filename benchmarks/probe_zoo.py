"""A model zoo for the probe: tiny transformers models, two training steps each on the emulated neuron device.

Every causal language model class of the pinned transformers (the `test` extra) whose config can be shrunk to a
tiny one without downloads is a candidate (plus hand-written entries for model kinds the issue found problems in:
a time-series transformer with a Student-t head). A candidate is *buildable* when its tiny model trains one step on
the CPU; each model is probed (`neuron-migrate probe benchmarks/probe_zoo.py:<entry> --steps 2`,
one process each) and *runs* when the probe gives a complete report (status ok: exit 0, or exit 1 when it reports
something TorchNeuron cannot run). Nothing here depends on time: no timing is reported and a run's outcome does
not depend on the machine's speed (the per-model timeout only guards against a hang).

    python benchmarks/probe_zoo.py                     # all candidates, 2 probes at a time
    python benchmarks/probe_zoo.py --only llama,mixtral --jobs 1
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
MAX_PARAMS = 4_000_000  # "tiny": a config the generic shrink cannot bring under this is left out, with the reason

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


def _ids():
    import torch

    torch.manual_seed(0)
    return torch.randint(3, VOCAB, (BATCH, SEQ))


def causal_lm_types() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def tiny_config(model_type: str):
    from transformers import AutoConfig

    base = AutoConfig.for_model(model_type)
    known = base.to_dict()
    if any(k.endswith("_config") and isinstance(v, dict) for k, v in known.items()):
        raise ValueError("composite config (sub-configs): needs a hand-written tiny config")
    kwargs = {k: v for k, v in SHRINK.items() if k in known}
    return AutoConfig.for_model(model_type, **kwargs)


def build_causal_lm(model_type: str):
    import torch
    from transformers import AutoModelForCausalLM

    cfg = tiny_config(model_type)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    n = sum(p.numel() for p in model.parameters())
    if n > MAX_PARAMS:
        raise ValueError(f"not tiny with the generic shrink ({n} parameters)")
    ids = _ids()
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


def __getattr__(name: str):  # factory targets: causal_lm__<model_type>, or a hand-written entry
    if name.startswith("causal_lm__"):
        return lambda: build_causal_lm(name[len("causal_lm__"):])
    if name in HAND:
        return HAND[name]
    raise AttributeError(name)


def entries(only: set[str] | None) -> list[str]:
    out = [f"causal_lm__{t}" for t in causal_lm_types()] + sorted(HAND)
    if only:
        out = [e for e in out if e.split("__")[-1] in only or e in only]
    return out


# ---------------------------------------------------------------------------------------------- phases


def cpu_check(entry: str) -> dict:
    """Build the tiny model and train one step on the CPU, in a fresh process (a model's import can break the next)."""
    code = f"""
import json, sys, traceback
sys.path.insert(0, {str(REPO / 'benchmarks')!r})
import probe_zoo, torch
try:
    model, inputs = getattr(probe_zoo, {entry!r})()
    n = sum(p.numel() for p in model.parameters())
    if n > probe_zoo.MAX_PARAMS:
        print(json.dumps({{"buildable": False, "why": f"not tiny with the generic shrink ({{n}} parameters)"}})); sys.exit()
    out = model(**inputs)
    loss = out.loss if getattr(out, "loss", None) is not None else out[0].float().sum()
    loss.backward()
    print(json.dumps({{"buildable": True, "params": n}}))
except Exception as exc:
    print(json.dumps({{"buildable": False, "why": (type(exc).__name__ + ": " + str(exc)).splitlines()[0][:300]}}))
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=REPO)
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
         f"- candidates done: {len(results)}" + (f" of {total}" if total else "")
         + " (causal LM classes of the pinned transformers, plus hand-written entries; run in a fixed order, hand-written "
           "entries first, then by the sha1 of the name, so a run stopped early is a spread over the alphabet)",
         f"- buildable (tiny config trains a step on the CPU): {len(built)}",
         f"- probed: {len(probed)}; **run on the emulated device: {len(ok)} of {len(probed)}"
         + (f" ({100 * len(ok) / len(probed):.0f} %)**" if probed else "**"), ""]
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
        L.append(f"| {k.split('__')[-1]} | {res.replace('|', '/')} | {pr.get('rc')} | "
                 f"{notes.replace('|', '/')[:400]} |")
    left = {k: v for k, v in results.items() if not v.get("buildable")}
    if left:
        L.append("\n## Not buildable with the generic tiny config (left out of the pass rate)\n")
        L.append("| model | why |\n|---|---|")
        for k in sorted(left):
            L.append(f"| {k.split('__')[-1]} | {left[k].get('why', '').replace('|', '/')[:200]} |")
    return "\n".join(L) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--only", default="", help="comma-separated model types (or entries)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=900, help="per probe; guards against a hang only")
    ap.add_argument("--results", default=str(REPO / "benchmarks" / "probe_zoo.json"),
                    help="JSON results, read first: entries already done are not run again")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "PROBE_ZOO.md"))
    ap.add_argument("--fresh", action="store_true", help="ignore earlier results")
    ap.add_argument("--render", action="store_true", help="only write the page from the results file")
    a = ap.parse_args(argv)
    import torch
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
    todo = [e for e in entries({x.strip() for x in a.only.split(",") if x.strip()} or None)
            if not (e in results and (not results[e].get("buildable") or results[e].get("probe")))]
    todo.sort(key=lambda e: (e.startswith("causal_lm__"), hashlib.sha1(e.encode()).hexdigest()))

    lock = threading.Lock()

    def save():
        with lock:
            _save()

    def _save():
        tmp = res_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"versions": versions, "results": results}, indent=1, sort_keys=True))
        os.replace(tmp, res_path)
        Path(a.out).write_text(render(results, versions, len(entries(None))))

    def one(entry: str) -> None:
        # the probe first (its child builds the model on the CPU); only a model that does not run is checked on the
        # CPU alone, to tell a model the generic tiny config cannot build from one the device fails on
        pr = probe(entry, a.timeout)
        if pr.get("status") == "ok":
            r = {"buildable": True, "probe": pr}
        else:
            r = cpu_check(entry)
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
