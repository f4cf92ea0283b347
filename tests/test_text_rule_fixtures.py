"""Data-driven tests for the launcher and dependency rules (NM5xx, NM6xx), like tests/test_rule_fixtures.py.

A case is `tests/fixtures/rules/<CODE>/<case>.in.<NAME>` where NAME is the file name the case stands for when it is
a bare name (`Dockerfile`, `requirements.txt`, `pyproject.toml`, `setup.py`, `setup.cfg`, `environment.yml`, `.env`,
`job.yaml`), else an extension (`sh`, `slurm`, `sbatch`, `bash`); plus `<case>.out.<NAME>` (the rewrite, which a
second rewrite leaves unchanged) and/or `<case>.findings` (`CODE LINE` per line, all rules run). One of the first
three lines containing `neuron-migrate-test: unsafe-fixes` turns unsafe fixes on. Cases are copied into a temporary folder
under their real name, next to any `<case>.<script>.py` helper files (the scripts a launcher starts).
"""
from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest

from neuron_migrate.files.discover import file_kind
from neuron_migrate.rules.api import Settings
from neuron_migrate.rules.registry import RuleSet, all_rules
from neuron_migrate.pipeline.text_files import parser_for as _parser
from neuron_migrate.rules.text_runner import check_doc, fix_doc_text

FIXTURES = Path(__file__).parent / "fixtures" / "rules"
CASES = sorted(p for p in FIXTURES.glob("NM[56]*/*.in.*"))
BARE = ("Dockerfile", "requirements.txt", "pyproject.toml", "setup.py", "setup.cfg", "environment.yml", ".env", "job.yaml",
        "requirements-dev.txt", "workflow.yml")


def _split(case: Path) -> tuple[str, str]:
    stem, name = case.name.split(".in.", 1)
    return stem, name if name in BARE else f"{stem}.{name}"


def _out(case: Path) -> Path:
    return case.with_name(case.name.replace(".in.", ".out.", 1))


def _stage(case: Path, tmp_path: Path, text: str | None = None) -> Path:
    stem, real = _split(case)
    for helper in case.parent.glob(f"{stem}.*.py"):
        shutil.copy(helper, tmp_path / helper.name[len(stem) + 1:])
    target = tmp_path / real
    target.write_text(case.read_text() if text is None else text)
    return target


def _settings(text: str) -> Settings:
    head = "\n".join(text.splitlines()[:3])
    return Settings(unsafe_fixes="neuron-migrate-test: unsafe-fixes" in head)


@pytest.fixture(scope="module")
def ruleset():
    return RuleSet.select()


def _ids(p: Path) -> str:
    return f"{p.parent.name}/{p.name}"


@pytest.mark.parametrize("case", [c for c in CASES if _out(c).exists()], ids=_ids)
def test_rewrite_matches_expected_and_is_fixed_point(case: Path, ruleset, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    target = _stage(case, tmp_path)
    kind = file_kind(target.name)
    text = target.read_text()
    got = fix_doc_text(text, target.name, _parser(kind), ruleset, _settings(text))[0]
    assert got == _out(case).read_text(), f"rewrite of {case.name} differs from {_out(case).name}"
    again = fix_doc_text(got, target.name, _parser(kind), ruleset, _settings(text))[0]
    assert again == got, f"a second rewrite changed {_out(case).name}"


@pytest.mark.parametrize("case", [c for c in CASES if c.with_name(_split(c)[0] + ".findings").exists()], ids=_ids)
def test_findings_match_expected(case: Path, ruleset, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    target = _stage(case, tmp_path)
    expected = Counter()
    for line in case.with_name(_split(case)[0] + ".findings").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            code, lineno = line.split()[:2]
            expected[(code, int(lineno))] += 1
    text = target.read_text()
    doc = _parser(file_kind(target.name))(text, target.name)
    got = Counter((f.rule.code, f.span.line) for f in check_doc(doc, ruleset, _settings(text)).findings)
    assert got == expected


def test_every_case_is_checked():
    for c in CASES:
        assert _out(c).exists() or c.with_name(_split(c)[0] + ".findings").exists(), c


def test_every_text_rule_has_fixtures_docs_and_examples():
    rules = [r for r in all_rules() if r.language != "python"]
    assert {r.code[:3] for r in rules} == {"NM5", "NM6"}
    for r in rules:
        folder = FIXTURES / r.code
        cases = [c for c in CASES if c.parent == folder]
        assert cases, f"{r.code} has no fixture cases in {folder}"
        assert r.docs and r.summary and r.examples, r.code
        if r.fix_safety.value != "none":
            assert any(_out(c).exists() for c in cases), f"{r.code} has a fix but no .out case"


EXAMPLE_FILE = {"shell": "run.sh", "deps": "requirements.txt"}


def test_rule_examples_trigger_their_rule(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("import torch_xla.distributed.xla_multiprocessing as xmp\nxmp.spawn(print, args=())\n")
    for r in [r for r in all_rules() if r.language != "python"]:
        for ex in r.examples:
            name = EXAMPLE_FILE[r.language]
            if "[project]" in ex.before:
                name = "pyproject.toml"
            elif "setup(" in ex.before:
                name = "setup.py"
            doc = _parser(file_kind(name))(ex.before, name)
            res = check_doc(doc, RuleSet([r]), Settings(unsafe_fixes=True))
            assert any(f.rule.code == r.code for f in res.findings), f"{r.code} example does not trigger:\n{ex.before}"
            if ex.after is not None:
                got = fix_doc_text(ex.before, name, _parser(file_kind(name)), RuleSet([r]), Settings(unsafe_fixes=True))[0]
                assert got.strip() == ex.after.strip(), f"{r.code} example rewrite differs:\n{got}"


def test_python_rules_do_not_run_on_launchers_and_launcher_rules_not_on_python(ruleset, tmp_path):
    from neuron_migrate.pipeline.process import process_file

    sh = tmp_path / "run.sh"
    sh.write_text('python -c "import torch_xla.core.xla_model as xm; xm.mark_step()"\n# os.environ["PJRT_DEVICE"] = "NEURON"\n')
    res = process_file(str(sh), ruleset, Settings(), fix=False)
    assert not res.error and not [f for f in res.findings if f.rule.language != "shell"]
    py = tmp_path / "cfg.py"
    py.write_text('X = "export PJRT_DEVICE=NEURON"\nREQ = "torch-xla==2.1"\n')
    res = process_file(str(py), ruleset, Settings(), fix=False)
    assert not [f for f in res.findings if f.rule.language != "python"]
