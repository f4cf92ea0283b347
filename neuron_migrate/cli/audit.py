"""`neuron-migrate audit PATH...`: every finding of every active rule, in text, concise, JSON, SARIF or GitHub form.

It never imports or executes the user's code (nor torch): files are parsed with `ast` only.
Exit codes: 0 no findings, 1 findings at or above --fail-level (0 with --exit-zero), 2 errors (unreadable or unparsable files,
bad options).
"""
from __future__ import annotations

from typing import List, Optional

import typer

FORMATS = ("text", "concise", "json", "sarif", "github")


def register(app: typer.Typer) -> None:
    app.command("audit", help="Report what in the code will not run well on TorchNeuron (nothing is run or changed).")(audit)


def audit(
    paths: List[str] = typer.Argument(None, help="Files or folders (.py, .ipynb)."),
    output_format: str = typer.Option("text", "--output-format", "-f", help="text | concise | json | sarif | github."),
    output_file: Optional[str] = typer.Option(None, "--output-file", "-o", help="Write the report to this file instead of stdout."),
    statistics: bool = typer.Option(False, "--statistics", help="Print counts per rule instead of the findings."),
    exit_zero: bool = typer.Option(False, "--exit-zero", help="Exit 0 even when there are findings (errors still exit 2)."),
    fail_level: str = typer.Option("info", "--fail-level", help="Lowest severity that makes the exit code 1: info | warning | error."),
    select: Optional[List[str]] = typer.Option(None, "--select", help="Rule codes or prefixes to run (comma separated)."),
    extend_select: Optional[List[str]] = typer.Option(None, "--extend-select", help="Rule codes or prefixes to add to the selection."),
    ignore: Optional[List[str]] = typer.Option(None, "--ignore", help="Rule codes or prefixes to skip."),
    exclude: Optional[List[str]] = typer.Option(None, "--exclude", help="Glob patterns of paths to skip."),
    table: Optional[str] = typer.Option(None, "--table", help="Compatibility table YAML to check ops against (default: the table for the installed torch family, else the newest)."),
    config: Optional[str] = typer.Option(None, "--config", help="pyproject.toml to read [tool.neuron-migrate] from."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", help="Worker processes (default: all cores)."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Do not read or write the result cache."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Text output: findings without code frames and summary only."),
    color: Optional[bool] = typer.Option(None, "--color/--no-color", help="Force or disable colour."),
    min_confidence: str = typer.Option("low", "--min-confidence",
                                       help="Drop compatibility findings whose table fact is less sure: high | medium | low."),
) -> None:
    from neuron_migrate.cli.common import EXIT_CLEAN, EXIT_ERROR, EXIT_FINDINGS, fail, open_cache, prepare
    from neuron_migrate.pipeline.parallel import run_files

    fmt = output_format.lower()
    if fmt not in FORMATS:
        fail(f"--output-format must be one of {', '.join(FORMATS)}, not {output_format!r}")
    if min_confidence not in ("high", "medium", "low"):
        fail(f"--min-confidence must be high, medium or low, not {min_confidence!r}")
    run = prepare(paths or [], select, ignore, config, None, None, exclude, extend_select)
    if table is not None:
        from pathlib import Path

        from neuron_migrate.table import TableError, load_table

        try:
            load_table(str(Path(table).resolve()))
        except (TableError, OSError) as exc:
            fail(f"--table: {exc}")
        run.settings_kw["table_path"] = str(Path(table).resolve())

    errors: list[tuple[str, str]] = [("", m) for m in run.messages]
    findings = []
    # a custom table may change without its path changing: no cache then
    cache = open_cache(run, fix=False, no_cache=no_cache or table is not None)
    for res in run_files(run.items, run.ruleset.codes, run.settings_kw, fix=False, write=False, jobs=jobs, cache=cache):
        if res.error:
            errors.append((res.path, res.error))
        findings.extend(res.findings)
    if min_confidence != "low" or (table is None and any(f.confidence for f in findings)):
        from neuron_migrate.table import TableError, confidence_rank, default_table_path

        floor = confidence_rank(min_confidence)
        findings = [f for f in findings if not f.confidence or confidence_rank(f.confidence) >= floor]
        try:
            warn = default_table_path()[1] if table is None else None
        except TableError:
            warn = None
        if warn and fmt in ("text", "concise"):
            typer.echo(f"warning: {warn}", err=True)
    findings.sort(key=lambda f: f.sort_key())
    if cache is not None:
        cache.save()  # a cache that cannot be written only costs time

    from neuron_migrate.report.audit import emit

    emit(fmt, findings, errors, run, statistics=statistics, output_file=output_file, quiet=quiet, color=color)
    if errors:
        raise typer.Exit(EXIT_ERROR)
    rank = {"info": 0, "warning": 1, "error": 2}
    if fail_level not in rank:
        fail(f"--fail-level must be info, warning or error, not {fail_level!r}")
    failing = [f for f in findings if rank[f.severity.value] >= rank[fail_level]]
    if failing and not exit_zero:
        raise typer.Exit(EXIT_FINDINGS)
    raise typer.Exit(EXIT_CLEAN)
