"""`neuron-migrate audit`: output formats, exit codes, errors, the table option, never importing torch."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SAMPLE = Path(__file__).parent / "sample"
REPO = Path(__file__).resolve().parents[2]


def audit(*args, cwd=SAMPLE):
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "neuron_migrate", "audit", "--no-cache", *args],
                          cwd=cwd, capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture(scope="module")
def json_findings():
    r = audit(".", "--output-format", "json")
    assert r.returncode == 1, r.stderr
    return json.loads(r.stdout)


def test_text_output_groups_by_file_with_frames_and_summary():
    r = audit(".")
    assert r.returncode == 1
    out = r.stdout
    assert "pkg/train.py (7 findings)" in out
    assert "pkg/train.py:16:9: NM101 [*] xm.mark_step()" in out
    assert "     16 |         xm.mark_step()" in out  # code frame
    assert "NM401 [unsafe fix]" in out
    assert "Found 7 findings (2 errors, 4 warnings, 1 info) in 1 of 2 files." in out
    assert "3 fixable with `neuron-migrate rewrite --write`" in out
    assert "clean.py" not in out


def test_json_fields_and_order(json_findings):
    got = [(f["location"]["path"], f["location"]["row"], f["location"]["column"], f["code"]) for f in json_findings]
    assert got == sorted(got)
    assert [f["code"] for f in json_findings] == ["NM102", "NM401", "NM305", "NM304", "NM101", "NM322", "NM901"]
    first = json_findings[0]
    assert set(first) >= {"code", "name", "message", "severity", "location", "fix", "url"}
    assert first["location"] == {"path": "pkg/train.py", "row": 8, "column": 14, "end": {"row": 8, "column": 29}}
    assert first["fix"]["applicability"] == "safe"
    assert first["fix"]["edits"][0]["content"] == 'torch.device("neuron")'
    by_code = {f["code"]: f for f in json_findings}
    assert by_code["NM401"]["fix"]["applicability"] == "unsafe"
    assert by_code["NM305"]["fix"] is None and by_code["NM305"]["severity"] == "warning"
    assert by_code["NM322"]["severity"] == "error"
    assert by_code["NM305"]["url"].endswith("#nm305")
    # suppressed findings are absent: NM310 on line 17 (noqa)
    assert not any(f["code"] == "NM310" for f in json_findings)


def test_json_is_stable():
    a = audit(".", "-f", "json", "-j", "1").stdout
    b = audit(".", "-f", "json", "-j", "1").stdout
    assert a == b


def test_sarif_has_what_github_requires(tmp_path):
    out = tmp_path / "r.sarif"
    r = audit(".", "-f", "sarif", "-o", str(out))
    assert r.returncode == 1 and r.stdout == ""
    log = json.loads(out.read_text())
    assert log["version"] == "2.1.0"
    assert log["$schema"].endswith("sarif-2.1.0.json")
    run = log["runs"][0]
    driver = run["tool"]["driver"]
    assert driver["name"] == "neuron-migrate"
    ids = [rule["id"] for rule in driver["rules"]]
    assert len(ids) == len(set(ids)) and "NM301" in ids and "NM101" in ids
    for rule in driver["rules"]:
        assert rule["shortDescription"]["text"] and rule["helpUri"].startswith("https://")
        assert rule["defaultConfiguration"]["level"] in ("error", "warning", "note")
    results = run["results"]
    assert len(results) == 7
    fps = set()
    for res in results:
        assert res["ruleId"] in ids and ids[res["ruleIndex"]] == res["ruleId"]
        assert res["message"]["text"]
        loc = res["locations"][0]["physicalLocation"]
        uri = loc["artifactLocation"]["uri"]
        # repo-relative (this sample lives inside the neuron-migrate git work tree)
        assert uri == "tests/audit/sample/pkg/train.py", uri
        assert loc["region"]["startLine"] >= 1 and loc["region"]["startColumn"] >= 1
        fp = res["partialFingerprints"]["primaryLocationLineHash"]
        assert fp not in fps
        fps.add(fp)
    levels = {res["ruleId"]: res["level"] for res in results}
    assert levels["NM322"] == "error" and levels["NM901"] == "note" and levels["NM101"] == "warning"


def test_github_annotations():
    r = audit(".", "-f", "github")
    lines = r.stdout.splitlines()
    assert len(lines) == 7
    assert lines[0].startswith("::warning file=pkg/train.py,line=8,col=14,endLine=8,endColumn=29,title=NM102 xla-device::NM102 [fixable]")
    assert any(l.startswith("::error file=pkg/train.py,line=19,") for l in lines)
    assert any(l.startswith("::notice ") for l in lines)


def test_concise_and_statistics():
    r = audit(".", "-f", "concise")
    assert r.stdout.splitlines()[0] == 'pkg/train.py:8:14: NM102 [*] XLA device: becomes torch.device("neuron")'
    assert "|" not in r.stdout  # no code frames
    s = audit(".", "-f", "json", "--statistics")
    rows = json.loads(s.stdout)
    assert {"code": "NM101", "name": "mark-step", "count": 1, "fixable": 1, "safe_fixable": 1, "severity": "warning"} in rows
    t = audit(".", "--statistics")
    assert "NM322" in t.stdout and "barrier-subgroup" in t.stdout and "Found 7 findings of 7 rules." in t.stdout
    assert "|" not in t.stdout  # counts, not findings


def test_exit_codes(tmp_path):
    assert audit("clean.py").returncode == 0
    assert "No findings in 1 file." in audit("clean.py").stdout
    assert audit(".", "--exit-zero").returncode == 0
    assert audit(".", "--select", "NM3", "--ignore", "NM305,NM304,NM322").returncode == 0
    bad = tmp_path / "broken.py"
    bad.write_text("import torch\ndef f(:\n")
    r = audit(str(bad), "clean.py", "--exit-zero")
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    err = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(err) == 1 and "broken.py" in err[0] and "syntax error line 2" in err[0]
    assert audit("clean.py", "-f", "yaml").returncode == 2
    assert audit("does-not-exist.py").returncode == 2


def test_audit_never_imports_torch_or_the_user_code(tmp_path):
    user = tmp_path / "user.py"
    user.write_text("import torch\nraise SystemExit('executed!')\nx = torch.zeros(3, dtype=torch.float64)\n")
    code = (
        "import sys\n"
        "from neuron_migrate.cli.app import main\n"
        f"sys.argv = ['neuron-migrate', 'audit', '--no-cache', '-f', 'json', {str(user)!r}]\n"
        "try:\n    main()\nexcept SystemExit as e:\n    rc = e.code\n"
        "print('RC', rc, 'torch' in sys.modules)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.stdout.strip().endswith("RC 1 False"), r.stdout + r.stderr
    assert '"NM304"' in r.stdout


def test_table_option_selects_the_table(tmp_path):
    from neuron_migrate.table import available_tables

    src = tmp_path / "ops.py"
    src.write_text("import torch\n\ny = torch.atan2(a, b)\n")
    r = audit(str(src), "-f", "concise")
    assert "NM310" in r.stdout
    table = tmp_path / "custom.yaml"
    table.write_text(
        f"extends: {available_tables()[-1]}\n"
        "version: custom\nsources:\n  me:\n    url: null\n    kind: community\n    confidence: low\n"
        "entries:\n- name: aten::atan2\n  kind: aten_op\n  status: unsupported\n  source: me\n"
    )
    r = audit(str(src), "-f", "concise", "--table", str(table))
    assert r.returncode == 1 and "NM311" in r.stdout and "NM310" not in r.stdout
    broken = tmp_path / "broken.yaml"
    broken.write_text("entries: [\n")
    r = audit(str(src), "--table", str(broken))
    assert r.returncode == 2 and "--table" in r.stderr and "Traceback" not in r.stderr


def test_table_is_loaded_only_for_relevant_sites(monkeypatch):
    import neuron_migrate.table as table_mod
    from neuron_migrate.rules.builtin import compat
    from neuron_migrate.rules.registry import RuleSet
    from neuron_migrate.rules.runner import check_text

    calls = []
    real = table_mod.load_table

    def spy(path=None):
        calls.append(path)
        return real(path)

    monkeypatch.setattr(table_mod, "load_table", spy)
    monkeypatch.setattr(compat, "_STATUS_CACHE", {})
    rs = RuleSet.select()
    check_text("import os\nimport torch_xla.core.xla_model as xm\nxm.mark_step()\nprint(os.sep)\n", "a.py", rs)
    assert calls == []
    res = check_text("import torch\ny = torch.atan2(a, b)\n", "b.py", rs)
    assert calls and [f.rule.code for f in res.findings] == ["NM310"]


def test_fail_level_decides_which_findings_fail(tmp_path):
    from typer.testing import CliRunner

    from neuron_migrate.cli.app import app

    f = tmp_path / "c.py"
    f.write_text("import torch\nmodel = torch.compile(torch.nn.Linear(2, 2))\n")  # info-level advice only
    run = lambda *a: CliRunner().invoke(app, ["audit", "--no-cache", "-f", "concise", *a, str(f)])
    assert run().exit_code == 0 and "NM404" not in run().output  # opinionated advice is opt-in
    assert run("--extend-select", "NM404").exit_code == 0 and "NM404" in run("--extend-select", "NM404").output
    assert run("--extend-select", "NM404", "--fail-level", "info").exit_code == 1
    assert run("--extend-select", "NM404", "--fail-level", "warning").exit_code == 0
    f.write_text("import torch\nx = torch.ones(2).double()\n")  # a warning
    assert run("--fail-level", "warning").exit_code == 1
    assert run("--fail-level", "error").exit_code == 0
    assert run("--fail-level", "loud").exit_code == 2


@pytest.mark.parametrize("wrap, imports", [
    ("DDP(model)", "from torch.nn.parallel import DistributedDataParallel as DDP\n"),
    ("FSDP(model)", "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\n"),
])
def test_optimizer_step_message_names_no_wrapper_the_model_is_not_in(wrap, imports):
    """NM110 on a model always wrapped in DDP or FSDP: the step becomes optimizer.step(), and the message says the
    wrapper averages the gradients without calling an FSDP model DDP."""
    from neuron_migrate.rules.registry import RuleSet
    from neuron_migrate.rules.runner import check_text

    text = ("import torch\nimport torch.distributed as dist\nimport torch_xla.core.xla_model as xm\n" + imports +
            "\n\ndef main():\n    dist.init_process_group('xla')\n    model = torch.nn.Linear(2, 2)\n"
            f"    model = {wrap}\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "    model(torch.ones(2)).sum().backward()\n    xm.optimizer_step(opt)\n")
    res = check_text(text, "train.py", RuleSet.select())
    [f] = [f for f in res.findings if f.rule.code == "NM110"]
    assert f.fix is not None and "always wrapped in DDP/FSDP" in f.message
    assert "the wrapper averages the gradients" in f.message and "DDP averages" not in f.message
