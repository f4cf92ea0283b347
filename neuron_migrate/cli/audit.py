"""`neuron-migrate audit PATH...`: every finding of every active rule, in the format a person or a tool reads.

It never imports or executes the user's code (nor torch): files are parsed with `ast` only.
Exit codes: 0 nothing at or above --fail-level (default warning: info-level advice never fails a run),
1 findings at or above it (0 with --exit-zero), 2 errors (unreadable or unparsable files, bad options, no file).
"""
from __future__ import annotations

from typing import List, Optional

import typer

FORMATS = ("text", "concise", "json", "json-lines", "sarif", "github", "gitlab", "junit")


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
    from neuron_migrate.cli.common import Selection, check_color, check_jobs, check_level, fail

    fmt = output_format.lower()
    if fmt not in FORMATS:
        fail(f"--output-format must be one of {', '.join(FORMATS)}, not {output_format!r}")
    if min_confidence not in ("high", "medium", "low"):
        fail(f"--min-confidence must be high, medium or low, not {min_confidence!r}")
    level = check_level("--fail-level", fail_level)  # before any work: a typo must not cost a whole run
    color_mode = check_color(color, no_color)
    check_jobs(jobs)
    if add_noqa and (watch or paths == ["-"]):
        fail("--add-noqa cannot be combined with --watch or standard input")
    if table is not None:
        from pathlib import Path

        from neuron_migrate.table import TableError, load_table

        try:
            load_table(str(Path(table).resolve()))
        except (TableError, OSError) as exc:
            fail(f"--table: {exc}")
    sel = Selection(select=select, extend_select=extend_select, ignore=ignore, exclude=exclude, extend_exclude=extend_exclude,
                    force_exclude=force_exclude, respect_gitignore=respect_gitignore, config=config, table=table,
                    max_file_size=max_file_size)

    def once() -> int:
        return _audit_once(paths, sel, fmt, output_file, statistics, show_fixes, exit_zero, level, stdin_filename,
                           add_noqa, jobs, no_cache or table is not None, quiet, color_mode, min_confidence)

    if watch:
        from neuron_migrate.cli.watch import watch_loop

        raise typer.Exit(watch_loop(paths, once, color_mode))
    raise typer.Exit(once())


def _audit_once(paths, sel, fmt, output_file, statistics, show_fixes, exit_zero, level, stdin_filename, add_noqa, jobs,
                no_cache, quiet, color_mode, min_confidence: str = "low") -> int:
    from neuron_migrate.cli.common import EXIT_CLEAN, EXIT_ERROR, EXIT_FINDINGS, RANK, iterate, prepare, report_no_files
    from neuron_migrate.report.text import console

    run = prepare(paths or [], sel, stdin_filename)
    if not run.items and not run.messages:
        return report_no_files(run, paths)
    err = console(stderr=True, color=color_mode)
    errors: list[tuple[str, str]] = [("", m) for m in run.messages]
    findings = []
    # a custom table may change without its path changing: no cache then
    if run.stdin is not None:
        from neuron_migrate.cli.stdin import stdin_results

        results = stdin_results(run, fix=False)
    else:
        results = iterate(run, fix=False, write=False, jobs=jobs, no_cache=no_cache, err=err,
                          show_progress=not quiet)
    for res in results:
        if res.error:
            errors.append((res.path, res.error))
        findings.extend(res.findings)
    table = sel.table
    if min_confidence != "low" or (table is None and any(f.confidence for f in findings)):
        from neuron_migrate.table import TableError, confidence_rank, default_table_path

        floor = confidence_rank(min_confidence)
        findings = [f for f in findings if not f.confidence or confidence_rank(f.confidence) >= floor]
        try:
            warn = default_table_path()[1] if table is None else None
        except TableError:
            warn = None
        if warn and fmt in ("text", "concise"):
            err.print(f"warning: {warn}", markup=False, highlight=False)
    findings.sort(key=lambda f: f.sort_key())

    if add_noqa:
        from neuron_migrate.cli.noqa import add_noqa_comments

        return add_noqa_comments(run, findings, errors, err)

    from neuron_migrate.report.audit import emit

    emit(fmt, findings, errors, run, statistics=statistics, output_file=output_file, quiet=quiet, color=color_mode,
         show_fixes=show_fixes, fail_level=level)
    if errors:
        return EXIT_ERROR
    failing = [f for f in findings if RANK[f.severity.value] >= RANK[level]]
    if failing and not exit_zero:
        return EXIT_FINDINGS
    return EXIT_CLEAN
