"""IPython syntax that Jupyter runs, in notebooks (issue 38, point 2): each shape parses, and comes back byte for byte.

A notebook is analysed as one Python text; IPython escapes in it are masked the way IPython's input transformers
see them: a comment where one may stand, else a placeholder per escape (the only body of an `if`, the value of
`VERSION = !curl ...`), a continuation line (`%pip install ... \\`) with its escape, and `%time CODE` as CODE.
"""
from __future__ import annotations

import ast
import json

import pytest

from neuron_migrate.files.notebook import dump_notebook, load_notebook, mask_cell, unmask_line

SHAPES = {
    "shell_only_body_of_if": "import os\nif not os.path.exists('data'):\n    !wget -q https://example.com/d.zip\n    !unzip -q d.zip\n",
    "pip_continuation": "%pip install torch torch_xla \\\n    transformers==5.0\nx = 1\n",
    "pip_continuation_unindented": "!pip install -q \\\ntorch_xla\nx = 1",
    "assign_from_shell": "VERSION = !curl -s https://example.com/version.txt\nprint(VERSION)\n",
    "assign_from_magic_in_def": "def f():\n    env = %env PJRT_DEVICE\n    return env\n",
    "magic_only_body_of_for": "for i in range(3):\n    %cd ..\n",
    "magic_in_else": "if flag:\n    pass\nelse:\n    %env PJRT_DEVICE=TPU\n",
    "help_in_block": "if True:\n    torch.ones?\n",
    "timed_code_in_block": "for i in range(2):\n    %time y = f(i)  # timed\n    %timeit -n 10 g(y)\n",
    "double_bang_with_tuple_assign": "a, b = !!ls\n",
}


def _nb(cells) -> bytes:
    nb = {"cells": [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": s}
                    for s in cells],
          "metadata": {"language_info": {"name": "python"}}, "nbformat": 4, "nbformat_minor": 5}
    return (json.dumps(nb, indent=1, sort_keys=True) + "\n").encode()


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_each_shape_parses_and_comes_back_byte_for_byte(name):
    src = SHAPES[name]
    lines = mask_cell(src)
    assert len(lines) == len(src.split("\n"))  # line for line: findings keep their cell lines
    ast.parse("\n".join(lines))
    assert "\n".join(unmask_line(ln) for ln in lines) == src
    raw = _nb(["import torch\n", src])
    nb = load_notebook(raw)
    ast.parse(nb.text)
    assert dump_notebook(nb, nb.text) == raw


def test_timed_code_is_analysed_as_code():
    lines = mask_cell(SHAPES["timed_code_in_block"])
    tree = ast.parse("\n".join(lines))
    calls = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert calls == {"range", "f", "g"}


def test_a_notebook_with_escapes_in_blocks_is_rewritten(tmp_path):
    from neuron_migrate.pipeline.process import process_file
    from neuron_migrate.rules.api import Settings
    from neuron_migrate.rules.registry import RuleSet, all_rules

    cells = [
        ["import os\n", "import torch\n", "import torch_xla.core.xla_model as xm\n"],
        ["if not os.path.exists('data'):\n", "    !wget -q https://example.com/data.zip\n"],
        ["%pip install torch torch_xla \\\n", "    transformers==5.0\n"],
        ["VERSION = !curl -s https://example.com/version.txt\n", "print(VERSION)\n"],
        ["for i in range(2):\n", "    %time y = torch.ones(2).to(xm.xla_device())\n", "    xm.mark_step()\n"],
        ["def f():\n", "    env = %env PJRT_DEVICE\n", "    return env\n"],
    ]
    path = tmp_path / "train.ipynb"
    path.write_bytes(_nb(cells))
    res = process_file(str(path), RuleSet([r for r in all_rules() if not r.opt_in]), Settings(), fix=True, write=True)
    assert res.error is None and res.written
    after = [c["source"] for c in json.loads(path.read_text())["cells"]]
    assert after[1:4] == cells[1:4] and after[5] == cells[5]  # the escapes, byte for byte
    assert after[4] == ["for i in range(2):\n", '    %time y = torch.ones(2).to(torch.device("neuron"))\n']
    assert after[0] == ["import os\n", "import torch\n"]


def test_the_editor_server_joins_cells_the_same_way():
    from neuron_migrate.server.core import join_cells, split_cells

    cells = [(f"cell{i}", src) for i, src in enumerate(SHAPES.values())] + [("last", "z = 0")]
    text, spans = join_cells(cells)
    ast.parse(text)
    # (split_cells gives a cell's source less one final newline, as the editor's cell documents hold it)
    assert split_cells(text, len(cells)) == [src[:-1] if src.endswith("\n") else src for _, src in cells]
