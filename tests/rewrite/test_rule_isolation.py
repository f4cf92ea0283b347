"""Issue 38, point 1: one rule's failure never costs the rest of the file.

A rule that raises while checking, or whose fix cannot be applied or gives invalid Python, loses its own findings
and fixes in that file, with one internal-error finding at the line of the node it failed on; every other rule's
findings are reported and their fixes applied.
"""
from __future__ import annotations

from neuron_migrate.rewrite.engine import fix_text
from neuron_migrate.rules.api import Settings
from neuron_migrate.rules.model import FixSafety, Rule, Severity
from neuron_migrate.rules.registry import RuleSet, all_rules
from neuron_migrate.rules.runner import check_text

SRC = """\
import torch
import torch_xla.core.xla_model as xm

d = xm.xla_device()
x = torch.ones(2)
xm.mark_step()


def f(model):
    return xm.get_ordinal()
"""


def _rule(check, trigger=("call", "torch_xla.core.xla_model.xla_device"), safety=FixSafety.NONE, code="NM998"):
    return Rule(code, "test-rule", "a test rule", safety, Severity.WARNING, "doc", triggers=[trigger, ("call", "torch_xla.core.xla_model.get_ordinal")],
                check=check, trigger_words=("torch_xla",))


def _inner(node, ctx):
    helper_node = node.args[0]  # noqa: F841 - what the rule was working on, held by this frame
    raise KeyError("boom")


def test_a_rule_that_raises_loses_its_findings_and_gets_one_at_the_failing_node():
    import ast

    def check(site, ctx):
        if site.key.endswith("xla_device"):
            return ctx.finding(site.node, "first site: fine")
        # the second site: the rule raises while looking at a lambda's body, four lines below the site
        lam = next(n for n in ast.walk(ctx.analysis.tree) if isinstance(n, ast.Lambda))
        _inner(lam.body, ctx)

    src = SRC + "\n\nwrap = lambda m: print(\n    m,\n    xm.get_ordinal(m),\n)\n"
    bad = _rule(check)
    res = check_text(src, "t.py", RuleSet([bad, *all_rules()]))
    mine = [f for f in res.findings if f.rule.code == "NM998"]
    assert [f.message.split(" (")[0] for f in mine] == ["internal error in rule NM998 at line 14"]  # not "first site"
    assert mine[0].span.line == 14  # `m` inside the lambda's body: the node the rule held, not its site (line 10)
    assert "KeyError" in mine[0].message
    assert {"NM101", "NM102"} <= {f.rule.code for f in res.findings}  # the other rules still report


def test_the_other_rules_still_rewrite_the_file():
    def check(site, ctx):
        raise ValueError("bug")

    out = fix_text(SRC, "t.py", RuleSet([_rule(check), *all_rules()]))
    assert "mark_step" not in out.text and 'torch.device("neuron")' in out.text
    crash = [f for f in out.remaining if f.rule.code == "NM998"]
    assert len(crash) == 1 and crash[0].message.startswith("internal error in rule NM998")


def test_a_fix_that_gives_invalid_python_is_left_out_alone(monkeypatch):
    """A fix whose output does not parse (found when the next round re-parses it): that round is done again
    without the rule."""
    from neuron_migrate.rewrite import apply

    real = apply.apply_fixes

    def check(site, ctx):
        fx = ctx.fixer("safe")
        fx.replace(site.node, "torch.zeros(2)")
        return ctx.finding(site.node, "bad fix", fix=fx.build())

    def apply_fixes(text, fixes, *args, **kwargs):
        new, applied = real(text, fixes, *args, **kwargs)
        if any("torch.zeros" in e.text for f in applied for e in f.edits):
            new += "this is not ) Python\n"  # what a broken fix's text would give
        return new, applied

    monkeypatch.setattr(apply, "apply_fixes", apply_fixes)
    out = fix_text(SRC, "t.py", RuleSet([_rule(check, ("call", "torch.ones"), FixSafety.SAFE), *all_rules()]))
    assert "mark_step" not in out.text and 'torch.device("neuron")' in out.text  # the other fixes are applied
    assert "zeros" not in out.text and "not )" not in out.text
    compile(out.text, "t.py", "exec")
    crash = [f for f in out.remaining if f.rule.code == "NM998"]
    assert len(crash) == 1 and "internal error in rule NM998" in crash[0].message
    assert "invalid Python" in crash[0].message
    assert out.text.splitlines()[crash[0].span.line - 1] == "x = torch.ones(2)"  # the failing fix's line
    assert "NM998" not in out.applied and out.applied["NM101"] == 1


def test_a_fix_that_raises_while_applied_is_left_out_alone():
    from neuron_migrate.rules.model import Edit, Fix, Span

    def check(site, ctx):
        # an edit past the end of the file: the applier cannot place it
        return ctx.finding(site.node, "bad fix", fix=Fix(FixSafety.SAFE, [Edit("replace", Span(400, 0, 400, 3), "x")]))

    out = fix_text(SRC, "t.py", RuleSet([_rule(check, ("call", "torch.ones"), FixSafety.SAFE), *all_rules()]))
    assert "mark_step" not in out.text and 'torch.device("neuron")' in out.text
    crash = [f for f in out.remaining if f.rule.code == "NM998"]
    assert len(crash) == 1 and "internal error in rule NM998" in crash[0].message


def test_nm151_reads_a_lambda_wrap():
    """pytorch/xla's FSDP tests wrap with `fsdp_wrap = lambda m: FSDP(m, ..., auto_wrap_policy=policy)`: NM151 read
    the lambda's body as a statement list and raised."""
    src = (
        "import torch_xla.core.xla_model as xm\n"
        "from torch_xla.distributed.fsdp import XlaFullyShardedDataParallel as FSDP\n"
        "\n"
        "def build(model):\n"
        "    policy = None\n"
        "    fsdp_wrap = lambda m: FSDP(m, auto_wrap_policy=policy)\n"
        "    return fsdp_wrap(model).to(xm.xla_device())\n"
    )
    res = check_text(src, "t.py", RuleSet(all_rules()), Settings())
    assert not [f for f in res.findings if "internal error" in f.message]
    assert [f.span.line for f in res.findings if f.rule.code == "NM151"] == [2, 6]
