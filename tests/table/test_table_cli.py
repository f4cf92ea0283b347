from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from neuron_migrate.cli.app import app
from neuron_migrate.table import Status, load_table
from neuron_migrate.table.cli import map_status, parse_markdown_tables

FIXTURES = Path(__file__).parent / "fixtures"
runner = CliRunner()


def _run(*args):
    return runner.invoke(app, ["table", *args])


def test_show_list_filters_by_status():
    r = _run("show", "--status", "unsupported", "--format", "json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["entries"] and all(e["status"] == "unsupported" for e in data["entries"])
    assert any(e["name"] == "torch.sparse" for e in data["entries"])


def test_show_text_table():
    r = _run("show", "--status", "unsupported")
    assert r.exit_code == 0, r.output
    assert "torch.sparse" in r.output and "unsupported" in r.output


def test_show_one_entry_with_source():
    r = _run("show", "atan2")
    assert r.exit_code == 0, r.output
    assert "aten::atan2" in r.output and "cpu_fallback" in r.output and "source:" in r.output
    r = _run("show", "torch.sparse.mm", "--format", "json")
    d = json.loads(r.output)
    assert d["name"] == "torch.sparse" and d["status"] == "unsupported"
    assert d["source_url"].startswith("https://awsdocs-neuron.readthedocs-hosted.com/")


def test_show_api_via_ops():
    r = _run("show", "torch.linalg.qr", "--format", "json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["status"] == "cpu_fallback" and d["ops"][0]["name"] == "aten::linalg_qr"


def test_show_unknown_and_table_option(mini_dir):
    r = _run("show", "aten::does_not_exist")
    assert r.exit_code == 1 and "unknown" in r.output
    r = _run("show", "--table", str(mini_dir / "torchneuron-9.9.9.yaml"), "--format", "json")
    assert r.exit_code == 0 and json.loads(r.output)["version"] == "9.9.9"


def test_show_bad_table_and_status(tmp_path):
    bad = tmp_path / "torchneuron-0.yaml"
    bad.write_text("version: 1\n", encoding="utf-8")
    r = _run("show", "--table", str(bad))
    assert r.exit_code == 2 and "torchneuron-0.yaml" in r.output
    r = _run("show", "--status", "great")
    assert r.exit_code == 2


@pytest.mark.parametrize(
    "word, status",
    [("✅", "native"), ("Supported", "native"), ("yes", "native"), ("CPU fallback", "cpu_fallback"),
     ("Fallback", "cpu_fallback"), ("❌", "unsupported"), ("Not supported", "unsupported"),
     ("❌ Not supported", "unsupported"), ("Partial", "partial"), ("Limited", "partial"), ("⚠️ Partial", "partial"),
     ("🤷 maybe", "unknown"), ("", "unknown")],
)
def test_map_status(word, status):
    assert map_status(word) == status


def test_import_markdown(tmp_path):
    out = tmp_path / "torchneuron-3.0.0.yaml"
    r = _run("import", str(FIXTURES / "upstream_compat.md"), "--out", str(out), "--version", "3.0.0")
    assert r.exit_code == 0, r.output
    doc = yaml.safe_load(out.read_text(encoding="utf-8"))
    assert doc["sources"]["upstream_md"]["kind"] == "aws_docs"
    by = {e["name"]: e for e in doc["entries"]}
    assert by["aten::add.Tensor"]["status"] == "native"
    assert by["aten::add.Tensor"]["dtypes"] == "fp32, bf16"
    assert "fused kernel" in by["aten::add.Tensor"]["note"] and "Extra Col: x1" in by["aten::add.Tensor"]["note"]
    assert by["aten::atan2"]["status"] == "cpu_fallback"
    assert by["aten::_scaled_mm"]["status"] == "unsupported"
    assert by["aten::_scaled_dot_product_fused_attention_overrideable"]["status"] == "partial"
    assert by["aten::weird_op"]["status"] == "unknown" and "maybe" in by["aten::weird_op"]["note"]
    assert by["aten::linalg_qr"]["status"] == "cpu_fallback"
    assert by["aten::mm"]["status"] == "native"
    assert by["torch.sparse"]["status"] == "unsupported" and by["torch.sparse"]["kind"] == "api"
    assert by["torch.distributed.all_to_all_single"]["kind"] == "distributed"
    assert by["torch.distributed.all_to_all_single"]["status"] == "partial"
    # the output is a loadable table
    t = load_table(out)
    assert t.op("atan2").status is Status.CPU_FALLBACK and t.op("atan2").source_kind == "aws_docs"


def test_import_stdout_and_no_table(tmp_path):
    r = _run("import", str(FIXTURES / "upstream_compat.md"))
    assert r.exit_code == 0 and "upstream_md" in r.output
    md = tmp_path / "empty.md"
    md.write_text("# nothing here\n", encoding="utf-8")
    r = _run("import", str(md))
    assert r.exit_code == 2 and "no markdown table" in r.output


def test_parse_markdown_skips_non_tables():
    rows = parse_markdown_tables((FIXTURES / "upstream_compat.md").read_text(encoding="utf-8"))
    assert len(rows) == 9


def test_build_without_torch_neuronx(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_neuronx", None)  # import raises ImportError
    r = _run("build")
    assert r.exit_code == 2
    assert "torch-neuronx" in r.output


def test_show_list_prints_notes_as_written(mini_dir):
    """A table's notes are data: `[verify]` and `:100:` stay as written (rich read them as a style tag and an
    emoji)."""
    table = mini_dir / "torchneuron-9.9.9.yaml"
    table.write_text(table.read_text(encoding="utf-8").replace(
        "note: no sparse}", 'note: "no sparse [verify] on Trn2, see op.py:100:"}'), encoding="utf-8")
    r = _run("show", "--table", str(table), "--status", "unsupported")
    assert r.exit_code == 0, r.output
    assert "no sparse [verify] on Trn2, see op.py:100:" in " ".join(r.output.split()), r.output
