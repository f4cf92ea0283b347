"""GitHub Actions workflow commands: one `::error|warning|notice file=...,line=...::message` line per finding,
shown as annotations on the pull request."""
from __future__ import annotations

from typing import Iterable

from neuron_migrate.rules.model import Finding

COMMAND = {"error": "error", "warning": "warning", "info": "notice"}


def _escape_data(s: str) -> str:
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_prop(s: str) -> str:
    return _escape_data(s).replace(":", "%3A").replace(",", "%2C")


def github_line(f: Finding) -> str:
    props = [f"file={_escape_prop(f.path.replace(chr(92), '/'))}", f"line={f.span.line}", f"col={f.span.col + 1}"]
    if f.span.end_line >= f.span.line:
        props.append(f"endLine={f.span.end_line}")
        if f.span.end_line == f.span.line and f.span.end_col > f.span.col:
            props.append(f"endColumn={f.span.end_col + 1}")
    props.append(f"title={_escape_prop(f'{f.rule.code} {f.rule.name}')}")
    fix = " [fixable]" if f.fix is not None else ""
    conf = f" [{f.confidence} confidence]" if f.confidence in ("medium", "low") else ""
    msg = f"{f.rule.code}{fix} {'(cell ' + str(f.cell) + ', line ' + str(f.span.line) + ') ' if f.cell else ''}{f.message}{conf}" + (f"\nnote: {f.note}" if f.note else "")
    return f"::{COMMAND[f.severity.value]} {','.join(props)}::{_escape_data(msg)}"


def github_lines(findings: Iterable[Finding]) -> str:
    return "".join(github_line(f) + "\n" for f in sorted(findings, key=lambda f: f.sort_key()))
