"""A file's analysis is freed by reference counting when the file is done (Analysis.release), not left to the cyclic
GC: with cycles, the GC's passes over live trees cost 8-23 % of a run (see pipeline/parallel.py:_tune_gc)."""
from __future__ import annotations

import gc
from pathlib import Path

import pytest

from neuron_migrate.pipeline.process import process_file
from neuron_migrate.rules.api import Settings
from neuron_migrate.rules.registry import RuleSet

SCRIPT = Path(__file__).parent / "integration" / "realistic" / "spawn_mp.py"


@pytest.mark.parametrize("fix", [False, True], ids=["audit", "rewrite"])
def test_processing_a_file_leaves_no_cyclic_garbage(fix):
    rules, settings = RuleSet.select(), Settings(unsafe_fixes=True)
    res = process_file(str(SCRIPT), rules, settings, fix)  # warm: first-use caches are not garbage
    assert res.findings or res.applied  # the file does exercise the rules and (for fix) the engine
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        process_file(str(SCRIPT), rules, settings, fix)
        gc.collect()
        kinds = {type(o).__name__ for o in gc.garbage}
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert not kinds & {"Site", "Scope", "Analysis", "Module", "Name", "Call"}, sorted(kinds)
