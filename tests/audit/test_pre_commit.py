"""The hooks in .pre-commit-hooks.yaml work with the real pre-commit (`pre-commit try-repo` on this checkout)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PRE_COMMIT = shutil.which("pre-commit", path=str(Path(sys.executable).parent)) or shutil.which("pre-commit")

pytestmark = pytest.mark.skipif(PRE_COMMIT is None or shutil.which("git") is None, reason="needs pre-commit and git")


def _git(repo: Path, *args):
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def _try_repo(repo: Path, home: Path, *args):
    env = {**os.environ, "PRE_COMMIT_HOME": str(home), "NO_COLOR": "1"}
    return subprocess.run([PRE_COMMIT, "try-repo", str(REPO), *args], cwd=repo, capture_output=True, text=True,
                          env=env, timeout=600)


def test_hooks_block_torch_xla_and_pass_clean_code(tmp_path):
    repo = tmp_path / "user"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@example.com")
    _git(repo, "config", "user.name", "t")
    home = tmp_path / "pre-commit-home"

    (repo / "clean.py").write_text("import torch\n\n\ndef f(x):\n    return torch.relu(x)\n")
    _git(repo, "add", "clean.py")
    ok = _try_repo(repo, home)  # both hooks, on the staged files
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "neuron-migrate audit" in ok.stdout and "neuron-migrate rewrite" in ok.stdout and "Failed" not in ok.stdout

    bad = repo / "train.py"
    bad.write_text("import torch_xla.core.xla_model as xm\n\nloss.backward()\nxm.mark_step()\n")
    _git(repo, "add", "train.py")
    blocked = _try_repo(repo, home)
    assert blocked.returncode == 1, blocked.stdout + blocked.stderr
    assert "neuron-migrate-audit" in blocked.stdout and "NM101" in blocked.stdout
    # the rewrite hook fixed the working copy, which is why the commit stops too
    assert "mark_step" not in bad.read_text()

    # launchers and dependency lists go through the same hooks; other text files are not passed to them
    _git(repo, "add", "train.py")  # the rewrite above, staged (pre-commit rolls hook fixes back over unstaged edits)
    (repo / "launch.sh").write_text("#!/bin/bash\nexport PJRT_DEVICE=NEURON\ntorchrun --nproc_per_node=2 train.py\n")
    (repo / "requirements.txt").write_text("torch==2.13.0\ntorch-xla==2.9.0\nnumpy\n")
    (repo / "NOTES.md").write_text("export PJRT_DEVICE=NEURON\n")
    _git(repo, "add", "launch.sh", "requirements.txt", "NOTES.md")
    blocked = _try_repo(repo, home)
    assert blocked.returncode == 1, blocked.stdout + blocked.stderr
    assert "NM501" in blocked.stdout and "NM601" in blocked.stdout and "NOTES.md" not in blocked.stdout
    assert "PJRT_DEVICE" not in (repo / "launch.sh").read_text() and "torch-xla" not in (repo / "requirements.txt").read_text()
    assert (repo / "NOTES.md").read_text() == "export PJRT_DEVICE=NEURON\n"
