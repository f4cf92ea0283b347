"""`neuron-migrate rewrite`: show (default), check or write the migration of torch_xla and CUDA code.

Exit codes: 0 nothing would change (or everything was written), 1 files would change (dry run, --check),
or with --fail-level, findings at or above it remain; 2 errors (bad input, options, configuration, no file).
Findings left for manual migration are shown but do not fail the run unless --fail-level asks: the
pre-commit hook fails only when it changed a file.
"""
from __future__ import annotations

from collections import Counter
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
    from neuron_migrate.cli.common import Selection, check_color, check_jobs, check_level

    level = check_level("--fail-level", fail_level, ("none", "info", "warning", "error"))
    color_mode = check_color(color, no_color)
    check_jobs(jobs)
    sel = Selection(select=select, extend_select=extend_select, ignore=ignore, exclude=exclude, extend_exclude=extend_exclude,
                    force_exclude=force_exclude, respect_gitignore=respect_gitignore, unsafe_fixes=unsafe_fixes,
                    device_style=device_style, config=config, max_file_size=max_file_size)

    def once() -> int:
        return _rewrite_once(paths, sel, write, check, diff, show_fixes, level, stdin_filename, jobs, quiet, no_cache, color_mode,
                             helpers_module)

    if watch:
        from neuron_migrate.cli.watch import watch_loop

        raise typer.Exit(watch_loop(paths, once, color_mode))
    raise typer.Exit(once())


def _rewrite_once(paths, sel, write, check, diff, show_fixes, level, stdin_filename, jobs, quiet, no_cache, color_mode,
                  helpers_module=None) -> int:
    from neuron_migrate.cli.common import EXIT_CLEAN, EXIT_ERROR, EXIT_FINDINGS, RANK, iterate, prepare, report_no_files
    from neuron_migrate.report.text import console, print_diff, unified_diff

    run = prepare(paths or [], sel, stdin_filename)
    if not run.items and not run.messages:
        if run.stdin is not None:  # an excluded stdin file comes back unchanged
            import sys

            sys.stdout.buffer.write(run.stdin[1])
            return EXIT_CLEAN
        return report_no_files(run, paths)
    out = console(color=color_mode)
    err = console(stderr=True, color=color_mode)
    shared = None
    if helpers_module:
        from pathlib import Path

        from neuron_migrate.rewrite.helpers_module import module_name

        shared = Path(helpers_module if helpers_module.endswith(".py") else helpers_module + ".py")
        for g in run.groups:
            g.settings_kw["helpers_module"] = module_name(shared)
        no_cache = True  # cached results were made without the shared module
    for m in run.messages:
        err.print(f"[red]error[/red]: {m}", highlight=False)
    do_write = write and not check and run.stdin is None
    errors = len(run.messages)
    changed = written = 0
    applied: Counter = Counter()
    remaining = []
    notes: dict = {}  # note text -> locations (one line per distinct note, however many files share it)
    fixed_list = []
    source_lines = {}
    if run.stdin is not None:
        from neuron_migrate.cli.stdin import stdin_results

        results = stdin_results(run, fix=True)
    else:
        results = iterate(run, fix=True, write=do_write, jobs=jobs, no_cache=no_cache, err=err, show_progress=not quiet and not diff)
    for res in results:
        if res.error:
            errors += 1
            err.print(f"[red]error[/red]: {res.path}: {res.error}", highlight=False)
        if run.stdin is not None and not diff and not check:
            import sys

            # standard input: the (rewritten) source goes to stdout, everything else to stderr
            sys.stdout.buffer.write(res.new_bytes if res.changed and not res.error else run.stdin[1])
            sys.stdout.flush()
            out = err
        if res.changed:
            changed += 1
            written += res.written
            if diff:
                print_diff(out, unified_diff(res.path, res.old_text, res.new_text), plain=True)
            elif not do_write and not quiet and run.stdin is None:
                print_diff(out, unified_diff(res.path, res.old_text, res.new_text), plain=False)
        for code, n in res.applied.items():
            applied[code] += n
        for f in res.applied_findings:
            if f.note:
                notes.setdefault(_note_key(f.note, res.path), []).append((f"{res.path}:{f.span.line}", f.note))
            fixed_list.append((res.path, f))
        remaining.extend(res.findings)
        if res.findings and res.new_text is not None:
            source_lines[res.path] = res.new_text.splitlines()
    if shared is not None:
        errors += _write_helpers_module(shared, fixed_list, do_write, diff, out, err)
    if not diff:
        _summary(out, err, run, changed, written, do_write, check, applied, remaining, notes, errors, quiet, source_lines,
                 fixed_list if show_fixes else None)
    if errors:
        return EXIT_ERROR
    if changed and not do_write and run.stdin is None or (check and changed):
        return EXIT_FINDINGS
    if level != "none" and any(RANK[f.severity.value] >= RANK[level] for f in remaining):
        return EXIT_FINDINGS
    return EXIT_CLEAN


MAX_NOTE_PLACES = 3


def _note_key(note: str, path: str) -> str:
    """Notes that differ only by the file they name (`Launch with: torchrun ... job7.py`) are one note."""
    import os

    for name in sorted({path, path.replace(os.sep, "/"), os.path.basename(path)}, key=len, reverse=True):
        if name and name in note:
            return note.replace(name, "<script>")
    return note


def _plural(n: int, word: str, plural: str = "") -> str:
    return f"{n} {word if n == 1 else (plural or word + 's')}"


def _summary(out, err, run, changed, written, do_write, check, applied, remaining, notes, errors, quiet, source_lines,
             fixed_list=None) -> None:
    from rich.text import Text

    from neuron_migrate.cli.common import unsafe_source
    from neuron_migrate.report.text import print_findings
    from neuron_migrate.rules.registry import get_rule

    if fixed_list:
        out.print()
        out.print(Text("Fixed:" if do_write else "Would fix:", style="bold"))
        for path, f in sorted(fixed_list, key=lambda pf: (pf[0], pf[1].span.line, pf[1].rule.code)):
            safety = f.fix.safety.value if f.fix is not None else "safe"
            out.print(f"  {path}:{f.span.line}: {f.rule.code} ({safety}) {f.message}", highlight=False)
    if remaining and not quiet:
        out.print()
        out.print(Text("Left for you (not rewritten automatically):", style="bold"))
        print_findings(out, sorted(remaining, key=lambda f: f.sort_key()), source_lines)
    out.print()
    n = len(run.items)
    verb = "rewritten" if do_write else "would be rewritten"
    out.print(Text(f"{changed} of {_plural(n, 'file')} {verb}" + (f" ({written} written)" if do_write else ""), style="bold"))
    unsafe_on = any(g.settings_kw.get("unsafe_fixes") for g in run.groups)
    if unsafe_on:
        level = f"Fixes applied: safe and unsafe (unsafe fixes on by {unsafe_source(run)})"
    else:
        level = "Fixes applied: safe only"
    out.print(Text(level + ("." if do_write else " (nothing written yet)."), style="yellow" if unsafe_on else "dim"))
    if applied:
        for code, count in sorted(applied.items()):
            r = get_rule(code)
            out.print(f"  {code} {r.name if r else ''}: {_plural(count, 'fix', 'fixes')}", highlight=False)
    if remaining:
        unsafe = sum(1 for f in remaining if f.fix is not None)
        manual = len(remaining) - unsafe
        if manual:
            out.print(Text(f"{_plural(manual, 'item')} {'needs' if manual == 1 else 'need'} manual migration", style="yellow"))
        if unsafe:
            out.print(Text(f"{unsafe} more can be fixed with --unsafe-fixes", style="yellow"))
    if run.skipped_note():
        out.print(Text(f"Skipped {run.skipped_note()}.", style="dim"))
    if notes:
        out.print(Text("Notes:", style="bold"))
        for key, places in notes.items():
            shown = ", ".join(p for p, _ in places[:MAX_NOTE_PLACES])
            more = f" and {len(places) - MAX_NOTE_PLACES} more" if len(places) > MAX_NOTE_PLACES else ""
            text = places[0][1] if len({n for _, n in places}) == 1 else key
            out.print(f"  - {shown}{more}: {text}", highlight=False)
    if changed and (notes or fixed_list or (remaining and not quiet)):
        out.print(Text("Line numbers above are those of the rewritten files" + ("." if do_write else " (the + side of the diff)."),
                       style="dim"))
    if changed and not do_write and not check and run.stdin is None:
        out.print(Text("Nothing was written: run again with --write to apply.", style="dim"))
    if errors:
        err.print(f"[red]{errors} error{'s' if errors != 1 else ''}[/red]")


def _write_helpers_module(shared, fixed_list, do_write, diff, out, err) -> int:
    """Create or extend the --helpers-module file with the helpers the rewritten files import; 1 on error."""
    from neuron_migrate.report.text import print_diff, unified_diff
    from neuron_migrate.rewrite.helpers_module import module_name, module_text

    users: dict = {}
    for path, f in fixed_list:
        for name, _src in (f.fix.helpers if f.fix else []):
            users.setdefault(name, set()).add(path)
    if not users:
        return 0
    old = shared.read_text(encoding="utf-8") if shared.exists() else ""
    try:
        new = module_text(old, sorted(users))
    except ValueError as exc:
        err.print(f"[red]error[/red]: {shared}: {exc}", highlight=False)
        return 1
    files = set().union(*users.values())
    msg = (f"{_plural(len(files), 'rewritten file')} {'imports' if len(files) == 1 else 'import'} helpers from the shared module "
           f"{module_name(shared)} ({shared}): {', '.join(sorted(users))}")
    if new != old:
        if do_write:
            shared.parent.mkdir(parents=True, exist_ok=True)
            if old:
                from neuron_migrate.files.source import read_source, write_atomic

                write_atomic(read_source(shared), new.encode("utf-8"))
            else:
                shared.write_text(new, encoding="utf-8")
        elif diff:
            print_diff(out, unified_diff(str(shared), old, new), plain=True)
    if not diff:
        out.print(msg, highlight=False)
    return 0
