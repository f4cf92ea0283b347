#!/usr/bin/env python
"""Generate compat_table/aten_dispatch-<torch family>.json from torch's own dispatcher (maintainer tool).

    python scripts/gen_aten_dispatch.py [--no-opinfo] [--no-models]

For every aten op overload registered in the installed torch it records which kernels torch itself provides:

    I  CompositeImplicitAutograd      (decomposes above autograd on every backend)
    E  CompositeExplicitAutograd      (a device-generic kernel used by any backend without its own)
    N  CompositeExplicitAutogradNonFunctional (structured wrappers: functional/in-place -> the out= kernel)
    C  a CPU kernel                   (so a backend needs its own kernel, or the CPU fallback runs it)
    P  a PrivateUse1 kernel registered by torch itself (before any backend is loaded)
    S  sparse-only (SparseCPU/SparseCsrCPU kernel, no dense or composite kernel)
    T  nested-only (NestedTensorCPU kernel, no dense or composite kernel)
    D  has a Python decomposition in torch._decomp.decomposition_table (compile-time only)

and, for composite (I/E/N) ops, what the composite kernel calls ("decomp"): each composite op reached by a
workload is run through its composite kernel (`OpOverload._op_dk(key, ...)`) under a TorchDispatchMode that
records the ops the kernel dispatches. Workloads: factory calls OpInfo skips, one or two OpInfo sample inputs per op (torch's own test
inputs), and forward+backward+AdamW steps of tiny random-weight transformers models built from configs (no
downloads; skipped when transformers is not installed). The model runs also write the distinct aten ops each
model reaches, with device substitutions applied (what a PrivateUse1 `neuron` device receives where the CPU
takes another path), to tests/table/data/model_ops.json for the coverage test.

Needs torch and, for the OpInfo samples, expecttest (`pip install expecttest`); the product only reads the JSON (no torch import at audit time).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import warnings
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
DK = torch._C.DispatchKey
has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key

sys.path.insert(0, str(Path(__file__).resolve().parent))
from device_substitutions import OP_RENAMES as DEVICE_SUBSTITUTIONS, DeviceSubstitutes  # noqa: E402


def op_name(func) -> str:
    name = func.name()
    return name[: -len(".default")] if name.endswith(".default") else name


def dispatcher_facts() -> dict[str, str]:
    import torch._decomp as decomp

    in_decomp = {op_name(k) for k in decomp.decomposition_table if hasattr(k, "name")}
    facts: dict[str, str] = {}
    for full in sorted(torch._C._dispatch_get_all_op_names()):
        if not full.startswith("aten::"):
            continue
        name = full[: -len(".default")] if full.endswith(".default") else full
        f = ""
        cia = has_kernel(full, "CompositeImplicitAutograd")
        cea = has_kernel(full, "CompositeExplicitAutograd")
        ceanf = has_kernel(full, "CompositeExplicitAutogradNonFunctional")
        cpu = has_kernel(full, "CPU")
        f += "I" if cia else ""
        f += "E" if cea else ""
        f += "N" if ceanf else ""
        f += "C" if cpu else ""
        f += "P" if has_kernel(full, "PrivateUse1") else ""
        dense = cia or cea or ceanf or cpu or has_kernel(full, "Meta")
        if not dense and (has_kernel(full, "SparseCPU") or has_kernel(full, "SparseCsrCPU")):
            f += "S"
        if not dense and has_kernel(full, "NestedTensorCPU"):
            f += "T"
        f += "D" if name in in_decomp else ""
        facts[name] = f
    return facts


def factory_workload(facts, decomp) -> None:
    """Factories and *_like ops OpInfo does not sample (their composite kernels are what a device gets)."""
    x = torch.rand(3, 4)
    calls = [lambda: torch.rand_like(x), lambda: torch.randn_like(x), lambda: torch.randint_like(x, 5),
             lambda: torch.rand(3), lambda: torch.randn(3), lambda: torch.randint(0, 5, (3,)), lambda: torch.randperm(5),
             lambda: torch.empty_like(x), lambda: torch.zeros_like(x), lambda: torch.ones_like(x),
             lambda: torch.full_like(x, 2.0), lambda: x.new_zeros(2), lambda: x.new_ones(2), lambda: x.new_full((2,), 1.0),
             lambda: x.new_empty(2), lambda: torch.normal(0.0, 1.0, (3,)), lambda: torch.bernoulli(x),
             lambda: torch.multinomial(x.abs() + 0.1, 2), lambda: x.clone().uniform_(), lambda: x.clone().normal_(),
             lambda: x.clone().exponential_(), lambda: torch.linspace(0, 1, 5), lambda: torch.logspace(0, 1, 5),
             lambda: torch.eye(3), lambda: torch.full((2, 2), 1.0), lambda: torch.scalar_tensor(1.0),
             lambda: torch.tril_indices(3, 3), lambda: torch.triu_indices(3, 3), lambda: torch.zeros(2, 2).index_put_(
                 (torch.tensor([0]),), torch.tensor(1.0)), lambda: torch.rsub(x, 1.0), lambda: x.masked_fill(x > 0.5, 0.0),
             lambda: torch.logsumexp(x, 1), lambda: x.sort(), lambda: x.argsort(), lambda: x.msort(), lambda: x.topk(2)]
    for call in calls:
        try:
            with Recorder(facts, decomp):
                call()
        except Exception:  # noqa: BLE001
            pass


class Recorder(TorchDispatchMode):
    """Records the top-level aten ops (what a probe's dispatch mode sees) and, for composite ops, runs the
    composite kernel under a nested recorder to learn what it dispatches."""

    def __init__(self, facts: dict[str, str], decomp: dict[str, set[str]], seen: set[str] | None = None):
        super().__init__()
        self.facts = facts
        self.decomp = decomp
        self.seen = seen if seen is not None else set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = op_name(func)
        if name.startswith("aten::"):
            self.seen.add(name)
        flags = self.facts.get(name, "")
        key = DK.CompositeExplicitAutograd if "E" in flags else (
            DK.CompositeExplicitAutogradNonFunctional if "N" in flags else (
                DK.CompositeImplicitAutograd if "I" in flags else None))
        if key is not None:
            kids: set[str] = set()
            try:
                with Recorder(self.facts, self.decomp, kids):
                    out = func._op_dk(key, *args, **kwargs)
            except Exception:  # noqa: BLE001 - the composite kernel refused these args: run the op normally
                return func(*args, **kwargs)
            self.decomp.setdefault(name, set()).update(kids)
            return out
        return func(*args, **kwargs)


def opinfo_workload(facts, decomp) -> int:
    from torch.testing._internal.common_methods_invocations import op_db

    n = 0
    for info in op_db:
        try:
            samples = list(info.sample_inputs("cpu", torch.float32, requires_grad=False))[:2]
        except Exception:  # noqa: BLE001
            continue
        for s in samples:
            try:
                with Recorder(facts, decomp):
                    info.op(s.input, *s.args, **s.kwargs)
                n += 1
            except Exception:  # noqa: BLE001
                pass
    return n


def tiny_models():
    """(name, model, make_inputs) for small random-weight transformers models built from configs."""
    import transformers as T

    common = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    ids = lambda vocab, n=8: torch.randint(0, vocab, (2, n))  # noqa: E731
    out = []
    out.append(("gpt2", T.GPT2LMHeadModel(T.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=100, n_positions=32)),
                lambda: dict(input_ids=ids(100), labels=ids(100))))
    out.append(("bert", T.BertForMaskedLM(T.BertConfig(vocab_size=100, max_position_embeddings=32, **common)),
                lambda: dict(input_ids=ids(100), labels=ids(100))))
    out.append(("t5", T.T5ForConditionalGeneration(T.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                                               num_heads=4, decoder_start_token_id=0)),
                lambda: dict(input_ids=ids(100), labels=ids(100))))
    out.append(("llama", T.LlamaForCausalLM(T.LlamaConfig(vocab_size=100, max_position_embeddings=32,
                                                         num_key_value_heads=2, **common)),
                lambda: dict(input_ids=ids(100), labels=ids(100))))
    out.append(("mixtral", T.MixtralForCausalLM(T.MixtralConfig(vocab_size=100, max_position_embeddings=32,
                                                               num_key_value_heads=2, num_local_experts=4,
                                                               num_experts_per_tok=2, **common)),
                lambda: dict(input_ids=ids(100), labels=ids(100))))
    out.append(("vit", T.ViTForImageClassification(T.ViTConfig(image_size=16, patch_size=4, num_labels=3, **common)),
                lambda: dict(pixel_values=torch.randn(2, 3, 16, 16), labels=torch.randint(0, 3, (2,)))))
    out.append(("resnet", T.ResNetForImageClassification(T.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                                                                         layer_type="basic", num_labels=3)),
                lambda: dict(pixel_values=torch.randn(2, 3, 32, 32), labels=torch.randint(0, 3, (2,)))))
    out.append(("fnet", T.FNetForMaskedLM(T.FNetConfig(vocab_size=100, max_position_embeddings=32, hidden_size=32,
                                                       num_hidden_layers=2, intermediate_size=64)),
                lambda: dict(input_ids=ids(100), labels=ids(100))))
    return out


def model_workload(facts, decomp) -> dict[str, list[str]]:
    torch.manual_seed(0)
    ops_by_model: dict[str, list[str]] = {}
    for name, model, make in tiny_models():
        model.train()
        # foreach=True: torch's optimizers default to the foreach kernels on a PrivateUse1 device, not on CPU
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
        seen: set[str] = set()
        batches = [make() for _ in range(2)]  # inputs are made on the host, outside the recording
        with DeviceSubstitutes(), Recorder(facts, decomp, seen):
            for batch in batches:
                out = model(**batch)
                out.loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
                opt.step()
                opt.zero_grad()
        ops_by_model[name] = sorted({DEVICE_SUBSTITUTIONS.get(o, o) for o in seen})
        print(f"  {name}: {len(ops_by_model[name])} distinct ops", file=sys.stderr)
    return ops_by_model


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--no-opinfo", action="store_true")
    ap.add_argument("--no-models", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.backends.mkldnn.enabled = False  # no CPU-only oneDNN paths
    family = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    facts = dispatcher_facts()
    decomp: dict[str, set[str]] = {}
    warnings.simplefilter("ignore")
    with contextlib.redirect_stdout(io.StringIO()):
        factory_workload(facts, decomp)
        n_samples = 0 if args.no_opinfo else opinfo_workload(facts, decomp)
    print(f"opinfo samples run: {n_samples}; composite ops decomposed: {len(decomp)}", file=sys.stderr)
    models: dict[str, list[str]] = {}
    if not args.no_models:
        try:
            import transformers  # noqa: F401
        except ImportError:
            print("transformers not installed: model workloads skipped", file=sys.stderr)
        else:
            models = model_workload(facts, decomp)
    doc = {
        "torch": torch.__version__,
        "command": "python scripts/gen_aten_dispatch.py",
        "flags": {"I": "CompositeImplicitAutograd", "E": "CompositeExplicitAutograd",
                  "N": "CompositeExplicitAutogradNonFunctional", "C": "CPU kernel", "P": "PrivateUse1 kernel in stock torch",
                  "S": "sparse-only", "T": "nested-only", "D": "torch._decomp decomposition"},
        "ops": facts,
        "decomp": {k: sorted(v) for k, v in sorted(decomp.items())},
    }
    out = args.out or ROOT / "compat_table" / f"aten_dispatch-{family}.json"
    out.write_text(json.dumps(doc, indent=0, sort_keys=False) + "\n", encoding="utf-8")
    print(f"wrote {out}: {len(facts)} ops, {len(decomp)} decompositions", file=sys.stderr)
    if models:
        import transformers

        mo = ROOT / "tests" / "table" / "data" / "model_ops.json"
        mo.parent.mkdir(parents=True, exist_ok=True)
        mo.write_text(json.dumps({"torch": torch.__version__, "transformers": transformers.__version__,
                                  "command": "python scripts/gen_aten_dispatch.py",
                                  "substitutions": DEVICE_SUBSTITUTIONS | {"F.dropout(training)": "aten::native_dropout",
                                                                           "F.scaled_dot_product_attention(4-D)":
                                                                           "recorded with dropout_p=0 (fused kernel)"},
                                  "models": models}, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {mo}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
