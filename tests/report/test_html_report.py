"""The HTML migration report, checked in a real headless browser (Debian's chromium; skipped, with the reason,
where it is not installed): the page loads without script errors, the numbers it shows equal the report's JSON,
and a screenshot is written (to $NM_SCREENSHOT_DIR when set, for CI artifacts)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--disable-extensions", "--disable-default-apps"]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    base = tmp_path_factory.mktemp("report")
    work = base / "xla_repo"
    shutil.copytree(REPO / "examples" / "xla_repo", work)
    (work / "notebook_cfg.sh").write_text('export PJRT_DEVICE=CPU\n')  # something left for manual work
    out, js, probe = base / "report.html", base / "report.json", base / "fallback_model.json"
    pytest.importorskip("torch")
    # a real probe run of the known-answer model: CPU fallbacks, partial/unknown ops and float64 sites
    p = subprocess.run([sys.executable, "-m", "neuron_migrate", "probe", str(REPO / "examples" / "probe_models" / "fallback_model.py") + ":make",
                        "--json-out", str(probe)], capture_output=True, text=True, cwd=base, timeout=600)
    assert p.returncode in (0, 1), p.stdout + p.stderr
    p = subprocess.run([sys.executable, "-m", "neuron_migrate", "report", ".", "-o", str(out), "--json", str(js),
                        "--probe", str(probe)], capture_output=True, text=True, cwd=work, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return out, json.loads(js.read_text()), base, json.loads(probe.read_text())


@pytest.mark.slow
def test_page_is_self_contained(report):
    page = report[0].read_text()
    # nothing is fetched at view time: no external scripts, styles, images or fonts
    assert not re.search(r"""(src|href)\s*=\s*["'](https?:)?//""", page.replace('href="https://', 'href="doc:'))
    assert "<link" not in page and "@import" not in page and "url(" not in page


class _Numbers(HTMLParser):
    """Text of every element with a data-testid, after the browser ran the page."""

    def __init__(self):
        super().__init__()
        self.stack: list = []
        self.values: dict = {}
        self.rows: dict = {}
        self.attrs_of: dict = {}

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        tid = a.get("data-testid")
        self.stack.append((tag, tid))
        if tid:
            self.values.setdefault(tid, []).append("")
            self.attrs_of.setdefault(tid, []).append(a)

    def handle_endtag(self, tag):
        while self.stack:
            t, _ = self.stack.pop()
            if t == tag:
                break

    def handle_data(self, data):
        for _, tid in self.stack:
            if tid:
                self.values[tid][-1] += data


def _chromium(args: list[str], tmp: Path) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp / 'profile'}", "--enable-logging=stderr", "--v=0", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium); the browser check needs it")
def test_numbers_in_the_browser_equal_the_json(report):
    out, data, base, probe_json = report
    p = _chromium(["--dump-dom", out.as_uri()], base)
    assert p.returncode == 0, p.stderr[-2000:]
    dom = p.stdout
    console = _console_errors(p.stderr)
    assert not console, console
    assert re.search(r'<pre id="nm-js-errors">\s*</pre>', dom), "script errors were written into the page"
    # the inline script ran and found the embedded data consistent
    assert f'data-files="{data["totals"]["files"]}"' in dom
    nums = _Numbers()
    nums.feed(dom)
    v = nums.values
    t = data["totals"]
    for s in ("migrated", "manual", "clean", "error"):
        assert int(v[f"total-{s}"][0]) == t[s] == int(v[f"legend-{s}"][0])
    assert int(v["total-files"][0]) == t["files"] == len(v["file-row"]) == len(data["files"])
    assert int(v["total-fixes"][0]) == t["fixes"] == sum(r["fixed"] for r in data["by_rule"])
    assert int(v["total-manual-items"][0]) == t["manual_items"] == len(v["manual-row"]) == len(data["manual"]) >= 1
    assert [int(x) for x in v["rule-fixed"]] == [r["fixed"] for r in data["by_rule"]]
    assert [int(x) for x in v["rule-manual"]] == [r["manual"] for r in data["by_rule"]]
    assert t["manual"] == 1 and t["error"] == 0
    # probe charts: per status, distinct ops and calls as in the probe JSON
    probe = probe_json["summary"]["by_status"]
    assert probe["cpu_fallback"]["ops"] >= 1  # the known-answer model really has fallbacks
    for s, counts in probe.items():
        assert int(v[f"probe-0-ops-{s}"][0]) == counts["ops"]
        assert int(v[f"probe-0-calls-{s}"][0]) == counts["calls"]
    f64 = probe_json["float64"]
    n64 = len(f64["ops"]) + len(f64["sources"]) + len(f64["tensors"])
    assert int(v["probe-0-f64"][0]) == n64 == len(v["f64-row-0"]) >= 1
    assert "fallback_model" in dom
    # the SVG bar segments carry the same values
    bar = re.search(r'<svg[^>]*data-testid="files-bar"[^>]*>(.*?)</svg>', dom, re.S).group(1)
    segments = {k: int(n) for k, n in re.findall(r'data-key="(\w+)" data-value="(\d+)"', bar)}
    assert segments == {s: t[s] for s in ("migrated", "manual", "clean", "error") if t[s]}


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium); the browser check needs it")
def test_screenshot(report):
    out, _data, base, _probe = report
    shot_dir = Path(os.environ.get("NM_SCREENSHOT_DIR", base))
    shot_dir.mkdir(parents=True, exist_ok=True)
    shot = shot_dir / "migration-report.png"
    p = _chromium([f"--screenshot={shot}", "--window-size=1280,2000", out.as_uri()], base)
    assert p.returncode == 0, p.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000


def _console_errors(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if "CONSOLE" in ln or "Uncaught" in ln]


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium); the browser check needs it")
def test_the_console_check_sees_script_errors(tmp_path):
    """The browser check above could fail: a page with a broken script is caught by the same detection."""
    page = tmp_path / "broken.html"
    page.write_text('<html><body><script>console.error("nm-broken"); undefinedFunction();</script></body></html>')
    p = _chromium(["--dump-dom", page.as_uri()], tmp_path)
    errors = _console_errors(p.stderr)
    assert any("nm-broken" in e for e in errors) and any("Uncaught" in e for e in errors), p.stderr[-2000:]
