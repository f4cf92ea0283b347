"""NM150's fix (rules/builtin/xla_spmd_fixes.py) is all or nothing per file: a program with any SPMD use it cannot
rewrite keeps every SPMD call as it was (no half-migrated single-controller program), and the finding at the use that
blocks says which part needs a human. The cases are the blocked_* fixtures of tests/fixtures/rules/NM150 (their
findings are checked by tests/test_rule_fixtures.py); the rewritten shapes run under torchrun in
tests/integration/test_spmd_rewrite.py."""
from __future__ import annotations

from pathlib import Path

import pytest

from neuron_migrate.rewrite.engine import fix_text
from neuron_migrate.rules.api import Settings
from neuron_migrate.rules.registry import RuleSet, all_rules
from neuron_migrate.rules.runner import check_text

CASES = Path(__file__).resolve().parents[1] / "fixtures" / "rules" / "NM150"
BLOCKED = {
    "blocked_manual": (14, "`enable_manual_sharding` has no rewrite"),
    "blocked_both": (11, "the batch and the weights are both sharded"),
    "blocked_activation": (18, "a sharding annotation inside the model"),
    "blocked_optimizer_first": (12, "an optimizer is built before the sharding"),
    "blocked_wrap_policy": (19, "FSDPv2's auto_wrap_policy is not functools.partial(transformer_auto_wrap_policy"),
    "spmd": (11, "the model whose gradients DDP must average was not found"),
}


@pytest.fixture(scope="module")
def ruleset():
    return RuleSet(all_rules())


@pytest.mark.parametrize("name", sorted(BLOCKED))
def test_blocked_program_keeps_every_spmd_call_and_says_why(name, ruleset):
    path = CASES / f"{name}.in.py"
    text = path.read_text()
    settings = Settings(unsafe_fixes=True)
    line, why = BLOCKED[name]
    findings = [f for f in check_text(text, str(path), ruleset, settings).findings if f.rule.code == "NM150"]
    said = [f for f in findings if "--unsafe-fixes leaves this file's SPMD program as it is" in f.message]
    assert [f.span.line for f in said] == [line] and why in said[0].message, [(f.span.line, f.message) for f in said]
    assert all(f.fix is None for f in findings)
    out = fix_text(text, str(path), ruleset, settings).text
    for call in ("use_spmd()", "global_runtime_device_count()", "xs.Mesh(", "mark_sharding("):
        assert text.count(call) == out.count(call), call


def test_audit_without_unsafe_fixes_offers_the_fix(ruleset):
    """Audit (no --unsafe-fixes) reports the data-parallel program's SPMD calls with the fix at the first one,
    marked unsafe; rewrite without --unsafe-fixes leaves the SPMD calls."""
    path = CASES / "data_parallel.in.py"
    text = path.read_text().split("\n", 1)[1]  # without the test-options line
    findings = [f for f in check_text(text, str(path), ruleset, Settings()).findings if f.rule.code == "NM150"]
    fixed = [f for f in findings if f.fix is not None]
    assert len(fixed) == 1 and fixed[0].fix.safety.value == "unsafe" and "use_spmd" in fixed[0].message
    assert "DistributedDataParallel" in fixed[0].note
    out = fix_text(text, str(path), ruleset, Settings()).text
    assert "xs.mark_sharding(data" in out and "xr.use_spmd()" in out
