"""`neuron-migrate report PATH... -o report.html`: the migration report as one self-contained HTML page."""
from __future__ import annotations

from typing import List, Optional

import typer


def register(app: typer.Typer) -> None:
    app.command("report", help="Write an HTML migration report: per-file status, fixes and manual work by rule, launch guidance, probe, parity and verify results.")(report)


def report(
    paths: List[str] = typer.Argument(None, help="Files or folders (Python, notebooks, launchers, job files, dependency lists)."),
    output: str = typer.Option("neuron-migrate-report.html", "--output", "-o", help="The HTML file to write."),
    probe: Optional[List[str]] = typer.Option(None, "--probe", help="A `neuron-migrate probe --json` report to chart (repeatable)."),
    parity: Optional[List[str]] = typer.Option(None, "--parity", help="A `neuron-migrate probe --compare/--parity --format json` "
                                               "result to chart per module (repeatable)."),
    verify: Optional[List[str]] = typer.Option(None, "--verify", help="A `neuron-migrate verify --format json` result to show "
                                               "(verdict, where the runs part, the loss per step; repeatable)."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Also write the report's data as JSON to this file."),
    unsafe_fixes: Optional[bool] = typer.Option(None, "--unsafe-fixes/--no-unsafe-fixes", help="Count unsafe fixes as automatic."),
    select: Optional[List[str]] = typer.Option(None, "--select", help="Rule codes or prefixes to run (comma separated)."),
    ignore: Optional[List[str]] = typer.Option(None, "--ignore", help="Rule codes or prefixes to skip."),
    exclude: Optional[List[str]] = typer.Option(None, "--exclude", help="Glob patterns of paths to skip."),
    config: Optional[str] = typer.Option(None, "--config", help="pyproject.toml to read [tool.neuron-migrate] from."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", help="Worker processes (default: all cores)."),
) -> None:
    import json
    from pathlib import Path

    from neuron_migrate.cli.common import EXIT_ERROR, Selection, fail, prepare
    from neuron_migrate.pipeline.parallel import run_files
    from neuron_migrate.report.html import render_html, report_data

    probes = []
    for p in probe or []:
        try:
            probes.append((Path(p).stem, json.loads(Path(p).read_text(encoding="utf-8"))))
        except (OSError, ValueError) as exc:
            fail(f"--probe {p}: cannot read a probe JSON report ({exc})")
    parities = []
    for p in parity or []:
        try:
            doc = json.loads(Path(p).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            fail(f"--parity {p}: cannot read a parity JSON result ({exc})")
        if not isinstance(doc, dict) or "status" not in doc or ("checks" not in doc and "error" not in doc):
            fail(f"--parity {p}: not a parity result (write one with `neuron-migrate probe TARGET --compare REF --format json`)")
        parities.append((Path(p).stem, doc))
    verifies = []
    for p in verify or []:
        try:
            doc = json.loads(Path(p).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            fail(f"--verify {p}: cannot read a verify JSON result ({exc})")
        if not isinstance(doc, dict) or "verdict" not in doc:
            fail(f"--verify {p}: not a verify result (write one with `neuron-migrate verify SCRIPT --json-out FILE`)")
        verifies.append((Path(p).stem, doc))
    run = prepare(paths or [], Selection(select=select, ignore=ignore, exclude=exclude, unsafe_fixes=unsafe_fixes, config=config))
    results = [res for g in run.groups
               for res in run_files(g.items, g.ruleset.spec, g.settings_kw, fix=True, write=False, jobs=jobs)]
    data = report_data(results, run.messages, probes, parities, verifies)
    try:
        Path(output).write_text(render_html(data), encoding="utf-8")
        if json_out:
            Path(json_out).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        fail(f"cannot write the report: {exc.strerror or exc}")
    t = data["totals"]
    typer.echo(f"{output}: {t['files']} files ({t['migrated']} migrated, {t['manual']} need manual work, {t['clean']} clean, "
               f"{t['error']} errors), {t['fixes']} automatic fixes, {t['manual_items']} manual items")
    if t["error"]:
        raise typer.Exit(EXIT_ERROR)
