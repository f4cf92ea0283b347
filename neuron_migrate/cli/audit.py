"""`neuron-migrate audit PATH...`: every finding of every active rule, in the format a person or a tool reads.

It never imports or executes the user's code (nor torch): files are parsed with `ast` only.
Exit codes: 0 nothing at or above --fail-level (default warning: info-level advice never fails a run),
1 findings at or above it (0 with --exit-zero), 2 errors (unreadable or unparsable files, bad options, no file).
"""
from __future__ import annotations

from typing import List, Optional

import typer

from neuron_migrate.cli.audit_run import FORMATS


def register(app: typer.Typer) -> None:
    app.command("audit", help="Report what in the code will not run well on TorchNeuron (nothing is run or changed).")(audit)


def audit(
    paths: List[str] = typer.Argument(None, help="Files or folders (.py, .ipynb); `-` reads standard input. Default: `.`."),
    output_format: str = typer.Option("text", "--output-format", "-f", help=f"One of: {', '.join(FORMATS)}."),
    output_file: Optional[str] = typer.Option(None, "--output-file", "-o", help="Write the report to this file instead of stdout."),
    statistics: bool = typer.Option(False, "--statistics", help="Print counts per rule instead of the findings."),
    show_fixes: bool = typer.Option(False, "--show-fixes", help="Show what each fix would change under its finding."),
    exit_zero: bool = typer.Option(False, "--exit-zero", help="Exit 0 even when there are findings (errors still exit 2)."),
    fail_level: str = typer.Option("warning", "--fail-level", help="Lowest severity that makes the exit code 1: info, warning (default) or error."),
    select: Optional[List[str]] = typer.Option(None, "--select", help="Rule codes, prefixes or names to run (comma separated)."),
    extend_select: Optional[List[str]] = typer.Option(None, "--extend-select", help="Rule codes, prefixes or names to add to the selection (opt-in advice such as NM404)."),
    ignore: Optional[List[str]] = typer.Option(None, "--ignore", help="Rule codes, prefixes or names to skip."),
    exclude: Optional[List[str]] = typer.Option(None, "--exclude", help="Glob patterns of paths to skip (adds to `exclude` in the configuration)."),
    extend_exclude: Optional[List[str]] = typer.Option(None, "--extend-exclude", help="More glob patterns of paths to skip."),
    force_exclude: Optional[bool] = typer.Option(None, "--force-exclude/--no-force-exclude", help="Apply excludes to files named on the command line too (what pre-commit passes)."),
    respect_gitignore: Optional[bool] = typer.Option(None, "--respect-gitignore/--no-respect-gitignore", help="Skip files ignored by .gitignore (default: yes)."),
    stdin_filename: Optional[str] = typer.Option(None, "--stdin-filename", help="With `-`: the name the standard input is reported and configured as."),
    add_noqa: bool = typer.Option(False, "--add-noqa", help="Add a `# noqa: CODE` comment for every current finding (to adopt the audit on an existing repository)."),
    watch: bool = typer.Option(False, "--watch", "-W", help="Run again whenever a file changes (Ctrl-C stops)."),
    table: Optional[str] = typer.Option(None, "--table", help="Compatibility table YAML to check ops against (default: the table for the installed torch family, else the newest)."),
    config: Optional[str] = typer.Option(None, "--config", help="pyproject.toml to read [tool.neuron-migrate] from (default: the closest one)."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", help="Worker processes, 1 or more (default: all cores)."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Do not read or write the result cache."),
    max_file_size: Optional[int] = typer.Option(None, "--max-file-size", help="Refuse files larger than this many bytes (default 20000000)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Text output: findings without code frames and summary only."),
    color: Optional[str] = typer.Option(None, "--color", help="auto (default: colour on a terminal unless NO_COLOR is set), always or never."),
    no_color: bool = typer.Option(False, "--no-color", hidden=True, help="Same as --color never."),
    min_confidence: str = typer.Option("low", "--min-confidence",
                                       help="Drop compatibility findings whose table fact is less sure: high | medium | low."),
) -> None:
    options = dict(locals())  # exactly the parameters: run_audit takes the same names
    from neuron_migrate.cli.audit_run import run_audit

    raise typer.Exit(run_audit(**options))
