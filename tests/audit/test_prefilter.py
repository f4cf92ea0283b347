"""RuleSet.could_match (one pattern for every trigger word) answers as a search for each word would."""
from __future__ import annotations

from pathlib import Path

import pytest

from neuron_migrate.rules import registry
from neuron_migrate.rules.registry import RuleSet

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("scan_before_compile", [0, 10**12, registry.SCAN_BEFORE_COMPILE])
def test_prefilter_is_a_search_for_any_trigger_word(monkeypatch, scan_before_compile):
    # 0: the compiled pattern from the first text; 10**12: word by word throughout; the default: both, in turn
    monkeypatch.setattr(registry, "SCAN_BEFORE_COMPILE", scan_before_compile)
    rs = RuleSet.select()
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in sorted(ROOT.glob("tests/fixtures/**/*.py"))]
    texts += ["x = 1\n", "", "import torch\n", "NEURON_PJRT_X = 1\n", "# noqa\n"]
    answers = [rs.could_match(t) for t in texts]
    assert answers == [any(w in t for w in rs.trigger_words) for t in texts]
    assert True in answers and False in answers
    assert (rs._trigger_re is not None) == (scan_before_compile < sum(map(len, texts)))


def test_no_rules_match_nothing():
    assert not RuleSet(()).could_match("import torch_xla\n")
    only = RuleSet.select(["NM101"])
    assert only.could_match("import torch_xla.core.xla_model as xm\n") and not only.could_match("print(1)\n")
