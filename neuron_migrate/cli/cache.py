"""`neuron-migrate cache clean [PATH...]`: delete the result cache (`.neuron-migrate-cache/`) of a project."""
from __future__ import annotations

from typing import List

import typer

cache_app = typer.Typer(help="Manage the result cache (.neuron-migrate-cache/).", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(cache_app, name="cache")


@cache_app.command("clean", help="Delete the result cache of the project holding each PATH (default: `.`).")
def clean(paths: List[str] = typer.Argument(None, help="Project folders or files (default: `.`).")) -> None:
    import os
    import shutil
    from pathlib import Path

    from neuron_migrate.files.config import find_pyproject
    from neuron_migrate.pipeline.cache import FOLDER, cache_folder

    folders = []
    for raw in paths or ["."]:
        p = Path(raw)
        cfg = find_pyproject(p)
        base = p if p.is_dir() else p.parent
        cands = [cache_folder(cfg), base / FOLDER]
        for c in cands:
            if c not in folders:
                folders.append(c)
    removed = 0
    for folder in folders:
        if not folder.is_dir():
            continue
        # only a folder that is ours: it holds our .gitignore marker or only results-*.json files
        marker = folder / ".gitignore"
        ours = marker.is_file() and "neuron-migrate" in marker.read_text(errors="replace")
        if not ours and any(not (n.startswith("results-") or n.startswith(".results-")) for n in os.listdir(folder)):
            typer.echo(f"neuron-migrate: not removing {folder}: it does not look like a neuron-migrate cache", err=True)
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed += 1
        typer.echo(f"Removed {folder}")
    if not removed:
        typer.echo("No cache to remove.")
