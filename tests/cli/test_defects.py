"""Issue 15, defects 1-12 and 14-17: each as the user hit it, through the command line."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from cli_support import XLA, cli, tty_run

REPO = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;]*m")


# 1 ---------------------------------------------------------------------------------------------------
def test_ignored_rule_is_silenced_not_turned_into_nm199(xla_project):
    r = cli("audit", "--no-cache", "-f", "json", "--ignore", "NM102", "train.py")
    codes = [f["code"] for f in json.loads(r.stdout)]
    assert "NM102" not in codes and "NM199" not in codes and "NM101" in codes
    (xla_project / "pyproject.toml").write_text('[tool.neuron-migrate]\nignore = ["xla-device"]\n')  # by name too
    codes = [f["code"] for f in json.loads(cli("audit", "--no-cache", "-f", "json", "train.py").stdout)]
    assert "NM102" not in codes and "NM199" not in codes
    # the fallback still speaks for a torch_xla API no rule knows
    (xla_project / "new.py").write_text("import torch_xla.core.xla_model as xm\nxm.brand_new_api()\n")
    codes = [f["code"] for f in json.loads(cli("audit", "--no-cache", "-f", "json", "new.py").stdout)]
    assert "NM199" in codes


# 2 ---------------------------------------------------------------------------------------------------
CLEAN = "import torch\n\nmodel = torch.compile(torch.nn.Linear(2, 2))\n\n\ndef f(x):\n    return torch.relu(x)\n"


def test_idiomatic_code_passes_audit_and_rewrite_check(xla_project):
    (xla_project / "clean.py").write_text(CLEAN)
    r = cli("audit", "--no-cache", "clean.py")
    assert r.exit_code == 0, r.output
    assert "NM404" not in r.output  # opinionated advice is opt-in
    opted = cli("audit", "--no-cache", "--extend-select", "NM404", "clean.py")
    assert opted.exit_code == 0 and "NM404" in opted.output and "does not fail the run" in opted.output
    assert cli("audit", "--no-cache", "--extend-select", "compile-graph-breaks", "--fail-level", "info", "clean.py").exit_code == 1
    assert cli("rewrite", "--check", "--no-cache", "--extend-select", "NM404", "clean.py").exit_code == 0


def test_rewrite_fails_only_when_a_file_would_change(xla_project):
    # a finding left for manual work (a warning) but nothing to rewrite
    (xla_project / "manual.py").write_text("import torch_xla.core.xla_model as xm\nxm.brand_new_api()\n")
    r = cli("rewrite", "--check", "--no-cache", "manual.py")
    assert r.exit_code == 0, r.output
    assert "1 item needs manual migration" in r.output  # singular (defect 6)
    assert cli("rewrite", "--write", "--no-cache", "manual.py").exit_code == 0
    assert cli("rewrite", "--check", "--no-cache", "--fail-level", "warning", "manual.py").exit_code == 1
    assert cli("rewrite", "--check", "--no-cache", "train.py").exit_code == 1


# 3 ---------------------------------------------------------------------------------------------------
def test_force_exclude_applies_to_named_files_and_extend_exclude_is_honoured(xla_project):
    (xla_project / "vendor").mkdir()
    (xla_project / "vendor" / "lib.py").write_text(XLA)
    (xla_project / "gen_out.py").write_text(XLA)
    (xla_project / "pyproject.toml").write_text('[tool.neuron-migrate]\nexclude = ["vendor/"]\nextend-exclude = ["gen_*.py"]\n')
    walked = cli("audit", "--no-cache", "-f", "concise", ".").output
    assert "vendor/lib.py" not in walked and "gen_out.py" not in walked and "train.py" in walked
    named = cli("audit", "--no-cache", "-f", "concise", "vendor/lib.py", "train.py").output
    assert "vendor/lib.py" in named  # without --force-exclude a named file is checked
    forced = cli("rewrite", "--write", "--no-cache", "--force-exclude", "vendor/lib.py", "gen_out.py", "train.py")
    assert forced.exit_code == 0, forced.output
    assert (xla_project / "vendor" / "lib.py").read_text() == XLA and (xla_project / "gen_out.py").read_text() == XLA
    assert "mark_step" not in (xla_project / "train.py").read_text()
    only_vendor = cli("audit", "--no-cache", "--force-exclude", "vendor/lib.py")
    assert only_vendor.exit_code == 0  # pre-commit passing only excluded files: nothing to do, success
    assert "--force-exclude" in (REPO / ".pre-commit-hooks.yaml").read_text()
    (xla_project / "pkg").mkdir()
    (xla_project / "pkg" / "only.py").write_text(XLA)
    assert cli("audit", "--no-cache", "-f", "concise", "--extend-exclude", "only.py", "pkg").exit_code == 2  # nothing left


# 4 ---------------------------------------------------------------------------------------------------
def test_progress_bar_on_a_terminal_only(tmp_path):
    (tmp_path / ".git").mkdir()
    for i in range(30):
        (tmp_path / f"m{i}.py").write_text(XLA)
    shown = tty_run(["audit", "--no-cache", "-j", "1", "-f", "concise", "."], tmp_path)
    assert re.search(r"audit.*\d+/30", ANSI.sub("", shown)), shown[-2000:]
    piped = subprocess.run([sys.executable, "-m", "neuron_migrate", "audit", "--no-cache", "-j", "1", "-f", "concise", "."],
                           cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert "/30" not in piped.stderr and "\x1b" not in piped.stderr + piped.stdout


# 5 ---------------------------------------------------------------------------------------------------
def test_no_color_on_a_terminal_and_color_modes(xla_project):
    coloured = tty_run(["audit", "--no-cache", "train.py"], xla_project)
    assert "\x1b[" in coloured and "NM101" in coloured
    plain = tty_run(["audit", "--no-cache", "train.py"], xla_project, {"NO_COLOR": "1"})
    assert "\x1b[" not in plain.replace("\x1b[?25l", "").replace("\x1b[?25h", "") and "NM101" in plain
    never = tty_run(["audit", "--no-cache", "--color", "never", "train.py"], xla_project)
    assert "\x1b[3" not in never and "\x1b[1m" not in never
    always = subprocess.run([sys.executable, "-m", "neuron_migrate", "audit", "--no-cache", "--color", "always", "train.py"],
                            cwd=xla_project, capture_output=True, text=True, timeout=300)
    assert "\x1b[" in always.stdout
    assert cli("audit", "--color", "sometimes", "train.py").exit_code == 2


# 6 ---------------------------------------------------------------------------------------------------
def test_rules_formats_and_no_mid_word_breaks():
    assert cli("rules", "--format", "yaml").exit_code == 2
    r = subprocess.run([sys.executable, "-m", "neuron_migrate", "rules"], capture_output=True, text=True, timeout=120,
                       env={"COLUMNS": "80", "PATH": "/usr/bin:/bin"})
    from neuron_migrate.rules.registry import all_rules

    lines = r.stdout.splitlines()
    assert len(lines) == len(all_rules())
    for rule, line in zip(all_rules(), lines):
        assert line.startswith(rule.code) and rule.summary in line  # whole summary, on one line
    help_text = subprocess.run([sys.executable, "-m", "neuron_migrate", "probe", "--help"], capture_output=True,
                               text=True, timeout=120, env={"COLUMNS": "80", "PATH": "/usr/bin:/bin"}).stdout
    flat = " ".join(help_text.replace("│", " ").split())
    assert "Exit 1 when found (comma separated): fallback, float64, unsupported, unknown, partial, graph-break, compile." in flat


def test_statistics_marks_legend_and_total(tmp_path, monkeypatch):
    (tmp_path / ".git").mkdir()
    monkeypatch.chdir(tmp_path)
    # NM101 has a safe fix; NM401 only an unsafe one
    (tmp_path / "s.py").write_text("import torch\nimport torch_xla.core.xla_model as xm\nxm.mark_step()\n"
                                   "model = torch.compile(model, dynamic=True)\n")
    out = cli("audit", "--no-cache", "--statistics", "s.py").output
    rows = {m.group(1): line for line in out.splitlines() if (m := re.match(r"\s*\d+\s+(NM\d+)\s", line))}
    assert "[*]" in rows["NM101"] and "[*]" not in rows["NM401"] and "[-]" in rows["NM401"]
    assert re.search(r"Found \d+ findings of \d+ rules\.", out)
    assert "[*] every finding has a safe fix" in out and "[-] some can be fixed, or only with --unsafe-fixes" in out


# 7 ---------------------------------------------------------------------------------------------------
def test_bad_fail_level_and_jobs_fail_before_any_work(xla_project):
    r = cli("audit", "--fail-level", "bogus", "does-not-exist.py")
    assert r.exit_code == 2 and "--fail-level" in r.output and "does-not-exist" not in r.output
    for j in ("0", "-3"):
        r = cli("audit", "-j", j, "train.py")
        assert r.exit_code == 2 and "--jobs must be 1 or more" in r.output
        assert cli("rewrite", "-j", j, "train.py").exit_code == 2
    assert cli("rewrite", "--fail-level", "loud", "train.py").exit_code == 2


# 8 ---------------------------------------------------------------------------------------------------
def test_no_path_means_the_current_folder(xla_project):
    r = cli("audit", "--no-cache", "-f", "concise")
    assert r.exit_code == 1 and "train.py" in r.output
    r = cli("rewrite", "--no-cache")
    assert r.exit_code == 1 and "1 of 1 file would be rewritten" in r.output


# 9 ---------------------------------------------------------------------------------------------------
def test_suppressions_bare_noqa_names_and_case(xla_project):
    (xla_project / "s.py").write_text(
        "import torch\n"
        "a = torch.fft.irfft(x)  # noqa\n"
        "b = torch.fft.irfft(x)  # neuron-migrate: ignore[fft-transform]\n"
        "c = torch.fft.irfft(x)  # NOQA: nm302\n"
        "d = torch.fft.irfft(x)  # Neuron-Migrate: IGNORE[NM302]\n"
        "e = torch.fft.irfft(x)\n"
        "f = 1  # noqa\n"
    )
    from neuron_migrate.rules.registry import get_rule

    assert get_rule("fft-transform").code == "NM302"
    found = json.loads(cli("audit", "--no-cache", "-f", "json", "s.py").stdout)
    by_line = {(f["code"], f["location"]["row"]) for f in found}
    assert ("NM302", 6) in by_line
    assert not any(code == "NM302" and row < 6 for code, row in by_line)
    assert ("NM901", 7) not in by_line  # a bare noqa is flake8's and Ruff's too: not judged, not removed
    fixed = cli("rewrite", "--write", "--no-cache", "s.py")
    assert fixed.exit_code == 0, fixed.output
    assert (xla_project / "s.py").read_text().splitlines()[6] == "f = 1  # noqa"
    assert "# noqa" in (xla_project / "s.py").read_text().splitlines()[1]  # a used one stays


# 10 --------------------------------------------------------------------------------------------------
def test_sarif_reports_files_that_failed(xla_project, tmp_path):
    (xla_project / "broken.py").write_text("import torch_xla\ndef f(:\n")
    r = cli("audit", "--no-cache", "-f", "sarif", "train.py", "broken.py")
    assert r.exit_code == 2
    log = json.loads(r.stdout)
    inv = log["runs"][0]["invocations"][0]
    assert inv["executionSuccessful"] is False
    (note,) = inv["toolExecutionNotifications"]
    assert note["level"] == "error" and "syntax error" in note["message"]["text"]
    assert note["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "broken.py"
    assert log["runs"][0]["results"]  # the file that worked still has its results
    ok = json.loads(cli("audit", "--no-cache", "-f", "sarif", "train.py").stdout)
    assert ok["runs"][0]["invocations"][0] == {"executionSuccessful": True}


# 11 --------------------------------------------------------------------------------------------------
def test_closest_pyproject_applies(xla_project):
    (xla_project / "pyproject.toml").write_text('[tool.neuron-migrate]\nignore = ["NM101"]\n')
    sub = xla_project / "sub"
    sub.mkdir()
    (sub / "pyproject.toml").write_text('[tool.neuron-migrate]\nignore = ["NM102"]\n')
    (sub / "t.py").write_text(XLA)
    (xla_project / "other").mkdir()
    (xla_project / "other" / "pyproject.toml").write_text("[project]\nname = 'x'\n")  # no section: skipped
    (xla_project / "other" / "o.py").write_text(XLA)
    found = json.loads(cli("audit", "--no-cache", "-f", "json", ".").stdout)
    codes = {(f["location"]["path"], f["code"]) for f in found}
    assert ("train.py", "NM102") in codes and ("train.py", "NM101") not in codes
    assert ("sub/t.py", "NM101") in codes and ("sub/t.py", "NM102") not in codes
    assert ("other/o.py", "NM102") in codes and ("other/o.py", "NM101") not in codes
    one = json.loads(cli("audit", "--no-cache", "-f", "json", "sub/t.py").stdout)
    assert {f["code"] for f in one} >= {"NM101"} and "NM102" not in {f["code"] for f in one}


# 12 --------------------------------------------------------------------------------------------------
SPAWN = ("import torch_xla.distributed.xla_multiprocessing as xmp\n\n\ndef _mp_fn(i):\n    pass\n\n\n"
         "if __name__ == '__main__':\n    xmp.spawn(_mp_fn, args=())\n")


def test_rewrite_notes_are_deduplicated(xla_project):
    for i in range(6):
        (xla_project / f"job{i}.py").write_text(SPAWN)
    out = cli("rewrite", "--no-cache", "-j", "1", ".").output
    notes = [ln for ln in out.splitlines() if ln.startswith("  - ")]
    launch = [ln for ln in notes if "torchrun" in ln]
    assert len(launch) == 1, notes
    # job0.py:11: the launch block in the rewritten file (line 9 before the imports went in)
    assert "and 3 more:" in launch[0] and "job0.py:11" in launch[0] and "<script>" in launch[0]
    (xla_project / "job9.py").write_text(SPAWN)
    single = [ln for ln in cli("rewrite", "--no-cache", "job9.py").output.splitlines() if ln.startswith("  - ")]
    assert len(single) == 1 and single[0].endswith("job9.py")  # a note of one file names it


def test_table_show_cites_no_internal_path():
    out = subprocess.run([sys.executable, "-m", "neuron_migrate", "table", "show"], capture_output=True, text=True,
                         timeout=120).stdout
    assert out and "shared/" not in out and "research/" not in out


# 14 --------------------------------------------------------------------------------------------------
def test_file_size_limit_is_documented_and_configurable(xla_project):
    big = xla_project / "big.py"
    big.write_text(XLA + "# padding\n" * 300)
    r = cli("audit", "--no-cache", "--max-file-size", "1000", "big.py")
    assert r.exit_code == 2 and "file too large" in r.output and "max-file-size" in r.output
    (xla_project / "pyproject.toml").write_text("[tool.neuron-migrate]\nmax-file-size = 1000\n")
    assert "file too large" in cli("audit", "--no-cache", "big.py").output
    (xla_project / "pyproject.toml").write_text("[tool.neuron-migrate]\nmax-file-size = 100000\n")
    assert cli("audit", "--no-cache", "-f", "concise", "big.py").exit_code == 1  # checked: findings
    assert "max-file-size" in (REPO / "README.md").read_text()


# 15 --------------------------------------------------------------------------------------------------
def test_version_in_one_place_and_documented_rev_matches():
    import tomllib

    import neuron_migrate

    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert neuron_migrate.__version__ == version
    assert cli("--version").output.strip() == f"neuron-migrate {version}"
    assert "__version__ = \"" not in (REPO / "neuron_migrate" / "__init__.py").read_text()  # read from metadata
    readme = (REPO / "README.md").read_text()
    revs = set(re.findall(r"rev: (v[0-9][^\s]*)", readme + (REPO / ".pre-commit-hooks.yaml").read_text()))
    assert revs == {f"v{version}"}
    assert "Run it on your own repository" in readme


# 16 --------------------------------------------------------------------------------------------------
def test_all_files_gitignored_is_an_error_that_says_why(xla_project):
    (xla_project / ".gitignore").write_text("build/\n*.gen.py\n")
    (xla_project / "build").mkdir()
    (xla_project / "build" / "lib").mkdir()
    (xla_project / "build" / "lib" / "a.py").write_text(XLA)
    (xla_project / "build" / "b.gen.py").write_text(XLA)
    r = cli("rewrite", "--no-cache", "build")
    assert r.exit_code == 2
    assert "no Python files found in build" in r.output and "ignored by .gitignore" in r.output
    assert "--no-respect-gitignore" in r.output
    r = cli("rewrite", "--no-cache", "--no-respect-gitignore", "build")
    assert r.exit_code == 1 and "2 of 2 files would be rewritten" in r.output
    summary = cli("rewrite", "--no-cache", ".").output
    assert "Skipped 1 folder ignored by .gitignore" in summary
    empty = xla_project / "empty"
    empty.mkdir()
    assert cli("audit", "--no-cache", "empty").exit_code == 2


# 17 --------------------------------------------------------------------------------------------------
def test_summary_says_which_fix_safety_was_applied(xla_project):
    (xla_project / "u.py").write_text("import torch\nmodel = torch.compile(model, dynamic=True)\n")
    safe = cli("rewrite", "--no-cache", "--write", "train.py").output
    assert "Fixes applied: safe only." in safe
    (xla_project / "pyproject.toml").write_text("[tool.neuron-migrate]\nunsafe-fixes = true\n")
    r = cli("rewrite", "--no-cache", "--write", "u.py").output
    assert "Fixes applied: safe and unsafe (unsafe fixes on by `unsafe-fixes = true` in" in r and "pyproject.toml" in r
    (xla_project / "u.py").write_text("import torch\nmodel = torch.compile(model, dynamic=True)\n")
    r = cli("rewrite", "--no-cache", "--write", "--no-unsafe-fixes", "u.py").output
    assert "Fixes applied: safe only" in r and "1 more can be fixed with --unsafe-fixes" in r
