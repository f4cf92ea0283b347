"""The applier's lookups scale with the edits near each other, not with every pair of edits or statements: a
4,000-line file with 400 fixed places took 19 s to rewrite, a 4 MB one over 300 s. Counted, never timed."""
from __future__ import annotations

import ast
import random

import neuron_migrate.rewrite.apply as apply
from neuron_migrate.rules.model import Edit, Fix, FixSafety, Span


def fix(line: int, col: int, end_line: int, end_col: int) -> Fix:
    return Fix(FixSafety.SAFE, [Edit("replace_expr", Span(line, col, end_line, end_col), "x")])


def old_select_compatible(fixes):
    taken, chosen, deferred = [], [], []
    for f in fixes:
        spans = [apply._skey(e.span) for e in f.edits]
        if any(apply._overlaps(s, t) for s in spans for t in taken):
            deferred.append(f)
            continue
        taken.extend(spans)
        chosen.append(f)
    return chosen, deferred


def test_select_compatible_chooses_as_the_pairwise_check_did():
    rng = random.Random(3)
    for _ in range(300):
        fixes = []
        for _ in range(rng.randint(1, 25)):
            line = rng.randint(1, 12)
            end_line = line + rng.choice([0, 0, 0, 1, 3])
            col = rng.randint(0, 8)
            end_col = rng.randint(0, 8) if end_line > line else col + rng.randint(0, 5)  # zero width: an insertion
            fixes.append(fix(line, col, end_line, end_col))
        assert apply.select_compatible(fixes) == old_select_compatible(fixes)


def test_select_compatible_compares_only_edits_that_share_a_line(monkeypatch):
    calls = []
    real = apply._overlaps
    monkeypatch.setattr(apply, "_overlaps", lambda a, b: calls.append(1) or real(a, b))
    fixes = [fix(line, 4, line, 10) for line in range(1, 3001)] + [fix(1500, 6, 1500, 8)]
    chosen, deferred = apply.select_compatible(fixes)
    assert len(chosen) == 3000 and deferred == [fixes[-1]]
    assert len(calls) == 1  # the pairwise check made 4.5 million


SOURCE = '''import os

@decorator
@other(
    1,
)
def f():
    return 1
x = 1; y = 2
class C:
    pass


if x:
    y = 3
'''


def test_top_level_index_finds_what_a_scan_of_the_body_finds():
    tree = ast.parse(SOURCE)
    top = apply._top_level(tree)
    n = len(SOURCE.splitlines())
    for ra in range(1, n + 2):
        for rb in range(ra, n + 2):
            scan = [st for st in tree.body if apply._stmt_start(st) <= rb and ra <= (st.end_lineno or st.lineno)]
            assert top.over(ra, rb) == scan
        first = next((s for s in tree.body if apply._stmt_start(s) == ra or s.lineno <= ra <= (s.end_lineno or s.lineno)), None)
        assert top.at(ra) is first
    assert apply._top_level(tree) is top  # built once per tree


def test_line_ranges_meet_as_a_scan_of_them_says():
    rng = random.Random(5)
    for _ in range(300):
        ranges = [(a, a + rng.choice([0, 0, 1, 4])) for a in (rng.randint(1, 40) for _ in range(rng.randint(0, 12)))]
        index = apply._LineRanges(ranges)
        for first in range(0, 45):
            for last in range(first, min(first + 6, 46)):
                assert index.meets(first, last) == any(a <= last and first <= b for a, b in ranges)

