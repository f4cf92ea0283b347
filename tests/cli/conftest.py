"""Fixtures of the command-line tests; the shared helpers live in cli_support.py (see there why)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

if str(Path(__file__).parent) not in sys.path:  # `from cli_support import ...` in any pytest import mode
    sys.path.insert(0, str(Path(__file__).parent))

from cli_support import XLA  # noqa: E402


@pytest.fixture
def xla_project(tmp_path, monkeypatch):
    (tmp_path / ".git").mkdir()  # the repository top: configuration and .gitignore lookups stop here
    (tmp_path / "train.py").write_text(XLA)
    monkeypatch.chdir(tmp_path)
    return tmp_path
