"""The HTML report's verify section, from a real `neuron-migrate verify --json-out` result (a planted defect in a
migrated copy; the original side runs natively here, the torch_xla side is test_xla_slow.py's): the verdict, the
step, the module and line, the rewritten hunk, and a per-step loss chart; rendered in a headless browser."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tests.verify.programs import plant, planted_line, write_program  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def verify_page(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("verify-report")
    orig = write_program(tmp / "original", "native")
    mig = tmp / "migrated"
    shutil.copytree(orig, mig)
    args = plant(mig, "gelu made approximate")
    result = tmp / "gelu.json"
    res = subprocess.run([sys.executable, "-m", "neuron_migrate", "verify", str(mig / "train.py"), "--original", str(orig),
                          "--native-original", "--float64", "--steps", "3", "--json-out", str(result), "--", *args],
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]
    out = tmp / "report.html"
    rep = subprocess.run([sys.executable, "-m", "neuron_migrate", "report", str(mig), "-o", str(out), "--verify", str(result),
                          "--json", str(tmp / "data.json")], capture_output=True, text=True, timeout=600)
    assert rep.returncode == 0, rep.stdout + rep.stderr
    return (json.loads(result.read_text()), out.read_text(encoding="utf-8"), json.loads((tmp / "data.json").read_text()),
            planted_line(mig, "gelu made approximate"))


def test_verify_section_matches_the_result(verify_page):
    doc, page, data, (path, line) = verify_page
    section = page[page.index('data-testid="verify-0"'):]
    assert 'data-verdict="diverged"' in page
    assert re.search(r'data-testid="verify-0-step">0<', section)
    assert 'data-testid="verify-0-module">Net.block<' in section and 'data-testid="verify-0-source">model.py:6<' in section
    assert f"<code>{path}:{line}</code> (not by a rewrite rule)" in section
    assert data["verifies"][0]["verdict"] == "diverged" == doc["verdict"]
    # one bar per compared step's loss, red where it fails its gate
    bars = re.findall(r'data-module="step (\d+)" data-ok="(true|false)"', section)
    assert [int(s) for s, _ in bars] == [r["step"] for r in doc["comparison"]["rows"] if "loss_rel" in r]
    assert any(ok == "false" for _, ok in bars) == any(
        r["loss_rel"] > doc["comparison"]["gates"]["loss"] for r in doc["comparison"]["rows"] if "loss_rel" in r)


def test_a_file_that_is_not_a_verify_result_is_a_one_line_error(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"status": "ok"}')
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "a.py").write_text("import torch\n")
    res = subprocess.run([sys.executable, "-m", "neuron_migrate", "report", str(tmp_path / "p"), "-o", str(tmp_path / "r.html"),
                          "--verify", str(bad)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "not a verify result" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_verify_section_renders_in_the_browser(verify_page, tmp_path):
    doc, page, _, _ = verify_page
    html = tmp_path / "r.html"
    html.write_text(page, encoding="utf-8")
    p = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                        "--disable-component-update", "--disable-sync", "--no-first-run",
                        f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", html.as_uri()],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    dom = p.stdout
    assert 'id="nm-js-errors"></pre>' in dom
    assert 'data-testid="verify-0-verdict">diverged<' in dom
    assert len(re.findall(r'data-module="step \d+"', dom)) == len([r for r in doc["comparison"]["rows"] if "loss_rel" in r])


@pytest.fixture(scope="module")
def scale_page(tmp_path_factory):
    """A 2-process verify of a program whose migrated copy lost the scale of its gradient all_reduce."""
    from tests.verify.programs import write_allreduce_program

    tmp = tmp_path_factory.mktemp("verify-scale")
    orig = write_allreduce_program(tmp / "original")
    mig = write_allreduce_program(tmp / "migrated", "scale of the gradient all_reduce dropped")
    result = tmp / "scale.json"
    res = subprocess.run([sys.executable, "-m", "neuron_migrate", "verify", str(mig / "train.py"), "--original", str(orig),
                          "--native-original", "--steps", "2", "--nproc", "2", "--json-out", str(result)],
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 1, res.stdout[-2000:] + res.stderr[-2000:]
    out = tmp / "report.html"
    rep = subprocess.run([sys.executable, "-m", "neuron_migrate", "report", str(mig), "-o", str(out), "--verify", str(result)],
                         capture_output=True, text=True, timeout=600)
    assert rep.returncode == 0, rep.stdout + rep.stderr
    return json.loads(result.read_text()), out.read_text(encoding="utf-8")


def test_the_distributed_checks_are_in_the_section(scale_page):
    doc, page = scale_page
    section = page[page.index('data-testid="verify-0"'):]
    assert 'data-testid="verify-0-collective">all_reduce<' in section
    assert re.search(r'data-testid="verify-0-step">0<', section)
    assert re.search(r'data-testid="verify-0-collectives">Collectives in the first step .*original <code>all_reduce '
                     r'\(gradients\) ×6</code>; migrated, rank 0 of 2: <code>all_reduce \(gradients\) ×6</code>', section)
    assert 'data-testid="verify-0-trajectory">2 processes against 1: comparable' in section
    assert "removed from the original: <code>p.grad /= world</code>" in section
    assert doc["distributed"]["trajectory"]["comparable"] is True


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_the_distributed_section_renders_in_the_browser(scale_page, tmp_path):
    _, page = scale_page
    html = tmp_path / "r.html"
    html.write_text(page, encoding="utf-8")
    p = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                        "--disable-component-update", "--disable-sync", "--no-first-run",
                        f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", html.as_uri()],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    dom = p.stdout
    assert 'id="nm-js-errors"></pre>' in dom
    assert 'data-testid="verify-0-verdict">diverged<' in dom and 'data-testid="verify-0-trajectory">' in dom
