"""Line numbers of rewrite findings, moved onto the rewritten text.

A fix is found in the text of the round that applied it (the original file in round one, an intermediate text
later), and inserted imports and helpers, pruned imports and later rounds move every line below them. What
`rewrite` reports (notes, the list of fixes, findings left for the user) refers to the file the user gets: each
finding's lines are mapped from the text it was found in to the final text by a line diff. A line the rewrite
replaced maps into its replacement (the first line of it when the replacement is shorter); a deleted line maps
to the line that now stands where it was.
"""
from __future__ import annotations

import difflib
from bisect import bisect_right
from dataclasses import replace
from typing import Callable

from neuron_migrate.files.span import Span


def line_map(old: str, new: str) -> Callable[[int], int]:
    """A function from 1-based lines of `old` to 1-based lines of `new`."""
    if old == new:
        return lambda n: n
    a, b = old.splitlines(), new.splitlines()
    ops = difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
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


def move_findings(findings: list, old: str, new: str) -> list:
    """`findings` (spans in `old`) with their spans in `new`; the same objects when nothing moved."""
    if old == new or not findings:
        return findings
    to_new = line_map(old, new)
    out = []
    for f in findings:
        s = f.span
        line = to_new(s.line)
        end = max(line, to_new(s.end_line)) if s.end_line != s.line else line
        if line == s.line and end == s.end_line:
            out.append(f)
            continue
        out.append(replace(f, span=Span(line, s.col, end, s.end_col)))
    return out
