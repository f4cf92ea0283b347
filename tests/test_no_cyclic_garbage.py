"""A file's analysis is freed by reference counting when the file is done (Analysis.release), not left to the cyclic
GC: with cycles, the GC's passes over live trees cost 8-23 % of a run (see pipeline/parallel.py:tune_gc)."""
from __future__ import annotations

import gc
from pathlib import Path

import pytest

from neuron_migrate.pipeline.process import process_file
from neuron_migrate.rules.api import Settings
from neuron_migrate.rules.registry import RuleSet

SCRIPT = Path(__file__).parent / "integration" / "realistic" / "spawn_mp.py"
ANALYSIS_KINDS = {"Site", "Scope", "Analysis", "Module", "Name", "Call"}  # what a file's analysis is made of


def _garbage_kinds(work):
    """(work()'s result, the type names of what it left to the cyclic GC)."""
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        out = work()
        gc.collect()
        return out, {type(o).__name__ for o in gc.garbage}
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


@pytest.mark.parametrize("fix", [False, True], ids=["audit", "rewrite"])
def test_processing_a_file_leaves_no_cyclic_garbage(fix):
    rules, settings = RuleSet.select(), Settings(unsafe_fixes=True)
    res = process_file(str(SCRIPT), rules, settings, fix)  # warm: first-use caches are not garbage
    assert res.findings or res.applied  # the file does exercise the rules and (for fix) the engine
    _res, kinds = _garbage_kinds(lambda: process_file(str(SCRIPT), rules, settings, fix))
    assert not kinds & ANALYSIS_KINDS, sorted(kinds)


def test_the_editor_server_check_leaves_no_cyclic_garbage_and_its_findings_still_fix():
    """The language server checks a buffer on every change: each check's tree must go at once, and the findings
    it returns (diagnostics, then quick fixes) must not need the released analysis."""
    from neuron_migrate.server.core import Checker

    checker, path = Checker(), str(SCRIPT)
    text = SCRIPT.read_text(encoding="utf-8")
    checker.check(text, path)  # warm
    (findings, error), kinds = _garbage_kinds(lambda: checker.check(text, path))
    assert error is None and findings
    assert not kinds & ANALYSIS_KINDS, sorted(kinds)
    fixable = [f for f in findings if f.fix is not None]
    assert fixable
    fixed = checker.fix_one(text, path, fixable[0])
    assert fixed is not None and fixed != text
    assert [f.span for f in findings] == [f.span for f in checker.check(text, path)[0]]
