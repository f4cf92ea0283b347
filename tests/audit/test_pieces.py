"""A very large file is audited in pieces of top-level statements (bounded memory) with the findings a whole-file
check gives, when no fact spans pieces; cuts never fall inside a string or brackets; anything it cannot cut
is checked whole."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pytest

import neuron_migrate.rules.pieces as pieces
from neuron_migrate.files.lines import source_lines
from neuron_migrate.pipeline.cache import result_from_dict, result_to_dict
from neuron_migrate.pipeline.process import process_file
from neuron_migrate.rules.model import finding_to_dict
from neuron_migrate.rules.registry import RuleSet
from neuron_migrate.rules.runner import check_text

HEAD = '''"""A generated training module."""
from __future__ import annotations

import torch
import torch_xla.core.xla_model as xm

device = xm.xla_device()
'''

# a module-level string whose lines look like defs at column 0: no cut may fall inside it
STRING = '''
TEMPLATE = """
def not_code():
    xm.mark_step()
class AlsoNot:
    pass
@decorated
"""
'''

BLOCK = '''

@torch.no_grad()
def step_{i}(model, batch):
    """Docstring with a column-0 line:
def inside_docstring():
    """
    out = model(batch.to(device))
    xm.mark_step()  # noqa: NM101
    return torch.cuda.is_available(), out


class Trainer{i}:
    def run(self, loader):
        for batch in loader:
            loss = self.model(batch)
            xm.optimizer_step(self.opt)
            xm.mark_step()
        return xm.get_ordinal(), (
            1,
2)
'''

TAIL = '''

if __name__ == "__main__":
    print(device, TEMPLATE)
'''


def generated(blocks: int = 40, newline: str = "\n") -> str:
    body = [HEAD] + [BLOCK.format(i=i) + (STRING if i == blocks // 2 else "") for i in range(blocks)] + [TAIL]
    return "".join(body).replace("\n", newline)


def clean_generated(blocks: int = 40) -> str:
    """generated() without column-0 lines in strings or brackets: the lines alone show its statements."""
    return (generated(blocks).replace("def inside_docstring():\n", "    indented\n").replace(STRING, "")
            .replace("            1,\n2)\n", "            1, 2)\n"))


@pytest.fixture
def small_pieces(monkeypatch):
    monkeypatch.setattr(pieces, "PIECE_CHARS", 1500)


def as_data(result) -> list:
    return [json.dumps(finding_to_dict(f), sort_keys=True) for f in result.findings]


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_pieces_give_the_whole_file_findings(small_pieces, newline):
    text = generated(newline=newline)
    rs = RuleSet.select([], [])
    whole = check_text(text, "gen.py", rs)
    cut = pieces.check_in_pieces(text, "gen.py", rs)
    assert cut is not None and cut.pieces > 5
    assert as_data(cut) == as_data(whole)
    assert len(whole.findings) > 100
    assert cut.suppressed == whole.suppressed == 40  # one noqa per block, counted once


@pytest.mark.parametrize("clean", [True, False])
def test_the_lines_plan_the_pieces_when_their_trees_agree(small_pieces, monkeypatch, clean):
    """The statements the column-0 lines suggest plan the pieces, and each piece's own parse checks them; a file
    where a column-0 line sits in a string or brackets fails that check and is planned by parsing first."""
    parsed_first = []
    real = pieces._cut
    monkeypatch.setattr(pieces, "_cut", lambda lines: parsed_first.append(1) or real(lines))
    text = clean_generated() if clean else generated()
    rs = RuleSet.select([], [])
    cut = pieces.check_in_pieces(text, "gen.py", rs)
    assert cut is not None and cut.pieces > 5
    assert as_data(cut) == as_data(check_text(text, "gen.py", rs))
    assert bool(parsed_first) is not clean


def test_the_line_plan_matches_the_parsed_statements():
    text = clean_generated(5).replace("\nclass Trainer", "\n# a comment\n\nclass Trainer")
    lines = source_lines(text, keepends=True)
    tree = ast.parse(text)
    assert pieces._statements_by_lines(lines) == [
        (pieces._first_line(st) - 1, st.end_lineno, isinstance(st, pieces._DEFS)) for st in tree.body]


def test_cuts_fall_between_top_level_statements(small_pieces):
    text = generated()
    lines = source_lines(text, keepends=True)
    ranges, glue, imports = pieces._cut(lines)
    assert ranges[0][0] == 0 and ranges[-1][1] == len(lines)
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))  # a partition of the lines
    inside_strings = set()
    for i, line in enumerate(lines):
        if line.startswith(("def not_code", "class AlsoNot", "@decorated", "def inside_docstring")):
            inside_strings.add(i)
    assert inside_strings and not inside_strings & {start for start, _ in ranges}
    # the template string was a cut candidate: the piece before it did not parse alone, so it was taken whole
    template = next(i for i, line in enumerate(lines) if line.startswith("TEMPLATE"))
    assert any(a <= template and lines.index('"""\n', template + 1) < b for a, b in ranges)
    assert (template, template + 7) in glue  # module glue every piece keeps
    assert imports == [(1, 2), (3, 4), (4, 5)]


def test_glue_over_its_budget_keeps_only_the_imports(small_pieces, monkeypatch):
    monkeypatch.setattr(pieces, "GLUE_MAX_CHARS", 100)  # the imports are 86 characters, all the glue more
    import neuron_migrate.rules.runner as runner

    texts = []
    real = runner.check_text
    monkeypatch.setattr(runner, "check_text", lambda text, *a, **k: texts.append(text) or real(text, *a, **k))
    cut = pieces.check_in_pieces(clean_generated(), "gen.py", RuleSet.select([], []))
    assert cut is not None and len(texts) == cut.pieces > 5
    assert all("import torch_xla.core.xla_model as xm\n" in t for t in texts)
    assert sum("device = xm.xla_device()" in t for t in texts) == 1  # only in its own piece
    keys = [(f.span.line, f.span.col, f.rule.code) for f in cut.findings]
    assert len(keys) == len(set(keys))  # every finding reported once, by the piece that holds its line


@pytest.mark.parametrize("text", [
    generated() + "\ndef broken(:\n    pass\n",  # a syntax error: the whole-file check reports it
    HEAD + "x = [\n" + "".join(f"def_{i},\n" for i in range(500)) + "]\n",  # one statement: nothing to cut
    "# neuron-migrate: ignore-file[NM101]\n" + generated(),  # a file-wide suppression every piece must see
])
def test_what_cannot_be_cut_is_checked_whole(small_pieces, text):
    assert pieces.check_in_pieces(text, "gen.py", RuleSet.select([], [])) is None


def test_a_string_over_every_cut_tried_falls_back(small_pieces):
    text = HEAD + 'DOC = """\n' + "".join(f"def f{i}():\n    pass\n" for i in range(2000)) + '"""\n' + BLOCK.format(i=0)
    assert pieces.check_in_pieces(text, "gen.py", RuleSet.select([], [])) is None


def test_process_file_notes_the_pieces_and_the_cache_keeps_the_note(small_pieces, monkeypatch, tmp_path):
    monkeypatch.setattr(pieces, "PIECES_MIN_CHARS", 10_000)
    path = tmp_path / "gen.py"
    path.write_text(generated(), encoding="utf-8")
    rs = RuleSet.select([], [])
    res = process_file(str(path), rs, None, fix=False)
    assert res.error is None and len(res.findings) > 100
    assert len(res.notes) == 1 and "checked in" in res.notes[0] and "pieces" in res.notes[0]
    assert result_from_dict(str(path), result_to_dict(res)).notes == res.notes
    monkeypatch.setattr(pieces, "PIECES_MIN_CHARS", 10**9)
    whole = process_file(str(path), rs, None, fix=False)
    assert whole.notes == [] and [finding_to_dict(f) for f in whole.findings] == [finding_to_dict(f) for f in res.findings]
    assert whole.frames == res.frames


@pytest.mark.slow
def test_cli_audits_a_file_over_the_threshold_in_pieces(tmp_path):
    path = tmp_path / "generated.py"
    blocks = pieces.PIECES_MIN_CHARS // len(BLOCK) + 50
    path.write_text(generated(blocks), encoding="utf-8")
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
    # run from the file's folder: how a path elsewhere is shown depends on where the checkout is (a clone under
    # /tmp shows it as ../pytest-of-root/...)
    r = subprocess.run([sys.executable, "-m", "neuron_migrate", "audit", "--no-cache", "--output-format", "concise",
                        "--select", "NM101", path.name], capture_output=True, text=True, env=env, timeout=600,
                       cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    assert f"note: {path.name}: 4.0 MB, checked in 16 pieces" in " ".join(r.stderr.split())
    # one unsuppressed mark_step per block (the other has a noqa), none from the template string
    assert sum("NM101" in line for line in r.stdout.splitlines()) == blocks


# -- two processes: a forked child checks every second piece ---------------------------------------------------------
from neuron_migrate.pipeline import parallel  # noqa: E402


def test_fork_map_splits_the_items_between_two_processes_in_order():
    me = os.getpid()
    out = parallel.fork_map(lambda x: (x * x, os.getpid()), range(7))
    assert [v for v, _ in out] == [x * x for x in range(7)]
    assert {pid for _, pid in out[0::2]} == {me}
    assert len({pid for _, pid in out[1::2]}) == 1 and out[1][1] != me  # one child did the odd items


def test_fork_map_recomputes_what_the_child_could_not_give():
    me = os.getpid()

    def fails_in_the_child(x):
        if os.getpid() != me:
            raise ValueError("child only")
        return x + 1

    assert parallel.fork_map(fails_in_the_child, range(5)) == [1, 2, 3, 4, 5]
    # a result that cannot be pickled back: computed again here
    assert [f() for f in parallel.fork_map(lambda x: (lambda: x), range(4))] == [0, 1, 2, 3]


def test_fork_map_raises_what_the_serial_loop_raises_and_leaves_no_child():
    def boom(x):
        if x == 3:
            raise KeyError(x)
        return x

    with pytest.raises(KeyError):
        parallel.fork_map(boom, range(6))  # 3 is the child's: the parent recomputes it and raises
    with pytest.raises(KeyError):
        parallel.fork_map(boom, [3, 0, 1])  # the parent's own
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)  # every child was reaped


@pytest.mark.parametrize("clean", [True, False])
def test_pieces_on_two_processes_give_the_serial_findings(small_pieces, clean):
    """With fork_map the pieces are shared between two processes; a plan a piece's tree contradicts (clean=False)
    is still found, and the parse-first plan used."""
    text = clean_generated() if clean else generated()
    rs = RuleSet.select([], [])
    serial = pieces.check_in_pieces(text, "gen.py", rs)
    forked = pieces.check_in_pieces(text, "gen.py", rs, map_pieces=parallel.fork_map)
    assert forked is not None and forked.pieces == serial.pieces > 5
    assert as_data(forked) == as_data(serial) == as_data(check_text(text, "gen.py", rs))
    assert forked.suppressed == serial.suppressed == 40


def test_a_large_file_among_few_uses_the_second_core(small_pieces, monkeypatch, tmp_path):
    monkeypatch.setattr(pieces, "PIECES_MIN_CHARS", 10_000)
    used = []
    real = parallel.fork_map
    monkeypatch.setattr(parallel, "fork_map", lambda fn, items: used.append(len(items)) or real(fn, items))
    path = tmp_path / "gen.py"
    path.write_text(generated(), encoding="utf-8")
    items = [(str(path), str(path))]
    two = list(parallel.run_files(items, RuleSet.select([], []).spec, {}, fix=False, write=False, jobs=2))
    assert used and used[0] > 5
    forked = len(used)
    one = list(parallel.run_files(items, RuleSet.select([], []).spec, {}, fix=False, write=False, jobs=1))
    assert len(used) == forked  # -j 1: one process
    assert [finding_to_dict(f) for f in two[0].findings] == [finding_to_dict(f) for f in one[0].findings]
    assert two[0].notes == one[0].notes and len(two[0].findings) > 100
