from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from neuron_migrate.table import Entry, Status, Table, TableError, available_tables, load_table


def test_op_lookup_forms(mini_table: Table):
    for q in ("aten::atan2", "aten::atan2.default", "atan2", "aten.atan2", "aten.atan2.default", "torch.ops.aten.atan2.default"):
        e = mini_table.op(q)
        assert e is not None, q
        assert e.name == "aten::atan2"
        assert e.status is Status.CPU_FALLBACK
    e = mini_table.op("aten.add.out")
    assert e.name == "aten::add.out" and e.status is Status.NATIVE


def test_op_overload_falls_back_to_base(mini_table: Table):
    # aten::atan2.out is not listed: falls back to the base (default overload) entry
    assert mini_table.op("aten::atan2.out").name == "aten::atan2"
    assert mini_table.op("aten.mm.out").name == "aten::mm"
    # no base entry: aggregated over listed overloads that agree
    agg = mini_table.op("aten::add.Scalar")
    assert agg is not None and agg.name == "aten::add" and agg.status is Status.NATIVE
    assert "aggregated" in agg.note
    # overloads that disagree: partial
    assert mini_table.op("aten::min").status is Status.PARTIAL
    assert mini_table.op("aten::nope") is None


def test_api_lookup(mini_table: Table):
    assert mini_table.api("torch.sparse").status is Status.UNSUPPORTED
    e = mini_table.api("torch.sparse.mm")
    assert e is not None and e.name == "torch.sparse" and e.kind == "namespace"
    assert mini_table.api("torch.sparsefoo") is None  # prefix must end at a dot
    assert mini_table.api("torch.fft.rfft").name == "torch.fft"
    assert mini_table.api("torch.compile:dynamic").status is Status.UNSUPPORTED
    assert mini_table.api("torch.distributed:send").kind == "distributed"
    assert mini_table.api("torch.distributed.send").name == "torch.distributed:send"
    assert mini_table.api("torch.float64").dtypes == "float64 -> float32"
    assert mini_table.api("torch.atan2") is None  # ops are not API entries


def test_ops_for_api(mini_table: Table):
    assert mini_table.ops_for_api("torch.atan2") == ["aten::atan2"]
    assert mini_table.ops_for_api("Tensor.atan2") == ["aten::atan2"]
    assert mini_table.ops_for_api("torch.Tensor.atan2") == ["aten::atan2"]
    assert mini_table.ops_for_api("torch.nothing") == []


def test_worst_status(mini_table: Table):
    st, entries = mini_table.worst_status_for_api("torch.mix")
    assert st is Status.CPU_FALLBACK
    assert [e.name for e in entries] == ["aten::mm", "aten::atan2", "aten::nope"]
    assert entries[2].status is Status.UNKNOWN  # missing op counts as unknown
    assert mini_table.worst_status_for_api("torch.mm") == (Status.NATIVE, [mini_table.op("aten::mm")])
    st, _ = mini_table.worst_status_for_api("torch.unknownish")
    assert st is Status.UNKNOWN  # unknown is worse than native
    # an API entry wins over its ops
    st, entries = mini_table.worst_status_for_api("torch.sparse.mm")
    assert st is Status.UNSUPPORTED and entries[0].name == "torch.sparse"
    assert mini_table.worst_status_for_api("torch.nothing") == (Status.UNKNOWN, [])


def test_entry_fields_and_source(mini_table: Table):
    e = mini_table.op("atan2")
    assert isinstance(e, Entry)
    assert (e.source_id, e.source_url, e.source_kind, e.confidence) == (
        "pre", "https://example.invalid/src", "prerelease_source", "medium")
    with pytest.raises(Exception):
        e.status = Status.NATIVE  # frozen
    assert mini_table.version == "9.9.9"


def test_cached_per_path(mini_dir: Path):
    a = load_table(mini_dir / "torchneuron-9.9.9.yaml")
    b = load_table(str(mini_dir / "torchneuron-9.9.9.yaml"))
    assert a is b


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda s: s.replace("version: \"9.9.9\"\n", ""), "missing top-level key"),
        (lambda s: s.replace("status: cpu_fallback, source: pre}", "status: maybe, source: pre}", 1), "status must be one of"),
        (lambda s: s.replace("kind: namespace", "kind: module", 1), "kind must be one of"),
        (lambda s: s.replace("source: docs, note: no sparse", "source: nowhere, note: no sparse"), "'nowhere' is not defined"),
        (lambda s: s.replace("kind: aws_docs", "kind: blog"), "kind must be one of"),
        (lambda s: s.replace("confidence: high", "confidence: very"), "confidence must be one of"),
        (lambda s: s + "  - {name: aten::mm, kind: aten_op, status: native, source: pre}\n", "duplicate name"),
        (lambda s: s.replace("entries:", "entries: {}\nx:"), "'entries' must be a list"),
        (lambda s: s + "  - {name: [unclosed\n", "not valid YAML"),
        (lambda s: "- just\n- a list\n", "top level"),
    ],
)
def test_schema_errors_name_the_file(tmp_path: Path, mutate, message):
    from table_testdata import MINI

    bad = tmp_path / "torchneuron-6.6.6.yaml"
    bad.write_text(mutate(MINI), encoding="utf-8")
    with pytest.raises(TableError) as info:
        load_table(bad)
    assert "torchneuron-6.6.6.yaml" in str(info.value)
    assert message in str(info.value)


def test_missing_file_is_table_error(tmp_path: Path):
    with pytest.raises(TableError, match="nope.yaml"):
        load_table(tmp_path / "nope.yaml")


def test_extends_overrides_and_removes(mini_dir: Path):
    child = mini_dir / "torchneuron-10.0.0.yaml"
    child.write_text(
        "extends: torchneuron-9.9.9.yaml\nversion: '10.0.0'\ntorch_neuronx: '10.0.0.0'\n"
        "sources: {new: {url: null, kind: community, confidence: low}}\n"
        "entries:\n"
        "  - {name: aten::atan2, kind: aten_op, status: native, source: new}\n"
        "  - {name: aten::mm, remove: true}\n",
        encoding="utf-8",
    )
    t = load_table(child)
    assert t.version == "10.0.0" and t.torch == "2.13.0"
    assert t.op("atan2").status is Status.NATIVE and t.op("atan2").source_kind == "community"
    assert t.op("aten::mm") is None
    assert t.api("torch.sparse").status is Status.UNSUPPORTED  # inherited
    assert t.ops_for_api("torch.atan2") == ["aten::atan2"]


def test_extends_cycle(tmp_path: Path):
    (tmp_path / "torchneuron-1.yaml").write_text("extends: torchneuron-2.yaml\n", encoding="utf-8")
    (tmp_path / "torchneuron-2.yaml").write_text("extends: torchneuron-1.yaml\n", encoding="utf-8")
    with pytest.raises(TableError, match="cycle"):
        load_table(tmp_path / "torchneuron-1.yaml")


def test_available_tables_sorted_and_newest_default():
    tables = available_tables()
    names = [p.name for p in tables]
    assert "torchneuron-2.13.3.yaml" in names and "torchneuron-2.14.3.yaml" in names
    assert names.index("torchneuron-2.13.3.yaml") < names.index("torchneuron-2.14.3.yaml")
    # the default follows the installed torch family (torch 2.13 here), not simply the newest table
    from neuron_migrate.table import default_table_path

    assert load_table().path == default_table_path()[0]


def test_loader_does_not_import_torch():
    code = (
        "import sys\n"
        "from neuron_migrate.table import load_table\n"
        "t = load_table()\n"
        "t.worst_status_for_api('torch.atan2')\n"
        "import neuron_migrate.table.cli\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "assert 'rich' not in sys.modules, 'rich imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
