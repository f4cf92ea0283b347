"""`[tool.neuron-migrate]` in pyproject.toml; command-line options override it."""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10
    import tomli as tomllib

KEYS = {"select", "ignore", "exclude", "extend-exclude", "unsafe-fixes", "device-style", "table", "respect-gitignore", "cache"}


class ConfigError(Exception):
    pass


@dataclass
class Config:
    select: list[str] = field(default_factory=lambda: ["ALL"])
    ignore: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)
    unsafe_fixes: bool = False
    device_style: str = "neuron"
    table: Optional[str] = None
    respect_gitignore: bool = True
    cache: bool = True
    source: Optional[Path] = None  # the pyproject.toml it came from


def find_pyproject(start: Path) -> Optional[Path]:
    try:
        start = start.resolve()
        folder = start if start.is_dir() else start.parent
        for d in [folder, *folder.parents]:
            p = d / "pyproject.toml"
            if p.is_file():
                return p
            if (d / ".git").exists():
                break
    except OSError:  # an unreadable folder on the way up: no configuration rather than a crash
        return None
    return None


def load_config(paths: list[str], explicit: Optional[str] = None) -> Config:
    pyproject = Path(explicit) if explicit else find_pyproject(Path(paths[0]) if paths else Path.cwd())
    cfg = Config()
    if pyproject is None:
        return cfg
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{pyproject}: {exc}") from None
    section = data.get("tool", {}).get("neuron-migrate")
    if section is None:
        return cfg
    unknown = set(section) - KEYS
    if unknown:
        raise ConfigError(f"{pyproject}: unknown [tool.neuron-migrate] keys: {', '.join(sorted(unknown))}")

    def as_list(key):
        v = section.get(key, [])
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise ConfigError(f"{pyproject}: [tool.neuron-migrate] {key} must be a list of strings")
        return v

    cfg.source = pyproject
    if "select" in section:
        cfg.select = as_list("select")
    cfg.ignore = as_list("ignore")
    cfg.exclude = as_list("exclude") + as_list("extend-exclude")
    cfg.unsafe_fixes = bool(section.get("unsafe-fixes", False))
    style = section.get("device-style", "neuron")
    if style not in ("neuron", "accelerator"):
        raise ConfigError(f"{pyproject}: device-style must be 'neuron' or 'accelerator', not {style!r}")
    cfg.device_style = style
    cfg.table = section.get("table")
    if cfg.table and not Path(cfg.table).is_absolute():
        cfg.table = str(pyproject.parent / cfg.table)
    cfg.respect_gitignore = bool(section.get("respect-gitignore", True))
    cfg.cache = bool(section.get("cache", True))
    return cfg
