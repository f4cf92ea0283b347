"""The original side's environment: torch 2.9 + torch-xla 2.9 in their own virtual environment.

torch-xla 2.9 needs exactly torch 2.9 (on a newer torch it fails at import with an undefined symbol), so it
cannot share the migrated side's environment. `python -m neuron_migrate.verify.xla_env --install` creates it in
~/.cache/neuron-migrate/xla-2.9 (or $NM_VERIFY_XLA_ENV); $NM_VERIFY_XLA_PYTHON, or `verify --xla-python`, points
at an existing interpreter that has torch_xla instead. Measured: about 4.1 GB downloaded, 7.1 GB installed
(the only torch 2.9 wheel for Linux x86-64 on the registry is the CUDA build: it runs on CPU, and `import torch`
needs its NVIDIA libraries), 2-5 minutes.

No torch import here.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

TORCH_VERSION = "2.9.0"
TORCH_XLA_VERSION = "2.9.0"
PACKAGES = (f"torch=={TORCH_VERSION}", f"torch-xla=={TORCH_XLA_VERSION}")
DOWNLOAD_SIZE = "about 4.1 GB downloaded, 7.1 GB on disk"
MARKER = ".neuron-migrate-xla-env.json"  # written once the environment was checked to import torch_xla
INSTALL_COMMAND = "python -m neuron_migrate.verify.xla_env --install"


class XlaEnvMissing(Exception):
    """No interpreter with torch_xla: the message says how to install one."""


def env_dir() -> Path:
    env = os.environ.get("NM_VERIFY_XLA_ENV")
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "neuron-migrate" / "xla-2.9"


def env_python(folder: Path | None = None) -> Path:
    folder = folder or env_dir()
    return folder / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def missing_message() -> str:
    return (f"verify needs torch_xla to run the original program, and found none: install its environment "
            f"once with `{INSTALL_COMMAND}` ({DOWNLOAD_SIZE}, into {env_dir()}; NM_VERIFY_XLA_ENV chooses "
            f"another folder), or point --xla-python / NM_VERIFY_XLA_PYTHON at an interpreter that has "
            f"torch_xla")


def probe_python(python: str, timeout: float = 120.0) -> dict:
    """Import torch and torch_xla with `python`; {'torch': ..., 'torch_xla': ...} or {'error': ...}."""
    code = ("import json, torch, torch_xla; "
            "print(json.dumps({'torch': torch.__version__, 'torch_xla': torch_xla.__version__}))")
    env = dict(os.environ, PJRT_DEVICE="CPU", TF_CPP_MIN_LOG_LEVEL="3")
    try:
        proc = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": f"{python}: {exc}"}
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["exit status %d" % proc.returncode])[-1]
        return {"error": f"{python} cannot import torch_xla: {tail}"}
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": f"{python}: unexpected output {proc.stdout[-200:]!r}"}


def find_python(explicit: str | None = None) -> str:
    """The interpreter that runs the original side: --xla-python, $NM_VERIFY_XLA_PYTHON, or the cached
    environment (checked once, then trusted through its marker). Raises XlaEnvMissing."""
    chosen = explicit or os.environ.get("NM_VERIFY_XLA_PYTHON")
    if chosen:
        info = probe_python(chosen)
        if "error" in info:
            raise XlaEnvMissing(info["error"])
        return chosen
    python = env_python()
    if not python.exists():
        raise XlaEnvMissing(missing_message())
    marker = env_dir() / MARKER
    if marker.exists():
        return str(python)
    info = probe_python(str(python))
    if "error" in info:
        raise XlaEnvMissing(f"{info['error']}; reinstall with `{INSTALL_COMMAND}`")
    _write_marker(marker, info)
    return str(python)


def _write_marker(marker: Path, info: dict) -> None:
    try:
        marker.write_text(json.dumps(info) + "\n", encoding="utf-8")
    except OSError:
        pass


def install(folder: Path | None = None, quiet: bool = False) -> str:
    """Create the environment (a venv with the pinned pair) and check it imports torch_xla; returns its python.
    pip shows its own progress. Raises RuntimeError with a one-line reason."""
    folder = folder or env_dir()
    say = (lambda *a: None) if quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    python = env_python(folder)
    if python.exists():
        info = probe_python(str(python))
        if "error" not in info:
            _write_marker(folder / MARKER, info)
            say(f"the XLA environment is ready: {python} (torch {info['torch']}, torch_xla {info['torch_xla']})")
            return str(python)
    say(f"installing {' '.join(PACKAGES)} into {folder} ({DOWNLOAD_SIZE})")
    folder.parent.mkdir(parents=True, exist_ok=True)
    base = getattr(sys, "_base_executable", None) or sys.executable
    steps = [[base, "-m", "venv", "--clear", str(folder)],
             [str(python), "-m", "pip", "install", "--disable-pip-version-check", *(["-q"] if quiet else []),
              *PACKAGES]]
    for cmd in steps:
        try:
            proc = subprocess.run(cmd)
        except OSError as exc:
            raise RuntimeError(f"cannot run {cmd[0]}: {exc}") from exc
        if proc.returncode != 0:
            raise RuntimeError(f"`{' '.join(cmd)}` failed with exit status {proc.returncode}")
    info = probe_python(str(python))
    if "error" in info:
        raise RuntimeError(info["error"])
    _write_marker(folder / MARKER, info)
    say(f"the XLA environment is ready: {python} (torch {info['torch']}, torch_xla {info['torch_xla']})")
    return str(python)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m neuron_migrate.verify.xla_env",
                                     description="The torch 2.9 + torch-xla 2.9 environment verify runs original programs in.")
    parser.add_argument("--install", action="store_true", help=f"create it when absent ({DOWNLOAD_SIZE})")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    if args.install:
        try:
            install(quiet=args.quiet)
        except RuntimeError as exc:
            print(f"error: the XLA environment could not be installed: {exc}", file=sys.stderr)
            return 2
        return 0
    try:
        print(find_python())
    except XlaEnvMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
