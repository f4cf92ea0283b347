"""The pinned real-world corpus: PyPI wheels that contain torch_xla code, extracted to `.py` trees.

    python benchmarks/corpus.py            # download (once) and extract; prints the corpus folder
    python benchmarks/corpus.py --list     # also list the packages, files and lines

The cache lives outside the repository: `$NEURON_MIGRATE_BENCH_CACHE`, default
`~/.cache/neuron-migrate-bench`. Wheels go to `<cache>/wheels`, the extracted trees to
`<cache>/corpus/<name>-<version>/`. Each wheel is checked against the sha256 recorded below, so every
machine measures and tests the same bytes. Only the standard library and `pip` are used.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional


@dataclass(frozen=True)
class Package:
    name: str  # PyPI name
    version: str
    wheel: str  # file name pip saves
    sha256: str
    pip_args: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.name}-{self.version}"


# All six pinned versions exist on PyPI (checked 2026 with `pip download`); none had to be substituted.
PACKAGES: tuple[Package, ...] = (
    Package("torch-xla", "2.9.0", "torch_xla-2.9.0-cp311-cp311-manylinux_2_28_x86_64.whl",
            "13027393e252c7583ac364b02af8f1c0f7c497095b653c14ead82fbbda8549c3",
            ("--platform", "manylinux_2_28_x86_64", "--python-version", "3.11", "--implementation", "cp")),
    Package("optimum-neuron", "0.4.5", "optimum_neuron-0.4.5-py3-none-any.whl",
            "fde44f493e73e0bd558ba03f20034db05e7777db865de343c528538afd98ffa9"),
    Package("accelerate", "1.15.0", "accelerate-1.15.0-py3-none-any.whl",
            "97eacca0b73e45cb867dbf8c5d5d4dc32219544300e0c8992c7334dc2ef33cec"),
    Package("lightning", "2.6.6", "lightning-2.6.6-py3-none-any.whl",
            "2bcbd6ee840071cd076c7dc9953d7ac1040df92f1c5fa76583aae644f037ab85"),
    Package("mosaicml", "0.32.1", "mosaicml-0.32.1-py3-none-any.whl",
            "d5dc601cec7af281d6a30ab8baccb7c495ee0044237893a991081f54617f8919"),
    Package("transformers", "5.24.0", "transformers-5.24.0-py3-none-any.whl",
            "ff5ebedf9359f94bb63772b6380eba6e7104d010cbbb2cb82c788817ea7486f6"),
)

BY_NAME = {p.name: p for p in PACKAGES}


class CorpusUnavailable(Exception):
    """A wheel could not be downloaded or does not match its pinned hash."""


def cache_dir() -> Path:
    env = os.environ.get("NEURON_MIGRATE_BENCH_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "neuron-migrate-bench"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_wheel(pkg: Package, cache: Path, timeout: float = 600, quiet: bool = True) -> Path:
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    path = wheels / pkg.wheel
    if not path.exists():
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
               f"{pkg.name}=={pkg.version}", "-d", str(wheels), *pkg.pip_args]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CorpusUnavailable(f"pip download {pkg.key} failed: {exc}") from None
        if proc.returncode != 0 or not path.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise CorpusUnavailable(f"pip download {pkg.key} failed (exit {proc.returncode}): {' | '.join(tail)}")
        if not quiet:
            print(f"downloaded {pkg.wheel}", file=sys.stderr)
    digest = _sha256(path)
    if digest != pkg.sha256:
        raise CorpusUnavailable(f"{path} has sha256 {digest}, expected {pkg.sha256} (delete it to download again)")
    return path


def extract(pkg: Package, wheel: Path, cache: Path) -> Path:
    """Extract the wheel's .py files to <cache>/corpus/<name>-<version>/ (once; a marker file says it is complete)."""
    dest = cache / "corpus" / pkg.key
    marker = dest / ".complete"
    if marker.exists():
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            name = info.filename
            if not name.endswith(".py") or name.startswith("/") or ".." in Path(name).parts:
                continue
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(zf.read(info))
    marker.write_text(pkg.sha256 + "\n")
    return dest


def ensure_corpus(names: Optional[Iterable[str]] = None, cache: Optional[Path] = None, quiet: bool = True) -> dict[str, Path]:
    """Download (once) and extract the pinned packages; returns {name: tree}. Raises CorpusUnavailable."""
    cache = cache or cache_dir()
    pkgs = [BY_NAME[n] for n in names] if names else list(PACKAGES)
    return {p.name: extract(p, fetch_wheel(p, cache, quiet=quiet), cache) for p in pkgs}


def py_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if p.is_file())


def mentions_xla(path: Path) -> bool:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return "torch_xla" in text


def count_lines(paths: Iterable[Path]) -> int:
    n = 0
    for p in paths:
        with open(p, "rb") as f:
            n += sum(1 for _ in f)
    return n


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="list packages, files, lines and files mentioning torch_xla")
    args = ap.parse_args(argv)
    try:
        trees = ensure_corpus(quiet=False)
    except CorpusUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(cache_dir() / "corpus")
    if args.list:
        for name, tree in trees.items():
            files = py_files(tree)
            print(f"  {BY_NAME[name].key:24} {len(files):5} files {count_lines(files):8} lines "
                  f"{sum(map(mentions_xla, files)):4} mention torch_xla")
    return 0


if __name__ == "__main__":
    sys.exit(main())
