"""Expression edits and statement deletions are spliced into the text where libcst would write exactly the same
characters (apply._splice); everything else goes through libcst. These tests prove the two agree, on every fixture and on the cases the splice
must refuse."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from neuron_migrate.rewrite import apply
from neuron_migrate.rewrite.apply import _apply_edits, _splice, apply_fixes
from neuron_migrate.rewrite.engine import fix_text
from neuron_migrate.rules.api import Settings
from neuron_migrate.rules.model import Edit, Fix, FixSafety, Span
from neuron_migrate.rules.registry import RuleSet

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "rules"
INPUTS = sorted(FIXTURES.glob("*/*.in.py"))


@pytest.fixture
def checked(monkeypatch):
    """Every splice is also done by libcst and must match, and every chunk rewritten one block at a time is also
    rewritten one function at a time and must match (SpliceMismatch otherwise); counts the splices."""
    monkeypatch.setattr(apply, "_CHECK_SPLICE", True)
    monkeypatch.setattr(apply, "_CHECK_REGIONS", True)
    calls = {"spliced": 0}
    real = apply._splice

    def counting(*a):
        out = real(*a)
        calls["spliced"] += out is not None
        return out

    monkeypatch.setattr(apply, "_splice", counting)
    return calls


def test_splice_matches_libcst_on_every_fixture(checked):
    rules, settings = RuleSet.select(), Settings(unsafe_fixes=True)
    errors = []
    for path in INPUTS:
        try:
            fix_text(path.read_text(), str(path), rules, settings)
        except Exception as exc:  # noqa: BLE001 - a mismatch surfaces as a FixError naming SpliceMismatch
            if "SpliceMismatch" in str(exc) or isinstance(exc, apply.SpliceMismatch):
                errors.append(f"{path}: {exc}")
    assert not errors, "\n".join(errors)
    assert checked["spliced"] > 20  # the text path is really taken, not always refused


def _edit(text: str, needle: str, new: str) -> Edit:
    """A replace_expr edit for the first expression whose source is `needle`."""
    tree = ast.parse(text)
    lines = text.splitlines()

    def char_col(line: int, byte_col: int) -> int:  # Span columns count characters, ast's count bytes
        return len(lines[line - 1].encode()[:byte_col].decode())

    for node in ast.walk(tree):
        if isinstance(node, ast.expr) and ast.get_source_segment(text, node) == needle:
            return Edit("replace_expr", Span(node.lineno, char_col(node.lineno, node.col_offset), node.end_lineno,
                                             char_col(node.end_lineno, node.end_col_offset)), new)
    raise AssertionError(needle)


@pytest.mark.parametrize("text, needle, new, spliced", [
    ("x = a.cuda()\n", "a.cuda()", "a.to(device)", True),
    ("y = (a.cuda())\n", "a.cuda()", "a.to(device)", True),  # the node's own parentheses stay outside the range
    ("def f():\n    return g(h(1), k)\n", "h(1)", "h(2)", True),
    ("y = (a)\n", "a", "(b + c)", False),  # the text's parentheses would replace the node's
    ("if not d == 'cuda':\n    pass\n", "d == 'cuda'", "d == 'neuron'", False),  # libcst negates a written compare
    ("s = f\"{a.cuda()}\"\n", "a.cuda()", "a.to('neuron')", False),  # quotes may need changing in an f-string
    ("z = f(a)\n", "f(a)", "g(a,\n  b)", False),  # libcst re-indents continuation lines
    ("w = 'é'; v = a.cuda()\n", "a.cuda()", "a.to(device)", False),  # non-ASCII line: columns are characters
])
def test_splice_takes_or_refuses_and_agrees_with_libcst(text, needle, new, spliced):
    _splice_agrees(text, _edit(text, needle, new), spliced)


def _splice_agrees(text: str, e: Edit, spliced: bool) -> None:
    """The splice takes `e` (or refuses it) as expected, writes libcst's text when it takes it, and the public entry
    point gives libcst's text either way."""
    got = _splice(text, 1, ast.parse(text).body, [e])
    assert (got is not None) is spliced
    via_libcst, _ = _apply_edits(text, [e])
    if got is not None:
        assert got == via_libcst
    out, applied = apply_fixes(text, [Fix(FixSafety.SAFE, [e])])
    assert out == via_libcst and len(applied) == 1


def _libcst_texts(monkeypatch, check_regions: bool) -> list:
    """The texts libcst is given from now on (each region, dedented), with _CHECK_REGIONS set as asked."""
    calls: list = []
    real = apply._apply_edits
    monkeypatch.setattr(apply, "_CHECK_REGIONS", check_regions)
    monkeypatch.setattr(apply, "_apply_edits", lambda t, e: calls.append(t) or real(t, e))
    return calls


def test_regions_rewrite_separate_methods_like_one_pass(monkeypatch):
    """Edits in two methods of a class go through libcst one method at a time; the text equals one pass over the
    whole class."""
    text = ("class T:\n"
            "    def a(self):\n"
            "        xm.mark_step()\n"  # the method's only statement: libcst writes `pass` (no splice)
            "\n"
            "    def b(self):\n"
            "        # keep me\n"
            "        xm.mark_step()\n"
            "        return x.cuda()\n")
    tree = ast.parse(text)
    stmts = [n for n in ast.walk(tree) if isinstance(n, ast.Expr)]
    edits = [Edit("delete_stmt", Span(s.lineno, s.col_offset, s.end_lineno, s.end_col_offset)) for s in stmts]
    edits.append(_edit(text, "x.cuda()", "x.to(device)"))
    one_pass, _ = _apply_edits(text, edits)
    calls = _libcst_texts(monkeypatch, check_regions=False)  # count only the regions rewrite uses
    out, applied = apply_fixes(text, [Fix(FixSafety.SAFE, [e]) for e in edits], tree)
    assert out == one_pass and len(applied) == 3
    assert len(calls) == 2 and all(c.startswith("def ") for c in calls)  # each method on its own, dedented


BLOCKS = (
    "class Trainer:\n"
    "    def train(self, data):\n"
    "        setup()\n"
    "        for b in data:\n"
    "            with ctx():\n"
    "                xm.mark_step()\n"  # the with's only statement: libcst writes `pass` (no splice)
    "            step(b)\n"
    "\n"
    "    def save(self, flag):\n"
    "        if flag:\n"
    "            # sync first\n"
    "            xm.mark_step()\n"  # an `if FLAG:` emptied by a fix goes as a whole, with its comment
    "\n"
    "        # then save\n"
    "        save()\n"
)


def test_regions_are_the_innermost_block_that_keeps_the_change_inside(monkeypatch):
    """libcst gets the innermost `for`/`with`/`try`/... holding an edit, never an `if` (an emptied `if FLAG:` is
    removed, which changes the block around it); the text equals one pass over the whole function."""
    tree = ast.parse(BLOCKS)
    edits = [Edit("delete_stmt", Span(6, 16, 6, 30)), Edit("delete_stmt", Span(12, 12, 12, 26))]
    one_pass, _ = _apply_edits(BLOCKS, edits)
    assert "if flag" not in one_pass and "sync first" not in one_pass and "# then save" in one_pass
    calls = _libcst_texts(monkeypatch, check_regions=True)  # also rewritten one function at a time: must be the same
    out, applied = apply_fixes(BLOCKS, [Fix(FixSafety.SAFE, [e]) for e in edits], tree)
    assert out == one_pass and len(applied) == 2
    assert calls[0].startswith("with ctx():\n") and calls[1].startswith("def save(")  # the with; the if's function


def _delete(text: str, needle: str) -> Edit:
    """A delete_stmt edit for the first statement whose source is `needle`."""
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.stmt) and ast.get_source_segment(text, node) == needle:
            return Edit("delete_stmt", Span(node.lineno, node.col_offset, node.end_lineno, node.end_col_offset))
    raise AssertionError(needle)


DEF_ALIAS_LOOP = "def f(data, loader):\n    def g(b):\n        return b\n\n    alias = loader\n    for b in data:\n        g(b)\n"


@pytest.mark.parametrize("text, needle, spliced", [
    ("for b in data:\n    step(b)\n    xm.mark_step()\n", "xm.mark_step()", True),  # directly after a sibling
    ("for b in data:\n    step(b)\n\n    xm.mark_step()  # sync\n    log()\n", "xm.mark_step()", True),  # blank line too
    ("def f():\n    a = 1\n    xm.mark_step(\n        wait=True)\n    return a\n", "xm.mark_step(\n        wait=True)", True),
    ("xm.mark_step()\n", "xm.mark_step()", True),  # a whole top-level chunk: libcst leaves nothing
    ("for b in data:\n    xm.mark_step()\n\n    step(b)\n", "xm.mark_step()", True),  # opens its block: blanks go
    ("for b in data:\n    xm.mark_step()\n\n    # c\n\n    step(b)\n", "xm.mark_step()", True),
    ("def f(a,\n      b):\n    xm.mark_step()\n\n\n    return 1\n", "xm.mark_step()", True),
    ("for b in data:\n    xm.mark_step()\n", "xm.mark_step()", False),  # the block would be empty (libcst: pass)
    ("for b in data:  # loop\n    xm.mark_step()\n    step(b)\n", "xm.mark_step()", False),  # a header comment
    ("if x:\n    xm.mark_step()\nelse:\n    y()\n", "xm.mark_step()", False),
    ("for b in data:\n    step(b)\n    # sync\n    xm.mark_step()\n", "xm.mark_step()", True),  # the comment stays
    ("for b in data:\n    step(b)\n\n    # sync\n\n    xm.mark_step()\n    log()\n", "xm.mark_step()", True),
    ("for b in data:\n    if b:\n        step(b)\n\n    xm.mark_step()\n", "xm.mark_step()", True),
    ("for b in data:\n    if b:\n        step(b)\n        # inner\n\n    xm.mark_step()\n", "xm.mark_step()", False),  # footer
    ("for b in data:\n    if b:\n        step(b)\n\n    # outer\n    xm.mark_step()\n", "xm.mark_step()", True),  # not under it
    ("for b in data:\n    step(b); xm.mark_step()\n", "xm.mark_step()", False),  # shares its line
    ("for b in data:\n    step(b)\n    xm.mark_step(); log()\n", "xm.mark_step()", False),
    ("if x:\n    step()\n    if y:\n        pass\n", "if y:\n        pass", False),  # a compound statement
    # blank lines above, none below: the next statement takes them (a def and the loop after it stay apart)
    (DEF_ALIAS_LOOP, "alias = loader", True),
    ("def f():\n    a()\n\n    alias = loader\n\n    b()\n", "alias = loader", True),  # blank lines below too
    ("def f():\n    a()\n\n    alias = loader\n    @dec\n    def g():\n        pass\n", "alias = loader", True),
    ("def f():\n    a()\n\n    alias = loader\n    other = loader\n    b()\n", "alias = loader", True),
])
def test_statement_deletes_splice_or_refuse_and_agree_with_libcst(text, needle, spliced):
    _splice_agrees(text, _delete(text, needle), spliced)


def test_a_deleted_statement_leaves_the_blank_line_above_to_the_statement_below(checked):
    """`train_device_loader = train_loader` between a local def and the loop (NM130 on pytorch/xla's zero1 test): the
    def and the loop stay apart, as they were."""
    out, _ = apply_fixes(DEF_ALIAS_LOOP, [Fix(FixSafety.SAFE, [_delete(DEF_ALIAS_LOOP, "alias = loader")])])
    assert out == DEF_ALIAS_LOOP.replace("    alias = loader\n", ""), out


# (tests that compare with a string literal: libcst removes such an `if` too, the text splice leaves it to libcst,
# whose rewrite of a window is what these tests are about)
WINDOWS = (
    "class Trainer:\n"
    "    def save(self, mode):\n"
    "        prepare()\n"
    "\n"
    "        if mode == 'xla':\n"
    "            # sync first\n"
    "            xm.mark_step()\n"  # an `if FLAG:` emptied by a fix goes as a whole, with its comment
    "\n"
    "        # then save\n"
    "        save()\n"
    "        for b in batches:\n"
    "            write(b)\n"
    "        if backend == 'xla':\n"
    "            xm.mark_step()\n"  # the same at the end of the function: nothing follows it
    "\n"
    "    def other(self):\n"
    "        return 1\n"
)


def test_an_emptied_if_between_two_statements_is_rewritten_with_its_neighbours_only(monkeypatch):
    """An `if FLAG:` that a fix empties is removed, which changes the block around it: libcst gets it with the
    statements on either side (a window, which keeps the block non-empty and its first statement in place), not the
    whole function; at the end of a block the window is the statement before and the `if`. Equal to one pass."""
    tree = ast.parse(WINDOWS)
    marks = [n for n in ast.walk(tree) if isinstance(n, ast.Expr) and "mark_step" in ast.unparse(n)]
    edits = [Edit("delete_stmt", Span(s.lineno, s.col_offset, s.end_lineno, s.end_col_offset)) for s in marks]
    one_pass, _ = _apply_edits(WINDOWS, edits)
    assert "if mode" not in one_pass and "sync first" not in one_pass and "backend" not in one_pass
    calls = _libcst_texts(monkeypatch, check_regions=True)  # also rewritten one function at a time: must be the same
    out, applied = apply_fixes(WINDOWS, [Fix(FixSafety.SAFE, [e]) for e in edits], tree)
    assert out == one_pass and len(applied) == 2
    windows = [c for c in calls if not c.startswith("def ")]  # (the check's function-at-a-time passes start so)
    assert windows == ["prepare()\n\nif mode == 'xla':\n    # sync first\n    xm.mark_step()\n\n# then save\nsave()\n",
                       "for b in batches:\n    write(b)\nif backend == 'xla':\n    xm.mark_step()\n"]


@pytest.mark.parametrize("text", [
    "def f():\n    if flag:\n        xm.mark_step()\n    save()\n",  # first in its block: its successor's blanks
    "def f():\n    a(); b()\n    if mode == 'xla':\n        xm.mark_step()\n    save()\n",  # a neighbour shares its line
    "def f():\n    prepare()\n    if mode == 'xla':\n        xm.mark_step()\n    save(); other(\n        1)\n",
])
def test_no_window_where_the_block_would_not_see_the_same_change(monkeypatch, text):
    """Where a window could differ from the block (the `if` opens the block; a neighbour's line holds a statement
    outside it), the function is rewritten as before; the text equals one pass either way."""
    tree = ast.parse(text)
    (mark,) = [n for n in ast.walk(tree) if isinstance(n, ast.Expr) and "mark_step" in ast.unparse(n)]
    e = Edit("delete_stmt", Span(mark.lineno, mark.col_offset, mark.end_lineno, mark.end_col_offset))
    calls = _libcst_texts(monkeypatch, check_regions=False)
    out, applied = apply_fixes(text, [Fix(FixSafety.SAFE, [e])], tree)
    assert calls == [text]  # the top-level function, whole
    assert out == _apply_edits(text, [e])[0] and len(applied) == 1


@pytest.mark.parametrize("text, needle, new, spliced", [
    ("if not torch.cuda.is_available():\n    pass\n", "torch.cuda.is_available()", "torch.accelerator.is_available()", True),
    ("ok = not a.is_cuda and b\n", "a.is_cuda", "a.device.type == 'neuron'", False),  # a comparison: negated
    ("@xp.trace_me('step')\ndef f():\n    return 1\n", "xp.trace_me('step')", "torch.profiler.record_function('step')", True),
])
def test_splice_under_not_and_in_decorators_agrees_with_libcst(text, needle, new, spliced):
    _splice_agrees(text, _edit(text, needle, new), spliced)


@pytest.mark.parametrize("text, spliced", [
    # taken: the `if` goes with its comments, as one statement would (blank lines above it too, unless a comment)
    ("def f():\n    prepare()\n\n    if flag:\n        # sync first\n        xm.mark_step()\n\n    # then save\n    save()\n", True),
    ("def f():\n    prepare()\n    # flush the graph\n    if is_torch_xla_available():\n        xm.mark_step()\n\n    save()\n", True),
    ("def f():\n    prepare()\n    if flag:  # on TPU\n        xm.mark_step()\n        xm.mark_step()  # twice\n", True),
    ("def f():\n    prepare()\n    if (\n        a.b\n        and not c == 1\n    ):\n        xm.mark_step()\n    save()\n", True),
    ("def f():\n    prepare()\n    if state.kind is DistributedType.XLA or torch.cuda.is_available():\n        xm.mark_step()\n", True),
    ("for b in data:\n    step(b)\n    if b:\n        xm.mark_step()\n\n# after\nlog()\n", True),
    # refused, and libcst's text either way
    ("def f():\n    prepare()\n    if mode == 'xla':\n        xm.mark_step()\n    save()\n", False),  # a string: libcst
    ("def f():\n    prepare()\n    if sync(x):\n        xm.mark_step()\n    save()\n", False),  # kept: `if sync(x): pass`
    ("def f():\n    prepare()\n    if flag:\n        xm.mark_step()\n    else:\n        log()\n", False),
    ("def f():\n    if a:\n        prepare()\n    elif flag:\n        xm.mark_step()\n    save()\n", False),  # an elif
    ("def f():\n    if flag:\n        xm.mark_step()\n\n    save()\n", False),  # opens its block
    ("def f():\n    prepare()\n    if flag:\n        xm.mark_step()\n        # footer\n    save()\n", False),
    ("def f():\n    prepare()\n    if flag: xm.mark_step()\n    save()\n", False),  # one line
    ("def f():\n    prepare(); other()\n    if flag:\n        xm.mark_step()\n    save()\n", True),
    ("def f():\n    if a:\n        prepare()\n    # c\n    if flag:\n        xm.mark_step()\n", True),  # after a block
    ("def f():\n    if a:\n        prepare()\n        # c\n    if flag:\n        xm.mark_step()\n", False),  # its footer
    ("if flag:\n    xm.mark_step()\n", True),  # a top-level `if`, the whole chunk: libcst leaves nothing
    ("def f():\n    prepare()\n    if (torch.cuda\n            .is_available)():\n        xm.mark_step()\n", False),
])
def test_an_emptied_if_flag_is_spliced_out_or_refused_and_agrees_with_libcst(text, spliced):
    """An `if FLAG:` whose statements the fixes delete is removed whole by libcst's applier; the text splice cuts the
    same lines where it can tell they are the same (rewrite/apply.py:_deleted_lines), and leaves the rest to libcst."""
    tree = ast.parse(text)
    marks = [n for n in ast.walk(tree) if isinstance(n, ast.Expr) and "mark_step" in ast.unparse(n)]
    edits = [Edit("delete_stmt", Span(m.lineno, m.col_offset, m.end_lineno, m.end_col_offset)) for m in marks]
    got = _splice(text, 1, tree.body, edits)
    via_libcst, keys = _apply_edits(text, edits)
    assert len(keys) == len(edits)
    assert (got is not None) is spliced
    if got is not None:
        assert got == via_libcst
        assert "mark_step" not in got
    out, applied = apply_fixes(text, [Fix(FixSafety.SAFE, [e]) for e in edits], tree)
    assert out == via_libcst and len(applied) == len(edits)
