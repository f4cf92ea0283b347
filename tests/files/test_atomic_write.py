"""Writes keep what the user had: group ownership, hard links (in place, or refused), no temp files left."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from neuron_migrate.files.source import SourceError, read_source, remove_stale_temps, write_atomic

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX ownership and links")

XLA = "import torch_xla.core.xla_model as xm\n\nxm.mark_step()\nprint('done')\n"


def _rewrite(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "neuron_migrate", "rewrite", "--write", "--no-color", *map(str, paths)],
                          capture_output=True, text=True, timeout=300)


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _other_group() -> int:
    if os.geteuid() == 0:
        return 4242  # root may give a file any group
    others = [g for g in os.getgroups() if g != os.getegid()]
    if not others:
        pytest.skip("needs root or membership in a second group")
    return others[0]


def test_group_ownership_is_kept(tmp_path):
    f = tmp_path / "train.py"
    f.write_text(XLA)
    gid = _other_group()
    os.chown(f, -1, gid)
    os.chmod(f, 0o640)
    p = _rewrite(f)
    assert p.returncode in (0, 1), p.stderr
    assert "mark_step" not in f.read_text()
    st = os.stat(f)
    assert st.st_gid == gid and (st.st_mode & 0o777) == 0o640


def test_hard_linked_file_is_written_in_place(tmp_path):
    f = tmp_path / "train.py"
    f.write_text(XLA)
    other = tmp_path / "linked_copy.py"
    os.link(f, other)
    ino = os.stat(f).st_ino
    p = _rewrite(f)
    assert p.returncode in (0, 1), p.stderr
    assert "mark_step" not in f.read_text()
    assert other.read_text() == f.read_text()  # the other name sees the new code: one file, still linked
    assert os.stat(f).st_ino == ino and os.stat(f).st_nlink == 2
    assert not [n for n in os.listdir(tmp_path) if n.endswith((".nm-tmp", ".nm-copyback"))]


def test_hard_linked_file_can_be_refused(tmp_path):
    f = tmp_path / "train.py"
    f.write_text(XLA)
    os.link(f, tmp_path / "other.py")
    src = read_source(f)
    with pytest.raises(SourceError, match="2 hard links"):
        write_atomic(src, b"print('new')\n", hardlinks="refuse")
    assert f.read_text() == XLA


def test_stale_temp_files_of_our_naming_are_removed(tmp_path):
    f = tmp_path / "train.py"
    f.write_text(XLA)
    dead = tmp_path / f".train.py.{_dead_pid()}.k3j2h1.nm-tmp"
    dead.write_text("half a file")
    live = tmp_path / f".train.py.{os.getpid()}.a1b2c3.nm-tmp"  # a run that is still going (this test)
    live.write_text("in progress")
    foreign = tmp_path / ".train.py.backup.nm-tmp"  # not our naming
    foreign.write_text("someone else's")
    unchanged = tmp_path / "clean.py"
    unchanged.write_text("print('nothing to migrate')\n")
    dead2 = tmp_path / f".clean.py.{_dead_pid()}.zz9.nm-tmp"
    dead2.write_text("left by a kill")
    p = _rewrite(f, unchanged)
    assert p.returncode in (0, 1), p.stderr
    assert not dead.exists() and not dead2.exists()
    assert live.exists() and foreign.exists()
    # a clean run leaves none of its own
    assert sorted(n for n in os.listdir(tmp_path) if n.endswith(".nm-tmp")) == sorted([live.name, foreign.name])


def test_interrupted_in_place_write_is_completed(tmp_path):
    f = tmp_path / "train.py"
    new = b"print('the complete rewrite')\n"
    f.write_bytes(new[:9])  # killed half-way through the copy-back
    pending = tmp_path / f".train.py.{_dead_pid()}.q1w2.nm-copyback"
    pending.write_bytes(new)
    remove_stale_temps(f)
    assert f.read_bytes() == new and not pending.exists()


def test_owner_we_cannot_reproduce_means_in_place(tmp_path, monkeypatch):
    """When the temp file cannot get the file's owner and group (not root, someone else's file), the file
    is written in place: it keeps its inode, owner and group."""
    import neuron_migrate.files.source as source

    f = tmp_path / "train.py"
    f.write_text(XLA)
    ino = os.stat(f).st_ino
    monkeypatch.setattr(source, "_keep_owner", lambda tmp, st: False)
    write_atomic(read_source(f), b"print('new')\n")
    assert f.read_bytes() == b"print('new')\n" and os.stat(f).st_ino == ino
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="process start times come from /proc")
def test_temp_of_a_reused_pid_is_stale(tmp_path):
    """A temp file whose pid now belongs to a process that started after the file's last write (pids wrap) is
    stale; one whose pid is a process that was running when the file was written is not; and one with this
    process's own pid is stale, since a file's temps are cleaned before it is written."""
    f = tmp_path / "train.py"
    f.write_text(XLA)
    newer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        reused = tmp_path / f".train.py.{newer.pid}.r3u5e.nm-tmp"
        reused.write_text("left by a killed run whose pid was handed out again")
        past = time.time() - 120  # written before `newer` started
        os.utime(reused, (past, past))
        older = tmp_path / f".train.py.{os.getppid()}.o1d3r.nm-tmp"  # pytest's parent ran before this was written
        older.write_text("a run still going")
        own = tmp_path / f".train.py.{os.getpid()}.s3lf0.nm-tmp"
        own.write_text("left by an earlier process with this pid")
        remove_stale_temps(f)
        assert not reused.exists() and not own.exists()
        assert older.exists()
    finally:
        newer.kill()
        newer.wait()


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="process states come from /proc")
def test_temp_of_a_killed_process_not_yet_reaped_is_stale(tmp_path):
    """A run killed a moment ago may still be a zombie (its parent has not collected it): its temps are stale."""
    f = tmp_path / "train.py"
    f.write_text(XLA)
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    left = tmp_path / f".train.py.{killed.pid}.z0m8i.nm-tmp"
    try:
        left.write_text("half a file")
        past = time.time() + 5  # as if written after the process started, so only its state tells
        os.utime(left, (past, past))
        killed.kill()
        while open(f"/proc/{killed.pid}/stat", "rb").read().rsplit(b")", 1)[1].split()[0] != b"Z":
            time.sleep(0.01)  # not collected yet (no wait): a zombie until the wait below
        remove_stale_temps(f)
        assert not left.exists()
    finally:
        killed.wait()
