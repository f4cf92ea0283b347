"""The plain-data classes that replaced dataclasses keep their behaviour: equality and hashing by fields,
immutability of the frozen ones, pickling (results cross process boundaries), copying, and a readable repr."""
from __future__ import annotations

import copy
import pickle

import pytest

from neuron_migrate.files.span import Span
from neuron_migrate.rules.model import Edit, Finding, Fix, FixSafety, ImportReq
from neuron_migrate.rules.registry import get_rule
from neuron_migrate.table.loader import Entry, Status


def test_frozen_records_compare_and_hash_by_value_and_cannot_change():
    a, b = Span(1, 2, 3, 4), Span(1, 2, 3, 4)
    assert a == b and hash(a) == hash(b) and a != Span(1, 2, 3, 5) and len({a, b}) == 1
    assert a != (1, 2, 3, 4)  # another class is never equal
    e = Edit("replace_expr", a, "x")
    assert e == Edit("replace_expr", b, "x") and {e: 1}[Edit("replace_expr", b, "x")] == 1
    for obj, name in ((a, "line"), (e, "text"), (ImportReq("os"), "alias")):
        with pytest.raises(AttributeError):
            setattr(obj, name, 9)
        with pytest.raises(AttributeError):
            delattr(obj, name)
    assert repr(e) == "Edit(kind='replace_expr', span=Span(line=1, col=2, end_line=3, end_col=4), text='x')"


def test_a_field_left_out_of_comparison_is_still_shown():
    one = Entry("torch.fft", "namespace", Status.PARTIAL, when_env={"X": {}})
    other = Entry("torch.fft", "namespace", Status.PARTIAL)
    assert one == other and hash(one) == hash(other)
    assert "when_env={'X': {}}" in repr(one)


def test_mutable_records_compare_by_value_are_unhashable_and_pickle():
    rule = get_rule("NM101")
    fix = Fix(FixSafety.SAFE, [Edit("delete_stmt", Span(3, 0, 3, 15))], [ImportReq("torch")])
    f = Finding(rule, "t.py", Span(3, 0, 3, 15), "removed", fix)
    assert f == copy.copy(f) and f != Finding(rule, "t.py", Span(3, 0, 3, 15), "other", fix)
    with pytest.raises(TypeError):
        hash(f)
    back = pickle.loads(pickle.dumps(f))
    assert back == f and back.rule is rule and back.fix.imports == [ImportReq("torch")]
    assert Fix(FixSafety.SAFE, []).imports is not Fix(FixSafety.SAFE, []).imports  # fresh defaults per instance
    frozen_back = pickle.loads(pickle.dumps(Span(1, 0, 1, 1)))
    assert frozen_back == Span(1, 0, 1, 1) and hash(frozen_back) == hash(Span(1, 0, 1, 1))


def test_frozen_record_fields_set_with_or_without_an_instance_dict():
    from neuron_migrate.files.records import FrozenRecord

    class Slotted(FrozenRecord):
        __slots__ = ("a", "b")
        _fields = ("a", "b")

        def __init__(self, a, b):
            self._set(a=a, b=b)

    s = Slotted(1, [2])
    assert (s.a, s.b) == (1, [2]) and not hasattr(s, "__dict__") and s == Slotted(1, [2])
    e = Entry("aten::add", "aten_op", Status.NATIVE)
    assert e.__dict__["name"] == "aten::add" and e.note is None
    with pytest.raises(AttributeError):
        s.a = 3


def test_decorated_rule_docs_are_dedented_when_read():
    from neuron_migrate.rules.model import Rule, Severity

    r = Rule("NM999", "x", "s", FixSafety.SAFE, Severity.INFO, "").docs_to_dedent("\n    First line.\n\n      indented\n    ")
    assert r.docs == "First line.\n\n  indented" and r.docs == "First line.\n\n  indented"
    r.docs = "  set as is  "
    assert r.docs == "  set as is  "
    assert get_rule("NM101").docs.startswith("Under PyTorch/XLA") and "\n    " not in get_rule("NM101").docs[:200]
