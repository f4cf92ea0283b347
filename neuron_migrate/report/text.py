"""Human output: findings grouped by file with a code frame, unified diffs, and the run summary."""
from __future__ import annotations

import re
from collections.abc import Iterable

from neuron_migrate.files.lines import source_lines
from neuron_migrate.rules.model import Finding, FixSafety

SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


class StyledText:
    """Text with rich styles, kept as plain data: a rich console renders it through `__rich__` (as rich.text.Text),
    PlainConsole writes `.plain`. Reports build these, so piped output never imports rich (~45 ms of a one-file run).
    The part of rich.text.Text the reports use: a style, `append`, `join`, `plain`."""

    __slots__ = ("parts",)

    def __init__(self, text: str = "", style: str = ""):
        self.parts: list[tuple[str, str]] = [(text, style)] if text else []

    def append(self, text: str, style: str = "") -> "StyledText":
        self.parts.append((text, style or ""))
        return self

    @property
    def plain(self) -> str:
        return "".join(t for t, _ in self.parts)

    def join(self, items) -> "StyledText":
        out = StyledText()
        for i, item in enumerate(items):
            if i and self.parts:
                out.parts.extend(self.parts)
            out.parts.extend(item.parts if isinstance(item, StyledText) else [(str(item), "")])
        return out

    def __rich__(self):
        from rich.text import Text

        t = Text()
        for text, style in self.parts:
            t.append(text, style=style or None)
        return t

    def __str__(self) -> str:
        return self.plain


# print(..., **PLAIN): the string as it is, for lines of user data (paths, messages): rich would read `[v2]` in a
# path as a style tag and `file.py:100:` as the :100: emoji
PLAIN = {"markup": False, "emoji": False, "highlight": False}


def labelled(label: str, style: str, text: str) -> "StyledText":
    """`error: <text>` with the label styled and the text (a path, a message) printed as it is."""
    return StyledText(label, style).append(f": {text}")


# what rich's markup and emoji rendering could change in a string: a tag (`[bold]`, `[/]`) or an emoji code
# (`:smile:`); a string with neither is printed as it is
_MAYBE_MARKUP = re.compile(r"\[[a-z#/@]|:\S*?:")


class PlainConsole:
    """The part of rich's Console the reports use, for output that is neither a terminal nor coloured (a pipe, a
    file, pre-commit): the same characters rich would write, without importing rich.console, which costs more than
    the audit of a small file. Anything richer than text (a table, markdown) goes to a real Console."""

    color_system = None
    is_terminal = False

    def __init__(self, stderr: bool = False):
        self.stderr = stderr

    @property
    def file(self):
        import sys

        return sys.stderr if self.stderr else sys.stdout  # looked up per use, like rich (test runners swap it)

    def print(self, *objects, sep: str = " ", end: str = "\n", markup=None, highlight=None, emoji=None,
              **kwargs) -> None:
        parts = []
        for obj in objects:
            if isinstance(obj, str):
                if (markup is False and emoji is False) or not _MAYBE_MARKUP.search(obj):
                    parts.append(obj)
                    continue
                from rich.markup import escape, render

                # rich renders markup unless told not to, and replaces :emoji: codes unless told not to
                parts.append(render(obj if markup is not False else escape(obj), emoji=emoji is not False).plain)
            elif hasattr(obj, "plain"):
                parts.append(obj.plain)
            else:
                from rich.console import Console

                Console(file=self.file, highlight=False, soft_wrap=True, no_color=True, color_system=None).print(
                    *objects, sep=sep, end=end, markup=markup, highlight=highlight, emoji=emoji, **kwargs)
                return
        self.file.write(sep.join(parts) + end)


def _plain_stream(stderr: bool, color) -> bool:
    """Would rich write this stream without colour or terminal control? (auto colour, not a terminal, not forced)"""
    import os
    import sys

    if color in ("always", True) or os.environ.get("FORCE_COLOR") or os.environ.get("TTY_COMPATIBLE") == "1":
        return False
    if color in ("never", False):
        return True
    stream = sys.stderr if stderr else sys.stdout
    try:
        return not stream.isatty()
    except (AttributeError, ValueError):
        return True


def console(stderr: bool = False, color=None):
    """A rich console. color: "auto" or None (colour on a terminal unless NO_COLOR is set; FORCE_COLOR forces it),
    "always" / True, "never" / False. Output that is not a terminal gets the light PlainConsole."""
    if _plain_stream(stderr, color):
        return PlainConsole(stderr)
    from rich.console import Console

    if color in ("always", True):
        return Console(stderr=stderr, highlight=False, soft_wrap=True, force_terminal=True, no_color=False)
    import os

    if color in ("never", False) or (color in ("auto", None) and os.environ.get("NO_COLOR")):
        # NO_COLOR (https://no-color.org): no escape sequences at all, styles included
        return Console(stderr=stderr, highlight=False, soft_wrap=True, no_color=True, color_system=None)
    # auto: rich reads NO_COLOR and FORCE_COLOR from the environment when these are left as None
    return Console(stderr=stderr, highlight=False, soft_wrap=True)


def unified_diff(path: str, old: str, new: str) -> str:
    import difflib  # only diffs need it

    return "".join(difflib.unified_diff(source_lines(old, True), source_lines(new, True), f"a/{path}", f"b/{path}"))


def print_diff(con, diff: str, plain: bool) -> None:
    if plain:
        con.file.write(diff if diff.endswith("\n") else diff + "\n")
        return
    out = []
    for line in diff.splitlines():
        style = "bold" if line.startswith(("+++", "---")) else "green" if line.startswith("+") else "red" if line.startswith("-") else "cyan" if line.startswith("@@") else ""
        out.append(StyledText(line, style=style))
    _emit(con, out)


def _emit(con, lines: list) -> None:
    """Print many lines in one call: per-call overhead in rich dominates large reports."""
    if not lines:
        return
    if con.color_system is None and not con.is_terminal:
        # piped, no colour: rich's rendering adds nothing but time (soft_wrap consoles do not wrap)
        con.file.write("\n".join(t if isinstance(t, str) else t.plain for t in lines) + "\n")
        return
    from rich.text import Text

    con.print(Text("\n").join(t.__rich__() if isinstance(t, StyledText) else t for t in lines))


def fix_label(f: Finding) -> str:
    if f.fix is None:
        return ""
    return "[*] " if f.fix.safety == FixSafety.SAFE else "[unsafe fix] "


def line_at(lines, n: int) -> str | None:
    """Line `n` (1-based) of a file's lines: a list of every line, or a {line: text} map of the lines the findings
    show (what the results cache keeps, so that a warm run reads no source); None when unknown."""
    if not lines or n < 1:
        return None
    if type(lines) is dict:
        return lines.get(n)
    return lines[n - 1] if n <= len(lines) else None


def fix_preview(f: Finding, lines) -> list:
    """--show-fixes: the lines a finding's fix changes, before and after (edits on one line), or its edits."""
    if f.fix is None:
        return []
    out = [StyledText(f"        = fix ({f.fix.safety.value}): {f.fix.description or 'edit'}", style="dim")]
    for e in f.fix.edits:
        old = line_at(lines, e.span.line) if e.span.line == e.span.end_line and e.kind != "delete_stmt" else None
        if old is not None:
            old = old.rstrip("\r\n")
            new = old[: e.span.col] + e.text + old[e.span.end_col:] if e.kind == "replace_expr" or e.kind == "replace_comment" else e.text
            out.append(StyledText(f"        - {old.strip()}", style="red"))
            out.append(StyledText(f"        + {new.strip()}", style="green"))
        elif e.kind == "delete_stmt":
            out.append(StyledText(f"        - line {e.span.line}" + (f"-{e.span.end_line}" if e.span.end_line != e.span.line else "") + " deleted", style="red"))
        else:
            for ln in (e.text or "").splitlines() or [""]:
                out.append(StyledText(f"        + {ln}", style="green"))
    for imp in f.fix.imports:
        out.append(StyledText(f"        + {imp.statement()}  (import)", style="green"))
    for name, _src in f.fix.helpers:
        out.append(StyledText(f"        + def {name}(...)  (helper)", style="green"))
    return out


def print_findings(con, findings: Iterable[Finding], source_lines: dict | None = None, concise: bool = False,
                   show_fixes: bool = False) -> None:
    _emit(con, _finding_lines(con, findings, source_lines, concise, show_fixes))


def _is_plain(con) -> bool:
    return con.color_system is None and not con.is_terminal  # piped: build strings, not rich Text (warm runs)


def _finding_lines(con, findings: Iterable[Finding], source_lines: dict | None, concise: bool, show_fixes: bool,
                   out: list | None = None) -> list:
    """The lines print_findings prints (strings for a plain console, StyledText otherwise), added to `out`."""
    plain = _is_plain(con)
    out = [] if out is None else out
    for f in findings:
        loc = f"{f.path}:{f'cell {f.cell}:' if f.cell else ''}{f.span.line}:{f.span.col + 1}:"
        conf = f" [{f.confidence} confidence{', ' + f.source if f.source else ''}]" if f.confidence in ("medium", "low") else ""
        if plain:
            out.append(f"{loc} {f.rule.code} {fix_label(f)}{f.message}{conf}")
        else:
            t = StyledText()
            t.append(loc, style="bold")
            t.append(" ")
            t.append(f.rule.code, style=SEVERITY_STYLE.get(f.severity.value, ""))
            t.append(f" {fix_label(f)}{f.message}")
            if conf:
                t.append(conf, style="dim")
            out.append(t)
        lines = (source_lines or {}).get(f.path) if f.cell is None else None  # notebook frames: lines count per cell
        if concise:
            if show_fixes:
                out += fix_preview(f, lines)
            continue
        text = line_at(lines, f.span.line)
        if text is not None:
            text = text.rstrip("\r\n")
            frame = f"  {f.span.line:>5} | {text}"
            width = max(1, (f.span.end_col if f.span.end_line == f.span.line else len(text)) - f.span.col)
            caret = "        | " + " " * f.span.col + "^" * width
            if plain:  # strings: what _emit writes for a pipe anyway
                out += (frame, caret)
            else:
                out += (StyledText(frame, style="dim"), StyledText(caret, style=SEVERITY_STYLE.get(f.severity.value, "")))
        if f.note:
            note = f"        = note: {f.note}"
            out.append(note if plain else StyledText(note, style="dim"))
        if show_fixes:
            out += fix_preview(f, lines)
    return out


def print_grouped(con, findings: Iterable[Finding], source_lines: dict | None = None, concise: bool = False,
                  show_fixes: bool = False) -> None:
    """Findings grouped by file: a header per file, then each finding (with its code frame unless concise)."""
    by_file: dict = {}
    for f in sorted(findings, key=lambda f: f.sort_key()):
        by_file.setdefault(f.path, []).append(f)
    plain = _is_plain(con)
    out: list = []  # plain: every file's lines, written at once (a warm run of a tree prints thousands)
    for i, (path, items) in enumerate(by_file.items()):
        n = len(items)
        header = f"{path} ({n} finding{'s' if n != 1 else ''})"
        if plain:
            if i:
                out.append("")
            out.append(header)
            _finding_lines(con, items, source_lines, concise, show_fixes, out)
            continue
        if i:
            con.print()
        con.print(StyledText(header, style="bold underline"))
        print_findings(con, items, source_lines, concise=concise, show_fixes=show_fixes)
    _emit(con, out)


def print_statistics(con, rows: list) -> None:
    """Rows of `report.json_out.statistics`: count, code, fix mark, name; then a legend and the total."""
    width = max((len(str(r["count"])) for r in rows), default=1)
    marks = set()
    for r in rows:
        t = StyledText(f"{r['count']:>{width}}\t")
        t.append(r["code"], style=SEVERITY_STYLE.get(r["severity"], ""))
        mark = "[*]" if r.get("safe_fixable", 0) == r["count"] else "[-]" if r["fixable"] else "   "
        marks.add(mark)
        t.append(f"\t{mark} {r['name']}")
        con.print(t)
    total = sum(r["count"] for r in rows)
    con.print(StyledText(f"Found {total} finding{'s' if total != 1 else ''} of {len(rows)} rule{'s' if len(rows) != 1 else ''}.", style="bold"))
    legend = []
    if "[*]" in marks:
        legend.append("[*] every finding has a safe fix (`rewrite --write`)")
    if "[-]" in marks:
        legend.append("[-] some can be fixed, or only with --unsafe-fixes")
    if legend:
        con.print(StyledText("; ".join(legend) + ".", style="dim"))
