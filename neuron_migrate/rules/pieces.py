"""Audit a very large file in pieces, so that memory stays bounded by a piece instead of growing with the file.

`ast.parse` keeps about 50 bytes of tree per byte of source (a 15 MB generated file: 975 MB at its peak), so
a file over `PIECES_MIN_CHARS` is cut at top-level statements into pieces of about `PIECE_CHARS` and each
piece is parsed and checked on its own. Each piece is checked as the whole file with every line outside it
blanked, except the module's glue (imports, assignments, `if`/`try` blocks: every top-level statement that
is not a def or a class), which every piece keeps: names imported or bound anywhere at module level resolve
in every piece, and line and column numbers are the file's own. A finding is reported by the piece that holds
its line. What a piece cannot see is another piece's defs and classes (a function defined in one piece and
called in another is unknown where it is called).

A cut is made only before a line at column 0 that starts a def, a class or a decorator. The plan (cuts, glue)
comes from the column-0 lines alone, and each piece's tree, which the check parses anyway, must hold exactly
the top-level statements the plan expects there, lines included; where it does not (a column-0 line inside a
string or brackets), the file is planned again by parsing each piece alone first, a cut standing only where
the text before it parses on its own: the tokenizer is then outside every string and bracket there, so the
rest is a sequence of whole statements too. When no cut exists (one huge literal, a syntax error) the file is
checked whole, as before.
"""
from __future__ import annotations

import ast
import bisect
import re

from neuron_migrate.files.lines import source_lines

PIECES_MIN_CHARS = 4_000_000  # files above this are checked in pieces (real hand-written files are far below)
PIECE_CHARS = 256_000  # about 5,000 lines: a piece's tree is some 15 MB
GLUE_MAX_CHARS = 200_000  # module glue kept in every piece; more, and only its imports are kept
_CUT = re.compile(r"(?:def|class|async[ \t]+def)[ \t]|@", re.ASCII)
_LONE_CR = re.compile(r"\r(?!\n)")
_CLAUSE = re.compile(r"(?:else|elif|except|finally)\b")  # column-0 lines that continue the statement above
_IMPORT = re.compile(r"(?:import|from)[ \t]")
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
PIECES_NOTE = ("{mb:.1f} MB, checked in {n} pieces of top-level statements to bound memory: facts that span the "
               "file (an import's other uses, APIs that migrate together, a function's callers) are judged per piece")
_MAX_RETRIES = 4  # cuts that did not parse, before the file is checked whole


def check_in_pieces(text: str, path: str, ruleset, settings=None, map_pieces=None):
    """The CheckResult of checking `text` piece by piece (its `analysis` is None), or None when the text
    cannot be cut (the caller checks it whole). `map_pieces(fn, pieces)`: [fn(p) for p in pieces], possibly on
    several processes (the pipeline's fork_map); the pieces are independent."""
    if "ignore-file" in text:  # a file-wide suppression comment must be seen by every piece
        return None
    if _LONE_CR.search(text):  # old Mac line ends: a blanked "\n" after a kept "\r" line would join the two
        return None
    lines = source_lines(text, keepends=True)
    statements = _statements_by_lines(lines)
    plan = _plan(statements, lines) if statements is not None else None
    if plan is not None and len(plan[0]) > 1:  # one parse per piece, each piece's tree checking the plan
        result = _check_plan(plan, lines, path, ruleset, settings, statements, map_pieces)
        if result is not None:
            return result
    cut = _cut(lines)  # the plan from parsing every piece first
    return _check_plan(cut, lines, path, ruleset, settings, None, map_pieces) if cut is not None else None


class _WrongPlan(Exception):
    """A piece's tree does not hold the top-level statements its plan expects there."""


def _check_plan(plan, lines: list[str], path: str, ruleset, settings, statements=None, map_pieces=None):
    """Check the pieces of `plan`; with `statements` (the top-level statements the plan was made from), each
    piece's tree must hold exactly the ones expected there, else None (the plan was wrong: a column-0 line in a
    string, say)."""
    ranges, glue, imports = plan
    keep = glue if sum(len(lines[i]) for a, b in glue for i in range(a, b)) <= GLUE_MAX_CHARS else imports
    if sum(len(lines[i]) for a, b in keep for i in range(a, b)) > GLUE_MAX_CHARS:
        return None
    from neuron_migrate.names.analysis import AnalysisError
    from neuron_migrate.rules.runner import CheckResult, check_text

    kept = {(a, b, False) for a, b in keep}

    def check_piece(span: tuple) -> tuple:
        """(findings, suppressed) of one piece; raises _WrongPlan."""
        start, end = span
        piece = ["\n"] * len(lines)
        for a, b in [*keep, (start, end)]:
            piece[a:b] = lines[a:b]
        text = "".join(piece)
        try:
            r = check_text(text, path, ruleset, settings, report_lines=range(start + 1, end + 1))
        except AnalysisError:
            if statements is not None:
                raise _WrongPlan from None
            raise
        if statements is not None:
            tree = r.analysis.tree if r.analysis is not None else ast.parse(text)
            expected = sorted(kept | {st for st in statements if start <= st[0] < end})
            if [(_first_line(st) - 1, st.end_lineno, isinstance(st, _DEFS)) for st in tree.body] != expected:
                raise _WrongPlan
        if r.analysis is not None:
            r.analysis.release()  # before the next piece is parsed: memory holds one piece at a time
        return r.findings, r.suppressed

    try:
        checked = (map_pieces or _serial)(check_piece, ranges)
    except _WrongPlan:
        return None
    from neuron_migrate.rules.model import Finding

    findings = [f for piece_findings, _ in checked for f in piece_findings]
    findings.sort(key=Finding.sort_key)
    return CheckResult(findings, None, None, sum(n for _, n in checked), pieces=len(ranges))


def _serial(fn, items) -> list:
    return [fn(x) for x in items]


def _first_line(stmt: ast.stmt) -> int:
    return min([stmt.lineno, *[d.lineno for d in getattr(stmt, "decorator_list", ())]])


def _statements_by_lines(lines: list[str]):
    """[(first, end, is_def)] of the top-level statements (0-based first line, end exclusive) as the lines alone
    suggest: a statement starts at every column-0 line that is not a comment, a closing bracket or a clause of
    the statement before (`else:`); decorators belong to what they decorate; trailing blank and comment lines
    belong to no statement. Wrong where a column-0 line sits in a string or brackets: the pieces' trees say so.
    None when no statement is a def or a class."""
    starts = []
    for i, line in enumerate(lines):
        c = line[:1]
        if not c or c in " \t\r\n\x0c#)]}" or _CLAUSE.match(line):
            continue
        if starts and lines[starts[-1]][:1] == "@" and all(not ln.strip() or ln.lstrip().startswith("#")
                                                          for ln in lines[starts[-1] + 1 : i]):
            if c == "@" or _CUT.match(line):
                continue  # another decorator, or what the decorators decorate: the same statement
        starts.append(i)
    out = []
    for k, first in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else len(lines)
        while end > first + 1 and (not lines[end - 1].strip() or lines[end - 1].lstrip().startswith("#")):
            end -= 1
        out.append((first, end, bool(_CUT.match(lines[first]))))
    return out if any(d for _a, _b, d in out) else None


def _plan(statements: list, lines: list[str]) -> tuple:
    """(piece ranges, glue spans, import spans) from `statements`: pieces of about PIECE_CHARS, cut before defs."""
    ranges, glue, imports = [], [], []
    start, size = 0, 0
    for k, (first, end, is_def) in enumerate(statements):
        if is_def and size >= PIECE_CHARS and first > start:
            ranges.append((start, first))
            start, size = first, 0
        upto = statements[k + 1][0] if k + 1 < len(statements) else len(lines)
        size += sum(len(lines[i]) for i in range(first if k else 0, upto))
        if not is_def:
            glue.append((first, end))
            if _IMPORT.match(lines[first]):
                imports.append((first, end))
    ranges.append((start, len(lines)))
    return ranges, glue, imports


def _cut(lines: list[str]):
    """([(start, end)] 0-based line ranges of the pieces, [(start, end)] of the glue statements, [(start, end)]
    of the top-level imports), or None. Every piece was parsed alone to prove its cut."""
    starts = [i for i, line in enumerate(lines) if _CUT.match(line)]
    n = len(lines)
    ranges, glue, imports = [], [], []
    start, retries = 0, 0
    while start < n:
        end = _end(lines, starts, start)
        while True:
            try:
                tree = ast.parse("".join(lines[start:end]))
                break
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                retries += 1
                if end == n or retries > _MAX_RETRIES:
                    return None  # a syntax error, or strings and brackets across every cut tried: check it whole
                end = _end(lines, starts, end)  # that cut was inside a string or brackets: take more
        for stmt in tree.body:
            if not isinstance(stmt, _DEFS):
                span = (start + stmt.lineno - 1, start + stmt.end_lineno)
                glue.append(span)
                if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                    imports.append(span)
        del tree
        ranges.append((start, end))
        start = end
    return (ranges, glue, imports) if len(ranges) > 1 else None


def _end(lines: list[str], starts: list[int], start: int) -> int:
    """The first cut line after `start` with at least PIECE_CHARS of text before it, else the end."""
    size = 0
    for i in range(start, len(lines)):
        size += len(lines[i])
        if size >= PIECE_CHARS:
            k = bisect.bisect_right(starts, i)
            return starts[k] if k < len(starts) else len(lines)
    return len(lines)
