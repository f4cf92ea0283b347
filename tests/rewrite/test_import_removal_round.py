"""A round whose fixes only remove imports nothing uses is validated by a parse, not analysed again
(rewrite.engine._left_after_import_removal): its outcome must be what a full analysis of that round gives."""
import pytest

from neuron_migrate.rewrite import engine
from neuron_migrate.rules.api import Settings
from neuron_migrate.rules.registry import RuleSet, all_rules

# round 1 rewrites every use of xm; round 2 removes the imports left unused (NM100); findings are left below them,
# one with an unsafe fix (kept in safe mode) and an unused suppression (NM901, a comment edit applied at the end)
SCRIPT = '''import os

import torch
import torch_xla.core.xla_model as xm
import torch_xla.distributed.parallel_loader as pl


def train(model, loader, opt):
    device = xm.xla_device()
    model.to(device)
    for x, y in pl.MpDeviceLoader(loader, device):
        loss = model(x).sum()
        loss.backward()
        opt.step()
        xm.mark_step()
    z = torch.zeros(2, dtype=torch.float64)  # noqa: NM124
    torch.cuda.synchronize()
    return z, os.sep
'''


@pytest.fixture(scope="module")
def ruleset():
    return RuleSet(all_rules())


def _outcome(text, ruleset, settings):
    out = engine.fix_text(text, "train.py", ruleset, settings)
    def row(f):
        edits = [(e.kind, e.span, e.text) for e in f.fix.edits] if f.fix else None
        return (f.rule.code, f.span, f.message, f.note, edits)
    return out.text, dict(out.applied), [row(f) for f in out.applied_findings], [row(f) for f in out.remaining]


@pytest.mark.parametrize("unsafe", [False, True])
def test_parse_only_round_gives_what_a_full_analysis_gives(ruleset, monkeypatch, unsafe):
    settings = Settings(unsafe_fixes=unsafe)
    checks = []
    real_check = engine.check_text
    monkeypatch.setattr(engine, "check_text", lambda *a, **k: checks.append(1) or real_check(*a, **k))
    short = _outcome(SCRIPT, ruleset, settings)
    n_short = len(checks)
    monkeypatch.setattr(engine, "_left_after_import_removal", lambda *a: None)
    checks.clear()
    full = _outcome(SCRIPT, ruleset, settings)
    assert n_short == len(checks) - 1  # the import-removal round was not analysed again
    assert short == full
    text = short[0]
    assert "torch_xla" not in text and "import os\n" in text
    assert short[1].get("NM100") == 2


def test_a_finding_in_an_edited_statement_makes_the_round_analysed(ruleset):
    from neuron_migrate.files.span import Span
    from neuron_migrate.rules.model import Edit, Finding, Fix, FixSafety

    rule = ruleset.rules[0] if hasattr(ruleset, "rules") else next(iter(all_rules()))
    removal = Fix(FixSafety.SAFE, [Edit("delete_stmt", Span(2, 0, 2, 20))], unused_import_only=True)
    removed = Finding(rule, "f.py", Span(2, 0, 2, 20), "unused import", fix=removal)
    other = Finding(rule, "f.py", Span(5, 0, 5, 3), "left")
    on_it = Finding(rule, "f.py", Span(2, 0, 2, 5), "on the import")
    numbered = Finding(rule, "f.py", Span(7, 0, 7, 3), "see line 3", note="and lines 4-8")
    gone = Finding(rule, "f.py", Span(7, 0, 7, 3), "see line 2")  # the removed import's line
    old = "".join(f"line{i}\n" for i in range(1, 9))
    new = old.replace("line2\n", "")
    take = lambda findings, todo, chosen, applied: engine._left_after_import_removal(findings, todo, chosen, applied, old, new)  # noqa: E731
    assert take([removed, other], [removed], [removal], [removal]) == [other]
    assert take([removed, other, on_it], [removed], [removal], [removal]) is None
    from neuron_migrate.rules.lines import move_findings

    assert take([removed, numbered], [removed], [removal], [removal]) == [numbered]
    (moved,) = move_findings([numbered], old, new, fixes=True)  # as fix_text moves what is left
    assert (moved.message, moved.note) == ("see line 2", "and lines 3-7")  # named as an analysis of `new` names it
    assert (numbered.message, numbered.note) == ("see line 3", "and lines 4-8")  # the round's finding is not changed
    assert take([removed, gone], [removed], [removal], [removal]) is None
    plain = Fix(FixSafety.SAFE, [Edit("delete_stmt", Span(2, 0, 2, 20))])
    assert take([removed], [removed], [plain], [plain]) is None  # not marked as an import removal
    assert take([removed], [removed], [removal], []) is None  # not applied


# round 2 removes the xm import; the finding left names a line below it, which moves up
NAMED_LINE = '''import torch_xla.core.xla_model as xm
from torch_xla.distributed.parallel_loader import MpDeviceLoader


def f(loader: "MpDeviceLoader"):
    xm.mark_step()
    return loader
'''


def test_a_message_naming_a_line_is_renumbered_as_a_full_analysis_names_it(ruleset, monkeypatch):
    checks = []
    real_check = engine.check_text
    monkeypatch.setattr(engine, "check_text", lambda *a, **k: checks.append(1) or real_check(*a, **k))
    short = _outcome(NAMED_LINE, ruleset, Settings())
    n_short = len(checks)
    monkeypatch.setattr(engine, "_left_after_import_removal", lambda *a: None)
    checks.clear()
    full = _outcome(NAMED_LINE, ruleset, Settings())
    assert n_short == len(checks) - 1 == 2
    assert short == full
    (left,) = short[3]
    assert "on line 4 names `MpDeviceLoader`" in left[2]  # line 5 before the import went
