"""Which XLA-based libraries a (rewritten) Python file still imports: torch_xla and the libraries built on it
(NeuronX Distributed, NxD Training, optimum-neuron). A file that imports one after `rewrite` is not migrated,
whatever else was rewritten in it; the rewrite summary says so (cli/rewrite_run.py).

An import inside `try:` whose handler catches ImportError is optional (a feature probe, NM107): it does not count.
"""
from __future__ import annotations

import re

XLA_BASED_LIBRARIES = ("torch_xla", "neuronx_distributed", "neuronx_distributed_training", "optimum.neuron")
_LINE = re.compile(r"^[\s\"']*(?:from|import)\s+(torch_xla|neuronx_distributed_training|neuronx_distributed|optimum\.neuron)\b",
                   re.MULTILINE)
# a line (or a `;`-separated statement) that imports something and names an XLA-based library's top package
_IMPORT_LINE = re.compile(r"(?:^|;)[ \t]*(?:from|import)[ \t][^\n]*\b(?:torch_xla|neuronx_distributed|optimum)\b", re.MULTILINE)
_IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


def _library(module: str) -> str | None:
    for lib in XLA_BASED_LIBRARIES:
        if module == lib or module.startswith(lib + "."):
            return lib
    return None


def _optional(handlers) -> bool:
    import ast

    for h in handlers:
        if h.type is None:
            return True
        types = h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]
        if any((t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) else "") in _IMPORT_ERRORS for t in types):
            return True
    return False


def xla_based_imports(text: str, python: bool = True, parsed: tuple | None = None) -> list[str]:
    """The XLA-based libraries `text` imports unconditionally, sorted. Not Python (a notebook's JSON) or not
    parseable: the import lines found by pattern. `parsed`: (a text, its ast) already at hand, used instead of a
    parse when the text is `text`."""
    if not any(lib.split(".")[0] in text for lib in XLA_BASED_LIBRARIES):
        return []
    if python and not _IMPORT_LINE.search(text):
        return []  # no import statement names one (the mentions are strings, comments, attributes): no parse needed
    if python:
        import ast

        if parsed is not None and parsed[1] is not None and parsed[0] == text:
            tree = parsed[1]
        else:
            try:
                tree = ast.parse(text)
            except (SyntaxError, ValueError):
                tree = None
        if tree is not None:
            found: set = set()

            blocks = (ast.stmt, ast.excepthandler, ast.match_case)  # what can hold an import: never an expression

            def visit(node, optional: bool) -> None:
                for child in ast.iter_child_nodes(node):
                    if not isinstance(child, blocks):
                        continue
                    if isinstance(child, ast.Try) or type(child).__name__ == "TryStar":
                        guarded = optional or _optional(child.handlers)
                        for stmt in child.body:
                            visit_stmt(stmt, guarded)
                        for part in (child.handlers, child.orelse, child.finalbody):
                            for stmt in part:
                                visit_stmt(stmt, optional)
                    else:
                        visit_stmt(child, optional)

            def visit_stmt(stmt, optional: bool) -> None:
                if isinstance(stmt, ast.Import) and not optional:
                    found.update(filter(None, (_library(a.name) for a in stmt.names)))
                elif isinstance(stmt, ast.ImportFrom) and stmt.module and not stmt.level and not optional:
                    lib = _library(stmt.module) or next(filter(None, (_library(f"{stmt.module}.{a.name}") for a in stmt.names)), None)
                    if lib:
                        found.add(lib)
                elif isinstance(stmt, (ast.Try,)) or type(stmt).__name__ == "TryStar":
                    wrapper = ast.Module(body=[stmt], type_ignores=[])
                    visit(wrapper, optional)
                else:
                    visit(stmt, optional)

            visit(tree, False)
            return sorted(found)
    return sorted({m.group(1) for m in _LINE.finditer(text)})
