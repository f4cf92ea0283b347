"""The probe's smaller defects from issue 11, each pinned by a test."""
from __future__ import annotations

import io
import textwrap

import pytest
from typer.testing import CliRunner

from neuron_migrate.cli.app import app
from neuron_migrate.probe import analyze, render
from neuron_migrate.probe.tables import choose_table

from .helpers import REPO, rel


def _doc(ops, **kw):
    return {"rank": 0, "world_size": 1, "status": "ok", "device": "cpu", "ops": ops, **kw}


def _op(op, phase, line, count=1, **kw):
    return {"op": op, "phase": phase, "file": "/x/m.py" if line else None, "line": line, "count": count,
            "in_dtypes": ["float32"], "out_dtypes": ["float32"], "float64": False, "attributed": False,
            "grad_fn": None, **kw}


def _report(docs, **kw):
    return analyze.build_report(docs, classifier=analyze.Classifier(), outcome={}, spec={"cwd": "/x"},
                                fail_on=kw.pop("fail_on", []), **kw)


def test_fail_on_graph_break_without_compile_is_an_error():
    for check in ("graph-break", "compile"):
        res = CliRunner().invoke(app, ["probe", "examples/probe_models/mlp.py:make", "--fail-on", check])
        assert res.exit_code == 2 and "needs --compile" in res.output


def test_graph_break_count_agrees_with_the_listed_breaks():
    comp = {"explain": {"graph_count": 2, "graph_break_count": 0,
                        "breaks": [{"reason": "item()", "file": "/x/m.py", "line": 8},
                                   {"reason": "print", "file": None, "line": None, "lib_file": None}]}}
    out = analyze._compile_section(comp, analyze.Classifier(), "/x")
    assert out["explain"]["graph_break_count"] == 2
    sites = [b["site"] for b in out["explain"]["breaks"]]
    assert sites == ["m.py:8", "(no frame outside torch)"]  # never "None:None"
    buf = io.StringIO()
    rep = _report([_doc([], compile=comp)])
    render.print_rich(rep, file=buf)
    text = buf.getvalue()
    assert "graph breaks 2" in text and "None:None" not in text


def test_decomposed_under_compile_is_not_cannot_lower():
    t = analyze.Classifier()
    elu = t.classify("aten::elu.default")
    assert elu["status"] == "cpu_fallback" and analyze.DECOMPOSED_NOTE in elu["note"]  # the table's own note
    comp = {"graphs": [{"index": 0, "kind": "forward", "ops": [
        {"op": "aten::elu.default", "file": "/x/m.py", "line": 3, "count": 1},
        {"op": "aten::atan2.default", "file": "/x/m.py", "line": 4, "count": 1}]}]}
    out = analyze._compile_section(comp, t, "/x")
    assert [b["op"] for b in out["cannot_lower"]] == ["aten::atan2.default"]
    assert [b["op"] for b in out["decomposed"]] == ["aten::elu.default"]


def test_float64_rows_put_the_users_lines_before_the_optimizer():
    f64 = dict(in_dtypes=["float64"], out_dtypes=["float64"], float64=True)
    ops = [_op("aten::mul.Tensor", "forward", 5, count=2, **f64)]
    ops += [_op("aten::_foreach_add_.Scalar", "optimizer", None, count=50, **f64),
            _op("aten::lerp_.Scalar", "optimizer", None, count=40, **f64)]
    ops += [_op("aten::mul.Tensor", "backward", 5, count=3, grad_fn="MulBackward0", **f64)]
    rep = _report([_doc(ops)])
    phases = [r["phases"] for r in rep["float64"]["ops"]]
    assert phases[0] == ["forward", "backward"] and all(p == ["optimizer"] for p in phases[1:])
    buf = io.StringIO()
    render.print_rich(rep, file=buf, top=1)  # with --top 1 the user's line is the one shown
    assert "m.py:5" in buf.getvalue()


def test_unknown_ops_are_listed_with_their_locations():
    rep = _report([_doc([_op("aten::definitely_unknown.default", "forward", 7, count=3),
                         _op("aten::definitely_unknown.default", "forward", 9)])])
    buf = io.StringIO()
    render.print_rich(rep, file=buf)
    assert "aten::definitely_unknown.default x4 at m.py:7 +1" in buf.getvalue()
    assert "aten::definitely_unknown.default x4 at m.py:7" in render.to_markdown(rep)


def test_traceback_is_printed_without_literal_markup():
    rep = _report([_doc([], status="error", error={"type": "ValueError", "message": "boom", "file": "/x/m.py",
                                                    "line": 3, "traceback": "Traceback (most recent call last):\n  x\nValueError: boom"})])
    buf = io.StringIO()
    render.print_rich(rep, file=buf)
    text = buf.getvalue()
    assert "ValueError: boom" in text and "[dim]" not in text and "[/]" not in text


def test_table_follows_the_installed_torch():
    path, warn = choose_table(None, "2.13.0+cpu")
    assert path.endswith("torchneuron-2.13.3.yaml") and warn is None
    path, warn = choose_table(None, "2.14.1")
    assert path.endswith("torchneuron-2.14.3.yaml") and warn is None
    path, warn = choose_table(None, "2.12.0")
    assert warn and "no shipped table is made for torch 2.12" in warn
    path, warn = choose_table(str(REPO / "compat_table" / "torchneuron-2.14.3.yaml"), "2.13.0")
    assert warn and "is for torch 2.14.0" in warn


torch = pytest.importorskip("torch")
from .helpers import run_json  # noqa: E402


def test_explicit_table_for_another_torch_is_warned_about():
    rc, rep, p = run_json([f"{rel('mlp.py')}:make", "--steps", "1", "--device", "cpu", "--table",
                           str(REPO / "compat_table" / "torchneuron-2.14.3.yaml")])
    if torch.__version__.startswith("2.14"):
        pytest.skip("the installed torch is the table's")
    assert rc == 0 and "is for torch 2.14.0" in rep["table_warning"] and "warning:" in p.stderr


@pytest.mark.slow
def test_forward_mode_calls_eval(tmp_path):
    m = tmp_path / "modes.py"
    m.write_text(textwrap.dedent("""
        import torch
        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(4, 4)
                self.drop = torch.nn.Dropout(0.5)
            def forward(self, x):
                if self.training:
                    x = torch.atan2(x, x + 1)  # only while training
                return self.drop(self.fc(x))
        def make():
            return M(), (torch.randn(2, 4),)
    """))
    rc, rep, _ = run_json([f"{m}:make", "--mode", "forward", "--steps", "1"])
    names = {o["op"] for o in rep["ops"] if o["phase"] != "init"}
    assert rc == 0 and "aten::addmm.default" in names
    assert not any("atan2" in n or "dropout" in n or "bernoulli" in n for n in names)
    rc, rep, _ = run_json([f"{m}:make", "--mode", "train", "--steps", "1"])
    assert any("atan2" in o["op"] for o in rep["ops"])


@pytest.mark.slow
def test_shapes_reshape_every_input_and_failures_are_not_recompiles(tmp_path):
    m = tmp_path / "labels.py"
    m.write_text(textwrap.dedent("""
        import torch
        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = torch.nn.Embedding(50, 8)
                self.head = torch.nn.Linear(8, 50)
            def forward(self, input_ids, labels):
                logits = self.head(self.emb(input_ids))
                return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        def make():
            ids = torch.randint(0, 50, (4, 6))
            return M(), {"input_ids": ids, "labels": ids.clone()}
    """))
    rc, rep, p = run_json([f"{m}:make", "--steps", "1", "--compile", "--shapes", "2x6,8x6,3x5", "--device", "cpu"])
    assert rc == 0, p.stderr[-2000:]
    r = rep["compile"]["recompiles"]
    # labels were reshaped with input_ids: every shape runs, and each new shape is one more compile
    assert [s["error"] for s in r["shapes"]] == [None, None, None]
    assert [s["new_compiles"] for s in r["shapes"]] == [1, 1, 1] and r["recompilations"] == 2
    assert r["failed_shapes"] == 0


@pytest.mark.slow
def test_recompile_count_leaves_out_failed_shapes():
    from neuron_migrate.probe import compile_probe

    class M(torch.nn.Module):
        def forward(self, x):
            return x.reshape(4, -1).sum()  # 4x2 and 4x3 work, 3x3 cannot be reshaped to 4 rows

    r = compile_probe._recompiles(M(), (torch.randn(4, 2),), {}, [[4, 2], [3, 3], [4, 3]], train=False)
    assert [s["error"] is None for s in r["shapes"]] == [True, False, True]
    assert r["failed_shapes"] == 1 and r["recompilations"] == 1


@pytest.mark.slow
def test_graph_break_inside_a_library_has_its_library_line(tmp_path):
    lib = tmp_path / "site-packages" / "fakelib"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text("")
    (lib / "layers.py").write_text(textwrap.dedent("""
        import torch
        class Breaks(torch.nn.Module):
            def forward(self, x):
                if x.sum().item() > 0:
                    x = x * 2
                return x
    """))
    m = tmp_path / "uses_lib.py"
    m.write_text("import sys, os\nsys.path.insert(0, os.path.join(os.path.dirname(__file__), 'site-packages'))\n"
                 "import torch\nfrom fakelib.layers import Breaks\n\ndef make():\n"
                 "    return Breaks(), (torch.ones(2, 4),)\n")
    rc, rep, p = run_json([f"{m}:make", "--compile", "--steps", "1", "--mode", "forward", "--device", "cpu",
                           "--fail-on", "graph-break"])
    ex = rep["compile"]["explain"]
    assert ex["graph_break_count"] == len(ex["breaks"]) >= 1, p.stderr[-2000:]
    b = ex["breaks"][0]
    assert b["lib_file"] == "fakelib/layers.py" and b["lib_line"] == 5 and b["site"] == "fakelib/layers.py:5"
    assert rc == 1 and rep["failed_checks"] == ["graph-break"]


def test_report_prints_paths_notes_and_line_numbers_as_they_are():
    """The rich report shows data, not markup: an error at line 100 is `m.py:100:`, not the :100: emoji (💯), a
    folder named `runs[v2]` keeps its brackets, and a row's `[low confidence, ...]` note is shown, not read as a
    style tag and dropped."""
    f64 = dict(in_dtypes=["float64"], out_dtypes=["float64"], float64=True)
    rep = _report([_doc([_op("aten::mul.Tensor", "forward", 100, count=2, **f64)], status="error",
                        error={"type": "RuntimeError", "message": "index [0] is out of range", "file": "/x/runs[v2]/m.py",
                               "line": 100})])
    rep["cpu_fallback"] = [{"op": "aten::odd.default", "count": 1, "sites": [{"site": "runs[v2]/m.py:100", "count": 1,
                                                                              "phase": "forward"}],
                            "note": "slow path", "confidence": "low", "source": "src-7"}]
    buf = io.StringIO()
    render.print_rich(rep, file=buf)
    text = buf.getvalue()
    assert "\U0001f4af" not in text
    assert "runs[v2]/m.py:100: index [0] is out of range" in text, text
    assert "[low confidence, src-7] slow path" in text, text
    assert "runs[v2]/m.py:100" in text
