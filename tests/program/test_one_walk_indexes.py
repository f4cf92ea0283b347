"""The one-walk indexes of the program model (values.prepare, distributed._index) give what the plain two-walk
versions they replaced give, on every fixture and example file: the oracles below are those versions. (values.prepare
now reads the shared node list and parent map, with no walk of its own; distributed._index reads the name walk's
resolutions and parent map: the same oracles hold them.)"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from neuron_migrate.names.analysis import Analysis, AnalysisError, child_nodes, walk
from neuron_migrate.program import distributed, values

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted([*ROOT.glob("tests/fixtures/**/*.py"), *ROOT.glob("examples/**/*.py"), *ROOT.glob("neuron_migrate/program/*.py")])


def _analyses():
    for f in FILES:
        try:
            yield f, Analysis(f.read_text(encoding="utf-8"), str(f))
        except (AnalysisError, UnicodeDecodeError):
            continue


def _walk_function(fn):
    stack = list(fn.body)
    while stack:
        n = stack.pop()
        yield n
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        stack.extend(child_nodes(n))


def _prepare_oracle(tree):
    functions, local_names, is_script = {}, {}, False
    for node in walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions.setdefault(node.name, node)
            names = {a.arg for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs,
                                     node.args.vararg, node.args.kwarg] if a is not None}
            glob: set = set()
            for sub in _walk_function(node):
                if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                    names.add(sub.id)
                elif isinstance(sub, (ast.Global, ast.Nonlocal)):
                    glob.update(sub.names)
            local_names[id(node)] = names - glob
        elif isinstance(node, ast.If) and values._is_main_guard(node.test):
            is_script = True
    return functions, local_names, is_script


def _index_oracle(facts, a):
    calls, local_calls, refs, local_refs, defs, callees, env = {}, {}, {}, {}, {}, set(), False
    for node in walk(a.tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            defs.setdefault(node.name, []).append(node)
        elif isinstance(node, ast.Call):
            callees.add(id(node.func))
            if isinstance(node.func, (ast.Name, ast.Attribute)):
                q = facts.qualname(node.func)
                if q is not None:
                    calls.setdefault(q, []).append(node)
                elif isinstance(node.func, ast.Name):
                    local_calls.setdefault(node.func.id, []).append(node)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in distributed.TORCHRUN_ENV:
            env = True
    for node in walk(a.tree):
        if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load):
            if id(node) in callees or isinstance(a.parent_of.get(node), ast.Attribute):
                continue
            q = facts.qualname(node)
            if q is not None:
                refs.setdefault(q, []).append(node)
            elif isinstance(node, ast.Name) and node.id in defs:
                local_refs.setdefault(node.id, []).append(node)
    return calls, local_calls, refs, local_refs, defs, env


def _position(node):
    return node.lineno, node.col_offset


def _in_source_order(index):
    """An index (name -> nodes) with each list sorted by position; a flag as it is."""
    if isinstance(index, bool):
        return index
    return {k: sorted(v, key=_position) for k, v in index.items()}


def test_there_are_files_to_compare():
    assert len(FILES) > 100


@pytest.mark.parametrize("chunk", range(4))
def test_one_walk_indexes_match_the_two_walk_oracles(chunk):
    checked = 0
    for i, (f, a) in enumerate(_analyses()):
        if i % 4 != chunk:
            continue
        b = values._Builder(a)
        b.prepare()
        functions, local_names, is_script = _prepare_oracle(a.tree)
        assert (b.functions, b.locals, b.is_script) == (functions, local_names, is_script), f
        assert list(b.locals) == list(local_names), f  # same order too
        facts = distributed.facts(a)
        got = (facts.calls, facts.local_calls, facts.refs, facts.local_refs, facts.defs, facts._env_strings)
        # the same nodes under the same names; the oracle lists them breadth-first, the index in source order
        assert [_in_source_order(x) for x in got] == [_in_source_order(x) for x in _index_oracle(facts, a)], f
        for index in (facts.local_calls, facts.local_refs, facts.defs):
            assert all(nodes == sorted(nodes, key=_position) for nodes in index.values()), f
        checked += 1
    assert checked


SHAPES = '''
import torch

def f(a, *b, c=(z := 1), **d):
    x = 1
    global g
    g = 2
    class K:
        k = 3
        def m(self):
            q = 4
    def inner():
        nonlocal x
        x = 5
        w = [y for y in range(3)]
    lam = lambda v: (u := v)
    for i, (j, k2) in enumerate([]):
        pass
    with open("p") as fh:
        pass
    try:
        pass
    except Exception as exc:
        pass
    match a:
        case [m1, *rest]:
            pass

@decorate(n := 1)
def f():
    pass

if True:
    def dup():
        return 1
else:
    def dup():
        return 2

class Outer:
    def dup(self):
        pass

def dup():
    pass

if __name__ == "__main__":
    f()
'''



def test_prepare_on_scope_edge_cases():
    """Walrus in defaults, decorators and lambdas, a class and defs inside a def, `global`/`nonlocal`, and defs of
    one name at several depths (the shallowest, then the first in the source, is the function of that name)."""
    a = Analysis(SHAPES)
    b = values._Builder(a)
    b.prepare()
    functions, local_names, is_script = _prepare_oracle(a.tree)
    assert (b.functions, b.locals, b.is_script) == (functions, local_names, is_script)
    assert list(b.locals) == list(local_names)
    first_f = b.functions["f"]
    assert first_f.args.args[0].arg == "a" and b.is_script
    assert b.functions["dup"].col_offset == 0  # the module-level def, below three nested ones
    # (`g` is declared global; the value pass counts a walrus inside a lambda as the function's (Python binds it
    # in the lambda); handler and match-capture names are not Name nodes; the class body and nested defs keep theirs)
    assert b.locals[id(first_f)] == {"a", "b", "c", "d", "x", "lam", "u", "i", "j", "k2", "fh"}
