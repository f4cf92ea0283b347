"""Locations of the rule and compatibility-table data (top-level folders in a checkout, package data when installed)."""
from __future__ import annotations

from pathlib import Path

_REPO_ROOT = Path(__file__).resolve().parents[2]


def data_dir(name: str) -> Path:
    """Return the folder holding `rules` or `compat_table` data."""
    here = Path(__file__).resolve().parent / name
    if here.is_dir():  # installed wheel: setup.py maps the top-level folder here
        return here
    return _REPO_ROOT / name
