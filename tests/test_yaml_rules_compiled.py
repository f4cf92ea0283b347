"""rules/*.yaml ship with a compiled JSON form (no YAML import or parse when the CLI starts): it is current, equal
to the YAML, used, and ignored when it is stale or damaged."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from neuron_migrate.rules.yaml_rules import compiled_path, load_yaml_rules, parse_yaml_entries, write_compiled

RULES = Path(__file__).resolve().parents[1] / "rules"
FILES = sorted(RULES.glob("*.yaml"))


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_shipped_compiled_form_is_current_and_equal(path, tmp_path):
    shipped = json.loads(compiled_path(path).read_text(encoding="utf-8"))
    assert shipped["entries"] == parse_yaml_entries(path), f"run `python -m neuron_migrate.rules.yaml_rules` after editing {path.name}"
    copy = tmp_path / path.name
    shutil.copyfile(path, copy)
    assert json.loads(write_compiled(copy).read_text(encoding="utf-8"))["sha256"] == shipped["sha256"]


def _summaries(folder: Path) -> dict:
    return {r.code: (r.summary, r.fix_safety, tuple(r.triggers)) for r in load_yaml_rules(folder)}


def test_stale_or_damaged_compiled_form_is_not_used(tmp_path):
    for p in FILES:
        shutil.copyfile(p, tmp_path / p.name)
        shutil.copyfile(compiled_path(p), compiled_path(tmp_path / p.name))
    base = _summaries(tmp_path)
    target = tmp_path / "cuda.yaml"
    text = target.read_text(encoding="utf-8")
    code = next(iter(r.code for r in load_yaml_rules(tmp_path) if r.origin == "cuda.yaml"))
    old = next(r.summary for r in load_yaml_rules(tmp_path) if r.code == code)
    target.write_text(text.replace(old, old + " (edited)", 1), encoding="utf-8")  # the JSON is now stale
    assert _summaries(tmp_path)[code][0] == old + " (edited)"
    compiled_path(target).write_text("{not json", encoding="utf-8")
    assert _summaries(tmp_path)[code][0] == old + " (edited)"
    compiled_path(target).unlink()
    assert _summaries(tmp_path)[code][0] == old + " (edited)"
    assert set(_summaries(tmp_path)) == set(base)


# that the CLI then starts without importing yaml: tests/report/test_plain_console.py
