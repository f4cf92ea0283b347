"""Line numbers of rewrite findings, moved onto the rewritten text.

A fix is found in the text of the round that applied it (the original file in round one, an intermediate text
later), and inserted imports and helpers, pruned imports and later rounds move every line below them. What
`rewrite` reports (notes, the list of fixes, findings left for the user) refers to the file the user gets: each
finding's lines, and the lines its message names ("line 12", "lines 12, 40"), are mapped from the text it was
found in to the final text by a line diff. A line the rewrite replaced maps into its replacement (the first line
of it when the replacement is shorter); a deleted line maps to the line that now stands where it was.
"""
from __future__ import annotations

import copy
import re
from bisect import bisect_left, bisect_right
from collections import Counter
from typing import Callable, Optional

from neuron_migrate.files.lines import source_lines
from neuron_migrate.files.span import Span
from neuron_migrate.rules.model import Edit


def _line_opcodes(a: list, b: list) -> list:
    """difflib-style opcodes from `a` to `b`. As patience diff does, the lines that occur once in each text and
    keep their order (the longest such sequence) are matched first; difflib's SequenceMatcher then diffs only the
    runs between them. Over whole texts it costs time quadratic in how often lines repeat (blank lines, `)`,
    `xm.mark_step()`): 19 s on a 4,000-line file with 400 changed places, where this takes milliseconds. Where a
    line could pair with either of two equal neighbours, the choice can differ from a SequenceMatcher over the
    whole texts; both are diffs of the texts."""
    ops: list = []

    def add(tag, i1, i2, j1, j2):
        if i1 == i2 and j1 == j2:
            return
        if tag == "equal" and ops and ops[-1][0] == "equal":  # the previous equal block continues
            ops[-1] = ("equal", ops[-1][1], i2, ops[-1][3], j2)
        else:
            ops.append((tag, i1, i2, j1, j2))

    i0 = j0 = 0
    run_i = run_j = -1  # a run of anchors that follow each other in both texts: one "equal" block
    for i, j in _unique_anchors(a, b):
        if i == i0 and j == j0 and run_i >= 0:  # nothing between this anchor and the last: the run goes on
            i0, j0 = i + 1, j + 1
            continue
        if run_i >= 0:
            add("equal", run_i, i0, run_j, j0)
        _gap_opcodes(a, b, i0, i, j0, j, add)
        run_i, run_j = i, j
        i0, j0 = i + 1, j + 1
    if run_i >= 0:
        add("equal", run_i, i0, run_j, j0)
    _gap_opcodes(a, b, i0, len(a), j0, len(b), add)
    return ops


def _unique_anchors(a: list, b: list) -> list:
    """(i, j) pairs of lines that occur once in `a` and once in `b`, the longest run increasing in both."""
    count_a, count_b = Counter(a), Counter(b)
    where_b = {line: j for j, line in enumerate(b)}  # read only for lines that occur once in b
    pairs = [(i, where_b[line]) for i, line in enumerate(a) if count_a[line] == 1 and count_b[line] == 1]
    js = [j for _i, j in pairs]
    if js == sorted(js):  # nothing moved (the usual rewrite): every pair is in the one longest run
        return pairs
    # longest increasing subsequence of the j's (patience sorting), pairs already in increasing i
    tails: list = []  # tails[k]: index into pairs of the smallest last j of an increasing run of length k + 1
    back = [-1] * len(pairs)
    tail_js: list = []
    for k, (_i, j) in enumerate(pairs):
        pos = bisect_left(tail_js, j)
        back[k] = tails[pos - 1] if pos else -1
        if pos == len(tails):
            tails.append(k)
            tail_js.append(j)
        else:
            tails[pos] = k
            tail_js[pos] = j
    run = []
    k = tails[-1] if tails else -1
    while k >= 0:
        run.append(pairs[k])
        k = back[k]
    return run[::-1]


def _gap_opcodes(a: list, b: list, i1: int, i2: int, j1: int, j2: int, add) -> None:
    """Opcodes for a[i1:i2] -> b[j1:j2]: common first and last lines set aside, SequenceMatcher on the rest."""
    if i1 == i2 or j1 == j2:
        add("delete" if i1 < i2 else "insert", i1, i2, j1, j2)
        return
    if i2 - i1 == j2 - j1 and a[i1:i2] == b[j1:j2]:  # the usual gap: lines that repeat, unchanged
        add("equal", i1, i2, j1, j2)
        return
    k, n = 0, min(i2 - i1, j2 - j1)
    while k < n and a[i1 + k] == b[j1 + k]:
        k += 1
    if k:
        add("equal", i1, i1 + k, j1, j1 + k)
        i1, j1 = i1 + k, j1 + k
    tail = 0
    while tail < min(i2 - i1, j2 - j1) and a[i2 - 1 - tail] == b[j2 - 1 - tail]:
        tail += 1
    if i2 - tail > i1 or j2 - tail > j1:
        if i2 - tail == i1 or j2 - tail == j1:
            add("delete" if i2 - tail > i1 else "insert", i1, i2 - tail, j1, j2 - tail)
        else:
            import difflib

            middle = difflib.SequenceMatcher(None, a[i1:i2 - tail], b[j1:j2 - tail], autojunk=False)
            for tag, x1, x2, y1, y2 in middle.get_opcodes():
                add(tag, x1 + i1, x2 + i1, y1 + j1, y2 + j1)
    if tail:
        add("equal", i2 - tail, i2, j2 - tail, j2)


def line_map(old: str, new: str, kept_only: bool = False) -> Callable[[int], Optional[int]]:
    """A function from 1-based lines of `old` to 1-based lines of `new`. With `kept_only`, lines the diff does not
    keep as they are (deleted or replaced) map to None."""
    if old == new:
        return lambda n: n
    a, b = source_lines(old), source_lines(new)
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
        if kept_only:
            return None
        if j2 == j1:  # deleted: where it was
            return min(j1 + 1, last)
        return j1 + min(i - i1, j2 - j1 - 1) + 1

    return to_new


# how messages name lines of their file: "line 12", "lines 12, 40", "lines 12-18" (rule messages, see cuda_device)
_LINE_REFS = re.compile(r"\b(lines? )(\d+(?:(?:, |-)\d+)*)")
_MORE_NUMBERS = re.compile(r"(?: ?,| and| or| to|-) ?\d")  # matched where a list of lines ends


def names_lines(text: str) -> bool:
    """Does the text name a line of its file (see _LINE_REFS)?"""
    return _LINE_REFS.search(text) is not None


def renumber_lines(message: str, to_new: Callable[[int], Optional[int]]) -> Optional[str]:
    """`message` with the lines it names (see _LINE_REFS) moved by `to_new`; None when one of them maps to None
    (gone) or a list of lines goes on in a form not understood here."""
    out, pos = [], 0
    for m in _LINE_REFS.finditer(message):
        if _MORE_NUMBERS.match(message, m.end()):
            return None
        moved = []
        for part in re.split(r"(, |-)", m.group(2)):
            if part in (", ", "-"):
                moved.append(part)
                continue
            line = to_new(int(part))
            if line is None:
                return None
            moved.append(str(line))
        out += [message[pos : m.start(2)], "".join(moved)]
        pos = m.end()
    return "".join(out) + message[pos:]


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
                fix = copy.copy(fix)
                fix.edits = [Edit(e.kind, sp, e.text) for sp, e in zip(spans, fix.edits)]
        # the lines a message names move too (a list it names in a form not read here is left as it is)
        message = (renumber_lines(f.message, to_new) or f.message) if names_lines(f.message) else f.message
        note = (renumber_lines(f.note, to_new) or f.note) if f.note and names_lines(f.note) else f.note
        if span is not f.span or fix is not f.fix or message != f.message or note != f.note:
            f = copy.copy(f)
            f.span, f.fix, f.message, f.note = span, fix, message, note
        out.append(f)
    return out
