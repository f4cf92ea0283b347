"""The `rewrite` command itself, without the command-line parser: what `neuron-migrate rewrite` runs once its
options are parsed (by typer in cli/rewrite.py, or by cli/fast.py for the common one-line forms). Never imports
typer: a pre-commit run of a few files must not pay for it."""
from __future__ import annotations

from collections import Counter

from neuron_migrate.files.lines import source_lines as text_lines


def run_rewrite(
    paths: list[str] | None = None,
    write: bool = False,
    check: bool = False,
    diff: bool = False,
    show_fixes: bool = False,
    unsafe_fixes: bool | None = None,
    fail_level: str = "none",
    select: list[str] | None = None,
    extend_select: list[str] | None = None,
    ignore: list[str] | None = None,
    exclude: list[str] | None = None,
    extend_exclude: list[str] | None = None,
    force_exclude: bool | None = None,
    respect_gitignore: bool | None = None,
    stdin_filename: str | None = None,
    device_style: str | None = None,
    watch: bool = False,
    config: str | None = None,
    jobs: int | None = None,
    quiet: bool = False,
    no_cache: bool = False,
    max_file_size: int | None = None,
    color: str | None = None,
    no_color: bool = False,
    helpers_module: str | None = None,
) -> int:
    """Run the command; returns its exit code."""
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

        return watch_loop(paths, once, color_mode)
    return once()


def _rewrite_once(paths, sel, write, check, diff, show_fixes, level, stdin_filename, jobs, quiet, no_cache, color_mode,
                  helpers_module=None) -> int:
    from neuron_migrate.cli.common import EXIT_CLEAN, EXIT_ERROR, EXIT_FINDINGS, RANK, iterate, prepare, report_no_files
    from neuron_migrate.report.text import console, labelled, print_diff, unified_diff

    run = prepare(paths or [], sel, stdin_filename, cached=not no_cache)
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
        err.print(labelled("error", "red", m))
    do_write = write and not check and run.stdin is None
    errors = len(run.messages)
    changed = written = 0
    applied: Counter = Counter()
    remaining = []
    notes: dict = {}  # note text -> locations (one line per distinct note, however many files share it)
    fixed_list = []
    source_lines = {}
    still_xla: list = []  # (path, libraries) of files that import an XLA-based library after the rewrite
    if run.stdin is not None:
        from neuron_migrate.cli.stdin import stdin_results

        results = stdin_results(run, fix=True, no_cache=no_cache)
    else:
        results = iterate(run, fix=True, write=do_write, jobs=jobs, no_cache=no_cache, err=err, show_progress=not quiet and not diff)
    for res in results:
        if res.error:
            errors += 1
            err.print(labelled("error", "red", f"{res.path}: {res.error}"))
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
                notes.setdefault(_note_key(f.note, res.path), []).append((_place(res.path, f), f.note))
            fixed_list.append((res.path, f))
        remaining.extend(res.findings)
        if not res.error:
            libs = _still_xla(res, run)
            if libs:
                still_xla.append((res.path, libs))
        if res.findings and res.new_text is not None:
            source_lines[res.path] = text_lines(res.new_text)
    if shared is not None:
        errors += _write_helpers_module(shared, fixed_list, do_write, diff, out, err)
    errors += _write_state_module(fixed_list, do_write, diff, out, err)
    if not diff:
        _summary(out, err, run, changed, written, do_write, check, applied, remaining, notes, errors, quiet, source_lines,
                 fixed_list if show_fixes else None, still_xla)
    if errors:
        return EXIT_ERROR
    if changed and not do_write and run.stdin is None or (check and changed):
        return EXIT_FINDINGS
    if level != "none" and any(RANK[f.severity.value] >= RANK[level] for f in remaining):
        return EXIT_FINDINGS
    return EXIT_CLEAN


MAX_NOTE_PLACES = 3
MAX_XLA_FILES = 10


def _note_key(note: str, path: str) -> str:
    """Notes that differ only by the file they name (`Launch with: torchrun ... job7.py`) are one note."""
    import os

    for name in sorted({path, path.replace(os.sep, "/"), os.path.basename(path)}, key=len, reverse=True):
        if name and name in note:
            return note.replace(name, "<script>")
    return note


def _plural(n: int, word: str, plural: str = "") -> str:
    return f"{n} {word if n == 1 else (plural or word + 's')}"


def _still_xla(res, run) -> list:
    """The XLA-based libraries (torch_xla, NxD, optimum-neuron) the file imports after the rewrite
    (pipeline/process.py's `xla_libraries`, worked out where the file was rewritten and cached with its result;
    standard input's text is read here)."""
    if not res.findings:
        return []
    if run.stdin is None or (res.new_text is not None and res.changed):
        if res.xla_libs is not None:
            return res.xla_libs
        from neuron_migrate.pipeline.process import xla_libraries

        return xla_libraries(res)
    from neuron_migrate.files.xla_deps import xla_based_imports

    return xla_based_imports(run.stdin[1].decode("utf-8", "replace"), python=res.path.endswith((".py", ".pyi")))


def _summary(out, err, run, changed, written, do_write, check, applied, remaining, notes, errors, quiet, source_lines,
             fixed_list=None, still_xla=()) -> None:
    from neuron_migrate.cli.common import unsafe_source
    from neuron_migrate.report.text import PLAIN, print_findings
    from neuron_migrate.report.text import StyledText as Text
    from neuron_migrate.rules.registry import rule_for_findings

    if fixed_list:
        out.print()
        out.print(Text("Fixed:" if do_write else "Would fix:", style="bold"))
        for path, f in sorted(fixed_list, key=lambda pf: (pf[0], pf[1].cell or 0, pf[1].span.line, pf[1].rule.code)):
            safety = f.fix.safety.value if f.fix is not None else "safe"
            out.print(f"  {_place(path, f)}: {f.rule.code} ({safety}) {f.message}", **PLAIN)
    from neuron_migrate.rules.model import is_performance_note

    perf = [f for f in remaining if is_performance_note(f)]
    todo = [f for f in remaining if not is_performance_note(f)]
    if todo and not quiet:
        out.print()
        out.print(Text("Left for you (not rewritten automatically):", style="bold"))
        print_findings(out, sorted(todo, key=lambda f: f.sort_key()), source_lines)
    if perf and not quiet:
        out.print()
        out.print(Text("Performance notes (the program runs as it is; no change needed):", style="bold"))
        print_findings(out, sorted(perf, key=lambda f: f.sort_key()), source_lines)
    out.print()
    n = len(run.items)
    verb = "rewritten" if do_write else "would be rewritten"
    out.print(Text(f"{changed} of {_plural(n, 'file')} {verb}" + (f" ({written} written)" if do_write else ""), style="bold"))
    if still_xla:
        libs = sorted({lib for _p, ls in still_xla for lib in ls})
        k = len(still_xla)
        out.print(Text(f"{_plural(k, 'file')} still {'depends' if k == 1 else 'depend'} on an XLA-based library "
                       f"({', '.join(libs)}) and {'is' if k == 1 else 'are'} not migrated"
                       + (" (after the rewrite)" if changed else "") + ":", style="red"))
        for path, ls in sorted(still_xla)[:MAX_XLA_FILES]:
            out.print(f"  {path}: {', '.join(ls)}", **PLAIN)
        if k > MAX_XLA_FILES:
            out.print(f"  and {k - MAX_XLA_FILES} more", **PLAIN)
    unsafe_on = any(g.settings_kw.get("unsafe_fixes") for g in run.groups)
    if unsafe_on:
        level = f"Fixes applied: safe and unsafe (unsafe fixes on by {unsafe_source(run)})"
    else:
        level = "Fixes applied: safe only"
    out.print(Text(level + ("." if do_write else " (nothing written yet)."), style="yellow" if unsafe_on else "dim"))
    if applied:
        for code, count in sorted(applied.items()):
            r = rule_for_findings(code)  # the catalogue's entry on a warm run: no rule module is imported
            out.print(f"  {code} {r.name if r else ''}: {_plural(count, 'fix', 'fixes')}", **PLAIN)
    if remaining:
        unsafe = sum(1 for f in remaining if f.fix is not None)
        manual = len(remaining) - unsafe - len(perf)
        if manual:
            out.print(Text(f"{_plural(manual, 'item')} {'needs' if manual == 1 else 'need'} manual migration", style="yellow"))
        if unsafe:
            out.print(Text(f"{unsafe} more can be fixed with --unsafe-fixes", style="yellow"))
        if perf:
            out.print(Text(f"{_plural(len(perf), 'performance note')} (listed apart: no change needed)", style="dim"))
    if run.skipped_note():
        out.print(Text(f"Skipped {run.skipped_note()}.", style="dim"))
    if notes:
        out.print(Text("Notes:", style="bold"))
        for key, places in notes.items():
            shown = ", ".join(p for p, _ in places[:MAX_NOTE_PLACES])
            more = f" and {len(places) - MAX_NOTE_PLACES} more" if len(places) > MAX_NOTE_PLACES else ""
            text = places[0][1] if len({n for _, n in places}) == 1 else key
            out.print(f"  - {shown}{more}: {text}", **PLAIN)
    if changed and (notes or fixed_list or (remaining and not quiet)):
        out.print(Text("Line numbers above are those of the rewritten files" + ("." if do_write else " (the + side of the diff)."),
                       style="dim"))
    if changed and not do_write and not check and run.stdin is None:
        out.print(Text("Nothing was written: run again with --write to apply.", style="dim"))
    if errors:
        err.print(f"[red]{errors} error{'s' if errors != 1 else ''}[/red]")


def _place(path: str, f) -> str:
    """`file:line`, or `notebook.ipynb:cell 4:10` (a notebook's line counts within its cell)."""
    return f"{path}:cell {f.cell}:{f.span.line}" if f.cell else f"{path}:{f.span.line}"


def _write_state_module(fixed_list, do_write, diff, out, err) -> int:
    """Write the module that holds NxD's global state natively (rules/nxd_state.py) beside the rewritten files that
    import it (their common folder); 1 on error (a different file of that name is there)."""
    import os
    from pathlib import Path

    from neuron_migrate.report.text import labelled, print_diff, unified_diff
    from neuron_migrate.rules.nxd_state import HEADER_LINE, MARK, MODULE, TEXT

    users = sorted({os.path.abspath(path) for path, f in fixed_list if f.fix and MARK in f.fix.description})
    if not users:
        return 0
    folder = Path(os.path.commonpath([os.path.dirname(u) for u in users]))
    target = folder / f"{MODULE}.py"
    old = target.read_text(encoding="utf-8") if target.exists() else ""
    if old and not old.startswith(HEADER_LINE):
        err.print(labelled("error", "red", f"{target}: exists and is not neuron-migrate's {MODULE} module: the rewritten "
                                           f"files import {MODULE}; rename yours or move it"))
        return 1
    if old != TEXT:
        if do_write:
            target.write_text(TEXT, encoding="utf-8")
        elif diff:
            print_diff(out, unified_diff(str(target), old, TEXT), plain=True)
    if not diff:
        away = [u for u in users if Path(u).parent != folder]
        out.print(f"NxD's process groups and checkpoints: {_plural(len(users), 'rewritten file')} import {MODULE} "
                  f"({target}{'' if do_write else ', not written'})" +
                  (f"; {len(away)} of them sit below that folder: put it on their import path" if away else ""),
                  highlight=False)
    return 0


def _write_helpers_module(shared, fixed_list, do_write, diff, out, err) -> int:
    """Create or extend the --helpers-module file with the helpers the rewritten files import; 1 on error."""
    from neuron_migrate.report.text import labelled, print_diff, unified_diff
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
        err.print(labelled("error", "red", f"{shared}: {exc}"))
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
