"""Wanted answers each (kind, key) once and keeps its memo bounded (a long-lived editor server sees many files)."""
from __future__ import annotations

from neuron_migrate.names.analysis import Wanted


def test_memo_is_bounded_and_answers_stay_right():
    w = Wanted({"call": {"torch.x"}}, {"ref": ("torch_xla.",)}, {"string"})
    for i in range(200_500):
        assert w.wants("call", f"k{i}") is False
    assert w._memo_size <= 200_000 and sum(len(m) for m in w._memo.values()) == w._memo_size
    assert w.wants("call", "torch.x") and w.wants("ref", "torch_xla.core") and w.wants("string", "anything")
    assert not w.wants("ref", "torch.core") and not w.wants("method", "x")
    assert w.wants("call", "torch.x")  # from the memo now
