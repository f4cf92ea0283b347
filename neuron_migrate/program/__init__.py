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


class ProgramNodes:
    """The nodes the value and device passes look at, each with its innermost enclosing def (None: module level),
    in the order those passes visit them. A def's body belongs to it; its defaults and decorators to the enclosing
    function (annotations and parameters are not listed).

    - `flow`: defs, classes, assignments, returns, comparisons, calls, dicts and subscripts (what values.py and
      device_flow.py interpret);
    - `binding`: names stored or deleted, `global`/`nonlocal` statements, defs and `if` statements (what decides a
      function's local names and whether the file is a script).

    Built in one walk of the tree and shared: each pass then loops over its few nodes instead of every node of the
    file (a third of which are names that are only read)."""

    def __init__(self, flow: list, binding: list):
        self.flow = flow
        self.binding = binding


_KINDS: dict = {}  # node type -> 1: flow, 2: binding, 3: both (ast.Name: binding when stored or deleted)


def _program_kinds() -> dict:
    """_KINDS, filled on first use (this package imports no `ast` at start-up)."""
    if not _KINDS:
        import ast

        _KINDS.update({t: 1 for t in (ast.ClassDef, ast.Assign, ast.AnnAssign, ast.Return, ast.Compare, ast.Call,
                                      ast.Dict, ast.Subscript)})
        _KINDS.update({t: 2 for t in (ast.Global, ast.Nonlocal, ast.If)})
        _KINDS.update({ast.FunctionDef: 3, ast.AsyncFunctionDef: 3})
    return _KINDS


def program_nodes(analysis) -> ProgramNodes:
    """The file's `ProgramNodes`, built once per analysis."""
    def build(a) -> ProgramNodes:
        import ast

        from neuron_migrate.names.analysis import child_nodes

        kinds = _program_kinds()
        Name, Load = ast.Name, ast.Load
        defs = (ast.FunctionDef, ast.AsyncFunctionDef)
        flow: list = []
        binding: list = []
        stack: list = [(a.tree, None)]
        pop, push = stack.pop, stack.append
        while stack:
            node, fn = pop()
            t = type(node)
            if t is Name:
                if type(node.ctx) is not Load:
                    binding.append((node, fn))
                continue  # no children
            k = kinds.get(t)
            if k is not None:
                if k & 1:
                    flow.append((node, fn))
                if k & 2:
                    binding.append((node, fn))
                if t in defs:
                    for child in node.body:
                        push((child, node))
                    for child in [*node.args.defaults, *[d for d in node.args.kw_defaults if d], *node.decorator_list]:
                        push((child, fn))
                    continue
            for child in child_nodes(node):
                push((child, fn))
        return ProgramNodes(flow, binding)

    return cached(analysis, "program_nodes", build)
