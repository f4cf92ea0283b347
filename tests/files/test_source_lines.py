"""Lines are counted as Python counts them: a form feed, a vertical tab or a \u2028 stays inside its line (str.splitlines
would break there, and every line number below it would point one line too far)."""
from __future__ import annotations

import ast

import pytest

from neuron_migrate.files.lines import source_lines
from neuron_migrate.pipeline.process import process_file
from neuron_migrate.rules.registry import RuleSet

ODD = 'import os\n\x0c\ndef f():\n    s = "a\u2028b"  # \x0b\x1c\x85\n    return s\r\nx = 1\ry = 2\nlast'


def test_lines_are_the_tokenizer_lines():
    lines = source_lines(ODD)
    assert lines == ["import os", "\x0c", "def f():", '    s = "a\u2028b"  # \x0b\x1c\x85', "    return s", "x = 1",
                     "y = 2", "last"]
    assert "".join(source_lines(ODD, keepends=True)) == ODD
    for node in ast.walk(ast.parse(ODD)):  # ast's line numbers index these lines
        if isinstance(node, ast.Name) and node.id in ("x", "y", "s"):
            assert source_lines(ODD)[node.lineno - 1][node.col_offset:].startswith(node.id)


@pytest.mark.parametrize("text", ["", "a", "a\n", "a\r\nb\rc\n\n", "\n\n", "x = 1\r\n"])
def test_plain_texts_split_as_splitlines_does(text):
    assert source_lines(text) == text.splitlines()
    assert source_lines(text, keepends=True) == text.splitlines(keepends=True)


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8"))
    return path


def test_a_form_feed_does_not_move_suppressions_or_findings(tmp_path):
    path = write(tmp_path, "paged.py", "import torch_xla.core.xla_model as xm\n\x0c\ndef f():\n"
                                       "    xm.mark_step()  # noqa: NM101\n    xm.mark_step()\n")
    res = process_file(str(path), RuleSet.select([], []), None, fix=False)
    assert [(f.rule.code, f.span.line) for f in res.findings] == [("NM101", 5)]  # line 4's is suppressed
    assert res.suppressed == 1 and res.frames == {5: "    xm.mark_step()"}


def test_rewrite_of_a_paged_file_keeps_its_form_feeds(tmp_path):
    before = ("import torch\nimport torch_xla.core.xla_model as xm\n\n\ndef g():\n    return 1\n\x0c\ndef f(model):\n"
              "    x = torch.zeros(3).to(xm.xla_device())  # \x0c odd\n    xm.mark_step()\n    return x\n")
    after = ("import torch\n\n\ndef g():\n    return 1\n\x0c\ndef f(model):\n"
             '    x = torch.zeros(3).to(torch.device("neuron"))  # \x0c odd\n    return x\n')
    path = write(tmp_path, "paged.py", before)
    res = process_file(str(path), RuleSet.select([], []), None, fix=True, write=True)
    assert res.error is None and res.written
    assert path.read_bytes() == after.encode("utf-8")
