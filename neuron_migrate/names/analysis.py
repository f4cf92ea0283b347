"""One `ast` pass per file: import aliases resolved to qualified names, and the sites rules look at.

Detection runs on `ast` (about 5x faster than libcst, with exact positions); libcst is only paid for files
that have a fix to apply. Name resolution is a per-scope map from bound name to qualified name:
imports bind (module level, function level, inside try/except or `if` guards alike), parameters and local
assignments shadow inside functions, and module-level reassignments such as `xm = None` in an
`except ImportError` branch are ignored so that the guarded import still resolves.
"""
from __future__ import annotations

import ast
import re
from collections import deque
from collections.abc import Callable, Iterator

from neuron_migrate.files.lines import source_lines
from neuron_migrate.files.span import Span

TYPE_CHECKING = False  # typing is not imported at run time (start-up): it serves annotations only
if TYPE_CHECKING:
    from typing import Optional

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_SCOPE_TYPES = frozenset(_SCOPES)
_UNBOUND = object()  # Scope.lookup: a name this scope does not bind (a binding may be None: shadowed)
# the node kinds _collect_scope does more with than visit their children
_COLLECT_SPECIAL = frozenset({ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                              ast.Lambda, ast.Constant})
# Fields that never hold a node worth visiting: expression contexts and operators are shared singletons
# (about a third of what ast.iter_child_nodes yields), the rest hold identifiers and constants.
_LEAF_FIELDS = frozenset({"ctx", "op", "ops", "id", "attr", "arg", "name", "module", "level", "value_kind",
                          "kind", "type_comment", "conversion", "is_async", "simple", "asname"})
_CHILD_FIELDS: dict[type, tuple[str, ...]] = {}
_AST = ast.AST


def _child_fields(cls: type) -> tuple[str, ...]:
    fields = _CHILD_FIELDS.get(cls)
    if fields is None:
        fields = _CHILD_FIELDS[cls] = tuple(f for f in cls._fields if f not in _LEAF_FIELDS)
    return fields


def _generic_children(node: ast.AST) -> list[ast.AST]:
    """child_nodes for any node: each non-leaf field's AST values, in field order."""
    out: list[ast.AST] = []
    for f in _child_fields(type(node)):
        v = getattr(node, f, None)
        if v is None:
            continue
        if type(v) is list:
            for x in v:
                if isinstance(x, _AST):
                    out.append(x)
        elif isinstance(v, _AST):
            out.append(v)
    return out


# Each node class's ASDL signature is its docstring (`Call(expr func, expr* args, keyword* keywords)`, the same
# form on 3.10 to 3.14): from it, a function per class that lists the children without looking at every field
# (the walks spend about a fifth of an audit here). `*` fields are lists, `?` fields may be None; builtin-typed
# fields (identifiers, strings, constants, ints) never hold nodes.
_SIGNATURE = re.compile(r"^(\w+)(?:\((.*)\))?$")  # `Pass`: no fields
_LEAF_TYPES = frozenset({"identifier", "string", "constant", "int", "object"})
_LISTS_WITH_NONE = frozenset({("Dict", "keys"), ("arguments", "kw_defaults")})  # `{**d}`, `*, a` without default


def _specialised_children(cls: type):
    """A function listing the children of `cls`'s nodes as _generic_children does, or None when `cls` has no
    signature to read (then the generic one serves)."""
    m = _SIGNATURE.match((cls.__doc__ or "").strip())
    if not m or m.group(1) != cls.__name__:
        return None
    kinds = {}
    for part in filter(None, (p.strip() for p in (m.group(2) or "").split(","))):
        typ, _, name = part.rpartition(" ")
        kinds[name] = typ
    fields = _child_fields(cls)
    if not set(fields) <= kinds.keys():
        return None
    items, steps = [], []  # a list display when every field is plain, else statements
    for f in fields:
        typ = kinds[f]
        if typ.rstrip("*?") in _LEAF_TYPES:
            continue
        if typ.endswith("*"):
            values = f"[x for x in n.{f} if x is not None]" if (cls.__name__, f) in _LISTS_WITH_NONE else f"n.{f}"
            items.append(f"*{values}")
            steps.append(f"    out += {values}")
        elif typ.endswith("?"):
            items.append(None)
            steps.append(f"    v = n.{f}\n    if v is not None:\n        out.append(v)")
        else:
            items.append(f"n.{f}")
            steps.append(f"    out.append(n.{f})")
    if None not in items:
        src = f"def children(n):\n    return [{', '.join(items)}]\n"
    else:
        src = "def children(n):\n    out = []\n" + "\n".join(steps) + "\n    return out\n"
    namespace: dict = {}
    exec(src, namespace)  # noqa: S102 - our own source, built from the ast module's signatures
    return namespace["children"]


class _ChildrenTable(dict):
    def __missing__(self, cls):
        fn = self[cls] = _specialised_children(cls) or _generic_children
        return fn


_CHILDREN = _ChildrenTable()


def child_nodes(node: ast.AST) -> list[ast.AST]:
    """The node's children in field order, like ast.iter_child_nodes, without contexts and operators."""
    try:
        return _CHILDREN[type(node)](node)
    except AttributeError:  # a node built without all its fields (never one ast.parse made)
        return _generic_children(node)


def walk(node: ast.AST) -> Iterator[ast.AST]:
    """Every node under `node` (itself included) in ast.walk's order, without contexts and operators."""
    todo = deque([node])
    pop, extend, table = todo.popleft, todo.extend, _CHILDREN
    while todo:
        n = pop()
        try:  # child_nodes, inlined: rules walk a great deal
            extend(table[type(n)](n))
        except AttributeError:
            extend(_generic_children(n))
        yield n
def child_blocks(stmt: ast.stmt) -> Iterator[list]:
    """The statement blocks directly inside a statement: its body, `else:` and `finally:` blocks, and the bodies of
    its `except` handlers and `case`s (a walk of statements that never enters expressions)."""
    for field in ("body", "orelse", "finalbody"):
        block = getattr(stmt, field, None)
        if isinstance(block, list):
            yield block
    for h in getattr(stmt, "handlers", []) or []:
        yield h.body
    for c in getattr(stmt, "cases", []) or []:
        yield c.body


_DEVICE_STRING = re.compile(r"^(xla|cuda|neuron)(:\d+)?$")
# a CUDA device string completed by %-formatting or str.format ('cuda:%d' % rank, 'cuda:{}'.format(gpu)): the DDP
# tutorial's checkpoint map {'cuda:%d' % 0: 'cuda:%d' % rank}
CUDA_FORMAT = re.compile(r"^cuda:(?:%d|%i|%s|\{\}|\{0\})$")


class AnalysisError(Exception):
    """The file cannot be analysed (syntax error, null bytes, nesting too deep). Message names the cause."""


def string_key(value: str) -> str:
    """Key under which a string constant is offered to rules: 'xla:1' -> 'xla'."""
    if not value.startswith(("xla", "cuda", "neuron")):  # most strings (docstrings): no match is possible
        return value
    m = _DEVICE_STRING.match(value)
    return m.group(1) if m else "cuda" if CUDA_FORMAT.match(value) else value


# Plain classes, not dataclasses: importing dataclasses costs every start-up about 20 ms (files/records.py).
class Scope:
    """One scope's bindings: local name -> qualified name (None when shadowed)."""

    def __init__(self, node: ast.AST, parent: Optional["Scope"], bindings: Optional[dict] = None,
                 imported: Optional[set] = None):
        self.node = node
        self.parent = parent
        self.bindings = {} if bindings is None else bindings  # name -> qualified name, or None when shadowed
        self.imported = set() if imported is None else imported
        self._by_qualname: Optional[dict] = None
        self._indexed = -1

    def names_bound_to(self, qualname: str) -> list:
        """The names this scope binds to `qualname`, in binding order (an index built on first use: rules ask
        for many qualified names in large modules)."""
        if self._by_qualname is None or self._indexed != len(self.bindings):
            index: dict = {}
            for name, q in self.bindings.items():
                if q is not None:
                    index.setdefault(q, []).append(name)
            self._by_qualname, self._indexed = index, len(self.bindings)
        return self._by_qualname.get(qualname, [])

    def lookup(self, name: str) -> tuple[Optional[str], Optional["Scope"]]:
        scope: Optional[Scope] = self
        while scope is not None:
            q = scope.bindings.get(name, _UNBOUND)
            if q is not _UNBOUND:
                return q, scope
            scope = scope.parent
        return None, None


class Site:
    """Something a rule may care about: a resolved call or reference, an import, a method call, a string."""

    def __init__(self, kind: str, key: str, node: ast.AST, analysis: "Analysis", scope: Scope,
                 alias: Optional[ast.alias] = None):
        self.kind = kind  # call | ref | store | import | star_import | method | attr | string | keyword
        self.key = key  # qualified name, method/attribute name, or string key
        self.node = node
        self.analysis = analysis
        self.scope = scope
        self.alias = alias  # for import sites

    @property
    def parent(self) -> Optional[ast.AST]:
        return self.analysis.parent_of.get(self.node)

    def ancestors(self) -> Iterator[ast.AST]:
        node = self.analysis.parent_of.get(self.node)
        while node is not None:
            yield node
            node = self.analysis.parent_of.get(node)

    @property
    def stmt(self) -> ast.stmt:
        if isinstance(self.node, ast.stmt):
            return self.node
        for anc in self.ancestors():
            if isinstance(anc, ast.stmt):
                return anc
        raise AssertionError("node outside any statement")

    @property
    def is_statement(self) -> bool:
        """The call is a whole expression statement: its value is discarded."""
        return isinstance(self.parent, ast.Expr)

    @property
    def span(self) -> Span:
        return self.analysis.span(self.node)

    @property
    def call(self) -> Optional[ast.Call]:
        return self.node if isinstance(self.node, ast.Call) else None


class Analysis:
    """Parsed tree, name resolution and sites of one source text."""

    # What the repository model says about this file (plain data, set by the rule runner from Settings.outside;
    # None: nothing known, the file is judged alone): "modes", the launch modes of the programs that run it
    # ("single", "torchrun", "xmp.spawn", "torch_xla.launch", "mp.spawn", "process group"); "training", the
    # training-step calls of defs and methods it imports from other files ({"name" / "Class.method": calls}).
    outside: Optional[dict] = None

    def __init__(self, text: str, path: str = "<string>", wanted: Optional["Wanted"] = None):
        self.text = text
        self.path = path
        try:
            self.tree = ast.parse(text, filename=path, type_comments=False)
        except SyntaxError as exc:
            line = f" line {exc.lineno}" if exc.lineno else ""
            raise AnalysisError(f"syntax error{line}: {exc.msg}") from None
        except (ValueError, RecursionError, MemoryError) as exc:  # null bytes, absurd nesting
            raise AnalysisError(f"cannot parse: {type(exc).__name__}: {exc}") from None
        self._lines: Optional[list[str]] = None
        self.parent_of: dict[ast.AST, ast.AST] = {}
        self.sites: list[Site] = []
        self.qualnames: set[str] = set()  # every resolved qualified name used in the file
        self.uses: dict[tuple[int, str], int] = {}  # (id(scope), name) -> resolved loads
        self.module_scope: Scope
        self.defined_names: set[str] = set()  # every name bound anywhere (to avoid collisions)
        self.scope_of: dict[ast.AST, Scope] = {}  # function/lambda node -> its scope (module: module_scope)
        # what the walk resolved, in its order, for whole-program indexes (program/distributed.py) that would
        # otherwise walk the tree and resolve every name again: (call, callee's qualified name) for each call of an
        # imported name, (node, qualified name) for each other load of one (a Name or the top of an attribute chain)
        self.resolved_calls: list[tuple[ast.Call, str]] = []
        self.resolved_refs: list[tuple[ast.AST, str]] = []
        self._wanted = wanted or Wanted.everything()
        try:
            self._walk()
        except RecursionError:
            raise AnalysisError("cannot analyse: expressions nested too deeply") from None

    def release(self) -> None:
        """Drop the tree, sites and facts once the file is done. They form reference cycles (a site points at its
        analysis), so without this only the cyclic GC frees them, and its passes over large live trees cost more
        than the analysis itself; cleared, plain reference counting frees them at once."""
        self.__dict__.clear()

    # -- positions -------------------------------------------------------------------------------
    @property
    def lines(self) -> list[str]:
        if self._lines is None:
            self._lines = source_lines(self.text, keepends=True) or [""]
        return self._lines

    def _char_col(self, line: int, byte_col: int) -> int:
        text = self.lines[line - 1] if 0 < line <= len(self.lines) else ""
        if text.isascii():
            return byte_col
        return len(text.encode("utf-8")[:byte_col].decode("utf-8", errors="replace"))

    def span(self, node: ast.AST) -> Span:
        return Span(
            node.lineno,
            self._char_col(node.lineno, node.col_offset),
            node.end_lineno or node.lineno,
            self._char_col(node.end_lineno or node.lineno, node.end_col_offset or 0),
        )

    def source(self, node: ast.AST) -> str:
        """Original text of a node (without surrounding parentheses)."""
        sp = self.span(node)
        if sp.line == sp.end_line:
            return self.lines[sp.line - 1][sp.col : sp.end_col]
        parts = [self.lines[sp.line - 1][sp.col :]]
        parts.extend(self.lines[sp.line : sp.end_line - 1])
        parts.append(self.lines[sp.end_line - 1][: sp.end_col])
        return "".join(parts)

    # -- resolution ------------------------------------------------------------------------------
    def resolve(self, node: ast.AST, scope: Scope, count_use: bool = True) -> Optional[str]:
        """Qualified name of a Name/Attribute chain whose root is an imported name, else None."""
        if type(node) is ast.Name:  # most calls: a plain name, no chain to collect
            base, owner = scope.lookup(node.id)
            if base is not None and count_use and owner is not None:
                key = (id(owner), node.id)
                self.uses[key] = self.uses.get(key, 0) + 1
            return base
        attrs = []
        while isinstance(node, ast.Attribute):
            attrs.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        base, owner = scope.lookup(node.id)
        if base is None:
            return None
        if count_use and owner is not None:
            key = (id(owner), node.id)
            self.uses[key] = self.uses.get(key, 0) + 1
        return ".".join([base, *reversed(attrs)]) if attrs else base

    def binding_for(self, qualname: str, scope: Optional[Scope] = None) -> Optional[str]:
        """A name visible in `scope` (default: module) bound to exactly `qualname`, if any."""
        start = scope = scope or self.module_scope
        while scope is not None:
            # a name an inner scope rebinds resolves there first, so lookup() from `start` rejects it
            for name in scope.names_bound_to(qualname):
                if start.lookup(name)[0] == qualname:
                    return name
            scope = scope.parent
        return None

    def uses_of(self, scope: Scope, name: str) -> int:
        return self.uses.get((id(scope), name), 0)

    # -- the walk --------------------------------------------------------------------------------
    def _collect_scope(self, scope: Scope) -> None:
        """Bind the names a scope imports or (in functions) assigns, before resolving its uses."""
        node = scope.node
        is_function = isinstance(node, _SCOPES)
        if is_function:
            args = node.args
            for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
                if a is not None:
                    scope.bindings[a.arg] = None
                    self.defined_names.add(a.arg)
        body = node.body if isinstance(node.body, list) else [node.body]
        stack = list(reversed(body))
        children_of = _CHILDREN
        assigned: set[str] = set()
        # (the classes and methods bound to locals: this loop sees most nodes of the file once)
        Name, Load, special = ast.Name, ast.Load, _COLLECT_SPECIAL
        pop, extend, defined_add, assigned_add = stack.pop, stack.extend, self.defined_names.add, assigned.add
        while stack:
            n = pop()
            t = type(n)
            if t is Name:
                if type(n.ctx) is not Load:  # Store or Del
                    defined_add(n.id)
                    assigned_add(n.id)
                continue
            if t not in special:
                extend(reversed(children_of[t](n)))  # a tree from ast.parse (see _walk)
                continue
            if t is ast.Import:
                for alias in n.names:
                    if alias.asname:
                        scope.bindings[alias.asname] = alias.name
                        scope.imported.add(alias.asname)
                        defined_add(alias.asname)
                    else:
                        root = alias.name.split(".")[0]
                        scope.bindings[root] = root
                        scope.imported.add(root)
                        defined_add(root)
                continue
            if t is ast.ImportFrom:
                if n.level == 0 and n.module:
                    for alias in n.names:
                        if alias.name == "*":
                            continue
                        name = alias.asname or alias.name
                        scope.bindings[name] = f"{n.module}.{alias.name}"
                        scope.imported.add(name)
                        defined_add(name)
                else:
                    for alias in n.names:
                        name = alias.asname or alias.name
                        defined_add(name)
                        assigned_add(name)
                continue
            if t is ast.FunctionDef or t is ast.AsyncFunctionDef or t is ast.ClassDef:
                defined_add(n.name)
                assigned_add(n.name)
                extend(reversed(n.decorator_list))
                if t is ast.ClassDef:
                    extend(reversed(n.body))  # class-body imports bind in the enclosing scope here
                continue
            # Lambda and Constant: nothing below binds here
        if is_function:
            for name in assigned - scope.imported:
                scope.bindings[name] = None
        else:
            # module level: a reassignment only shadows names that were never imported (guards keep imports)
            for name in assigned - scope.imported:
                scope.bindings.setdefault(name, None)

    def _walk(self) -> None:
        wanted = self._wanted
        self.module_scope = Scope(self.tree, None)
        self._collect_scope(self.module_scope)
        parent_of = self.parent_of
        sites = self.sites
        children_of = _CHILDREN
        # (node, scope) stack; children are pushed reversed so sites come out in source order
        stack: list[tuple[ast.AST, Scope]] = [(self.tree, self.module_scope)]
        push, pop = stack.append, stack.pop
        # the classes and methods the loop asks about, bound to locals (it runs once per node of the file)
        Call, Name, Attribute, Constant, Load = ast.Call, ast.Name, ast.Attribute, ast.Constant, ast.Load
        Import, ImportFrom, keyword = ast.Import, ast.ImportFrom, ast.keyword
        resolve, wants, add_site, add_qualname = self.resolve, wanted.wants, sites.append, self.qualnames.add
        want_string, want_attr, want_method = wanted.predicate("string"), wanted.predicate("attr"), wanted.predicate("method")
        want_keyword = wanted.predicate("keyword")
        uses = self.uses
        call_resolved, ref_resolved = self.resolved_calls.append, self.resolved_refs.append
        while stack:
            node, scope = pop()
            t = type(node)
            if t is Name:  # a third of all nodes: resolve() and Scope.lookup(), inlined
                name = node.id
                owner = scope
                while owner is not None:
                    q = owner.bindings.get(name, _UNBOUND)
                    if q is not _UNBOUND:
                        break
                    owner = owner.parent
                else:
                    continue  # bound nowhere (a builtin)
                if q is None:
                    continue  # a local or a shadowing assignment
                if type(node.ctx) is Load:
                    key = (id(owner), name)
                    uses[key] = uses.get(key, 0) + 1
                    kind = "ref"
                    ref_resolved((node, q))
                else:
                    kind = "store"  # Store or Del
                add_qualname(q)
                if wants(kind, q):
                    add_site(Site(kind, q, node, self, scope))
                continue  # no children
            if t in _SCOPE_TYPES and node is not scope.node:
                inner = Scope(node, scope)
                self._collect_scope(inner)
                self.scope_of[node] = inner
                # defaults and decorators belong to the outer scope
                outer_children = [*node.args.defaults, *[d for d in node.args.kw_defaults if d is not None]]
                if not isinstance(node, ast.Lambda):
                    outer_children += node.decorator_list
                    if node.returns is not None:
                        outer_children.append(node.returns)
                    # parameter annotations are evaluated in the enclosing scope too
                    a = node.args
                    for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
                        if arg is not None and arg.annotation is not None:
                            outer_children.append(arg.annotation)
                inner_children = node.body if isinstance(node.body, list) else [node.body]
                for child in reversed(inner_children):
                    parent_of[child] = node
                    stack.append((child, inner))
                for child in reversed(outer_children):
                    parent_of[child] = node
                    stack.append((child, scope))
                continue

            if t is Call:
                q = resolve(node.func, scope)
                if q is not None:
                    add_qualname(q)
                    call_resolved((node, q))
                    if wants("call", q):
                        add_site(Site("call", q, node, self, scope))
                    # the callee chain itself is consumed: do not offer it again as a ref
                    children = [*node.args, *node.keywords]
                    parent_of[node.func] = node
                    self._mark_inner(node.func)
                    for child in reversed(children):
                        parent_of[child] = node
                        push((child, scope))
                    continue
                if type(node.func) is Attribute and want_method(node.func.attr):
                    add_site(Site("method", node.func.attr, node, self, scope))
            elif t is Attribute:
                q = resolve(node, scope)
                if q is not None:
                    add_qualname(q)
                    if type(node.ctx) is Load:
                        kind = "ref"
                        ref_resolved((node, q))
                    else:
                        kind = "store"  # Store or Del
                    if wants(kind, q):
                        add_site(Site(kind, q, node, self, scope))
                    self._mark_inner(node)
                    continue  # the chain below resolves to prefixes of q: not separate sites
                if want_attr(node.attr):
                    add_site(Site("attr", node.attr, node, self, scope))
            elif t is Constant:
                if type(node.value) is str:
                    key = string_key(node.value)
                    if want_string(key):
                        add_site(Site("string", key, node, self, scope))
                continue  # no children
            elif t is Import:
                for alias in node.names:
                    q = alias.name
                    if wants("import", q):
                        add_site(Site("import", q, node, self, scope, alias=alias))
            elif t is ImportFrom:
                if node.level == 0 and node.module:
                    for alias in node.names:
                        if alias.name == "*":
                            if wants("star_import", node.module):
                                add_site(Site("star_import", node.module, node, self, scope, alias=alias))
                            continue
                        q = f"{node.module}.{alias.name}"
                        if wants("import", q):
                            add_site(Site("import", q, node, self, scope, alias=alias))
            elif t is keyword and node.arg is not None and want_keyword(node.arg):
                add_site(Site("keyword", node.arg, node, self, scope))

            # a tree from ast.parse: every node has all its fields (child_nodes' fallback is never needed)
            for child in reversed(children_of[t](node)):
                parent_of[child] = node
                push((child, scope))

    def _mark_inner(self, node: ast.AST) -> None:
        """Record parents along an attribute chain that is not walked further."""
        parent_of = self.parent_of
        while isinstance(node, ast.Attribute):
            parent_of[node.value] = node
            node = node.value


class Wanted:
    """Which sites the active rules subscribe to: exact keys and key prefixes per site kind."""

    def __init__(self, exact: dict[str, set], prefixes: dict[str, tuple], any_kinds: set):
        self.exact = exact
        self.prefixes = prefixes
        self.any_kinds = any_kinds
        self._memo: dict[str, dict[str, bool]] = {}  # kind -> key -> answer: keys repeat across sites and files
        self._memo_size = 0
        self._predicates: dict[str, Callable[[str], bool]] = {}

    @classmethod
    def everything(cls) -> "Wanted":
        kinds = {"call", "ref", "store", "import", "star_import", "method", "attr", "string", "keyword"}
        return cls({}, {}, kinds)

    def wants(self, kind: str, key: str) -> bool:
        memo = self._memo.get(kind)
        if memo is None:
            memo = self._memo[kind] = {}
        hit = memo.get(key)
        if hit is None:
            if self._memo_size >= 200_000:  # a long-lived server sees many files: keep the memo bounded
                self._memo.clear()
                self._memo_size = 0
                memo = self._memo[kind] = {}
            hit = memo[key] = self._wants(kind, key)
            self._memo_size += 1
        return hit

    def _wants(self, kind: str, key: str) -> bool:
        return self.predicate(kind)(key)

    def predicate(self, kind: str) -> Callable[[str], bool]:
        """`wants(kind, key)` for one kind, without the memo: for kinds whose keys rarely repeat (strings,
        docstrings included, attribute and keyword names), where a memo only grows."""
        p = self._predicates.get(kind)
        if p is None:
            p = self._predicates[kind] = self._predicate(kind)
        return p

    def _predicate(self, kind: str) -> Callable[[str], bool]:
        if kind in self.any_kinds:
            return _always
        exact = frozenset(self.exact.get(kind, ()))
        prefixes = tuple(self.prefixes.get(kind, ()))
        if not prefixes:
            return exact.__contains__
        return lambda key: key in exact or key.startswith(prefixes)


def _always(_key: str) -> bool:
    return True
