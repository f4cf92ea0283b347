"""`[tool.neuron-migrate]` in pyproject.toml; command-line options override it.

Each file uses the closest pyproject.toml above it that has a `[tool.neuron-migrate]` section (as Ruff uses
the closest configuration); the search stops at the repository top (a `.git` entry). A nested configuration
replaces the outer one for the files below it; it does not inherit from it.
"""
from __future__ import annotations

import sys
from functools import lru_cache
from pathlib import Path


def _toml():
    """tomllib (tomli on 3.10), imported when a pyproject.toml names this tool: most runs read none."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on 3.10
        import tomli as tomllib
    return tomllib

KEYS = {"select", "extend-select", "ignore", "extend-ignore", "per-file-ignores", "exclude", "extend-exclude",
        "force-exclude", "unsafe-fixes", "device-style", "table", "respect-gitignore", "cache", "max-file-size"}
SECTION = "neuron-migrate"
DEFAULT_MAX_FILE_SIZE = 20_000_000  # bytes; larger files are refused with a message (`max-file-size`)


class ConfigError(Exception):
    pass


# A plain class, not a dataclass: importing dataclasses (and the inspect module it imports) costs every start-up
# about 20 ms. Nothing compares configurations (runs group files by the identity of theirs).
class Config:
    """The [tool.neuron-migrate] settings of one pyproject.toml (defaults when there is none)."""

    def __init__(self, select: list[str] | None = None, extend_select: list[str] | None = None,
                 ignore: list[str] | None = None, per_file_ignores: dict[str, list[str]] | None = None,
                 exclude: list[str] | None = None, force_exclude: bool = False, unsafe_fixes: bool = False,
                 device_style: str = "neuron", table: str | None = None, respect_gitignore: bool = True,
                 cache: bool = True, max_file_size: int = DEFAULT_MAX_FILE_SIZE, source: Path | None = None,
                 explicit: set | None = None):
        self.select = ["ALL"] if select is None else select
        self.extend_select = [] if extend_select is None else extend_select
        self.ignore = [] if ignore is None else ignore
        self.per_file_ignores = {} if per_file_ignores is None else per_file_ignores  # glob -> codes or names
        self.exclude = [] if exclude is None else exclude
        self.force_exclude = force_exclude
        self.unsafe_fixes = unsafe_fixes
        self.device_style = device_style
        self.table = table
        self.respect_gitignore = respect_gitignore
        self.cache = cache
        self.max_file_size = max_file_size
        self.source = source  # the pyproject.toml it came from
        self.explicit = set() if explicit is None else explicit  # keys the file set ("unsafe-fixes = true in ...")

    @property
    def root(self) -> Path | None:
        """The project folder: exclude and per-file-ignores patterns are relative to it."""
        return self.source.parent if self.source else None


@lru_cache(maxsize=256)
def _has_section(p: Path) -> bool:
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    if "neuron-migrate" not in text:
        return False
    tomllib = _toml()
    try:
        return SECTION in tomllib.loads(text).get("tool", {})
    except tomllib.TOMLDecodeError:
        return True  # let load_config report the error with the file name


def find_pyproject(start: Path) -> Path | None:
    """The closest pyproject.toml with a [tool.neuron-migrate] section at or above `start`."""
    try:
        start = start.resolve()
        folder = start if start.is_dir() else start.parent
        for d in [folder, *folder.parents]:
            p = d / "pyproject.toml"
            if p.is_file() and _has_section(p):
                return p
            if (d / ".git").exists():
                break
    except OSError:  # an unreadable folder on the way up: no configuration rather than a crash
        return None
    return None


def load_config(paths: list[str], explicit: str | None = None) -> Config:
    pyproject = Path(explicit) if explicit else find_pyproject(Path(paths[0]) if paths and paths[0] != "-" else Path.cwd())
    if pyproject is None:
        return Config()
    return load_file(pyproject)


def load_file(pyproject: Path) -> Config:
    cfg = Config()
    tomllib = _toml()
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{pyproject}: {exc}") from None
    section = data.get("tool", {}).get(SECTION)
    if section is None:
        return cfg
    if not isinstance(section, dict):
        raise ConfigError(f"{pyproject}: [tool.neuron-migrate] must be a table")
    unknown = set(section) - KEYS
    if unknown:
        raise ConfigError(f"{pyproject}: unknown [tool.neuron-migrate] keys: {', '.join(sorted(unknown))} "
                          f"(known: {', '.join(sorted(KEYS))})")

    def as_list(key, value=None):
        v = section.get(key, []) if value is None else value
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise ConfigError(f"{pyproject}: [tool.neuron-migrate] {key} must be a list of strings")
        return v

    def as_bool(key, default):
        v = section.get(key, default)
        if not isinstance(v, bool):
            raise ConfigError(f"{pyproject}: [tool.neuron-migrate] {key} must be true or false, not {v!r}")
        return v

    cfg.source = pyproject
    cfg.explicit = set(section)
    if "select" in section:
        cfg.select = as_list("select")
    cfg.extend_select = as_list("extend-select")
    cfg.ignore = as_list("ignore") + as_list("extend-ignore")
    pfi = section.get("per-file-ignores", {})
    if not isinstance(pfi, dict):
        raise ConfigError(f"{pyproject}: [tool.neuron-migrate] per-file-ignores must be a table of glob = [codes]")
    cfg.per_file_ignores = {k: as_list(f"per-file-ignores.{k!r}", v) for k, v in pfi.items()}
    cfg.exclude = as_list("exclude") + as_list("extend-exclude")
    cfg.force_exclude = as_bool("force-exclude", False)
    cfg.unsafe_fixes = as_bool("unsafe-fixes", False)
    style = section.get("device-style", "neuron")
    if style not in ("neuron", "accelerator"):
        raise ConfigError(f"{pyproject}: device-style must be 'neuron' or 'accelerator', not {style!r}")
    cfg.device_style = style
    cfg.table = section.get("table")
    if cfg.table and not Path(cfg.table).is_absolute():
        cfg.table = str(pyproject.parent / cfg.table)
    cfg.respect_gitignore = as_bool("respect-gitignore", True)
    cfg.cache = as_bool("cache", True)
    size = section.get("max-file-size", DEFAULT_MAX_FILE_SIZE)
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise ConfigError(f"{pyproject}: [tool.neuron-migrate] max-file-size must be a positive number of bytes, not {size!r}")
    cfg.max_file_size = size
    return cfg


def per_file_ignored(cfg: Config, path: Path) -> list[str]:
    """The codes `per-file-ignores` drops for `path` (globs relative to the project folder, or on the name)."""
    if not cfg.per_file_ignores:
        return []
    import fnmatch
    import os

    try:
        rel = Path(os.path.abspath(path)).relative_to(cfg.root).as_posix() if cfg.root else path.as_posix()
    except ValueError:
        rel = path.as_posix()
    out: list[str] = []
    for pat, codes in cfg.per_file_ignores.items():
        p = pat[2:] if pat.startswith("./") else pat
        if fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(path.name, p) or rel.startswith(p.rstrip("/") + "/"):
            out += codes
    return out
