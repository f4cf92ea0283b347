"""CLI behaviour that needs no torch in the parent: import cost, missing torch, argument parsing, merging."""
from __future__ import annotations

import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from neuron_migrate.cli.app import app
from neuron_migrate.probe import analyze, cli


def test_cli_import_does_not_import_torch():
    code = "import sys, neuron_migrate.cli.app; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_without_torch_says_how_to_install(monkeypatch):
    monkeypatch.setattr(cli, "torch_available", lambda: False)
    res = CliRunner().invoke(app, ["probe", "examples/probe_models/mlp.py:make"])
    assert res.exit_code == 2
    assert "pip install 'neuron-migrate[probe]'" in res.output


def test_help_lists_options():
    res = CliRunner().invoke(app, ["probe", "--help"])
    assert res.exit_code == 0
    for opt in ("--mode", "--steps", "--max-steps", "--compile", "--shapes", "--numerics", "--fail-on", "--device",
                "--report", "--nproc-per-node", "--timeout"):
        assert opt in res.output


def test_parse_target(tmp_path):
    (tmp_path / "t.py").write_text("")
    assert cli.parse_target("t.py", str(tmp_path)) == {"kind": "script", "path": "t.py"}
    assert cli.parse_target("pkg.mod:make", str(tmp_path)) == {"kind": "factory", "ref": "pkg.mod:make"}
    assert cli.parse_target("dir/m.py:make", str(tmp_path))["kind"] == "factory"
    with pytest.raises(typer.BadParameter):
        cli.parse_target("missing.py", str(tmp_path))
    with pytest.raises(typer.BadParameter):
        cli.parse_target("nothing", str(tmp_path))


def test_parse_shapes_and_fail_on():
    assert cli.parse_shapes(["8x16,4x16", "2x16"]) == [[8, 16], [4, 16], [2, 16]]
    with pytest.raises(typer.BadParameter):
        cli.parse_shapes(["8xa"])
    assert cli.parse_fail_on("fallback, float64") == ["fallback", "float64"]
    with pytest.raises(typer.BadParameter):
        cli.parse_fail_on("fallback,nope")


def test_bad_fail_on_exits_2():
    res = CliRunner().invoke(app, ["probe", "x:y", "--fail-on", "bogus"])
    assert res.exit_code == 2


def _doc(rank, ops, **kw):
    return {"rank": rank, "world_size": 2, "status": "ok", "device": "cpu", "ops": ops, **kw}


def test_merge_and_classify_synthetic_ranks():
    op = {"op": "aten::atan2.default", "phase": "forward", "file": "/x/m.py", "line": 3, "count": 2,
          "in_dtypes": ["float32"], "out_dtypes": ["float32"], "float64": False, "attributed": False, "grad_fn": None}
    f64 = dict(op, op="aten::mul.Tensor", line=5, float64=True, in_dtypes=["float64"], count=1)
    docs = [_doc(0, [op, f64]), _doc(1, [dict(op, count=3)])]
    merged = analyze.merge_ops(docs)
    m = next(o for o in merged if o["op"] == "aten::atan2.default")
    assert m["count"] == 5 and m["ranks"] == [0, 1]
    rep = analyze.build_report(docs, classifier=analyze.Classifier(), outcome={}, spec={"cwd": "/x"},
                               fail_on=["float64", "unsupported"])
    assert rep["world_size"] == 2 and len(rep["ranks"]) == 2
    assert rep["float64"]["ops"][0]["site"] == "m.py:5"
    assert rep["failed_checks"] == ["float64"]
    assert rep["status"] == "ok"


def test_unknown_op_and_missing_table():
    c = analyze.Classifier()
    assert c.classify("aten::definitely_not_an_op.default")["status"] == "unknown"
    broken = analyze.Classifier("/nonexistent/table.yaml")
    assert broken.error and broken.classify("aten::add.Tensor")["status"] == "unknown"
