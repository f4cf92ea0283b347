"""Line numbers of rewrite findings, moved onto the rewritten text.

A fix is found in the text of the round that applied it (the original file in round one, an intermediate text
later), and inserted imports and helpers, pruned imports and later rounds move every line below them. What
`rewrite` reports (notes, the list of fixes, findings left for the user) refers to the file the user gets: each
finding's lines are mapped from the text it was found in to the final text by a line diff. A line the rewrite
replaced maps into its replacement (the first line of it when the replacement is shorter); a deleted line maps
to the line that now stands where it was.
"""
from __future__ import annotations

from bisect import bisect_right
from dataclasses import replace
from typing import Callable

from neuron_migrate.files.span import Span


def _line_opcodes(a: list, b: list) -> list:
    """difflib's opcodes from `a` to `b`, with the common first and last lines set aside first (as GNU diff does):
    a rewrite changes a few places of a long file, and SequenceMatcher's cost grows with the lines it is given
    (the full texts took a tenth of a rewrite of the bench tree). Where a line could pair with either of two equal
    neighbours, the choice can differ from a SequenceMatcher over the whole texts; both are diffs of the texts."""
    import difflib

    n = min(len(a), len(b))
    head = 0
    while head < n and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < n - head and a[-1 - tail] == b[-1 - tail]:
        tail += 1
    ops = [("equal", 0, head, 0, head)] if head else []
    middle = difflib.SequenceMatcher(None, a[head:len(a) - tail], b[head:len(b) - tail], autojunk=False)
    for tag, i1, i2, j1, j2 in middle.get_opcodes():
        if tag == "equal" and ops and ops[-1][0] == "equal":  # the head's block continues
            ops[-1] = ("equal", ops[-1][1], i2 + head, ops[-1][3], j2 + head)
        else:
            ops.append((tag, i1 + head, i2 + head, j1 + head, j2 + head))
    if tail:
        if ops and ops[-1][0] == "equal":
            ops[-1] = ("equal", ops[-1][1], len(a), ops[-1][3], len(b))
        else:
            ops.append(("equal", len(a) - tail, len(a), len(b) - tail, len(b)))
    return ops


def line_map(old: str, new: str) -> Callable[[int], int]:
    """A function from 1-based lines of `old` to 1-based lines of `new`."""
    if old == new:
        return lambda n: n
    a, b = old.splitlines(), new.splitlines()
    ops = _line_opcodes(a, b)
    starts = [i1 for _tag, i1, _i2, _j1, _j2 in ops]
    last = max(len(b), 1)

    def to_new(line: int) -> int:
        i = line - 1
        k = bisect_right(starts, i) - 1
        if k < 0:
            return 1
        tag, i1, i2, j1, j2 = ops[k]
        if i >= i2:  # past the end of the old text
            return last
        if tag == "equal":
            return j1 + (i - i1) + 1
        if j2 == j1:  # deleted: where it was
            return min(j1 + 1, last)
        return j1 + min(i - i1, j2 - j1 - 1) + 1

    return to_new


def move_findings(findings: list, old: str, new: str, fixes: bool = False) -> list:
    """`findings` (spans in `old`) with their spans in `new`; the same objects when nothing moved. With `fixes`,
    their fixes' edits move too (for findings whose fixes may still be applied to `new`)."""
    if old == new or not findings:
        return findings
    to_new = line_map(old, new)

    def moved(s: Span) -> Span:
        line = to_new(s.line)
        end = max(line, to_new(s.end_line)) if s.end_line != s.line else line
        return s if (line, end) == (s.line, s.end_line) else Span(line, s.col, end, s.end_col)

    out = []
    for f in findings:
        span = moved(f.span)
        fix = f.fix
        if fixes and fix is not None:
            spans = [moved(e.span) for e in fix.edits]
            if any(sp is not e.span for sp, e in zip(spans, fix.edits)):
                fix = replace(fix, edits=[replace(e, span=sp) for sp, e in zip(spans, fix.edits)])
        out.append(f if span is f.span and fix is f.fix else replace(f, span=span, fix=fix))
    return out
