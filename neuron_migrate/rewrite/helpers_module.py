"""`rewrite --helpers-module PATH`: the helpers go into one shared module that rewritten files import.

The module's import name follows from its path (packages up from the file while `__init__.py` exists;
otherwise the file's stem, importable when it sits beside the scripts). The module is created, or missing
helpers are added to it; helpers it already defines stay as they are.
"""
from __future__ import annotations

import ast
from pathlib import Path

from neuron_migrate.rules.api import PREFERRED_ALIAS
from neuron_migrate.rules.model import ImportReq

HEADER = '"""Helpers shared by the files neuron-migrate rewrote (created by `rewrite --helpers-module`)."""\n'


def module_name(path: Path) -> str:
    path = Path(path).resolve()
    parts = [path.stem]
    d = path.parent
    while (d / "__init__.py").exists():
        parts.insert(0, d.name)
        d = d.parent
    return ".".join(parts)


def _with_deps(names: list[str]) -> list[str]:
    from neuron_migrate.rules.helpers import HELPERS

    out: list[str] = []

    def add(n: str):
        if n in out or n not in HELPERS:
            return
        for dep in HELPERS[n].requires:
            add(dep)
        out.append(n)

    for n in names:
        add(n)
    return out


def module_text(existing: str, names: list[str]) -> str:
    """`existing` (may be empty) with every helper of `names` (and what they need) defined once."""
    from neuron_migrate.rewrite.insert import insert_support
    from neuron_migrate.rules.helpers import HELPERS

    text = existing or HEADER
    try:
        defined = {s.name for s in ast.parse(text).body if isinstance(s, (ast.FunctionDef, ast.ClassDef))}
    except SyntaxError:
        raise ValueError("the helpers module is not valid Python") from None
    imports: list[ImportReq] = []
    helpers: list[tuple[str, str]] = []
    for n in _with_deps(names):
        if n in defined:
            continue
        spec = HELPERS[n]
        spelled = {}
        for ph, module in (spec.imports or {}).items():
            alias = PREFERRED_ALIAS.get(module)
            imports.append(ImportReq(module, alias))
            spelled[ph] = alias or module
        helpers.append((n, spec.source.format(**spelled)))
    if not helpers:
        return text
    return insert_support(text, imports, helpers, only_called=False)
