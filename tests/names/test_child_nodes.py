"""names.analysis.child_nodes / walk: the walk's own child iterator must see what ast.iter_child_nodes sees, less the
expression contexts and operators (shared singletons no rule looks at)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from neuron_migrate.names.analysis import child_nodes, walk

_SKIPPED = (ast.expr_context, ast.operator, ast.cmpop, ast.unaryop, ast.boolop)
ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted([*ROOT.glob("neuron_migrate/**/*.py"), *ROOT.glob("tests/fixtures/**/*.py"),
                  *ROOT.glob("tests/integration/realistic/*.py")])

EDGE_CASES = '''
global_name = 1
def f(a, /, b=1, *args, c, d=2, **kw):
    global global_name
    def g():
        nonlocal a
    return {**kw, "k": a}
lambda *, x=1, y: x
match a:
    case {"k": 1, **rest}: pass
    case Point(x=0, y=yy) as p: pass
    case [1, *others] | None: pass
    case True: pass
try:
    pass
except ValueError as err:
    pass
try:
    pass
except* TypeError:
    pass
x = f"{a!r:>{b}}"
async def h():
    async with a as b, c:
        [i async for i in b if i]
'''


def _expected(node):
    return [c for c in ast.iter_child_nodes(node) if not isinstance(c, _SKIPPED)]


@pytest.mark.parametrize("text", [EDGE_CASES], ids=["edge-cases"])
def test_same_children_as_ast_on_edge_cases(text):
    tree = ast.parse(text)
    for node in ast.walk(tree):
        assert child_nodes(node) == _expected(node), ast.dump(node)[:200]


def test_same_children_and_walk_order_on_real_sources():
    assert len(SOURCES) > 100
    for path in SOURCES:
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue  # hostile-input fixtures
        for node in ast.walk(tree):
            assert child_nodes(node) == _expected(node), f"{path}:{getattr(node, 'lineno', '?')}"
        assert list(walk(tree)) == [n for n in ast.walk(tree) if not isinstance(n, _SKIPPED)], str(path)
