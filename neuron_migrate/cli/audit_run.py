"""The `audit` command itself, without the command-line parser: what `neuron-migrate audit` runs once its
options are parsed (by typer in cli/audit.py, or by cli/fast.py for the common one-line forms). Never imports
typer: a pre-commit run of a few files must not pay for it."""
from __future__ import annotations

FORMATS = ("text", "concise", "json", "json-lines", "sarif", "github", "gitlab", "junit")


def run_audit(
    paths: list[str] | None = None,
    output_format: str = "text",
    output_file: str | None = None,
    statistics: bool = False,
    show_fixes: bool = False,
    exit_zero: bool = False,
    fail_level: str = "warning",
    select: list[str] | None = None,
    extend_select: list[str] | None = None,
    ignore: list[str] | None = None,
    exclude: list[str] | None = None,
    extend_exclude: list[str] | None = None,
    force_exclude: bool | None = None,
    respect_gitignore: bool | None = None,
    stdin_filename: str | None = None,
    add_noqa: bool = False,
    watch: bool = False,
    table: str | None = None,
    config: str | None = None,
    jobs: int | None = None,
    no_cache: bool = False,
    max_file_size: int | None = None,
    quiet: bool = False,
    color: str | None = None,
    no_color: bool = False,
    min_confidence: str = "low",
) -> int:
    """Run the command; returns its exit code."""
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

        return watch_loop(paths, once, color_mode)
    return once()


def _audit_once(paths, sel, fmt, output_file, statistics, show_fixes, exit_zero, level, stdin_filename, add_noqa, jobs,
                no_cache, quiet, color_mode, min_confidence: str = "low") -> int:
    from neuron_migrate.cli.common import EXIT_CLEAN, EXIT_ERROR, EXIT_FINDINGS, RANK, iterate, prepare, report_no_files
    from neuron_migrate.report.text import console

    run = prepare(paths or [], sel, stdin_filename, cached=not no_cache)
    if not run.items and not run.messages:
        return report_no_files(run, paths)
    err = console(stderr=True, color=color_mode)
    errors: list[tuple[str, str]] = [("", m) for m in run.messages]
    findings = []
    frames: dict = {}  # path -> {line: text}: the code frames' lines the results carry
    # a custom table may change without its path changing: no cache then
    if run.stdin is not None:
        from neuron_migrate.cli.stdin import stdin_results

        results = stdin_results(run, fix=False, no_cache=no_cache)
    else:
        results = iterate(run, fix=False, write=False, jobs=jobs, no_cache=no_cache, err=err,
                          show_progress=not quiet)
    for res in results:
        if res.error:
            errors.append((res.path, res.error))
        if res.notes and not quiet:
            from neuron_migrate.report.text import labelled

            for note in res.notes:
                err.print(labelled("note", "cyan", f"{res.path}: {note}"))
        findings.extend(res.findings)
        if res.frames is not None:
            frames[res.path] = res.frames
    table = sel.table
    if min_confidence != "low" or (table is None and any(f.confidence for f in findings)):
        from neuron_migrate.table.choice import TableError, confidence_rank, default_table_path

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
         show_fixes=show_fixes, fail_level=level, frames=frames)
    if errors:
        return EXIT_ERROR
    failing = [f for f in findings if RANK[f.severity.value] >= RANK[level]]
    if failing and not exit_zero:
        return EXIT_FINDINGS
    return EXIT_CLEAN
