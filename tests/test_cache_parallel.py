"""Output is identical with and without the cache and with one or two worker processes."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "xla_project"


@pytest.fixture
def tree(tmp_path) -> Path:
    root = tmp_path / "proj"
    for i in range(8):  # enough files to use the process pool
        shutil.copytree(EXAMPLES, root / f"copy{i}")
    (root / "pyproject.toml").write_text("[tool.neuron-migrate]\nunsafe-fixes = true\n")
    return root


def nm(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "neuron_migrate", *args], capture_output=True, text=True, cwd=root)


@pytest.mark.parametrize("command", [["rewrite", "--diff"], ["rewrite", "--no-color"], ["audit", "--output-format", "json"],
                                     ["audit", "--no-color"], ["audit", "--output-format", "sarif"]])
@pytest.mark.slow
def test_same_output_with_and_without_cache_and_workers(tree, command):
    base = nm(tree, *command, "--no-cache", "-j", "1", ".")
    assert base.returncode == 1 and base.stdout
    cold = nm(tree, *command, "-j", "2", ".")
    assert (tree / ".neuron-migrate-cache").is_dir()
    warm = nm(tree, *command, "-j", "2", ".")
    assert cold.stdout == base.stdout
    assert warm.stdout == base.stdout
    assert cold.returncode == warm.returncode == base.returncode


@pytest.mark.slow
def test_corrupt_cache_is_a_warning(tree):
    first = nm(tree, "rewrite", "--diff", ".")
    for f in (tree / ".neuron-migrate-cache").glob("results-*.json"):
        f.write_text("{not json")
    again = nm(tree, "rewrite", "--diff", ".")
    assert again.returncode == first.returncode
    assert again.stdout == first.stdout
    assert "ignoring unreadable cache" in again.stderr


@pytest.mark.slow
def test_cache_follows_content_changes(tree):
    nm(tree, "rewrite", "--diff", ".")
    target = tree / "copy0" / "new_style.py"
    target.write_text("import torch\nprint(torch.ones(1))\n")
    out = nm(tree, "rewrite", "--diff", ".")
    assert "copy0/new_style.py" not in out.stdout
    assert "copy1/new_style.py" in out.stdout


@pytest.mark.slow
def test_write_with_warm_cache_writes(tree):
    nm(tree, "rewrite", "--diff", ".")  # warm the cache with would-change results
    res = nm(tree, "rewrite", "--write", ".")
    assert res.returncode in (0, 1), res.stderr
    assert "torch_xla" not in (tree / "copy3" / "single_device.py").read_text()
    assert nm(tree, "rewrite", "--check", ".").stdout.count("0 of") == 1


def _age(root: Path, seconds: int = 3600) -> None:
    """Date every file back, so that the cache trusts their stat signatures (recent files are 'racy')."""
    import os
    import time

    past = time.time_ns() - seconds * 1_000_000_000
    for f in root.rglob("*.py"):
        os.utime(f, ns=(past, past))


def test_warm_audit_report_reads_no_source(tree):
    """The code frames of a warm run come from the cache: a file whose content changed behind an unchanged stat
    signature (same size, mtime and inode) still shows the frames of the content the findings are for."""
    import os

    _age(tree)
    cold = nm(tree, "audit", "--show-fixes", ".")
    assert cold.returncode == 1 and " | " in cold.stdout
    target = tree / "copy0" / "torchrun_ddp.py"
    st = os.stat(target)
    data = target.read_bytes()
    target.write_bytes(bytes(b if b in b"\r\n" else ord("#") for b in data))  # same size, every line a comment
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    warm = nm(tree, "audit", "--show-fixes", ".")
    assert warm.stdout == cold.stdout
    assert "copy0/torchrun_ddp.py" in warm.stdout and "####" not in warm.stdout


def test_stdin_audit_shows_frames_of_the_input_not_of_a_file(tmp_path):
    (tmp_path / "train.py").write_text("x = 1\n")  # a different file of the given name must not be shown
    src = "import torch_xla.core.xla_model as xm\ndevice = xm.xla_device()\n"
    out = subprocess.run([sys.executable, "-m", "neuron_migrate", "audit", "-", "--stdin-filename", "train.py"],
                         input=src, capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 1, out.stderr
    assert "    2 | device = xm.xla_device()" in out.stdout
