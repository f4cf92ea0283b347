"""A source range, shared by name resolution, rules and every output format."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Span:
    """A source range: 1-based lines, 0-based columns counted in characters (not bytes)."""

    line: int
    col: int
    end_line: int
    end_col: int
