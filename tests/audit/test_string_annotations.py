"""The string-annotation scan (which keeps an import a forward reference names) finds every annotation."""
import ast
import textwrap

from neuron_migrate.rules.builtin.xla_core import _annotations

SOURCE = textwrap.dedent('''
    import torch_xla.core.xla_model as xm
    x: "xm.A" = 1

    def f(a: "xm.B", /, b: int = 2, *c: "xm.C", d: "xm.D", **e: "xm.E") -> "xm.F":
        y: "xm.G"
        async def g() -> "xm.H":
            pass
        lam = lambda q: q
        return lam

    class K:
        z: "xm.I"
        def m(self) -> "Optional[xm.J]":
            for i in range(3):
                w: "xm.K" = i
            else:
                u: "xm.L"
            while False:
                pass
            else:
                v: "xm.M"
            with open("f") as fh:
                r: "xm.N"

    try:
        t: "xm.O"
    except ImportError:
        t2: "xm.P"
    else:
        t3: "xm.Q"
    finally:
        t4: "xm.R"

    if True:
        def h(p: "xm.S"): ...
    elif False:
        s1: "xm.T"
    else:
        s2: "xm.U"

    match x:
        case 1:
            m1: "xm.V"
        case _:
            async def k(*, kw: "xm.W"): ...
''')


def _by_full_walk(tree):
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append(node.returns)
        elif isinstance(node, (ast.arg, ast.AnnAssign)):
            out.append(node.annotation)
    return {id(a) for a in out if a is not None}


def test_statement_walk_finds_what_a_full_walk_finds():
    tree = ast.parse(SOURCE)
    found = list(_annotations(tree))
    assert {id(a) for a in found} == _by_full_walk(tree)
    names = {ast.literal_eval(a).replace("Optional[", "").rstrip("]") for a in found if isinstance(a, ast.Constant)}
    assert names == {f"xm.{c}" for c in "ABCDEFGHIJKLMNOPQRSTUVW"}
