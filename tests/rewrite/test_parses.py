"""A rewrite parses each text of a file once: the tree a round's check made serves the fixes of that round, the
import insertion and the pruning of imports left unused, instead of a parse of the same text again (a parse is
most of a check's time)."""
from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest

from neuron_migrate.rewrite import engine
from neuron_migrate.rules.api import Settings
from neuron_migrate.rules.registry import RuleSet, all_rules

TESTS = Path(__file__).resolve().parents[1]
REALISTIC = sorted((TESTS / "integration" / "realistic").glob("*.py"))

# the loader's argument goes, and with it the only use of PREFETCH: its import is pruned after the last round
PRUNED = '''import torch
import torch_xla.core.xla_model as xm
import torch_xla.distributed.parallel_loader as pl

from settings import PREFETCH


def train(model, loader):
    device = xm.xla_device()
    for x, y in pl.MpDeviceLoader(loader, device, batches_per_execution=PREFETCH):
        model(x)
    xm.send(torch.ones(1), channel_id=1)
'''


@pytest.fixture(scope="module")
def ruleset():
    return RuleSet(all_rules())


def _parses(monkeypatch, text: str, ruleset, unsafe: bool) -> tuple[str, Counter]:
    counts: Counter = Counter()
    real = ast.parse

    def counting(source, *args, **kwargs):
        counts[source] += 1
        return real(source, *args, **kwargs)

    monkeypatch.setattr(ast, "parse", counting)
    out = engine.fix_text(text, "train.py", ruleset, Settings(unsafe_fixes=unsafe))
    monkeypatch.setattr(ast, "parse", real)
    return out.text, counts


def test_pruning_reuses_the_last_rounds_tree(monkeypatch, ruleset):
    text, counts = _parses(monkeypatch, PRUNED, ruleset, unsafe=True)
    assert "PREFETCH" not in text  # its import was pruned after the last round
    assert max(counts.values()) == 1, [(n, t[:80]) for t, n in counts.items() if n > 1]


@pytest.mark.parametrize("script", REALISTIC, ids=lambda p: p.name)
@pytest.mark.parametrize("unsafe", [False, True])
def test_no_text_of_a_realistic_rewrite_is_parsed_twice(monkeypatch, ruleset, script, unsafe):
    text, counts = _parses(monkeypatch, script.read_text(), ruleset, unsafe)
    assert text != script.read_text()
    twice = [(n, t[:80]) for t, n in counts.items() if n > 1 and "\n" in t.strip()]
    assert not twice
