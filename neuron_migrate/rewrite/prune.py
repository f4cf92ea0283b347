"""Remove the imports that the applied fixes left unused (`from torch import float64` after the float64 fix).

Generic and conservative: an imported name goes only when the original text used it and the rewritten text
no longer does (no load anywhere, no mention in a string such as `__all__` or an annotation). Imports the
user left unused are theirs; imports inside `try:` (availability probes) and `__future__` stay; a
statement with a comment is left as written.
"""
from __future__ import annotations

import ast
import re
from collections import Counter
from typing import Optional

from neuron_migrate.names.analysis import child_nodes, walk
from neuron_migrate.rules.model import Edit, Fix, FixSafety, Span


def _uses(tree: ast.AST) -> tuple[Counter, str]:
    names: Counter = Counter()
    strings = []
    for n in walk(tree):
        if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Store):
            names[n.id] += 1
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            strings.append(n.value)
    return names, "\n".join(strings)


def _imports_outside_try(tree: ast.AST):
    stack = [(tree, False)]
    while stack:
        node, in_try = stack.pop()
        for child in child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                if not in_try:
                    yield child
                continue
            stack.append((child, in_try or isinstance(child, (ast.Try, getattr(ast, "TryStar", ast.Try)))))


def _bound(alias: ast.alias, is_from: bool) -> str:
    return alias.asname or (alias.name if is_from else alias.name.split(".")[0])


def _char_col(line: str, byte_col: int) -> int:
    return len(line.encode("utf-8")[:byte_col].decode("utf-8", errors="replace"))


def _alias_text(a: ast.alias) -> str:
    return f"{a.name} as {a.asname}" if a.asname else a.name


def unused_import_fixes(before: str, after: str, before_tree: Optional[ast.Module] = None,
                        after_tree: Optional[ast.Module] = None) -> list[Fix]:
    """Fixes that remove imports of `after` whose names `before` used and `after` no longer does (the texts' trees,
    when the caller has them, save parsing them again)."""
    try:
        old_tree = before_tree or ast.parse(before)
        new_tree = after_tree or ast.parse(after)
    except (SyntaxError, ValueError, RecursionError):
        return []
    old_uses, _ = _uses(old_tree)
    new_uses, strings = _uses(new_tree)
    lines = after.splitlines(keepends=True)
    fixes = []
    for stmt in _imports_outside_try(new_tree):
        is_from = isinstance(stmt, ast.ImportFrom)
        if is_from and (stmt.module == "__future__" or any(a.name == "*" for a in stmt.names)):
            continue
        gone = []
        for a in stmt.names:
            name = _bound(a, is_from)
            if old_uses[name] and not new_uses[name] and not re.search(rf"\b{re.escape(name)}\b", strings):
                gone.append(a)
        if not gone:
            continue
        seg = "".join(lines[stmt.lineno - 1 : stmt.end_lineno])
        if "#" in seg or ";" in seg:
            continue  # a comment or a shared line: leave the statement as the user wrote it
        span = Span(stmt.lineno, _char_col(lines[stmt.lineno - 1], stmt.col_offset), stmt.end_lineno,
                    _char_col(lines[stmt.end_lineno - 1], stmt.end_col_offset))
        keep = [a for a in stmt.names if a not in gone]
        if not keep:
            edit = Edit("delete_stmt", span)
        elif is_from:
            names = ", ".join(_alias_text(a) for a in keep)
            edit = Edit("replace_stmt", span, f"from {'.' * stmt.level}{stmt.module or ''} import {names}")
        else:
            edit = Edit("replace_stmt", span, "import " + ", ".join(_alias_text(a) for a in keep))
        fixes.append(Fix(FixSafety.SAFE, [edit], description="remove an import the rewrite left unused"))
    return fixes
