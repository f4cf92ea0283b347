"""What `rewrite` reports points at lines of the rewritten file (the one the user gets), not at the line the
fix was found at: inserted imports and helpers, later rounds and pruned imports move every line below them."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from neuron_migrate.rewrite.engine import fix_text
from neuron_migrate.rules.lines import line_map
from neuron_migrate.rules.api import Settings
from neuron_migrate.rules.registry import RuleSet, all_rules
from neuron_migrate.rules.runner import check_text

TESTS = Path(__file__).resolve().parents[1]
REALISTIC = sorted((TESTS / "integration" / "realistic").glob("*.py"))

# helpers and imports go in above the function: every line of it moves down
HELPERS = '''import torch
import torch_xla.core.xla_model as xm
from torch import float64


def step(optimizer, model):
    x = torch.zeros(2, dtype=float64)
    xm.optimizer_step(optimizer)
    xm.send(x, channel_id=1)
    print(xm.get_ordinal())
'''
# an import only the dropped argument used is pruned after the last round, above an unused suppression
PRUNED = '''import torch
import torch_xla.core.xla_model as xm
import torch_xla.distributed.parallel_loader as pl

from settings import PREFETCH


def train(model, loader):
    device = xm.xla_device()
    for x, y in pl.MpDeviceLoader(loader, device, batches_per_execution=PREFETCH):
        model(x)
    z = 1  # noqa: NM124
    xm.send(z, channel_id=1)
'''


@pytest.fixture(scope="module")
def ruleset():
    return RuleSet(all_rules())


def _line(text: str, n: int) -> str:
    return text.splitlines()[n - 1]


def test_fixes_and_findings_point_into_the_rewritten_text(ruleset):
    out = fix_text(HELPERS, "t.py", ruleset, Settings(unsafe_fixes=True))
    assert out.text.count("\n") > HELPERS.count("\n") + 10  # helpers were inserted above the code
    at = {f.rule.code: f.span.line for f in out.applied_findings}
    assert _line(out.text, at["NM110"]).strip() == "_neuron_reduce_gradients(optimizer)"
    # one use of the rank: its one-line native form, not a helper (issue 38)
    assert _line(out.text, at["NM112"]).strip() == 'print(dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", 0)))'
    left = {f.rule.code: f.span for f in out.remaining}
    assert _line(out.text, left["NM124"].line).strip() == "xm.send(x, channel_id=1)"
    float64 = _line(out.text, left["NM304"].line)
    assert float64[left["NM304"].col:left["NM304"].end_col] == "float64"


def test_pruned_imports_and_comment_fixes_keep_lines_right(ruleset):
    out = fix_text(PRUNED, "w.py", ruleset, Settings(unsafe_fixes=True))
    assert "PREFETCH" not in out.text  # the import went after the last round
    assert "    z = 1\n" in out.text  # the unused suppression was removed from its own line ...
    assert "    xm.send(z, channel_id=1)\n" in out.text  # ... and the line below it is intact
    (send,) = [f for f in out.remaining if f.rule.code == "NM124"]
    assert _line(out.text, send.span.line).strip() == "xm.send(z, channel_id=1)"
    (comment,) = [f for f in out.applied_findings if f.rule.code == "NM901"]
    assert _line(out.text, comment.span.line).strip() == "z = 1"


@pytest.mark.parametrize("script", REALISTIC, ids=lambda p: p.name)
def test_findings_left_are_where_an_audit_of_the_output_finds_them(script, ruleset):
    """The findings rewrite leaves are exactly those a fresh audit of the rewritten text reports, line for line;
    every fix's line exists in the output."""
    text = script.read_text()
    settings = Settings(unsafe_fixes=True)
    out = fix_text(text, script.name, ruleset, settings)
    again = check_text(out.text, script.name, ruleset, settings).findings
    assert Counter((f.rule.code, f.span.line) for f in out.remaining) == Counter((f.rule.code, f.span.line) for f in again)
    n = len(out.text.splitlines())
    assert all(1 <= f.span.line <= f.span.end_line <= n for f in out.applied_findings)


def test_line_map():
    old = "a\nb\nc\nd\n"
    to_new = line_map(old, "x\ny\na\nb\nC1\nC2\nd\n")  # two lines in front, c replaced by two
    assert [to_new(n) for n in (1, 2, 3, 4)] == [3, 4, 5, 7]
    to_new = line_map(old, "a\nc\nd\n")  # b deleted: it maps to the line now where it was
    assert [to_new(n) for n in (1, 2, 3, 4)] == [1, 2, 2, 3]
    assert line_map(old, "a\nb\n")(4) == 2  # never past the end


def test_launcher_fixes_point_into_the_rewritten_script(tmp_path, monkeypatch):
    """Launchers are fixed round by round too: deleted `export` lines move the launch line up."""
    from typer.testing import CliRunner

    from neuron_migrate.cli.app import app

    (tmp_path / ".git").mkdir()
    (tmp_path / "run.sh").write_text("#!/bin/bash\nexport PJRT_DEVICE=NEURON\nexport XLA_IR_DEBUG=1\n"
                                     "export NEURONCORE_NUM_DEVICES=2\npython train.py --epochs 3\n")
    (tmp_path / "train.py").write_text("import torch_xla.distributed.xla_multiprocessing as xmp\n\n\ndef _mp_fn(i):\n"
                                       "    pass\n\n\nif __name__ == '__main__':\n    xmp.spawn(_mp_fn, args=())\n")
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["rewrite", "--write", "--no-cache", "--no-color", "--show-fixes", "run.sh"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    launch = (tmp_path / "run.sh").read_text().splitlines()
    assert launch[1] == "torchrun --nproc_per_node=2 train.py --epochs 3"
    assert "run.sh:2: NM505 (safe)" in r.output  # line 5 before the three exports went


def test_line_opcodes_are_a_diff_of_the_lines():
    """The prefix/suffix-trimmed opcodes cover both texts in order, and rebuild `b` from `a`: on the shapes that
    matter (changes at either end, in the middle, everything, nothing, texts that are prefixes of each other)."""
    from neuron_migrate.rules.lines import _line_opcodes

    base = [f"line {i}" for i in range(30)] + ["", "x", "", "x", ""]
    cases = [
        (base, base),
        (base, ["new"] + base),
        (base, base + ["new"]),
        (base, base[:10] + ["a", "b"] + base[12:]),
        (base, base[:10] + base[11:]),
        (base, []),
        ([], base),
        (base, base[:5]),
        (base[:5], base),
        (["x", "", "x"], ["x", "", "", "x"]),
        (base, list(reversed(base))),
    ]
    for a, b in cases:
        ops = _line_opcodes(a, b)
        assert [o[1] for o in ops[1:]] == [o[2] for o in ops[:-1]] and [o[3] for o in ops[1:]] == [o[4] for o in ops[:-1]]
        if ops:
            assert (ops[0][1], ops[0][3], ops[-1][2], ops[-1][4]) == (0, 0, len(a), len(b))
        else:
            assert not a and not b
        rebuilt = []
        for tag, i1, i2, j1, j2 in ops:
            if tag == "equal":
                assert a[i1:i2] == b[j1:j2]
                rebuilt += a[i1:i2]
            else:
                rebuilt += b[j1:j2]
        assert rebuilt == b
        assert all(x[0] != "equal" or y[0] != "equal" for x, y in zip(ops, ops[1:]))  # equal blocks merged


def test_line_opcodes_on_random_edits_are_a_diff():
    import random

    from neuron_migrate.rules.lines import _line_opcodes

    rng = random.Random(7)
    for _ in range(500):
        a = [rng.choice("abcde") + (str(rng.randint(0, 30)) if rng.random() < 0.3 else "") for _ in range(rng.randint(0, 40))]
        b = list(a)
        for _ in range(rng.randint(0, 6)):
            op = rng.random()
            if op < 0.3 and b:
                del b[rng.randrange(len(b))]
            elif op < 0.6:
                b.insert(rng.randint(0, len(b)), rng.choice("abcxyz"))
            elif b:
                b[rng.randrange(len(b))] = f"changed {rng.random()}"
        rebuilt, i_at, j_at = [], 0, 0
        for tag, i1, i2, j1, j2 in _line_opcodes(a, b):
            assert (i1, j1) == (i_at, j_at)
            if tag == "equal":
                assert a[i1:i2] == b[j1:j2]
            rebuilt += b[j1:j2]
            i_at, j_at = i2, j2
        assert (i_at, j_at) == (len(a), len(b)) and rebuilt == b


def _reference_line_opcodes(a: list, b: list) -> list:
    """_line_opcodes as first written: every unique line anchored one at a time (longest increasing run by patience
    sorting, always), every gap diffed line by line. The fast paths (runs of anchors, unchanged gaps, a run that
    needs no sorting) must give exactly these opcodes: reported lines must not move with the speed-ups."""
    import difflib
    from bisect import bisect_left

    ops: list = []

    def add(tag, i1, i2, j1, j2):
        if i1 == i2 and j1 == j2:
            return
        if tag == "equal" and ops and ops[-1][0] == "equal":
            ops[-1] = ("equal", ops[-1][1], i2, ops[-1][3], j2)
        else:
            ops.append((tag, i1, i2, j1, j2))

    def gap(i1, i2, j1, j2):
        if i1 == i2 or j1 == j2:
            add("delete" if i1 < i2 else "insert", i1, i2, j1, j2)
            return
        while i1 < i2 and j1 < j2 and a[i1] == b[j1]:
            add("equal", i1, i1 + 1, j1, j1 + 1)
            i1, j1 = i1 + 1, j1 + 1
        tail = 0
        while tail < min(i2 - i1, j2 - j1) and a[i2 - 1 - tail] == b[j2 - 1 - tail]:
            tail += 1
        if i2 - tail > i1 or j2 - tail > j1:
            if i2 - tail == i1 or j2 - tail == j1:
                add("delete" if i2 - tail > i1 else "insert", i1, i2 - tail, j1, j2 - tail)
            else:
                m = difflib.SequenceMatcher(None, a[i1:i2 - tail], b[j1:j2 - tail], autojunk=False)
                for tag, x1, x2, y1, y2 in m.get_opcodes():
                    add(tag, x1 + i1, x2 + i1, y1 + j1, y2 + j1)
        if tail:
            add("equal", i2 - tail, i2, j2 - tail, j2)

    pairs = [(i, b.index(line)) for i, line in enumerate(a) if a.count(line) == 1 and b.count(line) == 1]
    tails, tail_js, back = [], [], [-1] * len(pairs)
    for k, (_i, j) in enumerate(pairs):
        pos = bisect_left(tail_js, j)
        back[k] = tails[pos - 1] if pos else -1
        if pos == len(tails):
            tails.append(k)
            tail_js.append(j)
        else:
            tails[pos], tail_js[pos] = k, j
    run, k = [], tails[-1] if tails else -1
    while k >= 0:
        run.append(pairs[k])
        k = back[k]
    i0 = j0 = 0
    for i, j in [*run[::-1], (len(a), len(b))]:
        gap(i0, i, j0, j)
        if i < len(a):
            add("equal", i, i + 1, j, j + 1)
        i0, j0 = i + 1, j + 1
    return ops


def test_line_opcodes_fast_paths_give_the_plain_algorithms_opcodes():
    import random

    from neuron_migrate.rules.lines import _line_opcodes

    rng = random.Random(11)
    for n in range(3000):
        vocab = rng.choice([4, 30, 300])  # many repeats, some, nearly all lines unique
        a = [rng.choice("abcdefgh") + str(rng.randrange(vocab)) for _ in range(rng.randrange(0, 60))]
        b = list(a)
        for _ in range(rng.randrange(0, 8)):
            op = rng.randrange(5)
            if op == 0 and b:
                del b[rng.randrange(len(b))]
            elif op == 1:
                b.insert(rng.randrange(len(b) + 1), rng.choice(["", ")", "new"]) + str(rng.randrange(3)))
            elif op == 2 and len(b) > 1:  # a moved line: the anchors are no longer in order
                b.insert(rng.randrange(len(b)), b.pop(rng.randrange(len(b))))
            elif op == 3 and b:
                b[rng.randrange(len(b))] = f"changed {n}"
            elif op == 4 and b:  # a block of repeated lines (blank lines, closing brackets) inserted
                at = rng.randrange(len(b) + 1)
                b[at:at] = ["", ")"] * rng.randrange(1, 3)
        assert _line_opcodes(a, b) == _reference_line_opcodes(a, b), (a, b)


def test_line_opcodes_hand_difflib_only_the_runs_between_unique_lines(monkeypatch):
    """Many changes in a long file of repeated lines: SequenceMatcher over the whole texts is quadratic in the
    repeats (a 4,000-line rewrite took 19 s in it); anchored on the unique lines, it sees a few lines at a time."""
    import difflib

    from neuron_migrate.rules.lines import _line_opcodes

    block = ["", "def step_{i}(model):", "    out = model()", "    xm.mark_step()", "    return out", ")"]
    a = [line.format(i=i) for i in range(2000) for line in block]
    b = [line for line in a if line != "    xm.mark_step()"]  # 2,000 deletions among repeated lines
    sizes = []
    real = difflib.SequenceMatcher

    def spy(junk, x, y, autojunk=True):
        sizes.append(len(x) + len(y))
        return real(junk, x, y, autojunk=autojunk)

    monkeypatch.setattr(difflib, "SequenceMatcher", spy)
    ops = _line_opcodes(a, b)
    assert max(sizes, default=0) <= 12
    assert sum(i2 - i1 for tag, i1, i2, _j1, _j2 in ops if tag == "equal") == len(b)  # every kept line matched


@pytest.mark.parametrize("message, want", [
    ("left unchanged (lines 567, 571, 576), so", "left unchanged (lines 565, 569, 574), so"),
    ("the `if` block (lines 10-20) is removed", "the `if` block (lines 8-18) is removed"),
    ("line 12: a; line 40: b", "line 10: a; line 38: b"),
    ("xm.optimizer_step (line 12, 14) all-reduced", "xm.optimizer_step (line 10, 12) all-reduced"),
    ("2 calls, no line named, xla:1", "2 calls, no line named, xla:1"),
    ("the call at line 5", None),  # a line that is gone
    ("lines 12 and 14", None),  # a list in a form not read here
    ("lines 12,13", None),
])
def test_renumber_lines_moves_every_line_a_message_names(message, want):
    from neuron_migrate.rules.lines import renumber_lines

    assert renumber_lines(message, lambda n: None if n == 5 else n - 2) == want


def _named_lines(findings) -> list:
    return sorted((f.rule.code, f.span.line, f.message) for f in findings if _LINE_REF.search(f.message))


_LINE_REF = __import__("re").compile(r"\blines? \d")


def test_lines_named_in_messages_are_those_of_the_rewritten_file(ruleset):
    """A finding left after a rewrite was found in the text of the last round; later rounds and pruned imports
    move lines after it. The lines its message names move with its span: they read as an audit of the rewritten
    file reports them (here NM103 names the three 'xla' strings, below two imports that go)."""
    text = ("import torch\n"
            "import torch_xla.core.xla_model as xm\n"
            "import torch_xla.distributed.parallel_loader as pl\n"
            "\n"
            "from settings import PREFETCH\n"
            "\n\n"
            "def train(model, loader, backend=\"xla\"):\n"
            "    device = xm.xla_device()\n"
            "    for x, y in pl.MpDeviceLoader(loader, device, batches_per_execution=PREFETCH):\n"
            "        model(x)\n"
            "    if backend == \"xla\":\n"
            "        print(\"on xla\")\n"
            "    elif backend in (\"xla\", \"tpu\"):\n"
            "        print(\"tpu\")\n")
    out = fix_text(text, "t.py", ruleset, Settings(unsafe_fixes=True))
    left = _named_lines(out.remaining)
    assert [(c, n) for c, n, _m in left] == [("NM103", 4)] and "(lines 4, 9, 11)" in left[0][2], left  # 8, 12, 14
    assert all('"xla"' in _line(out.text, n) for n in (4, 9, 11))
    assert left == _named_lines(check_text(out.text, "t.py", ruleset).findings)


@pytest.mark.parametrize("path", REALISTIC, ids=lambda p: p.name)
def test_named_lines_match_an_audit_of_the_output_on_realistic_scripts(ruleset, path):
    text = path.read_text()
    out = fix_text(text, path.name, ruleset, Settings(unsafe_fixes=True))
    assert _named_lines(out.remaining) == _named_lines(check_text(out.text, path.name, ruleset).findings)
