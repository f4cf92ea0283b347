"""The README's two set-up commands are what CI runs: `.ci/run` calls the test command verbatim, and the slow tests
the default run leaves out are run there too."""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _commands() -> list[str]:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    setup = readme.split("## Run it on your own repository")[0]
    return [c.strip() for c in re.findall(r"```\n(python3 -m venv[^\n]*)\n```", setup)]


def test_readme_has_two_setup_commands_and_ci_runs_the_test_one():
    cmds = _commands()
    assert len(cmds) == 2, cmds
    demo, tests = cmds
    assert demo.endswith("neuron-migrate rewrite examples/xla_project")
    assert tests.endswith("pytest -n auto")
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert tests in ci.splitlines()
    assert "pytest -n auto -m slow" in ci.splitlines()


def test_default_run_leaves_out_slow_tests_and_ci_runs_them():
    toml = (REPO / "pyproject.toml").read_text(encoding="utf-8")  # (tomllib is 3.11+; the suite runs on 3.10 too)
    assert re.search(r"""^addopts = ".*-m 'not slow'.*"$""", toml, re.M)
    assert re.search(r"""^markers = \["slow: """, toml, re.M)
