"""Human output: findings grouped by file with a code frame, unified diffs, and the run summary."""
from __future__ import annotations

import difflib
from typing import Iterable, Optional

from neuron_migrate.rules.model import Finding, FixSafety

SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def console(stderr: bool = False, color: Optional[bool] = None):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=True, force_terminal=color, no_color=(color is False))


def unified_diff(path: str, old: str, new: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{path}", f"b/{path}"))


def print_diff(con, diff: str, plain: bool) -> None:
    if plain:
        con.file.write(diff if diff.endswith("\n") else diff + "\n")
        return
    from rich.text import Text

    out = []
    for line in diff.splitlines():
        style = "bold" if line.startswith(("+++", "---")) else "green" if line.startswith("+") else "red" if line.startswith("-") else "cyan" if line.startswith("@@") else ""
        out.append(Text(line, style=style))
    _emit(con, out)


def _emit(con, lines: list) -> None:
    """Print many lines in one call: per-call overhead in rich dominates large reports."""
    if not lines:
        return
    if con.color_system is None and not con.is_terminal:
        # piped, no colour: rich's rendering adds nothing but time (soft_wrap consoles do not wrap)
        con.file.write("\n".join(t.plain for t in lines) + "\n")
        return
    from rich.text import Text

    con.print(Text("\n").join(lines))


def fix_label(f: Finding) -> str:
    if f.fix is None:
        return ""
    return "[*] " if f.fix.safety == FixSafety.SAFE else "[unsafe fix] "


def print_findings(con, findings: Iterable[Finding], source_lines: Optional[dict] = None, concise: bool = False) -> None:
    from rich.text import Text

    out = []
    for f in findings:
        loc = f"{f.path}:{f'cell {f.cell}:' if f.cell else ''}{f.span.line}:{f.span.col + 1}:"
        t = Text()
        t.append(loc, style="bold")
        t.append(" ")
        t.append(f.rule.code, style=SEVERITY_STYLE.get(f.severity.value, ""))
        t.append(f" {fix_label(f)}{f.message}")
        if f.confidence in ("medium", "low"):
            t.append(f" [{f.confidence} confidence{', ' + f.source if f.source else ''}]", style="dim")
        out.append(t)
        if concise:
            continue
        lines = (source_lines or {}).get(f.path) if f.cell is None else None  # notebook frames: lines count per cell
        if lines and 0 < f.span.line <= len(lines):
            text = lines[f.span.line - 1].rstrip("\r\n")
            out.append(Text(f"  {f.span.line:>5} | {text}", style="dim"))
            width = max(1, (f.span.end_col if f.span.end_line == f.span.line else len(text)) - f.span.col)
            out.append(Text("        | " + " " * f.span.col + "^" * width, style=SEVERITY_STYLE.get(f.severity.value, "")))
        if f.note:
            out.append(Text(f"        = note: {f.note}", style="dim"))
    _emit(con, out)


def print_grouped(con, findings: Iterable[Finding], source_lines: Optional[dict] = None, concise: bool = False) -> None:
    """Findings grouped by file: a header per file, then each finding (with its code frame unless concise)."""
    from rich.text import Text

    by_file: dict = {}
    for f in sorted(findings, key=lambda f: f.sort_key()):
        by_file.setdefault(f.path, []).append(f)
    for i, (path, items) in enumerate(by_file.items()):
        if i:
            con.print()
        n = len(items)
        con.print(Text(f"{path} ({n} finding{'s' if n != 1 else ''})", style="bold underline"))
        print_findings(con, items, source_lines, concise=concise)


def print_statistics(con, rows: list) -> None:
    """Rows of `report.json_out.statistics`: count, code, fix mark, name."""
    from rich.text import Text

    width = max((len(str(r["count"])) for r in rows), default=1)
    for r in rows:
        t = Text(f"{r['count']:>{width}}\t")
        t.append(r["code"], style=SEVERITY_STYLE.get(r["severity"], ""))
        mark = "[*]" if r["fixable"] == r["count"] else "[-]" if r["fixable"] else "   "
        t.append(f"\t{mark} {r['name']}")
        con.print(t)
