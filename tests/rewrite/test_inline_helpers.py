"""Issue 38, point 7: a rank / world-size / barrier helper used once or twice in a file is written as its one-line
native form instead (`dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", 0))`); used more
often, or by another helper, it stays a helper."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from neuron_migrate.rewrite.engine import fix_text
from neuron_migrate.rules.api import Settings
from neuron_migrate.rules.registry import RuleSet, all_rules

HEAD = "import torch\nimport torch_xla.core.xla_model as xm\n\n\n"


@pytest.fixture(scope="module")
def ruleset():
    return RuleSet([r for r in all_rules() if not r.opt_in])


def _fix(body: str, ruleset) -> str:
    return fix_text(HEAD + body, "t.py", ruleset, Settings()).text


def test_twice_is_inlined(ruleset):
    out = _fix("def log(msg):\n    if xm.get_ordinal() == 0:\n        print(msg, xm.xrt_world_size())\n"
               "    rank = xm.get_ordinal()\n    xm.rendezvous('done')\n    return rank\n", ruleset)
    assert "def _neuron" not in out
    assert '    if (dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", 0))) == 0:\n' in out
    assert '        print(msg, (dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", 1))))\n' in out
    assert '    rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", 0))\n' in out
    assert "    if dist.is_initialized():\n        dist.barrier()\n    return rank\n" in out
    compile(out, "t.py", "exec")


def test_three_times_or_in_an_fstring_stays_a_helper(ruleset):
    out = _fix("def f():\n    return xm.get_ordinal(), xm.get_ordinal(), xm.get_ordinal()\n", ruleset)
    assert "def _neuron_rank():" in out and out.count("_neuron_rank()") == 4
    out = _fix("def f():\n    return f\"rank {xm.get_ordinal()}\"\n", ruleset)
    assert "def _neuron_rank():" in out


def test_a_helper_another_helper_calls_stays(ruleset):
    out = _fix("def f(msg, err):\n    xm.master_print(msg, fd=err)\n    return xm.get_ordinal()\n", ruleset)
    assert "def _neuron_rank():" in out and "def _neuron_master_print(" in out


def test_plain_master_prints_are_the_guarded_print(ruleset):
    """xm.master_print of plain values, once or twice, without fd=/local=/flush=: the `if` one writes by hand. A value
    that calls something stays behind the helper (inlined, only rank 0 would evaluate it)."""
    out = _fix("def f(msg, step):\n    xm.master_print(msg)\n    xm.master_print(f'step {step}', msg)\n", ruleset)
    assert "def _neuron" not in out, out
    guard = '    if (dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", 0))) == 0:\n'
    assert out.endswith(f"{guard}        print(msg)\n{guard}        print(f'step {{step}}', msg)\n"), out
    out = _fix("def f(msg):\n    xm.master_print(msg)\n    return xm.get_ordinal()\n", ruleset)
    assert out.endswith("    if _neuron_rank() == 0:\n        print(msg)\n    return _neuron_rank()\n"), out
    out = _fix("def f(loss):\n    xm.master_print(loss.item())\n", ruleset)
    assert "def _neuron_rank0_print(*args):" in out and "    _neuron_rank0_print(loss.item())\n" in out
    compile(out, "t.py", "exec")


def test_the_one_liners_answer_as_the_helpers_did(ruleset, tmp_path):
    """Without a process group: torchrun's RANK / WORLD_SIZE, else 0 and 1; the barrier does nothing."""
    out = _fix("def f():\n    xm.rendezvous('x')\n    return xm.get_ordinal(), xm.xrt_world_size()\n\n\nprint(*f())\n", ruleset)
    assert "def _neuron" not in out
    script = tmp_path / "s.py"
    script.write_text(out)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    run = lambda extra: subprocess.run([sys.executable, str(script)], env={**env, **extra}, capture_output=True, text=True,
                                       timeout=120)
    assert run({}).stdout.split() == ["0", "1"]
    assert run({"RANK": "3", "WORLD_SIZE": "4"}).stdout.split() == ["3", "4"]


def test_a_use_in_a_decorator_counts(ruleset):
    """Uses are found in every statement that writes the helper's name, a decorator above its def included (only
    those statements are walked: files.lines.statements_naming)."""
    body = ("def f():\n    return xm.get_ordinal(), xm.get_ordinal()\n\n\n"
            "@some_registry(\n    rank=xm.get_ordinal(),\n)\n"
            "def g():\n    return 0\n")
    out = _fix(body, ruleset)
    assert "def _neuron_rank():" in out and out.count("_neuron_rank()") == 4  # three uses: stays a helper
    out = _fix(body.replace("xm.get_ordinal(), xm.get_ordinal()", "xm.get_ordinal()", 1), ruleset)
    assert "def _neuron" not in out and out.count('int(os.environ.get("RANK", 0))') == 2  # two: inlined


def test_statements_naming_a_helper():
    import ast

    from neuron_migrate.files.lines import source_lines
    from neuron_migrate.files.lines import statements_naming as _naming

    text = "x = 1\n\n@deco(\n    _h(),\n)\ndef f():\n    pass\n\n\ny = [\n    1,\n    _h,\n]\nz = 2\n"
    tree = ast.parse(text)
    assert [s.lineno for s in _naming(tree, source_lines(text, keepends=True), {"_h"})] == [6, 10]
    assert _naming(tree, source_lines(text, keepends=True), {"_other"}) == []
    text = "x = 1\n\ny = ｈ\n"  # NFKC: the Name is `h`
    assert [s.lineno for s in _naming(ast.parse(text), source_lines(text, keepends=True), {"h"})] == [3]
