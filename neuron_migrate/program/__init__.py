"""The whole-program model: facts about a file that no single call site shows.

Sits between name resolution (`names/`) and the rules: launch mode (entry point or library), whether a process
group exists (and is guaranteed) at a point, whether an optimizer's model is always DDP-wrapped, which values
reach the device, which string values flow into which comparisons. Rules ask it instead of guessing from one site.
"""
from __future__ import annotations

from typing import Callable, TypeVar

T = TypeVar("T")


def cached(analysis, key: str, build: Callable[[object], T]) -> T:
    """The fact set `key` of one file, built once per `names.analysis.Analysis` and shared by every rule.

    Each module of this package exposes one entry point `facts(analysis)` that calls this, so a rule pays for a
    whole-program fact only in files where some rule asks for it.
    """
    store = analysis.__dict__.setdefault("_program_facts", {})
    if key not in store:
        store[key] = build(analysis)
    return store[key]
