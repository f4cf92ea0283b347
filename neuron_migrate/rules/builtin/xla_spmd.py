"""XLA SPMD (NM150): every use reported with its DTensor plan, and for `xs.Mesh` and `xs.mark_sharding` the plan
written out from the call's own arguments (the mesh shape and names, the placements a partition spec means).

XLA SPMD is single-controller: one process drives every device and shards tensors by annotation. Native
torch.distributed is one process per NeuronCore (torchrun) with DTensor, so data loading, seeding and checkpointing
change with the process model. `rewrite --unsafe-fixes` rewrites the whole program of a file in one fix where it has
the shape of pytorch/xla's SPMD examples (data parallel, FSDPv2, nn.Linear weights sharded over one axis), and
nothing where any other SPMD use is left (xla_spmd_fixes.py).
"""
from __future__ import annotations

import ast

from neuron_migrate.names.analysis import walk
from neuron_migrate.rules.api import kwarg, rule
from neuron_migrate.rules.builtin.xla_spmd_fixes import spmd_fix

SPMD_MODULES = ("torch_xla.distributed.spmd", "torch_xla.experimental.xla_sharding",
                "torch_xla.experimental.spmd_fully_sharded_data_parallel")
RUNTIME = {
    "torch_xla.runtime.use_spmd": "delete it: run one process per NeuronCore under torchrun with dist.init_process_group(\"neuron\")",
    "torch_xla.runtime.is_spmd": "False: there is no single-controller mode (one process per NeuronCore)",
    "torch_xla.runtime.global_runtime_device_count": "dist.get_world_size() (one process per NeuronCore)",
    "torch_xla.runtime.addressable_runtime_device_count": "int(os.environ[\"LOCAL_WORLD_SIZE\"]) (processes on this host, set by torchrun)",
}
_GENERAL = ("rewrite with one process per NeuronCore (torchrun) and DTensor: mesh = init_device_mesh(\"neuron\", shape, "
            "mesh_dim_names=...), distribute_tensor(t, mesh, placements) / fully_shard / parallelize_module")
PLANS = {
    "Mesh": "init_device_mesh(\"neuron\", mesh_shape, mesh_dim_names=axis_names)",
    "HybridMesh": "init_device_mesh(\"neuron\", (hosts, per_host), mesh_dim_names=...) (the outer dimension across hosts)",
    "get_1d_mesh": "init_device_mesh(\"neuron\", (world_size,), mesh_dim_names=(name,))",
    "set_global_mesh": "keep the DeviceMesh in a variable (or module global) and pass it where it is used",
    "get_global_mesh": "the DeviceMesh variable the program built with init_device_mesh",
    "mark_sharding": "distribute_tensor(t, mesh, placements) (placements per mesh dimension: the partition spec inverted)",
    "mark_sharding_with_gradients": "distribute_tensor(t, mesh, placements) (DTensor gradients keep the placements)",
    "clear_sharding": "dtensor.full_tensor() or dtensor.redistribute(mesh, [Replicate()] * mesh.ndim)",
    "enable_manual_sharding": "dtensor.to_local() (the local shard), or torch.distributed.tensor.experimental.local_map",
    "disable_manual_sharding": "DTensor.from_local(local, mesh, placements)",
    "xla_distribute_tensor": "torch.distributed.tensor.distribute_tensor(t, mesh, placements)",
    "xla_distribute_module": "torch.distributed.tensor.distribute_module(module, mesh, partition_fn, input_fn, output_fn)",
    "apply_backward_optimization_barrier": "delete it: an XLA compiler hint",
    "XLAShardedTensor": "torch.distributed.tensor.DTensor",
    "ShardingSpec": "a list of placements (Shard(dim) / Replicate()) per mesh dimension",
    "ShardingType": "DTensor placements (Shard / Replicate / Partial)",
    "SpmdFullyShardedDataParallel": ("FSDP2: fully_shard(block, mesh=mesh[\"fsdp\"]) on each block, then fully_shard(model, "
                                     "mesh=mesh[\"fsdp\"]) (torch.distributed.fsdp)"),
}


def _mesh_names(call: ast.Call, ctx) -> tuple | None:
    """The axis names of the mesh a mark_sharding call uses, when its argument is a name assigned once in the file
    from xs.Mesh(..., axis_names) with literal names; None otherwise."""
    mesh = kwarg(call, "mesh", 1)
    if not isinstance(mesh, ast.Name):
        return None
    found = []
    for node in walk(ctx.analysis.tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == mesh.id for t in node.targets):
            found.append(node.value)
    if len(found) != 1 or not isinstance(found[0], ast.Call):
        return None
    names = kwarg(found[0], "axis_names", 2)
    try:
        value = ast.literal_eval(names) if names is not None else None
    except ValueError:
        return None
    return tuple(value) if isinstance(value, (tuple, list)) and all(isinstance(n, str) for n in value) else None


def spec_placements(spec, mesh_names) -> list[str] | None:
    """The DTensor placements (one per mesh dimension) that an XLA partition spec means.

    `spec[d]` names the mesh axis (by name or index; a tuple for several) that tensor dimension d is split over, or
    None; placements go the other way: for each mesh dimension, Shard(d) of the tensor dimension split over it, else
    Replicate(). Returns None when the spec cannot be read (unknown name, an axis used twice).
    """
    ndim = len(mesh_names)
    placements = ["Replicate()"] * ndim
    for d, entry in enumerate(spec):
        axes = entry if isinstance(entry, (tuple, list)) else (entry,)
        for axis in axes:
            if axis is None:
                continue
            i = mesh_names.index(axis) if isinstance(axis, str) and axis in mesh_names else axis if isinstance(axis, int) else None
            if i is None or not 0 <= i < ndim or placements[i] != "Replicate()":
                return None
            placements[i] = f"Shard({d})"
    return placements


def _mark_sharding_plan(call: ast.Call, ctx) -> str:
    spec_node = kwarg(call, "partition_spec", 2)
    try:
        spec = ast.literal_eval(spec_node) if spec_node is not None else None
    except ValueError:
        spec = None
    if not isinstance(spec, (tuple, list)):
        return PLANS["mark_sharding"]
    names = _mesh_names(call, ctx)
    if names is None:
        if not all(isinstance(a, int) or a is None for e in spec for a in (e if isinstance(e, (tuple, list)) else (e,))):
            return PLANS["mark_sharding"] + "; the mesh's axis names are not known here: map each name to its mesh dimension"
        names = tuple(range(1 + max([a for e in spec for a in (e if isinstance(e, (tuple, list)) else (e,)) if a is not None],
                                    default=0)))
    placements = spec_placements(spec, names)
    if placements is None:
        return PLANS["mark_sharding"] + "; the partition spec could not be read: write the placements by hand"
    tensor = ctx.src(kwarg(call, "t", 0)) if kwarg(call, "t", 0) is not None else "t"
    mesh = ctx.src(kwarg(call, "mesh", 1)) if kwarg(call, "mesh", 1) is not None else "mesh"
    dims = ", ".join(str(n) for n in names)
    hint = ""
    if placements.count("Replicate()") == len(placements) - 1 and tensor.endswith(".weight"):
        sharded = next(p for p in placements if p != "Replicate()")
        style = {"Shard(0)": "ColwiseParallel()", "Shard(1)": "RowwiseParallel()"}.get(sharded)
        if style:
            hint = f"; for an nn.Linear weight that is {style} on that mesh dimension in a parallelize_module plan"
    return (f"distribute_tensor({tensor}, {mesh}, [{', '.join(placements)}]) (one placement per mesh dimension {dims}; "
            f"under torchrun each rank then holds its shard){hint}; an input batch: each rank loads its own slice instead")


def _mesh_plan(call: ast.Call, ctx) -> str:
    shape = kwarg(call, "mesh_shape", 1)
    names = kwarg(call, "axis_names", 2)
    ids = kwarg(call, "device_ids", 0)
    text = f"init_device_mesh(\"neuron\", {ctx.src(shape) if shape is not None else 'mesh_shape'}"
    if names is not None:
        text += f", mesh_dim_names={ctx.src(names)}"
    text += ") (torch.distributed.device_mesh; ranks in order"
    ids_src = ctx.src(ids) if ids is not None else ""
    if ids is not None and not any(k in ids_src for k in ("arange", "range(")):
        text += "; device_ids in another order: DeviceMesh(\"neuron\", torch.tensor(device_ids).reshape(mesh_shape), mesh_dim_names=...)"
    return text + ")"


@rule(
    code="NM150",
    name="xla-spmd",
    summary="XLA SPMD (single-controller sharding annotations): the data-parallel, FSDPv2 and Linear-weight shapes become one process per device (DDP / fully_shard / parallelize_module); the rest is reported with its DTensor plan",
    fix="unsafe",
    severity="error",
    triggers=[(kind, q) for m in SPMD_MODULES for q in (f"{m}.*",) for kind in ("call", "ref", "store", "import")]
    + [(kind, q) for q in RUNTIME for kind in ("call", "ref", "store", "import")],
    docs="""
        XLA SPMD runs one process that drives every device and shards tensors by annotation
        (`xs.mark_sharding(t, mesh, partition_spec)`, `xr.use_spmd()`, FSDPv2). TorchNeuron runs one process per
        NeuronCore and supports DTensor, FSDP and tensor parallelism
        (https://github.com/aws-neuron/aws-neuron-sdk/blob/master/frameworks/torch/pytorch-native-overview.rst):
        build the mesh with `torch.distributed.device_mesh.init_device_mesh("neuron", shape, mesh_dim_names=...)`,
        shard with `distribute_tensor(t, mesh, placements)`, `fully_shard` (FSDP2) or `parallelize_module`. Data
        loading, seeding and checkpointing change with the process model, so every SPMD call is reported.

        The finding writes the plan from the call where it can: `xs.Mesh(ids, (4, 2), ("data", "model"))` →
        `init_device_mesh("neuron", (4, 2), mesh_dim_names=("data", "model"))`; `xs.mark_sharding(w, mesh,
        ("model", None))` → `distribute_tensor(w, mesh, [Replicate(), Shard(0)])`. A partition spec says, per
        tensor dimension, which mesh axis splits it; DTensor placements say, per mesh dimension, which tensor
        dimension it splits (`Shard(d)`) or that it replicates: the inverse. For an `nn.Linear` weight, `Shard(0)`
        on one mesh dimension is `ColwiseParallel()` and `Shard(1)` is `RowwiseParallel()` in a
        `parallelize_module` plan. `SpmdFullyShardedDataParallel` (FSDPv2) becomes FSDP2 `fully_shard` over the
        'fsdp' axis. `xr.use_spmd()` goes (torchrun starts the processes); `xr.global_runtime_device_count()` is
        `dist.get_world_size()`.

        `rewrite --unsafe-fixes` rewrites a file's whole SPMD program in one fix (at its first SPMD call) when it has
        the shape of pytorch/xla's SPMD examples, one process per device under torchrun:
        `xr.use_spmd()` -> `dist.init_process_group("neuron")` (under torchrun; run without it, a group of one process on
        a HashStore, as NM110's launch rewrite does); `xr.global_runtime_device_count()` ->
        `dist.get_world_size()`; `mesh = xs.Mesh(ids, shape, names)` with ids in device order (`np.array(range(n))`,
        `np.arange(n)`) -> `init_device_mesh("neuron", shape, mesh_dim_names=names)`;
        `xs.mark_sharding(batch, mesh, ("data", None, ...))` on a batch in the training code -> `batch =
        batch.tensor_split(mesh["data"].size())[mesh["data"].get_local_rank()]` (every rank loads the same global
        batch with the same seeds and keeps its slice) and, for the gradient average, the model of the file's one
        optimizer is wrapped in `DistributedDataParallel(model, device_mesh=mesh["data"])` just before it;
        `pl.MpDeviceLoader(loader, device, input_sharding=xs.ShardingSpec(mesh, ("data", None, ...)))` -> the loader
        iterated through `_BatchSlices(loader, mesh["data"])` (an inserted class: every tensor of each batch cut to
        the rank's slice); `model = FSDPv2(model[, mesh])` (with `xs.set_global_mesh`) -> `fully_shard(model,
        mesh=mesh["fsdp"])`, and with `auto_wrap_policy=functools.partial(transformer_auto_wrap_policy,
        transformer_layer_cls={Layer})` first `fully_shard` on each `Layer` module (the batch slices as above, FSDP2
        averaging the gradients); a mesh kept as `self.mesh` in a trainer class is followed in that class;
        `xs.mark_sharding(m.weight, mesh, ("model", None))` / `(None, "model")` -> `parallelize_module(m,
        mesh["model"], ColwiseParallel(output_layouts=Replicate()))` / `RowwiseParallel(input_layouts=Replicate())`
        (whole tensors in and out, as the annotation kept them: same values), with the optimizer built after.
        The layout of pytorch/xla's examples/data_parallel/train_resnet_spmd_data_parallel.py, where the mesh is
        built in a subclass's `__init__` after `super().__init__()` and the base class, in another file of the
        repository (found through the imports and `sys.path`), builds `self.model` and `self.optimizer =
        optim.X(self.model.parameters(), ...)`: `self.model = DistributedDataParallel(self.model,
        device_mesh=mesh["data"])` right after the mesh. DDP trains the parameter objects of the module it wraps, so
        the optimizer built before the wrap stays valid. Only when that `__init__` builds one such optimizer, reads
        `self.model` nowhere else, calls no method of self, and the model is a class of the repository whose modules
        hold no BatchNorm and import nothing but torch and the standard library (SPMD normalised over the global
        batch; the finding gives the `nn.SyncBatchNorm.convert_sync_batchnorm` form otherwise). The same BatchNorm check
        holds where the file builds the model and its optimizer itself: the model is a torch.nn module or a class of
        the repository that holds no BatchNorm (through what it imports from the repository), in a file that names
        none; a model from another library (torchvision, timm) keeps the SPMD program with that finding.
        What changes: a rank's loss is its slice's (the global loss is the mean over ranks); DDP's state_dict keys
        gain `module.`; FSDP2 and tensor-parallel parameters are DTensors; the launcher must start `torchrun
        --nproc_per_node=N` (N devices). Left as findings, and the whole file with them (the finding at the use says
        why): manual sharding, activation sharding inside the model, data and tensor parallelism on one mesh,
        FSDPv2 with `shard_output` or another wrap policy, an `input_sharding=` beyond the batch dimension, a mesh in
        another order or built in another file, a data-parallel model whose optimizer is neither in the file nor in
        a base class's `__init__` as above (DDP needs it), an optimizer built before the sharding. Checked by running
        (tests/integration/test_spmd_rewrite.py): data-parallel, tensor-parallel (Llama-like decoder) and FSDPv2
        programs (one in the layout of pytorch/xla's train_decoder_only_fsdp_v2.py, one in that of
        train_resnet_spmd_data_parallel.py with a small CNN) train under torchrun with 2
        processes and match the 1-process loss within 1e-5 per step (CPU with gloo), and the loss torch_xla 2.9 SPMD
        computes for the untouched originals on 2 XLA CPU devices; unverified on a Trainium host.
    """,
    examples=[("xr.use_spmd()", None),
              ("import torch_xla.distributed.spmd as xs\nmesh = xs.Mesh(np.arange(8), (4, 2), (\"data\", \"model\"))\n"
               "xs.mark_sharding(w, mesh, (\"model\", None))", None)],
)
def xla_spmd(site, ctx):
    if site.kind == "store":
        return ctx.finding(site, f"`{ctx.src(site.node)}` is assigned (monkey-patched): migrate by hand")
    made = spmd_fix(site, ctx) if site.kind == "call" else None
    fix, note = made if made and made[0] is not None else (None, "")
    why = f"; --unsafe-fixes leaves this file's SPMD program as it is: {made[1]}" if made and made[0] is None else ""
    if site.key in RUNTIME:
        if site.kind == "import":
            return ctx.finding(site, f"`{site.key}` is XLA SPMD: {_GENERAL}")
        return ctx.finding(site, f"`{site.key}` is XLA SPMD -> {RUNTIME[site.key]}{why}", fix=fix, note=note)
    name = site.key.rsplit(".", 1)[1]
    if site.kind == "call" and name in ("Mesh",):
        plan = _mesh_plan(site.node, ctx)
    elif site.kind == "call" and name in ("mark_sharding", "mark_sharding_with_gradients"):
        plan = _mark_sharding_plan(site.node, ctx)
    else:
        plan = PLANS.get(name)
    if plan is None or site.kind == "import":
        return ctx.finding(site, f"`{site.key}` is XLA SPMD: {_GENERAL}" + (f"; here: {plan}" if plan and site.kind == "import" else "")
                           + why, fix=fix, note=note)
    return ctx.finding(site, f"`{site.key}` is XLA SPMD -> {plan}{why}", fix=fix, note=note)


# -- NM166 native sharding after the optimizer --------------------------------------------------------------------
_NATIVE_SHARDING = ("torch.distributed.tensor.parallel.parallelize_module",
                    "torch.distributed.tensor.parallel.api.parallelize_module",
                    "torch.distributed.fsdp.fully_shard", "torch.distributed._composable.fsdp.fully_shard",
                    "torch.distributed.tensor.distribute_module", "torch.distributed._tensor.distribute_module")


def _function_of(a, node):
    up = a.parent_of.get(node)
    while up is not None and not isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.Module)):
        up = a.parent_of.get(up)
    return up if isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef)) else None


def _is_optimizer(q: str) -> bool:
    return q.startswith("torch.optim.") and q.count(".") == 2 and q.rpartition(".")[2][:1].isupper()


def _super_init_line(fn) -> "int | None":
    for n in walk(fn):
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "__init__"
                and isinstance(n.func.value, ast.Call) and isinstance(n.func.value.func, ast.Name)
                and n.func.value.func.id == "super"):
            return n.lineno
    return None


def _base_optimizer_words(ctx, fn, line: int) -> str:
    """Where a base class's `__init__`, run by `super().__init__()` above `line`, builds an optimizer over the model:
    in another repository file (the repository model's "spmd_bases"), or in this file; "" when none is known."""
    a = ctx.analysis
    if fn.name != "__init__":
        return ""
    cls = a.parent_of.get(fn)
    start = _super_init_line(fn)
    if not isinstance(cls, ast.ClassDef) or start is None or start > line:
        return ""
    entry = ((getattr(a, "outside", None) or {}).get("spmd_bases") or {}).get(cls.name) or {}
    if entry.get("o"):
        opt, model, at = entry["o"][0][:3]
        return (f"the optimizer `self.{opt}` that {entry.get('class')}.__init__ builds over `self.{model}.parameters()` "
                f"({entry.get('in')}:{at}, run by super().__init__() above)")
    names = {b.id for b in cls.bases if isinstance(b, ast.Name)}
    for base in a.tree.body:
        if isinstance(base, ast.ClassDef) and base.name in names:
            for d in base.body:
                if isinstance(d, ast.FunctionDef) and d.name == "__init__":
                    for n in walk(d):
                        if isinstance(n, ast.Call) and _is_optimizer(a.resolve(n.func, a.scope_of.get(d, a.module_scope), count_use=False) or ""):
                            return f"the optimizer that {base.name}.__init__ builds (line {n.lineno}, run by super().__init__() above)"
    return ""


@rule(
    code="NM166",
    name="sharding-after-optimizer",
    summary="parallelize_module / fully_shard / distribute_module after the optimizer is built: it keeps the replaced parameters, which never train",
    fix="none",
    severity="error",
    triggers=[("call", q) for q in _NATIVE_SHARDING],
    docs="""
        `parallelize_module`, `fully_shard` and `distribute_module` replace a module's parameters with new DTensor
        parameters. An optimizer built before them holds the old parameter objects: it steps tensors the model no
        longer uses, and the sharded weights never train, with nothing failing (XLA's sharding annotations kept the
        parameter objects, so torch_xla programs written this way trained there). Reported where an optimizer is
        built earlier in the same function and none after, or where the call follows `super().__init__()` in an
        `__init__` whose base class builds one (in this file, or in another file of the repository: pytorch/xla's
        tensor_parallel/train_decoder_only_spmd_tp.py shards the MLPs of a model whose Adam optimizer
        train_decoder_only_base.py built). Build the optimizer after the sharding (`self.optimizer =
        torch.optim.Adam(self.model.parameters(), ...)` again after the loop).
    """,
    examples=[("import torch\nfrom torch.distributed.tensor.parallel import parallelize_module, ColwiseParallel\n"
               "opt = torch.optim.Adam(model.parameters())\nparallelize_module(model, mesh, {'fc': ColwiseParallel()})", None)],
)
def sharding_after_optimizer(site, ctx):
    a = ctx.analysis
    call = site.call
    fn = _function_of(a, call)
    api = site.key.rpartition(".")[2]
    before, after = [], []
    for c, q in a.resolved_calls:
        if _is_optimizer(q) and _function_of(a, c) is fn:
            (before if c.lineno < call.lineno else after).append(c)
    if after:
        return None  # an optimizer is built again after the sharding
    if before:
        where = f"the optimizer built on line {before[-1].lineno}"
    else:
        where = _base_optimizer_words(ctx, fn, call.lineno) if fn is not None else ""
    if not where:
        return None
    return ctx.finding(site, f"{api} replaces the module's parameters with DTensor parameters; {where} holds the old "
                             "ones, so the sharded weights never train: build the optimizer after the sharding")
