"""The fix of NM150 (xla_spmd.py): an XLA SPMD program rewritten to one process per device (torchrun).

XLA SPMD is single-controller: one process drives every device, computes on the *global* batch, and the compiler
splits the work by the sharding annotations. The shapes of pytorch/xla's SPMD examples and user guide keep their
meaning with one process per device when:

- `xr.use_spmd()` -> `dist.init_process_group("neuron")` (torchrun starts the processes; without torchrun, a group
  of one process);
- `xr.global_runtime_device_count()` -> `dist.get_world_size()`;
- `mesh = xs.Mesh(ids, shape, names)` (or `self.mesh = ...`) with ids in device order (`np.array(range(n))`,
  `np.arange(n)`, `range(n)`) -> `init_device_mesh("neuron", shape, mesh_dim_names=names)` (ranks in the same order;
  an ids variable used only there goes);
- data parallel: `xs.mark_sharding(batch, mesh, ("data", None, ...))` on a tensor of the training code ->
  `batch = batch.tensor_split(mesh["data"].size())[mesh["data"].get_local_rank()]`, and a device loader's
  `input_sharding=xs.ShardingSpec(mesh, ("data", None, ...))` -> the loader through `_BatchSlices` (every tensor of
  each batch cut the same way): every rank loads the same global batch (same seeds, as the one controller did) and
  keeps its slice; since each rank now computes the gradient of its slice, the model handed to the file's one
  optimizer is wrapped in `DistributedDataParallel(model, device_mesh=mesh["data"])` just before it (DDP averages
  the gradients in backward: the global batch's gradient when the loss is a mean and the slices are equal); where
  a base class in another file builds `self.model` and its optimizer (the repository model's "spmd_bases"), the
  wrap follows the mesh in the subclass's `__init__` (DDP keeps the parameter objects the optimizer holds);
- FSDPv2: `model = FSDPv2(model[, mesh][, auto_wrap_policy=<transformer_auto_wrap_policy of classes>])` (mesh from
  `xs.set_global_mesh`, which goes) -> `fully_shard` on each module of those classes, then on the model, over
  `mesh["fsdp"]` (FSDP2 averages the gradients: no DDP);
- tensor parallel: `xs.mark_sharding(m.weight, mesh, ("model", None))` / `(None, "model")` ->
  `parallelize_module(m, mesh["model"], ColwiseParallel(output_layouts=Replicate()))` /
  `RowwiseParallel(input_layouts=Replicate())`: whole tensors in and out, as the annotation left the module's values.

All of it is one fix, made at the file's first SPMD call, or nothing: a file with any other SPMD use (manual or
activation sharding, data and tensor parallelism at once, a mesh built elsewhere...) keeps every finding, and the one
that blocks says why. Never imports torch.
"""
from __future__ import annotations

import ast

from neuron_migrate.names.analysis import walk
from neuron_migrate.program import cached
from neuron_migrate.rules.api import has_star_args, kwarg
from neuron_migrate.rules.helpers import HELPERS, Helper

SPMD = "torch_xla.distributed.spmd"
SPMD_MODULES = (SPMD, "torch_xla.experimental.xla_sharding", "torch_xla.experimental.spmd_fully_sharded_data_parallel")
USE_SPMD = "torch_xla.runtime.use_spmd"
COUNT = "torch_xla.runtime.global_runtime_device_count"
RUNTIME = (USE_SPMD, "torch_xla.runtime.is_spmd", COUNT, "torch_xla.runtime.addressable_runtime_device_count")
_MARKS = ("mark_sharding",)
_OWN_PARALLEL = ("init_process_group", "DistributedDataParallel", "FullyShardedDataParallel", "XlaFullyShardedDataParallel",
                 "fully_shard")
_PARAMS = ("parameters", "named_parameters", "state_dict", "buffers", "named_buffers")

NOTE = ("one process per device under torchrun (launch with torchrun --nproc_per_node=<devices>); every rank loads "
        "the same global batch (same seeds) and keeps its slice of the batch dimension (tensor_split: uneven for a "
        "batch the mesh axis does not divide, where the averaged gradient is no longer the global batch's); the "
        "model is wrapped in DistributedDataParallel over that mesh axis (gradients averaged in backward; "
        "state_dict keys gain 'module.', attributes are reached through model.module); what a rank computes from "
        "the batch (the loss, accuracy counts, printed values) is its slice's: the global loss is the mean over "
        "ranks (dist.all_reduce); a tensor of the batch that was not marked (labels XLA matched to the sharded "
        "rows) stays whole: slice it the same way")


TP_NOTE = ("each sharded weight's module becomes DTensor tensor-parallel over that mesh axis with whole tensors in and "
           "out (ColwiseParallel(output_layouts=Replicate()) for ('model', None), RowwiseParallel(input_layouts="
           "Replicate()) for (None, 'model')), as XLA's annotation kept the module's result whole: same values, the "
           "weight split over the ranks; for a module other than nn.Linear (an nn.Embedding's weight splits on the "
           "other dimension) the values are the same; the parameters become DTensors (the optimizer is built after; "
           "clip_grad_norm_ and state_dict see DTensors; every rank loads the same batch)")


FSDP_NOTE = ("one process per device under torchrun (launch with torchrun --nproc_per_node=<devices>); every rank "
             "loads the same global batch (same seeds) and keeps its slice of the batch dimension; FSDPv2 -> FSDP2 "
             "fully_shard over mesh['fsdp'] (parameters sharded along dim 0 as FSDPv2 did, gradients averaged over "
             "the ranks; the parameters and state_dict values become DTensors); what a rank computes from the batch "
             "(the loss) is its slice's: the global loss is the mean over ranks; FSDPv2's output sharding has no "
             "counterpart (each rank's output is its slice's)")


HELPERS["_BatchSlices"] = Helper(
    '''class _BatchSlices:
    """Iterates `loader` keeping this rank's slice of each batch (every tensor in it cut along its first dimension
    over `mesh_dim`), as XLA SPMD's input_sharding split the global batch over that mesh axis."""

    def __init__(self, loader, mesh_dim):
        self.loader = loader
        self.mesh_dim = mesh_dim

    def __iter__(self):
        return (self.slice(batch) for batch in self.loader)

    def __len__(self):
        return len(self.loader)

    def slice(self, batch):
        if isinstance(batch, {torch}.Tensor):
            return batch.tensor_split(self.mesh_dim.size())[self.mesh_dim.get_local_rank()] if batch.dim() else batch
        if isinstance(batch, dict):
            return {{key: self.slice(value) for key, value in batch.items()}}
        if isinstance(batch, (list, tuple)):
            cut = [self.slice(value) for value in batch]
            return type(batch)(*cut) if hasattr(batch, "_fields") else type(batch)(cut)
        return batch
''',
    {"torch": "torch"},
)


def is_spmd(q: str) -> bool:
    return q in RUNTIME or any(q.startswith(m + ".") for m in SPMD_MODULES)


def _enclosing(ctx, node):
    """The function (or module) whose body holds `node`, and the statement of that body that holds it."""
    parents = ctx.analysis.parent_of
    stmt, p = None, node
    while p is not None and not isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.Module)):
        if isinstance(p, ast.stmt):
            stmt = p
        p = parents.get(p)
    return p, stmt


def _class_of(ctx, node):
    p = ctx.analysis.parent_of.get(node)
    while p is not None and not isinstance(p, ast.ClassDef):
        p = ctx.analysis.parent_of.get(p)
    return p


def _in_model(ctx, node) -> bool:
    """Inside a `forward` or a class deriving from a Module: model code, where annotations shard activations."""
    scope, _ = _enclosing(ctx, node)
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) and scope.name == "forward":
        return True
    cls = _class_of(ctx, node)
    return cls is not None and any("Module" in ast.unparse(b) for b in cls.bases)


def _key(node) -> str | None:
    """How a mesh / model is named: `mesh` or `self.mesh` (an attribute of self); None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return f"self.{node.attr}"
    return None


def _visible(ctx, entry, node) -> bool:
    """The mesh `entry` is in scope at `node`: built in the same function or at module level, or (self.mesh) in a
    method of the same class."""
    _c, _d, _n, scope, cls = entry
    if isinstance(scope, ast.Module):
        return True
    if cls is not None:
        return _class_of(ctx, node) is cls
    return _enclosing(ctx, node)[0] is scope


def _single_assign(ctx, scope, name: str):
    """The one `name = value` statement in `scope`'s own body (not nested functions), or None."""
    found = []
    for node in walk(scope):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            found.append(node)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.With, ast.NamedExpr)) and name in {
                n.id for n in walk(getattr(node, "target", node)) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}:
            return None
    if len(found) != 1 or len(found[0].targets) != 1 or not isinstance(found[0].targets[0], ast.Name):
        return None
    return found[0]


def _range_ids(ctx, node, q_of) -> bool:
    """`range(n)`, `list(range(n))`, `np.array(range(n))`, `np.arange(n)`: device ids in device order."""
    if not isinstance(node, ast.Call) or has_star_args(node) or node.keywords:
        return False
    f = node.func
    if isinstance(f, ast.Name) and f.id == "range" and len(node.args) == 1:
        return True
    q = q_of(f)
    if q == "numpy.arange" and len(node.args) == 1:
        return True
    if (q == "numpy.array" or (isinstance(f, ast.Name) and f.id == "list")) and len(node.args) == 1:
        return _range_ids(ctx, node.args[0], q_of)
    return False


class Plan:
    """What the file's SPMD calls become, or why they cannot (`blocked`: (node, reason))."""

    def __init__(self):
        self.calls: list = []  # every SPMD call node, in source order
        self.use_spmd: list = []  # statements
        self.counts: list = []  # calls
        self.meshes: dict = {}  # mesh name -> (call, ids assignment to delete or None, axis names, enclosing scope)
        self.marks: list = []  # (statement, tensor name, mesh name, axis name)
        self.weights: list = []  # (statement, module expression, mesh name, axis name, "colwise" / "rowwise")
        self.ddp = None  # (optimizer statement, model name, mesh name, axis), or (mesh statement, ..., "after")
        self.fsdp = None  # (assignment, FSDPv2 call, model source, mesh key or None: the global mesh, classes)
        self.loaders: list = []  # (its ShardingSpec call, mesh key, axis, pl.MpDeviceLoader call) with input_sharding
        self.global_mesh = None  # (set_global_mesh statement, mesh name)
        self.blocked = None


def _block(plan: Plan, node, reason: str) -> Plan:
    if plan.blocked is None:
        plan.blocked = (node.value if isinstance(node, ast.Expr) else node, reason)
    return plan


def spmd_plan(ctx) -> Plan:
    a = ctx.analysis
    resolved = {id(c): q for c, q in a.resolved_calls}

    def q_of(node):
        return a.resolve(node, a.module_scope, count_use=False)

    plan = Plan()
    spmd_calls = sorted(((c, q) for c, q in a.resolved_calls if is_spmd(q)), key=lambda cq: (cq[0].lineno, cq[0].col_offset))
    plan.calls = [c for c, _ in spmd_calls]
    for node, q in a.resolved_refs:
        if is_spmd(q):
            return _block(plan, node, f"`{q.rpartition('.')[2]}` is used as a value (not called)")
    for site in a.sites:
        if site.kind == "store" and is_spmd(site.key):
            return _block(plan, site.node, "an SPMD name is assigned (patched)")
    if not spmd_calls:
        return plan
    if any(q.rpartition(".")[2] in _OWN_PARALLEL for q in resolved.values()):
        return _block(plan, spmd_calls[0][0], "the file also starts a process group or wraps the model (DDP/FSDP) itself")
    # the meshes first: marks refer to them
    for call, q in spmd_calls:
        name = q.rpartition(".")[2]
        if name != "Mesh" or q.startswith(SPMD_MODULES[2]):
            continue
        parent = a.parent_of.get(call)
        ids, shape, names = kwarg(call, "device_ids", 0), kwarg(call, "mesh_shape", 1), kwarg(call, "axis_names", 2)
        if not (isinstance(parent, ast.Assign) and len(parent.targets) == 1 and _key(parent.targets[0]) and parent.value is call):
            return _block(plan, call, "the mesh is not assigned to a name (or an attribute of self)")
        if has_star_args(call) or ids is None or shape is None or names is None or len(call.args) + len(call.keywords) != 3:
            return _block(plan, call, "the mesh's arguments are not (device_ids, mesh_shape, axis_names)")
        try:
            axis_names = ast.literal_eval(names)
        except (ValueError, TypeError, SyntaxError, RecursionError):
            return _block(plan, call, "the mesh's axis names are not literal strings")
        if not (isinstance(axis_names, (tuple, list)) and all(isinstance(n, str) for n in axis_names)):
            return _block(plan, call, "the mesh's axis names are not literal strings")
        scope, _ = _enclosing(ctx, call)
        drop = None
        if isinstance(ids, ast.Name):
            assign = _single_assign(ctx, scope, ids.id)
            uses = [n for n in walk(a.tree) if isinstance(n, ast.Name) and n.id == ids.id and isinstance(n.ctx, ast.Load)]
            if assign is None or not _range_ids(ctx, assign.value, q_of):
                return _block(plan, call, "the device ids are not in device order (range / np.arange): build "
                                          "DeviceMesh(\"neuron\", torch.tensor(device_ids).reshape(mesh_shape), mesh_dim_names=...)")
            if len(uses) == 1:
                drop = assign
        elif not _range_ids(ctx, ids, q_of):
            return _block(plan, call, "the device ids are not in device order (range / np.arange): build "
                                      "DeviceMesh(\"neuron\", torch.tensor(device_ids).reshape(mesh_shape), mesh_dim_names=...)")
        mesh_name = _key(parent.targets[0])
        stores = [n for n in walk(a.tree) if isinstance(n, (ast.Name, ast.Attribute)) and isinstance(n.ctx, ast.Store)
                  and _key(n) == mesh_name]
        if mesh_name in plan.meshes or len(stores) != 1:
            return _block(plan, call, f"`{mesh_name}` is assigned more than once")
        cls = _class_of(ctx, call) if mesh_name.startswith("self.") else None
        plan.meshes[mesh_name] = (call, drop, tuple(axis_names), scope, cls)
    for call, q in spmd_calls:
        name = q.rpartition(".")[2]
        parent = a.parent_of.get(call)
        if q == USE_SPMD:
            if call.args or call.keywords or not isinstance(parent, ast.Expr):
                return _block(plan, call, "`use_spmd` is not a plain statement")
            plan.use_spmd.append(parent)
        elif q == COUNT:
            if call.args or call.keywords:
                return _block(plan, call, "unexpected arguments")
            plan.counts.append(call)
        elif name == "Mesh" and call in [m[0] for m in plan.meshes.values()]:
            continue
        elif name in _MARKS and q.startswith(SPMD_MODULES[:2]):
            why = _mark(ctx, plan, call, parent)
            if why:
                return _block(plan, call, why)
        elif name == "set_global_mesh" and q.startswith(SPMD_MODULES[:2]):
            arg = call.args[0] if len(call.args) == 1 and not call.keywords else None
            if not (isinstance(parent, ast.Expr) and arg is not None and _key(arg) in plan.meshes) or plan.global_mesh:
                return _block(plan, call, "the global mesh is not one xs.Mesh built in this file")
            plan.global_mesh = (parent, _key(arg))
        elif name == "SpmdFullyShardedDataParallel":
            why = _fsdp(ctx, plan, call, parent)
            if why:
                return _block(plan, call, why)
        elif name == "ShardingSpec":
            why = _loader(ctx, plan, call, parent)
            if why:
                return _block(plan, call, why)
        else:
            return _block(plan, call, f"`{name}` has no rewrite that keeps the single-controller program's meaning "
                                      "(rewritten: use_spmd, the device count, a Mesh in device order, set_global_mesh, "
                                      "FSDPv2, mark_sharding of batches along their batch dimension or of nn.Linear "
                                      "weights over one axis, a device loader's input_sharding of the batch dimension)")
    batches = [(m[0], m[2], m[3]) for m in plan.marks] + [x[:3] for x in plan.loaders]  # (node, mesh key, axis)
    if plan.weights and (batches or plan.fsdp):
        return _block(plan, plan.weights[0][0], _BOTH)
    if plan.fsdp and plan.fsdp[3] is None:
        if plan.global_mesh is None:
            return _block(plan, plan.fsdp[1], "FSDPv2 without mesh= uses a global mesh not set in this file")
        plan.fsdp = plan.fsdp[:3] + (plan.global_mesh[1],) + plan.fsdp[4:]
    if plan.global_mesh and not plan.fsdp:
        return _block(plan, plan.global_mesh[0], "the global mesh is read elsewhere (xs.get_global_mesh): pass the DeviceMesh there")
    if plan.fsdp and "fsdp" not in plan.meshes[plan.fsdp[3]][2]:
        return _block(plan, plan.fsdp[1], "FSDPv2's mesh has no 'fsdp' axis")
    if batches:
        if len({(b[1], b[2]) for b in batches}) != 1:
            axes = sorted({f"{b[1]}[{b[2]!r}]" for b in batches})
            return _block(plan, batches[0][0], f"the batches are sharded over different meshes or axes ({', '.join(axes)})")
        if plan.fsdp and batches[0][1:] != (plan.fsdp[3], "fsdp"):
            return _block(plan, batches[0][0], "the batch is sharded over another axis than FSDPv2's 'fsdp'")
        why = "" if plan.fsdp else _optimizer(ctx, plan, batches[0][1], batches[0][2])
        if why:
            return _block(plan, batches[0][0], why)
    if plan.weights or plan.fsdp:
        stmts = [w[0] for w in plan.weights] or [plan.fsdp[0]]
        why = _after(ctx, stmts, "parallelize_module" if plan.weights else "fully_shard")
        if why:
            return _block(plan, stmts[0], why)
    return plan


def _policy_classes(ctx, policy, call):
    """The layer classes of `functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={A, B})` (inline, or
    a name assigned once just for this call: then also that assignment, to delete), or None."""
    a = ctx.analysis
    drop = None
    if isinstance(policy, ast.Name):
        scope, _ = _enclosing(ctx, call)
        drop = _single_assign(ctx, scope, policy.id)
        uses = [n for n in walk(a.tree) if isinstance(n, ast.Name) and n.id == policy.id and isinstance(n.ctx, ast.Load)]
        if drop is None or len(uses) != 1:
            return None
        policy = drop.value
    if not (isinstance(policy, ast.Call) and len(policy.args) == 1 and len(policy.keywords) == 1
            and policy.keywords[0].arg == "transformer_layer_cls" and not has_star_args(policy)):
        return None
    fn = a.resolve(policy.args[0], a.module_scope, count_use=False) or ""
    if a.resolve(policy.func, a.module_scope, count_use=False) != "functools.partial" or not fn.endswith(".transformer_auto_wrap_policy") or not fn.startswith(
            ("torch_xla.distributed.fsdp.wrap.", "torch.distributed.fsdp.wrap.")):
        return None
    classes = policy.keywords[0].value
    if not isinstance(classes, (ast.Set, ast.List, ast.Tuple)) or not classes.elts or not all(
            isinstance(e, (ast.Name, ast.Attribute)) for e in classes.elts):
        return None
    return [ctx.src_relative(e) for e in classes.elts], drop


def _fsdp(ctx, plan: Plan, call, parent) -> str:
    """`model = FSDPv2(model[, mesh][, auto_wrap_policy=<transformer_auto_wrap_policy of classes>])`: FSDP2
    fully_shard over the mesh's 'fsdp' axis (on each module of those classes, then the model)."""
    module, mesh, policy = kwarg(call, "module", 0), kwarg(call, "mesh", 1), kwarg(call, "auto_wrap_policy")
    known = 1 + (mesh is not None) + (policy is not None)
    if plan.fsdp or has_star_args(call) or len(call.args) + len(call.keywords) != known or len(call.args) > 2:
        return ("FSDPv2 with shard_output, extra_data_axis or auto_wrapper_callable (or more than one wrap): fully_shard "
                "on each block then on the model, over mesh['fsdp'], by hand")
    if not (isinstance(parent, ast.Assign) and len(parent.targets) == 1 and _key(module)
            and _key(parent.targets[0]) == _key(module)):
        return "the wrap is not `model = FSDPv2(model, ...)`"
    if mesh is not None and not (_key(mesh) in plan.meshes and _visible(ctx, plan.meshes[_key(mesh)], call)):
        return "FSDPv2's mesh is not an xs.Mesh built in this file"
    classes = None
    if policy is not None:
        classes = _policy_classes(ctx, policy, call)
        if classes is None:
            return ("FSDPv2's auto_wrap_policy is not functools.partial(transformer_auto_wrap_policy, "
                    "transformer_layer_cls={...}): fully_shard on each block then on the model, by hand")
    plan.fsdp = (parent, call, ctx.src(module), _key(mesh) if mesh is not None else None, classes)
    return ""


def _loader(ctx, plan: Plan, call, parent) -> str:
    """`pl.MpDeviceLoader(loader, device, input_sharding=xs.ShardingSpec(mesh, ("data", None, ...)))`: the loader
    iterated through _BatchSlices (each rank's slice of every batch tensor)."""
    a = ctx.analysis
    loader = a.parent_of.get(parent) if isinstance(parent, ast.keyword) else None
    lq = a.resolve(loader.func, a.module_scope, count_use=False) if isinstance(loader, ast.Call) else None
    if parent.arg != "input_sharding" if isinstance(parent, ast.keyword) else True:
        return "a ShardingSpec other than a device loader's input_sharding"
    if lq != "torch_xla.distributed.parallel_loader.MpDeviceLoader" or has_star_args(loader) or not loader.args:
        return "input_sharding of a loader other than pl.MpDeviceLoader(loader, device, ...)"
    mesh, spec = kwarg(call, "mesh", 0), kwarg(call, "partition_spec", 1)
    if has_star_args(call) or len(call.args) + len(call.keywords) != 2 or _key(mesh) not in plan.meshes:
        return "the ShardingSpec's mesh is not an xs.Mesh built in this file"
    entry = plan.meshes[_key(mesh)]
    value = _spec(spec, entry[2])
    if value is None or value[0] is None or any(v is not None for v in value[1:]) or not _visible(ctx, entry, call):
        return ("input_sharding that shards more than the batch dimension over one mesh axis: by hand (DistributedSampler "
                "and batch_size // world size for the batch dimension)")
    plan.loaders.append((call, _key(mesh), value[0], loader))
    return ""


_BOTH = ("the batch and the weights are both sharded (data and tensor parallelism on one mesh): DDP over mesh[data] "
         "does not take DTensor parameters; apply the parallelize_module plan, then FSDP2 fully_shard(model, "
         "mesh=mesh[data]), by hand")


def _after(ctx, stmts: list, api: str) -> str:
    """parallelize_module / fully_shard replace the module's parameters: every optimizer of the file must be built
    after them, in the same function (XLA's annotations and FSDPv2 kept the parameter objects)."""
    opts = [c for c, q in ctx.analysis.resolved_calls if q.startswith("torch.optim.") and q.count(".") == 2
            and q.rpartition(".")[2][:1].isupper()]
    if not opts:
        return (f"no torch.optim optimizer is built in this file after the sharding: {api} replaces the parameters, "
                "so the optimizer must be built after it")
    last = max(_enclosing(ctx, st)[1].end_lineno for st in stmts)
    scopes = {id(_enclosing(ctx, st)[0]) for st in stmts}
    for c in opts:
        scope, stmt = _enclosing(ctx, c)
        if id(scope) not in scopes or stmt.lineno <= last:
            return (f"an optimizer is built before the sharding (or in another function): {api} replaces the "
                    "parameters, so build the optimizer after it")
    return ""


def _spec(spec, names) -> tuple | None:
    """The literal partition spec with axis indices turned into names; None when it is not a literal of known axes."""
    try:
        value = ast.literal_eval(spec) if spec is not None else None
    except (ValueError, TypeError, SyntaxError, RecursionError):
        return None
    if not isinstance(value, (tuple, list)) or not value:
        return None
    out = []
    for v in value:
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < len(names):
            v = names[v]
        if v is not None and (not isinstance(v, str) or v not in names):
            return None
        out.append(v)
    return tuple(out)


def _mark(ctx, plan: Plan, call, parent) -> str:
    t, mesh, spec = kwarg(call, "t", 0), kwarg(call, "mesh", 1), kwarg(call, "partition_spec", 2)
    same = (isinstance(parent, ast.Assign) and len(parent.targets) == 1 and isinstance(parent.targets[0], ast.Name)
            and isinstance(t, ast.Name) and parent.targets[0].id == t.id)  # `x = xs.mark_sharding(x, ...)`
    if not (isinstance(parent, ast.Expr) or same) or has_star_args(call) or len(call.args) + len(call.keywords) != 3:
        return "mark_sharding's result is used or its arguments are not (tensor, mesh, partition_spec)"
    if _in_model(ctx, call):
        return ("a sharding annotation inside the model (activation sharding): DTensor redistribute / "
                "parallelize_module layouts by hand")
    if _key(mesh) not in plan.meshes:
        return "its mesh is not an xs.Mesh built in this file"
    mesh_key = _key(mesh)
    names = plan.meshes[mesh_key][2]
    value = _spec(spec, names)
    if value is None:
        return "the partition spec is not a literal of this mesh's axes (one name or index, or None, per dimension)"
    scope, _stmt = _enclosing(ctx, call)
    if not _visible(ctx, plan.meshes[mesh_key], call):
        return "the mesh is built in another function"
    if isinstance(t, ast.Attribute) and t.attr == "weight" and len(value) == 2 and value.count(None) == 1:
        axis = value[0] or value[1]
        style = "colwise" if value[0] else "rowwise"  # Shard(0) of an nn.Linear weight [out, in] / Shard(1)
        plan.weights.append((parent, t.value, mesh_key, axis, style))
        return ""
    if not isinstance(t, ast.Name):
        return ("a parameter or sub-tensor is sharded other than an nn.Linear weight over one axis (tensor "
                "parallelism): distribute_tensor / parallelize_module with the placements above, by hand")
    if any(v is not None for v in value[1:]) or value[0] is None:
        return ("a partition spec that shards more than the batch dimension (tensor or sequence parallelism): "
                "distribute_tensor with the placements above, by hand")
    for node in walk(scope):  # a name bound by a loop over parameters is a weight, not a batch
        if isinstance(node, ast.For) and t.id in {n.id for n in walk(node.target) if isinstance(n, ast.Name)}:
            it = ast.unparse(node.iter)
            if any(f".{p}(" in it for p in _PARAMS):
                return ("parameters are sharded (FSDP / tensor parallelism over the mesh): fully_shard or "
                        "distribute_tensor with the placements above, by hand")
    if any(m[1] == t.id and _enclosing(ctx, m[0])[0] is scope for m in plan.marks):
        return f"`{t.id}` is marked twice in one function (slicing it twice would halve it again)"
    plan.marks.append((parent, t.id, mesh_key, value[0]))
    return ""


def _optimizer(ctx, plan: Plan, mesh: str, axis: str) -> str:
    """Find the one optimizer built from `model.parameters()` in this file; DDP wraps that model just before it."""
    found = []
    for call, q in ctx.analysis.resolved_calls:
        if q.startswith("torch.optim.") and q.count(".") == 2 and q.rpartition(".")[2][:1].isupper() and call.args:
            first = call.args[0]
            if (isinstance(first, ast.Call) and isinstance(first.func, ast.Attribute) and first.func.attr == "parameters"
                    and _key(first.func.value) and not first.args and not first.keywords):
                found.append((call, _key(first.func.value)))
    why = ("the model whose gradients DDP must average was not found (one torch.optim optimizer built from "
           "`model.parameters()` in this file, after the mesh, or in the __init__ of a base class in another file of "
           f"the repository): wrap it in DistributedDataParallel(model, device_mesh={mesh}[{axis!r}]) after the mesh by "
           "hand (DDP keeps the model's parameter objects, so an optimizer built on them before stays valid)")
    if not found:
        got = _base_optimizer(ctx, plan, mesh, axis)
        return why if got is None else got
    if len(found) != 1:
        return why
    call, model = found[0]
    scope, stmt = _enclosing(ctx, call)
    mcall = plan.meshes[mesh][0]
    if (not isinstance(stmt, ast.Assign) or ctx.analysis.parent_of.get(stmt) is not scope or stmt.lineno < mcall.lineno
            or not _visible(ctx, plan.meshes[mesh], stmt)):
        return why
    norm = _batch_norm_here(ctx, scope, stmt, model)
    if norm:
        return (f"the model `{model}` may hold BatchNorm layers ({norm}): XLA SPMD normalised them over the global "
                f"batch, a process per device would normalise its slice. Write `{model} = DistributedDataParallel("
                f"nn.SyncBatchNorm.convert_sync_batchnorm({model}, {mesh}[{axis!r}].get_group()), device_mesh="
                f"{mesh}[{axis!r}])` after the mesh and before the optimizer by hand (SyncBatchNorm normalises over the "
                "ranks' slices together), or plain DDP if the model has none")
    plan.ddp = (stmt, model, mesh, axis)
    return ""


def _batch_norm_here(ctx, scope, opt_stmt, model: str) -> str:
    """"" when the model the optimizer trains is built in this file from a class known to hold no BatchNorm: a class
    of this repository (the repository model's "spmd_models"; without one, a class of this file that imports only
    what the repository model calls plain: torch, torch_xla, numpy and the standard library) or a torch.nn module, in a file that names no BatchNorm; else why it may."""
    from neuron_migrate.repository.model import BATCH_NORM_WORDS, PLAIN_LIBRARIES  # the repository path's own test

    a = ctx.analysis
    if any(w in a.text for w in BATCH_NORM_WORDS):
        return "this file names BatchNorm"
    built = None
    for node in walk(scope):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and _key(node.targets[0]) == model
                and node.lineno < opt_stmt.lineno and (built is None or node.lineno > built.lineno)):
            built = node
    value = built.value if built is not None else None
    while (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
           and isinstance(value.func.value, ast.Call)):  # Net(...).to(device).train()
        value = value.func.value
    if not isinstance(value, ast.Call):
        return f"where `{model}` is built was not found before its optimizer in this function"
    name = ast.unparse(value.func)
    facts = (getattr(a, "outside", None) or {}).get("spmd_models")
    if facts is not None and name in facts:
        return "" if facts[name] == 0 else facts[name]
    q = dict((id(c), q) for c, q in a.resolved_calls).get(id(value), "")
    if q.startswith("torch.nn.") and "Norm" not in q:
        return ""
    if facts is None and isinstance(value.func, ast.Name) and any(
            isinstance(st, ast.ClassDef) and st.name == name for st in a.tree.body):
        for st in a.tree.body:
            if isinstance(st, ast.Import):
                mods = [al.name for al in st.names]
            elif isinstance(st, ast.ImportFrom):
                mods = ["." * st.level + (st.module or "")]
            else:
                continue
            other = next((m for m in mods if m.partition(".")[0] not in PLAIN_LIBRARIES | {"torch_xla"}), None)
            if other is not None:
                return f"{name} is a class of this file, which imports {other}"
        return ""
    return f"{name} is not a model class of this repository"


def _base_optimizer(ctx, plan: Plan, mesh: str, axis: str) -> "str | None":
    """The layout of pytorch/xla's examples/data_parallel/train_resnet_spmd_data_parallel.py: the mesh is built in
    the `__init__` of a subclass, after `super().__init__()`, and the base class (another file of the repository:
    its "spmd_bases" fact) builds `self.model` and `self.optimizer = optim.X(self.model.parameters(), ...)`. DDP
    wraps `self.model` right after the mesh: DDP trains the very parameter objects of the module it wraps, so the
    base's optimizer (built before) steps the wrapped model's parameters, and the base's methods reach the model
    through `self.model` when they run, after `__init__`. "" when the plan is made (plan.ddp), else why not (None:
    no such base class is known)."""
    a = ctx.analysis
    call, _drop, _names, scope, _cls = plan.meshes[mesh]
    cls = _class_of(ctx, call)
    fact = ((getattr(a, "outside", None) or {}).get("spmd_bases") or {}).get(cls.name) if cls is not None else None
    if fact is None:
        return None
    where = f"{fact['class']}.__init__ ({fact['in']})"
    opts = fact.get("o") or []
    if len(opts) != 1:
        return (f"{where} builds {len(opts)} optimizers from `self.<model>.parameters()`: wrap the model they train in "
                f"DistributedDataParallel(self.model, device_mesh={mesh}[{axis!r}]) after the mesh by hand")
    opt, model, opt_line = opts[0]
    target = f"self.{model}"
    hand = (f"write `{target} = DistributedDataParallel({target}, device_mesh={mesh}[{axis!r}])` right after the mesh "
            f"by hand (DDP keeps the parameter objects, so the base class's optimizer `self.{opt}`, built on them, stays "
            "valid)")
    if fact.get("bn") != 0:
        built = fact.get("a") or [0, "?"]
        return (f"the model `{target}` (`{built[1]}`, {fact['in']} line {built[0]}) may hold BatchNorm layers "
                f"({fact.get('bn') or 'not found'}): XLA SPMD normalised them over the global batch, a process per device "
                f"would normalise its slice. Write `{target} = DistributedDataParallel(nn.SyncBatchNorm."
                f"convert_sync_batchnorm({target}, {mesh}[{axis!r}].get_group()), device_mesh={mesh}[{axis!r}])` right "
                "after the mesh by hand (SyncBatchNorm normalises over the ranks' slices together; it and DDP keep the "
                f"parameter objects, so the optimizer `self.{opt}` that {where} built on them stays valid), or plain "
                "DDP if the model has none")
    others = [n for n in fact.get("r", ()) if n != opt_line]
    if fact.get("a") and fact["a"][0] > opt_line:
        others.insert(0, fact["a"][0])  # the model is built again after the optimizer: it trains the other one
    if fact.get("c") or others or fact.get("bases") not in ([], ["object"]):
        what = (f"line {fact['c'][0]} calls a method of self or hands self on" if fact.get("c") else
                f"line {others[0]} reads or sets `{target}` (a reference kept there would bypass the wrap)" if others else
                "the base class has bases of its own")
        return f"{where}: {what}; {hand}"
    if not (isinstance(scope, ast.FunctionDef) and scope.name == "__init__" and a.parent_of.get(scope) is cls
            and len(cls.bases) == 1 and isinstance(cls.bases[0], ast.Name)):
        return f"the mesh is not built in the __init__ of a class with the one base {fact['class']}: {hand}"
    _s, stmt = _enclosing(ctx, call)
    body = scope.body
    supers = [i for i, st in enumerate(body) if isinstance(st, ast.Expr) and isinstance(st.value, ast.Call)
              and ast.unparse(st.value.func) == "super().__init__"]
    if a.parent_of.get(stmt) is not scope or len(supers) != 1 or supers[0] > body.index(stmt):
        return f"the mesh is not a statement of __init__ after its one super().__init__() call: {hand}"
    for node in walk(a.tree):
        if (isinstance(node, ast.Attribute) and _key(node) in (target, f"self.{opt}")
                and (isinstance(node.ctx, ast.Store) or _enclosing(ctx, node)[0] is scope)):
            return f"line {node.lineno}: `{_key(node)}` is set or used in this __init__ too: {hand}"
    plan.ddp = (stmt, target, mesh, axis, "after")
    return ""


def spmd_fix(site, ctx):
    """(fix, note) at the file's first SPMD call when the whole program has a shape this module rewrites; (None,
    reason) at the call that blocks it; None elsewhere."""
    plan = cached(ctx.analysis, "nm150_plan", lambda _a: spmd_plan(ctx))  # one plan per file, not per site
    if plan.blocked is not None:
        node, why = plan.blocked
        return (None, why) if node is site.node else None
    if not plan.calls or site.node is not plan.calls[0]:
        return None
    fx = ctx.fixer()
    dist = fx.ref("torch.distributed")
    for stmt in plan.use_spmd:
        # as the launch rewrites do (NM110's xmp.spawn): under torchrun the group its variables describe, else (the
        # original's own `python train.py`) a group of one process, so that the script still runs as it is started
        os_ = fx.ref("os")
        fx.replace(stmt, "\n".join([f'if "WORLD_SIZE" in {os_}.environ:  # started by torchrun',
                                    f'    {dist}.init_process_group("neuron")',
                                    "else:  # run without torchrun: a group of one process",
                                    f'    {dist}.init_process_group("neuron", store={dist}.HashStore(), rank=0, world_size=1)']))
    for call in plan.counts:
        fx.replace(call, f"{dist}.get_world_size()")
    if plan.meshes:
        init = fx.member("torch.distributed.device_mesh.init_device_mesh")
    meshes = {}
    anchor = plan.ddp[0] if plan.ddp is not None and len(plan.ddp) > 4 else None
    for key, (call, drop, *_rest) in plan.meshes.items():
        shape, names = kwarg(call, "mesh_shape", 1), kwarg(call, "axis_names", 2)
        meshes[key] = f'{init}("neuron", {ctx.src_relative(shape)}, mesh_dim_names={ctx.src_relative(names)})'
        if anchor is None or ctx.analysis.parent_of.get(call) is not anchor:
            fx.replace(call, meshes[key])
        if drop is not None:
            fx.delete(drop)
    for stmt, t, mesh, axis in plan.marks:
        fx.replace(stmt, f'{t} = {t}.tensor_split({mesh}["{axis}"].size())[{mesh}["{axis}"].get_local_rank()]')
    note = "one process per device under torchrun (launch with torchrun --nproc_per_node=<devices>)"
    if plan.global_mesh is not None:
        fx.delete(plan.global_mesh[0])
    for _spec_call, mesh, axis, loader in plan.loaders:
        rest = [ctx.src_relative(x) for x in loader.args[1:]]
        rest += [f"{k.arg}={ctx.src_relative(k.value)}" for k in loader.keywords if k.arg != "input_sharding"]
        first = f'{fx.helper("_BatchSlices")}({ctx.src_relative(loader.args[0])}, {mesh}["{axis}"])'
        fx.replace(loader, f"{ctx.src_relative(loader.func)}({', '.join([first, *rest])})")
    if plan.fsdp is not None:
        stmt, _call, model, mesh, classes = plan.fsdp
        fs = fx.member("torch.distributed.fsdp.fully_shard")
        text = f'{fs}({model}, mesh={mesh}["fsdp"])'
        if classes is not None:
            names, drop = classes
            var = next(v for v in ("module", "submodule", "_module") if v not in ctx.analysis.defined_names)
            kinds = names[0] if len(names) == 1 else f"({', '.join(names)})"
            text = (f"for {var} in {model}.modules():\n    if isinstance({var}, {kinds}):\n"
                    f'        {fs}({var}, mesh={mesh}["fsdp"])\n{text}')
            if drop is not None:
                fx.delete(drop)
        fx.replace(stmt, text)
        note = FSDP_NOTE
    if plan.weights:
        tp = "torch.distributed.tensor.parallel"
        pm = fx.member(f"{tp}.parallelize_module")
        rep = fx.member("torch.distributed.tensor.Replicate")
        styles = {"colwise": f"{fx.member(f'{tp}.ColwiseParallel')}(output_layouts={rep}())",
                  "rowwise": f"{fx.member(f'{tp}.RowwiseParallel')}(input_layouts={rep}())"}
        for stmt, module, mesh, axis, style in plan.weights:
            fx.replace(stmt, f'{pm}({ctx.src_relative(module)}, {mesh}["{axis}"], {styles[style]})')
        note += "; " + TP_NOTE
    if plan.ddp is not None:
        stmt, model, mesh, axis, *after = plan.ddp
        ddp = fx.member("torch.nn.parallel.DistributedDataParallel")
        wrap = f'{model} = {ddp}({model}, device_mesh={mesh}["{axis}"])'
        if after:  # the model and its optimizer are built by the base class: the wrap follows the mesh statement
            wrap = f"{ctx.src_relative(stmt.targets[0])} = {meshes[mesh]}\n{wrap}"
            fx.replace(stmt, wrap)
        else:
            fx.insert_before(stmt, wrap)
        note = NOTE
    return fx.build(description="XLA SPMD -> one process per device (torchrun): DDP over the data axis, DTensor tensor parallelism over the model axis"), note
