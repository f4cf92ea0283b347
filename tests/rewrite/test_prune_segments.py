"""The speed-ups of the rewrite's last steps keep their answers (issue 36: rewrite <= 2x audit on the torch tree).

`prune._segment` replaces `ast.get_source_segment` (which splits the whole text again at each call: quadratic in a
file's imports), and `xla_based_imports` skips the parse when no import statement names an XLA-based library."""
import ast

from neuron_migrate.files.lines import source_lines
from neuron_migrate.files.xla_deps import xla_based_imports
from neuron_migrate.rewrite.prune import _segment

TEXT = ('import os\r\nfrom a.b import (c,\n    d)  # é\nx = "é"; import torch_xla.core.xla_model as xm\n'
        'def f():\n    from émoji import (\n        a as b,\n    )\n    return b\n')


def test_segment_is_get_source_segment():
    tree = ast.parse(TEXT)
    lines = source_lines(TEXT, keepends=True)
    nodes = [n for n in ast.walk(tree) if isinstance(n, (ast.stmt, ast.expr))]
    assert len(nodes) >= 10
    for n in nodes:
        assert _segment(lines, n) == ast.get_source_segment(TEXT, n)


def test_xla_imports_found_without_a_parse_only_when_none_can_be_there():
    assert xla_based_imports(TEXT) == ["torch_xla"]  # after a `;`
    assert xla_based_imports("import os, torch_xla\n") == ["torch_xla"]
    assert xla_based_imports("from optimum import (\n    neuron,\n)\n") == ["optimum.neuron"]
    assert xla_based_imports('x = "torch_xla"  # import torch_xla later\nif "torch_xla" in y: pass\n') == []
    assert xla_based_imports("try:\n    import torch_xla\nexcept ImportError:\n    pass\n") == []
