"""Remove the imports that the applied fixes left unused (`from torch import float64` after the float64 fix).

Generic and conservative: an imported name goes only when the original text used it and the rewritten text
no longer does (no load anywhere, no mention in a string such as `__all__` or an annotation; docstrings are prose
and do not count). Imports the
user left unused are theirs; imports inside `try:` (availability probes) and `__future__` stay; a
statement with a comment is left as written.
"""
from __future__ import annotations

import ast
import re
from collections import Counter
from typing import Optional

from neuron_migrate.files.lines import source_lines, statements_naming
from neuron_migrate.names.analysis import child_nodes
from neuron_migrate.rules.model import Edit, Fix, FixSafety, Span


def _survey(tree: ast.AST) -> tuple[Counter, str, list]:
    """The tree's Name loads (and dels) by name, its strings joined, and its imports outside `try:`."""
    names, strings = _loads_and_strings(tree)
    return names, strings, _imports_outside_try(tree)


def _loads_and_strings(tree: ast.AST) -> tuple[Counter, str]:
    """The tree's Name loads (and dels) by name and its strings joined, in one walk (import statements hold
    neither, so the walk need not enter them)."""
    names: Counter = Counter()
    strings = []
    docs = set()  # the docstrings met so far: a holder is popped before its body's first constant is reached
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, _DOC_HOLDERS):
            docs |= _docstrings([node])
        for child in child_nodes(node):
            t = type(child)
            if t is ast.Name:
                if type(child.ctx) is not ast.Store:
                    names[child.id] += 1
            elif t is ast.Constant:
                if type(child.value) is str and id(child) not in docs:
                    strings.append(child.value)
            elif t is not ast.Import and t is not ast.ImportFrom:
                stack.append(child)
    return names, "\n".join(strings)


_DOC_HOLDERS = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _docstrings(holders) -> set:
    """The ids of the docstring constants of `holders` (nodes; the module, defs and classes among them hold
    docstrings): prose, which names an imported module without using it, unlike `__all__` or a string
    annotation."""
    out = set()
    for holder in holders:
        if isinstance(holder, _DOC_HOLDERS) and holder.body:
            first = holder.body[0]
            if type(first) is ast.Expr and type(first.value) is ast.Constant and type(first.value.value) is str:
                out.add(id(first.value))
    return out


def survey_without_imports(survey: tuple, tree: ast.Module) -> tuple[Counter, str, list]:
    """`survey` (of a text) made the survey of `tree`, the text with import statements removed or narrowed: imports
    hold no name load and no string, so only the imports change (a statement walk of `tree`, not a walk of every node)."""
    names, strings, _imports = survey
    return names, strings, _imports_outside_try(tree)


def survey_of_analysis(analysis) -> tuple[Counter, str, list]:
    """`_survey` of an analysed text's tree, from what the name analysis already holds: its parent map lists every
    node of the tree but the root, the parameter nodes of defs and lambdas (which hold no name: their annotations
    and defaults are listed) and a def's type parameters (3.12+, walked here), so names and strings are two
    comprehensions over it instead of a walk; imports are found by a walk of statements only (they never stand
    inside an expression), in `_survey`'s order."""
    tree = analysis.tree
    Name, Constant, Store = ast.Name, ast.Constant, ast.Store
    nodes = list(analysis.parent_of)
    if _TYPE_PARAMS:
        defs = (ast.FunctionDef, ast.AsyncFunctionDef)
        nodes += [n for d in nodes if type(d) in defs for tp in d.type_params for n in ast.walk(tp)]
    names = Counter([n.id for n in nodes if type(n) is Name and type(n.ctx) is not Store])
    docs = _docstrings([tree, *(n for n in nodes if isinstance(n, _DOC_HOLDERS))])
    strings = "\n".join([n.value for n in nodes if type(n) is Constant and type(n.value) is str and id(n) not in docs])
    return names, strings, _imports_outside_try(tree)


_TYPE_PARAMS = "type_params" in ast.FunctionDef._fields  # Python 3.12+
_STATEMENT_HOLDERS = (ast.stmt, ast.excepthandler, ast.match_case)


def _imports_outside_try(tree: ast.AST) -> list:
    """The imports outside `try:` blocks (an import under `try:` is an availability probe: it stays), in the order
    of a walk that takes each node's children in order and goes on from the last one pushed, entering only what
    may hold statements."""
    imports = []
    trys = (ast.Try, getattr(ast, "TryStar", ast.Try))
    holders = _STATEMENT_HOLDERS
    stack = [(tree, False)]
    while stack:
        node, in_try = stack.pop()
        for child in child_nodes(node):
            t = type(child)
            if t is ast.Import or t is ast.ImportFrom:
                if not in_try:
                    imports.append(child)
            elif isinstance(child, holders):
                stack.append((child, in_try or isinstance(child, trys)))
    return imports


def _bound(alias: ast.alias, is_from: bool) -> str:
    return alias.asname or (alias.name if is_from else alias.name.split(".")[0])


def _char_col(line: str, byte_col: int) -> int:
    return len(line.encode("utf-8")[:byte_col].decode("utf-8", errors="replace"))


def _alias_text(a: ast.alias) -> str:
    return f"{a.name} as {a.asname}" if a.asname else a.name


def unused_import_fixes(before: str, after: str, before_tree: Optional[ast.Module] = None,
                        after_tree: Optional[ast.Module] = None, after_survey: Optional[tuple] = None) -> list[Fix]:
    """Fixes that remove imports of `after` whose names `before` used and `after` no longer does (the texts' trees,
    when the caller has them, save parsing them again; `after_survey`, `survey_of_analysis` of an analysis of
    `after`, saves walking its tree)."""
    try:
        old_tree = before_tree or ast.parse(before)
        if after_survey is None:
            after_survey = _survey(after_tree or ast.parse(after))
    except (SyntaxError, ValueError, RecursionError):
        return []
    new_uses, strings, imports = after_survey
    # the names the rewritten text imports and no longer uses; the original text's uses are counted only when there
    # are some (one walk of the original tree saved for most files)
    unused = []
    for stmt in imports:
        is_from = isinstance(stmt, ast.ImportFrom)
        if is_from and (stmt.module == "__future__" or any(a.name == "*" for a in stmt.names)):
            continue
        candidates = [a for a in stmt.names if not new_uses[_bound(a, is_from)]
                      and not re.search(rf"\b{re.escape(_bound(a, is_from))}\b", strings)]
        if candidates:
            unused.append((stmt, is_from, candidates))
    if not unused:
        return []
    old_uses = _loads_and_strings(old_tree)[0]
    lines = source_lines(after, keepends=True)
    fixes = []
    for stmt, is_from, candidates in unused:
        gone = [a for a in candidates if old_uses[_bound(a, is_from)]]
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
            kept_lines = _without_alias_lines(seg, gone, stmt.col_offset) if stmt.end_lineno > stmt.lineno else None
            if kept_lines is not None:
                # one name per line in parentheses: only the removed names' lines go (the diff a reviewer expects)
                edit = Edit("replace_stmt", span, kept_lines)
            else:
                names = ", ".join(_alias_text(a) for a in keep)
                edit = Edit("replace_stmt", span, f"from {'.' * stmt.level}{stmt.module or ''} import {names}")
        else:
            edit = Edit("replace_stmt", span, "import " + ", ".join(_alias_text(a) for a in keep))
        fixes.append(Fix(FixSafety.SAFE, [edit], description="remove an import the rewrite left unused"))
    return fixes


def _without_alias_lines(seg: str, gone: list, col: int):
    """The text of a parenthesised `from ... import (` statement (`seg`: its whole lines; `col`: where it starts on
    the first) without the lines that hold only one of the `gone` aliases, relative to the statement's indentation
    as fix texts are; None when a gone name shares its line with another or the statement is not laid out one name
    per line."""
    lines = [ln.rstrip("\r") for ln in seg.split("\n")]
    if lines and lines[-1] == "":
        lines.pop()
    if not lines[0].rstrip().endswith("(") or lines[0][:col].strip():
        return None
    patterns = [re.compile(rf"^[ \t]*{re.escape(a.name)}"
                           + (rf"[ \t]+as[ \t]+{re.escape(a.asname)}" if a.asname else "") + r"[ \t]*,?[ \t]*$")
                for a in gone]
    kept, dropped = [], 0
    for i, line in enumerate(lines):
        if 0 < i < len(lines) - 1 and any(p.match(line) for p in patterns):
            dropped += 1
            continue
        kept.append(line)
    if dropped != len(gone):
        return None
    return "\n".join([kept[0][col:], *(ln[col:] if not ln[:col].strip() else ln for ln in kept[1:])])


def _added_top_level_defs(before: str, after: str, before_tree=None, after_tree=None):
    """(the trees of `before` and `after`, {name: statement} of the undecorated top-level defs and classes of
    `after` whose name `before` does not define), or None when either text does not parse: what the rewrite
    inserted."""
    try:
        tree = after_tree or ast.parse(after)
        old = before_tree or ast.parse(before)
    except (SyntaxError, ValueError, RecursionError):
        return None
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    had = {s.name for s in old.body if isinstance(s, kinds)}
    added = {s.name: s for s in tree.body if isinstance(s, kinds) and s.name not in had and not s.decorator_list}
    return old, tree, added


def drop_dead_helpers(before: str, after: str, inserted=(), before_tree=None, after_tree=None) -> str:
    """`after` without the inserted helpers nothing calls any more, and without the imports the rewrite added that
    nothing uses then.

    A helper is inserted by the fix that calls it; a later fix may remove that call (`xm.master_print(
    met.metrics_report())` becomes `_neuron_master_print(...)`, then the whole report statement goes). Only a
    top-level def or class named as a known helper, absent from `before`, goes; its own helpers go with it when
    nothing else uses them. An import statement goes only when `before` had no statement of the same text, and
    nothing in the result loads the name it binds."""
    from neuron_migrate.rules.helpers import HELPERS

    # the common case, decided on the text: every inserted helper's name occurs beyond its own definition
    if all(len(re.findall(rf"\b{re.escape(name)}\b", after)) > len(re.findall(rf"\b{re.escape(name)}\b", src))
           for name, src in inserted):
        return after
    added = _added_top_level_defs(before, after, before_tree, after_tree)
    if added is None:
        return after
    old, tree, new_defs = added
    helpers = {name: s for name, s in new_defs.items() if name in HELPERS}
    if not helpers:
        return after
    # loads of each helper name outside the helper's own definition, by the statement that holds them
    uses: dict = {name: set() for name in helpers}
    lines = source_lines(after, keepends=True)
    for stmt in statements_naming(tree, lines, uses):
        owner = stmt.name if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else None
        for n in ast.walk(stmt):
            if isinstance(n, ast.Name) and n.id in uses and n.id != owner:
                uses[n.id].add(owner if owner in helpers else "")
    dead: set = set()
    changed = True
    while changed:
        changed = False
        for name, users in uses.items():
            if name not in dead and not (users - dead):
                dead.add(name)
                changed = True
    if not dead:
        return after
    drop = set()
    for name in dead:
        s = helpers[name]
        drop.update(range(s.lineno - 1, s.end_lineno))
        i = s.end_lineno
        while i < len(lines) and not lines[i].strip() and i - s.end_lineno < 2:
            drop.add(i)
            i += 1
    kept_names, _strings = _loads_and_strings(_parse_or_none("".join(l for i, l in enumerate(lines) if i not in drop)) or tree)
    before_lines = source_lines(before, keepends=True)
    old_imports = {_segment(before_lines, s) for s in _imports_outside_try(old)}
    for stmt in _imports_outside_try(tree):
        if stmt.col_offset or _segment(lines, stmt) in old_imports:
            continue
        is_from = isinstance(stmt, ast.ImportFrom)
        if all(not kept_names[_bound(a, is_from)] for a in stmt.names):
            drop.update(range(stmt.lineno - 1, stmt.end_lineno))
    text = "".join(l for i, l in enumerate(lines) if i not in drop)
    # an import block that lost all its lines leaves its separating blank lines: keep at most two in a row
    return re.sub(r"\A(?:[ \t]*\r?\n)+", "", text) if text.strip() else text


def _segment(lines: list, node) -> str:
    """`ast.get_source_segment` on the lines of a text split once (source_lines, keepends): that function splits the
    whole text again at every call, which made this step quadratic in a file's imports (transformers' trainer.py)."""
    first, last = node.lineno - 1, node.end_lineno - 1
    if first == last:
        return lines[first].encode()[node.col_offset:node.end_col_offset].decode()
    return "".join([lines[first].encode()[node.col_offset:].decode(), *lines[first + 1:last],
                    lines[last].encode()[:node.end_col_offset].decode()])


def _parse_or_none(text: str):
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError, RecursionError):
        return None


# -- blocks a rewrite emptied ----------------------------------------------------------------------------------
_PURE_CALLS = {"get_rank", "get_world_size", "is_initialized", "is_available", "get_node_local_rank", "get_ordinal",
               "is_master_ordinal", "get_local_ordinal", "global_ordinal", "local_ordinal", "world_size"}
_IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError"}


def _pure(test: ast.AST) -> bool:
    """A test that only reads (names, attributes, comparisons, rank/world-size queries): dropping it loses nothing."""
    for n in ast.walk(test):
        if isinstance(n, ast.Call):
            func = n.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
            # `flags.get("metrics_debug")`: a lookup in the settings, as `FLAGS.metrics_debug` is
            lookup = name == "get" and isinstance(func, ast.Attribute) and 1 <= len(n.args) <= 2
            if (name not in _PURE_CALLS and not lookup) or any(not isinstance(a, ast.Constant) for a in n.args) or \
                    any(k.arg is None or not isinstance(k.value, ast.Constant) for k in n.keywords):
                return False
        elif isinstance(n, ast.Subscript):
            if not isinstance(n.slice, ast.Constant):  # `flags["metrics_debug"]`, not `x[f()]`
                return False
        elif isinstance(n, (ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom, ast.Lambda,
                            ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            return False
    return True


def _only_pass(body: list) -> bool:
    return len(body) == 1 and isinstance(body[0], ast.Pass)


def _emptied(node) -> bool:
    """`if <pure test>: pass` (no else), or `try: pass` whose handlers only react to a failed import."""
    if isinstance(node, ast.If):
        return _only_pass(node.body) and not node.orelse and _pure(node.test)
    if isinstance(node, ast.Try) and _only_pass(node.body) and not node.orelse and not node.finalbody and node.handlers:
        for h in node.handlers:
            types = h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]
            if not all(isinstance(t, ast.Name) and t.id in _IMPORT_ERRORS for t in types):
                return False
            if not all(isinstance(s, (ast.Raise, ast.Pass)) or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Call))
                       for s in h.body):
                return False
        return True
    return False


def drop_emptied_blocks(before: str, after: str, before_tree=None, after_tree=None) -> str:
    """`after` without the blocks the rewrite emptied: `if rank == 0: pass` left where a removed statement stood,
    `try: pass / except ImportError: raise ...` left where the torch_xla imports stood, and an `if FLAGS.debug:` that
    held only such a block. A block written that way in `before` (same code) stays. A block that is the only
    statement of its body stays (it would need a `pass` anyway)."""
    pass_re = re.compile(r"^[ \t]*pass[ \t]*(?:#.*)?$", re.M)
    if len(pass_re.findall(after)) <= len(pass_re.findall(before)):
        return after
    try:
        new = after_tree or ast.parse(after)
        old = before_tree or ast.parse(before)
    except (SyntaxError, ValueError, RecursionError):
        return after
    had = {ast.dump(n) for n in ast.walk(old) if _emptied(n)}
    parent_of = {}
    for p in ast.walk(new):
        for c in ast.iter_child_nodes(p):
            parent_of[c] = p
    lines = source_lines(after, keepends=True)
    drop: set = set()
    gone: dict = {}  # id of a block -> (the block, its statements that go)
    for n in ast.walk(new):
        if not _emptied(n) or ast.dump(n) in had:
            continue
        # an `if <pure test>:` whose whole body is this block goes with it
        while True:
            up = parent_of.get(n)
            if isinstance(up, ast.If) and up.body == [n] and not up.orelse and _pure(up.test):
                n = up
                continue
            break
        holder = parent_of.get(n)
        block = next((getattr(holder, f) for f in ("body", "orelse", "finalbody")
                      if isinstance(getattr(holder, f, None), list) and n in getattr(holder, f)), None)
        if block is None or len(block) == 1:
            continue
        first, last = n.lineno - 1, n.end_lineno - 1
        if lines[first][: n.col_offset].strip() or lines[last][_char_col(lines[last], n.end_col_offset):].strip():
            continue  # shares a line with other code
        drop.update(range(first, last + 1))
        gone.setdefault(id(block), (block, []))[1].append(n)
    if not drop:
        return after
    keep: dict = {}  # line -> its text: a block whose every statement goes keeps `pass` in the first one's place
    for block, stmts in gone.values():
        if len(stmts) == len(block):
            first = min(stmts, key=lambda st: st.lineno)
            line = lines[first.lineno - 1]
            end = line[len(line.rstrip("\r\n")):] or "\n"
            keep[first.lineno - 1] = line[: first.col_offset] + "pass" + end
    return "".join(keep.get(i, l) for i, l in enumerate(lines) if i not in drop or i in keep)


# Helpers whose few calls read better as the one-line native form (issue 38): name -> (kind, template). The
# templates use the spellings the inserted helper itself used for torch.distributed and os.
_INLINE = {
    "_neuron_rank": ("expr", '{dist}.get_rank() if {dist}.is_initialized() else int({os}.environ.get("RANK", 0))'),
    "_neuron_world_size": ("expr", '{dist}.get_world_size() if {dist}.is_initialized() else int({os}.environ.get("WORLD_SIZE", 1))'),
    "_neuron_barrier": ("stmt", "if {dist}.is_initialized():\n{indent}    {dist}.barrier()"),
    # xm.master_print of plain values (no call among them: only rank 0 evaluates them once inlined)
    "_neuron_rank0_print": ("print", 'if ({dist}.get_rank() if {dist}.is_initialized() else int({os}.environ.get("RANK", 0))) == 0:\n'
                                     "{indent}    print({args})"),
}
INLINE_MAX_CALLS = 2
# where a conditional expression stands without parentheses: the whole value of an assignment, a return, a keyword
_BARE_OK = (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Return, ast.keyword, ast.NamedExpr)


def _plain_value(node) -> bool:
    """A constant, a name, an attribute of one, or an f-string of those: evaluating it does nothing else."""
    if isinstance(node, ast.JoinedStr):
        return all(isinstance(v, ast.Constant) or (isinstance(v, ast.FormattedValue) and _plain_value(v.value)
                                                    and (v.format_spec is None or _plain_value(v.format_spec)))
                   for v in node.values)
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, (ast.Constant, ast.Name))


def _spellings(helper: ast.FunctionDef) -> dict:
    """How the inserted helper spells torch.distributed (`dist`) and os (`os`)."""
    out = {}
    for n in ast.walk(helper):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name):
            if n.attr in ("get_rank", "get_world_size", "barrier", "is_initialized"):
                out.setdefault("dist", n.value.id)
            elif n.attr == "environ":
                out.setdefault("os", n.value.id)
    return out


def inline_small_helpers(before: str, after: str, inserted=(), before_tree=None, after_tree=None) -> tuple:
    """(`after` with each inserted rank / world-size / barrier helper called at most INLINE_MAX_CALLS times replaced
    by its one-line native form at those calls, and its definition removed: `_neuron_rank()` becomes
    `dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", 0))`, a `_neuron_barrier(tag)`
    statement `if dist.is_initialized(): dist.barrier()`. Kept as a helper where another helper calls it, where a
    call is in an f-string, passes arguments that may do something, or is used as a value, or where a statement
    shares its line. Its tree (the check that it parses), or None when nothing changed: the steps after this one
    read the tree instead of parsing the text again.)"""
    wanted = [n for n in _INLINE if n in inserted and f"def {n}(" in after]
    if not wanted:
        return after, None
    added = _added_top_level_defs(before, after, before_tree, after_tree)
    if added is None:
        return after, None
    _old, tree, new_defs = added
    defs = {name: s for name, s in new_defs.items() if isinstance(s, ast.FunctionDef) and name in wanted}
    if not defs:
        return after, None
    parents: dict = {}
    owner_of: dict = {}  # a node -> the top-level def holding it (its name), for the helpers' own bodies
    named: dict = {name: [] for name in defs}  # helper name -> its Name nodes, in walk order
    lines = source_lines(after, keepends=True)
    # (the nodes of statements that never write a helper's name are neither uses nor above one: not walked)
    for stmt in statements_naming(tree, lines, named):
        top = stmt.name if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else None
        for n in ast.walk(stmt):
            owner_of[n] = top
            if type(n) is ast.Name and n.id in named:
                named[n.id].append(n)
            for c in ast.iter_child_nodes(n):
                parents[c] = n

    def char_col(line: int, col: int) -> int:
        return len(lines[line - 1].encode("utf-8")[:col].decode("utf-8", "replace"))

    edits: list = []  # (line, col, end_line, end_col, text) in characters
    drop: set = set()
    from neuron_migrate.rules.helpers import HELPERS

    for name, d in defs.items():
        spell = _spellings(d)
        kind, template = _INLINE[name]
        if kind == "print":  # its body calls the rank helper: the spellings are that helper's
            rank = new_defs.get("_neuron_rank")
            spell = _spellings(rank) if isinstance(rank, ast.FunctionDef) else {}
            if any(owner_of.get(n) not in HELPERS for n in named.get("_neuron_rank", ())):
                template = "if _neuron_rank() == 0:\n{indent}    print({args})"  # the helper stays for other uses
        if "dist" not in spell or (kind in ("expr", "print") and "os" not in spell):
            continue
        uses = [n for n in named[name] if owner_of.get(n) != name]
        if not uses or len(uses) > INLINE_MAX_CALLS:
            continue
        mine: list = []
        for use in uses:
            call = parents.get(use)
            if owner_of.get(use) in HELPERS or not isinstance(call, ast.Call) or call.func is not use or call.keywords:
                break
            up = call
            in_fstring = False
            while up is not None:
                if isinstance(up, ast.JoinedStr):
                    in_fstring = True
                up = parents.get(up)
            if in_fstring:
                break
            if kind == "expr":
                if call.args:
                    break
                parent = parents.get(call)
                # bare as a whole value or a call's only argument; in parentheses anywhere else (also where a tuple
                # or an argument list would read it right, for the reader's sake)
                bare = isinstance(parent, _BARE_OK) or (isinstance(parent, ast.Call) and parent.args == [call]
                                                        and not parent.keywords)
                text = template.format(**spell)
                mine.append((call.lineno, char_col(call.lineno, call.col_offset), call.end_lineno,
                             char_col(call.end_lineno, call.end_col_offset), text if bare else f"({text})"))
            else:
                stmt = parents.get(call)
                if kind == "print":
                    if not isinstance(stmt, ast.Expr) or not call.args or not all(_plain_value(a) for a in call.args):
                        break
                elif not isinstance(stmt, ast.Expr) or len(call.args) > 1 or not all(
                        isinstance(a, (ast.Constant, ast.Name, ast.Attribute)) for a in call.args):
                    break
                head = lines[stmt.lineno - 1][: char_col(stmt.lineno, stmt.col_offset)]
                tail = lines[stmt.end_lineno - 1][char_col(stmt.end_lineno, stmt.end_col_offset):].strip()
                if head.strip() or (tail and not tail.startswith("#")) or (
                        kind == "print" and call.args[0].lineno != call.args[-1].end_lineno):
                    break
                args = ""
                if kind == "print":
                    first, last = call.args[0], call.args[-1]
                    args = lines[first.lineno - 1][char_col(first.lineno, first.col_offset):
                                                   char_col(last.end_lineno, last.end_col_offset)]
                mine.append((stmt.lineno, len(head), stmt.end_lineno, char_col(stmt.end_lineno, stmt.end_col_offset),
                             template.format(indent=head, args=args, **spell)))
        else:
            edits.extend(mine)
            drop.update(range(d.lineno - 1, d.end_lineno))
            i = d.end_lineno
            while i < len(lines) and not lines[i].strip() and i - d.end_lineno < 2:
                drop.add(i)
                i += 1
    if not edits:
        return after, None
    for line, col, end_line, end_col, text in sorted(edits, reverse=True):
        first, last = lines[line - 1], lines[end_line - 1]
        lines[line - 1] = first[:col] + text + last[end_col:]
        for k in range(line, end_line):
            lines[k] = ""
    out = "".join(ln for i, ln in enumerate(lines) if i not in drop)
    out_tree = _parse_or_none(out)
    return (out, out_tree) if out_tree is not None else (after, None)


# -- comments about a statement the rewrite removed -----------------------------------------------------------
# words that tie a comment to torch_xla code: a comment that names one of them, directly above statements that named
# it too and that the rewrite removed, explains code that is gone
_XLA_WORDS = frozenset({"xla", "xm", "xmp", "xr", "pjrt", "xrt", "tpu", "mark_step", "torch_xla", "mpdeviceloader",
                         "parallelloader"})
# one of those words in a comment (`torch_xla` through its `xla`: `_` ends a word here)
_XLA_WORD = "(?<![A-Za-z0-9])(?:" + "|".join(sorted(_XLA_WORDS - {"torch_xla"})) + ")(?![A-Za-z0-9])"
_XLA_COMMENT = re.compile(r"^[ \t]*#.*?" + _XLA_WORD, re.M | re.I)  # a whole-line comment
_XLA_IN_COMMENT = re.compile(r"#[^\n]*?" + _XLA_WORD, re.I)  # any comment (or a '#' in a string: checked later)
_WORD = re.compile(r"[A-Za-z0-9_]+")
# code the rewrite removes because it served torch_xla alone, though it names no torch_xla word: transformers'
# `Trainer._wrap_model` patch that set `args.local_rank = -1` under XLA (NM163); a comment naming XLA above it goes too
_XLA_ONLY_CODE = ("Trainer._wrap_model",)
_MAX_REMOVED_RUN = 30  # lines of removed code a comment block may have stood above


def _xla_words(text: str) -> set:
    """The torch_xla words of a text: whole identifiers and their `_`-separated parts, lowercased."""
    out = set()
    for w in _WORD.findall(text.lower()):
        if w in _XLA_WORDS:
            out.add(w)
        out.update(p for p in w.split("_") if p in _XLA_WORDS)
    return out


def drop_orphaned_comments(before: str, after: str) -> str:
    """`after` without the comment blocks that stood directly above torch_xla statements the rewrite removed and that
    speak of them (`## xm.mark_step is executing the current graph ...` above `xm.mark_step()`, `# XLA imports` above
    the torch_xla imports): a block of whole-line comments at the statements' indentation, naming a torch_xla word
    (`xla`, `xm`, `mark_step`, ...) that the removed lines name too, found once in each text, and followed in `after`
    by what followed the removed lines in `before`. Comments above code that was replaced, not removed, stay."""
    if not _XLA_IN_COMMENT.search(before):
        return after
    old = source_lines(before, keepends=True)
    new = source_lines(after, keepends=True)
    drop: set = set()
    seen_blocks: set = set()
    for m in _XLA_COMMENT.finditer(before):
        i = before.count("\n", 0, m.start())
        indent = old[i][: len(old[i]) - len(old[i].lstrip(" \t"))]

        def is_comment(k: int) -> bool:
            return 0 <= k < len(old) and old[k].startswith(indent) and old[k][len(indent):].startswith("#")

        s, e = i, i
        while is_comment(s - 1):
            s -= 1
        while is_comment(e + 1):
            e += 1
        if (s, e) in seen_blocks:
            continue
        seen_blocks.add((s, e))
        nxt = e + 1
        if nxt >= len(old) or not old[nxt].strip() or not old[nxt].startswith(indent) or old[nxt][len(indent)] in " \t":
            continue  # not directly above a statement at its own indentation
        block = old[s : e + 1]
        at = _only_occurrence(new, block)
        if at is None or _only_occurrence(old, block) != s:
            continue
        j = at + len(block)
        following = new[j] if j < len(new) else None
        if following == old[nxt]:
            continue  # the statement below it is still there
        for k in range(1, _MAX_REMOVED_RUN + 1):
            if (old[nxt + k] if nxt + k < len(old) else None) == following:
                break
        else:
            continue
        removed = "".join(old[nxt : nxt + k])
        words = _xla_words(removed) | ({"xla"} if any(w in removed for w in _XLA_ONLY_CODE) else set())
        if not (_xla_words("".join(block)) & words):
            continue
        lines = set(range(at, j))
        if following is not None and not following.strip() and (at == 0 or not new[at - 1].strip()):
            lines.add(j)  # the blank line that separated the removed code from what follows: one is enough
        drop |= lines
    trailing = _stale_trailing_comments(old, new)
    if not drop and not trailing:
        return after
    return "".join(trailing.get(n, line) for n, line in enumerate(new) if n not in drop)


_TRAILING = re.compile(r"^(?P<code>[ \t]*[^#'\"\s][^#'\"\n]*?)[ \t]+(?P<comment>#[^\n]*?)(?P<end>\r?\n?)$")


def _stale_trailing_comments(old: list, new: list) -> dict:
    """{line index in `new`: the line without its trailing comment} for the lines whose code the rewrite changed from
    torch_xla code to code without it, where the comment names torch_xla (`optimizer.step()  # XLA MP: performs grad
    allreduce and optimizer step` after `xm.optimizer_step(optimizer)`): the same comment, once in each text, on a
    line without quotes (no '#' inside a string). A comment on a block's header line stays: it speaks of the block."""
    def comments(lines):
        found: dict = {}
        for n, line in enumerate(lines):
            if "#" not in line:
                continue
            m = _TRAILING.match(line)
            if m and _XLA_IN_COMMENT.match(m.group("comment")):
                found.setdefault(m.group("comment"), []).append((n, m))
        return found

    after = comments(new)
    if not after:
        return {}
    before = comments(old)
    out = {}
    for comment, hits in after.items():
        was = before.get(comment)
        if len(hits) != 1 or not was or len(was) != 1:
            continue
        n, m = hits[0]
        code_before, code_after = was[0][1].group("code"), m.group("code")
        if code_after.rstrip().endswith(":"):
            continue  # a block's header (`if xm.is_master_ordinal():  # no XLA tensors beyond this point!`): it speaks of the block
        if code_before != code_after and _xla_words(code_before) and not _xla_words(code_after):
            out[n] = code_after + m.group("end")
    return out


def _only_occurrence(lines: list, block: list):
    """The index at which `block` (a list of lines) starts in `lines` when it occurs there exactly once, else None."""
    first, found = block[0], None
    for n, line in enumerate(lines):
        if line == first and lines[n : n + len(block)] == block:
            if found is not None:
                return None
            found = n
    return found
