"""The whole-program model: facts about a file that no single call site shows.

Sits between name resolution (`names/`) and the rules: launch mode (entry point or library), whether a process
group exists (and is guaranteed) at a point, whether an optimizer's model is always DDP-wrapped, which values
reach the device, which string values flow into which comparisons. Rules ask it instead of guessing from one site.
"""
from __future__ import annotations

from collections.abc import Callable

TYPE_CHECKING = False  # typing is not imported at run time (start-up): it serves annotations only
if TYPE_CHECKING:
    from typing import TypeVar

    T = TypeVar("T")


def cached(analysis, key: str, build: Callable[[object], T]) -> T:
    """The fact set `key` of one file, built once per `names.analysis.Analysis` and shared by every rule.

    Each module of this package exposes one entry point `facts(analysis)` that calls this, so a rule pays for a
    whole-program fact only in files where some rule asks for it.
    """
    store = analysis.__dict__.setdefault("_program_facts", {})
    if key not in store:
        store[key] = build(analysis)
    return store[key]


def nodes_with_function(analysis) -> list:
    """(node, innermost enclosing def or None) for the file's nodes, in the order the value and device passes
    visit them. A def's body belongs to it; its defaults and decorators to the enclosing function (annotations and
    parameters are not listed). Built once per file and shared, instead of one tree walk per pass."""
    def build(a) -> list:
        import ast

        from neuron_migrate.names.analysis import child_nodes

        defs = (ast.FunctionDef, ast.AsyncFunctionDef)
        out: list = []
        stack: list = [(a.tree, None)]
        while stack:
            node, fn = stack.pop()
            out.append((node, fn))
            if isinstance(node, defs):
                for child in node.body:
                    stack.append((child, node))
                for child in [*node.args.defaults, *[d for d in node.args.kw_defaults if d], *node.decorator_list]:
                    stack.append((child, fn))
                continue
            for child in child_nodes(node):
                stack.append((child, fn))
        return out

    return cached(analysis, "nodes_with_function", build)
