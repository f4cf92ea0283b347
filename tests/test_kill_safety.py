"""`rewrite --write` killed with SIGKILL mid-run never leaves a half-written file, and the next run cleans up.

Every file afterwards is byte-identical either to its original or to its complete rewrite; a rerun finishes
the job and leaves no temp file. The kill is synchronised on events, not on time: the test watches the
tree and kills the run once it has replaced a chosen number of files (some kills land before any write),
then checks what it sees, so a slow or a fast machine tests the same thing.
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
CMD = [sys.executable, "-m", "neuron_migrate", "rewrite", "--write", "--quiet", "--no-color"]
LIMIT_S = 600  # generous: only a hung run reaches it
ATTEMPTS = 12  # at most: the loop stops once three kills landed mid-run (after the first four attempts)


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


def _inodes(root: Path, names) -> dict:
    out = {}
    for n in names:
        try:
            st = os.stat(root / n)
            out[n] = (st.st_ino, st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            out[n] = None
    return out


def _temps(root: Path) -> list[str]:
    return [p.name for p in root.rglob("*") if p.name.endswith((".nm-tmp", ".nm-copyback"))]


def _kill_after_writes(work: Path, names, writes: int) -> int:
    """Start a rewrite of `work` and SIGKILL its process group once `writes` files were replaced (0: as soon
    as it runs). Returns how many files had been replaced when it was stopped. The run's results cache is its own
    (the working directory is `work`'s parent), not the one other tests share."""
    start = _inodes(work, names)
    proc = subprocess.Popen([*CMD, str(work)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            cwd=work.parent)
    deadline = time.monotonic() + LIMIT_S
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            now = _inodes(work, names)
            if sum(now[n] != start[n] for n in names) >= writes:
                break
            time.sleep(0.002)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGSTOP)  # freeze it: what we count below is what it had done
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=LIMIT_S)
    now = _inodes(work, names)
    return sum(now[n] != start[n] for n in names)


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_sigkill_leaves_every_file_original_or_complete(tmp_path):
    original = tmp_path / "original"
    _make_tree(original, 12)
    before = _snapshot(original)
    expected_tree = tmp_path / "expected"
    shutil.copytree(original, expected_tree)
    subprocess.run([*CMD, str(expected_tree)], capture_output=True, check=False, timeout=LIMIT_S, cwd=tmp_path)
    after = _snapshot(expected_tree)
    changing = [k for k in before if before[k] != after[k]]
    assert len(changing) >= 40, "the rewrite should change most files"
    assert not _temps(expected_tree), "a clean run left temp files"

    rng = random.Random(1234)
    killed_mid_run = 0
    seen = []  # (writes asked, files replaced when stopped) of each attempt
    # on a loaded machine (CI runs two test processes besides the rewrite's own workers) the watcher can be scheduled
    # too late and see a run that already finished: such an attempt still checks the files, and more attempts are
    # made until three kills have landed mid-run
    for attempt in range(ATTEMPTS):
        if attempt >= 4 and killed_mid_run >= 3:
            break
        work = tmp_path / f"run{attempt}"
        shutil.copytree(original, work)
        # first attempt: before any write; then after a random share of the writes
        writes = 0 if attempt == 0 else rng.randint(1, len(changing) - 10)
        done_at_kill = _kill_after_writes(work, sorted(before), writes)
        seen.append((writes, done_at_kill))
        got = _snapshot(work)
        assert set(got) == set(before)
        done = 0
        for name, data in got.items():
            assert data in (before[name], after[name]), f"{name} is neither original nor rewritten after SIGKILL"
            done += data == after[name] != before[name]
        if 0 < done_at_kill < len(changing):
            killed_mid_run += 1
        # the next run finishes the job and removes whatever the killed one left
        p = subprocess.run([*CMD, str(work)], capture_output=True, text=True, timeout=LIMIT_S, cwd=tmp_path)
        assert "Traceback" not in p.stderr
        assert _snapshot(work) == after
        assert not _temps(work), f"temp files left after the rerun: {_temps(work)}"
        shutil.rmtree(work)
    assert killed_mid_run >= 3, f"the kills should land between the first and the last write: {seen} of {len(changing)}"
