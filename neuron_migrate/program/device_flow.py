"""Device flow: which tensors and modules are on, or go to, the accelerator, and which code dispatches over backends.

Two facts rules need and no single call site shows:

- **placement**: where a tensor or module expression lives. `x.to(device)`, `x.cuda()`, `torch.zeros(..., device=dev)`
  with an accelerator device, and names assigned from them are on the device; `x.cpu()`, `x.numpy()`,
  `torch.from_numpy(a)`, `device="cpu"` and names assigned from them are on the CPU; anything else is unknown.
  **fate** follows an expression outwards (`x.double().to(device)`, `y = x.double(); y = y.to(device)`): where its
  value ends up. A float64 fix (NM304) applies only where the value is on or goes to the device; a float64
  reference computed after `.cpu()` is left alone.
- **dispatch**: a function (or the module) that tests several backends (`torch.cuda.is_available()` next to
  `torch.backends.mps.is_available()` / `torch.xpu` / `is_torch_xla_available()`, `device.type == "cuda"` next to
  `"mps"`, a `{"cuda": ..., "xpu": ...}` table) is multi-backend library code: CUDA rules leave it alone.

Device-ish values: the strings 'neuron', 'cuda', 'xla' (with an index), `torch.device(<one of them>)`,
`xm.xla_device()`, `torch.accelerator.current_accelerator()`, and names or attributes called `device`/`dev`/`*_device`
unless the same scope gives them a CPU value.

Entry point: `facts(analysis) -> DeviceFlow`.
"""
from __future__ import annotations

import ast
import re

from neuron_migrate.program import cached, program_nodes
from neuron_migrate.program import values as _values

TYPE_CHECKING = False  # typing is not imported at run time (start-up): it serves annotations only
if TYPE_CHECKING:
    from typing import Optional

DEVICE, CPU, UNKNOWN = "device", "cpu", "unknown"
_ACCEL_STRINGS = re.compile(r"^(neuron|cuda|xla)(:\d+)?$")
_DEVICE_NAME = re.compile(r"^(device|dev|.*_device|device_.*)$", re.I)
_DEVICE_CALLS = {"torch_xla.core.xla_model.xla_device", "torch_xla.device", "torch_xla.runtime.xla_device",
                 "torch.accelerator.current_accelerator"}
_TO_CPU_METHODS = {"cpu", "numpy", "tolist", "item"}
_TO_DEVICE_METHODS = {"cuda", "neuron", "xla"}
_CPU_SOURCES = {"torch.from_numpy"}
# availability tests per backend (qualified names; accelerate/transformers-style helpers matched by name below)
_AVAILABILITY = {
    "torch.cuda.is_available": "cuda", "torch.backends.mps.is_available": "mps", "torch.backends.mps.is_built": "mps",
    "torch.mps.is_available": "mps", "torch.xpu.is_available": "xpu", "torch.npu.is_available": "npu",
    "torch.hpu.is_available": "hpu", "torch.mlu.is_available": "mlu", "torch.neuron.is_available": "neuron",
    "torch.musa.is_available": "musa",
}
_HELPER_AVAILABLE = re.compile(r"^is_(?:torch_)?(cuda|mps|xpu|npu|hpu|mlu|musa|xla|tpu|neuron|neuronx|ipex|habana|gaudi)(?:_available)?$")
_HASATTR_BACKENDS = {"xpu", "mps", "npu", "hpu", "mlu", "musa", "neuron"}


class DeviceFlow:
    def __init__(self, analysis) -> None:
        self.a = analysis
        self._assigns: dict[tuple, list] = {}  # (id(function) or 0, name) -> assigned values
        self._moved: set = set()  # (id(function) or 0, name) of names whose value goes to the device (`x.to(device)`)
        self._moved_inplace: set = set()  # ... and that hold the device value afterwards (`model.to(device)`, `x = x.to(device)`)
        self._backends: dict[int, set] = {}  # id(function) or 0 -> backends it tests
        self._file_backends: Optional[set] = None
        self.touches_device = False
        self._resolving: set = set()  # names being resolved now (cycle guard for is_device_value)
        self._build()

    # -- public ----------------------------------------------------------------------------------------
    def function_of(self, node) -> Optional[ast.AST]:
        """The innermost function holding `node` (None: module level)."""
        # (program.ProgramNodes' rule, read off the parent map: a def's statements are its body; its decorators,
        # defaults and annotations belong to the function around it)
        parent_of = self.a.parent_of
        child, up = node, parent_of.get(node)
        while up is not None:
            t = type(up)
            if (t is ast.FunctionDef or t is ast.AsyncFunctionDef) and isinstance(child, ast.stmt):
                return up
            child, up = up, parent_of.get(up)
        return None

    def dispatch_backends(self, node) -> set:
        """Backends (accelerators) tested by the function that holds `node`; in a file that tests three or more
        accelerators anywhere (a multi-backend library such as accelerate's), every backend the file tests."""
        if self._file_backends is None:
            self._add_value_set_backends()
            every: set = set()
            for kinds in self._backends.values():
                every |= kinds
            norm = {"cuda" if k == "gpu" else k for k in every} & _values.ACCELERATORS
            self._file_backends = every if len(norm) >= 3 else set()
        fn = self.function_of(node)
        return self._backends.get(id(fn) if fn is not None else 0, set()) | self._file_backends

    def dispatchers(self) -> list:
        """The functions (None: module level) that test two or more accelerator backends, in source order."""
        self.dispatch_backends(self.a.tree)  # the value sets' backends are counted too
        found = []
        for node, _fn in program_nodes(self.a).flow:
            if type(node) in (ast.FunctionDef, ast.AsyncFunctionDef):
                kinds = {"cuda" if k == "gpu" else k for k in self._backends.get(id(node), ())}
                if len(kinds & _values.ACCELERATORS) >= 2:
                    found.append(node)
        return found

    def is_dispatch(self, node) -> bool:
        """`node` is in code that dispatches over more than one accelerator backend."""
        kinds = {"cuda" if k == "gpu" else k for k in self.dispatch_backends(node)}
        return len(kinds & _values.ACCELERATORS) >= 2

    def is_device_value(self, expr, fn=None) -> Optional[bool]:
        """True: an accelerator device; False: the CPU; None: cannot tell."""
        if expr is None:
            return None
        if isinstance(expr, ast.Constant):
            if isinstance(expr.value, str):
                if _ACCEL_STRINGS.match(expr.value):
                    return True
                if expr.value.split(":")[0] == "cpu":
                    return False
            return None if expr.value is not None else False
        if isinstance(expr, ast.JoinedStr) and expr.values and isinstance(expr.values[0], ast.Constant):
            head = str(expr.values[0].value)
            return True if re.match(r"^(neuron|cuda|xla):", head) else None
        if isinstance(expr, ast.IfExp):
            a, b = self.is_device_value(expr.body, fn), self.is_device_value(expr.orelse, fn)
            return True if (a or b) else None
        if isinstance(expr, ast.BoolOp):
            return True if any(self.is_device_value(v, fn) for v in expr.values) else None
        if isinstance(expr, ast.Call):
            q = self._q(expr.func)
            if q == "torch.device" and expr.args:
                return self.is_device_value(expr.args[0], fn)
            if q in _DEVICE_CALLS or (isinstance(expr.func, ast.Attribute) and expr.func.attr == "current_accelerator"):
                return True
            return None
        if isinstance(expr, ast.Name):
            key = (self._fid(fn), expr.id)
            if key in self._resolving:  # `device = torch.device(device)`: a name defined through itself
                return None
            vals = self._assigns.get(key) or self._assigns.get((0, expr.id)) or []
            self._resolving.add(key)
            try:
                seen = [self.is_device_value(v, fn) for v in vals]
            finally:
                self._resolving.discard(key)
            if any(s is False for s in seen) and not any(seen):
                return False
            if any(seen):
                return True
            return True if _DEVICE_NAME.match(expr.id) else None
        if isinstance(expr, ast.Attribute):
            return True if _DEVICE_NAME.match(expr.attr) else None
        return None

    def device_name_at(self, node, objects_only: bool = False) -> Optional[str]:
        """A name that holds the program's chosen device at `node`: assigned once, at the top level of the same
        function before `node` (or once at module level, not shadowed), from a device value
        (`device = torch.device("cuda" if ... else "cpu")`). A fix can then write `x.to(device)`, as a hand
        migration would."""
        fn = self.function_of(node)
        scopes = [fn, None] if fn is not None else [None]
        for scope in scopes:
            body = scope.body if scope is not None else self.a.tree.body
            for stmt in body:
                if scope is fn and stmt.lineno >= node.lineno:
                    break
                if isinstance(stmt, ast.If):
                    # `if args.device: device = torch.device(args.device) else: device = torch.device(...)`
                    for name in _assigned_on_every_path(stmt):
                        vals = self._assigns.get((self._fid(scope), name), ())
                        if (_DEVICE_NAME.match(name) and vals and all(self.is_device_value(v, scope) is not False for v in vals)
                                and any(self.is_device_value(v, scope) for v in vals)
                                and all(v.lineno < node.lineno for v in vals) and scope is fn
                                and (not objects_only or all(_is_device_object(v) for v in vals))):
                            return name
                    continue
                if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
                    continue
                name = stmt.targets[0].id
                if not _DEVICE_NAME.match(name) or len(self._assigns.get((self._fid(scope), name), ())) != 1:
                    continue
                if scope is None and fn is not None and (id(fn), name) in self._assigns:
                    continue
                if scope is None and fn is not None and name in {a.arg for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]}:
                    continue
                if self.is_device_value(stmt.value, scope) and not isinstance(stmt.value, ast.Name) and (
                        not objects_only or _is_device_object(stmt.value)):
                    return name
        return None

    def placement(self, expr, fn=None, depth: int = 0) -> str:
        """Where the value of a tensor/module expression lives: DEVICE, CPU or UNKNOWN."""
        if depth > 6 or expr is None:
            return UNKNOWN
        if fn is None:
            fn = self.function_of(expr)
        if isinstance(expr, ast.Call):
            func = expr.func
            q = self._q(func)
            if q in _CPU_SOURCES:
                return CPU
            dev = _kw(expr, "device")
            if q is not None and q.startswith("torch.") and dev is not None:
                v = self.is_device_value(dev, fn)
                return DEVICE if v else CPU if v is False else UNKNOWN
            if isinstance(func, ast.Attribute):
                m = func.attr
                if m in _TO_CPU_METHODS:
                    return CPU
                if m in _TO_DEVICE_METHODS:
                    return DEVICE
                if m == "to":
                    target = _kw(expr, "device") or (expr.args[0] if expr.args else None)
                    v = self.is_device_value(target, fn) if target is not None and not self._is_dtype(target) else None
                    if v:
                        return DEVICE
                    if v is False:
                        return CPU
                return self.placement(func.value, fn, depth + 1)
            return UNKNOWN
        if isinstance(expr, ast.Attribute):
            return UNKNOWN
        if isinstance(expr, ast.Name):
            key = (self._fid(fn), expr.id)
            if key in self._moved_inplace or (0, expr.id) in self._moved_inplace:
                return DEVICE
            vals = self._assigns.get(key) or []
            places = {self.placement(v, fn, depth + 1) for v in vals if not (isinstance(v, ast.Name) and v.id == expr.id)}
            if DEVICE in places:
                return DEVICE
            if places == {CPU}:
                return CPU
            return UNKNOWN
        if isinstance(expr, ast.BinOp):
            a, b = self.placement(expr.left, fn, depth + 1), self.placement(expr.right, fn, depth + 1)
            return DEVICE if DEVICE in (a, b) else CPU if a == b == CPU else UNKNOWN
        return UNKNOWN

    def fate(self, expr, fallback: bool = True) -> str:
        """Where the value of `expr` ends up: follows method chains and the name it is assigned to; when nothing
        outside decides, its own placement (`fallback=False`: UNKNOWN)."""
        fn = self.function_of(expr)
        node = expr
        parent = self.a.parent_of.get(node)
        while isinstance(parent, ast.Attribute) and isinstance(self.a.parent_of.get(parent), ast.Call) \
                and self.a.parent_of.get(parent).func is parent:
            call = self.a.parent_of.get(parent)
            m = parent.attr
            if m in _TO_CPU_METHODS:
                return CPU
            if m in _TO_DEVICE_METHODS:
                return DEVICE
            if m == "to":
                target = _kw(call, "device") or (call.args[0] if call.args else None)
                v = self.is_device_value(target, fn) if target is not None and not self._is_dtype(target) else None
                if v:
                    return DEVICE
                if v is False:
                    return CPU
            node = call
            parent = self.a.parent_of.get(node)
        if isinstance(parent, ast.Assign) and len(parent.targets) == 1 and isinstance(parent.targets[0], ast.Name):
            key = (self._fid(fn), parent.targets[0].id)
            if key in self._moved:
                return DEVICE
        return self.placement(node, fn) if fallback else UNKNOWN

    # -- building --------------------------------------------------------------------------------------
    def _fid(self, fn) -> int:
        return id(fn) if fn is not None else 0

    def _q(self, func) -> Optional[str]:
        if not isinstance(func, (ast.Name, ast.Attribute)):
            return None
        return self.a.resolve(func, self.a.module_scope, count_use=False)

    def _is_dtype(self, node) -> bool:
        q = self._q(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
        return bool(q) and q.startswith("torch.") and (q.split(".")[-1].startswith(("float", "int", "bfloat", "complex", "uint"))
                                                       or q.split(".")[-1] in ("double", "half", "long", "bool", "short", "cdouble"))

    def _build(self) -> None:
        for node, fn in program_nodes(self.a).flow:
            t = type(node)
            if t is ast.FunctionDef or t is ast.AsyncFunctionDef:
                self._params(node)
            elif t is ast.Assign or t is ast.AnnAssign or t is ast.Call or t is ast.Dict:  # what _visit looks at
                self._visit(node, fn)

    def _add_value_set_backends(self) -> None:
        """Value sets whose strings name several accelerators: the functions holding them dispatch. Done when
        dispatch is first asked about, not in _build: placement and fate (NM304's question) do not need the
        value sets, which cost more than the rest of the flow."""
        for vs in _values.facts(self.a).sets:
            if vs.multi_backend:
                for m in vs.members:
                    fn = self.function_of(m.node)
                    self._backends.setdefault(self._fid(fn), set()).update(vs.kinds)

    def _params(self, fdef) -> None:
        args = fdef.args
        positional = [*args.posonlyargs, *args.args]
        for arg, default in zip(positional[len(positional) - len(args.defaults):], args.defaults):
            self._assigns.setdefault((id(fdef), arg.arg), []).append(default)
        for arg, default in zip(args.kwonlyargs, args.kw_defaults):
            if default is not None:
                self._assigns.setdefault((id(fdef), arg.arg), []).append(default)

    def _visit(self, node, fn) -> None:
        fid = self._fid(fn)
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    self._assigns.setdefault((fid, t.id), []).append(node.value)
                    if isinstance(node.value, ast.Call) and self._moves_self(node.value, t.id):
                        self._moved.add((fid, t.id))
                        self._moved_inplace.add((fid, t.id))  # `x = x.to(device)`: the name now holds the device copy
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            self._assigns.setdefault((fid, node.target.id), []).append(node.value)
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute):
                moved = False
                if func.attr in _TO_DEVICE_METHODS:
                    moved = True
                elif func.attr == "to":
                    target = _kw(node, "device") or (node.args[0] if node.args else None)
                    moved = target is not None and not self._is_dtype(target) and bool(self.is_device_value(target, fn))
                if moved:
                    self.touches_device = True
                    if isinstance(func.value, ast.Name):
                        self._moved.add((fid, func.value.id))  # its value goes to the device (a copy, or itself)
                        if isinstance(self.a.parent_of.get(node), ast.Expr):
                            self._moved_inplace.add((fid, func.value.id))  # `model.to(device)`: modules move in place
            dev = _kw(node, "device")
            if dev is not None and self.is_device_value(dev, fn):
                self.touches_device = True
            q = self._q(func)
            backend = _AVAILABILITY.get(q or "")
            if backend is None and isinstance(func, (ast.Name, ast.Attribute)):
                name = func.id if isinstance(func, ast.Name) else func.attr
                m = _HELPER_AVAILABLE.match(name)
                if m:
                    backend = {"neuronx": "neuron", "habana": "hpu", "gaudi": "hpu", "ipex": "xpu", "tpu": "xla"}.get(m.group(1), m.group(1))
                elif name == "hasattr" and len(node.args) == 2 and isinstance(node.args[1], ast.Constant) \
                        and node.args[1].value in _HASATTR_BACKENDS:
                    backend = node.args[1].value
            if backend is not None:
                self._backends.setdefault(fid, set()).add(backend)
        elif isinstance(node, ast.Dict):
            kinds = {_values.device_kind(k.value) for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
            kinds.discard(None)
            if len(kinds & _values.ACCELERATORS) >= 2:
                self._backends.setdefault(fid, set()).update(kinds)

    def _moves_self(self, call, name) -> bool:
        """`x = x.to(device)` / `x = x.cuda()`."""
        func = call.func
        while isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call):
            func = func.value.func
        if not (isinstance(call.func, ast.Attribute) and isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
                and func.value.id == name):
            return False
        return self.placement(call) == DEVICE


def _is_device_object(expr) -> bool:
    """The expression makes a `torch.device` (not a device string): `torch.device(...)`, `xm.xla_device()`, ..."""
    if isinstance(expr, ast.IfExp):
        return _is_device_object(expr.body) and _is_device_object(expr.orelse)
    if isinstance(expr, ast.Call):
        f = expr.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        return name in ("device", "xla_device", "current_accelerator")
    return False


def _assigned_on_every_path(stmt: ast.If) -> set:
    """Names that an if/else assigns (plain `name = ...`) in every branch."""

    def block(stmts) -> set:
        out: set = set()
        for st in stmts:
            if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name):
                out.add(st.targets[0].id)
            elif isinstance(st, ast.If):
                out |= _assigned_on_every_path(st)
        return out

    if not stmt.orelse:
        return set()
    return block(stmt.body) & block(stmt.orelse)


def _kw(call, name):
    for k in call.keywords:
        if k.arg == name:
            return k.value
    return None


# every spelling through which a backend enters `_backends` or a value set's kinds, as a lower-case word
_BACKEND_WORDS = {**{w: w for w in _values.ACCELERATORS}, "gpu": "cuda", "neuronx": "neuron", "habana": "hpu",
                  "gaudi": "hpu", "ipex": "xpu"}
# a backend word as a whole run of letters (`torch_cuda` holds `cuda`, `cudagraph` does not), longest spelling first
_BACKEND_RUN = re.compile(r"(?<![a-z])(?:%s)(?![a-z])" % "|".join(sorted(map(re.escape, _BACKEND_WORDS), key=len, reverse=True)))


def _names_two_backends(low: str) -> bool:
    """Two backends are spelled in `low` (lower-case text), each as a whole run of letters (what `_BACKEND_RUN`
    matches): one search per spelling, in C, instead of the pattern run over every character."""
    found = set()
    n = len(low)
    for word, kind in _BACKEND_WORDS.items():
        if kind in found:
            continue
        size = len(word)
        i = low.find(word)
        while i >= 0:
            j = i + size
            if (i == 0 or not "a" <= low[i - 1] <= "z") and (j == n or not "a" <= low[j] <= "z"):
                found.add(kind)
                if len(found) >= 2:
                    return True
                break
            i = low.find(word, i + 1)
    return False


def may_dispatch(analysis) -> bool:
    """False when no code in the file can dispatch over backends, decided from the text alone: every backend a
    function can be found to test (availability calls and helpers, `hasattr(torch, "xpu")`, device strings,
    `{"cuda": ..., "mps": ...}` tables) is spelled as a word of the source, and dispatch needs two. Lets the CUDA
    rules skip building the device flow and the value sets in the many files that name one backend."""
    def build(a) -> bool:
        return _names_two_backends(a.text.lower())

    return cached(analysis, "may_dispatch", build)


def facts(analysis) -> DeviceFlow:
    return cached(analysis, "device_flow", DeviceFlow)
