"""Data-driven rule tests: every rule has a folder tests/fixtures/rules/<CODE>/ of cases.

A case is `<name>.in.py` plus any of:
- `<name>.out.py`: what `rewrite` makes of it (and a second rewrite of the .out.py changes nothing);
- `<name>.findings`: the findings audit reports on the .in.py, one `CODE LINE` per line (all rules run).
A first line `# neuron-migrate-test: unsafe-fixes device-style=accelerator` sets options for the case.
"""
from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest

from neuron_migrate.rewrite.engine import fix_text
from neuron_migrate.rules.api import Settings
from neuron_migrate.rules.registry import RuleSet, all_rules
from neuron_migrate.rules.runner import check_text

RULE_FIXTURES = Path(__file__).parent / "fixtures" / "rules"
CASES = sorted(RULE_FIXTURES.glob("*/*.in.py"))


def _settings(text: str) -> Settings:
    first = text.splitlines()[0] if text else ""
    opts = first.split("neuron-migrate-test:", 1)[1].split() if "neuron-migrate-test:" in first else []
    s = Settings()
    for o in opts:
        if o == "unsafe-fixes":
            s.unsafe_fixes = True
        elif o.startswith("device-style="):
            s.device_style = o.split("=", 1)[1]
    return s


def _case_id(p: Path) -> str:
    return f"{p.parent.name}/{p.name[: -len('.in.py')]}"


@pytest.fixture(scope="module")
def ruleset():
    return RuleSet(all_rules())  # every rule, opt-in advice included


@pytest.mark.parametrize("case", [c for c in CASES if c.with_name(c.name.replace(".in.py", ".out.py")).exists()], ids=_case_id)
def test_rewrite_matches_expected(case: Path, ruleset):
    out_path = case.with_name(case.name.replace(".in.py", ".out.py"))
    text = case.read_text()
    settings = _settings(text)
    got = fix_text(text, str(case), ruleset, settings).text
    assert got == out_path.read_text(), f"rewrite of {case.name} differs from {out_path.name}"


@pytest.mark.parametrize("case", [c for c in CASES if c.with_name(c.name.replace(".in.py", ".out.py")).exists()], ids=_case_id)
def test_output_is_fixed_point(case: Path, ruleset):
    out_path = case.with_name(case.name.replace(".in.py", ".out.py"))
    text = out_path.read_text()
    ast.parse(text)
    again = fix_text(text, str(out_path), ruleset, _settings(case.read_text())).text
    assert again == text, f"a second rewrite changed {out_path.name}"


def test_every_case_is_checked():
    """A case with neither an expected rewrite nor expected findings would check nothing."""
    for c in CASES:
        assert c.with_name(c.name.replace(".in.py", ".out.py")).exists() or c.with_name(c.name.replace(".in.py", ".findings")).exists(), c


@pytest.mark.parametrize("case", [c for c in CASES if c.with_name(c.name.replace(".in.py", ".findings")).exists()], ids=_case_id)
def test_findings_match_expected(case: Path, ruleset):
    expected_file = case.with_name(case.name.replace(".in.py", ".findings"))
    expected = Counter()
    for line in expected_file.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            code, lineno = line.split()[:2]
            expected[(code, int(lineno))] += 1
    text = case.read_text()
    findings = check_text(text, str(case), ruleset, _settings(text)).findings
    assert not [f for f in findings if f.message.startswith("internal error")]  # no rule raised (issue 38)
    got = Counter((f.rule.code, f.span.line) for f in findings)
    assert got == expected


def test_every_rule_has_fixtures_docs_and_examples():
    # launcher and dependency rules (language shell/deps) have their cases in tests/test_text_rule_fixtures.py
    for r in [r for r in all_rules() if r.language == "python"]:
        folder = RULE_FIXTURES / r.code
        assert folder.is_dir() and list(folder.glob("*.in.py")), f"{r.code} has no fixture cases in {folder}"
        assert r.docs and r.summary, f"{r.code} lacks docs"
        assert r.examples, f"{r.code} lacks an example"
        if r.fix_safety.value != "none":
            assert list(folder.glob("*.out.py")), f"{r.code} has a fix but no .out.py case"


# Examples in rule docs leave out the usual imports; these are the aliases they assume.
EXAMPLE_PREAMBLE = """\
import os
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.distributed as dist
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.runtime as xr
import torch_xla.distributed.xla_multiprocessing as xmp
import torch_xla.distributed.parallel_loader as pl
import torch_xla.debug.metrics as met
import torch_xla.amp
"""


def test_rule_examples_trigger_their_rule():
    """Each documented example's `before` really triggers the rule it documents."""
    for r in [r for r in all_rules() if r.language == "python"]:
        for ex in r.examples:
            res = check_text(EXAMPLE_PREAMBLE + ex.before + "\n", "<example>", RuleSet([r]), Settings(unsafe_fixes=True))
            assert res.findings, f"{r.code} example does not trigger the rule:\n{ex.before}"


def test_rules_reference_page_is_current():
    """docs/rules.md is generated from the registry (one definition feeds the docs)."""
    from neuron_migrate.cli.rules import rules_markdown

    page = Path(__file__).resolve().parents[1] / "docs" / "rules.md"
    assert page.read_text() == rules_markdown(all_rules()), "regenerate: neuron-migrate rules --format markdown > docs/rules.md"


def test_no_expected_rewrite_writes_torch_neuron():
    """`torch.neuron.*` exists only where torch-neuronx is installed: migrated code seeds with torch.manual_seed and
    reaches the device generator through torch.get_device_module(), so that it also runs on a machine without
    Trainium (issue 38). Only code that already used torch.neuron keeps it."""
    for case in CASES:
        out = case.with_name(case.name.replace(".in.py", ".out.py"))
        if out.exists() and "torch.neuron." not in case.read_text():
            assert "torch.neuron." not in out.read_text(), out
