"""Statuses derived from torch's dispatcher (compat_table/aten_dispatch-<family>.json) and model coverage."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from neuron_migrate._data import data_dir
from neuron_migrate.table import Status, load_table

DATA = Path(__file__).parent / "data"
SHIPPED = data_dir("compat_table") / "torchneuron-2.13.3.yaml"

# A table whose derivation is fully known: ops, composite flags and what each composite kernel calls.
DERIVED_TABLE = """\
version: "8.8.8"
torch_neuronx: "8.8.8.0"
neuron_sdk: "2.33.0"
torch: "2.13.0"
dispatch: dispatch.json
sources:
  pre: {url: "https://example.invalid/src", kind: prerelease_source, confidence: medium}
  low: {url: "https://example.invalid/low", kind: community, confidence: low}
  torch_dispatch: {url: "https://example.invalid/torch", kind: torch, confidence: high}
  rn: {url: "https://example.invalid/rn", kind: aws_docs, confidence: medium}
entries:
  - {name: aten::mm, kind: aten_op, status: native, source: pre}
  - {name: aten::empty.memory_format, kind: aten_op, status: native, source: pre}
  - {name: aten::fill_.Scalar, kind: aten_op, status: native, source: pre}
  - {name: aten::slow, kind: aten_op, status: cpu_fallback, source: low}
  - {name: aten::own, kind: aten_op, status: native, source: pre}
  - {name: torch.sparse, kind: namespace, status: unsupported, source: rn, note: no sparse}
"""
DISPATCH = {
    "torch": "2.13.0+cpu",
    "ops": {"aten::mm": "C", "aten::empty.memory_format": "C", "aten::fill_.Scalar": "C", "aten::slow": "C",
            "aten::ones": "E", "aten::mixed": "E", "aten::nested_mixed": "N", "aten::alias_only": "E",
            "aten::needs_kernel": "C", "aten::unrecorded": "E", "aten::own": "E", "aten::cycle_a": "E",
            "aten::cycle_b": "E", "aten::sparse_only_op": "S", "aten::_to_sparse": "C"},
    "decomp": {"aten::ones": ["aten::empty.memory_format", "aten::fill_.Scalar"],
               "aten::mixed": ["aten::mm", "aten::slow"],
               "aten::nested_mixed": ["aten::ones", "aten::mixed"],
               "aten::alias_only": [],
               "aten::own": ["aten::slow"],
               "aten::cycle_a": ["aten::cycle_b", "aten::mm"], "aten::cycle_b": ["aten::cycle_a"]},
}


@pytest.fixture
def derived(tmp_path):
    (tmp_path / "torchneuron-8.8.8.yaml").write_text(DERIVED_TABLE, encoding="utf-8")
    (tmp_path / "dispatch.json").write_text(json.dumps(DISPATCH), encoding="utf-8")
    return load_table(tmp_path / "torchneuron-8.8.8.yaml")


def test_composite_of_native_ops_is_native_with_their_confidence(derived):
    v = derived.classify_op("aten::ones")
    assert (v.status, v.via, v.confidence, v.source_id) == (Status.NATIVE, "derived", "medium", "pre")
    assert "CompositeExplicitAutograd" in v.note and "aten::fill_.Scalar" in v.note
    assert derived.op("ones") is None  # op() is the table's own entries only (the emulator's kernel set)
    assert derived.derived_entry("ones").status is Status.NATIVE


def test_composite_takes_the_worst_child_and_its_confidence(derived):
    v = derived.classify_op("aten::mixed")
    assert (v.status, v.confidence, v.source_id, v.cause) == (Status.CPU_FALLBACK, "low", "low", "aten::slow")
    nested = derived.classify_op("aten::nested_mixed")  # NonFunctional wrapper -> composite -> slow
    assert nested.status is Status.CPU_FALLBACK and nested.cause == "aten::slow"
    assert "CompositeExplicitAutogradNonFunctional" in nested.note


def test_metadata_only_composite_is_native_high(derived):
    v = derived.classify_op("aten::alias_only")
    assert (v.status, v.confidence, v.source_id) == (Status.NATIVE, "high", "torch_dispatch")


def test_unknown_means_a_kernel_is_needed(derived):
    v = derived.classify_op("aten::needs_kernel")
    assert v.status is Status.UNKNOWN and v.via == "none" and "needs a backend kernel" in v.note
    assert derived.op("aten::needs_kernel") is None
    un = derived.classify_op("aten::unrecorded")  # composite whose calls were never recorded: still unknown
    assert un.status is Status.UNKNOWN and "not recorded" in un.note
    assert "not an aten op" in derived.classify_op("aten::no_such_op").note


def test_a_backend_kernel_beats_the_composite(derived):
    # the backend registered its own kernel for a composite op: the composite (which calls a host op) never runs
    v = derived.classify_op("aten::own")
    assert v.status is Status.NATIVE and v.via == "entry"


def test_cycles_terminate(derived):
    v = derived.classify_op("aten::cycle_a")
    assert v.status in (Status.UNKNOWN, Status.NATIVE)


def test_sparse_ops_take_the_namespace_verdict(derived):
    for op in ("aten::sparse_only_op", "aten::_to_sparse"):
        v = derived.classify_op(op)
        assert (v.status, v.via, v.confidence) == (Status.UNSUPPORTED, "namespace", "medium"), op


def test_without_dispatch_data_nothing_is_derived(mini_table):
    assert mini_table.dispatch is None
    assert mini_table.classify_op("aten::zeros_like").status is Status.UNKNOWN


# ------------------------------------------------------------------------------------------ shipped table

NOISE = ["aten::zeros_like", "aten::empty_like", "aten::lift_fresh", "aten::_unsafe_view", "aten::masked_fill.Scalar",
         "aten::logsumexp", "aten::index_put", "aten::rsub.Scalar", "aten::full_like", "aten::new_zeros"]


@pytest.mark.parametrize("op", NOISE)
def test_composite_noise_is_not_unknown(op):
    """The issue's noise: ops any backend without its own kernel decomposes (CompositeExplicitAutograd)."""
    t = load_table(SHIPPED)
    v = t.classify_op(op)
    assert v.status is not Status.UNKNOWN, (op, v.note)
    assert v.via in ("derived", "entry"), (op, v.via)


def test_noise_is_unknown_without_derivation(tmp_path):
    """The same ops were unknown before the dispatcher data: the derivation, not a hand entry, resolves them."""
    import yaml

    raw = yaml.safe_load(SHIPPED.read_text(encoding="utf-8"))
    raw.pop("dispatch")
    (tmp_path / "torchneuron-2.13.3.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    t = load_table(tmp_path / "torchneuron-2.13.3.yaml")
    unknown = [op for op in NOISE if t.classify_op(op).status is Status.UNKNOWN]
    assert len(unknown) >= 7, unknown


def test_dispatch_data_covers_every_aten_op():
    d = load_table(SHIPPED).dispatch
    assert d["torch"].startswith("2.13")
    assert len(d["ops"]) > 3000 and len(d["decomp"]) > 300
    assert d["ops"]["aten::zeros_like"] == "ED" or "E" in d["ops"]["aten::zeros_like"]
    assert d["decomp"]["aten::zeros_like"] == ["aten::empty_like", "aten::zero_"]
    assert "I" in d["ops"]["aten::dropout"] and "C" in d["ops"]["aten::native_dropout"]


def test_dispatch_data_matches_installed_torch():
    """The committed facts are what the installed torch's dispatcher says (regenerate with
    scripts/gen_aten_dispatch.py when torch changes); skipped without torch 2.13."""
    torch = pytest.importorskip("torch")
    if not torch.__version__.startswith("2.13"):
        pytest.skip(f"dispatcher data is for torch 2.13, installed {torch.__version__}")
    d = load_table(SHIPPED).dispatch
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    keys = {"I": "CompositeImplicitAutograd", "E": "CompositeExplicitAutograd",
            "N": "CompositeExplicitAutogradNonFunctional", "C": "CPU"}
    live = {n for n in torch._C._dispatch_get_all_op_names() if n.startswith("aten::")}
    assert {n[:-8] if n.endswith(".default") else n for n in live} == set(d["ops"])
    for full in sorted(live)[::7]:
        name = full[:-8] if full.endswith(".default") else full
        got = "".join(k for k, key in keys.items() if has(full, key))
        assert got == "".join(k for k in d["ops"][name] if k in keys), full


def _model_ops() -> dict[str, list[str]]:
    return json.loads((DATA / "model_ops.json").read_text(encoding="utf-8"))["models"]


@pytest.mark.parametrize("model", sorted(_model_ops()))
def test_tiny_model_coverage(model):
    """<= 2 % of the distinct aten ops a tiny random-weight model reaches in a training step are unknown
    (op lists recorded by scripts/gen_aten_dispatch.py with transformers, device substitutions applied)."""
    ops = _model_ops()[model]
    t = load_table(SHIPPED)
    unknown = [op for op in ops if t.classify_op(op).status is Status.UNKNOWN]
    assert len(ops) >= 30
    assert len(unknown) <= 0.02 * len(ops), unknown


def test_model_op_lists_have_device_substitutions():
    models = _model_ops()
    every = {op for ops in models.values() for op in ops}
    assert "aten::native_dropout" in every and "aten::bernoulli_.float" not in every
    assert "aten::_scaled_dot_product_fused_attention_overrideable" in every
    assert not any("flash_attention_for_cpu" in op for op in every)
    assert {"gpt2", "bert", "t5", "llama", "vit", "resnet", "fnet"} <= set(models)


@pytest.mark.slow
def test_model_ops_current_when_transformers_is_installed():
    """With transformers installed, one model's recorded op list is what a fresh trace gives."""
    pytest.importorskip("transformers")
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    code = (
        "import sys, json; sys.path.insert(0, 'scripts');"
        "import gen_aten_dispatch as g;"
        "facts = g.dispatcher_facts(); decomp = {};"
        "import torch; torch.backends.mkldnn.enabled = False;"
        "g.tiny_models = (lambda f: (lambda: [m for m in f() if m[0] == 'bert']))(g.tiny_models);"
        "print(json.dumps(g.model_workload(facts, decomp)['bert']))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == _model_ops()["bert"]
