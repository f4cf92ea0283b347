""""N items need manual migration" counts only what needs a human (issue 37 point 7): performance notes (ops that run on
the host, CUDA library settings that do nothing on Neuron) are listed apart in the rewrite's summary, in the report's
totals, file status and JSON, and are marked in the audit's JSON."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PERF_ONLY = """\
import torch

torch.backends.cuda.matmul.allow_tf32 = True
model = torch.nn.Linear(4, 2).to("cuda")
x = torch.randn(3, 4, device="cuda")
print(model(x))
"""
MANUAL = """\
import torch

torch.backends.cuda.matmul.allow_tf32 = True
print(torch.cuda.get_device_properties(0).major)
"""


def _cli(*args, cwd):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "neuron_migrate", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=120)


def _tree(tmp_path):
    (tmp_path / "perf_only.py").write_text(PERF_ONLY)
    (tmp_path / "manual.py").write_text(MANUAL)
    return tmp_path


def test_rewrite_summary_counts_performance_notes_apart(tmp_path):
    out = _cli("rewrite", ".", "--unsafe-fixes", "--no-cache", cwd=_tree(tmp_path)).stdout
    assert "1 item needs manual migration" in out and "3 performance notes (listed apart: no change needed)" in out, out


def test_report_totals_status_and_json(tmp_path):
    root = _tree(tmp_path)
    p = _cli("report", ".", "-o", "r.html", "--json", "r.json", cwd=root)
    assert p.returncode == 0, p.stdout + p.stderr
    data = json.loads((root / "r.json").read_text())
    assert data["totals"]["manual_items"] == 1 and data["totals"]["performance_notes"] == 3
    status = {Path(f["path"]).name: f["status"] for f in data["files"]}
    assert status == {"perf_only.py": "migrated", "manual.py": "manual"}  # performance notes alone need no change
    assert [m["code"] for m in data["manual"]] == ["NM205"]
    assert sorted(m["code"] for m in data["performance"]) == ["NM217", "NM217", "NM310"]
    assert all(r["manual"] == (1 if r["code"] == "NM205" else 0) for r in data["by_rule"]), data["by_rule"]
    page = (root / "r.html").read_text()
    assert '<span data-testid="total-manual-items">1</span> items for manual work' in page
    assert "<h2>Performance notes</h2>" in page and "1 manual items" in p.stdout


def test_audit_json_marks_performance_notes(tmp_path):
    p = _cli("audit", ".", "--output-format", "json", "--no-cache", cwd=_tree(tmp_path))
    rows = json.loads(p.stdout)
    marked = {(Path(r["location"]["path"]).name, r["code"]): r["performance_note"] for r in rows}
    assert marked[("manual.py", "NM205")] is False and marked[("manual.py", "NM217")] is True
    assert marked[("perf_only.py", "NM310")] is True and marked[("perf_only.py", "NM201")] is False
