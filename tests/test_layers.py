"""The package layout follows the flow: every import between packages points down the stack, so no two
packages can import each other (no cycles between packages).

Function-local imports count too (they are how the CLI stays light, and they still make a cycle).
"""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "neuron_migrate"

# Lowest first. A package may import its own modules and any package on a lower layer.
LAYERS = [
    {"_data"},
    {"files"},  # discovery, reading, notebooks, config, atomic writes
    {"names", "table"},  # name resolution; the compatibility table (data)
    {"program", "repository"},  # the whole-program model of a file; the repository model (programs across files)
    {"rules"},  # rule model, API, registry, built-in and YAML rules
    {"rewrite", "probe", "shell", "deps"},  # stages that use the rules
    {"verify"},  # runs the original and the rewritten program side by side (rewrite, the emulated device)
    {"report"},  # output formats
    {"pipeline"},  # per-file processing, the process pool, the cache
    {"cli", "server"},  # commands and the language server
]
LAYER = {pkg: i for i, group in enumerate(LAYERS) for pkg in group}


def _package_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "neuron_migrate" or len(parts) < 2:
        return None
    return parts[1]


def _imports(path: Path, package: str):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this file's package
                base = ["neuron_migrate", package][: 2 - (node.level - 1)] if package else ["neuron_migrate"]
                yield node.lineno, ".".join(base + ([node.module] if node.module else []))
            elif node.module:
                yield node.lineno, node.module


def _edges():
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        if len(rel.parts) == 1:  # neuron_migrate/__init__.py, __main__.py: the top
            continue
        package = rel.parts[0]
        for line, module in _imports(path, package):
            target = _package_of(module)
            if target and target != package:
                yield package, target, f"{rel}:{line} imports {module}"


def test_every_package_has_a_layer():
    packages = {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    missing = sorted(packages - set(LAYER))
    assert not missing, f"add {missing} to LAYERS in tests/test_layers.py (where they sit in the flow)"


def test_imports_point_down_the_stack():
    # `>=`: packages on one layer are independent of each other, so no two packages can import each other.
    wrong = [why for src, dst, why in _edges() if LAYER[dst] >= LAYER[src]]
    assert not wrong, "imports that point up the stack or sideways:\n" + "\n".join(wrong)
