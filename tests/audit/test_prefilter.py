"""RuleSet.could_match (one pattern for every trigger word) answers as a search for each word would."""
from __future__ import annotations

from pathlib import Path

from neuron_migrate.rules.registry import RuleSet

ROOT = Path(__file__).resolve().parents[2]


def test_prefilter_is_a_search_for_any_trigger_word():
    rs = RuleSet.select()
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in sorted(ROOT.glob("tests/fixtures/**/*.py"))]
    texts += ["x = 1\n", "", "import torch\n", "NEURON_PJRT_X = 1\n", "# noqa\n"]
    answers = [rs.could_match(t) for t in texts]
    assert answers == [any(w in t for w in rs.trigger_words) for t in texts]
    assert True in answers and False in answers


def test_no_rules_match_nothing():
    assert not RuleSet(()).could_match("import torch_xla\n")
    only = RuleSet.select(["NM101"])
    assert only.could_match("import torch_xla.core.xla_model as xm\n") and not only.could_match("print(1)\n")
