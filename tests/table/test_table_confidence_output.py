"""Confidence and source of table-driven findings: every output format shows them, --min-confidence filters,
`table show` prints the source URL and confidence."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """\
import torch


def step(a, b, x, device):
    q, r = torch.linalg.qr(a)          # cpu_fallback, medium (pre-release linalg)
    y = torch.sparse.mm(a, b)          # unsupported namespace, medium (release notes as reported)
    g = torch.Generator(device=device)  # low (community)
    return q, y, g
"""


def audit(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "train.py").write_text(SCRIPT, encoding="utf-8")
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "neuron_migrate", "audit", "--no-cache", "--select", "NM3", "train.py",
                           *args], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)


def test_json_carries_confidence_and_source(tmp_path):
    r = audit(tmp_path, "--output-format", "json")
    items = {(f["code"], f["location"]["row"]): f for f in json.loads(r.stdout)}
    assert items[("NM310", 5)]["confidence"] == "medium" and items[("NM310", 5)]["source"] == "prerelease_linalg"
    assert items[("NM301", 6)]["confidence"] == "medium" and items[("NM301", 6)]["source"] == "aws_rn_233_reported"
    assert items[("NM325", 7)]["confidence"] == "low"


def test_text_marks_medium_and_low(tmp_path):
    out = audit(tmp_path).stdout
    qr = next(line for line in out.splitlines() if ":5:" in line and "NM310" in line)
    assert "[medium confidence, prerelease_linalg]" in qr
    gen = next(line for line in out.splitlines() if ":7:" in line and "NM325" in line)
    assert "[low confidence" in gen


def test_min_confidence_filters(tmp_path):
    def codes(*args):
        return sorted((f["code"], f["location"]["row"])
                      for f in json.loads(audit(tmp_path, "--output-format", "json", *args).stdout))

    everything = codes()
    medium = codes("--min-confidence", "medium")
    high = codes("--min-confidence", "high")
    assert ("NM325", 7) in everything and ("NM325", 7) not in medium
    assert ("NM310", 5) in medium and ("NM301", 6) in medium
    assert ("NM310", 5) not in high and ("NM301", 6) not in high
    bad = audit(tmp_path, "--min-confidence", "very")
    assert bad.returncode == 2 and "--min-confidence" in bad.stderr


def test_sarif_properties(tmp_path):
    doc = json.loads(audit(tmp_path, "--output-format", "sarif").stdout)
    props = [res["properties"] for res in doc["runs"][0]["results"]]
    assert {"confidence": "medium", "source": "prerelease_linalg"}.items() <= next(
        p for p in props if p.get("source") == "prerelease_linalg").items()


def test_findings_survive_the_cache_with_confidence(tmp_path):
    from neuron_migrate.rules.model import Finding, Span, finding_from_dict, finding_to_dict
    from neuron_migrate.rules.registry import get_rule

    f = Finding(rule=get_rule("NM310"), path="x.py", span=Span(1, 0, 1, 4), message="m", confidence="low", source="s")
    back = finding_from_dict(finding_to_dict(f))
    assert (back.confidence, back.source) == ("low", "s")
    plain = finding_to_dict(Finding(rule=get_rule("NM101"), path="x.py", span=Span(1, 0, 1, 4), message="m"))
    assert "confidence" not in plain  # non-table findings keep their old cache form


def run_show(*args):
    from typer.testing import CliRunner

    from neuron_migrate.cli.app import app

    return CliRunner().invoke(app, ["table", "show", *args])


def test_show_prints_url_and_confidence_for_entries_and_derived_ops():
    r = run_show("aten::linalg_qr")
    assert r.exit_code == 0, r.output
    assert "confidence: medium" in r.output and "url:        https://github.com/parmoham-aws/" in r.output
    r = run_show("zeros_like")  # no entry: derived from the dispatcher
    assert r.exit_code == 0, r.output
    assert "derived from torch's dispatcher" in r.output and "CompositeExplicitAutograd" in r.output
    assert "confidence: medium" in r.output and "url:" in r.output
    r = run_show("torch.sparse.mm")
    assert "confidence: medium" in r.output and "release-notes/components/torchneuron.html" in r.output
    assert "shared/research" not in r.output
    data = json.loads(run_show("aten::sort", "--format", "json").output)
    assert data["confidence"] == "low" and data["source"] == "prerelease_no_kernel" and data["source_url"]
    data = json.loads(run_show("aten::zeros_like", "--format", "json").output)
    assert data["via"] == "derived" and data["status"] == "native"


def test_show_lists_env_forms():
    r = run_show("aten::_fft_c2r")
    assert "with TORCH_NEURONX_COMPLEX_DECOMPOSE=0: unsupported" in r.output
