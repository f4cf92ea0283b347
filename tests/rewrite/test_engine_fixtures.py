"""Engine-level fixture pairs (tests/fixtures/rewrite/*.in.py -> *.out.py), all rules on.

Each `.out.py` must be what the rewrite gives, a fixed point, and a module that imports and runs (as
`__main__`) on CPU through the test-only `neuron` stand-in: inserted imports and helpers placed after their
first use, or a late import the fix relies on, fail here with NameError.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from neuron_migrate.rewrite.engine import fix_text
from neuron_migrate.rules.api import Settings
from neuron_migrate.rules.registry import RuleSet

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "rewrite"
SHIM = Path(__file__).resolve().parents[1] / "integration" / "neuron_on_cpu"
CASES = sorted(FIXTURES.glob("*.in.py"))


def settings_for(text: str) -> Settings:
    first = text.splitlines()[0] if text else ""
    opts = first.split("neuron-migrate-test:", 1)[1].split() if "neuron-migrate-test:" in first else []
    return Settings(unsafe_fixes="unsafe-fixes" in opts)


def _out(case: Path) -> Path:
    return case.with_name(case.name.replace(".in.py", ".out.py"))


@pytest.fixture(scope="module")
def ruleset():
    return RuleSet.select()


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name[: -len(".in.py")])
def test_rewrite_matches_expected_and_is_a_fixed_point(case: Path, ruleset):
    text = case.read_text()
    got = fix_text(text, str(case), ruleset, settings_for(text)).text
    assert got == _out(case).read_text()
    ast.parse(got)
    assert fix_text(got, str(_out(case)), ruleset, settings_for(text)).text == got


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name[: -len(".in.py")])
@pytest.mark.slow
def test_rewritten_module_imports_and_runs(case: Path):
    pytest.importorskip("torch")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SHIM), str(FIXTURES)]))
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    code = "import runpy, sys; runpy.run_path(sys.argv[1], run_name='__main__')"
    p = subprocess.run([sys.executable, "-c", code, str(_out(case))], capture_output=True, text=True, env=env,
                       cwd=str(FIXTURES), timeout=300)
    assert p.returncode == 0, p.stderr
