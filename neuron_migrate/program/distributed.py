"""Distributed facts of one file: how it is launched, where a process group exists, what is DDP-wrapped.

Rules that migrate torch_xla's multi-process API ask these questions instead of guessing from one call site:

- `facts.entry_point`: the file runs as a program (`if __name__ == "__main__":`, a launch call), else a library.
- `facts.launch`: "spawn" (`xmp.spawn`), "launch" (`torch_xla.launch`), "torchrun" (an entry point that calls
  `init_process_group` itself) or None.
- `facts.single_device`: an entry point that never starts a process group (no init, no launcher, no DDP, no
  torchrun environment read) and that no distributed program of the repository runs (imports, or starts with
  torchrun: `analysis.outside`, from the repository model): ranks are 0, the world is 1 and every collective is
  local.
- `facts.group_at(node)`: the process-group state where `node` runs, a `Group`: NONE (the program never starts
  one), MAYBE (also module-level code of a module that xmp.spawn / torch_xla.launch programs import, whose functions
  are ALWAYS: the repository model's "group"), LAUNCHED (a group exists whenever torchrun started the program: `if "WORLD_SIZE" in os.environ:
  init` alone) or ALWAYS (an `init_process_group` runs before it on every path, e.g. the launch rewrite's own:
  torchrun's group, else a one-process group).
- `facts.launch_needs_init(fn)`: the launch rewrite has to start the group itself (the worker does not always);
  `facts.launch_inits()`: it does so somewhere in this file (then every other init must be guarded).
- `facts.always_wrapped(optimizer, at)`: the optimizer's model is DDP/FSDP-wrapped on every path (True), it is
  not or only sometimes (False), or the file does not show (None); `facts.wraps_unconditionally()`: every
  DDP/FSDP wrap in the file runs whenever its function runs (the answer when the optimizer cannot be followed).
- `facts.uses(qualnames)`: every call or reference of those names in the file, for API families that must
  migrate together (all `xm.all_reduce` of a file, or none).

Everything is computed from the `ast` of the file in one cheap pass plus memoised look-ups; nothing is imported.
The same answers come out before and after the launch rewrite (its `if "WORLD_SIZE" in os.environ: ... else: ...`
init is recognised), so a fixed-point rewrite does not flip decisions between rounds.
"""
from __future__ import annotations

import ast
import enum
from collections.abc import Iterable

from neuron_migrate.names.analysis import walk
from neuron_migrate.program import cached

TYPE_CHECKING = False  # typing is not imported at run time (start-up): it serves annotations only
if TYPE_CHECKING:
    from typing import Optional

DIST = "torch.distributed"
INIT = {f"{DIST}.init_process_group", f"{DIST}.distributed_c10d.init_process_group"}
IS_INITIALIZED = {f"{DIST}.is_initialized", f"{DIST}.distributed_c10d.is_initialized"}
SPAWN = {"torch_xla.distributed.xla_multiprocessing.spawn"}
LAUNCH = {"torch_xla.launch", "torch_xla.torch_xla.launch"}
OTHER_LAUNCHERS = ("torch.multiprocessing.spawn", "torch.multiprocessing.start_processes",
                   "torch.distributed.launcher", "torch.distributed.elastic", "torch.distributed.run")
WRAPPERS = (
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
    "torch.distributed.fsdp",
    "torch.distributed._composable.fsdp",
    "torch.distributed._composable.replicate",
    "torch_xla.distributed.fsdp",
)
# environment a torchrun-started program reads: a sign that it is meant for several processes
TORCHRUN_ENV = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK"}

_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


class Group(enum.Enum):
    NONE = "none"  # the program never starts a process group
    MAYBE = "maybe"
    LAUNCHED = "launched"  # started by the launch rewrite whenever torchrun launched the program
    ALWAYS = "always"

    @property
    def exists(self) -> bool:
        return self is Group.ALWAYS


_RANKING = {Group.MAYBE: 0, Group.LAUNCHED: 1, Group.ALWAYS: 2}


def _stronger(a: Group, b: Group) -> Group:
    return a if _RANKING.get(a, 0) >= _RANKING.get(b, 0) else b


def _join(states: Iterable[Group]) -> Group:
    """The state every one of several call sites guarantees."""
    out = None
    for s in states:
        if out is None or s == out:
            out = s
        elif {s, out} <= {Group.ALWAYS, Group.LAUNCHED}:
            out = Group.LAUNCHED
        else:
            return Group.MAYBE
    return out or Group.MAYBE


def _source_order(node: ast.AST) -> tuple[int, int]:
    return node.lineno, node.col_offset


def facts(analysis) -> "DistributedFacts":
    return cached(analysis, "distributed", DistributedFacts)


class DistributedFacts:
    def __init__(self, analysis):
        self.analysis = analysis
        a = analysis
        self.calls: dict[str, list[ast.Call]] = {}  # qualified name -> calls
        self.refs: dict[str, list[ast.AST]] = {}  # qualified name -> uses as a value
        self.defs: dict[str, list[ast.AST]] = {}  # function name -> definitions
        self.local_calls: dict[str, list[ast.Call]] = {}  # function name -> calls of it by plain name
        self.local_refs: dict[str, list[ast.Name]] = {}  # function name -> other loads of it
        self._env_strings = False
        self._rewritten: Optional[bool] = None
        self._index(a.tree)
        outside = getattr(a, "outside", None)
        # the repository model saw every file that could call into this one, and none imports it (None: no model)
        self.imported_elsewhere = (None if outside is None or "unknown" in outside.get("modes", ())
                                   else bool(outside.get("imported")))
        self.entry_point = self._has_main_guard() or bool(self._launch_calls()) or self._script()
        inits = self._calls_of(INIT)
        if self._calls_of(SPAWN):
            self.launch: Optional[str] = "spawn"
        elif self._calls_of(LAUNCH):
            self.launch = "launch"
        elif self.entry_point and (inits or self._rewritten_launch()):
            self.launch = "torchrun"
        else:
            self.launch = None
        # XLA SPMD (xr.use_spmd()) is one process today, but NM150's rewrite makes it one process per device with a
        # process group: never judged single-device, so ranks stay guarded calls in the rewritten program
        others = any(q.startswith(OTHER_LAUNCHERS) for q in self.calls) or "torch_xla.runtime.use_spmd" in self.calls
        wrappers = any(q.startswith(WRAPPERS) for q in [*self.calls, *self.refs])
        self.starts_group = bool(inits or self._launch_calls() or others or wrappers)
        # a distributed program of the repository runs this file (it imports it, or starts it with torchrun): what
        # the file shows alone does not make it single-process (repository/model.py)
        self.distributed_elsewhere = bool(outside) and any(m != "single" for m in outside.get("modes", ()))
        # every program that runs this module starts it through xmp.spawn / torch_xla.launch, whose rewrite (NM127) starts
        # the process group before it calls the worker: a function of the module runs inside a group
        self.group_elsewhere = bool(outside) and bool(outside.get("group")) and not self.entry_point
        self.single_device = (self.entry_point and not self.starts_group and not self._env_strings
                              and not self.distributed_elsewhere)
        self._entry: dict[int, Group] = {}
        self._in_progress: set[int] = set()
        self._summary: dict[int, Group] = {}
        self._summarising = 0  # function summaries being built: a _starts answer may rest on a provisional one
        # id(block) -> what the statements of block[:k] start, for the k asked so far (_state_before asks about
        # every site's statement, and scanning its block again each time made long functions quadratic)
        self._prefix_starts: dict[int, list] = {}

    def _script(self) -> bool:
        """A script without a `__main__` guard: its module level loops (a training loop written at the top level,
        as quick experiments and notebooks exported to files are), and the repository model saw that no file
        imports it ("script"). A lone file (no model) is not judged so: a library module may be imported from
        elsewhere."""
        outside = getattr(self.analysis, "outside", None)
        return bool(outside and outside.get("script")) and any(
            isinstance(s, (ast.For, ast.While, ast.AsyncFor)) for s in self.analysis.tree.body)

    # -- index ------------------------------------------------------------------------------------
    def qualname(self, node: ast.AST) -> Optional[str]:
        """Qualified name of a Name/Attribute chain rooted in an import, in the scope where it stands."""
        return self.analysis.resolve(node, scope_at(self.analysis, node), count_use=False)

    def _index(self, tree: ast.Module) -> None:
        """Calls, value uses and defs by name. The calls and uses of imported names are the ones the name walk
        resolved (names/analysis.py), in its scopes; the rest comes from one loop over the nodes it met (its parent
        map): defs, calls of plain names that resolve to no import, loads of plain names that may be local
        functions (kept once every def is known), the torchrun variables' names as strings. The imported names'
        lists are in the walk's order, the others in source order."""
        a = self.analysis
        for node, q in a.resolved_calls:
            self.calls.setdefault(q, []).append(node)
        for node, q in a.resolved_refs:
            self.refs.setdefault(q, []).append(node)
        Name, Call, Attribute, Constant, Load = ast.Name, ast.Call, ast.Attribute, ast.Constant, ast.Load
        FunctionDef, AsyncFunctionDef = ast.FunctionDef, ast.AsyncFunctionDef
        resolved = {id(c) for c, _q in a.resolved_calls}
        defs, local_calls, loads = [], [], []  # loads: Name loads that are neither a callee nor an attribute's base
        for node, up in a.parent_of.items():
            t = type(node)
            if t is Name:
                if type(node.ctx) is Load and type(up) is not Attribute and (type(up) is not Call or up.func is not node):
                    loads.append(node)
            elif t is Call:
                if type(node.func) is Name and id(node) not in resolved:
                    local_calls.append(node)
            elif t is FunctionDef or t is AsyncFunctionDef:
                defs.append(node)
            elif t is Constant and type(node.value) is str and node.value in TORCHRUN_ENV:
                self._env_strings = True
        for node in sorted(defs, key=_source_order):
            self.defs.setdefault(node.name, []).append(node)
        for node in sorted(local_calls, key=_source_order):
            self.local_calls.setdefault(node.func.id, []).append(node)
        imported = {id(n) for n, _q in a.resolved_refs}
        for node in sorted((n for n in loads if n.id in self.defs and id(n) not in imported), key=_source_order):
            self.local_refs.setdefault(node.id, []).append(node)

    def _calls_of(self, names: Iterable[str]) -> list[ast.Call]:
        return [c for n in names for c in self.calls.get(n, ())]

    def _launch_calls(self) -> list[ast.Call]:
        return self._calls_of(SPAWN | LAUNCH)

    def uses(self, qualnames: Iterable[str]) -> list[ast.AST]:
        """Calls and value uses of the names, in source order (an API family that must migrate together)."""
        nodes = [n for q in qualnames for n in [*self.calls.get(q, ()), *self.refs.get(q, ())]]
        return sorted(nodes, key=lambda n: (n.lineno, n.col_offset))

    def _has_main_guard(self) -> bool:
        for stmt in self.analysis.tree.body:
            if isinstance(stmt, ast.If) and _is_main_test(stmt.test):
                return True
        return False

    def _rewritten_launch(self) -> bool:
        if self._rewritten is None:  # asked by __init__ and again by rules, per site: one walk of the file
            self._rewritten = any(self._launch_init(s) for s in walk(self.analysis.tree) if isinstance(s, ast.If))
        return self._rewritten

    # -- statement predicates ---------------------------------------------------------------------
    def _is_init_call(self, node: ast.AST) -> bool:
        return (isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute))
                and self.qualname(node.func) in INIT)

    def _stmt_inits(self, stmt: ast.stmt) -> bool:
        """The statement itself is an init_process_group call (value used or not)."""
        value = getattr(stmt, "value", None) if isinstance(stmt, (ast.Expr, ast.Assign, ast.AnnAssign)) else None
        return value is not None and self._is_init_call(value)

    def _body_inits(self, body: list) -> bool:
        return any(self._stmt_inits(s) for s in body)

    def _not_initialized_test(self, test: ast.expr) -> bool:
        return (isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and isinstance(test.operand, ast.Call)
                and isinstance(test.operand.func, (ast.Name, ast.Attribute)) and self.qualname(test.operand.func) in IS_INITIALIZED)

    def _initialized_test(self, test: ast.expr) -> bool:
        if isinstance(test, ast.Call) and isinstance(test.func, (ast.Name, ast.Attribute)):
            return self.qualname(test.func) in IS_INITIALIZED
        if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
            return any(self._initialized_test(v) for v in test.values)
        return False

    def _launch_init(self, stmt: ast.If) -> bool:
        """The launch rewrite's `if "WORLD_SIZE" in os.environ: dist.init_process_group("neuron")` (with or
        without its `else:` one-process group)."""
        mentions = any(isinstance(n, ast.Constant) and n.value == "WORLD_SIZE" for n in walk(stmt.test))
        return mentions and self._body_inits(stmt.body) and (not stmt.orelse or self._body_inits(stmt.orelse))

    def _starts(self, stmt: ast.stmt) -> Optional[Group]:
        """What a statement guarantees for the statements after it in the same block."""
        if self._stmt_inits(stmt):
            return Group.ALWAYS
        if isinstance(stmt, ast.If) and self._body_inits(stmt.body):
            if stmt.orelse:
                return Group.ALWAYS if self._body_inits(stmt.orelse) else None  # both branches start one
            if self._not_initialized_test(stmt.test):
                return Group.ALWAYS
            if self._launch_init(stmt):
                return Group.LAUNCHED
            return None
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and isinstance(stmt.value.func, ast.Name):
            name = stmt.value.func.id
            if name in self.defs and self.qualname(stmt.value.func) is None and len(self.defs[name]) == 1:
                return self._function_summary(self.defs[name][0])
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and isinstance(stmt.value.func, (ast.Name, ast.Attribute)):
            q = self.qualname(stmt.value.func)
            if q in SPAWN | LAUNCH:
                return None
        return None

    def _function_summary(self, fn: ast.AST) -> Optional[Group]:
        """What calling `fn` guarantees afterwards (a `setup()` that always initialises the group)."""
        key = id(fn)
        if key in self._summary:
            return self._summary[key]
        self._summary[key] = None  # recursion: no guarantee
        self._summarising += 1
        try:
            best = self._fold_starts(fn.body, None)
        finally:
            self._summarising -= 1
        self._summary[key] = best
        return best

    def _started_before(self, block: list, index: int) -> Optional[Group]:
        """What the statements block[:index] start (the strongest of their _starts), or None."""
        if not block:
            return None
        if self._summarising:
            return self._fold_starts(block[:index], None)
        done = self._prefix_starts.setdefault(id(block), [None])  # done[k]: the answer for block[:k]
        while len(done) <= index:  # extended in order, as a scan from the top would evaluate them
            done.append(self._fold_starts([block[len(done) - 1]], done[-1]))
        return done[index]

    def _fold_starts(self, stmts: list, best: Optional[Group]) -> Optional[Group]:
        for s in stmts:
            got = self._starts(s)
            if got is not None:
                best = got if best is None else _stronger(best, got)
        return best

    # -- group state --------------------------------------------------------------------------------
    def group_at(self, node: ast.AST) -> Group:
        """Process-group state where `node` runs."""
        if self.single_device:
            return Group.NONE
        return self._state_before(_stmt_of(self.analysis, node))

    def _state_before(self, stmt: ast.stmt) -> Group:
        a = self.analysis
        best = Group.MAYBE
        cur: ast.AST = stmt
        while True:
            parent = a.parent_of.get(cur)
            if parent is None or isinstance(parent, (ast.Module, *_FUNCS)):
                block, index = _position(a, parent if parent is not None else a.tree, cur)
                got = self._started_before(block, index)
                if got is not None:
                    best = _stronger(best, got)
                if parent is None or isinstance(parent, ast.Module):
                    return best
                if isinstance(parent, ast.Lambda):
                    return best
                return _stronger(best, self._entry_state(parent))
            block, index = _position(a, parent, cur)
            if block is not None:
                got = self._started_before(block, index)
                if got is not None:
                    best = _stronger(best, got)
                if isinstance(parent, ast.If) and block is parent.body and self._initialized_test(parent.test):
                    best = Group.ALWAYS
            cur = parent

    def _entry_state(self, fn: ast.AST) -> Group:
        """What every caller of `fn` in this file guarantees when it is called."""
        key = id(fn)
        if key in self._entry:
            return self._entry[key]
        if key in self._in_progress:
            return Group.MAYBE
        if self.group_elsewhere:
            self._entry[key] = Group.ALWAYS
            return Group.ALWAYS
        self._in_progress.add(key)
        try:
            name = getattr(fn, "name", None)
            parent = self.analysis.parent_of.get(fn)
            if name is None or isinstance(parent, ast.ClassDef) or len(self.defs.get(name, ())) != 1:
                state = Group.MAYBE
            else:
                states = []
                for call in self.local_calls.get(name, ()):
                    if call.func.id == name and self.qualname(call.func) is None:
                        stmt = _stmt_of(self.analysis, call)
                        state = self._state_before(stmt)
                        if state is not Group.ALWAYS and self._launch_beside(stmt, name):
                            state = Group.ALWAYS  # the launch rewrite starts torchrun's group here too (NM127)
                        states.append(state)
                for ref in self.local_refs.get(name, ()):
                    launch = self.analysis.parent_of.get(ref)
                    if isinstance(launch, ast.Call) and launch in self._launch_calls() and _launched_fn(launch) is ref:
                        # the launch rewrite starts the group before calling the worker (NM127)
                        states.append(Group.ALWAYS if self.launch_needs_init(name) else Group.MAYBE)
                    else:
                        states.append(Group.MAYBE)
                state = _join(states) if states else Group.MAYBE
        finally:
            self._in_progress.discard(key)
        self._entry[key] = state
        return state

    def _launch_beside(self, stmt: ast.stmt, name: str) -> bool:
        """`stmt` (a direct call of the worker `name`) is the torchrun side of the script's torchrun test whose other
        side launches the same worker (`if dist.is_torchelastic_launched(): fn(...) else: xmp.spawn(fn, ...)`), and the
        launch rewrite starts the group for it."""
        found = _torchrun_if(self.analysis, stmt)
        if found is None or not found[0] or not self.launch_needs_init(name):
            return False
        return any(isinstance(n, ast.Call) and n in self._launch_calls() and isinstance(_launched_fn(n), ast.Name)
                   and _launched_fn(n).id == name for st in found[1] for n in ast.walk(st))

    def launch_needs_init(self, fn_name: Optional[str]) -> bool:
        """The launch rewrite must start the group itself: the worker does not always start it first."""
        defs = self.defs.get(fn_name or "", ())
        if len(defs) != 1:
            return True
        return self._function_summary(defs[0]) is not Group.ALWAYS

    def launch_inits(self) -> bool:
        """The launch rewrite starts the process group (torchrun runs), so the script's own init must be guarded."""
        if self._rewritten_launch():
            return True
        for call in self._launch_calls():
            fn = _launched_fn(call)
            if self.launch_needs_init(fn.id if isinstance(fn, ast.Name) else None):
                return True
        return False

    # -- DDP wrapping ---------------------------------------------------------------------------------
    def always_wrapped(self, optimizer: ast.expr, at: ast.AST, depth: int = 0) -> Optional[bool]:
        """Is the model whose parameters `optimizer` steps wrapped in DDP/FSDP on every path to `at`?"""
        if not isinstance(optimizer, ast.Name) or depth > 3:
            return None
        fn = function_of(self.analysis, at)
        defs = _assignments(fn, optimizer.id, self.analysis)
        if not defs:
            return self._through_parameter(fn, optimizer.id, lambda arg, call: self.always_wrapped(arg, call, depth + 1))
        results = []
        for assign in defs:
            model = _model_of_optimizer(assign.value)
            if model is None:
                return None
            # the wrap may come after the optimizer is built: what counts is that it runs before the step
            results.append(self._model_wrapped(model, at if function_of(self.analysis, at) is fn else None, assign, depth))
        if any(r is None for r in results):
            return None
        return all(results)

    def _model_wrapped(self, model: ast.expr, at: Optional[ast.AST], where: ast.AST, depth: int) -> Optional[bool]:
        """The model expression (`model`, `model.module`) in the function holding `where` is wrapped on every path
        (before `at` when given, else anywhere in that function)."""
        root = model
        while isinstance(root, ast.Attribute):
            root = root.value
        if not isinstance(root, ast.Name):
            return None
        name = root.id
        fn = function_of(self.analysis, where)
        limit = _stmt_of(self.analysis, at).lineno if at is not None else float("inf")
        found_wrap = False
        for s in _function_statements(self.analysis, fn):
            if not isinstance(s, (ast.Assign, ast.AnnAssign, ast.Expr)) or s.lineno > limit:
                continue
            value = s.value
            if value is None:
                continue
            wrap_call = value if isinstance(value, ast.Call) and self._is_wrapper(value.func) else None
            if wrap_call is None:
                if any(isinstance(n, ast.Call) and self._is_wrapper(n.func) for n in walk(value)):
                    targets = _target_names(s)
                    if name in targets:
                        found_wrap = True  # wrapped inside an expression (`DDP(m) if flag else m`): not always
                continue
            targets = _target_names(s)
            first = wrap_call.args[0] if wrap_call.args else None
            if name in targets or (isinstance(first, ast.Name) and first.id == name):
                found_wrap = True
                if _unconditional(self.analysis, s, fn):
                    return True
        if found_wrap:
            return False
        defs = _assignments(fn, name, self.analysis)
        if not defs:
            via = self._through_parameter(fn, name, lambda arg, call: self._model_wrapped(arg, call, call, depth + 1) if depth < 3 else None)
            return via
        return False

    def wraps_unconditionally(self) -> bool:
        """The file wraps models in DDP/FSDP, and every wrap runs whenever its function runs (no flag decides)."""
        wraps = [c for q, calls in self.calls.items() if q.startswith(WRAPPERS) for c in calls]
        if not wraps:
            return False
        for call in wraps:
            stmt = _stmt_of(self.analysis, call)
            if stmt.value is not call if isinstance(stmt, (ast.Assign, ast.Expr)) else True:
                return False  # inside an expression (`DDP(m) if flag else m`)
            if not _unconditional(self.analysis, stmt, function_of(self.analysis, stmt)):
                return False
        return True

    def _is_wrapper(self, func: ast.AST) -> bool:
        if not isinstance(func, (ast.Name, ast.Attribute)):
            return False
        q = self.qualname(func)
        return q is not None and q.startswith(WRAPPERS)

    def _through_parameter(self, fn, name: str, ask) -> Optional[bool]:
        """`name` is a parameter of `fn`: ask about the argument at each call site of `fn` in this file."""
        if fn is None or isinstance(fn, ast.Lambda):
            return None
        params = [p.arg for p in [*fn.args.posonlyargs, *fn.args.args]]
        kwonly = [p.arg for p in fn.args.kwonlyargs]
        if name not in params and name not in kwonly:
            return None
        calls = [c for c in self.local_calls.get(fn.name, ()) if self.qualname(c.func) is None]
        if not calls or self.local_refs.get(fn.name):
            return None
        results = []
        for call in calls:
            arg = None
            for kw in call.keywords:
                if kw.arg == name:
                    arg = kw.value
            if arg is None and name in params:
                i = params.index(name)
                if isinstance(self.analysis.parent_of.get(fn), ast.ClassDef):
                    i -= 1
                if 0 <= i < len(call.args) and not any(isinstance(x, ast.Starred) for x in call.args[: i + 1]):
                    arg = call.args[i]
            if arg is None:
                return None
            results.append(ask(arg, call))
        if any(r is None for r in results):
            return None
        return all(results)


# -- small tree helpers ------------------------------------------------------------------------------
def _is_main_test(test: ast.expr) -> bool:
    if not isinstance(test, ast.Compare) or len(test.ops) != 1 or not isinstance(test.ops[0], ast.Eq):
        return False
    sides = [test.left, test.comparators[0]]
    return any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides) and any(
        isinstance(s, ast.Constant) and s.value == "__main__" for s in sides)


def _launched_fn(call: ast.Call) -> Optional[ast.AST]:
    for kw in call.keywords:
        if kw.arg == "fn":
            return kw.value
    return call.args[0] if call.args else None


def _stmt_of(analysis, node: ast.AST) -> ast.stmt:
    while not isinstance(node, ast.stmt):
        node = analysis.parent_of[node]
    return node


def function_of(analysis, node: ast.AST):
    """The innermost def or lambda that holds `node` (its decorators and defaults included), None at module level."""
    n = analysis.parent_of.get(node)
    while n is not None and not isinstance(n, _FUNCS):
        n = analysis.parent_of.get(n)
    return n


def scope_at(analysis, node: ast.AST):
    """The name scope of the function_of `node` (the module's at module level)."""
    return analysis.scope_of.get(function_of(analysis, node), analysis.module_scope)


_BLOCK_FIELDS = ("body", "orelse", "finalbody", "handlers")


def _position(analysis, parent: ast.AST, child: ast.AST) -> tuple[Optional[list], int]:
    """(the block of `parent` that holds `child`, its index there), or (None, 0); each parent's blocks are
    indexed once per file."""
    def build(_a) -> dict:
        where: dict = {}
        for f in _BLOCK_FIELDS:
            block = getattr(parent, f, None)
            if isinstance(block, list):
                for i, c in enumerate(block):
                    where.setdefault(id(c), (block, i))  # the first block holding it, as a scan would find
        return where

    return cached(analysis, f"distributed.positions:{id(parent)}", build).get(id(child), (None, 0))


def _walk_function(fn, tree: Optional[ast.Module] = None) -> list:
    """Statements of a function (fn=None: of the module `tree`) in source order, without nested scopes."""
    body = fn.body if fn is not None else (tree.body if tree is not None else [])
    out = []
    stack = list(reversed(body)) if isinstance(body, list) else []
    while stack:
        s = stack.pop()
        out.append(s)
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for f in _BLOCK_FIELDS:
            block = getattr(s, f, None)
            if isinstance(block, list):
                for c in reversed(block):
                    if isinstance(c, ast.ExceptHandler):
                        stack.extend(reversed(c.body))
                    elif isinstance(c, ast.stmt):
                        stack.append(c)
        if isinstance(s, ast.Match):
            for case in reversed(s.cases):
                stack.extend(reversed(case.body))
    return sorted(out, key=lambda s: s.lineno)


def _target_names(stmt: ast.stmt) -> set:
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
    return {t.id for t in targets if isinstance(t, ast.Name)}


def _function_statements(analysis, fn) -> list:
    """_walk_function's statements, listed once per function and file."""
    return cached(analysis, f"distributed.statements:{id(fn)}", lambda a: _walk_function(fn, a.tree))


def _assignments(fn, name: str, analysis) -> list:
    """Assignments `name = ...` in the function (module level when fn is None), in source order."""
    def build(a) -> dict:
        by_name: dict = {}
        for s in _function_statements(a, fn):
            if isinstance(s, (ast.Assign, ast.AnnAssign)) and s.value is not None:
                for target in _target_names(s):
                    by_name.setdefault(target, []).append(s)
        return by_name

    return list(cached(analysis, f"distributed.assignments:{id(fn)}", build).get(name, ()))


def _model_of_optimizer(value: ast.expr) -> Optional[ast.expr]:
    """`model` in `SGD(model.parameters(), ...)` (also named_parameters, or param-group dicts built from them)."""
    if not isinstance(value, ast.Call):
        return None
    for n in walk(value):
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                and n.func.attr in ("parameters", "named_parameters") and n is not value):
            return n.func.value
    return None


def _unconditional(analysis, stmt: ast.stmt, fn) -> bool:
    """No `if`, `try`, loop `else` or match between the statement and its function body."""
    n = analysis.parent_of.get(stmt)
    child = stmt
    while n is not None and n is not fn and not isinstance(n, ast.Module):
        if isinstance(n, (ast.If, ast.Try, ast.ExceptHandler, ast.Match, ast.IfExp, ast.While)):
            return False
        if isinstance(n, (ast.For, ast.AsyncFor)) and any(c is child for c in n.orelse):
            return False
        if isinstance(n, (ast.For, ast.AsyncFor)):
            return False  # a loop may run zero times
        child = n
        n = analysis.parent_of.get(n)
    return True


# -- the script's own test for torchrun ---------------------------------------------------------------------------
TORCHRUN_VARS = TORCHRUN_ENV | {"TORCHELASTIC_RUN_ID"}


def tests_torchrun(analysis, test) -> bool:
    """`test` asks whether torchrun started the process: `dist.is_torchelastic_launched()` (pytorch/xla's
    test_train_mp_imagenet.py), `os.environ.get("WORLD_SIZE")`, `os.getenv("RANK")`, `"WORLD_SIZE" in os.environ`."""
    resolve = analysis.resolve
    if isinstance(test, ast.Call) and not test.args and not test.keywords:
        return resolve(test.func, analysis.module_scope, count_use=False) == "torch.distributed.is_torchelastic_launched"
    if isinstance(test, ast.Call) and test.args and isinstance(test.args[0], ast.Constant) \
            and test.args[0].value in TORCHRUN_VARS:
        return resolve(test.func, analysis.module_scope, count_use=False) in ("os.environ.get", "os.getenv")
    if (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.In)
            and isinstance(test.left, ast.Constant) and test.left.value in TORCHRUN_VARS):
        return resolve(test.comparators[0], analysis.module_scope, count_use=False) == "os.environ"
    return False


def _torchrun_if(analysis, node):
    """(whether `node` is on the side its innermost torchrun test (in its function) takes under torchrun, the
    statements of the other side), or None when no such test holds it."""
    parents = analysis.parent_of
    child, p = node, parents.get(node)
    while p is not None and not isinstance(p, (*_FUNCS, ast.ClassDef)):
        if isinstance(p, ast.If) and child is not p.test:
            in_body = any(child is st for st in p.body)
            test = p.test
            negated = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
            if tests_torchrun(analysis, test.operand if negated else test):
                return in_body != negated, (p.orelse if in_body else p.body)
        child, p = p, parents.get(p)
    return None


def torchrun_side(analysis, node) -> Optional[bool]:
    """True: `node` runs only when torchrun started the process; False: only when it did not; None: either."""
    found = _torchrun_if(analysis, node)
    return None if found is None else found[0]


def torchrun_branch_of(analysis, stmt) -> Optional[list]:
    """The statements the script runs instead of `stmt` when torchrun started it (`stmt` in the other branch of its
    torchrun test: `if dist.is_torchelastic_launched(): fn(...) else: xmp.spawn(fn, ...)`), else None."""
    found = _torchrun_if(analysis, stmt)
    return None if found is None or found[0] else found[1]
