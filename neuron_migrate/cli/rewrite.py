"""`neuron-migrate rewrite`: show (default), check or write the migration of torch_xla and CUDA code."""
from __future__ import annotations

from collections import Counter
from typing import List, Optional

import typer


def register(app: typer.Typer) -> None:
    app.command("rewrite", help="Rewrite torch_xla / CUDA code for TorchNeuron. Shows a diff unless --write.")(rewrite)


def rewrite(
    paths: List[str] = typer.Argument(None, help="Files or folders (.py, .ipynb). Default: nothing."),
    write: bool = typer.Option(False, "--write", "-w", help="Apply the changes to the files."),
    check: bool = typer.Option(False, "--check", help="Write nothing; exit 1 if any file would change."),
    diff: bool = typer.Option(False, "--diff", help="Print plain unified diffs (no colour, no findings)."),
    unsafe_fixes: Optional[bool] = typer.Option(None, "--unsafe-fixes/--no-unsafe-fixes", help="Also apply fixes that may change behaviour."),
    select: Optional[List[str]] = typer.Option(None, "--select", help="Rule codes or prefixes to run (comma separated)."),
    ignore: Optional[List[str]] = typer.Option(None, "--ignore", help="Rule codes or prefixes to skip."),
    exclude: Optional[List[str]] = typer.Option(None, "--exclude", help="Glob patterns of paths to skip."),
    device_style: Optional[str] = typer.Option(None, "--device-style", help="'neuron' (torch.device(\"neuron\")) or 'accelerator' (torch.accelerator)."),
    config: Optional[str] = typer.Option(None, "--config", help="pyproject.toml to read [tool.neuron-migrate] from."),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", help="Worker processes (default: all cores)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Only the summary and errors."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Do not read or write the result cache."),
    color: Optional[bool] = typer.Option(None, "--color/--no-color", help="Force or disable colour."),
) -> None:
    from neuron_migrate.cli.common import EXIT_CLEAN, EXIT_ERROR, EXIT_FINDINGS, open_cache, prepare
    from neuron_migrate.pipeline.parallel import run_files
    from neuron_migrate.report.text import console, print_diff, unified_diff

    run = prepare(paths or [], select, ignore, config, unsafe_fixes, device_style, exclude)
    out = console(color=color)
    err = console(stderr=True, color=color)
    for m in run.messages:
        err.print(f"[red]error[/red]: {m}")
    do_write = write and not check
    errors = len(run.messages)
    changed = written = 0
    applied: Counter = Counter()
    remaining = []
    notes: list[str] = []
    source_lines = {}
    cache = open_cache(run, fix=True, no_cache=no_cache)
    if cache is not None and cache.warning:
        err.print(f"[yellow]warning[/yellow]: {cache.warning}")
    for res in run_files(run.items, run.ruleset.codes, run.settings_kw, fix=True, write=do_write, jobs=jobs, cache=cache):
        if res.error:
            errors += 1
            err.print(f"[red]error[/red]: {res.path}: {res.error}")
        if res.changed:
            changed += 1
            written += res.written
            if diff:
                print_diff(out, unified_diff(res.path, res.old_text, res.new_text), plain=True)
            elif not do_write and not quiet:
                print_diff(out, unified_diff(res.path, res.old_text, res.new_text), plain=False)
        for code, n in res.applied.items():
            applied[code] += n
        for f in res.applied_findings:
            note = f"{res.path}:{f.span.line}: {f.note}" if f.note else ""
            if note and note not in notes:
                notes.append(note)
        remaining.extend(res.findings)
        if res.findings and res.new_text is not None:
            source_lines[res.path] = res.new_text.splitlines()
    if cache is not None:
        problem = cache.save()
        if problem:
            err.print(f"[yellow]warning[/yellow]: {problem}")
    if not diff:
        _summary(out, err, run, changed, written, do_write, check, applied, remaining, notes, errors, quiet, source_lines)
    if errors:
        raise typer.Exit(EXIT_ERROR)
    if (changed and not do_write) or remaining:
        raise typer.Exit(EXIT_FINDINGS)
    raise typer.Exit(EXIT_CLEAN)


def _summary(out, err, run, changed, written, do_write, check, applied, remaining, notes, errors, quiet, source_lines) -> None:
    from rich.text import Text

    from neuron_migrate.report.text import print_findings
    from neuron_migrate.rules.registry import get_rule

    if remaining and not quiet:
        out.print()
        out.print(Text("Left for you (not rewritten automatically):", style="bold"))
        print_findings(out, sorted(remaining, key=lambda f: f.sort_key()), source_lines)
    out.print()
    n = len(run.items)
    verb = "rewritten" if do_write else "would be rewritten"
    out.print(Text(f"{changed} of {n} file{'s' if n != 1 else ''} {verb}" + (f" ({written} written)" if do_write else ""), style="bold"))
    if applied:
        for code, count in sorted(applied.items()):
            r = get_rule(code)
            out.print(f"  {code} {r.name if r else ''}: {count} fix{'es' if count != 1 else ''}")
    if remaining:
        unsafe = sum(1 for f in remaining if f.fix is not None)
        manual = len(remaining) - unsafe
        out.print(Text(f"{manual} item{'s' if manual != 1 else ''} need manual migration", style="yellow"))
        if unsafe:
            out.print(Text(f"{unsafe} more can be fixed with --unsafe-fixes", style="yellow"))
    if notes:
        out.print(Text("Notes:", style="bold"))
        for note in notes:
            out.print(f"  - {note}")
    if changed and not do_write and not check:
        out.print(Text("Nothing was written: run again with --write to apply.", style="dim"))
    if errors:
        err.print(f"[red]{errors} error{'s' if errors != 1 else ''}[/red]")
