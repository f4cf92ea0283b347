"""Render an audit run in the chosen format, to stdout or --output-file. Errors always go to stderr."""
from __future__ import annotations

import sys

from neuron_migrate.files.lines import source_lines


def _source_lines(findings, frames: dict | None = None) -> dict:
    """File text for code frames (notebooks: the cells joined, as the findings count lines); `frames` holds the
    lines already known per path ({line: text}, from the results), so only the other files are read."""
    out = dict(frames or {})
    for path in {f.path for f in findings} - out.keys():
        from pathlib import Path

        from neuron_migrate.files.load import load_for_analysis

        try:
            _, text, _ = load_for_analysis(Path(path))
        except Exception:  # noqa: BLE001 - a frame is optional
            continue
        out[path] = source_lines(text)
    return out


def _summary(con, findings, n_files: int, n_errors: int, skipped: str = "", info_passes: bool = True) -> None:
    from neuron_migrate.report.text import StyledText as Text
    from neuron_migrate.rules.model import FixSafety

    n = len(findings)
    files = len({f.path for f in findings})
    if not n:
        con.print(Text(f"No findings in {n_files} file{'s' if n_files != 1 else ''}.", style="bold green"))
    else:
        sev = {"error": 0, "warning": 0, "info": 0}
        safe = unsafe = 0
        for f in findings:  # one pass: a warm run of a tree summarises thousands
            sev[f.rule.severity.value] += 1
            if f.fix is not None:
                if f.fix.safety is FixSafety.SAFE:
                    safe += 1
                else:
                    unsafe += 1
        parts = ", ".join(f"{v} {k}{'s' if v != 1 else ''}" for k, v in sev.items() if v)
        con.print(Text(f"Found {n} finding{'s' if n != 1 else ''} ({parts}) in {files} of {n_files} file{'s' if n_files != 1 else ''}.",
                       style="bold"))
        if safe:
            con.print(Text(f"[*] {safe} fixable with `neuron-migrate rewrite --write`.", style="green"))
        if unsafe:
            con.print(Text(f"{unsafe} more fixable with `neuron-migrate rewrite --write --unsafe-fixes`.", style="yellow"))
        infos = sev["info"]
        if infos and info_passes:
            con.print(Text(f"{infos} info finding{'s' if infos != 1 else ''} (advice) {'does' if infos == 1 else 'do'} not fail the run "
                           "(--fail-level info makes them).", style="dim"))
    if skipped:
        con.print(Text(f"Skipped {skipped}.", style="dim"))
    if n_errors:
        con.print(Text(f"{n_errors} file{'s' if n_errors != 1 else ''} could not be checked.", style="bold red"))


def emit(fmt: str, findings: list, errors: list, run, statistics: bool = False, output_file: str | None = None,
         quiet: bool = False, color=None, show_fixes: bool = False, fail_level: str = "warning",
         frames: dict | None = None) -> None:
    from neuron_migrate.report.text import console, labelled

    err = console(stderr=True, color=color)
    for path, msg in errors:
        # one line per file, never a traceback
        err.print(labelled("error", "red", f"{path + ': ' if path else ''}{msg}"))

    text_out: str | None = None
    if fmt == "json":
        from neuron_migrate.report.json_out import findings_json, statistics_json

        text_out = statistics_json(findings) if statistics else findings_json(findings)
    elif fmt == "json-lines":
        from neuron_migrate.report.json_out import findings_json_lines

        text_out = findings_json_lines(findings)
    elif fmt == "sarif":
        from neuron_migrate.report.sarif import sarif_json

        text_out = sarif_json(findings, run.ruleset.rules, errors=[e for e in errors])
    elif fmt == "gitlab":
        from neuron_migrate.report.gitlab import gitlab_json

        text_out = gitlab_json(findings)
    elif fmt == "junit":
        from neuron_migrate.report.junit import junit_xml

        text_out = junit_xml(findings, errors, len(run.items))
    elif fmt == "github":
        from neuron_migrate.report.github import github_lines

        text_out = github_lines(findings)
    if text_out is not None:
        _write(text_out, output_file)
        return

    # text / concise (rich)
    import io

    buf = io.StringIO() if output_file else None
    if buf is not None:
        from rich.console import Console

        con = Console(file=buf, highlight=False, soft_wrap=True, no_color=True, force_terminal=False)
    else:
        con = console(color=color)
    from neuron_migrate.report.json_out import statistics as stats
    from neuron_migrate.report.text import print_findings, print_grouped, print_statistics

    if statistics:
        print_statistics(con, stats(findings))
    elif fmt == "concise":
        print_findings(con, findings, _source_lines(findings, frames) if show_fixes else None, concise=True, show_fixes=show_fixes)
    else:
        print_grouped(con, findings, None if quiet and not show_fixes else _source_lines(findings, frames), concise=quiet,
                      show_fixes=show_fixes)
        if findings:
            con.print()
        _summary(con, findings, len(run.items), len(errors), run.skipped_note(), fail_level != "info")
    if buf is not None:
        _write(buf.getvalue(), output_file)


def _write(text: str, output_file: str | None) -> None:
    if output_file:
        from pathlib import Path

        Path(output_file).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
