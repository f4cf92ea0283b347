"""`audit --add-noqa`: write a `# noqa: CODES` comment for every current finding (to adopt the audit on a large
repository and fix the backlog later), merging with an existing `# noqa: ...` on the line.

The comment goes on the finding's line, or on the first line of its statement when the finding's line ends
inside a multi-line string. Notebooks are left alone (reported). Files are rewritten atomically with their
encoding, BOM and line endings kept; NM9xx findings (about suppressions themselves) get no comment.
"""
from __future__ import annotations

from pathlib import Path

from neuron_migrate.rules.noqa import add_to_text


def add_noqa_comments(run, findings, errors, err) -> int:
    from neuron_migrate.cli.common import EXIT_CLEAN, EXIT_ERROR
    from neuron_migrate.files.source import SourceError, read_source, write_atomic
    from neuron_migrate.report.text import labelled

    for path, msg in errors:
        err.print(labelled("error", "red", f"{path + ': ' if path else ''}{msg}"))
    by_path: dict = {}
    display_to_path = {display: path for path, display in run.items}
    for f in findings:
        if f.rule.code.startswith("NM9"):
            continue
        by_path.setdefault(f.path, {}).setdefault(f.span.line, set()).add(f.rule.code)
    total = files = 0
    failed = bool(errors)
    for display, codes_by_line in sorted(by_path.items()):
        real = Path(display_to_path.get(display, display))
        if real.suffix == ".ipynb":
            err.print(labelled("warning", "yellow", f"{display}: notebooks get no noqa comments (add them in the editor)"))
            continue
        try:
            src = read_source(real)
            new_text, added, missed = add_to_text(src.text, codes_by_line)
            if added:
                write_atomic(src, src.encode(new_text))
        except (SourceError, OSError, UnicodeEncodeError) as exc:
            err.print(labelled("error", "red", f"{display}: not changed: {exc}"))
            failed = True
            continue
        if missed:
            err.print(labelled("warning", "yellow", f"{display}: {missed} finding(s) inside multi-line strings got no comment"))
        if added:
            total += added
            files += 1
    print(f"Added {total} noqa comment{'s' if total != 1 else ''} to {files} file{'s' if files != 1 else ''}.")
    return EXIT_ERROR if failed else EXIT_CLEAN
