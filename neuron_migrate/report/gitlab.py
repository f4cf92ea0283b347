"""GitLab Code Quality report (a JSON list; https://docs.gitlab.com/ci/testing/code_quality/): one issue per
finding with description, check_name, fingerprint (stable across unrelated edits), severity, location."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Iterable, Optional

from neuron_migrate.rules.model import Finding

SEVERITY = {"error": "major", "warning": "minor", "info": "info"}


def gitlab_json(findings: Iterable[Finding], root: Optional[Path] = None) -> str:
    from neuron_migrate.report.sarif import _line_text, artifact_uri, repo_root

    root = root or repo_root()
    lines: dict = {}
    seen: dict = {}
    out = []
    for f in sorted(findings, key=lambda f: f.sort_key()):
        uri = artifact_uri(f.path, root)
        text = " ".join(_line_text(f.path, f.span.line, lines).split())
        base = hashlib.sha256(f"{f.rule.code}\0{uri}\0{text}".encode()).hexdigest()
        seen[base] = seen.get(base, 0) + 1
        fingerprint = hashlib.sha256(f"{base}:{seen[base]}".encode()).hexdigest()[:32]
        out.append({
            "description": f"{f.rule.code} {f.message}",
            "check_name": f"{f.rule.code} {f.rule.name}",
            "fingerprint": fingerprint,
            "severity": SEVERITY[f.severity.value],
            "location": {"path": uri, "positions": {
                "begin": {"line": f.span.line, "column": f.span.col + 1},
                "end": {"line": max(f.span.end_line, f.span.line), "column": f.span.end_col + 1},
            }},
        })
    return json.dumps(out, indent=2, ensure_ascii=False) + "\n"
