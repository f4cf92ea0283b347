"""Run `process_file` over many files on all cores, in chunks, shipping paths in and plain results out."""
from __future__ import annotations

import os
from typing import Callable, Iterator, Optional

_STATE: dict = {}

PARALLEL_MIN_FILES = 24  # below this, a process pool costs more than it saves


def _init(codes, settings_kw, fix, write):
    from neuron_migrate.rules.api import Settings
    from neuron_migrate.rules.registry import RuleSet

    _STATE.update(ruleset=RuleSet.from_codes(codes), settings=Settings(**settings_kw), fix=fix, write=write)


def _one(item):
    from neuron_migrate.files.process import process_file

    path, display = item
    return process_file(path, _STATE["ruleset"], _STATE["settings"], _STATE["fix"], _STATE["write"], display)


def default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover
        return os.cpu_count() or 1


def run_files(items: list[tuple[str, str]], codes, settings_kw: dict, fix: bool, write: bool,
              jobs: Optional[int] = None, progress: Optional[Callable] = None) -> Iterator:
    """Yield FileResults in input order. `codes` are the active rule codes (RuleSet.codes)."""
    jobs = jobs or default_jobs()
    if jobs <= 1 or len(items) < PARALLEL_MIN_FILES:
        _init(codes, settings_kw, fix, write)
        for item in items:
            yield _one(item)
        return
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    chunk = max(1, min(64, len(items) // (jobs * 8)))
    ctx = mp.get_context("fork") if hasattr(os, "fork") else mp.get_context("spawn")
    with ProcessPoolExecutor(jobs, mp_context=ctx, initializer=_init, initargs=(tuple(codes), settings_kw, fix, write)) as pool:
        yield from pool.map(_one, items, chunksize=chunk)
