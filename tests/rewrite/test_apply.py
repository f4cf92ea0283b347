"""The fix applier on its own: f-strings, call arguments with comments, not-equal, else removal."""
from __future__ import annotations

import ast

from neuron_migrate.rewrite.engine import fix_text
from neuron_migrate.rules.api import Settings
from neuron_migrate.rules.registry import RuleSet

RULES = RuleSet.select()


def _fix(text: str, unsafe: bool = True):
    return fix_text(text, "t.py", RULES, Settings(unsafe_fixes=unsafe))


def test_fix_that_cannot_go_into_a_nested_fstring_stays_a_finding():
    text = ("import torch_xla.core.xla_model as xm\n"
            "d = xm.xla_device()\n"
            "print(f\"nested {f'{xm.xla_device()}'}\")\n")
    out = _fix(text)
    ast.parse(out.text)
    assert "d = torch.device(\"neuron\")" in out.text  # the other fix still applied
    assert "f'{xm.xla_device()}'" in out.text
    left = [f.span.line for f in out.remaining if f.rule.code == "NM102"]
    assert len(left) == 1 and "f'{xm.xla_device()}'" in out.text.splitlines()[left[0] - 1]


def test_multiline_call_arguments_keep_comments_and_layout():
    text = ("import torch_xla.core.xla_model as xm\n\n\n"
            "def train(loss, step, log_fn):\n"
            "    for i in range(3):\n"
            "        xm.add_step_closure(log_fn, (loss,  # the loss\n"
            "                                     step))  # and step\n")
    out = _fix(text).text
    assert "        log_fn(loss,  # the loss\n               step)  # and step\n" in out


def test_src_relative_keeps_comments_and_reindents_to_the_statement():
    from neuron_migrate.names.analysis import Analysis
    from neuron_migrate.rules.api import Ctx

    text = ("def f():\n"
            "    if True:\n"
            "        x = g(a,  # first\n"
            "              '''multi\n"
            "   line''',\n"
            "              b)\n")
    a = Analysis(text)
    call = a.tree.body[0].body[0].body[0].value
    ctx = Ctx(a)
    assert ctx.src_relative(call) == "g(a,  # first\n      '''multi\n   line''',\n      b)"
    assert ctx.args_src(call) == "a,  # first\n      '''multi\n   line''',\n      b"
