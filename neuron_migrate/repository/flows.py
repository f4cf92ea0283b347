"""Where a device loader goes once it leaves the method that builds it, across the files of a repository (NM130).

`Trainer.make_loader` returns `pl.MpDeviceLoader(loader, self.device)` in trainer/base.py and train.py does
`loader = trainer.make_loader(ds)` then `trainer.train_epoch(loader, epoch)`: the loader only reaches a method of the
same object, whose loop can move the batch where it unpacks it, so the plain DataLoader can be returned. These
functions answer that from the files' trees; the model (model.py) asks them only for the few files that wrap a
device loader (scan record "ml") and for the files that import those, so the parse costs nothing elsewhere.

Every answer errs on the side of "cannot follow" (None): then NM130 keeps its `_DeviceLoader` object.
"""
from __future__ import annotations

import ast
import re

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def parse(data: bytes) -> Optional[ast.Module]:
    try:
        return ast.parse(data)
    except (SyntaxError, ValueError):
        return None


def _body_nodes(scope):
    """The nodes of one scope, nested functions, lambdas and classes yielded but not entered."""
    stack = list(scope.body) if isinstance(scope.body, list) else [scope.body]
    while stack:
        n = stack.pop()
        yield n
        if not isinstance(n, _SCOPES):
            stack.extend(ast.iter_child_nodes(n))


def _is_device_loader(node) -> bool:
    """`pl.MpDeviceLoader(...)`, `MpDeviceLoader(...)` or `<x>.per_device_loader(...)` (by name: the rule decides)."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    return name in ("MpDeviceLoader", "per_device_loader")


def loader_methods(tree: ast.Module) -> dict:
    """{"Class.method": (class, method)} for the methods of top-level classes that `return` a device loader call."""
    out: dict = {}
    for cls in tree.body:
        if not isinstance(cls, ast.ClassDef):
            continue
        for fn in cls.body:
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                    isinstance(n, ast.Return) and _is_device_loader(n.value) for n in _body_nodes(fn)):
                out[f"{cls.name}.{fn.name}"] = (cls.name, fn.name)
    return out


def class_methods(tree: ast.Module, names: set) -> set:
    """The names of the defs in the bodies of the classes named `names` (anywhere in the file)."""
    out: set = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.ClassDef) and n.name in names:
            out.update(d.name for d in n.body if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return out


_SELF = re.compile(rb"self\.([A-Za-z_]\w*)")
# after `.name`: `x.a = ...`, `x.a += ...`, `x.a[i] = ...`, and `x.a, y = ...` (a scan: a keyword argument after
# `x.a,` counts too, which only ever reports a store that is not one)
_STORE_AFTER = rb"[ \t]*(?:\[[^\]\n]*\][ \t]*)?(?:(?:[-+*/%@&|^]|//|\*\*|>>|<<)?=(?!=)|,[^\n=]*(?<![=!<>])=(?!=))"
_ANY = (b"setattr(", b"getattr(", b"__dict__", b"vars(")


_DEF_NAME = re.compile(rb"def[ \t]+([A-Za-z_]\w*)")


def own_attributes(data: bytes) -> set:
    """The attribute names of a file that NM130 and NM144 may ask other files about: those used on `self` on the
    lines that build a device loader (the attribute that holds it, the device; a call may run over 3 more lines),
    and, in a file that names RateTracker, the names of its defs (the methods a tracker may be handed to)."""
    out: set = set()
    for needle in (b"MpDeviceLoader", b"per_device_loader"):
        i = data.find(needle)
        while i >= 0:
            start = data.rfind(b"\n", 0, i) + 1
            end = i
            for _ in range(4):
                nxt = data.find(b"\n", end + 1)
                end = len(data) if nxt < 0 else nxt
            out.update(m.decode() for m in _SELF.findall(data, start, end))
            i = data.find(needle, i + 1)
    if b"RateTracker" in data:
        out.update(m.decode() for m in _DEF_NAME.findall(data))
    return out


_LOADER_VALUE = rb"[ \t]*=[ \t]*[\w.]*(?:MpDeviceLoader|\.per_device_loader)[ \t]*\("


def attribute_names(data: bytes, names: set) -> tuple:
    """({names of `names` a file reads after a dot}, {those it may store}, {those it only ever stores a device loader
    call in: `self.train_device_loader = pl.MpDeviceLoader(...)`}), from a scan that may over-report reads and stores
    (`.device` also matches `.device_count`); "*" in the first two when the file calls setattr/getattr or reads
    `__dict__`/`vars()` (any attribute may then be meant)."""
    read, stored, loaders = set(), set(), set()
    for name in names:
        needle = b"." + name.encode()
        mentions = data.count(needle)
        if not mentions:
            continue
        stores = len(re.findall(re.escape(needle) + _STORE_AFTER, data))
        if mentions > stores:
            read.add(name)
        if stores:
            if len(re.findall(re.escape(needle) + _LOADER_VALUE, data)) == stores:
                loaders.add(name)
            else:
                stored.add(name)
    if any(n in data for n in _ANY):
        read.add("*")
        stored.add("*")
    return read, stored, loaders


def returns_loader(data: bytes) -> bool:
    """Some line returns a device loader call (loader_methods then finds which method, from the tree)."""
    for needle in (b"MpDeviceLoader", b"per_device_loader"):
        i = data.find(needle)
        while i >= 0:
            start = data.rfind(b"\n", 0, i) + 1
            if data[start:i].lstrip().startswith(b"return"):
                return True
            i = data.find(needle, i + 1)
    return False


def _stores(scope, name: str) -> int:
    count = 0
    for n in _body_nodes(scope):
        if isinstance(n, (ast.Global, ast.Nonlocal)) and name in n.names:
            return 99
        if isinstance(n, ast.Name) and n.id == name and not isinstance(n.ctx, ast.Load):
            count += 1
        elif isinstance(n, _SCOPES) and any(isinstance(m, ast.Name) and m.id == name for m in ast.walk(n)):
            return 99  # a nested scope sees it too
    return count


def _params(fn) -> list:
    a = fn.args
    return [p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg] if p is not None]


def _len_of(call, node) -> bool:
    """`call` is `len(node)`."""
    return (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "len"
            and call.args == [node] and not call.keywords)


def _passed_to_method(node, parent, receiver: str) -> Optional[list]:
    """[method, index] when `node` is positional argument `index` of `receiver.method(...)` (no * or **)."""
    if not (isinstance(parent, ast.Call) and node in parent.args and isinstance(parent.func, ast.Attribute)
            and isinstance(parent.func.value, ast.Name) and parent.func.value.id == receiver):
        return None
    if any(isinstance(x, ast.Starred) for x in parent.args) or any(k.arg is None for k in parent.keywords):
        return None
    return [parent.func.attr, parent.args.index(node)]


def result_uses(tree: ast.Module, method: str) -> Optional[list]:
    """Where the results of the calls `<name>.method(...)` in a file go: [[other method, argument index]] of the
    calls `<same name>.other(result, ...)` they are handed to, in the function that makes them (bound to a local
    name that function only passes so or measures with len(), or passed directly). None when some result, or the
    method itself, goes anywhere else (iterated here, returned, stored, passed to anything else), or when the method
    is named other than as such a call."""
    parents: dict = {}
    for n in ast.walk(tree):
        for c in ast.iter_child_nodes(n):
            parents[c] = n
    scopes: dict = {}  # node -> the function (or module) whose body holds it

    def scope_of(node):
        up = parents.get(node)
        while up is not None and not isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.Module)):
            up = parents.get(up)
        return up

    out: list = []
    for n in ast.walk(tree):
        if isinstance(n, ast.FunctionDef) and n.name == method:
            continue  # its own def (or another class's method of that name, called so: its calls are looked at)
        if isinstance(n, ast.Name) and n.id == method:
            return None  # the bare name: imported, aliased, passed around
        if isinstance(n, ast.Constant) and n.value == method:
            return None  # getattr(obj, "method")
        if not (isinstance(n, ast.Attribute) and n.attr == method):
            continue
        call = parents.get(n)
        if not (isinstance(call, ast.Call) and call.func is n and isinstance(n.value, ast.Name)):
            return None  # `f = obj.method`, `super().method(...)`: not followed
        receiver = n.value.id
        scope = scopes.get(call)
        if scope is None:
            scope = scopes[call] = scope_of(call)
        if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return None
        if _stores(scope, receiver) != (0 if receiver in _params(scope) else 1):
            return None  # the object the result is handed back to must be the one that made it
        parent = parents.get(call)
        if isinstance(parent, ast.Expr):
            continue  # the result is dropped
        direct = _passed_to_method(call, parent, receiver)
        if direct is not None:
            out.append(direct)
            continue
        if not (isinstance(parent, ast.Assign) and parent.value is call and len(parent.targets) == 1
                and isinstance(parent.targets[0], ast.Name)):
            return None
        name = parent.targets[0].id
        if name in _params(scope) or _stores(scope, name) != 1:
            return None
        for m in _body_nodes(scope):
            if not (isinstance(m, ast.Name) and m.id == name and isinstance(m.ctx, ast.Load)):
                continue
            user = parents.get(m)
            if _len_of(user, m):
                continue
            passed = _passed_to_method(m, user, receiver)
            if passed is None:
                return None
            out.append(passed)
    return [list(x) for x in dict.fromkeys(tuple(x) for x in out)]


# -- a device loader handed to a function of another file ------------------------------------------------------------
def _current_device(expr, fn) -> bool:
    """`xm.xla_device()` / `torch_xla.device()` with no argument (the process's own device, which `"neuron"` names
    once a process group or the runtime picked it), or a name `fn` binds once, to such a call."""
    if isinstance(expr, ast.Name) and fn is not None and expr.id not in _params(fn) and _stores(fn, expr.id) == 1:
        for n in _body_nodes(fn):
            if (isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)
                    and n.targets[0].id == expr.id):
                expr = n.value
                break
    if not (isinstance(expr, ast.Call) and not expr.args and not expr.keywords):
        return False
    f = expr.func
    return (isinstance(f, ast.Attribute) and (f.attr == "xla_device" or (f.attr == "device" and isinstance(f.value, ast.Name)
                                                                          and f.value.id == "torch_xla"))) \
        or (isinstance(f, ast.Name) and f.id == "xla_device")


def _handed_call(node, parent) -> "Optional[tuple]":
    """(function name, argument index, call) when `node` is positional argument `index` of a call of a plain name
    (no * or ** arguments)."""
    if not (isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and node in parent.args):
        return None
    if any(isinstance(x, ast.Starred) for x in parent.args) or any(k.arg is None for k in parent.keywords):
        return None
    return parent.func.id, parent.args.index(node), parent


_LOADER_NAME = re.compile(rb"^[ \t]*([A-Za-z_]\w*)[ \t]*=[ \t]*[\w.]*MpDeviceLoader\(", re.M)


def may_hand_loader(data: bytes, names: set) -> bool:
    """Some call of one of `names` has `MpDeviceLoader(` or a name bound to one among its next lines: the text test
    before `handed_loaders` parses the file (it may say yes where the parse then finds nothing)."""
    if not names:
        return False
    loaders = [b"MpDeviceLoader("] + [m.group(1) for m in _LOADER_NAME.finditer(data)]
    for name in names:
        needle = name.encode() + b"("
        i = data.find(needle)
        while i >= 0:
            if i == 0 or not (data[i - 1:i].isalnum() or data[i - 1:i] in (b"_", b".")):
                end = i
                for _ in range(4):  # the call's line and three more (its arguments may be on their own lines)
                    nxt = data.find(b"\n", end + 1)
                    end = len(data) if nxt < 0 else nxt
                if any(x in data[i:end] for x in loaders):
                    return True
            i = data.find(needle, i + 1)
    return False


def handed_loaders(tree: ast.Module) -> list:
    """One list per device loader on its function's own device that is only handed to calls of plain names: [(function
    name, argument index, call)] for `train_one_epoch(model, pl.MpDeviceLoader(loader, device), ...)`, or for each call
    `dl = pl.MpDeviceLoader(loader, device)`, bound once, is passed to (it may be measured with len() too). A loader
    that goes anywhere else too is left out (NM130 keeps its wrapper)."""
    parents: dict = {}
    for n in ast.walk(tree):
        for c in ast.iter_child_nodes(n):
            parents[c] = n
    out: list = []
    for call in ast.walk(tree):
        if not (isinstance(call, ast.Call) and _is_device_loader(call)):
            continue
        f = call.func
        if (f.attr if isinstance(f, ast.Attribute) else f.id) != "MpDeviceLoader":
            continue
        device = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "device"), None)
        fn = parents.get(call)
        while fn is not None and not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.Module)):
            fn = parents.get(fn)
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or device is None or not _current_device(device, fn):
            continue
        parent = parents.get(call)
        direct = _handed_call(call, parent)
        if direct is not None:
            out.append([direct])
            continue
        if not (isinstance(parent, ast.Assign) and parent.value is call and len(parent.targets) == 1
                and isinstance(parent.targets[0], ast.Name)):
            continue
        name = parent.targets[0].id
        if name in _params(fn) or _stores(fn, name) != 1:
            continue
        got: list = []
        for m in _body_nodes(fn):
            if not (isinstance(m, ast.Name) and m.id == name and isinstance(m.ctx, ast.Load)):
                continue
            user = parents.get(m)
            if _len_of(user, m):
                continue
            passed = _handed_call(m, user)
            if passed is None:
                got = []
                break
            got.append(passed)
        if got:
            out.append(got)
    return out


_GRAD_MODES = ("no_grad", "inference_mode", "enable_grad")


def _grad_mode(decorator) -> bool:
    """`@torch.no_grad()`, `@torch.inference_mode()` (`@torch.no_grad` too): the function is called as it is."""
    f = decorator.func if isinstance(decorator, ast.Call) and not decorator.args and not decorator.keywords else decorator
    return (f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else "") in _GRAD_MODES


def top_level_def(tree: ast.Module, name: str):
    """The module's one top-level def `name` (undecorated, or under a grad-mode decorator) when nothing else at module
    level binds that name."""
    found = None
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == name:
            if found is not None or not all(_grad_mode(d) for d in stmt.decorator_list):
                return None
            found = stmt
        elif isinstance(stmt, ast.ClassDef) and stmt.name == name:
            return None
        elif not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and any(
                isinstance(n, ast.Name) and n.id == name and not isinstance(n.ctx, ast.Load) for n in ast.walk(stmt)):
            return None
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name) == name for a in stmt.names):
            return None
    return found


def only_iterated(fn, index: int) -> bool:
    """Positional parameter `index` of `fn` is only a `for` loop's iterable (directly or through enumerate(), the
    batch bound to a name or a tuple of names) or measured with len(): the loops can move each batch themselves."""
    params = [*fn.args.posonlyargs, *fn.args.args]
    if index >= len(params):
        return False
    param = params[index].arg
    parents: dict = {}
    for n in ast.walk(fn):
        for c in ast.iter_child_nodes(n):
            parents[c] = n
    uses = 0
    for n in _body_nodes(fn):
        if isinstance(n, (ast.Global, ast.Nonlocal)) and param in n.names:
            return False
        if isinstance(n, _SCOPES) and any(isinstance(m, ast.Name) and m.id == param for m in ast.walk(n)):
            return False
        if not (isinstance(n, ast.Name) and n.id == param):
            continue
        if not isinstance(n.ctx, ast.Load):
            return False
        user = parents.get(n)
        if isinstance(user, ast.For) and user.iter is n:
            target = user.target
        elif (isinstance(user, ast.Call) and isinstance(user.func, ast.Name) and user.args == [n] and not user.keywords
              and user.func.id in ("len", "enumerate")):
            if user.func.id == "len":
                continue
            loop = parents.get(user)
            if not (isinstance(loop, ast.For) and loop.iter is user and isinstance(loop.target, ast.Tuple)
                    and len(loop.target.elts) == 2):
                return False
            target = loop.target.elts[1]
        else:
            return False
        if not (isinstance(target, ast.Name) or (isinstance(target, (ast.Tuple, ast.List)) and target.elts
                                                   and all(isinstance(e, ast.Name) for e in target.elts))):
            return False
        uses += 1
    return uses > 0
