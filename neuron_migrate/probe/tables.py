"""Which compatibility table the probe reads (an adapter over neuron_migrate.table's public loader).

The shipped tables are per torch-neuronx release, each made for one torch minor version
(`Table.torch`). Without --table the probe takes the newest table made for the installed torch; when none
matches (or --table names one for another torch) it says so in the report instead of silently comparing a
torch 2.13 run against the torch 2.14 table. No torch import (the torch version comes from its metadata).
"""
from __future__ import annotations

import importlib.metadata


def installed_torch_version() -> str | None:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def _minor(version: str | None) -> tuple[int, ...] | None:
    if not version:
        return None
    parts = []
    for piece in version.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            return None
        parts.append(int(digits))
    return tuple(parts) if len(parts) == 2 else None


def choose_table(explicit: str | None, torch_version: str | None = None) -> tuple[str | None, str | None]:
    """(table path or None for "none found", warning or None)."""
    from neuron_migrate.table import TableError, available_tables, load_table

    want = _minor(torch_version or installed_torch_version())
    if explicit:
        try:
            t = load_table(explicit)
        except TableError:
            return explicit, None  # the classifier reports the bad file
        have = _minor(str(t.torch))
        if want and have and have != want:
            return explicit, (f"table {t.version} is for torch {t.torch}, but torch {torch_version or installed_torch_version()} "
                              "is installed: statuses may not match this torch's ops")
        return explicit, None
    tables = available_tables()
    if not tables:
        return None, None
    loaded = []
    for p in tables:
        try:
            loaded.append((p, load_table(p)))
        except TableError:
            continue
    matching = [(p, t) for p, t in loaded if want and _minor(str(t.torch)) == want]
    if matching:
        return str(matching[-1][0]), None
    if not loaded:
        return None, None
    p, t = loaded[-1]
    if want:
        return str(p), (f"no shipped table is made for torch {'.'.join(map(str, want))}; using table {t.version} "
                        f"(torch {t.torch}); pass --table to choose")
    return str(p), None
