"""The fixes of NM160 (trainium_stack.py): NxD's common core rewritten to native torch.distributed.

What is rewritten, where each form keeps NxD's meaning (anything else stays a finding with its plan):
- NxD's parallel_state (and grads.clip_grad_norm) imports are re-pointed to the one module `rewrite` writes
  (rules/nxd_state.py: a DeviceMesh ("dp", "tp") and the same queries), when every use in the file is one it defines;
- ColumnParallelLinear / RowParallelLinear / ParallelEmbedding calls become `parallelize_module(nn.Linear(...),
  mesh["tp"], ColwiseParallel(...)/RowwiseParallel(...))` (the module itself, its outputs local tensors as NxD's were);
  isinstance checks on them become nn.Linear / nn.Embedding and `init_weight_cpu()` becomes `reset_parameters()`;
- parallel_cross_entropy(logits, labels) becomes F.cross_entropy(reduction="none") on the gathered logits;
- nxd.neuronx_distributed_config + initialize_parallel_model + initialize_parallel_optimizer (one fix, as they share
  the config): the mesh, the plain model on the device, the optimizer with a step pre-hook that averages gradients
  over dp and clips them as NxD's optimizer did; nxd.save/load/has_checkpoint go to the module (DCP format);
- utils.divide, random.model_parallel_xla_manual_seed: plain Python / torch.manual_seed.
"""
from __future__ import annotations

import ast

from neuron_migrate.files.lines import statements_naming
from neuron_migrate.names.analysis import walk
from neuron_migrate.program import cached
from neuron_migrate.rules.api import const_value, has_star_args, kwarg
from neuron_migrate.rules.nxd_state import GRADS, MARK, MODULE, STATE_QUERIES

PS = "neuronx_distributed.parallel_layers.parallel_state"
GRADS_MOD = "neuronx_distributed.parallel_layers.grads"
LAYERS = {"ColumnParallelLinear": "Linear", "RowParallelLinear": "Linear", "ParallelEmbedding": "Embedding"}
TDT = "torch.distributed.tensor"
TP = "torch.distributed.tensor.parallel"

_INIT_NOTE = ("the full weight is initialised by torch.nn's reset_parameters() and then split (distribute_tensor "
              "sends tp rank 0's values), where NxD initialised a master weight with its init_method (same default "
              "distribution, other random values)")
_BIAS_NOTE = "; the bias is initialised uniformly by nn.Linear where NxD zeroed it"


def _arg_forms(call: ast.Call, names: tuple, allowed_const: dict | None = None) -> "dict | None":
    """name -> argument node for a call whose arguments are exactly the parameters `names` (positional in that order,
    or keywords); None when it passes anything else. `allowed_const`: keyword -> the constants it may have."""
    if has_star_args(call) or len(call.args) > len(names):
        return None
    got = dict(zip(names, call.args))
    for kw in call.keywords:
        if kw.arg in got:
            return None
        if kw.arg in names:
            got[kw.arg] = kw.value
        elif allowed_const and kw.arg in allowed_const and const_value(kw.value, object()) in allowed_const[kw.arg]:
            continue
        else:
            return None
    return got


def _module_resolve(ctx, node) -> "str | None":
    return ctx.analysis.resolve(node, ctx.analysis.module_scope, count_use=False)


def state_rewritable(ctx) -> bool:
    """Every use of NxD's parallel_state / grads in the file is a name the written module defines, called the way
    the module's function takes it. Decided once per file (each NxD import and mesh reference asks; the answer is
    the file's)."""
    return cached(ctx.analysis, "nxd-state-rewritable", _state_rewritable)


def _state_rewritable(analysis) -> bool:
    for q in analysis.qualnames:
        for mod, ok in ((PS, STATE_QUERIES), (GRADS_MOD, GRADS)):
            if q.startswith(mod + ".") and q[len(mod) + 1:] not in ok:
                return False
    # a call resolves (from module scope) into either module only through a module-level name bound to one of them,
    # to a module above them or to something inside them: only the top-level statements that write such a name
    # can hold one, and only those are walked (none: no call to check)
    roots = set()
    scope = analysis.module_scope
    while scope is not None:
        roots.update(name for name, q in scope.bindings.items()
                     if q and any(mod.startswith(q) or q.startswith(mod) for mod in (PS, GRADS_MOD)))
        scope = scope.parent
    for node in (n for stmt in statements_naming(analysis.tree, analysis.lines, roots) for n in walk(stmt)) \
            if roots else ():
        if not isinstance(node, ast.Call):
            continue
        q = analysis.resolve(node.func, analysis.module_scope, count_use=False) or ""
        name = q.rpartition(".")[2]
        if not (q.startswith(PS + ".") or q.startswith(GRADS_MOD + ".")):
            continue
        if has_star_args(node):
            return False
        if name == "initialize_model_parallel":
            if _arg_forms(node, ("tensor_model_parallel_size", "pipeline_model_parallel_size")) is None:
                return False
        elif name == "clip_grad_norm":
            if _arg_forms(node, ("parameters", "max_norm", "norm_type")) is None:
                return False
        elif node.args or node.keywords:
            return False
    return True


def _state_name(ctx, fx) -> str:
    """How the file spells the written module: its re-pointed parallel_state name when it has one."""
    name = ctx.analysis.binding_for(PS)
    if name and state_rewritable(ctx):
        return name
    return fx.ref(MODULE)


def _mesh(ctx, fx) -> str:
    return f'{_state_name(ctx, fx)}.mesh["tp"]'


def mesh_kept_nxd(ctx) -> bool:
    """The file builds its groups with NxD's parallel_state and that stays NxD (a use the written module does not
    take: `get_data_parallel_group(as_list=True)`): `parallel_mesh.mesh` is never made here, so nothing may be
    rewritten onto it (a layer on `mesh["tp"]` would meet None; the program would break where NxD still runs)."""
    return any(q == PS or q.startswith(PS + ".") for q in ctx.analysis.qualnames) and not state_rewritable(ctx)


def _marked(fx, uses_module: bool, what: str):
    return fx.build(description=(MARK + " " if uses_module else "") + what)


# -- imports --------------------------------------------------------------------------------------------------------
def import_fix(site, ctx):
    node = site.node
    if site.alias is not (node.names[0] if node.names else None) or not state_rewritable(ctx):
        return None  # one fix per statement, made at its first name
    if isinstance(node, ast.ImportFrom) and node.level == 0:
        names = [a.name for a in node.names]
        if node.module == "neuronx_distributed.parallel_layers" and "parallel_state" in names:
            ps = next(a for a in node.names if a.name == "parallel_state")
            text = f"import {MODULE} as {ps.asname or 'parallel_state'}"
            rest = [ctx.src(a) for a in node.names if a is not ps]
            if rest:  # the other NxD modules stay imported (and reported) until nothing uses them
                text += f"\nfrom {node.module} import {', '.join(rest)}"
        elif (node.module == PS and set(names) <= STATE_QUERIES) or (node.module == GRADS_MOD and set(names) <= GRADS):
            text = f"from {MODULE} import " + ", ".join(ctx.src(a) for a in node.names)
        else:
            return None
    elif isinstance(node, ast.Import) and len(node.names) == 1 and node.names[0].name == PS and node.names[0].asname:
        text = f"import {MODULE} as {node.names[0].asname}"
    else:
        return None
    fx = ctx.fixer()
    fx.replace(node, text)
    return _marked(fx, True, f"NxD's parallel_state -> {MODULE} (a DeviceMesh)"), (
        f"{MODULE}.py, written beside this file, holds the DeviceMesh (\"dp\", \"tp\") and the queries NxD's "
        "parallel_state answered (same names, native torch.distributed)")


# -- layers ---------------------------------------------------------------------------------------------------------
def layer_fix(site, ctx, shown):
    call = site.node
    fx = ctx.fixer()
    if shown == "ColumnParallelLinear":
        args = _arg_forms(call, ("input_size", "output_size", "bias", "gather_output"))
        if args is None or "input_size" not in args or "output_size" not in args:
            return None
        gather = const_value(args.get("gather_output"), True if "gather_output" not in args else None)
        if gather is None:
            return None
        style = fx.member(f"{TP}.ColwiseParallel") + ("(output_layouts=" + fx.member(f"{TDT}.Replicate") + "())"
                                                    if gather else "()")
    elif shown == "RowParallelLinear":
        args = _arg_forms(call, ("input_size", "output_size", "bias", "input_is_parallel"))
        if args is None or "input_size" not in args or "output_size" not in args:
            return None
        parallel = const_value(args.get("input_is_parallel"), False if "input_is_parallel" not in args else None)
        if parallel is None:
            return None
        style = fx.member(f"{TP}.RowwiseParallel") + ("()" if parallel else "(input_layouts=" + fx.member(f"{TDT}.Replicate") + "())")
    else:
        args = _arg_forms(call, ("num_embeddings", "embedding_dim"), {"shard_across_embedding": (False,)})
        if args is None or len(args) != 2:
            return None
        # NxD's default: the vocabulary split over tp, ids replicated in, the output all-reduced
        style = fx.member(f"{TP}.RowwiseParallel") + "(input_layouts=" + fx.member(f"{TDT}.Replicate") + "())"
    first, second = list(args.values())[:2] if shown == "ParallelEmbedding" else (args["input_size"], args["output_size"])
    inner = f"{ctx.src_relative(first)}, {ctx.src_relative(second)}"
    bias_note = ""
    if shown != "ParallelEmbedding":
        bias = args.get("bias")
        if bias is not None:
            inner += f", bias={ctx.src_relative(bias)}"
        if const_value(bias, True if bias is None else None) is not False:
            bias_note = _BIAS_NOTE
    new = (f"{fx.member(f'{TP}.parallelize_module')}({fx.ref('torch.nn')}.{LAYERS[shown]}({inner}), "
           f"{_mesh(ctx, fx)}, {style})")
    fx.replace(call, new)
    return _marked(fx, True, f"{shown} -> nn.{LAYERS[shown]} + parallelize_module"), (
        f"the layer is plain nn.{LAYERS[shown]} sharded over mesh['tp'] by DTensor; its outputs are local tensors "
        f"as NxD's were (code that counts local heads from the tp size keeps working); {_INIT_NOTE}{bias_note}; its "
        "weight is a DTensor where the model's other parameters are plain tensors: build a torch.optim optimizer with "
        "foreach=False (its default foreach step on the device refuses the mix), or distribute the others too (Replicate)")


def isinstance_fix(site, ctx, shown):
    """`isinstance(m, (ColumnParallelLinear, RowParallelLinear))` -> `isinstance(m, nn.Linear)`."""
    node = site.node
    parent = ctx.analysis.parent_of.get(node)
    holder = parent if isinstance(parent, ast.Tuple) else node
    call = ctx.analysis.parent_of.get(holder)
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "isinstance"
            and len(call.args) == 2 and call.args[1] is holder and not call.keywords):
        return None
    elts = holder.elts if isinstance(holder, ast.Tuple) else [holder]
    first_nxd = None
    fx = ctx.fixer()
    out: list[str] = []
    for e in elts:
        q = _module_resolve(ctx, e) or ""
        layer = q.rpartition(".")[2] if q.startswith("neuronx_distributed") else None
        if layer is not None and layer not in LAYERS:
            return None
        if layer is not None and first_nxd is None:
            first_nxd = e
        text = f"{fx.ref('torch.nn')}.{LAYERS[layer]}" if layer else ctx.src(e)
        if text not in out:
            out.append(text)
    if first_nxd is not node:
        return None  # one fix per isinstance, made at its first NxD class
    classes = out[0] if len(out) == 1 else "(" + ", ".join(out) + ")"
    fx.replace(call, f"isinstance({ctx.src_relative(call.args[0])}, {classes})")
    return _marked(fx, False, "isinstance on NxD layers -> nn classes"), (
        "the check now also matches plain nn.Linear / nn.Embedding modules that were not NxD layers")


def init_weight_fix(site, ctx):
    if not any(q.startswith("neuronx_distributed") for q in ctx.analysis.qualnames):
        return None
    call = site.node
    if call.args or call.keywords or not isinstance(call.func, ast.Attribute):
        return None
    fx = ctx.fixer()
    fx.replace(call, f"{ctx.src_relative(call.func.value)}.reset_parameters()")
    return _marked(fx, False, "init_weight_cpu -> reset_parameters"), (
        "reset_parameters() re-initialises the (sharded) weight with torch.nn's default init: other random values "
        "than NxD's init_method")


# -- loss, utils, random ------------------------------------------------------------------------------------------
def cross_entropy_fix(site, ctx):
    call = site.node
    args = _arg_forms(call, ("logits", "target"), {"label_smoothing": (0, 0.0)})
    if args is None or len(args) != 2:
        return None
    fx = ctx.fixer()
    dt, shard = fx.member(f"{TDT}.DTensor"), fx.member(f"{TDT}.Shard")
    full = f"{dt}.from_local({ctx.src_relative(args['logits'])}, {_mesh(ctx, fx)}, [{shard}(-1)]).full_tensor()"
    fx.replace(call, f'{fx.ref("torch.nn.functional")}.cross_entropy({full}.movedim(-1, 1), '
                     f'{ctx.src_relative(args["target"])}, reduction="none")')
    return _marked(fx, True, "parallel_cross_entropy -> F.cross_entropy on gathered logits"), (
        "the vocab-sharded logits are all-gathered over tp (each rank's gradient is its slice, as NxD's was); per-token "
        "loss as before; labels of -100 now give a loss of 0 (F.cross_entropy's ignore_index) where NxD computed "
        "log-sum-exp for them; shards must be even (vocab divisible by tp)")


def _atom(ctx, node) -> str:
    text = ctx.src_relative(node)
    simple = (ast.Name, ast.Attribute, ast.Call, ast.Subscript, ast.Constant)
    return text if isinstance(node, simple) else f"({text})"


def divide_fix(site, ctx):
    args = _arg_forms(site.node, ("numerator", "denominator"))
    if args is None or len(args) != 2:
        return None
    fx = ctx.fixer()
    fx.replace(site.node, f"{_atom(ctx, args['numerator'])} // {_atom(ctx, args['denominator'])}")
    return _marked(fx, False, "divide -> //"), "NxD's divide also asserted that the division is exact: no longer checked"


def seed_fix(site, ctx):
    args = _arg_forms(site.node, ("seed",))
    if args is None or len(args) != 1 or not site.is_statement:
        return None
    fx = ctx.fixer()
    fx.replace(site.node, f"{fx.ref('torch')}.manual_seed({ctx.src_relative(args['seed'])})")
    return _marked(fx, False, "model_parallel_xla_manual_seed -> torch.manual_seed"), (
        "every rank seeds torch the same; the tp-sharded weights come from tp rank 0 (distribute_tensor), so no "
        "per-rank RNG tracker is needed; NxD's XLA RNG streams are not reproduced")


# -- checkpoints ------------------------------------------------------------------------------------------------------
_CKPT = {
    # NxD's order: (checkpoint_dir_str, tag, model, optimizer, scheduler, user_content, num_workers, use_xser,
    # num_kept_ckpts, ...); num_workers and use_xser (constants) have no counterpart and are dropped
    "save_checkpoint": (("path", "tag", "model", "optimizer", "scheduler", "user_content", "num_workers", "use_xser",
                         "num_kept_ckpts"), {"use_xser": (True, False), "num_workers": tuple(range(1, 257))}),
    "load_checkpoint": (("path", "tag", "model", "optimizer", "scheduler"), None),
    "has_checkpoint": (("path",), None),
}


def checkpoint_fix(site, ctx, shown):
    names, dropped = _CKPT[shown]
    dropped = dropped or {}
    call = site.node
    got = _arg_forms(call, names, dropped)
    if got is None or "path" not in got:
        return None
    if any(name in got and const_value(got[name], object()) not in allowed for name, allowed in dropped.items()):
        return None  # num_workers / use_xser given by position: only the constants the keyword may have
    fx = ctx.fixer()
    kept = [(name, a) for name, a in zip(names, call.args) if name not in dropped]
    # the module's function takes NxD's first six parameters by position; what came after the dropped ones (NxD's
    # num_kept_ckpts) goes by name
    parts = [ctx.src_relative(a) if i < 6 else f"{name}={ctx.src_relative(a)}" for i, (name, a) in enumerate(kept)]
    parts += [f"{kw.arg}={ctx.src_relative(kw.value)}" for kw in call.keywords if kw.arg in names and kw.arg not in dropped]
    fx.replace(call, f"{_state_name(ctx, fx)}.{shown}({', '.join(parts)})")
    return _marked(fx, True, f"nxd.{shown} -> torch.distributed.checkpoint"), (
        f"{MODULE}.{shown} keeps NxD's <path>/<tag> and <path>/newest layout in torch.distributed.checkpoint format "
        "(get_state_dict/set_state_dict); checkpoints NxD wrote (xser) do not load: convert them once with NxD; "
        "use_xser, num_workers and async saving have no counterpart")


# -- the trainer API: config + model + optimizer, one fix ------------------------------------------------------------
_NXD_ADAMW = {"lr": None, "betas": None, "eps": "1e-6", "weight_decay": "0.0"}  # NxD's defaults where torch's differ


def _scope_body(ctx, node):
    p = ctx.analysis.parent_of.get(node)
    while p is not None and not isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        p = ctx.analysis.parent_of.get(p)
    return p


def _assigned_call(ctx, call) -> "ast.Assign | None":
    stmt = ctx.analysis.parent_of.get(call)
    if isinstance(stmt, ast.Assign) and stmt.value is call and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        return stmt
    return None


def _dict_literal(node) -> "dict | None":
    if node is None:
        return {}
    if not isinstance(node, ast.Dict) or any(not isinstance(k, ast.Constant) for k in node.keys):
        return None
    return {k.value: v for k, v in zip(node.keys, node.values)}


def trainer_fix(site, ctx):
    """At nxd.neuronx_distributed_config: the config, and every initialize_parallel_model/optimizer that takes it."""
    call = site.node
    stmt = _assigned_call(ctx, call)
    if stmt is None or call.args or has_star_args(call):
        return None
    kws = {kw.arg: kw.value for kw in call.keywords}
    known = {"tensor_parallel_size", "pipeline_parallel_size", "optimizer_config", "mixed_precision_config",
             "model_init_config", "sequence_parallel", "activation_checkpoint_config"}
    if set(kws) - known:
        return None
    if const_value(kws.get("pipeline_parallel_size"), 1) != 1 or const_value(kws.get("sequence_parallel"), False) is not False:
        return None
    if "activation_checkpoint_config" in kws and const_value(kws["activation_checkpoint_config"], object()) is not None:
        return None
    opt_cfg = _dict_literal(kws.get("optimizer_config"))
    init_cfg = _dict_literal(kws.get("model_init_config"))
    if opt_cfg is None or init_cfg is None or set(opt_cfg) - {"zero_one_enabled", "grad_clipping", "max_grad_norm"}:
        return None
    if set(init_cfg) - {"meta_device_init", "param_init_fn"} or const_value(init_cfg.get("meta_device_init"), False) is not False:
        return None
    clipping = const_value(opt_cfg.get("grad_clipping"), True if "grad_clipping" not in opt_cfg else None)
    if clipping is None:
        return None
    cfg_name = stmt.targets[0].id
    body = _scope_body(ctx, stmt)
    uses = [n for n in walk(body) if isinstance(n, ast.Name) and n.id == cfg_name and n is not stmt.targets[0]]
    users = []
    for n in uses:
        user = ctx.analysis.parent_of.get(n)
        q = _module_resolve(ctx, user.func) if isinstance(user, ast.Call) else None
        if not (q and q.rpartition(".")[2] in ("initialize_parallel_model", "initialize_parallel_optimizer")
                and q.startswith("neuronx_distributed") and user.args and user.args[0] is n and not has_star_args(user)
                and _assigned_call(ctx, user) is not None):
            return None
        users.append((q.rpartition(".")[2], user))
    if not users or any(isinstance(n.ctx, ast.Store) for n in uses):
        return None
    fx = ctx.fixer()
    state = _state_name(ctx, fx)
    tp = kws.get("tensor_parallel_size")
    fx.replace(stmt, f"{state}.initialize_model_parallel(tensor_model_parallel_size={ctx.src_relative(tp) if tp is not None else '1'})")
    notes = ["the mesh is built as NxD's config built its groups; pipeline, sequence parallelism and activation "
             "checkpointing are not configured (none was asked for)"]
    device = ('"neuron"' if ctx.settings.device_style == "neuron"
              else f"{fx.ref('torch')}.accelerator.current_accelerator()")
    for kind, user in users:
        target = _assigned_call(ctx, user).targets[0].id
        if kind == "initialize_parallel_model":
            if len(user.args) < 2 or user.keywords:
                return None
            rest = ", ".join(ctx.src_relative(a) for a in user.args[2:])
            fx.replace(_assigned_call(ctx, user), f"{target} = {ctx.src_relative(user.args[1])}({rest}).to({device})")
            continue
        if len(user.args) != 3:
            return None
        cls_q = _module_resolve(ctx, user.args[1]) or ""
        kw = {k.arg: k.value for k in user.keywords}
        params = ctx.src_relative(user.args[2])
        if cls_q.startswith("neuronx_distributed") and cls_q.endswith("AdamW_FP32OptimParams"):
            if set(kw) - set(_NXD_ADAMW):
                return None
            parts = [params] + [f"{k}={ctx.src_relative(v)}" for k, v in kw.items()]
            parts += [f"{k}={d}" for k, d in _NXD_ADAMW.items() if d and k not in kw]
            opt = f"{fx.ref('torch.optim')}.AdamW({', '.join(parts)})"
            notes.append("AdamW_FP32OptimParams -> torch.optim.AdamW with NxD's defaults (eps=1e-6, weight_decay=0.0); "
                         "torch's AdamW adds eps to the bias-corrected denominator (NxD's, HF-style, to the raw one): "
                         "updates differ by O(eps); fp32 master copies of bf16 parameters are not kept (train fp32 "
                         "parameters with autocast)")
        elif cls_q.startswith("neuronx_distributed"):
            return None
        else:
            opt = f"{ctx.src_relative(user.args[1])}({', '.join([params] + [f'{k.arg}={ctx.src_relative(k.value)}' for k in user.keywords])})"
        max_norm = ctx.src_relative(opt_cfg["max_grad_norm"]) if "max_grad_norm" in opt_cfg else "1.0"
        hook = f"{state}.optimizer_step_pre_hook(max_grad_norm={max_norm if clipping else 'None'})"
        fx.replace(_assigned_call(ctx, user), f"{target} = {opt}\n{target}.register_step_pre_hook({hook})")
        notes.append("the optimizer's step first averages the gradients over mesh['dp'] and clips them (global norm "
                     "over tp-sharded and replicated parameters), as NxD's optimizer did")
        if const_value(opt_cfg.get("zero_one_enabled"), False) is not False:
            notes.append("zero_one_enabled: ZeRO-1's sharding of the optimizer state over dp is not kept (same updates; "
                         "each dp rank holds the whole optimizer state): for the memory saving use FSDP2 fully_shard "
                         "over mesh['dp']; optimizer.grad_norm no longer exists")
    if "mixed_precision_config" in kws:
        notes.append("mixed_precision_config is dropped: it acts on XLA's bf16 downcasting; the rewritten program "
                     "trains in the parameters' dtype (bf16: torch.autocast or FSDP2 MixedPrecisionPolicy)")
    if init_cfg.get("param_init_fn") is not None:
        notes.append("model_init_config's param_init_fn is dropped: NxD called it only with meta_device_init=True")
    return _marked(fx, True, "nxd trainer API -> DeviceMesh + plain model + optimizer"), "; ".join(notes)


def nxd_fix(site, ctx, shown):
    """(fix, note) for an NM160 site, or None when the site stays a finding."""
    kind = site.kind
    if kind == "import":
        return import_fix(site, ctx)
    if kind == "method":
        return init_weight_fix(site, ctx)
    if kind == "ref" and shown in LAYERS:
        return isinstance_fix(site, ctx, shown)
    if kind != "call":
        return None
    if shown in LAYERS or shown == "parallel_cross_entropy":
        if mesh_kept_nxd(ctx):
            return None  # they shard over parallel_mesh's mesh, which this file's NxD groups never make
        return layer_fix(site, ctx, shown) if shown in LAYERS else cross_entropy_fix(site, ctx)
    if shown == "divide":
        return divide_fix(site, ctx)
    if shown == "model_parallel_xla_manual_seed":
        return seed_fix(site, ctx)
    if shown in _CKPT:
        return checkpoint_fix(site, ctx, shown)
    if shown == "neuronx_distributed_config":
        return trainer_fix(site, ctx)
    return None
