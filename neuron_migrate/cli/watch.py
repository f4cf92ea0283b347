"""`--watch`: run, then poll the watched paths and run again when a Python file or a pyproject.toml changes.

Polling (every 0.3 s, by size and modification time) needs no extra dependency and works on every file system.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from neuron_migrate.files.discover import ALWAYS_SKIP, SUFFIXES

POLL_S = 0.3


def snapshot(paths: list[str]) -> dict:
    state = {}
    for raw in paths or ["."]:
        root = Path(raw)
        if root.is_file():
            _stat(root, state)
            continue
        for folder, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if d not in ALWAYS_SKIP]
            for name in files:
                if name.endswith(SUFFIXES) or name in ("pyproject.toml", ".gitignore"):
                    _stat(Path(folder) / name, state)
    return state


def _stat(p: Path, state: dict) -> None:
    try:
        st = p.stat()
    except OSError:
        return
    state[str(p)] = (st.st_size, st.st_mtime_ns)


def watch_loop(paths: list[str], once, color_mode: str) -> int:
    try:
        while True:
            before = snapshot(paths)
            try:
                code = once()
            except SystemExit as exc:  # a bad configuration (cli.common.fail): say so and keep watching
                code = exc.code if isinstance(exc.code, int) else 2
            sys.stderr.write(f"[watch] exit code {code}; watching for changes (Ctrl-C stops)\n")
            sys.stderr.flush()
            sys.stdout.flush()
            while True:
                time.sleep(POLL_S)
                now = snapshot(paths)
                if now != before:
                    sys.stderr.write("[watch] change detected, running again\n")
                    break
    except KeyboardInterrupt:
        return 0
