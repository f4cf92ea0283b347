"""Probe test fixtures: the emulated neuron device is built once per session (about a minute of CPU on a
cold cache; the cache under ~/.cache/neuron-migrate/emulator, or $NM_EMULATOR_CACHE, is reused after)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from neuron_migrate.probe.emulator.build import library_path

from .helpers import REPO


@pytest.fixture(scope="session")
def emulator_lib():
    if shutil.which("g++") is None and not os.environ.get("NM_EMULATOR_CXX"):
        pytest.skip("no C++ compiler: the emulated device cannot be built here")
    return library_path()


@pytest.fixture(scope="session")
def run_emulated(emulator_lib):
    """Run a Python snippet in a fresh process with the emulated device installed (`emu` is the emulator
    module, `torch` imported); the snippet sets `result`, returned as JSON. A fresh process keeps PrivateUse1
    of the test process itself untouched."""

    def run(code: str, *, table: str | None = "default", keep_going: bool = False, env: dict | None = None,
            timeout: float = 300):
        prelude = textwrap.dedent(f"""
            import json, sys, torch
            from neuron_migrate.probe import emulator as emu
            from neuron_migrate.table import load_table
            _t = {table!r}
            emu.install(load_table() if _t == "default" else (load_table(_t) if _t else None), keep_going={keep_going!r})
            result = None
        """)
        # once the result is printed the snippet ends with os._exit, skipping finalization as the probe child does:
        # autograd's device thread may still be releasing a backward pass's state, and if that takes the GIL
        # during finalization libstdc++ aborts the process (seen in about a third of runs on a loaded machine)
        script = prelude + textwrap.dedent(code) + (
            "\nprint('@@RESULT@@' + json.dumps(result))\n"
            "import os\n"
            "sys.stdout.flush(); sys.stderr.flush()\n"
            "os._exit(0)\n")
        e = dict(os.environ, **(env or {}))
        p = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=e, capture_output=True, text=True,
                           timeout=timeout)
        out = [ln for ln in p.stdout.splitlines() if ln.startswith("@@RESULT@@")]
        if p.returncode != 0 or not out:
            raise AssertionError(f"snippet failed (rc={p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-4000:]}")
        return json.loads(out[-1][len("@@RESULT@@"):])

    return run
