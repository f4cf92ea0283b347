"""Machine-readable findings: a JSON list, stable (sorted by path, line, column, code).

Each item: code, name, message, severity, location {path, row, column, end {row, column}} (1-based rows and
columns), fix (null, or {applicability, message, edits}), url, note, fixable, confidence and source (the
compatibility-table fact behind the finding: high|medium|low and its source id; null for other findings).
"""
from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable

from neuron_migrate.rules.model import Finding, is_performance_note


def _pos(line: int, col: int) -> dict:
    return {"row": line, "column": col + 1}


def finding_dict(f: Finding) -> dict:
    fix = None
    if f.fix is not None:
        fix = {
            "applicability": f.fix.safety.value,
            "message": f.fix.description or None,
            "edits": [
                {"kind": e.kind, "location": _pos(e.span.line, e.span.col), "end_location": _pos(e.span.end_line, e.span.end_col),
                 "content": e.text}
                for e in f.fix.edits
            ],
            "imports": [i.statement() for i in f.fix.imports],
            "helpers": [name for name, _ in f.fix.helpers],
        }
    return {
        "code": f.rule.code,
        "name": f.rule.name,
        "message": f.message,
        "severity": f.severity.value,
        "location": {"path": f.path.replace("\\", "/"), **_pos(f.span.line, f.span.col),
                     "end": _pos(f.span.end_line, f.span.end_col),
                     **({"cell": f.cell} if f.cell else {})},  # notebooks: rows count within this (1-based) cell
        "fix": fix,
        "fixable": f.fix is not None,
        # how fast the program runs, not whether it runs: needs no change (not manual migration)
        "performance_note": is_performance_note(f),
        "note": f.note or None,
        "confidence": f.confidence or None,
        "source": f.source or None,
        "url": f.rule.url,
    }


def findings_json(findings: Iterable[Finding]) -> str:
    items = [finding_dict(f) for f in sorted(findings, key=lambda f: f.sort_key())]
    return json.dumps(items, indent=2, ensure_ascii=False) + "\n"


def statistics(findings: Iterable[Finding]) -> list[dict]:
    findings = list(findings)
    counts = Counter(f.rule.code for f in findings)
    fixable = Counter(f.rule.code for f in findings if f.fix is not None)
    safe = Counter(f.rule.code for f in findings if f.fix is not None and f.fix.safety.value == "safe")
    rules = {f.rule.code: f.rule for f in findings}
    return [
        {"code": c, "name": rules[c].name, "count": n, "fixable": fixable[c], "safe_fixable": safe[c],
         "severity": rules[c].severity.value}
        for c, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    ]


def findings_json_lines(findings: Iterable[Finding]) -> str:
    return "".join(json.dumps(finding_dict(f), ensure_ascii=False) + "\n" for f in sorted(findings, key=lambda f: f.sort_key()))


def statistics_json(findings: Iterable[Finding]) -> str:
    return json.dumps(statistics(findings), indent=2) + "\n"
