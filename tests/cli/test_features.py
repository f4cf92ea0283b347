"""Issue 15 features: --watch, --show-fixes, --add-noqa, per-file-ignores, extend-select, stdin, cache clean,
junit and gitlab output, unused-suppression fixes; and the result cache's warm path (issue 14)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from xml.etree import ElementTree as ET

from cli_support import XLA, cli


def test_show_fixes_in_audit_and_rewrite(xla_project):
    out = cli("audit", "--no-cache", "--show-fixes", "-f", "concise", "train.py").output
    assert "= fix (safe)" in out
    assert "- device = xm.xla_device()" in out and '+ device = torch.device("neuron")' in out
    assert "+ import torch  (import)" in out
    r = cli("rewrite", "--no-cache", "--write", "--show-fixes", "train.py").output
    # lines of the rewritten file: the removed mark_step (line 4) was where the file now ends (line 3)
    assert "Fixed:" in r and "train.py:3: NM101 (safe)" in r and "train.py:3: NM102 (safe)" in r
    assert "Line numbers above are those of the rewritten files." in r


def test_add_noqa_baselines_every_finding(xla_project):
    (xla_project / "m.py").write_text(
        "import torch\n"
        "x = torch.zeros(3, dtype=torch.float64)  # noqa: E501\n"
        'doc = """\n'
        "multi-line string\n"
        '""" + str(torch.zeros(2, dtype=torch.float64))\n'
    )
    before = cli("audit", "--no-cache", "-f", "json", "m.py", "train.py")
    assert before.exit_code == 1
    r = cli("audit", "--no-cache", "--add-noqa", "m.py", "train.py")
    assert r.exit_code == 0 and "Added" in r.output
    text = (xla_project / "m.py").read_text()
    assert "# noqa: E501, NM304" in text.splitlines()[1]  # merged with the other tool's codes
    assert (xla_project / "train.py").read_text().splitlines()[3] == "xm.mark_step()  # noqa: NM101"
    after = cli("audit", "--no-cache", "-f", "json", "--fail-level", "info", "m.py", "train.py")
    assert after.exit_code == 0, after.output  # nothing left, and no unused-suppression finding either
    assert json.loads(after.stdout) == []


def test_per_file_ignores_and_extend_select_in_configuration(xla_project):
    (xla_project / "tests").mkdir()
    (xla_project / "tests" / "test_x.py").write_text(XLA)
    (xla_project / "c.py").write_text("import torch\nmodel = torch.compile(torch.nn.Linear(2, 2))\n")
    (xla_project / "pyproject.toml").write_text(
        '[tool.neuron-migrate]\nextend-select = ["NM404"]\n'
        '[tool.neuron-migrate.per-file-ignores]\n"tests/*" = ["NM101", "xla-device"]\n')
    found = json.loads(cli("audit", "--no-cache", "-f", "json", ".").stdout)
    got = {(f["location"]["path"], f["code"]) for f in found}
    assert ("train.py", "NM101") in got and ("train.py", "NM102") in got
    assert ("tests/test_x.py", "NM101") not in got and ("tests/test_x.py", "NM102") not in got
    assert ("tests/test_x.py", "NM199") not in got
    assert ("c.py", "NM404") in got
    # rewrite honours per-file-ignores too: the ignored call stays
    cli("rewrite", "--no-cache", "--write", ".")
    assert "xm.mark_step()" in (xla_project / "tests" / "test_x.py").read_text()
    assert "mark_step" not in (xla_project / "train.py").read_text()
    (xla_project / "pyproject.toml").write_text('[tool.neuron-migrate.per-file-ignores]\n"x" = 1\n')
    assert cli("audit", "--no-cache", ".").exit_code == 2  # must be a list: a one-line error, no traceback


def test_stdin_with_stdin_filename(xla_project):
    (xla_project / "pyproject.toml").write_text('[tool.neuron-migrate]\nignore = ["NM102"]\nexclude = ["vendor/"]\n')
    r = cli("audit", "--no-cache", "-f", "json", "-", "--stdin-filename", "pkg/train.py", input=XLA)
    found = json.loads(r.stdout)
    assert r.exit_code == 1 and {f["location"]["path"] for f in found} == {"pkg/train.py"}
    assert {f["code"] for f in found} == {"NM101"}  # the configuration of the named file applies
    fixed = subprocess.run([sys.executable, "-m", "neuron_migrate", "rewrite", "-", "--stdin-filename", "job.py"],
                           input=XLA, capture_output=True, text=True, cwd=xla_project, timeout=120)
    assert fixed.returncode == 0, fixed.stderr
    assert "mark_step" not in fixed.stdout and "xm.xla_device()" in fixed.stdout  # NM102 ignored by the config
    assert "Fixes applied: safe only" in fixed.stderr  # the summary goes to stderr, the code to stdout
    excluded = subprocess.run([sys.executable, "-m", "neuron_migrate", "rewrite", "-", "--stdin-filename", "vendor/v.py",
                               "--force-exclude"], input=XLA, capture_output=True, text=True, cwd=xla_project, timeout=120)
    assert excluded.returncode == 0 and excluded.stdout == XLA


def test_junit_and_gitlab_formats(xla_project):
    (xla_project / "broken.py").write_text("import torch_xla\ndef f(:\n")
    junit = cli("audit", "--no-cache", "-f", "junit", "train.py", "broken.py")
    root = ET.fromstring(junit.stdout)
    assert root.tag == "testsuites" and root.get("failures") == "2" and root.get("errors") == "1"
    cases = root.findall(".//testcase")
    assert {c.get("name") for c in cases} >= {"NM101 mark-step", "NM102 xla-device"}
    assert any(c.find("error") is not None and "broken.py" == c.get("name") for c in cases)
    gl = json.loads(cli("audit", "--no-cache", "-f", "gitlab", "train.py").stdout)
    assert {i["check_name"] for i in gl} == {"NM101 mark-step", "NM102 xla-device"}
    for issue in gl:
        assert issue["severity"] in ("info", "minor", "major", "critical", "blocker")
        assert issue["location"]["path"] == "train.py" and issue["location"]["positions"]["begin"]["line"] >= 1
    assert len({i["fingerprint"] for i in gl}) == len(gl)
    again = json.loads(cli("audit", "--no-cache", "-f", "gitlab", "train.py").stdout)
    assert [i["fingerprint"] for i in again] == [i["fingerprint"] for i in gl]  # stable across runs
    lines = cli("audit", "--no-cache", "-f", "json-lines", "train.py").stdout.splitlines()
    assert [json.loads(ln)["code"] for ln in lines] == ["NM102", "NM101"]


def test_cache_clean_and_warm_runs(xla_project):
    (xla_project / "pyproject.toml").write_text("[tool.neuron-migrate]\n")
    (xla_project / "broken.py").write_text("import torch_xla\ndef f(:\n")
    old = time.time() - 60
    for name in ("train.py", "broken.py", "pyproject.toml"):
        os.utime(xla_project / name, (old, old))  # older than the racy window: the stat path is trusted
    first = cli("audit", "-f", "concise", ".")
    cache = xla_project / ".neuron-migrate-cache"
    assert cache.is_dir() and list(cache.glob("results-*.json"))
    entries = json.loads(next(cache.glob("results-*.json")).read_text())["files"]
    assert all("stat" in e for e in entries.values())
    second = cli("audit", "-f", "concise", ".")
    assert second.exit_code == first.exit_code == 2
    assert second.output == first.output  # the syntax error is re-reported from the cache
    (xla_project / "train.py").write_text("import torch\n")  # new content (and new mtime): recomputed
    third = cli("audit", "-f", "concise", "train.py")
    assert third.exit_code == 0 and "NM101" not in third.output
    r = cli("cache", "clean")
    assert r.exit_code == 0 and "Removed" in r.output and not cache.exists()
    assert "No cache to remove." in cli("cache", "clean").output
    (xla_project / "notacache").mkdir()
    (xla_project / "notacache" / "keep.txt").write_text("x")
    os.environ["NEURON_MIGRATE_CACHE_DIR"] = str(xla_project / "notacache")
    try:
        refused = cli("cache", "clean")
    finally:
        del os.environ["NEURON_MIGRATE_CACHE_DIR"]
    assert "not removing" in refused.output and (xla_project / "notacache" / "keep.txt").exists()


def test_watch_reruns_on_change(xla_project):
    (xla_project / "train.py").write_text("import torch\n")
    proc = subprocess.Popen([sys.executable, "-m", "neuron_migrate", "audit", "--no-cache", "-f", "concise", "--watch", "."],
                            cwd=xla_project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    try:
        seen = []

        def wait_for(marker: str) -> None:
            deadline = time.monotonic() + 300  # generous: synchronised on output, not on time
            while time.monotonic() < deadline:
                line = proc.stdout.readline()
                if not line:
                    raise AssertionError("watch exited: " + "".join(seen))
                seen.append(line)
                if marker in line:
                    return
            raise AssertionError("".join(seen))

        wait_for("[watch] exit code 0")
        (xla_project / "train.py").write_text(XLA)
        wait_for("NM101")
        wait_for("[watch] exit code 1")
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_paths_and_line_numbers_print_as_they_are(tmp_path, monkeypatch):
    """Report lines carry user data: rich would read `[v2]` in a folder name as a style tag and `t.py:100:` as the
    :100: emoji (💯). Fix lists, rule counts, notes and error lines print them as they are."""
    folder = tmp_path / "runs[v2]"
    folder.mkdir()
    (folder / "t.py").write_text("import torch_xla.core.xla_model as xm\n" + "x = 1\n" * 98 + "d = xm.xla_device()\n")
    (folder / "bad.py").write_text("import torch_xla\ndef broken(:\n")
    monkeypatch.chdir(tmp_path)
    r = cli("rewrite", "--no-cache", "--show-fixes", "runs[v2]")
    out = r.output + (r.stderr if hasattr(r, "stderr") else "")
    assert "runs[v2]/t.py:100: NM102 (safe)" in out, out
    assert "error: runs[v2]/bad.py: syntax error" in out, out
    assert "\U0001f4af" not in out
    a = cli("audit", "--no-cache", "runs[v2]")
    out = a.output + (a.stderr if hasattr(a, "stderr") else "")
    assert "error: runs[v2]/bad.py: syntax error" in out, out
    assert "runs[v2]/t.py:100:" in out and "\U0001f4af" not in out, out
