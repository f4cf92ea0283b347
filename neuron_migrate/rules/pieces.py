"""Audit a very large file in pieces, so that memory stays bounded by a piece instead of growing with the file.

`ast.parse` keeps about 50 bytes of tree per byte of source (a 15 MB generated file: 975 MB at its peak), so
a file over `PIECES_MIN_CHARS` is cut at top-level statements into pieces of about `PIECE_CHARS` and each
piece is parsed and checked on its own. Each piece is checked as the whole file with every line outside it
blanked, except the module's glue (imports, assignments, `if`/`try` blocks: every top-level statement that
is not a def or a class), which every piece keeps: names imported or bound anywhere at module level resolve
in every piece, and line and column numbers are the file's own. A finding is reported by the piece that holds
its line. What a piece cannot see is another piece's defs and classes (a function defined in one piece and
called in another is unknown where it is called).

A cut is made only before a line at column 0 that starts a def, a class or a decorator, and only where the
text before it parses on its own: the tokenizer is then outside every string and bracket there, so the rest
is a sequence of whole statements too. When no such cut exists (one huge literal, a syntax error) the file
is checked whole, as before.
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
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
PIECES_NOTE = ("{mb:.1f} MB, checked in {n} pieces of top-level statements to bound memory: facts that span the "
               "file (an import's other uses, APIs that migrate together, a function's callers) are judged per piece")
_MAX_RETRIES = 4  # cuts that did not parse, before the file is checked whole


def check_in_pieces(text: str, path: str, ruleset, settings=None):
    """The CheckResult of checking `text` piece by piece (its `analysis` is None), or None when the text
    cannot be cut (the caller checks it whole)."""
    if "ignore-file" in text:  # a file-wide suppression comment must be seen by every piece
        return None
    if _LONE_CR.search(text):  # old Mac line ends: a blanked "\n" after a kept "\r" line would join the two
        return None
    lines = source_lines(text, keepends=True)
    cut = _cut(lines)
    if cut is None:
        return None
    ranges, glue, imports = cut
    keep = glue if sum(len(lines[i]) for a, b in glue for i in range(a, b)) <= GLUE_MAX_CHARS else imports
    if sum(len(lines[i]) for a, b in keep for i in range(a, b)) > GLUE_MAX_CHARS:
        return None
    from neuron_migrate.rules.runner import CheckResult, check_text

    findings, suppressed = [], 0
    for start, end in ranges:
        piece = ["\n"] * len(lines)
        for a, b in [*keep, (start, end)]:
            piece[a:b] = lines[a:b]
        r = check_text("".join(piece), path, ruleset, settings, report_lines=range(start + 1, end + 1))
        findings += r.findings
        suppressed += r.suppressed
        if r.analysis is not None:
            r.analysis.release()  # before the next piece is parsed: memory holds one piece at a time
    from neuron_migrate.rules.model import Finding

    findings.sort(key=Finding.sort_key)
    return CheckResult(findings, None, None, suppressed, pieces=len(ranges))


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
