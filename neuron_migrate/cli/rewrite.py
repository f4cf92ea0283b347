"""`neuron-migrate rewrite`: show (default), check or write the migration of torch_xla and CUDA code.

Exit codes: 0 nothing would change (or everything was written), 1 files would change (dry run, --check),
or with --fail-level, findings at or above it remain; 2 errors (bad input, options, configuration, no file).
Findings left for manual migration are shown but do not fail the run unless --fail-level asks: the
pre-commit hook fails only when it changed a file.
"""
from __future__ import annotations

from typing import List, Optional

import typer


def register(app: typer.Typer) -> None:
    app.command("rewrite", help="Rewrite torch_xla / CUDA code for TorchNeuron. Shows a diff unless --write.")(rewrite)


def rewrite(
    paths: List[str] = typer.Argument(None, help="Files or folders (.py, .ipynb); `-` reads standard input and prints the result. Default: `.`."),
    write: bool = typer.Option(False, "--write", "-w", help="Apply the changes to the files."),
    check: bool = typer.Option(False, "--check", help="Write nothing; exit 1 if any file would change."),
    diff: bool = typer.Option(False, "--diff", help="Print plain unified diffs (no colour, no findings)."),
    show_fixes: bool = typer.Option(False, "--show-fixes", help="List every fix applied (file:line, rule, message)."),
    unsafe_fixes: Optional[bool] = typer.Option(None, "--unsafe-fixes/--no-unsafe-fixes", help="Also apply fixes that may change behaviour."),
    fail_level: str = typer.Option("none", "--fail-level", help="Also exit 1 when findings at or above this level remain: none (default), info, warning, error."),
    select: Optional[List[str]] = typer.Option(None, "--select", help="Rule codes, prefixes or names to run (comma separated)."),
    extend_select: Optional[List[str]] = typer.Option(None, "--extend-select", help="Rule codes, prefixes or names to add to the selection."),
    ignore: Optional[List[str]] = typer.Option(None, "--ignore", help="Rule codes, prefixes or names to skip."),
    exclude: Optional[List[str]] = typer.Option(None, "--exclude", help="Glob patterns of paths to skip (adds to `exclude` in the configuration)."),
    extend_exclude: Optional[List[str]] = typer.Option(None, "--extend-exclude", help="More glob patterns of paths to skip."),
    force_exclude: Optional[bool] = typer.Option(None, "--force-exclude/--no-force-exclude", help="Apply excludes to files named on the command line too (what pre-commit passes)."),
    respect_gitignore: Optional[bool] = typer.Option(None, "--respect-gitignore/--no-respect-gitignore", help="Skip files ignored by .gitignore (default: yes)."),
    stdin_filename: Optional[str] = typer.Option(None, "--stdin-filename", help="With `-`: the name the standard input is reported and configured as."),
    device_style: Optional[str] = typer.Option(None, "--device-style", help="'neuron' (torch.device(\"neuron\")) or 'accelerator' (torch.accelerator)."),
    watch: bool = typer.Option(False, "--watch", "-W", help="Run again whenever a file changes (Ctrl-C stops)."),
    config: Optional[str] = typer.Option(None, "--config", help="pyproject.toml to read [tool.neuron-migrate] from (default: the closest one)."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", help="Worker processes, 1 or more (default: all cores)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Only the summary and errors."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Do not read or write the result cache."),
    max_file_size: Optional[int] = typer.Option(None, "--max-file-size", help="Refuse files larger than this many bytes (default 20000000)."),
    color: Optional[str] = typer.Option(None, "--color", help="auto (default: colour on a terminal unless NO_COLOR is set), always or never."),
    no_color: bool = typer.Option(False, "--no-color", hidden=True, help="Same as --color never."),
    helpers_module: Optional[str] = typer.Option(None, "--helpers-module", help="Put inserted helpers into this one module (a .py path, created or extended) and import them from it, instead of pasting them into each file."),
) -> None:
    options = dict(locals())  # exactly the parameters: run_rewrite takes the same names
    from neuron_migrate.cli.rewrite_run import run_rewrite

    raise typer.Exit(run_rewrite(**options))
