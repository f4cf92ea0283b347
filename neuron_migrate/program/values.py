"""String value sets: which device-name strings of a file flow into the same comparison.

A configuration value and the code that reads it must migrate together. `device: str = "xla"` (a dataclass
field), `parser.add_argument("--device", default="xla", choices=["cpu", "xla"])`, `def f(device="xla")` and
`if requested == "xla":` are one value set when the value can travel from one to the other; rewriting one of
them alone changes which branch the program takes. This module groups every device-name string literal
(`xla`, `cuda`, `cpu`, `mps`, `xpu`, ...; `'xla:1'` and `f"cuda:{i}"` too) into sets, following values through
the file:

- slots: a local or module name, a parameter of a function defined in the file, an attribute name
  (`args.device`, `self.device`, `cfg.device` and a class field `device: str = ...` share the slot `attr:device`),
  a string dict key (`cfg["device"]`), an environment variable (`os.environ.get("DEV", "xla")`), the return
  value of a function of the file, the keys or elements of a named dict/tuple table;
- links: assignments (`x = y`, `x = a if c else b`, `x = y or "xla"`), calls of functions of the file (arguments
  to parameters, `return` to the call), comparisons (`==`, `!=`, `in (...)`, `.startswith()`), lookups in a named
  table (`TABLE[x]`, `TABLE.get(x)`, `x in TABLE`), argparse `default=`/`choices=` to `args.<dest>`,
  `set_defaults()`, keyword arguments to attributes of the same name (`Config(device="xla")`).

For each set it records whether the value reaches a torch device position (`sink`: `torch.device(v)`,
`.to(v)`, `device=v`, `torch.autocast(v)`, a comparison with a real device's `.type`, a name that holds a
`torch.device`), where values may come from outside the file (`external`: command line, config attributes,
environment, callers of a public function), and which device kinds its strings name (`kinds`; two
accelerators in one set is device-dispatching code).

Entry point: `facts(analysis) -> ValueFacts`; `facts(a).set_of(node)` gives the `ValueSet` of a string literal.
"""
from __future__ import annotations

import ast
import re

from neuron_migrate.names.analysis import CUDA_FORMAT
from neuron_migrate.program import cached, program_nodes

TYPE_CHECKING = False  # typing is not imported at run time (start-up): it serves annotations only
if TYPE_CHECKING:
    from typing import Optional

DEVICE_WORDS = ("xla", "cuda", "neuron", "cpu", "mps", "xpu", "npu", "hpu", "mlu", "tpu", "gpu", "musa", "meta")
ACCELERATORS = frozenset(DEVICE_WORDS) - {"cpu", "meta"}
# torch.distributed backend names: a backend is a value too (`--dist-backend default="nccl"` -> `backend=args.dist_backend`,
# `args.dist_backend == "nccl"`); never an accelerator of its own
BACKEND_WORDS = ("nccl", "gloo", "mpi", "ucc")
_WORD = re.compile(r"^(%s)(:\d+)?$" % "|".join(DEVICE_WORDS + BACKEND_WORDS))
_FSTRING_HEAD = re.compile(r"^(%s):" % "|".join(DEVICE_WORDS))

# torch functions whose first positional argument (or `device`-like keyword) is a device
_DEVICE_FUNCS = {"torch.device", "torch.autocast", "torch.amp.autocast", "torch.Generator", "torch.get_autocast_dtype",
                 "torch.is_autocast_enabled", "torch.distributed.get_default_backend_for_device",
                 # a device mesh's first argument is its device type (pytorch/examples' fsdp_tp_example.py:
                 # `init_device_mesh("cuda", (dp, tp), mesh_dim_names=...)`)
                 "torch.distributed.device_mesh.init_device_mesh", "torch.distributed.init_device_mesh",
                 "torch.distributed.device_mesh.DeviceMesh", "torch.distributed.DeviceMesh",
                 "torch.distributed.tensor.DeviceMesh", "torch.distributed._tensor.DeviceMesh"}
_DEVICE_KWARGS = {"device", "device_type", "map_location"}
# torch.distributed calls taking a backend name: qualified name -> its positional index
_BACKEND_FUNCS = {"torch.distributed.init_process_group": 0, "torch.distributed.distributed_c10d.init_process_group": 0,
                  "torch.distributed.new_group": 1, "torch.distributed.is_backend_available": 0,
                  "torch.distributed.Backend": 0}
# calls whose result is a real torch.device
_DEVICE_VALUES = {"torch.device", "torch_xla.core.xla_model.xla_device", "torch_xla.device", "torch_xla.runtime.xla_device",
                  "torch.accelerator.current_accelerator"}


def device_kind(value: str) -> Optional[str]:
    """'xla:1' -> 'xla'; None for a string that is not a device name."""
    m = _WORD.match(value)
    return m.group(1) if m else "cuda" if CUDA_FORMAT.match(value) else None


# Plain classes, not dataclasses: importing dataclasses costs every start-up about 20 ms (files/records.py).
class Member:
    """One device-name string literal (an `ast.Constant`, or an f-string `f"cuda:{i}"`)."""

    def __init__(self, node: ast.expr, kind: str, role: str, devicey: bool = False, slot: Optional[str] = None):
        self.node = node
        self.kind = kind  # 'xla', 'cuda', ...
        # device | compare | choice | cli-default | field | default | assign | dict-key | dict-value | element |
        # env-default | return | argument | other
        self.role = role
        self.devicey = devicey  # the first build would have called it a device (device-named target or operand)
        self.slot = slot  # the slot it was first joined to ('type:...': compared with a real device's type)

    @property
    def real_device_compare(self) -> bool:
        return self.role == "compare" and bool(self.slot) and self.slot.startswith("type:")

    @property
    def direct_sink(self) -> bool:
        return self.role in ("device", "backend")


class ValueSet:
    """The values one variable may hold, in source order, and whether any reaches a device position."""

    def __init__(self, members: Optional[list[Member]] = None, slots: Optional[set] = None, sink: bool = False,
                 external: Optional[list] = None):
        self.members = [] if members is None else members  # in source order
        self.slots = set() if slots is None else slots
        self.sink = sink  # some value of the set reaches a torch device position
        self.external = [] if external is None else external  # why values may come from outside the file
        self.elsewhere: list = []  # "file:line" where another file of the program passes the value to torch
        self.split: list = []  # "file:line" of defaults in other files that keep their strings (see finish)

    @property
    def kinds(self) -> set:
        return {m.kind for m in self.members}

    @property
    def multi_backend(self) -> bool:
        """More than one accelerator among the strings: code that dispatches over backends."""
        kinds = {"cuda" if k == "gpu" else k for k in self.kinds}  # 'gpu' is the CUDA backend's other name
        return len(kinds & ACCELERATORS) >= 2

    def of_kind(self, kind: str) -> list[Member]:
        return [m for m in self.members if m.kind == kind]

    def lines(self, kind: Optional[str] = None) -> list[int]:
        return sorted({m.node.lineno for m in self.members if kind is None or m.kind == kind})

    def plan(self) -> str:
        """How the set may migrate: 'all' (its values reach a device: every string must change together),
        'keep' (labels that configuration or callers may pass in: change none), 'free' (labels only this file
        uses: changing all of them together keeps meaning, as does changing none)."""
        if self.split:
            return "keep"  # another file holds strings of this value that it does not rewrite
        if self.sink:
            return "all"
        return "keep" if self.external else "free"


class ValueFacts:
    def __init__(self) -> None:
        self._set_of: dict[int, ValueSet] = {}
        self.sets: list[ValueSet] = []

    def set_of(self, node: ast.AST) -> Optional[ValueSet]:
        return self._set_of.get(id(node))


def facts(analysis) -> ValueFacts:
    return cached(analysis, "values", _build)


# -- building ------------------------------------------------------------------------------------
class _Union:
    def __init__(self) -> None:
        self.parent: dict = {}

    def find(self, x):
        self.parent.setdefault(x, x)
        root = x
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[x] != root:
            self.parent[x], x = root, self.parent[x]
        return root

    def join(self, a, b) -> None:
        if a is None or b is None:
            return
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[ra] = rb


def _string_member(node: ast.AST) -> Optional[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return device_kind(node.value)
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
        head = node.values[0].value
        m = _FSTRING_HEAD.match(head) if isinstance(head, str) else None
        return m.group(1) if m else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and isinstance(node.left, ast.Constant):
        # `"cuda:" + str(rank % n)` (SwAV's map_location): the sum names the device as an f-string would
        head = node.left.value
        m = _FSTRING_HEAD.match(head) if isinstance(head, str) and head.endswith(":") else None
        return m.group(1) if m else None
    return None


class _Builder:
    def __init__(self, analysis) -> None:
        self.a = analysis
        self.u = _Union()
        self.members: dict[int, Member] = {}
        self.sink_slots: set = set()
        self.external: dict = {}  # slot -> reason
        self.functions: dict[str, ast.AST] = {}  # module-level and nested function names -> def
        self.locals: dict[int, set] = {}  # id(function) -> names bound in it
        self.is_script = False
        self.argparse_dests: set = set()
        self.outer: dict = {}  # id(function) -> enclosing function (None: module)
        self._dicts: set = set()
        self._tables: set = set()  # slots assigned a dict, list, tuple or set literal
        self._contains: list = []  # (string, slot, devicey) of `"cuda" in x` tests, joined in finish

    # -- scopes -----------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Function names (the first def of each name, breadth-first), each function's local names, and whether
        the file is a script. A name's `owner` is the function whose body scan reaches it: a def's body belongs to
        the def; its other parts, and anything under a class, to no function (a function's locals are its
        parameters and the names its own body stores, nested defs and classes left out). Read off the node list
        the value walk uses and the parent map of the name analysis, instead of a walk of its own."""
        parent_of = self.a.parent_of
        defs: list = []
        stored: list = []  # Store names, `global` and `nonlocal` statements: what a function's locals depend on
        for node, _fn in program_nodes(self.a).binding:
            t = type(node)
            if t is ast.Name:
                if type(node.ctx) is ast.Store:
                    stored.append(node)
            elif t is ast.FunctionDef or t is ast.AsyncFunctionDef:
                defs.append(node)
            elif t is ast.Global or t is ast.Nonlocal:
                stored.append(node)
            elif t is ast.If and not self.is_script and _is_main_guard(node.test):
                self.is_script = True
        stores: dict = {id(d): set() for d in defs}  # id(def) -> names stored in its body scan
        glob: dict = {id(d): set() for d in defs}  # id(def) -> names declared global or nonlocal there
        for node in stored:
            owner = _owner(node, parent_of)
            if owner is None:
                continue
            if type(node) is ast.Name:
                stores[id(owner)].add(node.id)
            else:
                glob[id(owner)].update(node.names)
        # breadth-first order is depth first, then source order: defs sit in statement lists, whose order is the
        # source's at every level
        defs.sort(key=lambda d: (_depth(d, parent_of), d.lineno, d.col_offset))
        for node in defs:
            self.functions.setdefault(node.name, node)
            args = node.args
            names = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
                     if a is not None}
            self.locals[id(node)] = (names | stores[id(node)]) - glob[id(node)]

    def name_slot(self, name: str, fn) -> str:
        while fn is not None:
            if name in self.locals.get(id(fn), ()):
                return f"name:{id(fn)}:{name}"
            fn = self.outer.get(id(fn))
        return f"name:mod:{name}"

    def param_slot(self, fdef, name: str) -> str:
        slot = f"name:{id(fdef)}:{name}"
        if not self.is_script and not fdef.name.startswith("_"):
            self.external.setdefault(slot, f"callers of `{fdef.name}()`")
        return slot

    # -- slots of expressions ---------------------------------------------------------------------------
    def slot_of(self, node, fn) -> Optional[str]:
        a = self.a
        if isinstance(node, ast.Name):
            return self.name_slot(node.id, fn)
        if isinstance(node, ast.Attribute):
            if node.attr == "type":
                slot = f"type:{id(fn)}:{a.source(node.value)}"
                self.sink_slots.add(slot)
                return slot
            slot = f"attr:{node.attr}"
            self.external.setdefault(slot, f"the `{node.attr}` attribute (configuration may set it)")
            return slot
        if isinstance(node, ast.Subscript):
            key = node.slice
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                slot = f"key:{key.value}"
                self.external.setdefault(slot, f"the `{key.value!r}` key (configuration may set it)")
                return slot
            if isinstance(key, ast.Constant) and isinstance(key.value, int) and isinstance(node.value, ast.Call):
                return self.slot_of(node.value, fn)  # x.split(":")[0]
            return None
        if isinstance(node, ast.Call):
            func = node.func
            q = a.resolve(func, _scope_stub(a), count_use=False) if isinstance(func, (ast.Name, ast.Attribute)) else None
            if q in ("os.environ.get", "os.getenv") and node.args and isinstance(node.args[0], ast.Constant):
                slot = f"env:{node.args[0].value}"
                self.external.setdefault(slot, f"the {node.args[0].value} environment variable")
                if len(node.args) > 1:
                    self.flow(node.args[1], slot, fn, "env-default")
                return slot
            if q in _DEVICE_VALUES:
                slot = f"devvalue:{id(node)}"
                self.sink_slots.add(slot)
                return slot
            if isinstance(func, ast.Name) and func.id == "str" and len(node.args) == 1:
                arg = node.args[0]
                if isinstance(arg, ast.Attribute) and arg.attr == "device":  # str(x.device): a real device's name
                    slot = f"type:{id(fn)}:{a.source(arg)}"
                    self.sink_slots.add(slot)
                    return slot
                return self.slot_of(arg, fn)
            if isinstance(func, ast.Name) and func.id in self.functions:
                return f"ret:{func.id}"
            if isinstance(func, ast.Attribute) and func.attr in ("lower", "upper", "strip", "split", "casefold") :
                return self.slot_of(func.value, fn)
            if isinstance(func, ast.Attribute) and func.attr == "get" and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    slot = f"key:{first.value}"
                    self.external.setdefault(slot, f"the `{first.value!r}` key (configuration may set it)")
                    if len(node.args) > 1:
                        self.flow(node.args[1], slot, fn, "dict-value")
                    return slot
            return None
        return None

    def add_member(self, node, role: str, slot: Optional[str], devicey: bool = False, only=None) -> bool:
        kind = _string_member(node)
        if kind is None or (only is not None and kind not in only):
            return False
        if type(node) is ast.JoinedStr and len(node.values) == 2 and type(node.values[1]) is ast.FormattedValue:
            devicey = True  # f'cuda:{gpu}' (all of it): a device with its index, not a backend label
        m = Member(node, kind, role, devicey, slot)
        self.members[id(node)] = m
        key = ("m", id(node))
        self.u.find(key)
        if slot is not None:
            self.u.join(key, slot)
        return True

    def flow(self, value, slot: Optional[str], fn, role: str, devicey: bool = False, only=None) -> None:
        """`value` flows into `slot`: string literals join it as members (`only`: of those kinds), other expressions
        join their slot."""
        if value is None:
            return
        if isinstance(value, ast.IfExp):
            self.flow(value.body, slot, fn, role, devicey, only)
            self.flow(value.orelse, slot, fn, role, devicey, only)
            return
        if isinstance(value, ast.BoolOp):
            for v in value.values:
                self.flow(v, slot, fn, role, devicey, only)
            return
        if self.add_member(value, role, slot, devicey, only) or (only is not None and _string_member(value) is not None):
            return
        if slot is not None:
            other = self.slot_of(value, fn)
            if other is not None:
                self.u.join(other, slot)

    # -- the walk ---------------------------------------------------------------------------------------
    def walk(self) -> None:
        for node, fn in program_nodes(self.a).flow:
            t = type(node)
            if t is ast.FunctionDef or t is ast.AsyncFunctionDef:
                self.outer[id(node)] = fn
                self.visit_def(node, fn)
            else:  # the other kinds ProgramNodes.flow lists (program/__init__.py)
                self.visit(node, fn)

    def visit_def(self, node, fn) -> None:
        args = node.args
        positional = [*args.posonlyargs, *args.args]
        for arg, default in zip(positional[len(positional) - len(args.defaults):], args.defaults):
            self.flow(default, self.param_slot(node, arg.arg), fn, "default", "device" in arg.arg.lower())
        for arg, default in zip(args.kwonlyargs, args.kw_defaults):
            if default is not None:
                self.flow(default, self.param_slot(node, arg.arg), fn, "default", "device" in arg.arg.lower())

    def visit(self, node, fn) -> None:
        """The node kinds of ProgramNodes.flow other than defs (the walk offers no others)."""
        if isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
                    slot = f"attr:{stmt.target.id}"
                    self.external.setdefault(slot, f"the `{stmt.target.id}` field (configuration may set it)")
                    self.flow(_field_default(stmt.value), slot, fn, "field", "device" in stmt.target.id.lower())
                elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                    slot = f"attr:{stmt.targets[0].id}"
                    self.flow(stmt.value, slot, fn, "field", "device" in stmt.targets[0].id.lower())
            return
        if isinstance(node, ast.Assign):
            for target in node.targets:
                self.assign(target, node.value, fn)
        elif isinstance(node, ast.AnnAssign) and node.value is not None and not isinstance(self.a.parent_of.get(node), ast.ClassDef):
            self.assign(node.target, node.value, fn)
        elif isinstance(node, ast.Return) and node.value is not None and fn is not None:
            self.flow(node.value, f"ret:{fn.name}", fn, "return")
        elif isinstance(node, ast.Compare):
            self.compare(node, fn)
        elif isinstance(node, ast.Call):
            self.call(node, fn)
        elif isinstance(node, ast.Dict):
            self.dict_literal(node, None, fn)
        elif isinstance(node, ast.Subscript):
            table = self.slot_of(node.value, fn) if isinstance(node.value, (ast.Name, ast.Attribute)) else None
            if table is not None and not (isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str)):
                self.flow(node.slice, table + "#keys", fn, "compare")

    def assign(self, target, value, fn) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts):
                for t, v in zip(target.elts, value.elts):
                    self.assign(t, v, fn)
            return
        slot = self.slot_of(target, fn) if isinstance(target, (ast.Name, ast.Attribute, ast.Subscript)) else None
        if slot is None:
            return
        name = target.id if isinstance(target, ast.Name) else target.attr if isinstance(target, ast.Attribute) else ""
        devicey = "device" in name.lower()
        if isinstance(value, ast.Dict):
            self._tables.add(slot)
            self.dict_literal(value, slot, fn)
            return
        if isinstance(value, (ast.Tuple, ast.List, ast.Set)):
            self._tables.add(slot)
            for e in value.elts:
                self.flow(e, slot + "#keys", fn, "element")
            return
        if isinstance(value, ast.Call):
            q = self.a.resolve(value.func, _scope_stub(self.a), count_use=False)
            if q in _DEVICE_VALUES or (isinstance(value.func, ast.Attribute) and value.func.attr == "current_accelerator"):
                self.sink_slots.add(slot)
        if isinstance(value, ast.Attribute) and value.attr == "device":
            self.sink_slots.add(slot)  # d = x.device: a real torch.device
        self.flow(value, slot, fn, "assign", devicey)

    def dict_literal(self, node: ast.Dict, slot: Optional[str], fn) -> None:
        if id(node) in self._dicts:
            return
        self._dicts.add(id(node))
        keys_slot = (slot + "#keys") if slot else f"dict:{id(node)}"
        for k, v in zip(node.keys, node.values):
            if k is None:
                continue
            self.add_member(k, "dict-key", keys_slot)
            if isinstance(k, ast.Constant) and isinstance(k.value, str) and not _string_member(k):
                vslot = f"key:{k.value}"
                self.flow(v, vslot, fn, "dict-value")

    def compare(self, node: ast.Compare, fn) -> None:
        operands = [node.left, *node.comparators]
        for i, op in enumerate(node.ops):
            left, right = operands[i], operands[i + 1]
            if isinstance(op, (ast.In, ast.NotIn)):
                slot = self.slot_of(left, fn)
                direct = slot is None and _real_device_expr(left)
                if isinstance(right, (ast.Tuple, ast.List, ast.Set)):
                    for e in right.elts:
                        if direct:
                            self.add_member(e, "device", None)
                        else:
                            self.flow(e, slot, fn, "compare", _devicey_operand(left))
                else:
                    table = self.slot_of(right, fn)
                    if table is not None:
                        other = slot
                        if other is None and _string_member(left) is not None and isinstance(right, (ast.Name, ast.Attribute, ast.Call)):
                            # `"cuda" in device`: a substring test of a string value, or a lookup in a table; which
                            # one is known once every assignment is seen (finish)
                            self._contains.append((left, table, _devicey_operand(right)))
                        elif other is None:
                            self.add_member(left, "compare", table + "#keys")
                        else:
                            self.u.join(other, table + "#keys")
                continue
            if not isinstance(op, (ast.Eq, ast.NotEq, ast.Is, ast.IsNot)):
                continue
            for this, other in ((left, right), (right, left)):
                if _string_member(this) is None:
                    continue
                slot = self.slot_of(other, fn)
                if slot is None and _real_device_expr(other):
                    self.add_member(this, "device", None)
                else:
                    self.add_member(this, "compare", slot, _devicey_operand(other))

    def call(self, node: ast.Call, fn) -> None:
        a = self.a
        func = node.func
        q = a.resolve(func, _scope_stub(a), count_use=False) if isinstance(func, (ast.Name, ast.Attribute)) else None
        attr = func.attr if isinstance(func, ast.Attribute) else None
        if attr in ("add_argument", "add_option"):
            dest = _argparse_dest(node)
            if dest is not None:
                slot = f"attr:{dest}"
                self.argparse_dests.add(dest)
                self.external[slot] = f"the command line (--{dest.replace('_', '-')})"
                for kw in node.keywords:
                    if kw.arg == "default":
                        self.flow(kw.value, slot, fn, "cli-default")
                    elif kw.arg == "choices" and isinstance(kw.value, (ast.List, ast.Tuple, ast.Set)):
                        for e in kw.value.elts:
                            self.flow(e, slot, fn, "choice")
            return
        if attr == "set_defaults":
            for kw in node.keywords:
                if kw.arg:
                    self.flow(kw.value, f"attr:{kw.arg}", fn, "cli-default")
            return
        if attr == "startswith" and node.args:
            slot = self.slot_of(func.value, fn)
            arg = node.args[0]
            targets = arg.elts if isinstance(arg, ast.Tuple) else [arg]
            for t in targets:
                if slot is None or slot.startswith("type:"):
                    if slot is not None:
                        self.sink_slots.add(slot)
                    self.add_member(t, "device" if slot is None else "compare", slot)
                else:
                    self.add_member(t, "compare", slot, True)
            return
        if attr == "get" and node.args and isinstance(func.value, (ast.Name, ast.Attribute)):
            table = self.slot_of(func.value, fn)
            first = node.args[0]
            if table is not None and not (isinstance(first, ast.Constant) and isinstance(first.value, str) and not _string_member(first)):
                self.flow(first, table + "#keys", fn, "compare")
            return
        if q in _BACKEND_FUNCS:
            pos = _BACKEND_FUNCS[q]
            value = next((k.value for k in node.keywords if k.arg in ("backend", "name")), None)
            if value is None and len(node.args) > pos and not isinstance(node.args[pos], ast.Starred):
                value = node.args[pos]
            if value is not None:
                slot = f"backendarg:{id(node)}"  # a process-group backend: whatever flows into it is one sink value
                self.sink_slots.add(slot)
                # backend names only: `init_process_group("xla")` is NM126's, not a device string
                self.flow(value, slot, fn, "backend", only=BACKEND_WORDS)
            return
        device_call = q in _DEVICE_FUNCS or attr == "to"
        if device_call and node.args:
            slot = f"devarg:{id(node)}"  # the argument is a device: whatever flows into it is one sink value
            self.sink_slots.add(slot)
            self.flow(node.args[0], slot, fn, "device")
        local = self.functions.get(func.id) if isinstance(func, ast.Name) else None
        if local is not None:
            params = [p.arg for p in [*local.args.posonlyargs, *local.args.args]]
            for p, arg in zip(params, node.args):
                if isinstance(arg, ast.Starred):
                    break
                self.flow(arg, self.param_slot(local, p), fn, "argument")
        for kw in node.keywords:
            if kw.arg is None:
                continue
            if local is not None:
                self.flow(kw.value, self.param_slot(local, kw.arg), fn, "argument")
            elif kw.arg in _DEVICE_KWARGS and q is not None and q.split(".")[0] in ("torch", "torch_xla") or (
                    kw.arg in _DEVICE_KWARGS and attr in ("to", "load", "zeros", "ones", "empty", "randn", "rand", "full", "arange", "tensor")):
                slot = f"devarg:{id(kw)}"
                self.sink_slots.add(slot)
                self.flow(kw.value, slot, fn, "device")
            else:
                self.flow(kw.value, f"attr:{kw.arg}", fn, "argument", "device" in kw.arg)

    def finish(self) -> ValueFacts:
        for node, slot, devicey in self._contains:
            # a name that holds a table: a key lookup; else a substring test of the value itself (`'cuda' in device`
            # is True for 'cuda:1' as well): the string belongs to the value's set and changes with it
            if slot in self._tables:
                self.add_member(node, "compare", slot + "#keys")
            else:
                self.add_member(node, "compare", slot, devicey)
        out = ValueFacts()
        groups: dict = {}
        for key in list(self.u.parent):
            root = self.u.find(key)
            vs = groups.get(root)
            if vs is None:
                vs = groups[root] = ValueSet()
            if isinstance(key, tuple):
                vs.members.append(self.members[key[1]])
            else:
                vs.slots.add(key)
        # attributes another file of the same programs reads where torch takes a backend or a device (the repository
        # model's "sinks": `init_process_group(backend=cfg.backend)` in train.py makes config.py's `backend: str = "nccl"`
        # a backend value); both files then see the same set reach torch, so its strings change together in both
        outside = getattr(self.a, "outside", None) or {}
        elsewhere = outside.get("sinks") or {}
        # config values of that name in another file that the repository model does not see reach torch (the scan missed
        # how this file passes it): that file keeps its strings, so this file's must stay too (`plan`: keep)
        unseen = outside.get("unseen") or {}
        # nanoGPT's configuration (repository model: `_exec_configs`): a config file's globals are the program's, so a
        # string it assigns to a name the program passes to torch is a backend or device value of the program; and the
        # program's globals take values from the command line and from those files
        config_of = outside.get("config_of") or {}
        exec_config = outside.get("exec_config")
        for key in list(self.u.parent):
            if isinstance(key, str):
                base = key[:-5] if key.endswith("#keys") else key
                vs = groups[self.u.find(key)]
                if key in self.sink_slots or base in self.sink_slots:
                    vs.sink = True
                if key.startswith("name:mod:"):
                    where = (config_of.get("sinks") or {}).get(key[9:])
                    if where:
                        vs.sink = True
                        if where not in vs.elsewhere:
                            vs.elsewhere.append(where)
                    files = (exec_config or {}).get("names", {}).get(key[9:])
                    if files is not None:
                        reason = f"the command line (`--{key[9:]}=...`, which {exec_config['via']} reads)"
                        if files:
                            reason += f" and the config files that set it ({', '.join(files)}: rewritten with it)"
                        if reason not in vs.external:
                            vs.external.append(reason)
                where = elsewhere.get(key[5:]) if key.startswith("attr:") else None
                if where:
                    vs.sink = True
                    if where not in vs.elsewhere:
                        vs.elsewhere.append(where)
                where = unseen.get(key[5:]) if key.startswith("attr:") else None
                if where and where not in vs.split:
                    vs.split.append(where)
                reason = self.external.get(key) or self.external.get(base)
                if reason and reason not in vs.external:
                    vs.external.append(reason)
        for m in self.members.values():
            if m.direct_sink:
                groups[self.u.find(("m", id(m.node)))].sink = True
        for vs in groups.values():
            if not vs.members:
                continue
            vs.members.sort(key=lambda m: (m.node.lineno, m.node.col_offset))
            out.sets.append(vs)
            for m in vs.members:
                out._set_of[id(m.node)] = vs
        return out


def _build(analysis) -> ValueFacts:
    b = _Builder(analysis)
    b.prepare()
    b.walk()
    return b.finish()


# -- small helpers -------------------------------------------------------------------------------------
def _owner(node, parent_of: dict):
    """The def whose body scan reaches `node` (see _Builder.prepare): its nearest def or class above it decides."""
    child, up = node, parent_of.get(node)
    while up is not None:
        t = type(up)
        if t is ast.ClassDef:
            return None
        if t is ast.FunctionDef or t is ast.AsyncFunctionDef:
            return up if isinstance(child, ast.stmt) else None  # a def's statements are its body (decorators are not)
        child, up = up, parent_of.get(up)
    return None


def _depth(node, parent_of: dict) -> int:
    n = 0
    up = parent_of.get(node)
    while up is not None:
        n += 1
        up = parent_of.get(up)
    return n


def _is_main_guard(test) -> bool:
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
            and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators))


def _scope_stub(analysis):
    return analysis.module_scope


def _field_default(value):
    """`field(default="xla")` -> the default; anything else as it is."""
    if isinstance(value, ast.Call) and isinstance(value.func, (ast.Name, ast.Attribute)):
        name = value.func.id if isinstance(value.func, ast.Name) else value.func.attr
        if name in ("field", "Field"):
            for kw in value.keywords:
                if kw.arg == "default":
                    return kw.value
            if value.args:
                return value.args[0]
    return value


def _argparse_dest(call: ast.Call) -> Optional[str]:
    for kw in call.keywords:
        if kw.arg == "dest" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
            return kw.value.value
    names = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    for n in names:
        if n.startswith("--"):
            return n[2:].replace("-", "_")
    for n in names:
        if not n.startswith("-"):
            return n
    return None


def _real_device_expr(node) -> bool:
    """An expression that is (the string of) a real torch.device: `x.device`, `str(d)`, `d.type`."""
    if isinstance(node, ast.Attribute) and node.attr in ("type", "device"):
        return True
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "str"


def _devicey_operand(node) -> bool:
    if isinstance(node, ast.Name):
        return "device" in node.id.lower()
    if isinstance(node, ast.Attribute):
        return node.attr in ("type", "device", "device_type") or "device" in node.attr.lower()
    return False
