"""Checks on the shipped data in compat_table/."""
from __future__ import annotations

import pytest
import yaml

from neuron_migrate._data import data_dir
from neuron_migrate.table import KINDS, Status, available_tables, load_api_map, load_table

TABLES = available_tables()


def test_both_release_tables_ship():
    names = {p.name for p in TABLES}
    assert {"torchneuron-2.13.3.yaml", "torchneuron-2.14.3.yaml"} <= names
    assert (data_dir("compat_table") / "SCHEMA.md").is_file()


@pytest.mark.parametrize("path", TABLES, ids=lambda p: p.name)
def test_every_entry_has_valid_status_and_known_source(path):
    t = load_table(path)
    assert t.entries, path
    assert t.torch_neuronx and t.neuron_sdk == "2.33.0" and t.torch
    for e in t.entries:
        assert isinstance(e.status, Status)
        assert e.kind in KINDS
        assert e.source_id in t.sources, (e.name, e.source_id)
        assert t.sources[e.source_id]["kind"] in ("aws_docs", "prerelease_source", "community")
        assert e.confidence in ("high", "medium", "low")
    # the raw file too (not only the loader's view): every source id used is defined in that file or its parent
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    for r in raw.get("entries") or []:
        assert Status(r["status"]) in Status
        assert r["source"] in t.sources


def test_shipped_facts():
    t = load_table(data_dir("compat_table") / "torchneuron-2.13.3.yaml")
    for ns in ("torch.sparse", "torch.func", "torch.nested", "torch.distributions"):
        e = t.api(ns + ".something")
        assert e is not None and e.status is Status.UNSUPPORTED and e.source_kind == "aws_docs", ns
    assert t.api("torch.fft.rfft").status is Status.PARTIAL
    assert t.api("torch.compile:dynamic").status is Status.UNSUPPORTED
    assert t.api("torch.float64").status is Status.PARTIAL
    assert t.op("aten::atan2").status is Status.CPU_FALLBACK
    assert t.op("aten::linalg_qr").status is Status.CPU_FALLBACK
    assert t.op("aten::add.Tensor").status is Status.NATIVE
    assert t.op("aten::add.Tensor").source_kind == "prerelease_source"
    assert t.op("aten::add.Tensor").confidence == "medium"
    assert t.op("aten::div.Tensor").status is Status.NATIVE  # structured delegate
    assert t.op("aten::argsort.stable").status is Status.CPU_FALLBACK  # hidden host compute
    natives = [e for e in t.entries if e.kind == "aten_op" and e.status is Status.NATIVE]
    assert len(natives) > 300


def test_214_extends_213():
    t13 = load_table(data_dir("compat_table") / "torchneuron-2.13.3.yaml")
    t14 = load_table(data_dir("compat_table") / "torchneuron-2.14.3.yaml")
    assert t14.version == "2.14.3" and t14.torch_neuronx == "2.14.3.0" and t14.torch == "2.14.0"
    assert len(t14.entries) >= len(t13.entries)
    assert t14.op("atan2").status is Status.CPU_FALLBACK


def test_api_map_content():
    amap = load_api_map()
    assert len(amap) >= 300
    assert amap["torch.atan2"] == ("aten::atan2",)
    assert amap["Tensor.atan2"] == ("aten::atan2",)
    assert amap["torch.linalg.qr"] == ("aten::linalg_qr",)
    assert "aten::_scaled_dot_product_fused_attention_overrideable" in amap["torch.nn.functional.scaled_dot_product_attention"]
    assert "aten::addmm" in amap["torch.nn.LSTM"] or "aten::mm" in amap["torch.nn.LSTM"]
    assert any(op.startswith("aten::_fft") for op in amap["torch.fft.rfft"])
    for prefix in ("torch.linalg.", "torch.fft.", "torch.special.", "torch.nn.functional.", "Tensor.", "torch.nn."):
        assert sum(k.startswith(prefix) for k in amap) >= 10, prefix
    for ops in amap.values():
        assert ops and all("::" in o and not o.endswith(".default") for o in ops)
    header = (data_dir("compat_table") / "api_to_aten.yaml").read_text(encoding="utf-8")[:600]
    assert "scripts/gen_api_map.py" in header and "torch 2." in header


def test_worst_status_on_shipped_table():
    t = load_table()
    assert t.ops_for_api("torch.atan2") == ["aten::atan2"]
    st, entries = t.worst_status_for_api("torch.atan2")
    assert st is Status.CPU_FALLBACK and entries[0].name == "aten::atan2"
    assert t.worst_status_for_api("torch.linalg.qr")[0] is Status.CPU_FALLBACK
    assert t.worst_status_for_api("torch.sparse.mm")[0] is Status.UNSUPPORTED
    assert t.worst_status_for_api("torch.mm")[0] is Status.NATIVE
