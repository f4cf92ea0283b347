"""Compile the emulated device (`neuron_emulator.cpp`) once per source, torch build and ABI, into a user cache.

    $NM_EMULATOR_CACHE or $XDG_CACHE_HOME/neuron-migrate/emulator (default ~/.cache/...)/<key>/libneuron_emulator.so

The key hashes the C++ source, the torch version and git revision, the C++11 ABI flag, the machine and the
compiler's version line, so a torch upgrade or an edited source builds afresh and a stale library is never
loaded. Builds take a file lock (two probes started together build once: the second waits, then finds the
library) and land by an atomic rename of a synced file, so a library in the cache is always whole; a failed build
publishes nothing. The probe's parent builds (or finds) the library and hands its path to the child, which never
builds (tests/probe/test_fresh_install.py: concurrent first builds, a failed build, two probes on a fresh cache).
Plain g++ is enough: no ninja, cmake, pybind11 or Python headers (the library is loaded with
`torch.ops.load_library` and speaks to Python only through `neuron_emu::*` ops).
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

SOURCE = Path(__file__).with_name("neuron_emulator.cpp")
LIB_NAME = "libneuron_emulator.so"
BUILD_TIMEOUT_S = 900


class EmulatorUnavailable(RuntimeError):
    """The emulated device cannot be built or loaded here (no compiler, a failed build, no torch)."""


def cache_root() -> Path:
    env = os.environ.get("NM_EMULATOR_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "neuron-migrate" / "emulator"


def find_compiler() -> str | None:
    for cand in (os.environ.get("NM_EMULATOR_CXX"), os.environ.get("CXX"), "g++", "c++", "clang++"):
        if cand:
            path = shutil.which(cand)
            if path:
                return path
    return None


def _compiler_id(cxx: str) -> str:
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return cxx
    return (out.splitlines() or [cxx])[0]


def _torch_facts() -> dict:
    """The installed torch, found without importing it (the CLI stays light): its folder and version file."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        raise ImportError("torch is not installed")
    root = Path(spec.origin).resolve().parent
    try:
        version_text = (root / "version.py").read_text(encoding="utf-8")
    except OSError:
        version_text = ""
    m = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", version_text)
    return {"version": m.group(1) if m else "unknown", "version_file": version_text, "root": root}


def _cxx11_abi() -> int:
    if "torch" in sys.modules:
        return int(sys.modules["torch"].compiled_with_cxx11_abi())
    p = subprocess.run([sys.executable, "-c", "import torch; print(int(torch.compiled_with_cxx11_abi()))"],
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise EmulatorUnavailable(f"cannot import torch to build the emulated device: {p.stderr.strip()[-300:]}")
    return int(p.stdout.strip() or 1)


def cache_key(cxx: str) -> str:
    t = _torch_facts()
    h = hashlib.sha256()
    h.update(SOURCE.read_bytes())
    # torch/version.py carries the version, git revision and build flavour (and so the C++ ABI)
    for part in (t["version_file"], str(t["root"]), platform.machine(), sys.platform, _compiler_id(cxx)):
        h.update(b"\0" + str(part).encode())
    return f"torch{t['version'].replace('+', '_')}-{h.hexdigest()[:16]}"


def compile_command(cxx: str, out: Path) -> list[str]:
    t = _torch_facts()
    inc, lib = t["root"] / "include", t["root"] / "lib"
    return [
        cxx, "-std=c++20", "-O1", "-fPIC", "-shared", "-w",
        f"-D_GLIBCXX_USE_CXX11_ABI={_cxx11_abi()}",
        "-isystem", str(inc), "-isystem", str(inc / "torch" / "csrc" / "api" / "include"),
        str(SOURCE), "-o", str(out),
        "-L", str(lib), "-lc10", "-ltorch_cpu", "-ltorch", f"-Wl,-rpath,{lib}",
    ]


def library_path(build: bool = True, log=None) -> Path:
    """The compiled library, building it first when the cache has none (raises EmulatorUnavailable)."""
    cxx = find_compiler()
    if cxx is None:
        raise EmulatorUnavailable("no C++ compiler found (g++; set $CXX): the emulated neuron device needs one "
                                  "to build once")
    try:
        key = cache_key(cxx)
    except ImportError as exc:
        raise EmulatorUnavailable(f"torch is not importable: {exc}") from exc
    d = cache_root() / key
    lib = d / LIB_NAME
    if lib.is_file():
        return lib
    if not build:
        raise EmulatorUnavailable(f"the emulated device is not built yet ({lib})")
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EmulatorUnavailable(f"cannot create the emulator cache {d}: {exc}") from exc
    with open(d / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent build finishes first; then the library is there
        try:
            if lib.is_file():
                return lib
            tmp = d / f"{LIB_NAME}.tmp{os.getpid()}"
            cmd = compile_command(cxx, tmp)
            if log is not None:
                log(f"building the emulated neuron device (once, about a minute): {d}")
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
            except (OSError, subprocess.SubprocessError) as exc:
                raise EmulatorUnavailable(f"building the emulated device failed: {exc}") from exc
            if p.returncode != 0 or not tmp.is_file():
                (d / "build.log").write_text(" ".join(cmd) + "\n\n" + p.stdout + p.stderr, encoding="utf-8")
                first = next((ln for ln in (p.stderr or "").splitlines() if "error" in ln), p.stderr.strip()[:300])
                raise EmulatorUnavailable(f"building the emulated device failed ({first.strip()}); "
                                          f"full log: {d / 'build.log'}")
            with open(tmp, "rb+") as fh:  # on disk before it is published: a crash cannot leave a partial library
                head = fh.read(4)
                os.fsync(fh.fileno())
            if head != b"\x7fELF":
                raise EmulatorUnavailable(f"building the emulated device gave no shared library ({tmp})")
            os.replace(tmp, lib)  # atomic: a reader sees no library or the whole one
            return lib
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


if __name__ == "__main__":  # python -m neuron_migrate.probe.emulator.build: build (or find) and print the path
    print(library_path(log=lambda m: print(m, file=sys.stderr)))
