"""The HTML report's parity section: gates, the module where the divergence starts, the culprit ops and a
per-module divergence chart, built from a real `probe --parity --format json` result."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # end-to-end: trains, runs several processes or the whole corpus

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "tests" / "probe" / "parity_models"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def parity_page(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("parity-report")
    res = subprocess.run([sys.executable, "-m", "neuron_migrate", "probe", "models.py:energy", "--parity",
                          "--emulate-precision", "float64", "--format", "json"], cwd=MODELS, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 1, res.stderr
    result = tmp / "energy.json"
    result.write_text(res.stdout)
    project = tmp / "project"
    shutil.copytree(REPO / "examples" / "xla_project", project)
    out = tmp / "report.html"
    rep = subprocess.run([sys.executable, "-m", "neuron_migrate", "report", str(project), "-o", str(out),
                          "--parity", str(result), "--json", str(tmp / "data.json")], capture_output=True, text=True,
                         timeout=600)
    assert rep.returncode == 0, rep.stdout + rep.stderr
    return json.loads(res.stdout), out.read_text(encoding="utf-8"), json.loads((tmp / "data.json").read_text())


def test_parity_section_matches_the_result(parity_page):
    doc, page, data = parity_page
    section = page[page.index('data-testid="parity-0"'):]
    assert len(re.findall(r'data-testid="parity-0-gate" data-ok="false"', section)) == sum(
        1 for c in doc["checks"] if not c["ok"])
    assert f'data-testid="parity-0-origin">{doc["origin_module"].replace("<", "&lt;").replace(">", "&gt;")}<' in section
    bars = re.findall(r'<rect [^>]*data-module="([^"]+)" data-ok="(true|false)"', section)
    assert [(m, ok == "true") for m, ok in bars] == [
        (m["module"].replace("<", "&lt;").replace(">", "&gt;"), m["ok"]) for m in doc["modules"]]
    culprit = doc["localisation"]["culprits"][0]
    assert f'{culprit["op"]}</code> at <code>{culprit["file"]}:{culprit["line"]}' in section
    assert data["parities"][0]["origin"] == doc["origin_module"]


def test_bad_parity_file_is_a_one_line_error(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"ops": []}')
    res = subprocess.run([sys.executable, "-m", "neuron_migrate", "report", str(REPO / "examples" / "xla_project"),
                          "-o", str(tmp_path / "r.html"), "--parity", str(bad)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "not a parity result" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_parity_section_renders_in_the_browser(parity_page, tmp_path):
    doc, page, _ = parity_page
    html = tmp_path / "r.html"
    html.write_text(page, encoding="utf-8")
    p = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                        "--disable-component-update", "--disable-sync", "--no-first-run",
                        f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", html.as_uri()],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    dom = p.stdout
    assert 'id="nm-js-errors"></pre>' in dom  # the page's own error box stayed empty
    assert len(re.findall(r'data-testid="parity-0-gate"', dom)) == len(doc["checks"])
