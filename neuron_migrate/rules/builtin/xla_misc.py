"""torch_xla data loading, precision, RNG, metrics/profiler, version gates and the catch-alls (NM130-NM199).

The environment-variable rules are in `xla_env.py`; the YAML renames and the report catalogue in
`rules/torch_xla.yaml`.
"""
from __future__ import annotations

import ast

from neuron_migrate.names.analysis import child_nodes, walk
from neuron_migrate.rules.helpers import HELPERS, Helper
from neuron_migrate.program import cached
from neuron_migrate.rules.api import const_value, has_star_args, kwarg, rule

PL = "torch_xla.distributed.parallel_loader"
XM = "torch_xla.core.xla_model"
MET = "torch_xla.debug.metrics"
XP = "torch_xla.debug.profiler"
RELEASE_NOTES = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/release-notes/components/torchneuron.html"
NATIVE_FAQ = "https://github.com/aws-neuron/aws-neuron-sdk/blob/master/frameworks/torch/pytorch-native-overview.rst"

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


def _isinstance_or_base(site, ctx) -> str | None:
    """'isinstance'/'subclass' when a class reference is tested or subclassed, else None."""
    node = site.node
    parent = site.parent
    if isinstance(parent, (ast.Tuple, ast.List)):
        node, parent = parent, ctx.analysis.parent_of.get(parent)
    if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and parent.func.id in ("isinstance", "issubclass") and node in parent.args[1:]:
        return "isinstance"
    if isinstance(parent, ast.ClassDef) and node in parent.bases:
        return "subclass"
    return None


# -- NM130 ------------------------------------------------------------------------------------------
def _builtin_call(node, name: str, analysis, scope) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name
            and analysis.resolve(node.func, scope, count_use=False) is None and scope.lookup(name)[0] is None)


def _loop_over(node, site, ctx):
    """(for statement, enumerated) when `node` is the iterable of a for loop, directly or through enumerate()."""
    a = ctx.analysis
    parent = a.parent_of.get(node)
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


def _param_uses(fn, param: str, site, ctx):
    """The for loops over parameter `param` of `fn` when that is all `fn` does with it (len() allowed), else None."""
    a = ctx.analysis
    if any(isinstance(n, ast.Name) and n.id == param for n in walk(fn) if n is not fn) and _nested_mentions(fn, param):
        return None
    loops = []
    for n in _scope_body_nodes(fn):
        if not (isinstance(n, ast.Name) and n.id == param):
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


def _plain_alias(target, loader, site, ctx):
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
        if _loop_over(n, site, ctx) is None and not (_builtin_call(user, "len", a, site.scope) and len(user.args) == 1):
            return None
        uses.append(n)
    return (assign, uses) if uses else None


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
              ("call", f"{PL}.ParallelLoader"), ("ref", f"{PL}.ParallelLoader"), ("ref", f"{PL}.PerDeviceLoader")],
    docs=f"""
        `pl.MpDeviceLoader(loader, device)` wraps a DataLoader: background threads copy each batch to the XLA
        device and every `next()` cuts the lazy graph. TorchNeuron is eager, so only the copy is needed, and the
        rewrite is what one writes by hand: the plain DataLoader is iterated and the loop moves the unpacked
        batch, `for data, target in loader:` gaining `data, target = data.to(device), target.to(device)`
        (a batch bound to one name becomes `batch = _batch_to_device(batch, device)`, an inserted function that
        moves the tensors inside lists, tuples and dicts). This applies where every use of the loader is visible:
        the call is a loop's iterable (also through `enumerate`), or it is assigned to a name that this function
        only iterates in `for` loops or passes to `len()`. The unpacked names are assumed to be tensors, as in
        `(data, target)` batches. A loader that escapes (returned, passed on, stored on `self`) becomes
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
            return ctx.finding(site, "pl.ParallelLoader kept as an object: iterate the plain DataLoader and move each batch to the device")
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
    batches = [(loop, _batch_names(loop, enumerated)) for loop, enumerated in loops] if loops is not None else None
    dev = ctx.src(device)
    if batches is not None and all(names is not None for _, names in batches):
        alias = _plain_alias(target, loader, site, ctx)
        if alias is not None:  # `device_loader = pl.MpDeviceLoader(loader, d)` only iterated: iterate `loader` itself
            assign, uses = alias
            fx.delete(assign)
            for use in uses:
                fx.replace(use, loader.id)
        else:
            fx.replace(target, ctx.src(loader))
        for loop, names in batches:
            if isinstance(names, ast.Name):
                move = f"{names.id} = {fx.helper('_batch_to_device')}({names.id}, {dev})"
            else:
                moved = [n for n in names if n != "_"]
                move = f"{', '.join(moved)} = {', '.join(f'{n}.to({dev})' for n in moved)}"
            fx.insert_before(loop.body[0], move)
        return ctx.finding(site, f"pl.{cls}: the plain loader is iterated and each batch is moved to the device in the loop "
                                 "(eager: no graph cut needed)", fix=fx.build(), note=note)
    name = fx.helper("_DeviceLoader")
    fx.replace(target, f"{name}({ctx.src(loader)}, {dev})")
    return ctx.finding(site, f"pl.{cls}: the loader is consumed where this rule cannot follow it, so it becomes _DeviceLoader, "
                             "which moves each batch to the device (eager: no graph cut needed)", fix=fx.build(), note=note)


# -- NM131 ------------------------------------------------------------------------------------------
@rule(
    code="NM131",
    name="xla-autocast",
    summary="torch_xla.amp.autocast(device, ...) becomes torch.autocast(\"neuron\", dtype=torch.bfloat16, ...)",
    fix="unsafe",
    severity="warning",
    triggers=[("call", "torch_xla.amp.autocast"), ("call", "torch_xla.amp.autocast_mode.autocast"),
              ("ref", "torch_xla.amp.autocast"), ("ref", "torch_xla.amp.autocast_mode.autocast")],
    docs=f"""
        `torch_xla.amp.autocast(device, enabled=True, dtype=None, cache_enabled=True)` takes a *device* as its
        first argument and defaults to bfloat16 on TPU/Neuron. TorchNeuron uses the standard
        `torch.autocast(device_type="neuron", dtype=torch.bfloat16)` ({NATIVE_FAQ}), whose op lists follow the
        CUDA conventions. The device argument is dropped, `dtype` defaults to `torch.bfloat16`, `enabled=` and
        `cache_enabled=` are kept. The fix is unsafe: with torch_xla <= 2.5 the XLA autocast printed a warning
        and did nothing on Neuron, so the rewritten code really runs in mixed precision and its numerics change;
        under XLA a dtype other than bfloat16 disabled autocast, natively it is honoured.
    """,
    examples=[("with torch_xla.amp.autocast(device):\n    loss = model(x)", "with torch.autocast(\"neuron\", dtype=torch.bfloat16):\n    loss = model(x)")],
)
def xla_autocast(site, ctx):
    if site.kind == "ref":
        return ctx.finding(site, "torch_xla.amp.autocast used as a value: use functools.partial(torch.autocast, \"neuron\", dtype=torch.bfloat16)")
    call = site.call
    if has_star_args(call):
        return ctx.finding(site, "torch_xla.amp.autocast with *args/**kwargs: use torch.autocast(\"neuron\", dtype=torch.bfloat16) by hand")
    fx = ctx.fixer()
    torch = fx.ref("torch")
    dtype = kwarg(call, "dtype", 2)
    if dtype is None or (isinstance(dtype, ast.Constant) and dtype.value is None):
        dtype_src = f"{torch}.bfloat16"
    elif isinstance(dtype, (ast.Attribute, ast.Constant)):
        dtype_src = ctx.src(dtype)
    else:
        dtype_src = f"{ctx.src(dtype)} or {torch}.bfloat16"
    device_type = '"neuron"' if ctx.settings.device_style != "accelerator" else f"{torch}.accelerator.current_accelerator().type"
    parts = [device_type, f"dtype={dtype_src}"]
    for name, pos in (("enabled", 1), ("cache_enabled", 3)):
        v = kwarg(call, name, pos)
        if v is not None:
            parts.append(f"{name}={ctx.src(v)}")
    fx.replace(call, f"{torch}.autocast({', '.join(parts)})")
    return ctx.finding(site, "torch_xla.amp.autocast: becomes torch.autocast(\"neuron\", ...) (bfloat16 by default)", fix=fx.build(),
                       note="On torch_xla <= 2.5 this autocast did nothing on Neuron: check accuracy, the model now really runs in mixed precision.")


# -- NM132 ------------------------------------------------------------------------------------------
@rule(
    code="NM132",
    name="xla-checkpoint",
    summary="torch_xla.utils.checkpoint.checkpoint becomes torch.utils.checkpoint.checkpoint(..., use_reentrant=True)",
    fix="safe",
    severity="warning",
    triggers=[("call", "torch_xla.utils.checkpoint.checkpoint"), ("ref", "torch_xla.utils.checkpoint.checkpoint")],
    docs=f"""
        torch_xla ships a copy of activation checkpointing (`torch_xla.utils.checkpoint.checkpoint`) that
        defaults to `use_reentrant=True`; TorchNeuron supports the standard `torch.utils.checkpoint` ({NATIVE_FAQ}).
        Current PyTorch warns when `use_reentrant` is not passed (and later releases raise), so the fix
        passes `use_reentrant=True` explicitly when the call does not, keeping the old behaviour
        (`use_reentrant=False` is recommended by PyTorch and usually works too). Used as a value
        (`ckpt = checkpoint`), the name becomes `functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=True)`.
    """,
    examples=[("from torch_xla.utils.checkpoint import checkpoint\ny = checkpoint(block, x)",
               "import torch.utils.checkpoint\nfrom torch_xla.utils.checkpoint import checkpoint\ny = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=True)")],
)
def xla_checkpoint(site, ctx):
    fx = ctx.fixer()
    target = fx.name("torch.utils.checkpoint.checkpoint", site.scope)
    if site.kind == "ref":
        fx.replace(site.node, f"{fx.ref('functools')}.partial({target}, use_reentrant=True)")
        return ctx.finding(site, "torch_xla checkpoint used as a value: becomes functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=True)", fix=fx.build())
    call = site.call
    if any(k.arg is None for k in call.keywords) or kwarg(call, "use_reentrant") is not None:
        fx.replace(call.func, target)
    else:
        args = [ctx.src(a) for a in call.args] + [f"{k.arg}={ctx.src(k.value)}" for k in call.keywords]
        fx.replace(call, f"{target}({', '.join([*args, 'use_reentrant=True'])})")
    return ctx.finding(site, "torch_xla checkpoint: becomes torch.utils.checkpoint.checkpoint with use_reentrant passed explicitly", fix=fx.build())


# -- NM133 ------------------------------------------------------------------------------------------
def _scope_body_nodes(scope_node):
    """Nodes of one scope, not descending into nested functions, lambdas or classes (yielded, not entered)."""
    stack = list(scope_node.body) if isinstance(scope_node.body, list) else [scope_node.body]
    while stack:
        n = stack.pop()
        yield n
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        stack.extend(child_nodes(n))


def _nested_mentions(scope_node, name: str) -> bool:
    for n in _scope_body_nodes(scope_node):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            if any(isinstance(m, ast.Name) and m.id == name for m in walk(n)):
                return True
    return False


def _scope_names(analysis, scope) -> tuple:
    """({name: stores}, names with a load that is not the first argument of xm.set_rng_state, names mentioned in
    nested code) of one scope's body, made once per scope (a scan per get_rng_state call was quadratic)."""
    def build(_a) -> tuple:
        stores: dict = {}
        bad_loads, nested = set(), set()
        for n in _scope_body_nodes(scope.node):
            if isinstance(n, ast.Name):
                if isinstance(n.ctx, ast.Store):
                    stores[n.id] = stores.get(n.id, 0) + 1
                    continue
                call = analysis.parent_of.get(n)
                if not (isinstance(call, ast.Call) and call.args and call.args[0] is n and
                        analysis.resolve(call.func, scope, count_use=False) == f"{XM}.set_rng_state"):
                    bad_loads.add(n.id)
            elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                nested.update(m.id for m in walk(n) if isinstance(m, ast.Name))
        return stores, bad_loads, nested

    return cached(analysis, f"rng scope names:{id(scope.node)}", build)


def _rng_facts(analysis):
    """Which xm.get_rng_state() / xm.set_rng_state() calls form save/restore pairs in this file.

    A pair is `state = xm.get_rng_state()` whose name (assigned once in its scope, not seen by nested
    code) is only ever passed as the first argument of `xm.set_rng_state(...)` in the same scope.
    """
    gets = [s for s in analysis.sites if s.kind == "call" and s.key == f"{XM}.get_rng_state"]
    paired_gets, paired_names, unpaired = set(), set(), 0
    for g in gets:
        parent = g.parent
        ok = False
        if isinstance(parent, ast.Assign) and len(parent.targets) == 1 and isinstance(parent.targets[0], ast.Name):
            name = parent.targets[0].id
            stores, bad_loads, nested = _scope_names(analysis, g.scope)
            ok = stores.get(name, 0) == 1 and name not in bad_loads and name not in nested
            if ok:
                paired_gets.add(g.node)
                paired_names.add((id(g.scope), name))
        unpaired += not ok
    return paired_gets, paired_names, unpaired


def _restores_state(seed, site, facts) -> bool:
    """The set_rng_state argument may be a state saved by an unpaired xm.get_rng_state()."""
    if not facts[2]:
        return False
    if isinstance(seed, ast.Constant):
        return False
    if isinstance(seed, ast.Name):
        for n in _scope_body_nodes(site.scope.node):
            if (isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == seed.id for t in n.targets)
                    and isinstance(n.value, ast.Call)
                    and site.analysis.resolve(n.value.func, site.scope, count_use=False) == f"{XM}.get_rng_state"):
                return True
        return False
    return not isinstance(seed, ast.BinOp)


@rule(
    code="NM133",
    name="xla-rng-seed",
    summary="xm.set_rng_state(seed) / torch_xla.manual_seed(seed) seed the device; xm.get_rng_state() returns an int seed",
    fix="safe",
    severity="warning",
    triggers=[("call", f"{XM}.set_rng_state"), ("call", "torch_xla.manual_seed"), ("call", "torch_xla.torch_xla.manual_seed"),
              ("call", f"{XM}.get_rng_state"), ("ref", f"{XM}.set_rng_state"), ("ref", "torch_xla.manual_seed"), ("ref", f"{XM}.get_rng_state")],
    docs="""
        `xm.set_rng_state(seed, device=None)` and `torch_xla.manual_seed(seed)` set the XLA device generator's
        *seed* (an int, not a state tensor). They become `torch.neuron.manual_seed(seed)`, which seeds the
        current NeuronCore only, exactly like before (`torch.neuron` is the device module TorchNeuron registers;
        under torchrun each process has one core). With `device-style = "accelerator"` the fix writes
        `torch.manual_seed(seed)` instead and is unsafe, because that also reseeds the CPU generator.
        `xm.get_rng_state()` returns that int seed, while `torch.neuron.get_rng_state()` returns a ByteTensor
        state: code that stores, compares or broadcasts the value (accelerate keeps `states["xm_seed"]`) is
        reported; use `torch.neuron.get_rng_state()` / `set_rng_state()` as a pair or `torch.random.fork_rng`.
        The two migrate together or not at all: `state = xm.get_rng_state()` whose name only ever reaches
        `xm.set_rng_state(state)` in the same function becomes `torch.neuron.get_rng_state()` /
        `torch.neuron.set_rng_state(state)` (a save/restore of the device generator, as before); while an
        `xm.get_rng_state()` stays, a `set_rng_state` argument that may hold its value is reported, not seeded.
    """,
    examples=[("xm.set_rng_state(args.seed)", "torch.neuron.manual_seed(args.seed)")],
)
def xla_rng_seed(site, ctx):
    short = "xm.get_rng_state" if site.key.endswith("get_rng_state") else "xm.set_rng_state" if site.key.endswith("set_rng_state") else "torch_xla.manual_seed"
    facts = cached(ctx.analysis, "xla_rng_pairs", _rng_facts)
    accelerator = ctx.settings.device_style == "accelerator"
    if short == "xm.get_rng_state":
        if site.kind == "call" and site.node in facts[0] and not accelerator:
            fx = ctx.fixer()
            fx.replace(site.call, f"{fx.ref('torch')}.neuron.get_rng_state()")
            return ctx.finding(site, "xm.get_rng_state() saved the device generator for xm.set_rng_state(): the pair becomes "
                                     "torch.neuron.get_rng_state() / set_rng_state()", fix=fx.build())
        return ctx.finding(site, "xm.get_rng_state() returns an int seed; torch.neuron.get_rng_state() returns a ByteTensor: "
                                 "save/restore with torch.neuron.get_rng_state()/set_rng_state() as a pair, or use torch.random.fork_rng")
    if site.kind == "ref":
        return ctx.finding(site, f"{short} used as a value: use torch.neuron.manual_seed (same (seed) call)")
    call = site.call
    seed = kwarg(call, "seed", 0)
    if seed is None or has_star_args(call):
        return ctx.finding(site, f"{short} without a plain seed argument: call torch.neuron.manual_seed(seed) by hand")
    fx = ctx.fixer()
    torch = fx.ref("torch")
    if short == "xm.set_rng_state" and isinstance(seed, ast.Name) and (id(site.scope), seed.id) in facts[1]:
        if accelerator:
            return ctx.finding(site, "xm.set_rng_state() restores a state saved by xm.get_rng_state(): use the device module's "
                                     "get_rng_state()/set_rng_state() pair (torch.neuron on Neuron) by hand")
        fx.replace(call, f"{torch}.neuron.set_rng_state({ctx.src(seed)})")
        return ctx.finding(site, "xm.set_rng_state() restores the state saved by xm.get_rng_state(): the pair becomes "
                                 "torch.neuron.get_rng_state() / set_rng_state()", fix=fx.build())
    if short == "xm.set_rng_state" and _restores_state(seed, site, facts):
        return ctx.finding(site, "xm.set_rng_state() may restore a value saved by xm.get_rng_state(), which stays: migrate the two "
                                 "together (torch.neuron.get_rng_state() / set_rng_state())")
    if accelerator:
        fx.replace(call, f"{torch}.manual_seed({ctx.src(seed)})")
        return ctx.finding(site, f"{short}: becomes torch.manual_seed(seed) (also reseeds the CPU generator)", fix=fx.build("unsafe"))
    fx.replace(call, f"{torch}.neuron.manual_seed({ctx.src(seed)})")
    return ctx.finding(site, f"{short}: becomes torch.neuron.manual_seed(seed)", fix=fx.build())


# NM141 (XLA FSDP auto-wrap policies) lives with NM151 in xla_fsdp.py: they migrate together.


# -- NM134 ------------------------------------------------------------------------------------------
@rule(
    code="NM134",
    name="xla-fork-rng",
    summary="xm.fork_rng() becomes torch.random.fork_rng(device_type=\"neuron\")",
    fix="unsafe",
    severity="warning",
    triggers=[("call", f"{XM}.fork_rng"), ("ref", f"{XM}.fork_rng")],
    docs="""
        `xm.fork_rng(device=None, enabled=True)` saves the XLA generator seed and restores it on exit. The native
        context manager is `torch.random.fork_rng(device_type="neuron", enabled=...)`; its first positional
        parameter is a list of devices, so the XLA `device` argument is dropped. Unsafe: the native version
        also forks the CPU generator, so CPU random numbers drawn inside the block no longer advance the outer
        CPU stream.
    """,
    examples=[("with xm.fork_rng():\n    noise = torch.randn(4)", "with torch.random.fork_rng(device_type=\"neuron\"):\n    noise = torch.randn(4)")],
)
def xla_fork_rng(site, ctx):
    if site.kind == "ref":
        return ctx.finding(site, "xm.fork_rng used as a value: use functools.partial(torch.random.fork_rng, device_type=\"neuron\")")
    call = site.call
    if has_star_args(call):
        return ctx.finding(site, "xm.fork_rng with *args/**kwargs: use torch.random.fork_rng(device_type=\"neuron\") by hand")
    fx = ctx.fixer()
    parts = ['device_type="neuron"']
    enabled = kwarg(call, "enabled", 1)
    if enabled is not None:
        parts.append(f"enabled={ctx.src(enabled)}")
    fx.replace(call, f"{fx.ref('torch')}.random.fork_rng({', '.join(parts)})")
    return ctx.finding(site, "xm.fork_rng: becomes torch.random.fork_rng(device_type=\"neuron\") (also forks the CPU generator)", fix=fx.build())


# -- NM135 ------------------------------------------------------------------------------------------
_REPORTS = (f"{MET}.metrics_report", f"{MET}.short_metrics_report")
_CLEARS = (f"{MET}.clear_all", f"{MET}.clear_counters", f"{MET}.clear_metrics")
_MET_OTHER = (f"{MET}.counter_names", f"{MET}.counter_value", f"{MET}.metric_names", f"{MET}.metric_data",
              f"{MET}.executed_fallback_ops")
_LOG_METHODS = {"debug", "info", "warning", "warn", "error", "critical", "exception", "log", "print"}
_MET_ADVICE = ("TorchNeuron has no XLA metrics: use torch_neuronx.get_fallback_ops() for ops that ran on CPU, "
               "torch.neuron.get_dynamo_metrics() and TORCH_LOGS=graph_breaks,recompiles for torch.compile")


def _only_printed(site, ctx) -> bool:
    """The call is an argument (maybe inside an f-string) of a print/log call that is a whole statement."""
    node = site.node
    parent = site.parent
    while isinstance(parent, (ast.FormattedValue, ast.JoinedStr)):
        node, parent = parent, ctx.analysis.parent_of.get(parent)
    if not isinstance(parent, ast.Call) or node not in parent.args:
        return False
    if not isinstance(ctx.analysis.parent_of.get(parent), ast.Expr):
        return False
    func = parent.func
    q = ctx.analysis.resolve(func, site.scope, count_use=False)
    printing = (isinstance(func, ast.Name) and func.id.endswith("print")) or q == f"{XM}.master_print" or (
        q is None and isinstance(func, ast.Attribute) and (func.attr in _LOG_METHODS or func.attr.endswith("print")))
    if not printing:
        return False
    # nothing else with side effects in the arguments
    for a in [*parent.args, *[k.value for k in parent.keywords]]:
        if a is node:
            continue
        if any(isinstance(n, (ast.Call, ast.Await, ast.NamedExpr, ast.Yield, ast.YieldFrom)) for n in walk(a)):
            return False
    return True


@rule(
    code="NM135",
    name="xla-metrics",
    summary="torch_xla.debug.metrics reports and counters do not exist on TorchNeuron",
    fix="safe",
    severity="warning",
    triggers=[*[("call", q) for q in (*_REPORTS, *_CLEARS, *_MET_OTHER)], *[("ref", q) for q in (*_REPORTS, *_MET_OTHER)]],
    docs="""
        `met.metrics_report()` describes lazy-tensor compilation and transfers; TorchNeuron has no such counters.
        A statement that only prints or logs the report (`print(met.metrics_report())`,
        `xm.master_print(met.short_metrics_report())`, `logger.info(f"{met.metrics_report()}")`) is removed, as are
        `met.clear_*()` statements; an `if FLAGS.metrics_debug:` left empty goes with it, and the rewrite's notes
        name each removed report (and the flag that no longer does anything) at its line. Any other use (tests asserting `met.counter_value("aten::...")`, reports
        written to files) is reported. What to use instead: `torch_neuronx.get_fallback_ops()` lists the ops
        that fell back to CPU in eager mode, `torch.neuron.get_dynamo_metrics()` and
        `TORCH_LOGS=graph_breaks,recompiles` show torch.compile graph breaks and recompiles
        (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/torch/index.html).
    """,
    examples=[("xm.master_print(met.metrics_report())", "")],
)
def xla_metrics(site, ctx):
    name = "met." + site.key.rsplit(".", 1)[1]
    if site.kind == "call" and site.key in _CLEARS and site.is_statement:
        fx = ctx.fixer()
        fx.delete(site.stmt)
        return ctx.finding(site, f"{name}() clears XLA metrics that do not exist on TorchNeuron: removed", fix=fx.build())
    if site.kind == "call" and site.key in _REPORTS and _only_printed(site, ctx):
        fx = ctx.fixer()
        fx.delete(site.stmt)
        stmt = site.stmt
        holder = ctx.analysis.parent_of.get(stmt)
        if isinstance(holder, ast.If) and holder.body == [stmt] and not holder.orelse:
            note = (f"removed `if {ctx.src(holder.test)}:` and the metrics report it printed: {ctx.src(holder.test)} no longer "
                    f"does anything here; {_MET_ADVICE}")
        else:
            note = f"removed `{ctx.src(stmt).strip()}`: {_MET_ADVICE}"
        return ctx.finding(site, f"{name}() only printed: removed ({_MET_ADVICE})", fix=fx.build(), note=note)
    return ctx.finding(site, f"{name} has no TorchNeuron equivalent: {_MET_ADVICE}")


# -- NM136 ------------------------------------------------------------------------------------------
@rule(
    code="NM136",
    name="xla-profiler",
    summary="torch_xla.debug.profiler traces become torch.profiler.record_function; the profile server goes",
    fix="safe",
    severity="warning",
    triggers=[("call", f"{XP}.StepTrace"), ("call", f"{XP}.Trace"), ("call", f"{XP}.start_server"),
              ("call", f"{XP}.trace"), ("call", f"{XP}.trace_detached"), ("call", f"{XP}.trace_me"),
              ("call", f"{XP}.start_trace"), ("call", f"{XP}.stop_trace"),
              ("ref", f"{XP}.StepTrace"), ("ref", f"{XP}.Trace"), ("ref", f"{XP}.trace_me")],
    docs="""
        `with xp.StepTrace(name, step_num=i):` and `with xp.Trace(name):` annotate a region for the XLA
        profiler; `StepTrace` also cut the lazy graph on exit, which eager TorchNeuron does not need. Both
        become `torch.profiler.record_function(name)`, which labels the region in `torch.profiler` traces.
        `xp.start_server(port)` as a statement (it starts the XLA profiler's gRPC server) is removed, and so are
        the capture statements (`xp.trace(...)`, `trace_detached`, `start_trace`/`stop_trace`), each named with
        its line in the rewrite's notes, since no XLA profile is written any more: profile with
        `torch.profiler.profile(...)` and the Neuron profiler (Neuron Explorer) instead. The `@xp.trace_me(name)`
        decorator becomes `@torch.profiler.record_function(name)`. Their values used elsewhere are reported.
    """,
    examples=[("import torch_xla.debug.profiler as xp\nwith xp.StepTrace('train', step_num=step):\n    train_step()", "import torch.profiler\nwith torch.profiler.record_function('train'):\n    train_step()")],
)
def xla_profiler(site, ctx):
    short = site.key.rsplit(".", 1)[1]
    advice = "profile with torch.profiler.profile(...) (regions labelled by torch.profiler.record_function) or the Neuron profiler"
    if site.kind == "ref":
        return ctx.finding(site, f"xp.{short} used as a value: {advice}")
    call = site.call
    if short in ("StepTrace", "Trace"):
        name = kwarg(call, "name", 0)
        if name is None or has_star_args(call):
            return ctx.finding(site, f"xp.{short} without a plain name: use torch.profiler.record_function(name) by hand")
        fx = ctx.fixer()
        fx.replace(call, f"{fx.ref('torch.profiler')}.record_function({ctx.src(name)})")
        extra = [k.arg for k in call.keywords if k.arg != "name"] + (["positional arguments"] if len(call.args) > 1 else [])
        note = f"Dropped {', '.join(extra)}." if extra else ""
        return ctx.finding(site, f"xp.{short}: becomes torch.profiler.record_function (eager: no graph cut on exit)", fix=fx.build(), note=note)
    if short == "start_server" and site.is_statement:
        fx = ctx.fixer()
        fx.delete(site.stmt)
        return ctx.finding(site, f"xp.start_server starts the XLA profiler server: removed; {advice}", fix=fx.build(),
                           note=f"removed `{ctx.src(site.stmt).strip()}` (the XLA profiler's server); {advice}")
    if short in ("trace", "trace_detached", "start_trace", "stop_trace") and site.is_statement:
        fx = ctx.fixer()
        fx.delete(site.stmt)
        return ctx.finding(site, f"xp.{short} captured an XLA profile: removed; {advice}", fix=fx.build(),
                           note=f"removed `{ctx.src(site.stmt).strip()}`: no XLA profile is captured any more; {advice}")
    if short == "trace_me" and isinstance(site.parent, (ast.FunctionDef, ast.AsyncFunctionDef)) and site.node in site.parent.decorator_list:
        name = kwarg(call, "scope", 0)
        if name is not None and not has_star_args(call) and len(call.args) + len(call.keywords) == 1:
            fx = ctx.fixer()
            fx.replace(call, f"{fx.ref('torch.profiler')}.record_function({ctx.src(name)})")
            return ctx.finding(site, "@xp.trace_me: becomes @torch.profiler.record_function (a decorator too)", fix=fx.build())
    return ctx.finding(site, f"xp.{short} is XLA-profiler specific: {advice}")


# -- NM139 ------------------------------------------------------------------------------------------
_AVAILABLE = [f"{lib}.{mod}is_torch_xla_available" for lib in ("transformers", "accelerate", "diffusers", "optimum.neuron")
              for mod in ("", "utils.", "utils.import_utils.", "utils.imports.")]
_AVAILABLE += [a.replace("is_torch_xla_available", "is_torch_tpu_available") for a in _AVAILABLE if a.startswith("transformers")]
_GUARD_ADVICE = ("after migration uninstall torch-xla (or set USE_TORCH_XLA=0 for Hugging Face libraries), "
                 "otherwise the XLA branch stays active; collapse the check to the native branch")


@rule(
    code="NM139",
    name="xla-version-gate",
    summary="torch_xla version checks and availability flags keep XLA code paths alive",
    fix="none",
    severity="info",
    triggers=[("ref", "torch_xla.__version__"), ("ref", "torch_xla.version.__version__"), ("string", "torch_xla*"), ("string", "torch-xla*"),
              *[("call", a) for a in _AVAILABLE], *[("ref", a) for a in _AVAILABLE]],
    docs="""
        Code gates behaviour on torch_xla: `torch_xla.__version__` comparisons, Lightning's
        `RequirementCache("torch_xla>=2.1")`, `importlib.util.find_spec("torch_xla")`, Hugging Face's
        `is_torch_xla_available()`. Such a flag often gates non-XLA behaviour too (diffusers moves timesteps to
        the CPU when it is set). After migration the gate is either always false (torch-xla uninstalled: the
        branch is dead code) or, worse, still true when torch-xla stays installed, and Hugging Face
        accelerate/transformers then take their XLA paths. Each gate is reported: collapse it to the native
        branch, and uninstall torch-xla or set `USE_TORCH_XLA=0`.
    """,
    examples=[("if torch_xla.__version__ >= '2.5':\n    pass", None)],
)
def xla_version_gate(site, ctx):
    if site.kind == "string":
        parent = site.parent
        if not (isinstance(parent, ast.Call) and site.node in parent.args) and not (
                isinstance(parent, ast.keyword) and isinstance(ctx.analysis.parent_of.get(parent), ast.Call)):
            return None  # a message or a name, not a package check
        value = site.node.value
        if isinstance(parent, ast.Call) and any(isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith(("torch_xla", "torch-xla"))
                                                for a in parent.args[: parent.args.index(site.node)]):
            return None  # one finding per call
        if not (value in ("torch_xla", "torch-xla") or value[len("torch_xla"):][:1] in ("<", ">", "=", "!", "~", "[")):
            return None
        return ctx.finding(site, f"package check on {ctx.src(site.node)}: {_GUARD_ADVICE}")
    if site.key.endswith("__version__"):
        return ctx.finding(site, f"torch_xla version gate: {_GUARD_ADVICE}")
    return ctx.finding(site, f"{site.key.rsplit('.', 1)[1]}(): {_GUARD_ADVICE}")


# -- catch-alls -------------------------------------------------------------------------------------
@rule(
    code="NM190",
    name="torch-xla-star-import",
    summary="`from torch_xla... import *` hides which torch_xla names the code uses",
    fix="none",
    severity="warning",
    triggers=[("star_import", "torch_xla*")],
    docs="""
        A star import binds torch_xla names without naming them, so no rule can see (or rewrite) their uses.
        Replace it with explicit imports (`import torch_xla.core.xla_model as xm`) and run the migration
        again.
    """,
    examples=[("from torch_xla.core.xla_model import *", None)],
)
def xla_star_import(site, ctx):
    return ctx.finding(site, f"star import from {site.key}: import the names explicitly, then run neuron-migrate again")


@rule(
    code="NM191",
    name="torch-xla-monkey-patch",
    summary="assigning to a torch_xla attribute (monkey-patching) changes what later torch_xla calls do",
    fix="none",
    severity="warning",
    triggers=[("store", "torch_xla*")],
    docs="""
        Code such as `xm.optimizer_step = patched_step` (transformers did this under XLA FSDP) changes what later
        torch_xla calls do, so rewriting those calls by their documented meaning would be wrong. The patch is
        reported: move its logic into the native code that replaces the patched function, and delete it.
    """,
    examples=[("xm.optimizer_step = lambda opt, **kw: opt.step()", None)],
)
def xla_monkey_patch(site, ctx):
    if not isinstance(site.node, ast.Attribute):
        return None  # `xm = None` rebinds the local name (import guards), it patches nothing
    return ctx.finding(site, f"`{ctx.src(site.node)}` is monkey-patched: later calls do not behave as documented; "
                             "move the patch's logic into the native replacement and delete the assignment")


@rule(
    code="NM199",
    name="torch-xla-reference",
    summary="a torch_xla API no other rule migrates",
    fix="none",
    severity="warning",
    triggers=[("call", "torch_xla*"), ("ref", "torch_xla*")],
    docs=f"""
        The fallback for every torch_xla call or reference that no specific rule handled, so that nothing
        torch_xla is left behind silently after `rewrite --write` (torch-xla is not installed with
        TorchNeuron). TorchNeuron is native PyTorch on the `neuron` device: find the native equivalent
        (`torch.*`, `torch.distributed` with the `neuron` backend, `torch.neuron` device module,
        `torch.compile(backend="neuron")`), or remove the call when it only served the lazy-tensor runtime.
        See {RELEASE_NOTES}.
    """,
    examples=[("torch_xla.core.xla_model.some_new_api()", None)],
)
def torch_xla_reference(site, ctx):
    what = "used as a value" if site.kind == "ref" else "called"
    return ctx.finding(site, f"`{site.key}` ({what}) has no automatic migration: replace it with native PyTorch on the neuron device "
                             "(torch.*, torch.distributed backend \"neuron\", torch.neuron), or remove it if it only served the XLA runtime")


# -- NM144-NM146: torch_xla's pure-Python utilities -------------------------------------------------
XU = "torch_xla.utils.utils"
TU = "torch_xla.test.test_utils"

HELPERS["_RateTracker"] = Helper(
    '''class _RateTracker:
    """Examples per second, smoothed over the calls to rate() (what xm.RateTracker computed)."""

    def __init__(self, smooth_factor=None):
        if smooth_factor is None:
            smooth_factor = float({os}.environ.get("RATE_TRACKER_SMOOTHING", 0.4))
        self._smooth_factor = smooth_factor
        self._start_time = self._partial_time = {time}.time()
        self._partial_count = self._count = 0.0
        self._partial_rate = None

    def add(self, count):
        self._count += count

    def rate(self):
        now = {time}.time()
        delta = now - self._partial_time
        if delta <= 0:
            return 0.0
        rate = self._count / delta
        if self._partial_rate is not None:
            rate = (1 - self._smooth_factor) * rate + self._smooth_factor * self._partial_rate
        self._partial_count += self._count
        self._count = 0.0
        self._partial_time, self._partial_rate = now, rate
        return rate

    def global_rate(self):
        delta = {time}.time() - self._start_time
        return (self._partial_count + self._count) / delta if delta > 0 else 0.0
''',
    {"os": "os", "time": "time"},
)
HELPERS["_print_training_update"] = Helper(
    '''def _print_training_update(device, step, loss, rate, global_rate, epoch=None, summary_writer=None):
    """One training log line, and the rates to TensorBoard with a writer (as test_utils.print_training_update did)."""
    epoch_field = f" Epoch={{epoch}}" if epoch is not None else ""
    print(f"| Training Device={{device}}{{epoch_field}} Step={{step}} Loss={{loss:.5f}} Rate={{rate:.2f}} "
          f"GlobalRate={{global_rate:.2f}} Time={{{datetime}.datetime.now():%H:%M:%S}}", flush=True)
    if summary_writer:
        summary_writer.add_scalar("examples/sec", rate)
        summary_writer.add_scalar("average_examples/sec", global_rate)
''',
    {"datetime": "datetime"},
)
HELPERS["_summary_writer"] = Helper(
    '''def _summary_writer(logdir):
    """A TensorBoard writer for `logdir`, or None without one (as test_utils.get_summary_writer did)."""
    if not logdir:
        return None
    from tensorboardX import SummaryWriter

    writer = SummaryWriter(log_dir=logdir)
    writer.add_scalar("TensorboardStartTimestamp", {time}.time(), 0)
    return writer
''',
    {"time": "time"},
)


def _datetime_class(fx, scope) -> str:
    """Local spelling of datetime.datetime: `datetime` after `from datetime import datetime`, else datetime.datetime."""
    bound = fx.ctx.analysis.binding_for("datetime.datetime", scope)
    return bound or f"{fx.ref('datetime')}.datetime"


# -- NM144 under --unsafe-fixes: the usual tracker as a plain namespace --------------------------
_TRACKER_METHODS = ("add", "rate", "global_rate")
_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _rate_text(node, name: str, time_ref: str, parent) -> str:
    """`name.seen / (time.time() - name.start)`, in parentheses where the operator precedence at `node` needs them."""
    text = f"{name}.seen / ({time_ref}.time() - {name}.start)"
    free = (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Return, ast.Expr, ast.keyword, ast.Call, ast.FormattedValue,
            ast.Tuple, ast.List, ast.Set, ast.Dict, ast.Compare, ast.BoolOp, ast.IfExp)
    if isinstance(parent, ast.Call) and node is parent.func:
        return f"({text})"
    if isinstance(parent, free):
        return text
    if isinstance(parent, ast.BinOp) and (isinstance(parent.op, (ast.Add, ast.Sub))
                                          or (node is parent.left and isinstance(parent.op, (ast.Mult, ast.Div, ast.FloorDiv, ast.Mod)))):
        return text
    return f"({text})"


def _tracker_use_edits(use: ast.Name, time_ref: str, ctx):
    """(node, text) replacing one use of a tracker name that is `.rate()`, `.global_rate()` or `.add(n)` as a
    statement; None for any other use."""
    a = ctx.analysis
    attr = a.parent_of.get(use)
    call = a.parent_of.get(attr)
    if not (isinstance(attr, ast.Attribute) and attr.value is use and attr.attr in _TRACKER_METHODS
            and isinstance(call, ast.Call) and call.func is attr):
        return None
    name = use.id
    if attr.attr == "add":
        stmt = a.parent_of.get(call)
        if not (isinstance(stmt, ast.Expr) and len(call.args) == 1 and not call.keywords):
            return None
        count = call.args[0]
        if isinstance(count, (ast.Starred, ast.GeneratorExp, ast.Yield, ast.YieldFrom)):
            return None
        src = ctx.args_src(call)
        if _ends_with_comma(src):
            if "\n" in src:
                return None
            src = ctx.src_relative(count)
        if "\n" in src or isinstance(count, ast.NamedExpr):
            src = f"({src})"  # the comments and line breaks inside the call's parentheses stay
        return stmt, f"{name}.seen += {src}"
    if call.args or call.keywords:
        return None
    return call, _rate_text(call, name, time_ref, a.parent_of.get(call))


def _ends_with_comma(text: str) -> bool:
    """The last token of `text` (comments and line breaks aside) is a comma: `n,` would make a tuple."""
    import io
    import tokenize

    last = None
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.ENDMARKER, tokenize.INDENT, tokenize.DEDENT):
                last = tok.string
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return True  # cannot tell: treat as the unsafe case
    return last == ","


def _only_binding(tree, fname: str):
    """The module-level or nested def named `fname` when it is the file's only binding of that name, else None."""
    found = []
    for n in walk(tree):
        if isinstance(n, (*_FUNCS, ast.ClassDef)) and n.name == fname:
            found.append(n)
        elif isinstance(n, ast.Name) and n.id == fname and not isinstance(n.ctx, ast.Load):
            return None
        elif isinstance(n, ast.alias) and (n.asname or n.name.split(".")[0]) == fname:
            return None
        elif isinstance(n, ast.arg) and n.arg == fname:
            return None
        elif isinstance(n, (ast.Global, ast.Nonlocal)) and fname in n.names:
            return None
    if len(found) != 1 or not isinstance(found[0], _FUNCS) or found[0].decorator_list:
        return None
    return found[0]


def _closure_call(use, ctx, scope):
    """(closure function node, argument index) when `use` is an element of `xm.add_step_closure(fn, args=(...))`."""
    a = ctx.analysis
    seq = a.parent_of.get(use)
    call = _call_of_argument(seq, a)
    if not (isinstance(seq, (ast.Tuple, ast.List)) and isinstance(call, ast.Call)
            and a.resolve(call.func, scope, count_use=False) == f"{XM}.add_step_closure"):
        return None
    if has_star_args(call) or any(isinstance(e, ast.Starred) for e in seq.elts) or kwarg(call, "args", 1) is not seq:
        return None
    fn = kwarg(call, "closure", 0)
    return (fn, seq.elts.index(use)) if isinstance(fn, ast.Name) else None


def _call_of_argument(node, a):
    """The call that `node` is an argument of, positionally or by keyword (else the node's parent)."""
    parent = a.parent_of.get(node)
    return a.parent_of.get(parent) if isinstance(parent, ast.keyword) else parent


def _passed_to(use, ctx, scope):
    """(function name node, argument index) when `use` is a positional argument of a call of a plain name, directly
    or through xm.add_step_closure."""
    a = ctx.analysis
    call = a.parent_of.get(use)
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and use in call.args:
        if any(isinstance(x, ast.Starred) for x in call.args) or any(k.arg is None for k in call.keywords):
            return None
        return call.func, call.args.index(use)
    return _closure_call(use, ctx, scope)


def _tracker_param_edits(fn, index: int, name: str, time_refs: dict, fx, ctx):
    """The edits inside `fn` when its parameter `index` (always given our tracker, positionally) is only used as a
    tracker; None otherwise."""
    params = [*fn.args.posonlyargs, *fn.args.args]
    if index >= len(params):
        return None
    p = params[index].arg
    if _nested_mentions(fn, p):
        return None
    fn_scope = ctx.analysis.scope_of.get(fn)
    time_ref = fx.ref("time", fn_scope)
    if fn_scope is None or time_ref != time_refs.setdefault("ref", time_ref):
        return None
    edits = []
    for n in _scope_body_nodes(fn):
        if isinstance(n, (ast.Global, ast.Nonlocal)) and p in n.names:
            return None
        if not (isinstance(n, ast.Name) and n.id == p):
            continue
        if not isinstance(n.ctx, ast.Load):
            return None
        edit = _tracker_use_edits(n, time_ref, ctx)
        if edit is None:
            return None
        edits.append(edit)
    return edits


def _plain_tracker_fix(site, ctx):
    """Under --unsafe-fixes: the Fix that makes `name = xm.RateTracker()` a SimpleNamespace(start, seen) and each
    use plain arithmetic, when every use of the tracker in this file is visible and one of the known forms; else None."""
    a = ctx.analysis
    call, assign, scope = site.node, site.parent, site.scope
    scope_node = scope.node
    if call.args or call.keywords or not isinstance(scope_node, _FUNCS):
        return None  # smooth_factor= (or anything) given: the smoothing is asked for, keep it
    if not (isinstance(assign, ast.Assign) and assign.value is call and len(assign.targets) == 1
            and isinstance(assign.targets[0], ast.Name)):
        return None
    name = assign.targets[0].id
    if _binds_param(scope_node, name) or _nested_mentions(scope_node, name):
        return None
    fx = ctx.fixer("unsafe")
    time_refs = {"ref": fx.ref("time", scope)}
    edits, done_params, uses = [], set(), []
    for n in _scope_body_nodes(scope_node):
        if isinstance(n, (ast.Global, ast.Nonlocal)) and name in n.names:
            return None
        if isinstance(n, ast.Name) and n.id == name:
            if n is assign.targets[0]:
                continue
            if not isinstance(n.ctx, ast.Load):
                return None  # the name is bound again (another tracker or anything else)
            uses.append(n)
    for n in uses:
        edit = _tracker_use_edits(n, time_refs["ref"], ctx)
        if edit is not None:
            edits.append(edit)
            continue
        passed = _passed_to(n, ctx, scope)
        if passed is None:
            return None
        fname, index = passed
        fn = _only_binding(a.tree, fname.id)
        if fn is None or a.parent_of.get(fn) not in (a.tree, scope_node) or not _only_called_with(fn.name, index, name, scope, ctx):
            return None
        if (fn, index) in done_params:
            continue
        done_params.add((fn, index))
        inner = _tracker_param_edits(fn, index, name, time_refs, fx, ctx)
        if inner is None:
            return None
        edits.extend(inner)
    bound = a.binding_for("types.SimpleNamespace", scope)
    if bound:
        namespace = bound
    elif "SimpleNamespace" not in a.defined_names:
        namespace = fx.member("types.SimpleNamespace")
    else:
        namespace = fx.name("types.SimpleNamespace", scope)
    fx.replace(call, f"{namespace}(start={time_refs['ref']}.time(), seen=0)")
    for node, text in edits:
        fx.replace(node, text)
    return fx


def _binds_param(fn, name: str) -> bool:
    args = fn.args
    return name in [p.arg for p in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg] if p is not None]


def _only_called_with(fname: str, index: int, name: str, scope, ctx) -> bool:
    """Every reference to function `fname` in the file is a call (direct or as a step closure) in `scope` that
    passes the tracker `name` at position `index`."""
    a = ctx.analysis
    in_scope = {id(n) for n in _scope_body_nodes(scope.node)}
    for n in walk(a.tree):
        if not (isinstance(n, ast.Name) and n.id == fname and isinstance(n.ctx, ast.Load)):
            continue
        if id(n) not in in_scope:
            return False
        parent = _call_of_argument(n, a)
        if isinstance(parent, ast.Call) and parent.func is n:
            args = parent.args
            if any(isinstance(x, ast.Starred) for x in args) or any(k.arg is None for k in parent.keywords):
                return False
        elif isinstance(parent, ast.Call) and kwarg(parent, "closure", 0) is n and \
                a.resolve(parent.func, scope, count_use=False) == f"{XM}.add_step_closure":
            seq = kwarg(parent, "args", 1)
            if not isinstance(seq, (ast.Tuple, ast.List)) or any(isinstance(x, ast.Starred) for x in seq.elts):
                return False
            args = seq.elts
        else:
            return False
        if not (len(args) > index and isinstance(args[index], ast.Name) and args[index].id == name):
            return False
    return True


@rule(
    code="NM144",
    name="xla-rate-tracker",
    summary="xm.RateTracker (examples/sec) becomes a small inserted _RateTracker class with the same methods; "
            "with --unsafe-fixes, the usual tracker becomes a start time and a count",
    fix="safe",
    severity="warning",
    triggers=[("call", f"{XM}.RateTracker"), ("ref", f"{XM}.RateTracker")],
    docs="""
        `xm.RateTracker(smooth_factor=None)` is a pure-Python throughput meter: `add(n)` counts examples,
        `rate()` returns examples per second since the previous `rate()` call, smoothed with the previous
        rate (`smooth_factor`, default `RATE_TRACKER_SMOOTHING` or 0.4), and `global_rate()` the average since
        construction. Native PyTorch has no such class, and a whole script should not keep importing torch_xla
        for it, so the safe fix makes the constructor `_RateTracker(...)`: a copy of that logic (about twenty
        lines, time and os only) inserted once into the module. Arguments and calls stay as they are.

        With `--unsafe-fixes`, the tracker of PyTorch/XLA's `test_train_mp_*` scripts needs no class: when
        `tracker = xm.RateTracker()` (no arguments) is assigned once in a function and every use of it in the
        file is `tracker.add(n)` as a statement, `tracker.rate()` or `tracker.global_rate()`, in that function
        or in a function of this file that it is passed to (directly or through `xm.add_step_closure(fn,
        args=(..., tracker, ...))`) and that uses the parameter only that way, the tracker becomes
        `SimpleNamespace(start=time.time(), seen=0)`, `add(n)` becomes `tracker.seen += n`, and both rates become
        `tracker.seen / (time.time() - tracker.start)`. That is torch_xla's `global_rate()` (except that an
        elapsed time of exactly zero divides by zero where torch_xla returned 0.0); `rate()` loses its smoothing
        and reports the average since the tracker was created, not the recent rate: the finding's note says so.
        All edits of one tracker are one fix. Any other use, or a `smooth_factor=` argument, keeps the safe
        `_RateTracker` fix.
    """,
    examples=[("tracker = xm.RateTracker()", "tracker = _RateTracker()"),
              ("def train(loader):\n    tracker = xm.RateTracker()\n    for x in loader:\n        tracker.add(x.shape[0])\n"
               "    print(tracker.rate())",
               "def train(loader):\n    tracker = SimpleNamespace(start=time.time(), seen=0)  # --unsafe-fixes\n"
               "    for x in loader:\n        tracker.seen += x.shape[0]\n    print(tracker.seen / (time.time() - tracker.start))")],
)
def xla_rate_tracker(site, ctx):
    if site.kind == "ref" and _isinstance_or_base(site, ctx):
        return ctx.finding(site, "xm.RateTracker subclassed or tested with isinstance: use the inserted _RateTracker by hand")
    if site.kind == "call" and ctx.settings.unsafe_fixes:
        fx = _plain_tracker_fix(site, ctx)
        if fx is not None:
            return ctx.finding(site, "xm.RateTracker: becomes a start time and a count (SimpleNamespace); its rates are "
                                     "count / elapsed time", fix=fx.build("unsafe"),
                               note="rate() is no longer smoothed: the logged rate is now the average since the tracker "
                                    "was created (global_rate() is unchanged).")
    fx = ctx.fixer()
    name = fx.helper("_RateTracker")
    fx.replace(site.node.func if site.kind == "call" else site.node, name)
    return ctx.finding(site, "xm.RateTracker: becomes _RateTracker, the same examples/sec meter without torch_xla", fix=fx.build())


@rule(
    code="NM145",
    name="xla-sample-generator",
    summary="xu.SampleGenerator(data, sample_count) becomes [data] * sample_count",
    fix="safe",
    severity="warning",
    triggers=[("call", f"{XU}.SampleGenerator"), ("ref", f"{XU}.SampleGenerator")],
    docs="""
        `torch_xla.utils.utils.SampleGenerator(data, sample_count)` stands in for a DataLoader in synthetic-data
        runs: every iteration yields the same `data` object `sample_count` times, it can be iterated again each
        epoch, and `len()` is `sample_count`. A list holding `sample_count` references to `data`,
        `[data] * sample_count`, does exactly that (one reference per batch, no copies). Used as a value it is
        reported.
    """,
    examples=[("import torch_xla.utils.utils as xu\nloader = xu.SampleGenerator(data=(x, y), sample_count=100)", "loader = [(x, y)] * 100")],
)
def xla_sample_generator(site, ctx):
    if site.kind == "ref":
        return ctx.finding(site, "xu.SampleGenerator used as a value: use a list, [data] * sample_count, by hand")
    call = site.call
    data, count = kwarg(call, "data", 0), kwarg(call, "sample_count", 1)
    if data is None or count is None or has_star_args(call) or len(call.args) + len(call.keywords) != 2:
        return ctx.finding(site, "xu.SampleGenerator without plain (data, sample_count) arguments: use [data] * sample_count by hand")
    count_src = ctx.src(count)
    if not isinstance(count, (ast.Name, ast.Attribute, ast.Constant, ast.Call, ast.Subscript)):
        count_src = f"({count_src})"
    text = f"[{ctx.src(data)}] * {count_src}"
    parent = site.parent
    if not isinstance(parent, (ast.Assign, ast.AnnAssign, ast.keyword, ast.Call, ast.Return)):
        text = f"({text})"
    fx = ctx.fixer()
    fx.replace(call, text)
    return ctx.finding(site, "xu.SampleGenerator: becomes [data] * sample_count (the same object, sample_count times, re-iterable, with len())",
                       fix=fx.build())


_TU_FUNCS = ("print_training_update", "print_test_update", "now", "get_summary_writer", "write_to_summary", "close_summary_writer")
_FSTRING_UNSAFE = ('"', "\\", "\n", "#", "{", "}", "lambda")


def _field(ctx, node) -> str | None:
    """Source of an argument for use inside an f-string field on every supported Python, or None."""
    src = ctx.src(node)
    return None if any(c in src for c in _FSTRING_UNSAFE) else src


def _given(node) -> bool:
    return node is not None and not (isinstance(node, ast.Constant) and node.value is None)


def _simple(node) -> bool:
    """Cheap to evaluate twice and free of side effects: a name or an attribute chain on one."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name)


@rule(
    code="NM146",
    name="xla-test-utils",
    summary="torch_xla.test.test_utils logging helpers become print()/TensorBoard calls",
    fix="safe",
    severity="warning",
    triggers=[*[("call", f"{TU}.{f}") for f in _TU_FUNCS], *[("ref", f"{TU}.{f}") for f in _TU_FUNCS]],
    docs="""
        `torch_xla.test.test_utils` holds the logging helpers of PyTorch/XLA's example scripts. Each becomes
        what it did, in plain Python:
        `print_training_update(device, step, loss, rate, global_rate, epoch)` prints
        `| Training Device=... Epoch=... Step=... Loss=... Rate=... GlobalRate=... Time=...` and becomes that
        `print(f"...", flush=True)`; with a `summary_writer=` it also wrote both rates to TensorBoard, which
        needs the rates once, so it becomes a call of an inserted `_print_training_update` with the same
        arguments. `print_test_update(device, accuracy, epoch, step)` becomes its `print(f"| Test ...")`.
        `now(fmt)` is `datetime.now().strftime(fmt)` (default `"%H:%M:%S"`). `get_summary_writer(logdir)`
        becomes `_summary_writer(logdir)`, an inserted function that, like the original, imports
        `tensorboardX` only when a log directory is given (the dependency stays the one the script already
        had), and logs `TensorboardStartTimestamp`. `write_to_summary(writer, step, dict_to_write={...})` with a
        literal dict becomes `if writer is not None:` plus one `writer.add_scalar(tag, value, step)` per entry;
        `write_xla_metrics=True` is dropped with a note (there are no XLA metrics). `close_summary_writer(w)`
        becomes `if w is not None: w.close()` (close flushes). The printed device is the native one
        (`neuron`), without torch_xla's `/ordinal` suffix.
    """,
    examples=[("import torch_xla.test.test_utils as test_utils\ntest_utils.print_test_update(device, accuracy, epoch=epoch)",
               'print(f"| Test Device={device} Epoch={epoch} Accuracy={accuracy:.2f} Time={datetime.datetime.now():%H:%M:%S}", flush=True)')],
)
def xla_test_utils(site, ctx):
    short = site.key.rsplit(".", 1)[1]
    if site.kind == "ref":
        return ctx.finding(site, f"test_utils.{short} used as a value: replace it with print()/SummaryWriter calls by hand")
    call = site.call
    by_hand = ctx.finding(site, f"test_utils.{short} with arguments this rule cannot map: replace it with print()/SummaryWriter calls by hand")
    if has_star_args(call):
        return by_hand
    fx = ctx.fixer()
    if short == "now":
        fmt = kwarg(call, "format", 0)
        fx.replace(call, f"{_datetime_class(fx, site.scope)}.now().strftime({ctx.src(fmt) if fmt is not None else repr('%H:%M:%S')})")
        return ctx.finding(site, "test_utils.now(): becomes datetime.now().strftime(...)", fix=fx.build())
    if short == "get_summary_writer":
        logdir = kwarg(call, "logdir", 0)
        if logdir is None or len(call.args) + len(call.keywords) != 1:
            return by_hand
        fx.replace(call.func, fx.helper("_summary_writer"))
        return ctx.finding(site, "test_utils.get_summary_writer: becomes _summary_writer (tensorboardX, imported only with a log directory, as before)",
                           fix=fx.build())
    if not site.is_statement:
        return by_hand
    if short == "close_summary_writer":
        writer = kwarg(call, "summary_writer", 0)
        if writer is None or not _simple(writer):
            return by_hand
        w = ctx.src(writer)
        fx.replace(site.stmt, f"if {w} is not None:\n    {w}.close()")
        return ctx.finding(site, "test_utils.close_summary_writer: becomes writer.close() (which flushes) when there is a writer", fix=fx.build())
    if short == "write_to_summary":
        writer, step = kwarg(call, "summary_writer", 0), kwarg(call, "global_step", 1)
        scalars, xla_metrics = kwarg(call, "dict_to_write", 2), kwarg(call, "write_xla_metrics", 3)
        if writer is None or not _simple(writer) or not isinstance(scalars, ast.Dict) or None in scalars.keys:
            return by_hand
        w = ctx.src(writer)
        step_src = f", {ctx.src(step)}" if _given(step) else ""
        body = [f"    {w}.add_scalar({ctx.src(k)}, {ctx.src(v)}{step_src})" for k, v in zip(scalars.keys, scalars.values)]
        note = "write_xla_metrics dropped: TorchNeuron has no XLA metrics to log" if _given(xla_metrics) and const_value(xla_metrics, True) else ""
        if body:
            fx.replace(site.stmt, "\n".join([f"if {w} is not None:", *body]))
        else:
            fx.delete(site.stmt)
        return ctx.finding(site, "test_utils.write_to_summary: becomes writer.add_scalar(...) per entry when there is a writer",
                           fix=fx.build(), note=note)
    clock = f"{_datetime_class(fx, site.scope)}.now():%H:%M:%S"
    if short == "print_test_update":
        device, accuracy = kwarg(call, "device", 0), kwarg(call, "accuracy", 1)
        epoch, step = kwarg(call, "epoch", 2), kwarg(call, "step", 3)
        if device is None or len(call.args) + len(call.keywords) > 4:
            return by_hand
        fields = [("Device", device, ""), ("Step", step, ""), ("Epoch", epoch, ""), ("Accuracy", accuracy, ":.2f")]
        kind = "Test"
    else:
        names = ("device", "step", "loss", "rate", "global_rate", "epoch", "summary_writer")
        args = {n: kwarg(call, n, i) for i, n in enumerate(names)}
        if any(args[n] is None for n in names[:5]) or len(call.args) + len(call.keywords) > 7:
            return by_hand
        if _given(args["summary_writer"]) or any(_field(ctx, args[n]) is None for n in names[:6] if args[n] is not None):
            fx.replace(call.func, fx.helper("_print_training_update"))
            return ctx.finding(site, "test_utils.print_training_update with a summary writer: becomes _print_training_update "
                                     "(the same line and TensorBoard scalars)", fix=fx.build())
        fields = [("Device", args["device"], ""), ("Epoch", args["epoch"], ""), ("Step", args["step"], ""),
                  ("Loss", args["loss"], ":.5f"), ("Rate", args["rate"], ":.2f"), ("GlobalRate", args["global_rate"], ":.2f")]
        kind = "Training"
    parts = []
    for label, node, spec in fields:
        if not _given(node):
            continue
        src = _field(ctx, node)
        if src is None:
            return by_hand
        parts.append(f"{label}={{{src}{spec}}}")
    parts.append(f"Time={{{clock}}}")
    fx.replace(call, f'print(f"| {kind} {" ".join(parts)}", flush=True)')
    return ctx.finding(site, f"test_utils.{short}: becomes the print() it made", fix=fx.build())
