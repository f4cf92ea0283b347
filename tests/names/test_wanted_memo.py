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


def test_memo_free_predicates_answer_as_wants_does():
    """The walk asks about strings, attributes, keywords and methods through per-kind predicates (no memo: their
    keys rarely repeat); they give wants()'s answer for every kind of subscription."""
    from neuron_migrate.rules.registry import RuleSet

    for w in (RuleSet.select(["ALL"], []).wanted,
              Wanted({"string": {"xla"}, "attr": {"is_cuda"}}, {"string": ("NCCL_", "TPU_"), "keyword": ("dev",)}, {"method"})):
        keys = ["xla", "xla:", "cuda", "NCCL_DEBUG", "TPU_NAME", "is_cuda", "device", "dev", "", "x" * 300, "to"]
        for kind in ("string", "attr", "keyword", "method", "call", "ref"):
            pred = w.predicate(kind)
            assert [pred(k) for k in keys] == [Wanted(w.exact, w.prefixes, w.any_kinds).wants(kind, k) for k in keys], kind


def test_string_key_names_device_strings_only():
    from neuron_migrate.names.analysis import string_key

    assert [string_key(s) for s in ("xla:1", "cuda", "neuron:0", "xla\n", "xlab", "cuda:x", "docstring", "")] == [
        "xla", "cuda", "neuron", "xla", "xlab", "cuda:x", "docstring", ""]
