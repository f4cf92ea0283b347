"""SARIF 2.1.0 for GitHub code scanning: the tool driver carries rule metadata from the registry; results carry
repository-relative URIs, regions and partialFingerprints (stable across unrelated edits: the hash covers the
rule, the path and the text of the flagged line, plus an occurrence counter)."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Iterable, Optional

from neuron_migrate.files.lines import source_lines
from neuron_migrate.rules.model import Finding, Rule

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
LEVEL = {"error": "error", "warning": "warning", "info": "note"}
INFO_URI = "https://github.com/neuron-migrate/neuron-migrate"


def repo_root(start: Optional[Path] = None) -> Path:
    """The enclosing git work tree of `start` (default: cwd), else `start` itself."""
    start = (start or Path.cwd()).resolve()
    for p in (start, *start.parents):
        if (p / ".git").exists():
            return p
    return start


def artifact_uri(path: str, root: Path) -> str:
    p = Path(path)
    absolute = p if p.is_absolute() else (Path.cwd() / p)
    try:
        rel = os.path.relpath(absolute.resolve(), root)
    except ValueError:
        return absolute.resolve().as_uri()
    if rel.startswith(".."):
        return absolute.resolve().as_uri()
    return Path(rel).as_posix()


def rule_descriptor(r: Rule) -> dict:
    fix = {"safe": "safe fix", "unsafe": "unsafe fix", "none": "no fix"}[r.fix_safety.value]
    return {
        "id": r.code,
        "name": "".join(w.capitalize() for w in r.name.split("-")),
        "shortDescription": {"text": r.summary},
        "fullDescription": {"text": r.docs},
        "help": {"text": r.docs, "markdown": f"**{r.code} {r.name}** ({fix})\n\n{r.docs}"},
        "helpUri": r.url,
        "defaultConfiguration": {"level": LEVEL[r.severity.value]},
        "properties": {"tags": [r.category, fix], "fix": r.fix_safety.value},
    }


def _line_text(path: str, line: int, cache: dict) -> str:
    if path not in cache:
        try:
            cache[path] = source_lines(Path(path).read_text(encoding="utf-8", errors="replace"))
        except OSError:
            cache[path] = []
    lines = cache[path]
    return lines[line - 1] if 0 < line <= len(lines) else ""


def sarif_log(findings: Iterable[Finding], rules: Iterable[Rule], root: Optional[Path] = None, version: str = "",
              errors: Iterable = ()) -> dict:
    """`errors` are (path, message) of files that could not be checked: they go into the run's invocation as
    error notifications (and make executionSuccessful false), so a failed file is never silently absent."""
    from neuron_migrate import __version__

    root = root or repo_root()
    findings = sorted(findings, key=lambda f: f.sort_key())
    rule_list = sorted({r.code: r for r in rules}.values(), key=lambda r: r.code)
    # every rule a result names must be in the driver
    known = {r.code for r in rule_list}
    for f in findings:
        if f.rule.code not in known:
            rule_list.append(f.rule)
            known.add(f.rule.code)
    rule_list.sort(key=lambda r: r.code)
    index = {r.code: i for i, r in enumerate(rule_list)}
    lines: dict = {}
    seen: dict = {}
    results = []
    for f in findings:
        uri = artifact_uri(f.path, root)
        text = " ".join(_line_text(f.path, f.span.line, lines).split()) if f.cell is None else f"cell {f.cell}:{f.span.line}"
        digest = hashlib.sha256(f"{f.rule.code}\0{uri}\0{text}".encode()).hexdigest()[:16]
        seen[digest] = seen.get(digest, 0) + 1
        region = {"startLine": f.span.line, "startColumn": f.span.col + 1}
        if f.span.end_line >= f.span.line:
            region["endLine"] = f.span.end_line
            if f.span.end_line > f.span.line or f.span.end_col > f.span.col:
                region["endColumn"] = f.span.end_col + 1
        message = f.message + (f"\n\nNote: {f.note}" if f.note else "")
        results.append({
            "ruleId": f.rule.code,
            "ruleIndex": index[f.rule.code],
            "level": LEVEL[f.severity.value],
            "message": {"text": message},
            "locations": [{"physicalLocation": {
                "artifactLocation": {"uri": uri, **({"uriBaseId": "%SRCROOT%"} if not uri.startswith("file:") else {})},
                "region": region,
            }, **({"logicalLocations": [{"name": f"cell {f.cell}", "kind": "notebookCell"}]} if f.cell else {})}],
            "partialFingerprints": {"primaryLocationLineHash": f"{digest}:{seen[digest]}"},
            "properties": {"fixable": f.fix is not None, **({"fix": f.fix.safety.value} if f.fix else {}),
                           **({"confidence": f.confidence} if f.confidence else {}),
                           **({"source": f.source} if f.source else {}),
                           **({"cell": f.cell} if f.cell else {})},
        })
    return {
        "version": "2.1.0",
        "$schema": SCHEMA,
        "runs": [{
            "tool": {"driver": {
                "name": "neuron-migrate",
                "version": version or __version__,
                "semanticVersion": version or __version__,
                "informationUri": INFO_URI,
                "rules": [rule_descriptor(r) for r in rule_list],
            }},
            "invocations": [_invocation(list(errors), root)],
            "originalUriBaseIds": {"%SRCROOT%": {"uri": root.as_uri() + "/"}},
            "columnKind": "unicodeCodePoints",
            "results": results,
        }],
    }


def _invocation(errors: list, root: Path) -> dict:
    notes = []
    for path, msg in errors:
        note = {"level": "error", "message": {"text": f"{path}: {msg}" if path else msg},
                "descriptor": {"id": "file-not-checked"}}
        if path:
            uri = artifact_uri(path, root)
            note["locations"] = [{"physicalLocation": {"artifactLocation": {
                "uri": uri, **({"uriBaseId": "%SRCROOT%"} if not uri.startswith("file:") else {})}}}]
        notes.append(note)
    inv = {"executionSuccessful": not errors}
    if notes:
        inv["toolExecutionNotifications"] = notes
    return inv


def sarif_json(findings: Iterable[Finding], rules: Iterable[Rule], root: Optional[Path] = None, errors: Iterable = ()) -> str:
    return json.dumps(sarif_log(findings, rules, root, errors=errors), indent=2, ensure_ascii=False) + "\n"
