"""Where inserted imports and helpers go: where isort would put them, and always before their first use.

Imports join the import block of the file's header (its leading imports) in the section isort would give
them (`__future__`, stdlib, third-party, first-party, relative), at their sorted place when the section is
sorted, or start a new section there. Helper functions go below the header imports. Both move up, to just
before a statement, when module-level code runs them earlier: a statement that uses the name, or calls a
module function (or instantiates a module class) whose body uses it. A helper's own imports and helpers are
placed before it. A name the file already binds (an import further down, say) is imported again in the
header only when the existing binding comes after such a first use.
"""
from __future__ import annotations

import ast
import re
import sys
from functools import lru_cache
from typing import Optional

from neuron_migrate.files.lines import source_lines
from neuron_migrate.names.analysis import walk
from neuron_migrate.rules.model import ImportReq

INF = 1 << 60

_STDLIB = set(getattr(sys, "stdlib_module_names", ())) | {"__future__"}
# roots isort users would see in the third-party section; used to tell first-party groups apart
_KNOWN_THIRD = {
    "torch", "torchvision", "torchaudio", "torchtext", "torch_xla", "torch_neuronx", "numpy", "scipy", "pandas",
    "transformers", "datasets", "accelerate", "lightning", "pytorch_lightning", "tqdm", "yaml", "PIL", "sklearn",
    "matplotlib", "tensorboard", "tensorboardX", "wandb", "deepspeed", "apex", "timm", "einops", "safetensors",
    "huggingface_hub", "optimum", "absl", "fairscale", "megatron", "tokenizers", "jax", "tensorflow", "h5py",
}
# section order, as isort has it
_FUTURE, _STD, _THIRD, _FIRST, _LOCAL = range(5)


class InsertError(Exception):
    pass


def _start(stmt: ast.stmt) -> int:
    return min([stmt.lineno, *[d.lineno for d in getattr(stmt, "decorator_list", [])]])


def _import_category(stmt: ast.stmt) -> int:
    if isinstance(stmt, ast.ImportFrom):
        if stmt.level:
            return _LOCAL
        mod = stmt.module or ""
        if mod == "__future__":
            return _FUTURE
    else:
        mod = stmt.names[0].name
    root = mod.split(".")[0]
    return _STD if root in _STDLIB else _THIRD


def _module_category(module: str) -> int:
    return _STD if module.split(".")[0] in _STDLIB else _THIRD


def _sort_key(stmt: ast.stmt) -> tuple:
    if isinstance(stmt, ast.ImportFrom):
        return (1, ("." * stmt.level + (stmt.module or "")).lower())
    return (0, stmt.names[0].name.lower())


def _req_key(req: ImportReq) -> tuple:
    st = req.statement()
    if st.startswith("from "):
        return (1, st.split()[1].lower())
    return (0, req.module.lower())


def _bound_name(req: ImportReq) -> str:
    st = req.statement()
    if " as " in st:
        return st.rsplit(" as ", 1)[1].strip()
    if st.startswith("from "):
        return st.rsplit(" import ", 1)[1].strip()
    return req.module.split(".")[0]


# -- which names module-level code needs, and where ------------------------------------------------
class _ExecNames(ast.NodeVisitor):
    """Names loaded when a statement runs (function and lambda bodies excluded), and names it calls."""

    def __init__(self):
        self.loads: set[str] = set()
        self.calls: set[str] = set()

    def visit_Name(self, node):
        if isinstance(node.ctx, ast.Load):
            self.loads.add(node.id)

    def visit_Call(self, node):
        if isinstance(node.func, ast.Name):
            self.calls.add(node.func.id)
        self.generic_visit(node)

    def _function(self, node):
        for d in node.decorator_list:
            self.visit(d)
        for d in [*node.args.defaults, *[k for k in node.args.kw_defaults if k is not None]]:
            self.visit(d)

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def visit_Lambda(self, node):
        for d in [*node.args.defaults, *[k for k in node.args.kw_defaults if k is not None]]:
            self.visit(d)


def _all_names(node: ast.AST) -> tuple[set[str], set[str]]:
    loads, calls = set(), set()
    for n in walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            loads.add(n.id)
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name):
            calls.add(n.func.id)
    return loads, calls


def _loaded(body: list[ast.stmt], names: set[str]) -> set[str]:
    """Which of `names` the statements load somewhere; the walk stops once it has seen them all (the names a fix
    imports are mostly used near the top of the file)."""
    found: set[str] = set()
    if not names:
        return found
    for stmt in body:
        for n in walk(stmt):
            if type(n) is ast.Name and n.id in names and type(n.ctx) is ast.Load and n.id not in found:
                found.add(n.id)
                if len(found) == len(names):
                    return found
    return found


def first_exec_uses(body: list[ast.stmt]) -> dict[str, int]:
    """name -> index of the first top-level statement that needs it bound when it runs."""
    defs = {}
    for s in body:
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defs.setdefault(s.name, s)
    deferred: dict[str, tuple[set, set]] = {}

    def names_of_def(name: str) -> tuple[set, set]:
        if name not in deferred:
            deferred[name] = _all_names(defs[name])
        return deferred[name]

    first: dict[str, int] = {}
    for i, stmt in enumerate(body):
        v = _ExecNames()
        v.visit(stmt)
        names = set(v.loads)
        todo = [c for c in v.calls if c in defs]
        seen = set(todo)
        while todo:
            loads, calls = names_of_def(todo.pop())
            names |= loads
            for c in calls:
                if c in defs and c not in seen:
                    seen.add(c)
                    todo.append(c)
        for n in names:
            first.setdefault(n, i)
    return first


def _bindings(body: list[ast.stmt]) -> dict[str, list[tuple[int, ast.stmt]]]:
    """name -> [(top-level index, binding statement)] for module-level bindings (guarded imports included)."""
    out: dict[str, list] = {}

    def add(name, i, s):
        out.setdefault(name, []).append((i, s))

    # an explicit stack, not a recursive closure: that would be a reference cycle holding the tree
    stack = [(i, s) for i, s in reversed(list(enumerate(body)))]
    while stack:
        i, s = stack.pop()
        if isinstance(s, ast.Import):
            for a in s.names:
                add(a.asname or a.name.split(".")[0], i, s)
        elif isinstance(s, ast.ImportFrom):
            for a in s.names:
                add(a.asname or a.name, i, s)
        elif isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            add(s.name, i, s)
        elif isinstance(s, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = s.targets if isinstance(s, ast.Assign) else [s.target]
            for t in targets:
                for n in walk(t):
                    if isinstance(n, ast.Name):
                        add(n.id, i, s)
        elif isinstance(s, (ast.If, ast.Try, getattr(ast, "TryStar", ast.Try), ast.With)):
            nested = []
            for field in ("body", "orelse", "finalbody"):
                nested += getattr(s, field, []) or []
            for h in getattr(s, "handlers", []) or []:
                nested += h.body
            stack.extend((i, n) for n in reversed(nested))
    return out


def _binds_module(stmt: ast.stmt, req: ImportReq) -> bool:
    """Does import `stmt` make `req`'s spelling mean `req.module`?"""
    if isinstance(stmt, ast.Import):
        for a in stmt.names:
            if req.alias and req.alias != req.module:
                if a.asname == req.alias and a.name == req.module:
                    return True
                continue
            if a.asname is None and (a.name == req.module or a.name.startswith(req.module + ".")):
                return True
        return False
    if isinstance(stmt, ast.ImportFrom) and not stmt.level and stmt.module and "." in req.module:
        parent, _, last = req.module.rpartition(".")
        want = req.alias or last
        return stmt.module == parent and any(a.name == last and (a.asname or a.name) == want for a in stmt.names)
    return False


# -- the header ------------------------------------------------------------------------------------
def _is_docstring(s: ast.stmt) -> bool:
    return isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str)


def _header(body: list[ast.stmt]) -> tuple[list[ast.stmt], int]:
    """The leading top-level imports (before the first definition or block of code), and the index of the
    statement after the last of them (or after the docstring)."""
    imports = []
    end = 1 if body and _is_docstring(body[0]) else 0
    for i, s in enumerate(body):
        if isinstance(s, (ast.Import, ast.ImportFrom)):
            imports.append(s)
            end = i + 1
        elif isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.For, ast.While, ast.With,
                            ast.AsyncFor, ast.AsyncWith)) or (isinstance(s, ast.If) and not _only_imports(s)):
            break
        elif isinstance(s, ast.Try) and not _only_imports(s):
            break
    return imports, end


def _only_imports(s: ast.stmt) -> bool:
    """A guarded import (`try: import x / except ImportError: ...`, `if sys.version...: import x`)."""
    has = False
    for n in walk(s):
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            has = True
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.For, ast.While)):
            return False
    return has


def _groups(lines: list[str], imports: list[ast.stmt]) -> list[list[ast.stmt]]:
    """Header imports split where a blank line or other code separates them."""
    groups: list[list[ast.stmt]] = []
    prev_end = None
    for s in imports:
        if prev_end is not None and all(lines[k].strip().startswith("#") for k in range(prev_end, s.lineno - 1)) \
                and groups:
            groups[-1].append(s)
        else:
            groups.append([s])
        prev_end = s.end_lineno
    return groups


def _roots(group: list[ast.stmt]) -> set:
    """The top-level packages a group of import statements names."""
    out = set()
    for s in group:
        if isinstance(s, ast.ImportFrom):
            if not s.level:
                out.add((s.module or "").split(".")[0])
        else:
            out.update(a.name.split(".")[0] for a in s.names)
    return out


def _group_category(group: list[ast.stmt], after_third: bool) -> int:
    cats = {_import_category(s) for s in group}
    if _LOCAL in cats:
        return _LOCAL
    if cats == {_FUTURE}:
        return _FUTURE
    if cats <= {_STD, _FUTURE}:
        return _STD
    roots = {(s.module if isinstance(s, ast.ImportFrom) else s.names[0].name).split(".")[0] for s in group
             if _import_category(s) == _THIRD}
    if after_third and not roots & _KNOWN_THIRD:
        return _FIRST  # a group of unknown packages below the third-party block: the project's own
    return _THIRD


def _import_line(lines: list[str], imports: list[ast.stmt], req: ImportReq, first_party: bool) -> tuple[int, str]:
    """(0-based line to insert before, "" in a section | "after" a section | "before" the first one | "none")."""
    groups = _groups(lines, imports)
    cats = []
    seen_third = False
    for g in groups:
        c = _group_category(g, seen_third)
        seen_third = seen_third or c == _THIRD
        cats.append(c)
    want = _FIRST if first_party else _module_category(req.module)
    root = req.module.split(".")[0]
    # a section of its kind that already imports from its package (`import torch` for torch.distributed) before the
    # first one of its kind (a project module above the torch imports, taken for a third-party one)
    kin = [(g, c) for g, c in zip(groups, cats) if c == want and root in _roots(g)]
    for g, c in kin or zip(groups, cats):
        if c != want:
            continue
        keys = [_sort_key(s) for s in g]
        new = _req_key(req)
        if keys == sorted(keys):
            pos = next((s for s, k in zip(g, keys) if k > new), None)
        elif [k[1] for k in keys] == sorted(k[1] for k in keys):
            pos = next((s for s, k in zip(g, keys) if k[1] > new[1]), None)
        else:
            pos = None
        if pos is not None:
            return _with_comments_above(lines, pos.lineno - 1), ""
        return g[-1].end_lineno, ""
    # no section of its kind: a new one after the sections that sort before it
    before = [g for g, c in zip(groups, cats) if c < want]
    if before:
        return before[-1][-1].end_lineno, "after"
    if groups:
        return _with_comments_above(lines, groups[0][0].lineno - 1), "before"
    return -1, "none"


_CELL_PREFIX = "# %%neuron-migrate-cell "  # files/notebook.py's CELL_MARK: the joined text of a notebook


def _cell_at(cells: list[int], line: int) -> int:
    """The index (into `cells`) of the notebook cell holding 0-based `line` (-1: above the first marker)."""
    import bisect

    return bisect.bisect_right(cells, line) - 1


def _cell_import_line(cells: list[int], body: list, starts: list[int], need: int) -> int:
    """0-based line for an import in the notebook cell of statement `need`: below that cell's leading imports, or
    right below its marker."""
    cell = _cell_at(cells, starts[need])
    line = cells[cell] + 1
    for k, stmt in enumerate(body):
        if _cell_at(cells, starts[k]) != cell:
            if starts[k] > cells[cell]:
                break
            continue
        if not isinstance(stmt, (ast.Import, ast.ImportFrom)) or k >= need:
            break
        line = stmt.end_lineno
    return line


def _with_comments_above(lines: list[str], at: int) -> int:
    """`at`, moved above the comment lines directly above it (they belong to that statement), unless those
    comments open the file (a shebang, licence or coding line stays first)."""
    up = at
    while up > 0 and lines[up - 1].strip().startswith("#") and not lines[up - 1].startswith("# %%neuron-migrate"):
        up -= 1
    if up < at and all(not ln.strip() or ln.lstrip().startswith("#") for ln in lines[:up]):
        return at
    return up


def _nl(text: str) -> str:
    i = text.find("\n")
    return "\r\n" if i > 0 and text[i - 1] == "\r" else "\n"


@lru_cache(maxsize=256)
def _helper_names(src: str) -> frozenset:
    """The names a helper's source loads (asked again for every import and helper placed: parsed once)."""
    try:
        return frozenset(_all_names(ast.parse(src))[0])
    except SyntaxError:
        return frozenset()


_SIMPLE_FROM = re.compile(r"from ([\w.]+) import ([\w, ]+?)([ \t]*(?:#.*)?)(\r?\n)?$")


def _extend_helper_import(lines: list[str], body: list, module: str, names: list[str]) -> bool:
    """Add `names` to the file's own one-line `from <module> import a, b` (sorted, as isort keeps it); False
    when there is no such line to extend (the caller adds a new import)."""
    for stmt in body:
        if (isinstance(stmt, ast.ImportFrom) and stmt.module == module and not stmt.level
                and stmt.lineno == stmt.end_lineno and all(a.asname is None for a in stmt.names)):
            m = _SIMPLE_FROM.match(lines[stmt.lineno - 1])
            if not m or m.group(1) != module:
                return False
            have = [a.name for a in stmt.names]
            merged = sorted(set(have) | set(names))
            lines[stmt.lineno - 1] = f"from {module} import {', '.join(merged)}{m.group(3)}{m.group(4) or ''}"
            return True
    return False


def bound_up_front(body: list[ast.stmt], req: ImportReq) -> Optional[ast.stmt]:
    """The import of `req` that only imports and a docstring come before, if the file has one. No statement
    can use the name before it, so insert_support would not add `req` (see its check of existing bindings)."""
    for i, s in enumerate(body):
        if isinstance(s, (ast.Import, ast.ImportFrom)):
            if _binds_module(s, req):
                return s
        elif not (i == 0 and _is_docstring(s)):
            return None
    return None


def _merge_from_imports(group: list) -> list:
    """New `from P import a` and `from P import b` entries inserted at one place become `from P import a, b` (as
    isort writes them); entries with an alias stay on their own line."""
    out: list = []
    for cat, key, stmt, mode in group:
        m = re.fullmatch(r"from (\S+) import (\w+)", stmt)
        prev = re.fullmatch(r"from (\S+) import (\w+(?:, \w+)*)", out[-1][2]) if out else None
        if m and prev and prev.group(1) == m.group(1) and out[-1][0] == cat and out[-1][3] == mode:
            names = prev.group(2).split(", ")
            if m.group(2) not in names:
                names.append(m.group(2))
                # isort's order: CONSTANTS, Classes, functions
                names.sort(key=lambda n: (0 if n.isupper() else 1 if n[0].isupper() else 2, n.lower()))
            out[-1] = (cat, out[-1][1], f"from {m.group(1)} import {', '.join(names)}", mode)
        else:
            out.append((cat, key, stmt, mode))
    return out


def insert_support(text: str, imports: list[ImportReq], helpers: list[tuple[str, str]],
                   helper_import: Optional[str] = None, only_called: bool = True,
                   body: Optional[list[ast.stmt]] = None) -> str:
    """Add `imports` and `helpers` ((name, source), dependencies first) to `text`.

    With `helper_import` (a module name), helpers are not pasted in: `from <module> import name` is added.
    With `only_called` false (the shared helpers module, which defines helpers for other files), every helper is
    added, called here or not. `body`: the top-level statements of `text` where the caller has them (their names,
    and the lines they and their decorators stand on, are all that is read here); else `text` is parsed.
    """
    if body is None:
        try:
            body = ast.parse(text).body
        except (SyntaxError, ValueError, RecursionError) as exc:
            raise InsertError(f"rewrite produced invalid Python before adding imports: {exc}") from None
    if not helpers and all(bound_up_front(body, req) for req in imports):
        return text  # the common case: `import torch` is already among the file's leading imports
    lines = source_lines(text, keepends=True)
    nl = _nl(text)
    first_use = first_exec_uses(body)
    binds = _bindings(body)
    header, header_end = _header(body)
    starts = [_start(s) - 1 for s in body]  # 0-based first line of each top-level statement

    defined = {s.name for s in body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    new_helpers = [(n, src) for n, src in helpers if n not in defined]
    if new_helpers and only_called:
        # a helper whose only caller another fix removed (`xm.master_print(met.metrics_report())` deleted whole)
        # is not added: only those the file loads, and their own dependencies
        wanted = _loaded(body, {n for n, _ in new_helpers})
        for name, src in reversed(new_helpers):
            if name in wanted:
                wanted |= _helper_names(src)
        new_helpers = [(n, src) for n, src in new_helpers if n in wanted]
    helper_reqs: list[ImportReq] = []
    if helper_import and new_helpers:
        # only the helpers the file itself calls; their own dependencies live in the shared module
        loaded = _loaded(body, {n for n, _ in new_helpers})
        direct = [n for n, _ in new_helpers if n in loaded]
        if direct and not _extend_helper_import(lines, body, helper_import, direct):
            helper_reqs = [ImportReq(f"{helper_import}.{n}", n) for n in direct]
        new_helpers = []
    # helper position: below the header, above the first statement that runs one of them
    helper_at = header_end
    for name, _src in new_helpers:
        helper_at = min(helper_at, first_use.get(name, INF))
    # a name a helper needs must be bound before the helper is defined (and so before it runs)
    needed_at = dict(first_use)
    for name, src in reversed(new_helpers):
        at = min(helper_at, needed_at.get(name, INF))
        for dep in _helper_names(src):
            needed_at[dep] = min(needed_at.get(dep, INF), at)

    # an import nothing will use (a helper's own import when the helper lives in a shared module) is not added
    used: set[str] = set()
    for _name, src in new_helpers:
        used |= _helper_names(src)
    used |= _loaded(body, {_bound_name(r) for r in imports} - used)
    imports = [r for r in imports if _bound_name(r) in used]
    cells = [i for i, ln in enumerate(lines) if ln.startswith(_CELL_PREFIX)]  # a notebook's cell markers
    inserts: list[tuple] = []  # (line index, 0 import | 1 helpers, sort key, lines)
    entries: dict[int, list] = {}  # line -> [(category, key, statement, mode)]
    seen_stmts = set()
    shared: list[str] = []  # helper names imported from the shared module
    for req in [*imports, *helper_reqs]:
        stmt = req.statement()
        if stmt in seen_stmts:
            continue
        seen_stmts.add(stmt)
        name = _bound_name(req)
        need = needed_at.get(name, INF)
        existing = [(i, s) for i, s in binds.get(name, []) if isinstance(s, (ast.Import, ast.ImportFrom))]
        if any(i < need for i, s in existing if _binds_module(s, req)) or (need == INF and any(_binds_module(s, req) for _, s in existing)):
            continue
        first_party = req in helper_reqs
        line, mode = _import_line(lines, header, req, first_party=first_party)
        if mode == "none":  # no imports at all: after the docstring, or before the first statement
            line = body[0].end_lineno if header_end else (starts[0] if body else len(lines))
        if need < len(body) and line > starts[need]:
            line, mode = _with_comments_above(lines, starts[need]), ""
        if cells and need < len(body) and _cell_at(cells, starts[need]) >= 0 and _cell_at(cells, line) != _cell_at(cells, starts[need]):
            # a notebook: the import goes into the cell that needs it, not into an earlier, untouched cell
            line, mode = _cell_import_line(cells, body, starts, need), ""
        if first_party:
            if shared:
                continue  # one `from <module> import a, b` for all of them, at the first one's place
            shared.append(name)
            stmt = f"from {helper_import} import " + ", ".join(sorted(_bound_name(r) for r in helper_reqs))
        cat = _FIRST if first_party else _module_category(req.module)
        entries.setdefault(line, []).append((cat, _req_key(req), stmt, mode))
    for line, group in entries.items():
        group.sort(key=lambda e: (e[0], e[1]))
        group = _merge_from_imports(group)
        text_lines: list[str] = []
        for k, (cat, _key, stmt, mode) in enumerate(group):
            if k == 0 and mode == "after":
                text_lines.append(nl)  # a new section below the existing ones
            elif k and cat != group[k - 1][0] and (mode != "" or group[k - 1][3] != ""):
                text_lines.append(nl)  # sections are separated by a blank line
            text_lines.append(stmt + nl)
        if group[-1][3] == "before":
            text_lines.append(nl)  # a new section above the existing ones
        inserts.append((line, 0, (), text_lines))

    if new_helpers:
        if helper_at == header_end and header_end:
            hline = body[header_end - 1].end_lineno  # right below the header
        elif helper_at < len(body):
            hline = _with_comments_above(lines, starts[helper_at]) if helper_at < header_end else starts[helper_at]
        else:
            hline = len(lines)
        block: list[str] = []
        for _name, src in new_helpers:
            block += [nl, nl] + [ln + nl for ln in src.rstrip("\n").split("\n")]
        inserts.append((hline, 1, (), block))
    if not inserts:
        return "".join(lines)  # the text, or with names added to its own helpers import
    unterminated = bool(lines) and not lines[-1].endswith(("\n", "\r"))
    if unterminated:
        lines[-1] += nl  # the file ended without a newline where we may append
    out: list[str] = []
    pos = 0
    for line, order, _key, block in sorted(inserts, key=lambda t: (t[0], t[1], t[2])):
        out.extend(lines[pos:line])
        pos = max(pos, line)
        if order == 1:
            # helpers: two blank lines before and after, as PEP 8 has it; drop the blank lines they replace
            while out and not out[-1].strip() and not block[0].strip():
                out.pop()
            if not out or out[-1].startswith(_CELL_PREFIX):
                block = block[2:]  # the top of the file, or of a notebook cell
            rest_start = pos
            while rest_start < len(lines) and not lines[rest_start].strip():
                rest_start += 1
            pos = rest_start
            out.extend(block)
            if rest_start < len(lines):
                out.extend([nl, nl])
        else:
            out.extend(block)
    out.extend(lines[pos:])
    if unterminated and pos < len(lines) and out and out[-1] is lines[-1]:
        out[-1] = out[-1][: -len(nl)]  # nothing was appended after the last line: it keeps its missing newline
    return "".join(out)

