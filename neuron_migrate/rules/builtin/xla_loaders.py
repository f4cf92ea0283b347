"""torch_xla data loaders: pl.MpDeviceLoader, pl.ParallelLoader(...).per_device_loader() (NM130).

The plain DataLoader is iterated and each batch moved to the device where the loop unpacks it; the
inserted `_batch_to_device` / `_DeviceLoader` helpers serve only loaders this rule cannot follow.
"""
from __future__ import annotations

import ast

from neuron_migrate.names.analysis import walk
from neuron_migrate.rules.api import has_star_args, kwarg, rule
from neuron_migrate.rules.builtin.xla_misc import NATIVE_FAQ, _isinstance_or_base, _nested_mentions, _scope_body_nodes
from neuron_migrate.rules.helpers import HELPERS, Helper

PL = "torch_xla.distributed.parallel_loader"

HELPERS["_batch_to_device"] = Helper(
    '''def _batch_to_device(batch, device):
    """The batch with its tensors (also inside lists, tuples and dicts) moved to `device`, as pl.MpDeviceLoader did."""
    if isinstance(batch, {torch}.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {{key: _batch_to_device(value, device) for key, value in batch.items()}}
    if isinstance(batch, (list, tuple)):
        moved = [_batch_to_device(value, device) for value in batch]
        return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)
    return batch
''',
    {"torch": "torch"},
)
HELPERS["_DeviceLoader"] = Helper(
    '''class _DeviceLoader:
    """Iterates `loader` with each batch moved to `device` (what pl.MpDeviceLoader did)."""

    def __init__(self, loader, device, **prefetch_options):  # MpDeviceLoader's prefetch options mean nothing here
        self.loader = loader
        self.device = device

    def __iter__(self):
        return (_batch_to_device(batch, self.device) for batch in self.loader)

    def __len__(self):
        return len(self.loader)
''',
    {},
    requires=("_batch_to_device",),
)

# what each MpDeviceLoader/ParallelLoader option did, for the finding that says it is dropped
_LOADER_OPTIONS = {
    "batches_per_execution": "cut one XLA graph per that many batches; eager TorchNeuron runs every batch as it comes",
    "device_prefetch_size": "sized the device-side prefetch queue; overlap loading with DataLoader(num_workers=..., pin_memory=True)",
    "loader_prefetch_size": "sized the host-side prefetch queue; use DataLoader(prefetch_factor=..., num_workers=...)",
    "host_to_device_transfer_threads": "set the copy threads; overlap loading with DataLoader(num_workers=..., pin_memory=True)",
    "batchdim": "named the batch dimension for sharding; nothing shards here",
    "fixed_batch_size": "checked batch sizes; eager TorchNeuron does not need it",
}


# -- NM130 ------------------------------------------------------------------------------------------
def _builtin_call(node, name: str, analysis, scope) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name
            and analysis.resolve(node.func, scope, count_use=False) is None and scope.lookup(name)[0] is None)


def _loop_over(node, site, ctx):
    """(for statement, enumerated) when `node` is the iterable of a for loop, directly or through enumerate()."""
    a = ctx.analysis
    parent = a.parent_of.get(node)
    if (isinstance(parent, ast.Call) and parent.args and parent.args[0] is node and not has_star_args(parent)
            and a.resolve(parent.func, site.scope, count_use=False) == "itertools.islice"):
        node, parent = parent, a.parent_of.get(parent)  # islice(loader, n) takes fewer of the same batches
    if isinstance(parent, ast.For) and parent.iter is node:
        return parent, False
    if _builtin_call(parent, "enumerate", a, site.scope) and parent.args and parent.args[0] is node:
        loop = a.parent_of.get(parent)
        if isinstance(loop, ast.For) and loop.iter is parent:
            return loop, True
    return None


def _loader_loops(target, site, ctx, device):
    """The for loops that consume the device loader built by `target`, when that is all that consumes it.

    Either the call is itself a loop's iterable, or it is assigned to a name that, in this scope only, is
    iterated by for loops (maybe through enumerate), measured with len(), or handed to a function defined
    in this scope that does only that with it. None otherwise: then the loader
    escapes to code this rule cannot see and keeps a wrapper object.
    """
    a = ctx.analysis
    direct = _loop_over(target, site, ctx)
    if direct is not None:
        return [direct]
    through = _loops_through_argument(target, site, ctx, device)
    if through is not None:
        return through
    assign = a.parent_of.get(target)
    if not (isinstance(assign, ast.Assign) and assign.value is target and len(assign.targets) == 1 and isinstance(assign.targets[0], ast.Name)):
        return None
    name = assign.targets[0].id
    scope_node = site.scope.node
    if isinstance(scope_node, ast.Lambda) or _nested_mentions(scope_node, name):
        return None
    loops, stores = [], 0
    for n in _scope_body_nodes(scope_node):
        if isinstance(n, (ast.Global, ast.Nonlocal)) and name in n.names:
            return None
        if not (isinstance(n, ast.Name) and n.id == name):
            continue
        if not isinstance(n.ctx, ast.Load):
            stores += 1
            continue
        loop = _loop_over(n, site, ctx)
        if loop is not None:
            loops.append(loop)
        elif _builtin_call(a.parent_of.get(n), "len", a, site.scope) and len(a.parent_of.get(n).args) == 1:
            continue
        else:
            inner = _loops_in_local_function(n, name, scope_node, device, site, ctx)
            if inner is None:
                return None
            loops.extend(inner)
    return loops if stores == 1 else None


def _item_preserving_rebind(n, param: str, ctx, scope):
    """`param = itertools.islice(param, ...)` (a statement): the Name nodes of it that only take fewer batches, else ()."""
    a = ctx.analysis
    stmt = a.parent_of.get(n)
    if isinstance(n.ctx, ast.Load):
        call = stmt
        stmt = a.parent_of.get(call)
        if not (isinstance(call, ast.Call) and call.args and call.args[0] is n):
            return ()
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
            and stmt.targets[0].id == param and isinstance(stmt.value, ast.Call)):
        return ()
    call = stmt.value
    if not (call.args and isinstance(call.args[0], ast.Name) and call.args[0].id == param and not has_star_args(call)):
        return ()
    if a.resolve(call.func, scope, count_use=False) != "itertools.islice":
        return ()
    return (stmt.targets[0], call.args[0])


def _param_uses(fn, param: str, site, ctx):
    """The for loops over parameter `param` of `fn` when that is all `fn` does with it (len() allowed, and
    `param = itertools.islice(param, n)`, which only takes fewer batches), else None."""
    a = ctx.analysis
    if any(isinstance(n, ast.Name) and n.id == param for n in walk(fn) if n is not fn) and _nested_mentions(fn, param):
        return None
    scope = a.scope_of.get(fn, site.scope)
    loops = []
    passed = set()
    for n in _scope_body_nodes(fn):
        if not (isinstance(n, ast.Name) and n.id == param) or id(n) in passed:
            continue
        through = _item_preserving_rebind(n, param, ctx, scope)
        if through:
            passed.update(id(x) for x in through)
            continue
        if not isinstance(n.ctx, ast.Load):
            return None
        loop = _loop_over(n, site, ctx)
        if loop is not None:
            loops.append(loop)
        elif not (_builtin_call(a.parent_of.get(n), "len", a, site.scope) and len(a.parent_of.get(n).args) == 1):
            return None
    return loops


def _binds(fn, name: str) -> bool:
    args = fn.args
    params = [p.arg for p in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg] if p is not None]
    return name in params or any(isinstance(n, ast.Name) and n.id == name and not isinstance(n.ctx, ast.Load)
                                 for n in _scope_body_nodes(fn))


def _loops_in_local_function(use, name: str, scope_node, device, site, ctx):
    """`train_loop_fn(loader, epoch)` where train_loop_fn is a function defined in this same scope, called only
    with this loader at that position, that only iterates the parameter: its loops, else None.

    The device expression must mean the same inside the function (a name it does not rebind)."""
    a = ctx.analysis
    call = a.parent_of.get(use)
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and use in call.args and not has_star_args(call)):
        return None
    index = call.args.index(use)
    fname = call.func.id
    defs = [n for n in _scope_body_nodes(scope_node) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == fname]
    if len(defs) != 1 or defs[0].decorator_list:
        return None
    fn = defs[0]
    params = [*fn.args.posonlyargs, *fn.args.args]
    if index >= len(params):
        return None
    root = device
    while isinstance(root, ast.Attribute):
        root = root.value
    if not isinstance(root, ast.Name) or _binds(fn, root.id):
        return None
    for n in _scope_body_nodes(scope_node):  # every use of the function is such a call with this loader
        if isinstance(n, ast.Name) and n.id == fname:
            c = a.parent_of.get(n)
            if not (isinstance(c, ast.Call) and c.func is n and len(c.args) > index
                    and isinstance(c.args[index], ast.Name) and c.args[index].id == name):
                return None
    return _param_uses(fn, params[index].arg, site, ctx)


def _loops_through_argument(target, site, ctx, device):
    """`train_loop_fn(<loader expression>, epoch)` where train_loop_fn is a function defined in this scope, named
    only there, that only iterates that parameter: its loops, else None."""
    a = ctx.analysis
    call = a.parent_of.get(target)
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and target in call.args and not has_star_args(call)):
        return None
    scope_node = site.scope.node
    if isinstance(scope_node, ast.Lambda):
        return None
    index = call.args.index(target)
    fname = call.func.id
    defs = [n for n in _scope_body_nodes(scope_node) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == fname]
    if len(defs) != 1 or defs[0].decorator_list:
        return None
    fn = defs[0]
    params = [*fn.args.posonlyargs, *fn.args.args]
    if index >= len(params) or not _device_visible_in(device, fn):
        return None
    if sum(1 for n in _scope_body_nodes(scope_node) if isinstance(n, ast.Name) and n.id == fname) != 1:
        return None
    return _param_uses(fn, params[index].arg, site, ctx)


def _device_visible_in(device, fn) -> bool:
    """The device expression (a name or an attribute chain on one) means the same inside `fn`: `fn` does not bind
    its root name (a closure over it, or `self` in a method of the same object)."""
    root = device
    while isinstance(root, ast.Attribute):
        root = root.value
    return isinstance(root, ast.Name) and not _binds(fn, root.id)


def _function_around(node, a):
    up = a.parent_of.get(node)
    while up is not None and not isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.Module)):
        up = a.parent_of.get(up)
    return up if isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef)) else None


def _class_of_method(method, ctx):
    """The top-level class that `method` (a plain def directly in its body, with a `self`) belongs to, else None."""
    a = ctx.analysis
    cls = a.parent_of.get(method)
    if not (isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) and isinstance(cls, ast.ClassDef)
            and a.parent_of.get(cls) is a.tree and method.args.args and not method.decorator_list):
        return None
    for n in walk(a.tree):  # a subclass in this same file: not followed
        if isinstance(n, ast.ClassDef) and n is not cls and any(
                (isinstance(b, ast.Name) and b.id == cls.name) or (isinstance(b, ast.Attribute) and b.attr == cls.name)
                for b in n.bases):
            return None
    return cls


def _sealed(cls, ctx, methods, reads=(), stores=(), loader_stores=()) -> bool:
    """Code in other files cannot change what `methods` of `cls` do with the loader: the class is closed (no other
    repository file imports it, the model's "closed"; `_class_of_method` checks this file), or the repository model
    says that no subclass in any file defines one of `methods`, and that no other file that may hold its objects
    reads one of the attributes `reads` or stores one of `stores`, except that those of `loader_stores` may be given
    another device loader (a subclass's `self.train_device_loader = pl.MpDeviceLoader(...)`: its batches arrive on
    the device already, and moving them again where the loop unpacks them changes nothing)."""
    outside = getattr(ctx.analysis, "outside", None) or {}
    if cls.name in outside.get("closed", ()):
        return True
    foreign = (outside.get("foreign") or {}).get(cls.name)
    if foreign is None:
        return False
    for key, names in (("defs", methods), ("read", reads), ("set", stores),
                       ("set_loader", set(stores) - set(loader_stores))):
        seen = set(foreign.get(key, ("*",)))
        if "*" in seen or seen & set(names):
            return False
    return True


def _returned_loader_loops(target, site, ctx, device):
    """`return pl.MpDeviceLoader(loader, self.device)` in a method of a top-level class, where the repository model
    says every caller, in any file, hands the result only to other methods of the same object
    (`loader = trainer.make_loader(ds)`, then `trainer.train_epoch(loader, epoch)`), each defined in this class,
    not overridden by a subclass, and only iterating that parameter: those loops (the batch is moved to
    `self.device`, which the class sets once and no other file sets). Else None."""
    a = ctx.analysis
    ret = a.parent_of.get(target)
    fn = site.scope.node
    cls = _class_of_method(fn, ctx) if isinstance(ret, ast.Return) and ret.value is target else None
    if cls is None:
        return None
    me = fn.args.args[0].arg
    if not (isinstance(device, ast.Attribute) and isinstance(device.value, ast.Name) and device.value.id == me):
        return None
    via = ((getattr(a, "outside", None) or {}).get("loaders") or {}).get(f"{cls.name}.{fn.name}")
    if not via:
        return None
    methods: dict = {}
    for n in cls.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if n.name in methods:
                return None
            methods[n.name] = n
    if sum(1 for n in walk(a.tree) if isinstance(n, ast.Attribute) and n.attr == device.attr
           and not isinstance(n.ctx, ast.Load)) != 1:
        return None
    loops = []
    for name, index in via:
        callee = methods.get(name)
        if callee is None:
            return None
        params = [*callee.args.posonlyargs, *callee.args.args]
        if callee.decorator_list or index + 1 >= len(params) or params[0].arg != me:
            return None
        inner = _param_uses(callee, params[index + 1].arg, site, ctx)
        if inner is None:
            return None
        loops.extend(inner)
    if not loops or not _sealed(cls, ctx, {fn.name, *(name for name, _i in via)}, stores={device.attr}):
        return None
    return loops


def _attribute_loader_loops(target, site, ctx, device):
    """`self.loader = pl.MpDeviceLoader(loader, self.device)` in a method of a top-level class, where every use of
    `self.loader` is a loop's iterable, len(), or an argument of another method of the class that only iterates that
    parameter: the loops, where the batch is moved to `self.device` (which the class sets once). The class must be
    sealed for them (`_sealed`): no subclass overrides a method that uses the loader, and no other file reads the
    attribute or stores it or the device. Else None (the loader keeps a wrapper object)."""
    a = ctx.analysis
    assign = a.parent_of.get(target)
    if not (isinstance(assign, ast.Assign) and assign.value is target and len(assign.targets) == 1
            and isinstance(assign.targets[0], ast.Attribute) and isinstance(assign.targets[0].value, ast.Name)):
        return None
    attr = assign.targets[0]
    cls = _class_of_method(site.scope.node, ctx)
    me = attr.value.id
    if cls is None or site.scope.node.args.args[0].arg != me:
        return None
    if not (isinstance(device, ast.Attribute) and isinstance(device.value, ast.Name) and device.value.id == me):
        return None
    methods: dict = {}
    for n in cls.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if n.name in methods:
                return None
            methods[n.name] = n
    device_stores, loops, touched = 0, [], set()
    for n in walk(a.tree):
        if isinstance(n, ast.Attribute) and n.attr == device.attr and not isinstance(n.ctx, ast.Load):
            device_stores += 1
        if not (isinstance(n, ast.Attribute) and n.attr == attr.attr) or n is attr:
            continue
        fn = _function_around(n, a)
        if not (isinstance(n.ctx, ast.Load) and isinstance(n.value, ast.Name) and n.value.id == me and fn is not None
                and a.parent_of.get(fn) is cls and fn.args.args and fn.args.args[0].arg == me):
            return None
        touched.add(fn.name)
        loop = _loop_over(n, site, ctx)
        if loop is not None:
            loops.append(loop)
            continue
        parent = a.parent_of.get(n)
        if _builtin_call(parent, "len", a, site.scope) and len(parent.args) == 1:
            continue
        if not (isinstance(parent, ast.Call) and n in parent.args and not has_star_args(parent)
                and isinstance(parent.func, ast.Attribute) and isinstance(parent.func.value, ast.Name)
                and parent.func.value.id == me and parent.func.attr in methods):
            return None
        callee = methods[parent.func.attr]
        params = [*callee.args.posonlyargs, *callee.args.args]
        index = parent.args.index(n) + 1
        if callee.decorator_list or index >= len(params) or params[0].arg != me:
            return None
        inner = _param_uses(callee, params[index].arg, site, ctx)
        if inner is None:
            return None
        touched.add(callee.name)
        loops.extend(inner)
    if not (loops and device_stores == 1
            and _sealed(cls, ctx, touched, {attr.attr}, {attr.attr, device.attr}, loader_stores={attr.attr})):
        return None
    return loops


def _named_parallel_loader(call, site, ctx):
    """(assignment, [`name.per_device_loader(d)` calls]) when `name = pl.ParallelLoader(loader, devices)` is only
    ever used as `name.per_device_loader(d)` after it, in this scope, and `loader` is a plain name this scope does
    not bind again after the assignment. Else None."""
    a = ctx.analysis
    assign = a.parent_of.get(call)
    if not (isinstance(assign, ast.Assign) and assign.value is call and len(assign.targets) == 1
            and isinstance(assign.targets[0], ast.Name)):
        return None
    name = assign.targets[0].id
    loader = kwarg(call, "cpu_loader", 0) or kwarg(call, "loader", 0)
    scope_node = site.scope.node
    if not isinstance(loader, ast.Name) or isinstance(scope_node, ast.Lambda) or _nested_mentions(scope_node, name):
        return None
    uses, stores = [], []
    for n in _scope_body_nodes(scope_node):
        if isinstance(n, (ast.Global, ast.Nonlocal)) and {name, loader.id} & set(n.names):
            return None
        if isinstance(n, ast.Name) and n.id == loader.id and not isinstance(n.ctx, ast.Load) and n.lineno > assign.lineno:
            return None
        if not (isinstance(n, ast.Name) and n.id == name):
            continue
        if not isinstance(n.ctx, ast.Load):
            # another `name = pl.ParallelLoader(...)` (the next epoch's, the test loader's) has its own uses
            other = a.parent_of.get(n)
            if not (isinstance(other, ast.Assign) and len(other.targets) == 1 and other.targets[0] is n
                    and isinstance(other.value, ast.Call)
                    and a.resolve(other.value.func, site.scope, count_use=False) == f"{PL}.ParallelLoader"):
                return None
            stores.append(other.lineno)
            continue
        attr = a.parent_of.get(n)
        outer = a.parent_of.get(attr)
        if not (isinstance(attr, ast.Attribute) and attr.attr == "per_device_loader"
                and isinstance(outer, ast.Call) and outer.func is attr and len(outer.args) == 1 and not outer.keywords):
            return None
        uses.append(outer)
    # each use reads the nearest assignment above it; one above every assignment would read an earlier round's
    if any(u.lineno <= min(stores) for u in uses):
        return None
    mine = [u for u in uses if max(line for line in stores if line < u.lineno) == assign.lineno]
    return (assign, mine) if mine else None


def _plain_alias(target, loader, site, ctx, use_ok=None):
    """(assignment, uses) when `name = pl.MpDeviceLoader(loader, device)` would only become another name for
    `loader`: a statement of its own, `loader` a plain name nothing rebinds in this scope after it, and every use
    of `name` a loop's iterable (maybe through enumerate) or len() in this scope. Else None (the name stays)."""
    a = ctx.analysis
    assign = a.parent_of.get(target)
    if not (isinstance(loader, ast.Name) and isinstance(assign, ast.Assign) and assign.value is target
            and len(assign.targets) == 1 and isinstance(assign.targets[0], ast.Name) and assign.targets[0].id != loader.id):
        return None
    scope_node = site.scope.node
    parent = a.parent_of.get(assign)
    if isinstance(scope_node, ast.Lambda) or parent is not scope_node or _nested_mentions(scope_node, loader.id):
        return None  # only a statement directly in the function (or module) body: it runs before every loop
    if ctx.analysis.lines[assign.lineno - 1][: assign.col_offset].strip() or ";" in ctx.src(assign):
        return None
    name = assign.targets[0].id
    uses = []
    for n in _scope_body_nodes(scope_node):
        if isinstance(n, (ast.Global, ast.Nonlocal)) and ({name, loader.id} & set(n.names)):
            return None
        if isinstance(n, ast.Name) and n.id == loader.id and not isinstance(n.ctx, ast.Load) and n.lineno >= assign.lineno:
            return None
        if not (isinstance(n, ast.Name) and n.id == name) or n is assign.targets[0]:
            continue
        if not isinstance(n.ctx, ast.Load):
            return None
        user = a.parent_of.get(n)
        if use_ok is not None:
            if not use_ok(n):
                return None
        elif _loop_over(n, site, ctx) is None and not (_builtin_call(user, "len", a, site.scope) and len(user.args) == 1):
            return None
        uses.append(n)
    return (assign, uses) if uses else None


_CURRENT_DEVICE = ("torch_xla.core.xla_model.xla_device", "torch_xla.device")


def _current_device(device, site, ctx) -> bool:
    """`xm.xla_device()` / `torch_xla.device()` with no argument, or a name this function binds once, to such a call:
    the process's own device, which the loops of another file name as "neuron" (repository/flows.py decides the same
    from the text)."""
    a = ctx.analysis
    expr = device
    if isinstance(device, ast.Name):
        scope_node = site.scope.node
        binds = [n for n in _scope_body_nodes(scope_node) if isinstance(n, ast.Name) and n.id == device.id
                 and not isinstance(n.ctx, ast.Load)]
        assign = a.parent_of.get(binds[0]) if len(binds) == 1 else None
        if not (isinstance(assign, ast.Assign) and len(assign.targets) == 1 and assign.targets[0] is binds[0]):
            return False
        expr = assign.value
    return (isinstance(expr, ast.Call) and not expr.args and not expr.keywords
            and a.resolve(expr.func, site.scope, count_use=False) in _CURRENT_DEVICE)


def _handed_to(node, site, ctx, handed: dict) -> bool:
    """`node` is positional argument `index` of `f(...)` (no * or **), where the repository model says function `f`
    of another file of this run only iterates that parameter and is always handed a device loader there."""
    call = ctx.analysis.parent_of.get(node)
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and node in call.args
            and not has_star_args(call)):
        return False
    outside = ctx.settings.outside if ctx.settings is not None else None
    if not outside:
        return False
    import os

    here = os.path.dirname(os.path.abspath(ctx.analysis.path))
    index = call.args.index(node)
    return any(i == index and os.path.normpath(os.path.join(here, rel)) in outside
               for i, rel in handed.get(call.func.id, ()))


def _handed_loader(target, loader, site, ctx, device):
    """The fix's edits, as (assignment to delete or None, uses to rename to `loader`) or (None, []) to replace the call
    by the loader, when the device loader is only handed to functions of other files of this run that iterate it
    (repository facts "handed_loaders": the model found every call of them handing such a loader): those
    functions' loops move each batch to the device (`_loops_handed_in`). Else None."""
    a = ctx.analysis
    handed = (getattr(a, "outside", None) or {}).get("handed_loaders")
    if not handed or not _current_device(device, site, ctx):
        return None
    if _handed_to(target, site, ctx, handed):
        return None, []
    assign = a.parent_of.get(target)
    if not (isinstance(assign, ast.Assign) and assign.value is target and len(assign.targets) == 1
            and isinstance(assign.targets[0], ast.Name)):
        return None
    name = assign.targets[0].id
    scope_node = site.scope.node
    if isinstance(scope_node, ast.Lambda) or _nested_mentions(scope_node, name):
        return None
    uses, handed_once = [], False
    for n in _scope_body_nodes(scope_node):
        if isinstance(n, (ast.Global, ast.Nonlocal)) and name in n.names:
            return None
        if not (isinstance(n, ast.Name) and n.id == name) or n is assign.targets[0]:
            continue
        if not isinstance(n.ctx, ast.Load):
            return None
        user = a.parent_of.get(n)
        if _handed_to(n, site, ctx, handed):
            handed_once = True
        elif not (_builtin_call(user, "len", a, site.scope) and len(user.args) == 1):
            return None
        uses.append(n)
    if not handed_once:
        return None
    alias = _plain_alias(target, loader, site, ctx, lambda n: n in uses)
    return alias if alias is not None else (None, [])


def _loops_handed_in(site, ctx):
    """The module trigger of NM130: in a function that other files of the repository hand a device loader to (facts
    "loader_params"; their NM130 passes the plain DataLoader instead), each loop over that parameter moves its batch
    to the process's device where it unpacks it."""
    a = ctx.analysis
    wanted = (getattr(a, "outside", None) or {}).get("loader_params")
    if not wanted:
        return None
    out = []
    for stmt in a.tree.body:
        if not (isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name in wanted):
            continue
        params = [*stmt.args.posonlyargs, *stmt.args.args]
        for index in wanted[stmt.name]:
            if index >= len(params):
                continue
            param = params[index].arg
            loops = _param_uses(stmt, param, site, ctx)
            batches = [(loop, _batch_names(loop, enumerated)) for loop, enumerated in loops or ()]
            if not batches or any(names is None for _, names in batches):
                out.append(ctx.finding(stmt, f"`{stmt.name}` is handed a device loader by another file, whose migration "
                                             f"passes the plain DataLoader: move each batch of `{param}` to the device "
                                             "where it is unpacked"))
                continue
            fx = ctx.fixer()
            dev = (f"{fx.helper('_accelerator_device')}()" if ctx.settings is not None
                   and ctx.settings.device_style == "accelerator" else '"neuron"')
            todo = [(loop, names) for loop, names in batches if not _moves_batch_first(loop, names, dev, ctx)]
            if not todo:
                continue
            _insert_moves(fx, todo, dev, ctx)
            out.append(ctx.finding(todo[0][0], f"`{param}` of `{stmt.name}`: the files that hand it a device loader "
                                               "(pl.MpDeviceLoader) now pass the plain DataLoader, so the loop moves "
                                               "each batch to the device where it unpacks it", fix=fx.build()))
    return out or None


def _batch_names(loop, enumerated):
    """The loop's batch target: a Name, or a tuple of Names; None for anything else."""
    target = loop.target
    if enumerated:
        if not (isinstance(target, ast.Tuple) and len(target.elts) == 2):
            return None
        target = target.elts[1]
    if isinstance(target, ast.Name):
        return target
    if isinstance(target, (ast.Tuple, ast.List)) and target.elts and all(isinstance(e, ast.Name) for e in target.elts):
        return [e.id for e in target.elts]
    return None


def _moved_to(expr, name: str, dev: str, ctx) -> bool:
    """`expr` is `name.to(dev)` (optionally with non_blocking=)."""
    return (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "to"
            and isinstance(expr.func.value, ast.Name) and expr.func.value.id == name and len(expr.args) == 1
            and all(k.arg == "non_blocking" for k in expr.keywords) and ctx.src(expr.args[0]) == dev)


def _moves_batch_first(loop, names, dev: str, ctx) -> bool:
    """The loop's first statement already moves the whole batch to `dev`, as real loops often do (MpDeviceLoader's
    copy made it a no-op): `batch = {k: v.to(dev) for k, v in batch.items()}`, `batch = batch.to(dev)`, or
    `x, y = x.to(dev), y.to(dev)`. A second move inserted above it would only repeat it."""
    first = loop.body[0]
    if not (isinstance(first, ast.Assign) and len(first.targets) == 1):
        return False
    target, value = first.targets[0], first.value
    if isinstance(names, ast.Name):
        name = names.id
        if not (isinstance(target, ast.Name) and target.id == name):
            return False
        if _moved_to(value, name, dev, ctx):
            return True
        if (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "_batch_to_device"
                and len(value.args) == 2 and not value.keywords and isinstance(value.args[0], ast.Name)
                and value.args[0].id == name and ctx.src(value.args[1]) == dev):
            return True  # this rule's own move (a loop the repository model hands plain loaders to is seen again)
        if not (isinstance(value, ast.DictComp) and len(value.generators) == 1):
            return False
        gen = value.generators[0]
        pair = gen.target.elts if isinstance(gen.target, ast.Tuple) else []
        items = gen.iter
        return (not gen.ifs and not gen.is_async and len(pair) == 2 and all(isinstance(e, ast.Name) for e in pair)
                and isinstance(items, ast.Call) and isinstance(items.func, ast.Attribute) and items.func.attr == "items"
                and isinstance(items.func.value, ast.Name) and items.func.value.id == name and not items.args
                and not items.keywords and isinstance(value.key, ast.Name) and value.key.id == pair[0].id
                and pair[1].id != name and _moved_to(value.value, pair[1].id, dev, ctx))
    moved = [n for n in names if n != "_"]
    return (isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, ast.Tuple)
            and [e.id if isinstance(e, ast.Name) else None for e in target.elts] == moved
            and len(value.elts) == len(moved) and all(_moved_to(v, n, dev, ctx) for v, n in zip(value.elts, moved)))


def _insert_moves(fx, batches, dev: str, ctx) -> None:
    """Each loop moves its batch to the device first, unless its first statement already does."""
    for loop, names in batches:
        if not _moves_batch_first(loop, names, dev, ctx):
            fx.insert_before(loop.body[0], _move_text(names, dev, fx))


def _move_text(names, dev: str, fx) -> str:
    if isinstance(names, ast.Name):
        return f"{names.id} = {fx.helper('_batch_to_device')}({names.id}, {dev})"
    moved = [n for n in names if n != "_"]
    return f"{', '.join(moved)} = {', '.join(f'{n}.to({dev})' for n in moved)}"


def _named_parallel_fix(site, ctx, call, loader, assign, uses):
    """`para = pl.ParallelLoader(loader, [d])` ... `para.per_device_loader(d)`: the assignment goes, each
    per_device_loader call becomes the plain loader with its loops moving the batches (or _DeviceLoader where the
    batches go where this rule cannot follow them)."""
    fx = ctx.fixer()
    fx.delete(assign)
    plain = []
    for outer in uses:
        dev = ctx.src(outer.args[0])
        loops = _loader_loops(outer, site, ctx, outer.args[0])
        batches = [(loop, _batch_names(loop, enumerated)) for loop, enumerated in loops] if loops is not None else None
        if batches is not None and all(names is not None for _, names in batches):
            fx.replace(outer, ctx.src(loader))
            _insert_moves(fx, batches, dev, ctx)
            plain.append(outer)
        else:
            fx.replace(outer, f"{fx.helper('_DeviceLoader')}({ctx.src(loader)}, {dev})")
    how = ("the plain loader is iterated and each batch is moved to the device in the loop" if len(plain) == len(uses)
           else "per_device_loader(device) becomes _DeviceLoader(loader, device), which moves each batch to the device, "
                "where the batches go where this rule cannot follow them")
    return ctx.finding(site, f"pl.ParallelLoader bound to `{assign.targets[0].id}`: {how} (eager: no graph cut needed)",
                       fix=fx.build(), note="; ".join(_dropped_options(call, ctx)))


def _dropped_options(call, ctx) -> list[str]:
    notes = []
    for k in call.keywords:
        if k.arg in _LOADER_OPTIONS:
            notes.append(f"{k.arg}={ctx.src(k.value)} dropped (it {_LOADER_OPTIONS[k.arg]})")
    return notes


@rule(
    code="NM130",
    name="mp-device-loader",
    summary="pl.MpDeviceLoader / ParallelLoader(...).per_device_loader() become the plain loader, each batch moved to the device in the loop",
    fix="safe",
    severity="warning",
    triggers=[("call", f"{PL}.MpDeviceLoader"), ("ref", f"{PL}.MpDeviceLoader"),
              ("call", f"{PL}.ParallelLoader"), ("ref", f"{PL}.ParallelLoader"), ("ref", f"{PL}.PerDeviceLoader"),
              ("module", "*")],
    trigger_words=("torch_xla",),  # the module trigger's files are checked whatever their text (Settings.forces_check)
    docs=f"""
        `pl.MpDeviceLoader(loader, device)` wraps a DataLoader: background threads copy each batch to the XLA
        device and every `next()` cuts the lazy graph. TorchNeuron is eager, so only the copy is needed, and the
        rewrite is what one writes by hand: the plain DataLoader is iterated and the loop moves the unpacked
        batch, `for data, target in loader:` gaining `data, target = data.to(device), target.to(device)`
        (a batch bound to one name becomes `batch = _batch_to_device(batch, device)`, an inserted function that
        moves the tensors inside lists, tuples and dicts). A loop whose first statement already moves the whole batch
        to the same device (`batch = {{k: v.to(device) for k, v in batch.items()}}`, `batch = batch.to(device)`,
        `x, y = x.to(device), y.to(device)`: a no-op under MpDeviceLoader, kept in many scripts) gets no second
        move. This applies where every use of the loader is visible:
        the call is a loop's iterable (also through `enumerate`), or it is assigned to a name that this function
        only iterates in `for` loops or passes to `len()`. A loader stored on the object (`self.train_device_loader =
        pl.MpDeviceLoader(loader, self.device)` in `__init__`) and handed to another method that iterates it
        (`self.train_loop_fn(self.train_device_loader, epoch)`, also through `itertools.islice`) becomes the plain
        loader too, with the batch moved to `self.device` where that method unpacks it, when no subclass can
        change what those methods do: the repository model says no other file imports the class, or that no
        subclass in any file overrides the methods that use the loader and no other file reads or stores the
        loader's attribute (except to give it another device loader, whose batches arrive on the device already) or
        stores the device's (a subclass that only extends `__init__`, as pytorch/xla's `train_resnet_ddp.py` does,
        changes nothing); no class of the file derives from it. A loader a method
        returns (`return pl.MpDeviceLoader(loader, self.device)` in `make_loader`) becomes the plain loader when
        the repository model finds every call of that method, in any file, handing the result only to methods
        of the same object (`loader = trainer.make_loader(ds)`, then `trainer.train_epoch(loader, epoch)`), each a
        method of this class that no subclass overrides and that only iterates the loader (or measures it with
        `len()`): the batch is moved where those loops unpack it. The unpacked names are assumed to be tensors, as in
        `(data, target)` batches. Also named: `para = pl.ParallelLoader(loader, [device])` with
        `para.per_device_loader(device)` called later (each call becomes the plain loader), and a loop in a local
        `train_loop_fn(loader)` the loader is handed to. A loader handed to a function of another file of the
        repository (`train_one_epoch(model, train_loader, optimizer)` from engine.py, also under `@torch.no_grad()`)
        becomes the plain loader when the repository model finds that function only iterating that parameter and
        every call of it, in any file, handing a loader on the process's own device (`xm.xla_device()`) there: its
        loops move each batch to `"neuron"` where they unpack it (both files must be in the run; `rewrite train.py`
        alone keeps the wrapper). A loader that escapes (returned, passed on, stored on
        `self` of a class that other files import) becomes
        `_DeviceLoader(loader, device)`, a small inserted class that iterates the loader with each batch moved
        and keeps `len()`. `pl.ParallelLoader(loader, [device]).per_device_loader(device)` is treated the same.
        The prefetch options (`device_prefetch_size`, `loader_prefetch_size`, `batches_per_execution`,
        `host_to_device_transfer_threads`) have no meaning in eager execution: each one dropped is named, with
        its value, in the finding's note (use `pin_memory=True` and `num_workers` on the DataLoader for overlap).
        `input_sharding=` (SPMD) is reported: shard with DTensor. MpDeviceLoader never sharded data, so the
        sampler (`DistributedSampler`) stays as it is. `isinstance(x, pl.MpDeviceLoader)` and subclasses of
        the torch_xla loaders are reported: they rely on torch_xla internals. Native PyTorch device
        placement: {NATIVE_FAQ}.
    """,
    examples=[("for data, target in pl.MpDeviceLoader(loader, device):\n    step(data, target)",
               "for data, target in loader:\n    data, target = data.to(device), target.to(device)\n    step(data, target)")],
)
def mp_device_loader(site, ctx):
    if site.kind == "module":
        return _loops_handed_in(site, ctx)
    cls = site.key.rsplit(".", 1)[1]
    if site.kind == "ref":
        how = _isinstance_or_base(site, ctx)
        if how == "isinstance":
            return ctx.finding(site, f"isinstance check on pl.{cls}: the class is gone on TorchNeuron; test for the plain DataLoader instead")
        if how == "subclass":
            return ctx.finding(site, f"subclass of pl.{cls}: rebase it on a plain iterable that moves each batch to the device")
        if cls != "MpDeviceLoader":
            return ctx.finding(site, f"pl.{cls} used as a value: iterate the plain DataLoader and move each batch with .to(device)")
        fx = ctx.fixer()
        fx.replace(site.node, fx.helper("_DeviceLoader"))
        return ctx.finding(site, "pl.MpDeviceLoader used as a value: becomes _DeviceLoader (same (loader, device, **options) signature)", fix=fx.build())
    call = site.call
    if has_star_args(call):
        return ctx.finding(site, f"pl.{cls} with *args/**kwargs: iterate the loader and move each batch to the device by hand")
    if kwarg(call, "input_sharding") is not None:
        return ctx.finding(site, f"pl.{cls} with input_sharding= (SPMD): shard the inputs with DTensor (distribute_tensor on an init_device_mesh('neuron', ...) mesh) and move batches by hand")
    if len(call.args) > 2:
        return ctx.finding(site, f"pl.{cls} with options passed by position: iterate the loader and move each batch to the device by hand")
    loader = kwarg(call, "loader", 0) if cls == "MpDeviceLoader" else kwarg(call, "cpu_loader", 0) or kwarg(call, "loader", 0)
    if loader is None:
        return ctx.finding(site, f"pl.{cls} without a loader argument: migrate by hand")
    if cls == "MpDeviceLoader":
        device = kwarg(call, "device", 1)
        target = call
    else:
        attr = site.parent
        outer = ctx.analysis.parent_of.get(attr)
        if not (isinstance(attr, ast.Attribute) and attr.attr == "per_device_loader" and isinstance(outer, ast.Call)
                and outer.func is attr and len(outer.args) == 1 and not outer.keywords):
            named = None if has_star_args(call) or len(call.args) > 2 else _named_parallel_loader(call, site, ctx)
            if named is None:
                return ctx.finding(site, "pl.ParallelLoader kept as an object: iterate the plain DataLoader and move each batch to the device")
            return _named_parallel_fix(site, ctx, call, loader, *named)
        device = outer.args[0]
        target = outer
    if device is None:
        return ctx.finding(site, f"pl.{cls} without a device argument: migrate by hand")
    dropped = _dropped_options(call, ctx)
    unknown = [k.arg for k in call.keywords if k.arg not in ("loader", "cpu_loader", "device", "devices", *_LOADER_OPTIONS)]
    if unknown:
        return ctx.finding(site, f"pl.{cls} with {', '.join(unknown)}=: migrate by hand")
    note = "; ".join(dropped)
    fx = ctx.fixer()
    loops = _loader_loops(target, site, ctx, device)
    if loops is None:
        loops = _attribute_loader_loops(target, site, ctx, device)
    if loops is None:
        loops = _returned_loader_loops(target, site, ctx, device)
    batches = [(loop, _batch_names(loop, enumerated)) for loop, enumerated in loops] if loops is not None else None
    dev = ctx.src(device)
    if batches is not None and all(names is not None for _, names in batches):
        # the uses _loader_loops accepted: loops, len(), and arguments of the local functions whose loops it found
        alias = _plain_alias(target, loader, site, ctx, lambda n: _loop_over(n, site, ctx) is not None or (
            isinstance(ctx.analysis.parent_of.get(n), ast.Call) and n in ctx.analysis.parent_of[n].args
            and isinstance(ctx.analysis.parent_of[n].func, ast.Name)))
        if alias is not None:  # `device_loader = pl.MpDeviceLoader(loader, d)` only iterated: iterate `loader` itself
            assign, uses = alias
            fx.delete(assign)
            for use in uses:
                fx.replace(use, loader.id)
        else:
            fx.replace(target, ctx.src(loader))
        _insert_moves(fx, batches, dev, ctx)
        return ctx.finding(site, f"pl.{cls}: the plain loader is iterated and each batch is moved to the device in the loop "
                                 "(eager: no graph cut needed)", fix=fx.build(), note=note)
    handed = _handed_loader(target, loader, site, ctx, device) if cls == "MpDeviceLoader" else None
    if handed is not None:
        assign, uses = handed
        if assign is not None:
            fx.delete(assign)
            for use in uses:
                fx.replace(use, loader.id)
        else:
            fx.replace(target, ctx.src(loader))
        return ctx.finding(site, "pl.MpDeviceLoader: the plain loader is handed on, and the functions of other files "
                                 "that iterate it move each batch to the device where they unpack it (eager: no graph "
                                 "cut needed)", fix=fx.build(), note=note)
    name = fx.helper("_DeviceLoader")
    fx.replace(target, f"{name}({ctx.src(loader)}, {dev})")
    return ctx.finding(site, f"pl.{cls}: the loader is consumed where this rule cannot follow it, so it becomes _DeviceLoader, "
                             "which moves each batch to the device (eager: no graph cut needed)", fix=fx.build(), note=note)

