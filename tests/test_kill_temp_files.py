"""A `rewrite --write` killed while a temp file exists leaves no temp file in the user's tree (issue 38, point 5).

Temp files are written in a private folder of this user's (`neuron-migrate-tmp-<uid>` in the temp folder) on the
same filesystem, and renamed into place; a run killed meanwhile leaves its temp file there, and the next run that
writes removes it. The kill is placed on events, not on time: the run kills itself (SIGKILL) at the k-th call of
the step chosen at random (after the temp file is written and flushed, or just before the rename), so every
attempt lands while a temp file exists, on a slow machine as on a fast one.
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
XLA = "import torch\nimport torch_xla.core.xla_model as xm\n\n\ndef step(x):\n    xm.mark_step()\n    return x.to(xm.xla_device())\n"

KILLER = r"""
import os, runpy, signal, sys
step, k = sys.argv[1], int(sys.argv[2])
real = getattr(os, step)
calls = [0]
def hooked(*args, **kwargs):
    calls[0] += 1
    if calls[0] == k:
        os.kill(os.getpid(), signal.SIGKILL)
    return real(*args, **kwargs)
setattr(os, step, hooked)
sys.argv = ["neuron-migrate", *sys.argv[3:]]
runpy.run_module("neuron_migrate", run_name="__main__")
"""

FILES = 6


def _temps_in(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if "nm-tmp" in p.name or "nm-copyback" in p.name)


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_killed_writes_leave_no_temp_file_in_the_tree(tmp_path):
    tmpdir = tmp_path / "tmp"  # the temp folder, on the tree's filesystem (as /tmp and the home usually are)
    tmpdir.mkdir()
    env = {**os.environ, "TMPDIR": str(tmpdir), "PYTHONPATH": str(REPO)}
    private = tmpdir / f"neuron-migrate-tmp-{os.geteuid()}"
    rewrite = ["rewrite", "--write", "--quiet", "--no-color", "--no-cache", "--jobs", "1"]
    rng = random.Random(38)
    for attempt in range(5):
        tree = tmp_path / f"tree{attempt}"
        tree.mkdir()
        for i in range(FILES):
            (tree / f"m{i}.py").write_text(XLA)
        step, k = rng.choice(["fsync", "replace"]), rng.randint(1, FILES)
        p = subprocess.run([sys.executable, "-c", KILLER, step, str(k), *rewrite, str(tree)], env=env,
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == -signal.SIGKILL, (step, k, p.returncode, p.stderr[-2000:])
        assert _temps_in(tree) == [], f"killed at {step} #{k}: temp files in the tree"
        # the kill did land while a temp file existed: it is in the private folder, outside the tree
        assert len(list(private.glob("*.nm-tmp"))) == 1, (step, k)
        texts = [(tree / f"m{i}.py").read_text() for i in range(FILES)]
        assert sum(t != XLA for t in texts) == k - 1  # the files before the kill are complete, the rest original
        assert all(t == XLA or "mark_step" not in t for t in texts)
        # the next run that writes finishes the job and removes what the killed one left
        p = subprocess.run([sys.executable, "-m", "neuron_migrate", *rewrite, str(tree)], env=env,
                           capture_output=True, text=True, timeout=300)
        assert p.returncode in (0, 1), p.stderr[-2000:]
        assert all("mark_step" not in (tree / f"m{i}.py").read_text() for i in range(FILES))
        assert _temps_in(tree) == [] and list(private.glob("*.nm-tmp")) == []
