"""The hooks with the real pre-commit, through real `git commit`s.

- The hooks of `.pre-commit-hooks.yaml` (same ids, entries, file types) as a `repo: local` configuration
  running this checkout's code: an info-only file, an excluded vendored file and a clean file commit; torch_xla
  code is blocked and rewritten.
- The README's snippet as written (`rev: v<version>`), against a temporary clone of this checkout tagged the
  way releases are tagged: pre-commit builds its own environment from the tag and the hooks run from it.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]

try:
    import pre_commit  # noqa: F401
    HAVE_PRE_COMMIT = True
except ImportError:
    HAVE_PRE_COMMIT = False

pytestmark = pytest.mark.skipif(not HAVE_PRE_COMMIT or shutil.which("git") is None, reason="needs pre-commit and git")

XLA = "import torch_xla.core.xla_model as xm\n\n\ndef step(loss):\n    loss.backward()\n    xm.mark_step()\n"
INFO_ONLY = "import torch\n\ntorch.backends.cudnn.benchmark = True\n"  # NM217: info-level advice only
CLEAN = "import torch\n\n\ndef f(x):\n    return torch.relu(x)\n"


def _git(repo: Path, *args, check=True, extra_env=None):
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com", "NO_COLOR": "1", **(extra_env or {})}
    return subprocess.run(["git", *args], cwd=repo, check=check, capture_output=True, text=True, env=env, timeout=900)


def _pre_commit(repo: Path, home: Path, *args):
    env = {**os.environ, "PRE_COMMIT_HOME": str(home), "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "pre_commit", *args], cwd=repo, capture_output=True, text=True,
                          env=env, timeout=900)


def _user_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "user"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "pyproject.toml").write_text('[tool.neuron-migrate]\nexclude = ["vendor/"]\n')
    return repo


def _commit(repo: Path, home: Path, *files: str):
    """`git commit` with the installed hook; the hook runs this checkout's code (PYTHONPATH)."""
    _git(repo, "add", *files)
    pythonpath = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return _git(repo, "commit", "-q", "-m", "change", check=False,
                extra_env={"PRE_COMMIT_HOME": str(home), "PYTHONPATH": pythonpath})


def _local_config() -> str:
    """.pre-commit-hooks.yaml as a `repo: local` config that runs this checkout with this interpreter."""
    hooks = yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())
    local = []
    for h in hooks:
        entry = h["entry"].replace("neuron-migrate", f"{sys.executable} -m neuron_migrate", 1)
        hook = {"id": h["id"], "name": h["name"], "entry": entry, "language": "system"}
        hook.update({k: h[k] for k in ("files", "exclude", "types", "types_or", "require_serial") if k in h})
        local.append(hook)
    return yaml.safe_dump({"repos": [{"repo": "local", "hooks": local}]})


@pytest.mark.slow
def test_hooks_pass_advice_vendored_and_clean_commits_and_block_torch_xla(tmp_path):
    repo = _user_repo(tmp_path)
    home = tmp_path / "pre-commit-home"
    (repo / ".pre-commit-config.yaml").write_text(_local_config())
    subprocess.run([sys.executable, "-m", "pre_commit", "install"], cwd=repo, check=True, capture_output=True,
                   env={**os.environ, "PRE_COMMIT_HOME": str(home)}, timeout=300)
    # a clean commit
    (repo / "clean.py").write_text(CLEAN)
    ok = _commit(repo, home, "clean.py", "pyproject.toml", ".pre-commit-config.yaml")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "neuron-migrate audit" in ok.stdout + ok.stderr

    # info-level advice only: shown, not blocking, nothing rewritten
    (repo / "advice.py").write_text(INFO_ONLY)
    info = _commit(repo, home, "advice.py")
    assert info.returncode == 0, info.stdout + info.stderr
    assert (repo / "advice.py").read_text() == INFO_ONLY

    # a vendored torch_xla file, excluded in pyproject.toml: neither audited nor rewritten
    (repo / "vendor").mkdir()
    (repo / "vendor" / "lib.py").write_text(XLA)
    vendored = _commit(repo, home, "vendor/lib.py")
    assert vendored.returncode == 0, vendored.stdout + vendored.stderr
    assert (repo / "vendor" / "lib.py").read_text() == XLA

    # torch_xla code: both hooks fail the commit; the rewrite hook fixed the working copy
    (repo / "train.py").write_text(XLA)
    blocked = _commit(repo, home, "train.py")
    out = blocked.stdout + blocked.stderr
    assert blocked.returncode == 1, out
    assert "NM101" in out and "files were modified by this hook" in out
    assert "mark_step" not in (repo / "train.py").read_text()
    assert "train.py" not in _git(repo, "log", "--name-only", "--format=").stdout
    # the fixed file commits
    again = _commit(repo, home, "train.py")
    assert again.returncode == 0, again.stdout + again.stderr

    # launchers and dependency lists go through the same hooks; other text files are not passed to them
    (repo / "launch.sh").write_text("#!/bin/bash\nexport PJRT_DEVICE=NEURON\ntorchrun --nproc_per_node=2 train.py\n")
    (repo / "requirements.txt").write_text("torch==2.13.0\ntorch-xla==2.9.0\nnumpy\n")
    (repo / "NOTES.md").write_text("export PJRT_DEVICE=NEURON\n")
    blocked = _commit(repo, home, "launch.sh", "requirements.txt", "NOTES.md")
    out = blocked.stdout + blocked.stderr
    assert blocked.returncode == 1 and "NM501" in out and "NM601" in out and "NOTES.md" not in out, out
    assert "PJRT_DEVICE" not in (repo / "launch.sh").read_text() and "torch-xla" not in (repo / "requirements.txt").read_text()
    assert (repo / "NOTES.md").read_text() == "export PJRT_DEVICE=NEURON\n"


@pytest.mark.slow  # pre-commit builds its own environment from PyPI (a minute or two)
def test_readme_snippet_works_from_a_tagged_clone(tmp_path):
    """What a user copies from the README, with the repository URL pointing at a clone tagged as releases are."""
    import tomllib

    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    readme = (REPO / "README.md").read_text()
    snippet = re.search(r"```yaml\n(repos:\n  - repo: https://github.com/neuron-migrate/neuron-migrate\n.*?)```", readme, re.S).group(1)
    assert f"rev: v{version}" in snippet
    clone = tmp_path / "neuron-migrate"
    _git(tmp_path, "clone", "-q", str(REPO), str(clone))
    # the clone gets the working tree's current hooks and packaging (the test also runs before a commit)
    for rel in (".pre-commit-hooks.yaml", "pyproject.toml", "setup.py"):
        shutil.copy(REPO / rel, clone / rel)
    for folder in ("neuron_migrate", "rules", "compat_table"):
        shutil.rmtree(clone / folder)
        shutil.copytree(REPO / folder, clone / folder, ignore=shutil.ignore_patterns("__pycache__"))
    _git(clone, "add", "-A")
    _git(clone, "commit", "-q", "--allow-empty", "-m", "working tree")
    _git(clone, "tag", "-f", "-a", f"v{version}", "-m", f"neuron-migrate {version}")

    repo = _user_repo(tmp_path)
    (repo / ".pre-commit-config.yaml").write_text(snippet.replace("https://github.com/neuron-migrate/neuron-migrate", str(clone)))
    home = tmp_path / "pre-commit-home"
    (repo / "clean.py").write_text(CLEAN)
    (repo / "vendor").mkdir()
    (repo / "vendor" / "lib.py").write_text(XLA)
    _git(repo, "add", "-A")
    ok = _pre_commit(repo, home, "run", "--all-files")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "neuron-migrate audit" in ok.stdout and "Passed" in ok.stdout
    assert (repo / "vendor" / "lib.py").read_text() == XLA
    (repo / "train.py").write_text(XLA)
    _git(repo, "add", "train.py")
    bad = _pre_commit(repo, home, "run", "--files", "train.py")
    assert bad.returncode == 1 and "NM101" in bad.stdout, bad.stdout + bad.stderr
