"""The `--emulate-precision` kinds, parsed without importing torch (the CLI stays light)."""
from __future__ import annotations

from typing import Iterable

KINDS = ("float64", "int64", "bf16")


def parse_kinds(value: str | Iterable[str] | None) -> tuple[str, ...]:
    """'bf16,float64' -> ('float64', 'bf16') in canonical order; ValueError names an unknown kind."""
    if not value:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    items = [x.strip().lower() for x in items if x.strip()]
    bad = [x for x in items if x not in KINDS]
    if bad:
        raise ValueError(f"unknown precision {', '.join(bad)}; choose from {', '.join(KINDS)}")
    return tuple(k for k in KINDS if k in items)
