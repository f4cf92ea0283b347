"""Shared helpers for the probe tests: run the CLI in a subprocess (the probe itself spawns its child)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "examples" / "probe_models"
FAKE_NEURONX = Path(__file__).resolve().parent / "fake_torch_neuronx"


def marker_lines(path: Path) -> dict[str, int]:
    """`# PROBE: tag` markers -> line numbers, so the tests do not hard-code lines."""
    out = {}
    for i, line in enumerate(path.read_text().splitlines(), 1):
        m = re.search(r"# PROBE: ([\w-]+)", line)
        if m:
            out[m.group(1)] = i
    return out


def run_cli(args: list[str], *, env_extra: dict | None = None, timeout: float = 240, cwd: Path = REPO):
    env = dict(os.environ)
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    if env_extra:
        env.update(env_extra)
    return subprocess.run([sys.executable, "-m", "neuron_migrate", "probe", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def run_json(args: list[str], **kw) -> tuple[int, dict, subprocess.CompletedProcess]:
    p = run_cli([args[0], "--format", "json", *args[1:]], **kw)  # before any `--`
    try:
        rep = json.loads(p.stdout)
    except ValueError as exc:
        raise AssertionError(f"no JSON on stdout (rc={p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}") from exc
    return p.returncode, rep, p


def rel(name: str) -> str:
    return os.path.relpath(MODELS / name, REPO)
