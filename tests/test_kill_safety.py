"""`rewrite --write` killed with SIGKILL at random moments never leaves a half-written file.

Every file afterwards is byte-identical either to its original or to its complete rewrite.
"""
from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "xla_project"


def _make_tree(root: Path, copies: int) -> None:
    sources = sorted(EXAMPLES.glob("*.py"))
    for i in range(copies):
        d = root / f"pkg{i:03d}"
        d.mkdir(parents=True)
        for s in sources:
            # pad each file so that writes are not trivially small
            text = s.read_text() + "".join(f"\nPAD_{j} = {j}" for j in range(400)) + "\n"
            (d / s.name).write_text(text)


def _snapshot(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*.py"))}


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_sigkill_leaves_every_file_original_or_complete(tmp_path):
    original = tmp_path / "original"
    _make_tree(original, 60)
    before = _snapshot(original)
    expected_tree = tmp_path / "expected"
    shutil.copytree(original, expected_tree)
    cmd = [sys.executable, "-m", "neuron_migrate", "rewrite", "--write", "--quiet", "--no-color"]
    subprocess.run([*cmd, str(expected_tree)], capture_output=True, check=False)
    after = _snapshot(expected_tree)
    assert sum(before[k] != after[k] for k in before) > 100, "the rewrite should change most files"

    rng = random.Random(1234)
    killed_mid_run = 0
    for attempt in range(5):
        work = tmp_path / f"run{attempt}"
        shutil.copytree(original, work)
        proc = subprocess.Popen([*cmd, str(work)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        time.sleep(rng.uniform(0.4, 2.5))
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        got = _snapshot(work)
        assert set(got) == set(before)
        done = 0
        for name, data in got.items():
            assert data in (before[name], after[name]), f"{name} is neither original nor rewritten after SIGKILL"
            done += data == after[name] != before[name]
        if 0 < done < sum(before[k] != after[k] for k in before):
            killed_mid_run += 1
    assert killed_mid_run >= 1, "no kill landed in the middle of a run; the test proved nothing"
