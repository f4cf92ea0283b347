"""What `rewrite` and `audit` share: configuration, rule selection, file discovery, error printing."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import typer

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


def split_codes(values: Optional[list[str]]) -> list[str]:
    out = []
    for v in values or []:
        out += [x.strip() for x in v.split(",") if x.strip()]
    return out


@dataclass
class Run:
    config: object
    ruleset: object
    settings_kw: dict
    items: list  # (path, display path)
    messages: list


def prepare(paths: list[str], select, ignore, config_path, unsafe_fixes, device_style, exclude, extend_select=None) -> Run:
    from neuron_migrate.files.config import ConfigError, load_config
    from neuron_migrate.files.discover import discover
    from neuron_migrate.rules.registry import RuleError, RuleSet

    try:
        cfg = load_config(paths, config_path)
    except ConfigError as exc:
        fail(str(exc))
    sel = split_codes(select) or cfg.select
    sel += split_codes(extend_select)
    ign = cfg.ignore + split_codes(ignore)
    try:
        ruleset = RuleSet.select(sel, ign)
    except RuleError as exc:
        fail(str(exc))
    if unsafe_fixes is not None:
        cfg.unsafe_fixes = unsafe_fixes
    if device_style:
        if device_style not in ("neuron", "accelerator"):
            fail(f"--device-style must be 'neuron' or 'accelerator', not {device_style!r}")
        cfg.device_style = device_style
    files, messages = discover(paths, cfg.exclude + split_codes(exclude), cfg.respect_gitignore)
    cwd = Path.cwd()
    items = []
    for f in files:
        try:
            display = os.path.relpath(f, cwd)
            if display.startswith(".." + os.sep + ".."):
                display = str(f)
        except ValueError:
            display = str(f)
        items.append((str(f), display))
    settings_kw = {"device_style": cfg.device_style, "unsafe_fixes": cfg.unsafe_fixes}
    return Run(cfg, ruleset, settings_kw, items, messages)


def open_cache(run: Run, fix: bool, no_cache: bool):
    """The result cache for this run, or None when disabled (--no-cache or `cache = false`)."""
    if no_cache or not run.config.cache:
        return None
    from neuron_migrate.pipeline.cache import ResultCache, cache_folder, cache_key

    return ResultCache(cache_folder(run.config.source), cache_key(run.ruleset.codes, run.settings_kw, fix))


def fail(message: str) -> None:
    sys.stderr.write(f"neuron-migrate: error: {message}\n")
    raise typer.Exit(EXIT_ERROR)
