"""The change map: what differs between the original tree and the migrated one, hunk by hunk, with the rule codes
of the rewrite's fixes that made each hunk (a hunk without codes was changed by hand, or planted).

Localisation maps a diverging module (its class's lines) or optimizer (its construction line) on the migrated
side to the hunks that touch those lines. No torch here.
"""
from __future__ import annotations

import difflib
import os
from pathlib import Path

SKIP_DIRS = {".git", ".hg", ".venv", "venv", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache",
             "node_modules", ".neuron-migrate-cache", ".tox"}


def python_files(root: Path) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        for f in sorted(filenames):
            if f.endswith(".py"):
                out.append(os.path.relpath(os.path.join(dirpath, f), root).replace(os.sep, "/"))
    return out


class Hunk(dict):
    """{'path', 'old': [first, last], 'new': [first, last], 'codes': [...], 'removed': [...], 'added': [...]};
    line numbers 1-based and inclusive; an empty side has last = first - 1."""

    @property
    def new_range(self) -> tuple[int, int]:
        return tuple(self["new"])  # type: ignore[return-value]

    def label(self) -> str:
        first, last = self["new"] if self["new"][1] >= self["new"][0] else self["old"]
        where = f"{self['path']}:{first}" + (f"-{last}" if last > first else "")
        by = ", ".join(self["codes"]) if self["codes"] else "no rewrite rule (changed by hand)"
        return f"{where} ({by})"


def file_hunks(path: str, old: str, new: str, fixes: list[tuple[str, int]] = ()) -> list[Hunk]:
    """Hunks between two texts of one file; `fixes`: (rule code, line) of the fixes applied to it, the line in the
    rewritten text (where the rewrite engine leaves its applied findings; a deletion sits at the line after it)."""
    a, b = old.splitlines(), new.splitlines()
    out = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        lo, hi = j1 + 1, j2  # the hunk's lines in the new text (none for a deletion: it sat before line j1 + 1)
        lines = set(range(lo, hi + 1)) if hi >= lo else {j1, j1 + 1}
        codes = sorted({code for code, line in fixes if line in lines})
        out.append(Hunk(path=path, old=[i1 + 1, i2], new=[j1 + 1, j2], codes=codes, removed=a[i1:i2], added=b[j1:j2]))
    return out


def change_map(original: Path, migrated: Path, fixes: dict[str, list[tuple[str, int]]] | None = None) -> list[Hunk]:
    fixes = fixes or {}
    hunks: list[Hunk] = []
    for rel in sorted(set(python_files(original)) | set(python_files(migrated))):
        old = _read(original / rel)
        new = _read(migrated / rel)
        if old != new:
            hunks.extend(file_hunks(rel, old, new, fixes.get(rel, [])))
    return hunks


def _read(p: Path) -> str:
    try:
        return p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ""


def hunks_in(hunks: list[Hunk], path: str, first: int, last: int) -> list[Hunk]:
    """The hunks of `path` whose migrated lines meet [first, last] (a deletion counts at the line it left)."""
    out = []
    for h in hunks:
        if h["path"] != path:
            continue
        a, b = h["new"]
        if b < a:  # lines only removed: they were between a - 1 and a
            a, b = a - 1, a
        if a <= last and b >= first:
            out.append(h)
    return out


def hunks_at_original(hunks: list[Hunk], path: str, line: int) -> list[Hunk]:
    """The hunks of `path` that removed or replaced line `line` of the original text."""
    return [h for h in hunks if h["path"] == path and h["old"][0] <= line <= h["old"][1]]


def hunk_line(h: Hunk) -> tuple[int, bool]:
    """(the line a hunk is reported at, whether it only removed lines). A hunk with lines in the migrated text is
    reported at its first one; a deletion at the first removed line of the original (the line that is gone)."""
    if h["new"][1] >= h["new"][0]:
        return h["new"][0], False
    return h["old"][0], True
