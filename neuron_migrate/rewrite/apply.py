"""Apply fixes to source text, touching only the lines the fixes name.

Fixes address nodes by their source range (from the `ast` detection pass). Each top-level statement with an edit
is rewritten on its own: expression edits and statement deletions that libcst would write as plain text are
spliced into it (_splice); the rest goes to libcst (rewrite/cst_apply.py) for the smallest region that keeps the
change inside (_holding_region). Lines elsewhere are not touched.
"""
from __future__ import annotations

import ast
import os
import re
import sys
import weakref
from bisect import bisect_left, bisect_right
from typing import Optional

from neuron_migrate.files.lines import source_lines
from neuron_migrate.names.analysis import child_blocks, child_nodes
from neuron_migrate.rewrite.insert import InsertError, bound_up_front, insert_support
from neuron_migrate.rewrite.spans import ApplyError
from neuron_migrate.rewrite.spans import span_key as _skey
from neuron_migrate.rules.model import Edit, Fix, Span


def _overlaps(a: tuple, b: tuple) -> bool:
    return (a[0], a[1]) < (b[2], b[3]) and (b[0], b[1]) < (a[2], a[3]) or a == b


def select_compatible(fixes: list[Fix]) -> tuple[list[Fix], list[Fix]]:
    """Fixes whose edits do not overlap an earlier fix's; the rest wait for the next round."""
    taken: dict[int, list[tuple]] = {}  # line -> the chosen edits' spans over it (overlapping spans share a line)
    chosen, deferred = [], []
    for fix in fixes:
        spans = [_skey(e.span) for e in fix.edits]
        if any(_overlaps(s, t) for s in spans for line in range(s[0], s[2] + 1) for t in taken.get(line, ())):
            deferred.append(fix)
            continue
        for sp in spans:
            for line in range(sp[0], sp[2] + 1):
                taken.setdefault(line, []).append(sp)
        chosen.append(fix)
    return chosen, deferred


def _line_chunks(tree: ast.Module) -> list[tuple[int, int]]:
    """Line ranges (1-based, inclusive) of top-level statements, merged where statements share a line."""
    chunks: list[list[int]] = []
    for stmt in tree.body:
        start = min([stmt.lineno, *[d.lineno for d in getattr(stmt, "decorator_list", [])]])
        end = stmt.end_lineno or stmt.lineno
        if chunks and start <= chunks[-1][1]:
            chunks[-1][1] = max(chunks[-1][1], end)
        else:
            chunks.append([start, end])
    return [(a, b) for a, b in chunks]


_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _stmt_start(stmt: ast.stmt) -> int:
    return min([stmt.lineno, *[d.lineno for d in getattr(stmt, "decorator_list", [])]])


class _TopLevel:
    """A module's top-level statements with their first lines (decorators included) and last lines, both in
    order, so that the statements over some lines are found by bisection, not by a scan per edit."""

    def __init__(self, tree: ast.Module):
        self.body = tree.body
        self.starts = [_stmt_start(st) for st in self.body]
        self.ends = [st.end_lineno or st.lineno for st in self.body]

    def over(self, ra: int, rb: int) -> list:
        """The statements with a line in ra..rb."""
        return self.body[bisect_left(self.ends, ra) : bisect_right(self.starts, rb)]

    def at(self, a: int) -> Optional[ast.stmt]:
        """The first statement that starts at line `a` or holds it."""
        for i in range(bisect_left(self.ends, a), len(self.body)):
            if self.starts[i] > a:
                break
            st = self.body[i]
            if self.starts[i] == a or st.lineno <= a <= self.ends[i]:
                return st
        return None


_TOP_LEVELS: "weakref.WeakKeyDictionary[ast.Module, _TopLevel]" = weakref.WeakKeyDictionary()


def _top_level(tree: ast.Module) -> _TopLevel:
    top = _TOP_LEVELS.get(tree)
    if top is None:
        top = _TOP_LEVELS[tree] = _TopLevel(tree)
    return top


# statements with blocks of their own that the applier never removes as a whole when a fix empties a block in
# them (it writes `pass` there, or drops an emptied `else:`), so its changes stay inside them: each can be
# rewritten on its own (see _holding_region). Not `if`: an `if FLAG:` whose body a fix removed goes too, which empties
# the block around it in turn.
_COMPOUND = (*_DEFS, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try,
             *((ast.TryStar,) if hasattr(ast, "TryStar") else ()), ast.Match)


# edit kinds a window of sibling statements (see _holding_region) may hold: they remove or rewrite code and write no
# new statement (whose blocks libcst would indent by the parsed text's default indentation, which a window may not
# show)
_WINDOW_EDITS = frozenset({"delete_stmt", "replace_expr"})


def _holding_region(tree: ast.Module, a: int, b: int, edits: list[Edit], lines: list[str], kinds: tuple = _COMPOUND,
                    windows: bool = False):
    """The innermost region within top-level lines a..b that holds every edit and keeps the applier's changes
    inside, as (first line, last line, indentation), when its lines can be dedented losslessly (else the next one
    out). A region is a statement of `kinds` (a function or class, or one of _COMPOUND) that is not itself edited,
    or, with `windows`, three consecutive statements of one block whose first and last hold no edit (see
    _window_around): the middle one may vanish whole (an emptied `if FLAG:` goes, which is why `if` is no region of
    its own), and the block still keeps the other two."""
    lo = min(e.span.line for e in edits)
    hi = max(e.span.end_line for e in edits)
    keys = {(e.span.line, e.span.end_line) for e in edits}
    windows = windows and all(e.kind in _WINDOW_EDITS for e in edits)
    edited = _LineRanges((e.span.line, e.span.end_line) for e in edits) if windows else None
    node = _top_level(tree).at(a)
    candidates = []  # (first line, last line), outermost first
    while node is not None:
        if isinstance(node, kinds) and (node.lineno, node.end_lineno) not in keys:
            if _stmt_start(node) < lo and hi <= node.end_lineno and (a, b) != (_stmt_start(node), node.end_lineno):
                candidates.append((_stmt_start(node), node.end_lineno))
        child = None
        for block in child_blocks(node):
            for i, st in enumerate(block):
                if _stmt_start(st) <= lo and hi <= (st.end_lineno or st.lineno):
                    child = st
                    if edited is not None:
                        window = _window_around(block, i, edited)
                        if window is not None:
                            candidates.append(window)
                    break
            if child is not None:
                break
        node = child
    for ra, rb in reversed(candidates):
        first = lines[ra - 1]
        prefix = first[: len(first) - len(first.lstrip(" \t"))]
        # not losslessly dedentable: a less indented line (inside a string, say) or a whitespace-only one
        if prefix and all(not ln.strip("\r\n") or (ln.startswith(prefix) and ln.strip()) for ln in lines[ra - 1 : rb]):
            return ra, rb, prefix
    return None


def _window_around(block: list, i: int, edited: "_LineRanges") -> Optional[tuple[int, int]]:
    """Lines of block[i - 1 : i + 2] (block[i - 1 : i + 1] when block[i] ends the block) when rewriting them alone,
    dedented, as a module of two or three statements, is rewriting them in place: block[i] holds the edits, its
    neighbours hold none and share no line with a statement outside. The applier then treats them as in the block:
    block[i - 1] stays, so the block is never emptied and its first statement is never the one removed (whose
    successor would lose its leading blank lines there); a removed block[i] carries its comments to block[i + 1], or
    to the block's footer (the module's, here: the same lines, indented alike once the window is indented back)."""
    if i < 1:
        return None
    before = block[i - 1]
    last = block[i + 1] if i + 1 < len(block) else block[i]
    ra, rb = _stmt_start(before), last.end_lineno or last.lineno
    if edited.meets(ra, before.end_lineno or before.lineno):
        return None
    if last is not block[i] and edited.meets(_stmt_start(last), rb):
        return None
    if i >= 2 and (block[i - 2].end_lineno or block[i - 2].lineno) >= ra:
        return None  # `x = 1; y = 2` with y first in the window: its line holds x too
    if i + 2 < len(block) and _stmt_start(block[i + 2]) <= rb:
        return None
    return ra, rb


def _unshift(k: tuple, delta: int, n: int) -> tuple:
    if k[0] == "unfit":
        return ("unfit", *_unshift(k[1:], delta, n))
    return (k[0] + delta, k[1] + n, k[2] + delta, k[3] + n)


# line breaks that str.splitlines honours and Python's tokenizer does not (or not alone): line numbers could differ
_ODD_BREAKS = re.compile("[\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]|\r(?!\n)")


class _LineRanges:
    """Line ranges, asked whether any of them shares a line with a given range in O(log n): sorted by first line,
    with the furthest last line of each prefix."""

    def __init__(self, ranges):
        ordered = sorted(ranges)
        self.firsts = [a for a, _b in ordered]
        self.reach: list[int] = []
        for _a, b in ordered:
            self.reach.append(max(b, self.reach[-1]) if self.reach else b)

    def meets(self, first: int, last: int) -> bool:
        k = bisect_right(self.firsts, last)  # the ranges that start on or before `last`
        return bool(k) and self.reach[k - 1] >= first


def _splice(chunk: str, first_line: int, stmts: list[ast.stmt], edits: list[Edit]) -> Optional[str]:
    """`chunk` (source lines from `first_line`, holding `stmts`) with expression edits written in as plain text and
    deleted statements' lines cut (see _deleted_lines), or None when only libcst can do them exactly.

    For a `replace_expr` edit the applier writes libcst's parse of the edit's text, which prints back as that text,
    in place of the node, keeping the node's own parentheses (outside the ast range): the same characters as
    splicing the text into the range. It differs in four cases, all left to libcst: the node is inside an f-string
    (quotes may need changing), the text is a comparison written as the operand of `not` (negated in place), the
    text brings parentheses of its own (they would replace the node's), and the text spans lines (libcst indents
    its continuation lines by the enclosing block's indentation). Ranges are found in the ast so an edit that names
    no expression is left to libcst too; non-ASCII lines (columns in characters, not bytes) as well."""
    if not chunk.isascii() or _ODD_BREAKS.search(chunk):
        return None
    want: dict[tuple, Edit] = {}
    deletes: dict[tuple, Edit] = {}
    for e in edits:
        if e.kind == "delete_stmt":
            deletes[_skey(e.span)] = e
            continue
        if e.kind != "replace_expr" or e.text[:1] == "(" or e.text != e.text.strip() or not e.text or "\n" in e.text:
            return None
        want[_skey(e.span)] = e
    found: set = set()
    edited = _LineRanges((e.span.line, e.span.end_line) for e in want.values())
    stack: list = [(st, False) for st in stmts] if want else []
    while stack:
        node, blocked = stack.pop()
        end = getattr(node, "end_lineno", None)
        # (a decorated statement starts at its first decorator, above its own line number)
        if end is not None and not edited.meets(_stmt_start(node) if hasattr(node, "decorator_list") else node.lineno, end):
            continue  # holds no edited line (a sibling method of the one being rewritten, say): nothing to find
        if isinstance(node, ast.expr):
            k = (node.lineno, node.col_offset, node.end_lineno, node.end_col_offset)
            if k in want:
                if blocked:
                    return None
                found.add(k)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            o = node.operand
            e = want.get((o.lineno, o.col_offset, o.end_lineno, o.end_col_offset))
            if e is not None and _writes_comparison(e.text):
                return None
        inner_blocked = blocked or isinstance(node, ast.JoinedStr)
        for child in child_nodes(node):
            stack.append((child, inner_blocked))
    if len(found) != len(want):
        return None
    chunk_lines = chunk.splitlines(keepends=True)
    starts = [0]
    for ln in chunk_lines:
        starts.append(starts[-1] + len(ln))
    ranges = []  # (start, end, text) in chunk offsets
    for e in want.values():
        ranges.append((starts[e.span.line - first_line] + e.span.col, starts[e.span.end_line - first_line] + e.span.end_col, e.text))
    if deletes:
        cut = _deleted_lines(chunk_lines, first_line, stmts, deletes)
        if cut is None:
            return None
        for la, lb in cut:  # whole lines
            ranges.append((starts[la - first_line], starts[lb - first_line + 1], ""))
    out, pos = [], 0
    for a, b, text in sorted(ranges):
        if a < pos:
            return None  # overlapping edits (select_compatible keeps them apart; libcst decides if not)
        out.append(chunk[pos:a])
        out.append(text)
        pos = b
    out.append(chunk[pos:])
    return "".join(out)


def _writes_comparison(text: str) -> bool:
    """Does an edit's text parse to a comparison (which the applier negates in place under `not`)? Text that does
    not parse at all is left to libcst, which reports it."""
    try:
        return isinstance(ast.parse(text, mode="eval").body, ast.Compare)
    except (SyntaxError, ValueError, RecursionError):
        return True


_SIMPLE_STMTS = (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Pass, ast.Import, ast.ImportFrom, ast.Assert,
                 ast.Delete, ast.Raise, ast.Return, ast.Global, ast.Nonlocal, ast.Break, ast.Continue)
_LINE_REST = re.compile(r"[ \t]*(?:#[^\r\n]*)?\r?\n?\Z")  # what may follow a statement on its last line


def _pure_test(node: ast.expr, chunk_lines: list[str], first_line: int) -> bool:
    """rewrite/cst_apply.py's `_pure` on the ast: names, attributes, ints, True/False/None, `not`/`-`, `and`/`or`,
    comparisons of those, and argument-less calls whose callee's text says `available` or `xla`. (A string literal
    is pure there unless implicitly concatenated, which the ast does not show: it is left to libcst here.)"""
    t = type(node)
    if t is ast.Name or t is ast.Attribute:
        return True
    if t is ast.Constant:
        v = node.value
        return v is None or type(v) is bool or type(v) is int
    if t is ast.UnaryOp:
        return _pure_test(node.operand, chunk_lines, first_line)
    if t is ast.BoolOp:
        return all(_pure_test(v, chunk_lines, first_line) for v in node.values)
    if t is ast.Compare:
        return all(_pure_test(v, chunk_lines, first_line) for v in (node.left, *node.comparators))
    if t is ast.Call and not node.args and not node.keywords:
        f = node.func
        if f.lineno != f.end_lineno or not first_line <= f.lineno < first_line + len(chunk_lines):
            return False  # a callee over several lines: left to libcst
        text = chunk_lines[f.lineno - first_line][f.col_offset : f.end_col_offset]
        return "available" in text or "xla" in text.lower()
    return False


def _deleted_lines(chunk_lines: list[str], first_line: int, stmts: list[ast.stmt], deletes: dict) -> Optional[list]:
    """The line ranges `delete_stmt` edits remove, where libcst's removal is exactly those lines, or None.

    The applier drops the statement's line node, trailing comment included, with the blank lines above it unless
    they hold a comment (then all of them are carried to what follows: they stay). It does more (a block left empty
    gets `pass`, an emptied `else:` goes, the next statement's blank lines are trimmed) when the statement opens its
    block or is the last one left. So: a simple statement alone on its lines, after a sibling that stays (after a
    compound one, comment lines between them must not be indented under it: a block's footer holds those), or a
    top-level statement that is the whole chunk (libcst turns it into nothing). An `if FLAG:` (a test without side
    effects, no `else`) whose every statement is deleted is removed whole by the applier, as one statement would
    be: the same rules apply to it, when no comment indented under it follows it (its block's footer, which goes
    with it)."""
    last_line = first_line + len(chunk_lines) - 1
    cut: dict = {}
    covered: set = set()  # the deletes whose lines are cut (an emptied `if` takes those of its statements)

    def whole_lines(st) -> bool:
        head = chunk_lines[st.lineno - first_line][: st.col_offset]
        tail = chunk_lines[st.end_lineno - first_line][st.end_col_offset:]
        return not head.strip(" \t") and _LINE_REST.match(tail) is not None

    def key(st) -> tuple:
        return (st.lineno, st.col_offset, st.end_lineno, st.end_col_offset)

    def comments_above_stay(gap, st) -> bool:
        """Lines between a compound statement and `st` that hold a comment: the applier carries them to what follows
        `st`, unless they belong to the block above (libcst's block footer: comments indented under it)."""
        return all(not ln.strip() or len(ln) - len(ln.lstrip(" \t")) <= st.col_offset for ln in gap)

    def emptied_if(st, node, block) -> bool:
        """`st` is an `if` the applier removes whole (every statement of its indented body deleted, no `else`, a
        pure test), and none of its lines is also changed otherwise: not an `elif`, no comment indented under it
        after its last statement."""
        if (type(st) is not ast.If or st.orelse or st.body[0].lineno <= st.lineno
                or not all(key(b) in deletes for b in st.body) or st.end_lineno > last_line):
            return False
        if type(node) is ast.If and block is node.orelse:
            return False  # an `elif` (or `else: if`): the applier decides it with its parent
        if not _pure_test(st.test, chunk_lines, first_line):
            return False
        for ln in chunk_lines[st.end_lineno + 1 - first_line :]:
            text = ln.strip()
            if text and not text.startswith("#"):
                break
            if text and len(ln) - len(ln.lstrip(" \t")) > st.col_offset:
                return False  # the footer of its block: libcst drops it with the `if`
        return True

    def within(st) -> list:
        """The deletes in `st`'s lines (itself, or the statements of an emptied `if`): gone with it."""
        return [k for k in deletes if st.lineno <= k[0] and k[2] <= st.end_lineno]

    for st in stmts:
        if key(st) in deletes or emptied_if(st, None, None):
            # a statement that is the whole chunk (a top-level one): libcst leaves nothing of it
            if not ((key(st) not in deletes or isinstance(st, _SIMPLE_STMTS)) and st.lineno == first_line
                    and st.end_lineno == last_line and whole_lines(st)):
                return None
            cut[key(st)] = (st.lineno, st.end_lineno)
            covered.update(within(st))
    todo = [st for st in stmts if not isinstance(st, _SIMPLE_STMTS) and key(st) not in cut]
    while todo:
        node = todo.pop()
        for block in child_blocks(node):
            for i, st in enumerate(block):
                gone_if = bool(i) and emptied_if(st, node, block)
                if i and (gone_if or key(st) in deletes):
                    # a simple statement, or an emptied `if`, after a sibling that stays
                    prev = block[i - 1]
                    if (key(prev) in deletes or not (gone_if or isinstance(st, _SIMPLE_STMTS))
                            or prev.end_lineno < first_line or st.end_lineno > last_line or not whole_lines(st)):
                        return None
                    gap = chunk_lines[prev.end_lineno - first_line + 1 : st.lineno - first_line]
                    nxt = block[i + 1] if i + 1 < len(block) else None
                    if gap and not any(ln.strip() for ln in gap) and nxt is not None:
                        if key(nxt) in deletes or emptied_if(nxt, node, block):
                            return None  # a run of removals: libcst decides where the blank lines go
                        start = min([nxt.lineno, *(d.lineno for d in getattr(nxt, "decorator_list", ()))])
                        if start == st.end_lineno + 1:
                            # the next statement has no blank line of its own: it takes these (a deleted alias
                            # between a def and the loop below leaves them apart)
                            cut[key(st)] = (st.lineno, st.end_lineno)
                        else:
                            cut[key(st)] = (prev.end_lineno + 1, st.end_lineno)
                    elif not any(ln.strip() for ln in gap):
                        cut[key(st)] = (prev.end_lineno + 1, st.end_lineno)  # blank lines above go with it
                    elif isinstance(prev, _SIMPLE_STMTS) or comments_above_stay(gap, st):
                        # the lines above are all the statement's own and hold a comment: libcst carries them to
                        # what follows, so they stay where they are (after a block, unless indented under it)
                        cut[key(st)] = (st.lineno, st.end_lineno)
                    else:
                        return None
                    covered.update(within(st))
                elif key(st) in deletes:
                    # the block's first statement: libcst also drops the blank lines that would now open the block
                    nxt = block[1] if len(block) > 1 else None
                    above = chunk_lines[st.lineno - first_line - 1] if st.lineno > first_line else ""
                    if (nxt is None or key(nxt) in deletes or not isinstance(st, _SIMPLE_STMTS) or "#" in above
                            or not above.rstrip().endswith(":") or st.end_lineno >= last_line or not whole_lines(st)):
                        return None
                    end = st.end_lineno
                    while end < last_line and not chunk_lines[end + 1 - first_line].strip():
                        end += 1
                    cut[key(st)] = (st.lineno, end)
                    covered.add(key(st))
                elif not isinstance(st, _SIMPLE_STMTS):
                    todo.append(st)
    if covered != set(deletes):
        return None
    return sorted(cut.values())


def _apply_edits(text: str, edits: list[Edit]) -> tuple[str, set]:
    """libcst's rewrite of `text` and the (unshifted) keys of the edits applied (rewrite/cst_apply.py, imported
    here: a file whose edits are all spliced into the text never loads libcst)."""
    from neuron_migrate.rewrite.cst_apply import apply_edits

    return apply_edits(text, edits)


# NM_CHECK_SPLICE=1: every spliced region is also run through libcst and must come out the same (the tests and the
# bench tree use it to prove the text path exact)
_CHECK_SPLICE = bool(os.environ.get("NM_CHECK_SPLICE"))
# NM_CHECK_REGIONS=1: every chunk rewritten one block at a time is also rewritten one function at a time (the
# larger regions of earlier versions) and must come out the same
_CHECK_REGIONS = bool(os.environ.get("NM_CHECK_REGIONS"))


class SpliceMismatch(AssertionError):
    pass


def _libcst_region(lines: list[str], ra: int, rb: int, prefix: Optional[str], edits: list[Edit]) -> tuple[str, set]:
    """libcst's rewrite of lines ra..rb (dedented by `prefix` for the parse and indented back; None: a top-level
    chunk) and the keys of the edits applied, in the file's coordinates."""
    delta, n = ra - 1, len(prefix or "")
    body = "".join(ln[n:] if prefix and ln.startswith(prefix) else ln for ln in lines[ra - 1 : rb])
    shifted = [Edit(e.kind, Span(e.span.line - delta, e.span.col - n, e.span.end_line - delta, e.span.end_col - n), e.text)
               for e in edits]
    code, keys = _apply_edits(body, shifted)
    if prefix:
        code = "".join(ln if not ln.strip("\r\n") else prefix + ln for ln in source_lines(code, keepends=True))
    return code, {_unshift(k, delta, n) for k in keys}


def _splice_region(tree: ast.Module, lines: list[str], ra: int, rb: int, prefix: Optional[str], edits: list[Edit]) -> Optional[str]:
    """Lines ra..rb with `edits` spliced in (see _splice), or None when libcst must do them."""
    stmts = _top_level(tree).over(ra, rb)
    spliced = _splice("".join(lines[ra - 1 : rb]), ra, stmts, edits)
    if spliced is not None and _CHECK_SPLICE:
        code, keys = _libcst_region(lines, ra, rb, prefix, edits)
        if code != spliced or len(keys) != len(edits):
            sys.stderr.write(f"SPLICE MISMATCH at line {ra}\n--- libcst\n{code}\n--- splice\n{spliced}\n")
            raise SpliceMismatch(f"text splice differs from libcst at line {ra}")
    return spliced


def _rewrite_region(tree: ast.Module, lines: list[str], ra: int, rb: int, prefix: Optional[str], edits: list[Edit]) -> tuple[str, set]:
    """Lines ra..rb with `edits` applied (text splice when exact, else libcst) and the keys of the edits applied."""
    spliced = _splice_region(tree, lines, ra, rb, prefix, edits)
    if spliced is not None:
        return spliced, {_skey(e.span) for e in edits}
    return _libcst_region(lines, ra, rb, prefix, edits)


def _regions(tree: ast.Module, a: int, b: int, edits: list[Edit], lines: list[str],
             kinds: tuple = _COMPOUND, windows: bool = True) -> Optional[list[tuple]]:
    """Disjoint (first line, last line, indentation, edits) regions of top-level lines a..b, each the innermost
    statement of `kinds` (or, with `windows`, window of a block) holding its edits (see _holding_region), or None
    when some edit has none. The applier's changes never leave such a region (comments of a removed statement move
    within its block, an emptied block gets `pass` there), so each region can be rewritten on its own."""
    regions: list[list] = []
    for e in edits:
        r = _holding_region(tree, a, b, [e], lines, kinds, windows)
        if r is None:
            return None
        regions.append([r[0], r[1], r[2], [e]])
    regions.sort(key=lambda r: r[0])
    merged: list[list] = []
    for r in regions:
        while merged and r[0] <= merged[-1][1]:  # nested or shared: the innermost region holding both
            prev = merged.pop()
            both = prev[3] + r[3]
            u = _holding_region(tree, a, b, both, lines, kinds, windows)
            if u is None:
                return None
            r = [u[0], u[1], u[2], both]
        merged.append(r)
    return [tuple(r) for r in merged]


def _rewrite_chunk(tree: ast.Module, lines: list[str], a: int, b: int, edits: list[Edit]) -> tuple[str, set]:
    """Top-level lines a..b with `edits` applied, and the keys of the edits applied. libcst is paid only for the
    innermost functions or blocks (_COMPOUND) that hold edits it must do itself; expression edits it would write
    as their own text are spliced in (see _splice)."""
    spliced = _splice_region(tree, lines, a, b, None, edits)
    if spliced is not None:
        return spliced, {_skey(e.span) for e in edits}
    code, keys = _rewrite_regions(tree, lines, a, b, edits, _COMPOUND, windows=True)
    if _CHECK_REGIONS:
        wide = _rewrite_regions(tree, lines, a, b, edits, _DEFS, windows=False)
        if wide != (code, keys):
            sys.stderr.write(f"REGION MISMATCH at line {a}\n--- functions\n{wide[0]}\n--- blocks\n{code}\n")
            raise SpliceMismatch(f"rewriting blocks differs from rewriting functions at line {a}")
    return code, keys


def _rewrite_regions(tree: ast.Module, lines: list[str], a: int, b: int, edits: list[Edit], kinds: tuple,
                     windows: bool) -> tuple[str, set]:
    """_rewrite_chunk's libcst part, one region (innermost statement of `kinds`, or window, holding edits) at a time."""
    regions = _regions(tree, a, b, edits, lines, kinds, windows)
    if regions is None:
        return _libcst_region(lines, a, b, None, edits)
    out: list[str] = []
    keys: set = set()
    pos = a  # next line (1-based) not yet copied
    for ra, rb, prefix, group in regions:
        out.append("".join(lines[pos - 1 : ra - 1]))
        code, got = _rewrite_region(tree, lines, ra, rb, prefix, group)
        out.append(code)
        keys |= got
        pos = rb + 1
    out.append("".join(lines[pos - 1 : b]))
    return "".join(out), keys


def _ends_before(stmt: Optional[ast.stmt], line: int) -> bool:
    return stmt is not None and (stmt.end_lineno or stmt.lineno) < line


def _new_body(tree: ast.Module, chunks: list, rewritten: list) -> Optional[list]:
    """The top-level statements of the text apply_fixes wrote, with the lines they start and end at (and their
    decorators') in that text, or None when a rewritten chunk does not parse alone: what insert_support reads of a
    text's tree (names, and where top-level statements stand), without parsing the whole text again. The statements
    of untouched chunks are the old tree's, copied with their lines moved (their children are shared: they are read,
    not changed); each rewritten chunk is parsed on its own (a top-level statement is a syntactic unit)."""
    import copy

    starts = [a for a, _b in chunks]
    changed = {idx: (code, first) for idx, code, first, _moved in rewritten}
    moves = [(chunks[idx][1], moved) for idx, _code, _first, moved in rewritten]  # (last old line, shift after it)
    body: list = []
    k = 0  # the rewritten chunks passed so far
    done: set = set()

    def moved_to(st, by: int):
        new = copy.copy(st)
        new.lineno, new.end_lineno = st.lineno + by, (st.end_lineno or st.lineno) + by
        decorators = getattr(st, "decorator_list", None)
        if decorators:
            new.decorator_list = []
            for d in decorators:
                d2 = copy.copy(d)
                d2.lineno = d.lineno + by
                new.decorator_list.append(d2)
        return new

    for st in tree.body:
        idx = bisect_right(starts, _stmt_start(st)) - 1
        if idx in changed:
            if idx in done:
                continue
            done.add(idx)
            code, first = changed[idx]
            if not code:
                continue
            try:
                part = ast.parse(code)
            except (SyntaxError, ValueError, RecursionError):
                return None
            body.extend(moved_to(s, first - 1) for s in part.body)
            continue
        while k < len(moves) and moves[k][0] < _stmt_start(st):
            k += 1
        body.append(moved_to(st, moves[k - 1][1]) if k else st)
    return body


def apply_fixes(text: str, fixes: list[Fix], tree: Optional[ast.Module] = None,
                helper_import: Optional[str] = None) -> tuple[str, list[Fix]]:
    """Apply `fixes` to `text`. Returns the new text and the fixes actually applied.

    libcst is paid only for the top-level statements that contain an edit: each is parsed and transformed
    on its own (a top-level statement is a syntactic unit) and spliced back; lines elsewhere are not touched.
    """
    if not fixes:
        return text, []
    edits = [e for f in fixes for e in f.edits]
    if tree is None:  # the caller's ast of `text` saves a parse
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError, RecursionError) as exc:
            raise ApplyError(f"cannot parse the file: {exc}") from None
    lines = source_lines(text, keepends=True)
    chunks = _line_chunks(tree)
    chunk_starts = [a for a, _b in chunks]
    by_chunk: dict[int, list[Edit]] = {}
    for e in edits:
        idx = bisect_right(chunk_starts, e.span.line) - 1  # chunks are disjoint and in order
        if idx < 0 or e.span.end_line > chunks[idx][1]:
            raise ApplyError(f"line {e.span.line}: could not locate the code to change ({e.kind})")
        by_chunk.setdefault(idx, []).append(e)
    applied_keys: set = set()
    out: list[str] = []
    pos = 0  # next line index (0-based) of `lines` not yet copied
    rewritten: list[tuple] = []  # (chunk index, its new code, its first line in the new text, lines after it moved by)
    n_out = 0  # lines in `out`
    for idx in sorted(by_chunk):
        a, b = chunks[idx]
        prev_end = max(pos, chunks[idx - 1][1] if idx else 0)
        out.extend(lines[pos:prev_end])
        gap = lines[prev_end : a - 1]  # blank and comment lines between the previous statement and this one
        code, keys = _rewrite_chunk(tree, lines, a, b, by_chunk[idx])
        applied_keys.update(keys)
        if not code and all(not ln.strip() for ln in gap):
            gap = []  # a removed statement takes its blank separator lines with it (comments stay)
        out.extend(gap)
        n_out += prev_end - pos + len(gap)
        out.append(code)
        n_code = len(source_lines(code)) if code else 0
        rewritten.append((idx, code, n_out + 1, n_out + n_code - b))
        n_out += n_code
        pos = b
    out.extend(lines[pos:])
    new_text = "".join(out)
    stripped = False
    if new_text[:1] in ("\n", "\r") and text[:1] not in ("\n", "\r"):
        # the file's first statement was removed: the blank lines that separated it from the next go too
        new_text = re.sub(r"\A(?:[ \t]*\r?\n)+", "", new_text)
        stripped = True
    applied = [f for f in fixes if all(_skey(e.span) in applied_keys for e in f.edits)]
    unfit = {k[1:] for k in applied_keys if k[0] == "unfit"}
    if unfit:
        # leave out every fix with an edit that cannot be written (it stays a finding), and redo the rest
        keep = [f for f in fixes if not any(_skey(e.span) in unfit for e in f.edits)]
        return apply_fixes(text, keep, tree, helper_import) if keep else (text, [])
    missed = [e for f in fixes for e in f.edits if _skey(e.span) not in applied_keys]
    if missed:
        e = missed[0]
        raise ApplyError(f"line {e.span.line}: could not locate the code to change ({e.kind})")
    imports = list(dict.fromkeys(req for f in applied for req in f.imports))
    helpers = list(dict.fromkeys(h for f in applied for h in f.helpers))
    # imports the file already has among its leading imports, above every edited line, are there in the new
    # text too: no need to parse it again to place them
    first_edit = chunks[min(by_chunk)][0] if by_chunk else len(lines) + 1
    present = not helpers and all(_ends_before(bound_up_front(tree.body, req), first_edit) for req in imports)
    if (imports or helpers) and not present:
        body = None if stripped else _new_body(tree, chunks, rewritten)
        try:
            new_text = insert_support(new_text, imports, helpers, helper_import, body=body)
        except InsertError as exc:
            raise ApplyError(str(exc)) from None
    return new_text, applied

