"""The facts issue 13 lists, as the shipped table states them (status, confidence, source)."""
from __future__ import annotations

import json

import pytest

from neuron_migrate._data import data_dir
from neuron_migrate.table import Status, load_api_map, load_table

T13 = data_dir("compat_table") / "torchneuron-2.13.3.yaml"


@pytest.fixture
def t():
    return load_table(T13, env={})


def test_dropout_maps_to_native_dropout(t):
    amap = load_api_map()
    for api in ("torch.nn.functional.dropout", "torch.nn.Dropout"):
        assert amap[api] == ("aten::native_dropout",), api
        v = t.classify_api(api)
        assert v.status is Status.NATIVE and v.source_id == "prerelease_ops", api
    header = (data_dir("compat_table") / "api_to_aten.yaml").read_text(encoding="utf-8")[:3000]
    assert "torch.nn.functional.dropout (training)" in header and "is_fused_kernel_acceptable" in header
    # no recorded API carries the inputs the recording script built (aten::rand before the API's own ops)
    for api in ("torch.matmul", "torch.nn.functional.conv2d", "torch.nn.functional.linear"):
        assert "aten::rand" not in amap[api], api


def test_multihead_attention_backward_with_mask(t):
    v = t.classify_api("torch.nn.MultiheadAttention")
    assert (v.status, v.confidence, v.source_id) == (Status.PARTIAL, "low", "community_canallee")
    assert "attn_mask" in v.note and "backward" in v.note.lower()
    assert "inference fast path" in t.op("aten::_native_multi_head_attention").note


def test_fft_ops_entered_and_env_dependent(t):
    for op in ("aten::_fft_c2r", "aten::_fft_r2c", "aten::_fft_c2c"):
        e = t.op(op)
        assert (e.status, e.confidence, e.source_id) == (Status.PARTIAL, "low", "aws_env_vars"), op
        assert "TORCH_NEURONX_COMPLEX_DECOMPOSE" in e.note and e.when_env


def test_cross_entropy_in_place(t):
    for api in ("torch.nn.functional.cross_entropy", "torch.nn.CrossEntropyLoss"):
        v = t.classify_api(api)
        assert (v.status, v.confidence) == (Status.PARTIAL, "low") and "in place" in v.note, api


def test_grad_scaler_is_unsourced(t):
    v = t.classify_api("torch.amp.GradScaler")
    assert (v.status, v.confidence) == (Status.UNKNOWN, "low")
    for op in ("aten::_amp_foreach_non_finite_check_and_unscale_", "aten::_amp_update_scale_"):
        assert t.op(op).status is Status.CPU_FALLBACK and t.op(op).confidence == "low"


@pytest.mark.parametrize("name", ["torch.sparse", "torch.nested", "torch.distributions", "torch.func", "torch.fft",
                                  "torchao", "torch.float64", "torch.vmap", "torch.sparse_coo_tensor"])
def test_release_note_coverage_is_medium(t, name):
    e = t.api(name)
    assert e.confidence == "medium" and e.source_id == "aws_rn_233_reported", name
    assert "not read" in t.sources[e.source_id]["title"]


@pytest.mark.parametrize("op, status", [
    ("aten::mse_loss", Status.CPU_FALLBACK), ("aten::mse_loss.out", Status.CPU_FALLBACK),
    ("aten::native_batch_norm", Status.CPU_FALLBACK), ("aten::sort", Status.CPU_FALLBACK),
    ("aten::sort.stable", Status.CPU_FALLBACK), ("aten::randn", Status.CPU_FALLBACK),
    ("aten::normal_", Status.CPU_FALLBACK), ("aten::bernoulli_.float", Status.CPU_FALLBACK),
    ("aten::randperm", Status.CPU_FALLBACK), ("aten::multinomial", Status.CPU_FALLBACK),
    ("aten::rand", Status.CPU_FALLBACK),
])
def test_common_missing_ops(t, op, status):
    v = t.classify_op(op)
    assert v.status is status, (op, v)
    assert v.confidence in ("medium", "low") and v.source_id, op


def test_every_source_has_a_public_address_or_says_so(t):
    for sid, s in t.sources.items():
        assert "shared/research" not in (s.get("title") or "") and "shared/research" not in str(s.get("url")), sid
        if s["url"] is None:
            assert "no single public address" in s["title"], sid


def test_native_rows_from_the_snapshot_are_not_high(t):
    natives = [e for e in t.entries if e.kind == "aten_op" and e.status is Status.NATIVE]
    assert natives and all(e.confidence != "high" or e.source_kind == "aws_docs" for e in natives)


def test_audit_and_probe_agree_on_namespaces(t):
    """An API found statically and the ops a run records for it get one status (issue 13: sparse was 'error' in
    audit and 'unknown' in probe)."""
    from neuron_migrate.probe.analyze import Classifier

    c = Classifier(str(T13))
    for api, ops in [("torch.sparse.mm", ["aten::_to_sparse", "aten::_sparse_addmm"]),
                     ("torch.nested.nested_tensor", ["aten::_nested_tensor_from_tensor_list"]),
                     ("torch.fft.irfft", ["aten::_fft_c2r"])]:
        static = t.classify_api(api)
        for op in ops:
            run = c.classify(op)
            assert (run["status"], run["confidence"]) == (static.status.value, static.confidence), (api, op)
            assert run["source"] and run["source_url"], op
    for module, ns in [("torch.distributions.normal", "torch.distributions"), ("torch._functorch.apis", "torch.func")]:
        v = t.classify_module(module)
        assert v.status is Status.UNSUPPORTED and v.entries[0].name == ns
    assert t.classify_module("torch.nn.modules.linear") is None
