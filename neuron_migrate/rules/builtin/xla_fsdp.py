"""torch_xla FSDP (NM151) and its auto-wrap policies (NM141) become torch.distributed.fsdp where meaning is kept.

One decision per file (`fsdp_plan`): the XLA FSDP wrapper, its policies and their imports migrate together, or
nothing does and every use keeps a finding that names what blocks it. A file that mixed torch_xla's wrapper with
torch's policies (or one wrap of each) would not run.
"""
from __future__ import annotations

import ast

from neuron_migrate.names.analysis import child_nodes, walk
from neuron_migrate.program import cached
from neuron_migrate.program import device_flow
from neuron_migrate.program.distributed import Group
from neuron_migrate.program.distributed import facts as distributed_facts
from neuron_migrate.program.distributed import function_of, scope_at
from neuron_migrate.rules.api import has_star_args, rule
from neuron_migrate.rules.builtin.xla_fsdp_checkpoint import consolidation_edits
from neuron_migrate.rules.model import Fix

TYPE_CHECKING = False  # typing is not imported at run time (start-up): it serves annotations only
if TYPE_CHECKING:
    from typing import Optional

PKG = "torch_xla.distributed.fsdp"
WRAPPERS = (f"{PKG}.XlaFullyShardedDataParallel", f"{PKG}.xla_fully_sharded_data_parallel.XlaFullyShardedDataParallel")
TORCH_FSDP = "torch.distributed.fsdp.FullyShardedDataParallel"
SHARDING = "torch.distributed.fsdp.ShardingStrategy"
_WRAP = f"{PKG}.wrap"
_POLICIES = ("transformer_auto_wrap_policy", "size_based_auto_wrap_policy", "always_wrap_policy", "lambda_auto_wrap_policy")
POLICIES = {f"{_WRAP}.{p}": p for p in _POLICIES}
_POLICY_ATTRS = ("FORCE_LEAF_MODULES", "EXCLUDE_WRAP_MODULES")  # torch's size_based policy has the same two sets
NATIVE_FAQ = "https://github.com/aws-neuron/aws-neuron-sdk/blob/master/frameworks/torch/pytorch-native-overview.rst"

# XLA FSDP-only APIs: a program that uses them keeps XLA FSDP (what they do has no one-line torch equivalent)
_XLA_ONLY_APIS = {
    "consolidate_sharded_model_checkpoints": "stitches the per-rank shard checkpoints XLA FSDP saved; torch FSDP saves "
                                             "with torch.distributed.checkpoint or get_model_state_dict(model, options="
                                             "StateDictOptions(full_state_dict=True))",
    "consolidate_sharded_state_dicts": "stitches XLA FSDP shard state dicts; use torch.distributed.checkpoint",
    "checkpoint_module": "is XLA's activation checkpointing wrapper; torch FSDP uses apply_activation_checkpointing "
                         "(torch.distributed.algorithms._checkpoint.checkpoint_wrapper) on the blocks",
    "recursive_wrap": "is XLA's wrapping loop, called with XLA FSDP's own keywords",
}
# XLA FSDP keyword -> (its default, why another value keeps the finding). The default means the keyword only
# spells out what torch FSDP does anyway: it is dropped.
_XLA_KWARGS = {
    "flatten_parameters": (False, "flatten_parameters=True flattened the parameters XLA's way (trainable and frozen "
                                  "apart); torch FSDP1 flattens each unit into one FlatParameter: choose use_orig_params by hand"),
    "execute_sharding_on_init": (True, "only cut the XLA graph at init (xm.mark_step); delete it and the wrap migrates"),
    "optimization_barrier_in_forward": (True, "an XLA compiler barrier (memory vs fusion); delete it and the wrap migrates"),
    "optimization_barrier_in_backward": (True, "an XLA compiler barrier (memory vs fusion); delete it and the wrap migrates"),
    "mark_step_on_finalization": (False, "cut the XLA graph after backward; delete it and the wrap migrates"),
    "pin_layout_in_collective_ops": (True, "an XLA layout hint for the collectives; delete it and the wrap migrates"),
    "disable_reshard_on_root": (True, "disable_reshard_on_root=False resharded the root after forward, which torch FSDP1 never does"),
    "compute_dtype": (None, "mixed precision: torch FSDP takes mixed_precision=MixedPrecision(param_dtype=..., reduce_dtype=..., "
                            "buffer_dtype=...), whose casts differ (XLA reduce-scattered in compute_dtype unless "
                            "fp32_reduce_scatter, kept buffers in buffer_dtype)"),
    "buffer_dtype": (None, "mixed precision of buffers: torch FSDP takes MixedPrecision(buffer_dtype=...)"),
    "fp32_reduce_scatter": (False, "mixed precision of the gradient reduce-scatter: torch FSDP takes MixedPrecision(reduce_dtype=...)"),
    "sharding_groups": (None, "shards over replica subgroups: torch FSDP takes process_group= (dist.new_group) or "
                              "device_mesh= with ShardingStrategy.HYBRID_SHARD"),
    "sharding_rank": (None, "belongs to sharding_groups: torch FSDP takes process_group= or device_mesh="),
    "sharding_world_size": (None, "belongs to sharding_groups: torch FSDP takes process_group= or device_mesh="),
    "shard_param_on_dim_0": (False, "sharded along dim 0 without flattening; torch FSDP1 always flattens"),
    "auto_wrapper_callable": (None, "wraps each auto-wrapped block with another callable (often checkpoint_module): "
                                    "torch FSDP wraps with itself; add activation checkpointing with apply_activation_checkpointing"),
    "param_init_fn": (None, "XLA materialised meta/deferred modules with its own loop; torch FSDP1 calls param_init_fn "
                            "on each meta-device module: check it by hand"),
    "_shard_size_multiple": (128, "a private XLA FSDP option"),
    "_use_xla_patched_linear": (True, "a private XLA FSDP option (XLA's patched nn.Linear backward)"),
}
for _debug in ("_debug_dummy_forward_pass", "_debug_print", "_debug_dummy_all_gather_op", "_debug_dummy_all_reduce_op",
               "_debug_dummy_reduce_scatter_op", "_debug_dummy_optimization_barrier_op"):
    _XLA_KWARGS[_debug] = (False, "a private XLA FSDP debugging option")
_XLA_KWARGS["_debug_msg"] = ("xla_fsdp", "a private XLA FSDP debugging option")
_MAPPED_KWARGS = ("module", "auto_wrap_policy", "reshard_after_forward")

# what the wrapped model may do after the migration without changing meaning
_STATE = ("state_dict", "load_state_dict")
_MODEL_BLOCKERS = {
    "named_parameters": "its parameter names change (XLA FSDP kept one shard per parameter; torch FSDP1 one flat "
                        "parameter per unit, `_flat_param`): per-name settings such as no weight decay on biases would be lost",
    "get_shard_metadata": "XLA FSDP's shard metadata (for consolidate_sharded_model_checkpoints); torch FSDP has none",
    "sharded_params": "an XLA FSDP attribute", "full_params": "an XLA FSDP attribute",
    "set_gradient_divide_factors": "an XLA FSDP method", "_shard_parameters_": "an XLA FSDP method",
}
# optimizers whose update of an element depends on that element alone: the same values, however the parameters
# are cut into shards (XLA FSDP: a slice of each parameter; torch FSDP1: a slice of the flattened unit)
_ELEMENTWISE_OPTIMIZERS = {f"torch.optim.{n}" for n in ("SGD", "Adam", "AdamW", "Adagrad", "Adadelta", "Adamax", "ASGD",
                                                         "NAdam", "RAdam", "RMSprop", "Rprop")}
_NOT_MODELS = ("torch.optim.", "torch.amp.", "torch.cuda.amp.", "torch.neuron.amp.", "torch_xla.amp.")
_LOGGING = {"info", "debug", "warning", "error", "exception", "log"}
_BUILTINS = {"print", "isinstance", "issubclass", "id", "repr", "str", "type", "hasattr", "getattr", "len"}


# A plain class, not a dataclass: importing dataclasses costs every start-up about 20 ms (files/records.py).
class Plan:
    """The file's XLA FSDP migration: `fix` when everything migrates, else the reasons (node, why)."""

    def __init__(self):
        self.uses: list = []  # (node, qualname) of every family use, imports included
        self.blockers: list = []
        self.fix: Optional[Fix] = None
        self.wraps: list = []
        self.dropped: list = []  # keywords dropped because they spell out the default
        self.fsdp2_mapped: list = []  # (node, why): keywords FSDP2 maps (mixed precision) and FSDP1 does not
        self.fsdp2 = False  # the fix writes FSDP2 fully_shard (else FSDP1 FullyShardedDataParallel)
        self.fsdp2_policy_kept = False  # FSDP2 with the policy kept (torch's), choosing the modules to shard
        # the blockers FSDP2 may lift: the wrapped model's state_dict()/load_state_dict() calls (FSDP2's state dict is
        # this rank's shard too), get_shard_metadata() and consolidate_sharded_model_checkpoints (xla_fsdp_checkpoint)
        self.shard_state: list = []
        self.metadata_uses: list = []
        self.consolidate_uses: list = []
        self.checkpoint: list = []  # (node, what): the model's state_dict()/get_shard_metadata() calls, reported with CKPT_PLAN

    @property
    def active(self) -> bool:
        """The file uses XLA FSDP itself (not only its policies, nor only imports of its submodules)."""
        return any(q not in (PKG, _WRAP) and q not in POLICIES and not q.startswith(tuple(f"{p}." for p in POLICIES))
                   for _n, q in self.uses)

    def why(self) -> str:
        found = sorted(self.blockers, key=lambda b: (b[0].lineno, b[0].col_offset))
        shown = "; ".join(f"line {n.lineno}: {r}" for n, r in found[:3])
        return shown + (f"; and {len(found) - 3} more" if len(found) > 3 else "")


def fsdp_plan(ctx) -> Plan:
    return cached(ctx.analysis, "xla-fsdp-plan", lambda _a: _build_plan(ctx))


def _scope_walk(analysis):
    """(node, scope) for every node of the file, in source order."""
    stack = [(analysis.tree, analysis.module_scope)]
    while stack:
        node, scope = stack.pop()
        yield node, scope
        inner = analysis.scope_of.get(node, scope) if node is not analysis.tree else scope
        for child in reversed(child_nodes(node)):
            stack.append((child, inner))


def _build_plan(ctx) -> Plan:
    a = ctx.analysis
    plan = Plan()
    if not any(q.startswith(PKG) for q in a.qualnames):
        return plan
    imports, scopes = [], {}
    skip: set = set()
    for node, scope in _scope_walk(a):
        if id(node) in skip:
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith(PKG):
            imports.append(node)
            for al in node.names:
                plan.uses.append((node, f"{node.module}.{al.name}"))
                if al.name == "*":
                    plan.blockers.append((node, f"`from {node.module} import *`: the names it binds cannot be followed"))
            continue
        if isinstance(node, (ast.Name, ast.Attribute)):
            q = a.resolve(node, scope, count_use=False)
            if q is not None:
                chain = node
                while isinstance(chain, ast.Attribute):
                    chain = chain.value
                    skip.add(id(chain))
                if not (q.startswith(PKG + ".") or q == PKG):
                    continue
                if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                    continue  # `FSDP = None` in an `except ImportError:` rebinds the name, whichever class it was
                if not isinstance(node.ctx, ast.Load):
                    plan.blockers.append((node, f"`{ctx.src(node)}` is assigned to (monkey-patched)"))
                plan.uses.append((node, q))
                scopes[id(node)] = scope
    if not plan.active:
        return plan
    fx = ctx.fixer("unsafe")
    names = _new_names(a)
    for node, q in plan.uses:
        if isinstance(node, ast.ImportFrom):
            continue
        _classify_use(ctx, plan, fx, node, q, scopes[id(node)], names)
    _check_model_uses(ctx, plan)
    if all(any(b is s for s in plan.shard_state) for b in plan.blockers):
        # FSDP2's model.state_dict() is this rank's shard (DTensors), as XLA FSDP's was: those calls keep meaning
        plan.fix = _fsdp2_fix(ctx, plan)
        if plan.fix is not None:
            plan.fsdp2 = True
            plan.blockers = []
            return plan
    plan.blockers += plan.fsdp2_mapped
    if plan.blockers:
        return plan
    for stmt in imports:
        _move_import(ctx, fx, stmt, names)
    fx.imports.sort(key=lambda r: r.statement())  # `... FullyShardedDataParallel as FSDP` before `... ShardingStrategy`
    plan.fix = fx.build("unsafe", description="XLA FSDP -> torch.distributed.fsdp")
    return plan


def _new_names(a) -> dict:
    """Local names for the torch objects: the user's alias where the import had one, else the plain name if free."""
    out = {}
    taken = a.defined_names
    out[TORCH_FSDP] = "FullyShardedDataParallel" if "FullyShardedDataParallel" not in taken else "FSDP"
    out[SHARDING] = "ShardingStrategy"
    return out


def _member_target(q: str) -> Optional[str]:
    if q in WRAPPERS:
        return TORCH_FSDP
    if q in POLICIES:
        return f"torch.distributed.fsdp.wrap.{POLICIES[q]}"
    return None


def _move_import(ctx, fx, stmt: ast.ImportFrom, names: dict) -> None:
    """`from torch_xla.distributed.fsdp[.wrap] import X [as Y]` -> the torch import of the same objects."""
    reqs, keep = [], []
    for al in stmt.names:
        target = _member_target(f"{stmt.module}.{al.name}")
        if target is None:  # a submodule (`wrap`): NM100 removes the import once nothing uses it
            keep.append(al.name + (f" as {al.asname}" if al.asname else ""))
            continue
        local = al.asname or (names[TORCH_FSDP] if target == TORCH_FSDP else target.rpartition(".")[2])
        reqs.append((target, local))
    if not reqs:
        return
    kept = [f"from {stmt.module} import {', '.join(keep)}"] if keep else []
    if isinstance(ctx.analysis.parent_of.get(stmt), ast.Module):
        if kept:
            fx.replace(stmt, kept[0])
        else:
            fx.delete(stmt)
        for target, local in reqs:  # imported again where isort puts it
            fx.member(target, local)
        return
    # inside a function or a try block: the new import takes the old one's place
    by_pkg: dict = {}
    for target, local in reqs:
        pkg, _, name = target.rpartition(".")
        by_pkg.setdefault(pkg, []).append(name + (f" as {local}" if local != name else ""))
    fx.replace(stmt, "\n".join(kept + [f"from {pkg} import {', '.join(ns)}" for pkg, ns in by_pkg.items()]))


def _classify_use(ctx, plan: Plan, fx, node, q: str, scope, names: dict) -> None:
    a = ctx.analysis
    parent = a.parent_of.get(node)
    short = q[len(PKG) + 1:] if q != PKG else PKG
    last = q.rsplit(".", 1)[1]
    if q in WRAPPERS:
        new = _spelling(ctx, fx, node, TORCH_FSDP, names)
        if isinstance(parent, ast.Call) and parent.func is node:
            if _check_wrap(ctx, plan, fx, parent, new or ctx.src_relative(node)):
                return  # the whole call was rewritten, callee included
        elif not _in_isinstance(a, node):
            plan.blockers.append((node, "XlaFullyShardedDataParallel is used as a value (not called or tested with "
                                        "isinstance): where it goes cannot be followed"))
            return
        if new is not None:
            fx.replace(node, new)
        return
    if q in POLICIES:
        if isinstance(parent, ast.Call) and parent.func is node and any(k.arg == "unwrapped_params" for k in parent.keywords):
            plan.blockers.append((node, f"`{last}` is called with unwrapped_params=, which torch's policy names nonwrapped_numel"))
            return
        new = _spelling(ctx, fx, node, f"torch.distributed.fsdp.wrap.{last}", names)
        if new is not None:
            fx.replace(node, new)
        return
    attr = q[len(_WRAP) + 1:] if q.startswith(_WRAP + ".") else ""
    if "." in attr and attr.split(".")[0] in _POLICIES and attr.split(".", 1)[1] in _POLICY_ATTRS:
        policy = attr.split(".")[0]
        base = node
        while isinstance(base, ast.Attribute) and a.resolve(base, scope, count_use=False) != f"{_WRAP}.{policy}":
            base = base.value
        new = _spelling(ctx, fx, base, f"torch.distributed.fsdp.wrap.{policy}", names)
        if new is not None:
            fx.replace(base, new)
        return
    why = _XLA_ONLY_APIS.get(last)
    if why:
        plan.blockers.append((node, f"`{short}` is XLA FSDP only: it {why}"))
        if last == "consolidate_sharded_model_checkpoints":  # FSDP2 may write it natively (xla_fsdp_checkpoint)
            plan.consolidate_uses.append(node)
            plan.shard_state.append(plan.blockers[-1])
    elif q == PKG or q in (_WRAP, f"{PKG}.xla_fully_sharded_data_parallel"):
        plan.blockers.append((node, f"the module `{short}` is used as a value"))
    else:
        plan.blockers.append((node, f"`{short}` is part of XLA FSDP's own machinery, with no torch equivalent"))


def _in_isinstance(a, node) -> bool:
    n = a.parent_of.get(node)
    if isinstance(n, ast.Tuple):
        n = a.parent_of.get(n)
    return isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("isinstance", "issubclass")


def _spelling(ctx, fx, node, target: str, names: dict) -> Optional[str]:
    """The new text of a use of an XLA FSDP object, or None when the moved import keeps its local name."""
    a = ctx.analysis
    if isinstance(node, ast.Name):
        # bound by a `from torch_xla.distributed.fsdp import X [as Y]`, which moves with the same local name,
        # unless that name was torch_xla's own class name
        return names[TORCH_FSDP] if node.id == "XlaFullyShardedDataParallel" else None
    # `xfsdp.XlaFullyShardedDataParallel`, `torch_xla.distributed.fsdp.wrap.size_based_auto_wrap_policy`
    local = names[TORCH_FSDP] if target == TORCH_FSDP else target.rpartition(".")[2]
    if local in a.defined_names and a.binding_for(target) != local:
        return fx.name(target)
    return fx.member(target, local)


def _is_policy(ctx, expr, fn, depth: int = 0) -> bool:
    """An XLA (or torch) auto-wrap policy, a functools.partial of one, or a name assigned only such values."""
    a = ctx.analysis
    if depth > 4 or expr is None:
        return False
    if isinstance(expr, ast.Constant) and expr.value is None:
        return True
    scope = a.scope_of.get(fn, a.module_scope) if fn is not None else a.module_scope
    if isinstance(expr, (ast.Name, ast.Attribute)):
        q = a.resolve(expr, scope, count_use=False)
        if q in POLICIES or (q or "").startswith("torch.distributed.fsdp.wrap."):
            return True
        if isinstance(expr, ast.Name) and q is None:
            # the nearest function (or the module) that assigns it: a lambda assigns nothing, and a closure
            # (`fsdp_wrap = lambda m: FSDP(m, auto_wrap_policy=policy)`) reads the function around it
            values, where = _assigned(a, fn, expr.id), fn
            while not values and where is not None:
                where = function_of(a, where)
                values = _assigned(a, where, expr.id)
            return bool(values) and all(_is_policy(ctx, v, where, depth + 1) for v in values)
        return False
    if isinstance(expr, ast.Call) and expr.args and a.resolve(expr.func, scope, count_use=False) == "functools.partial":
        return _is_policy(ctx, expr.args[0], fn, depth + 1) and not any(k.arg == "unwrapped_params" for k in expr.keywords)
    return False


def _assigned(a, fn, name: str) -> list:
    """Values assigned to `name` directly in `fn`'s body (module level when fn is None), nested defs excluded."""
    out = []
    if isinstance(fn, ast.Lambda):
        return out  # its body is one expression: it assigns nothing (but for a walrus, not followed)
    body = fn.body if fn is not None else a.tree.body
    stack = list(body)
    while stack:
        s = stack.pop()
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(s, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in s.targets):
            out.append(s.value)
        elif isinstance(s, (ast.AnnAssign, ast.AugAssign)) and isinstance(s.target, ast.Name) and s.target.id == name:
            out.append(s.value)
        stack.extend(c for c in child_nodes(s) if isinstance(c, ast.stmt))
    return out


def _is_default(node, default) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is type(default) and node.value == default


def _check_wrap(ctx, plan: Plan, fx, call: ast.Call, callee: str) -> bool:
    """Check one wrap call; True when the fix rewrites the whole call (keywords dropped or mapped)."""
    a = ctx.analysis
    plan.wraps.append(call)
    block = plan.blockers.append
    if has_star_args(call):
        block((call, "XlaFullyShardedDataParallel(*args/**kwargs): the options cannot be checked"))
        return False
    if len(call.args) > 1:
        block((call.args[1], "options passed by position (XLA FSDP's second parameter is reshard_after_forward, "
                             "torch FSDP's process_group): pass them by keyword"))
        return False
    module = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "module"), None)
    fn = function_of(a, call)
    for kw in call.keywords:
        if kw.arg in _XLA_KWARGS:
            default, why = _XLA_KWARGS[kw.arg]
            if _is_default(kw.value, default):
                plan.dropped.append(kw)
                continue
            if kw.arg in _FSDP2_MAPPED:
                plan.fsdp2_mapped.append((kw, f"{kw.arg}=: {why}"))
                continue
            block((kw, f"{kw.arg}=: {why}"))
        elif kw.arg == "auto_wrap_policy":
            if not _is_policy(ctx, kw.value, fn):
                block((kw, "auto_wrap_policy= is not one of torch_xla's policies: torch FSDP calls a policy as "
                           "policy(module=, recurse=, nonwrapped_numel=), where XLA FSDP passed unwrapped_params="))
        elif kw.arg not in _MAPPED_KWARGS:
            block((kw, f"{kw.arg}= is no XLA FSDP option this rule knows"))
    # XLA FSDP moved the module to the XLA device; torch FSDP keeps it where it is (and refuses the CPU)
    if module is None or device_flow.facts(a).placement(module) != device_flow.DEVICE:
        block((module or call, "the wrapped module is not known to be on the device: XLA FSDP moved it to the XLA "
                               "device, torch FSDP does not (move it first: `model.to(device)`)"))
    state = distributed_facts(a).group_at(call)
    if state not in (Group.ALWAYS, Group.LAUNCHED):
        block((call, "no process group is started on every path before the wrap: XLA FSDP used the XLA runtime's "
                     "world, torch FSDP needs init_process_group first"))
    return _rewrite_keywords(ctx, fx, call, callee)


def _rewrite_keywords(ctx, fx, call: ast.Call, callee: str) -> bool:
    """Drop the keywords that spell out the default, map reshard_after_forward to sharding_strategy."""
    keep, changed = [], False
    for kw in call.keywords:
        if kw.arg in _XLA_KWARGS:
            changed = True
            continue
        if kw.arg == "reshard_after_forward":
            changed = True
            s = fx.member(SHARDING, "ShardingStrategy") if "ShardingStrategy" not in ctx.analysis.defined_names \
                or ctx.analysis.binding_for(SHARDING) == "ShardingStrategy" else fx.name(SHARDING)
            v = kw.value
            if isinstance(v, ast.Constant) and v.value in (True, False):
                keep.append(f"sharding_strategy={s}.{'FULL_SHARD' if v.value else 'SHARD_GRAD_OP'}")
            else:
                keep.append(f"sharding_strategy={s}.FULL_SHARD if {ctx.src(v)} else {s}.SHARD_GRAD_OP")
            continue
        keep.append(ctx.src_relative(kw))
    if not changed:
        return False
    parts = [ctx.src_relative(x) for x in call.args] + keep
    fx.replace(call, f"{callee}({', '.join(parts)})")
    return True


_FSDP2_MAPPED = ("compute_dtype", "fp32_reduce_scatter")
FULLY_SHARD = "torch.distributed.fsdp.fully_shard"
MP_POLICY = "torch.distributed.fsdp.MixedPrecisionPolicy"


def _fsdp2_fix(ctx, plan: Plan) -> Optional[Fix]:
    """The FSDP2 rewrite, when every wrap has its exact fully_shard form: `T = FSDP(Y, auto_wrap_policy=P, ...)`
    with P absent or transformer_auto_wrap_policy of one layer class becomes `fully_shard` of each module of that
    class in Y, then of Y. None where anything is outside that shape (the FSDP1 rewrite is tried then)."""
    a = ctx.analysis
    if "fully_shard" in a.defined_names or "MixedPrecisionPolicy" in a.defined_names:
        return None
    fx = ctx.fixer("unsafe")
    allowed: set = set()
    targets = set()
    edits = []
    for call in plan.wraps:
        stmt = a.parent_of.get(call)
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and stmt.value is call
                and isinstance(stmt.targets[0], (ast.Name, ast.Attribute))):
            return None
        allowed.add(id(call.func))
        module = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "module"), None)
        kws = {k.arg: k.value for k in call.keywords if k not in plan.dropped and k.arg != "module"}
        if set(kws) - {"auto_wrap_policy", "reshard_after_forward", *_FSDP2_MAPPED}:
            return None
        layers, kept_policy = None, None
        policy_expr = kws.get("auto_wrap_policy")
        if policy_expr is not None and not (isinstance(policy_expr, ast.Constant) and policy_expr.value is None):
            if not isinstance(module, (ast.Name, ast.Attribute)):
                return None
            found = _layer_policy(ctx, policy_expr, call)
            if found is not None:
                layers, policy_node, assign = found
                allowed.add(id(policy_node))
                if assign is not None:
                    edits.append(("delete", assign))
            elif _is_policy(ctx, policy_expr, function_of(a, call)):
                kept_policy = policy_expr  # the policy stays (torch's), and chooses the modules as XLA's wrap did
                plan.fsdp2_policy_kept = True
            else:
                return None
        opts = []
        if "reshard_after_forward" in kws:
            opts.append(f"reshard_after_forward={ctx.src(kws['reshard_after_forward'])}")
        if "compute_dtype" in kws:
            reduce = ""
            if "fp32_reduce_scatter" in kws:
                if not (isinstance(kws["fp32_reduce_scatter"], ast.Constant) and kws["fp32_reduce_scatter"].value is True):
                    return None
                reduce = f", reduce_dtype={fx.ref('torch')}.float32"
            opts.append(f"mp_policy={fx.member(MP_POLICY)}(param_dtype={ctx.src(kws['compute_dtype'])}{reduce})")
        elif "fp32_reduce_scatter" in kws:
            return None  # only relevant with compute_dtype (and then mapped)
        fully = fx.member(FULLY_SHARD)
        extra = "".join(f", {o}" for o in opts)
        model = ctx.src_relative(module)
        target = ctx.src(stmt.targets[0])
        lines = []
        var = next(n for n in ("module", "submodule", "layer_module", "_module") if n not in a.defined_names)
        if layers is not None and len(layers) == 1:
            lines += [f"for {var} in {model}.modules():", f"    if isinstance({var}, {ctx.src(layers[0])}):",
                      f"        {fully}({var}{extra})"]
        elif layers is not None:  # classes may nest: the inner ones first (FSDP2 shards bottom-up)
            classes = ", ".join(ctx.src(c) for c in layers)
            lines += [f"for {var} in reversed(list({model}.modules())):  # innermost first",
                      f"    if isinstance({var}, ({classes})):", f"        {fully}({var}{extra})"]
        elif kept_policy is not None:
            lines += [f"for {var} in {fx.helper('_neuron_policy_modules')}({model}, {ctx.src(kept_policy)}):",
                      f"    {fully}({var}{extra})"]
        lines.append(f"{fully}({model}{extra})" if target == model else f"{target} = {fully}({model}{extra})")
        edits.append(("replace", stmt, "\n".join(lines)))
        targets.add(_terminal(stmt.targets[0]))
    if plan.fsdp2_policy_kept and not _point_policies_to_torch(ctx, plan, fx, allowed):
        return None
    if plan.metadata_uses or plan.consolidate_uses:
        if len(plan.wraps) != 1 or not consolidation_edits(ctx, plan, fx, ctx.src(a.parent_of[plan.wraps[0]].targets[0]), allowed):
            return None
    for node, _q in plan.uses:
        if not isinstance(node, ast.ImportFrom) and id(node) not in allowed:
            return None  # isinstance tests, policies elsewhere: FSDP1 keeps those
    for node in walk(a.tree):  # FSDP2 has no .module and no clip_grad_norm_ method
        if (isinstance(node, ast.Attribute) and node.attr in ("module", "clip_grad_norm_")
                and isinstance(node.value, (ast.Name, ast.Attribute)) and _terminal(node.value) in targets):
            return None
    for edit in edits:
        if edit[0] == "delete":
            fx.delete(edit[1])
        else:
            fx.replace(edit[1], edit[2])
    return fx.build("unsafe", description="XLA FSDP -> FSDP2 fully_shard")


def _point_policies_to_torch(ctx, plan: Plan, fx, allowed: set) -> bool:
    """Every reference to a torch_xla policy names torch.distributed.fsdp.wrap's (same parameters; the helper
    passes nonwrapped_numel=, which torch's expects, where XLA's recursive wrap passed unwrapped_params=). False
    where an import of the policies also imports something else."""
    a = ctx.analysis
    names = _new_names(a)
    for node, q in plan.uses:
        if isinstance(node, ast.ImportFrom):
            if node.module == _WRAP:
                if not all(f"{_WRAP}.{al.name}" in POLICIES for al in node.names):
                    return False
                _move_import(ctx, fx, node, names)
            continue
        if q in POLICIES:
            allowed.add(id(node))
            new = _spelling(ctx, fx, node, f"torch.distributed.fsdp.wrap.{POLICIES[q]}", names)
            if new is not None:
                fx.replace(node, new)
    return True


def _layer_policy(ctx, expr, call):
    """(layer class nodes, policy name node, assignment to delete or None) for
    `functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Layer, ...})`, given inline or through
    a name assigned that once and read only by this wrap."""
    a = ctx.analysis
    assign = None
    if isinstance(expr, ast.Name):
        loads = [n for n in walk(a.tree) if isinstance(n, ast.Name) and n.id == expr.id]
        stores = [n for n in loads if not isinstance(n.ctx, ast.Load)]
        if len(loads) != 2 or len(stores) != 1:
            return None
        assign = a.parent_of.get(stores[0])
        if not (isinstance(assign, ast.Assign) and len(assign.targets) == 1 and assign.targets[0] is stores[0]
                and function_of(a, assign) is function_of(a, call) and assign.lineno < call.lineno):
            return None
        expr = assign.value
    if not (isinstance(expr, ast.Call) and len(expr.args) == 1 and len(expr.keywords) == 1
            and expr.keywords[0].arg == "transformer_layer_cls"
            and a.resolve(expr.func, scope_at(a, expr), count_use=False) == "functools.partial"):
        return None
    policy = expr.args[0]
    if a.resolve(policy, scope_at(a, policy), count_use=False) != f"{_WRAP}.transformer_auto_wrap_policy":
        return None
    classes = expr.keywords[0].value
    if not (isinstance(classes, (ast.Set, ast.List, ast.Tuple)) and classes.elts
            and all(isinstance(c, (ast.Name, ast.Attribute)) for c in classes.elts)):
        return None
    return classes.elts, policy, assign


def _terminal(node) -> Optional[str]:
    """`model` of `model`, `self.model`, `model.module` (the wrapped module's own name)."""
    while isinstance(node, ast.Attribute) and node.attr == "module":
        node = node.value
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _check_model_uses(ctx, plan: Plan) -> None:
    """The wrapped model's uses in the file: state dicts, parameter names and escapes keep XLA FSDP."""
    a = ctx.analysis
    block = plan.blockers.append
    models, where = set(), {}
    for call in plan.wraps:
        parent = a.parent_of.get(call)
        targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target] if isinstance(parent, ast.AnnAssign) else None
        if not targets:
            block((call, "the wrapped model is not assigned to a name (its uses cannot be followed): assign it first"))
            continue
        for t in targets:
            name = _terminal(t)
            if name is None:
                block((call, "the wrapped model is assigned to something other than a name or attribute"))
                continue
            models.add(name)
            where.setdefault(name, []).append((function_of(a, call), call.end_lineno))
    if not models:
        return
    facts = distributed_facts(a)
    _follow_into_local_functions(a, facts, models, where)
    not_models = _non_model_names(ctx)
    for node in walk(a.tree):
        if isinstance(node, ast.Return) and node.value is not None and not facts.entry_point:
            values = node.value.elts if isinstance(node.value, (ast.Tuple, ast.List)) else [node.value]
            if any(isinstance(n, (ast.Name, ast.Attribute)) and _terminal(n) in models for n in values):
                block((node, "the wrapped model is returned from a library function: code in other files may read its "
                             "state_dict() (XLA FSDP: this rank's shard; torch FSDP: the full model)"))
        if not isinstance(node, ast.Attribute):
            continue
        receiver = node.value
        name = _terminal(receiver)
        after = name in models and _after_wrap(a, node, where[name])
        if node.attr in _STATE and (after or (name not in models and name not in not_models)):
            call = a.parent_of.get(node)
            if isinstance(call, ast.Call) and call.func is node:
                who = "the FSDP-wrapped model's" if name in models else f"`{ctx.src(receiver)}` (which may be the FSDP-wrapped model):"
                block((node, f"{who} {node.attr}(): XLA FSDP's state dict is this rank's shard, torch FSDP's default is "
                             "the full model, so what a checkpoint holds would change (use torch.distributed.checkpoint "
                             "or get_model_state_dict / set_model_state_dict by hand)"))
                if name in models:
                    plan.shard_state.append(plan.blockers[-1])
                    plan.checkpoint.append((node, f"`{ctx.src(node)}()` of the XLA FSDP model is this rank's shard "
                                                  "(flattened, with get_shard_metadata() to stitch it)"))
        elif after and node.attr in _MODEL_BLOCKERS:
            block((node, f"the FSDP-wrapped model's {node.attr}: {_MODEL_BLOCKERS[node.attr]}"))
            if node.attr == "get_shard_metadata":
                plan.metadata_uses.append(node)
                plan.shard_state.append(plan.blockers[-1])
                plan.checkpoint.append((node, f"`{ctx.src(node)}()` is XLA FSDP's shard layout, which "
                                              "consolidate_sharded_model_checkpoints reads; FSDP2 needs none (its DTensors "
                                              "carry their placement)"))
        elif after and node.attr == "parameters":
            call = a.parent_of.get(node)
            if not _feeds_elementwise_optimizer(ctx, call):
                block((node, "the FSDP-wrapped model's parameters() go elsewhere than an elementwise torch.optim optimizer "
                             "(SGD, Adam, AdamW, ...): XLA FSDP gave a slice of each parameter, torch FSDP1 gives a slice "
                             "of the flattened unit, so norms or per-tensor statistics over them change (clip with "
                             "model.clip_grad_norm_(max_norm) instead)"))
        elif after and node.attr == "clip_grad_norm_":
            call = a.parent_of.get(node)
            if isinstance(call, ast.Call) and (len(call.args) > 2 or any(k.arg == "groups" for k in call.keywords) or has_star_args(call)):
                block((node, "clip_grad_norm_(groups=...) reduced the norm over replica groups; torch FSDP's has no groups"))
    for call_node in walk(a.tree):
        if not isinstance(call_node, ast.Call):
            continue
        args = [*call_node.args, *[k.value for k in call_node.keywords]]
        passed = [x for x in args if isinstance(x, (ast.Name, ast.Attribute)) and _terminal(x) in models
                  and _after_wrap(a, x, where[_terminal(x)])]
        if not passed or _local_or_builtin(ctx, call_node):
            continue
        block((call_node, f"the wrapped model is passed to `{ctx.src(call_node.func)}`, defined outside this file: its "
                          "state_dict or parameter uses there cannot be checked"))


def _follow_into_local_functions(a, facts, models: set, where: dict) -> None:
    """A function of this file that gets the model as an argument names it by its parameter: check those uses too."""
    for _ in range(3):
        added = False
        for name, calls in facts.local_calls.items():
            for call in calls:
                for fn in facts.defs.get(name, []):
                    params = [x.arg for x in [*fn.args.posonlyargs, *fn.args.args]]
                    passed = [(params[i] if i < len(params) else None, x) for i, x in enumerate(call.args)]
                    passed += [(k.arg, k.value) for k in call.keywords]
                    for param, x in passed:
                        if param and param not in models and isinstance(x, (ast.Name, ast.Attribute)) and _terminal(x) in models:
                            models.add(param)
                            where.setdefault(param, []).append((fn, fn.lineno))
                            added = True
        if not added:
            return


def _after_wrap(a, node, wraps) -> bool:
    """The use runs after a wrap: later in the wrap's own function, or anywhere in another function."""
    fn = function_of(a, node)
    for wfn, end in wraps:
        if fn is not wfn or node.lineno > end:
            return True
    return False


def _local_or_builtin(ctx, call: ast.Call) -> bool:
    """A callee whose use of the model this check sees (defined in the file) or that only looks at it."""
    f = call.func
    defs = distributed_facts(ctx.analysis).defs
    if isinstance(f, ast.Name):
        return f.id in _BUILTINS or f.id in defs
    if isinstance(f, ast.Attribute):
        return (isinstance(f.value, ast.Name) and f.value.id == "self" and f.attr in defs) or f.attr in _LOGGING
    return False


def _feeds_elementwise_optimizer(ctx, call) -> bool:
    a = ctx.analysis
    if not isinstance(call, ast.Call):
        return False
    opt = a.parent_of.get(call)
    if not isinstance(opt, ast.Call) or not opt.args or opt.args[0] is not call:
        return False
    return a.resolve(opt.func, scope_at(a, opt), count_use=False) in _ELEMENTWISE_OPTIMIZERS


def _non_model_names(ctx) -> set:
    """Names assigned an optimizer, scheduler or grad scaler in this file: their state_dict() is not the model's."""
    a = ctx.analysis
    out = set()
    for node, scope in _scope_walk(a):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            q = a.resolve(node.value.func, scope, count_use=False) or ""
            if q.startswith(_NOT_MODELS) or q.endswith(("Optimizer", "Scheduler", "GradScaler", "LR")):
                out.update(n for n in map(_terminal, node.targets) if n)
    return out


# -- NM151 ------------------------------------------------------------------------------------------
_FAMILY = [*WRAPPERS, *(f"{PKG}.{n}" for n in ("consolidate_sharded_model_checkpoints", "consolidate_sharded_state_dicts",
                                                "checkpoint_module", "wrap.recursive_wrap"))]
_PREFIXES = [f"{PKG}.xla_fully_sharded_data_parallel.*", f"{PKG}.state_dict_utils.*", f"{PKG}.utils.*",
             f"{PKG}.xla_flatten_params_wrapper.*", f"{PKG}.checkpoint_consolidation.*"]


@rule(
    code="NM151",
    name="xla-fsdp",
    summary="torch_xla FSDP becomes torch.distributed.fsdp.FullyShardedDataParallel where the program keeps its meaning",
    fix="unsafe",
    severity="error",
    triggers=[(kind, q) for q in [*_FAMILY, *_PREFIXES] for kind in ("call", "ref", "store", "import")],
    docs=f"""
        `XlaFullyShardedDataParallel` belongs to torch_xla. TorchNeuron supports torch FSDP1
        (`torch.distributed.fsdp.FullyShardedDataParallel`) and FSDP2 `fully_shard` in eager mode ({NATIVE_FAQ}).
        The file's XLA FSDP migrates to FSDP1 as a whole (wrapper, auto-wrap policies of NM141, their imports), or
        not at all, when all of this holds:

        - Every wrap passes the module and keywords only. `auto_wrap_policy=` is one of torch_xla's policies, a
          `functools.partial` of one, or a name assigned only such values (torch calls a policy with
          `nonwrapped_numel=` where XLA passed `unwrapped_params=`, so a custom policy would break).
          `reshard_after_forward=True/False` becomes `sharding_strategy=ShardingStrategy.FULL_SHARD/SHARD_GRAD_OP`
          (both keep the root unsharded after forward, as XLA's `disable_reshard_on_root=True` did). An XLA-only
          keyword given its default value is dropped. Any other value keeps the finding: mixed precision
          (`compute_dtype`, `buffer_dtype`, `fp32_reduce_scatter`: torch's `MixedPrecision` casts differently),
          `sharding_groups`/`sharding_rank`/`sharding_world_size`, `shard_param_on_dim_0`,
          `flatten_parameters=True`, `disable_reshard_on_root=False`, `auto_wrapper_callable`, `param_init_fn`,
          private `_debug_*` options, and the XLA graph knobs (`execute_sharding_on_init`,
          `optimization_barrier_in_*`, `mark_step_on_finalization`, `pin_layout_in_collective_ops`: they only
          shaped the XLA graph, so the finding says to delete them).
        - The module is on the device when wrapped (XLA FSDP moved it to the XLA device; torch FSDP keeps it
          where it is) and a process group exists on every path to the wrap (torch FSDP needs one).
        - No XLA-FSDP-only API is used in the file: `consolidate_sharded_model_checkpoints`,
          `consolidate_sharded_state_dicts`, `checkpoint_module`, `recursive_wrap`, `get_shard_metadata()`
          (FSDP2 rewrites one checkpoint shape of the first and the last, below).
        - The wrapped model's `state_dict()`/`load_state_dict()` is not called (nor that of anything in the file
          that may be it): XLA FSDP's state dict is this rank's shard, torch FSDP's default is the full model,
          so what a checkpoint holds would change. Save with `torch.distributed.checkpoint` or
          `get_model_state_dict` by hand.
        - Its `parameters()` feed only an elementwise `torch.optim` optimizer (SGD, Adam, AdamW, Adagrad,
          Adadelta, Adamax, ASGD, NAdam, RAdam, RMSprop, Rprop): XLA FSDP gave the optimizer a slice of each
          parameter, FSDP1 a slice of each flattened unit, which is the same arithmetic only for updates that
          read each element alone (no norms, no per-tensor statistics; `model.clip_grad_norm_(max_norm)` is
          fine, torch's also reduces over all ranks). `named_parameters()` keeps the finding (names change).
        - The wrapped model does not leave the file's view (returned from a library function, passed to a
          function defined elsewhere).

        Unsafe: the optimizer's tensors (and so its own state_dict) have another layout, XLA checkpoints of the
        old run do not load, and memory use differs. `xm.optimizer_step(opt)` on the wrapped model's optimizer
        becomes `opt.step()` (NM110): XLA FSDP documents that `xm.optimizer_step` must not be used with it (it
        all-reduced the already reduce-scattered shard gradients); torch FSDP averages the gradients itself.
        FSDP2 (preferred by TorchNeuron): where every wrap is `T = FSDP(Y, ...)` with keywords among
        `auto_wrap_policy`, `reshard_after_forward` (same name in FSDP2), `compute_dtype` (->
        `mp_policy=MixedPrecisionPolicy(param_dtype=...)`, with `reduce_dtype=torch.float32` for
        `fp32_reduce_scatter=True`) and XLA defaults, and the model's `.module`/`.clip_grad_norm_` and
        `isinstance` tests unused, the fix calls `fully_shard` on each module XLA FSDP's auto-wrap gave its own
        unit, innermost first (FSDP2 shards bottom-up), then `fully_shard(Y)`. With no policy: `fully_shard(Y)`.
        `functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={{Layer}})`: a loop over
        `Y.modules()` with `isinstance(module, Layer)`, and the policy is deleted; several classes (which may
        nest, as an RMSNorm inside a decoder layer): the loop runs over `reversed(list(Y.modules()))`, inner
        modules first. Any other torch_xla policy (`size_based_auto_wrap_policy`, `lambda_auto_wrap_policy`,
        `always_wrap_policy`, a `functools.partial` of one or a name assigned one): the policy stays, pointed at
        torch.distributed.fsdp.wrap's (same parameters), and the inserted `_neuron_policy_modules(Y, policy)`
        returns the modules XLA's recursive wrap chose (the policy asked about each module with its subtree's
        parameters, then with those its wrapped children left, with `nonwrapped_numel=` for XLA's
        `unwrapped_params=`); checked against torch_xla 2.9's own wrapping on a decoder (slow suite). FSDP2 leaves buffers in their dtype (XLA FSDP cast
        floating buffers to `buffer_dtype`, default `compute_dtype`: the finding says so). The checkpoint shape of
        torch_xla's test_train_mp_mnist_fsdp_with_ckpt.py migrates with FSDP2: `xm.save(D, f"{{prefix}}...",
        master_only=False)` of a dict literal `D` holding `"model": model.state_dict()` and `"shard_metadata":
        model.get_shard_metadata()`, then (only barriers and prints between) `if xm.is_master_ordinal(local=False):
        consolidate_sharded_model_checkpoints(prefix, suffix)` whose `prefix + suffix` pattern matches the saved
        file: the `shard_metadata` entry goes (FSDP2 needs none), and the consolidation becomes
        `get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))` on every
        rank (a collective, so before the `if`) and `torch.save({{"model": ...}}, path)` inside it, at XLA's path.
        Shards saved for a consolidation elsewhere, a consolidation later in training, on each host's first rank
        (`local=True`) or of other files keep XLA FSDP and the finding. Checked by running
        (tests/integration/test_fsdp_zero_rewrite.py): a decoder program rewritten this way gives, with 2
        processes, the 1-process loss within 1e-5 at every step.
    """,
    examples=[("from torch_xla.distributed.fsdp import XlaFullyShardedDataParallel as FSDP\n"
               "dist.init_process_group(\"xla\", init_method=\"xla://\")\nmodel = FSDP(nn.Linear(4, 4).to(\"xla\"), reshard_after_forward=False)",
               "from torch.distributed.fsdp import FullyShardedDataParallel as FSDP\nfrom torch.distributed.fsdp import ShardingStrategy\n"
               "dist.init_process_group(\"neuron\")\nmodel = FSDP(nn.Linear(4, 4).to(\"neuron\"), sharding_strategy=ShardingStrategy.SHARD_GRAD_OP)")],
)
def xla_fsdp(site, ctx):
    plan = fsdp_plan(ctx)
    name = site.key[len(PKG) + 1:] if site.key.startswith(PKG + ".") else site.key
    if plan.fix is None:
        if site.kind == "import" and not plan.active:
            return None
        reason = plan.why() if plan.blockers else "the file's use of XLA FSDP cannot be followed"
        if site.kind != "import" and name.rsplit(".", 1)[-1] in ("consolidate_sharded_model_checkpoints",
                                                                 "consolidate_sharded_state_dicts"):
            return ctx.finding(site, f"`{name}` stitches the per-rank shard checkpoints XLA FSDP saved, and stays with XLA "
                                     f"FSDP ({reason}). {CKPT_PLAN}")
        if site.kind == "call" and plan.wraps and site.node is plan.wraps[0] and plan.checkpoint:
            # the checkpoint calls on the model are no trigger of their own: reported once, from the first wrap
            extra = [ctx.finding(node, f"{what}: XLA FSDP stays in this file ({reason}). {CKPT_PLAN}")
                     for node, what in plan.checkpoint]
            return [_kept_finding(ctx, site, name, reason), *extra]
        return _kept_finding(ctx, site, name, reason)
    return _migrated_finding(ctx, site, plan, name)


CKPT_PLAN = ("Native plan (with FSDP2 fully_shard): each rank's shard goes through torch.distributed.checkpoint, "
             "dcp.save({'model': get_model_state_dict(model), 'optim': get_optimizer_state_dict(model, optimizer)}, "
             "checkpoint_id=DIR), resumed with dcp.load of the same dict then set_model_state_dict / "
             "set_optimizer_state_dict (torch.distributed.checkpoint.state_dict); the consolidated model that "
             "consolidate_sharded_model_checkpoints wrote is get_model_state_dict(model, options=StateDictOptions("
             "full_state_dict=True, cpu_offload=True)), called on every rank (a collective), saved with torch.save on "
             "rank 0; get_shard_metadata() is not needed. XLA FSDP checkpoints of earlier runs do not load.")


def _kept_finding(ctx, site, name, reason):
    # the reasons and the plan are said once, at the file's first such finding; the others point there
    first = cached(ctx.analysis, "NM151 first kept finding", lambda _a: (site.node.lineno, site.key))
    if first != (site.node.lineno, site.key):
        return ctx.finding(site, f"`{name}` is torch_xla FSDP and stays, with the rest of the file's XLA FSDP: see line "
                                 f"{first[0]} for why and the native plan")
    return ctx.finding(site, f"`{name}` is torch_xla FSDP and stays ({reason}): migrate it by hand to "
                             "torch.distributed.fsdp (FullyShardedDataParallel, or FSDP2 fully_shard on each block "
                             "then the model; compute_dtype/buffer_dtype -> MixedPrecisionPolicy(param_dtype=..., "
                             "reduce_dtype=...); checkpoint_module -> apply_activation_checkpointing) and save with "
                             "torch.distributed.checkpoint (consolidation: get_model_state_dict with "
                             "StateDictOptions(full_state_dict=True, cpu_offload=True) on every rank, saved on rank 0)")


def _migrated_finding(ctx, site, plan: Plan, name):
    if plan.fsdp2:
        if site.kind == "call" and site.node in plan.wraps:
            kws = {k.arg for k in site.node.keywords}
            note = ("FSDP2 shards each parameter on dim 0 (DTensor) and averages gradients by reduce-scatter as XLA FSDP "
                    "did; parameter names stay those of the unwrapped model; the optimizer must be built after "
                    "fully_shard (as XLA FSDP required). Checkpoints of XLA FSDP runs do not load.")
            if plan.consolidate_uses:
                note += (" consolidate_sharded_model_checkpoints (line " + ", ".join(str(n.lineno) for n in plan.consolidate_uses)
                         + ") becomes get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, "
                         "cpu_offload=True)) on every rank (a collective: before the master's `if`), saved by the master as "
                         "{'model': ...} at XLA's path (the model is as it was saved: only barriers and prints lie between); "
                         "the 'shard_metadata' entry (get_shard_metadata(), read only by the consolidation) leaves the "
                         "per-rank checkpoint.")
            if plan.checkpoint:
                note += (" The model's state_dict()/load_state_dict() (line " + ", ".join(
                    str(n.lineno) for n, _ in plan.checkpoint) + ") stay this rank's shard: FSDP2's state dict holds "
                         "this rank's DTensor shards (a checkpoint loads back at the same world size); the full model is "
                         "get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)), "
                         "called on every rank.")
            if "compute_dtype" in kws:
                note += (" Mixed precision: MixedPrecisionPolicy casts the parameters and the floating inputs to param_dtype and "
                         "reduces gradients in it (reduce_dtype=torch.float32 for fp32_reduce_scatter=True); XLA FSDP also "
                         "cast floating buffers to buffer_dtype (default compute_dtype), FSDP2 leaves buffers as they are.")
            return ctx.finding(site, "XLA FSDP wrap becomes FSDP2 fully_shard (each module the auto-wrap policy wrapped, "
                                     "innermost first, then the model)", fix=plan.fix, note=note)
        return ctx.finding(site, f"`{name}`: XLA FSDP becomes FSDP2 fully_shard (torch.distributed.fsdp)", fix=plan.fix)
    if site.kind == "import":
        return ctx.finding(site, f"`{name}`: imported from torch.distributed.fsdp instead", fix=plan.fix)
    if site.kind == "call" and site.node in plan.wraps:
        dropped = [k.arg for k in plan.dropped if k in site.node.keywords]
        extra = f"; {', '.join(dropped)} dropped (set to XLA FSDP's default)" if dropped else ""
        note = ("The optimizer sees torch FSDP's flat shards: its state_dict layout changes, and XLA FSDP checkpoints "
                "of earlier runs do not load. FSDP2 fully_shard is the next step.")
        steps = distributed_facts(ctx.analysis).calls.get("torch_xla.core.xla_model.optimizer_step", [])
        if steps:
            note += (f" xm.optimizer_step (line {', '.join(str(c.lineno) for c in steps)}) all-reduced the already "
                     "reduce-scattered shard gradients once more, which XLA FSDP documents as wrong; it becomes "
                     "optimizer.step() (NM110): torch FSDP averages the gradients itself.")
        return ctx.finding(site, "XLA FSDP wrap becomes torch FSDP (FullyShardedDataParallel, FULL_SHARD unless "
                                 f"reshard_after_forward=False){extra}", fix=plan.fix, note=note)
    return ctx.finding(site, f"`{name}` becomes torch.distributed.fsdp's", fix=plan.fix)


# -- NM141 ------------------------------------------------------------------------------------------
@rule(
    code="NM141",
    name="xla-fsdp-wrap-policy",
    summary="torch_xla FSDP auto-wrap policies become torch.distributed.fsdp.wrap policies (with the wrapper, NM151)",
    fix="unsafe",
    severity="warning",
    triggers=[(kind, q) for q in POLICIES for kind in ("call", "ref")],
    docs="""
        torch_xla's FSDP copied the auto-wrap policies of torch.distributed.fsdp.wrap: `size_based_auto_wrap_policy`
        (`min_num_params=1e8`, `force_leaf_modules`, `exclude_wrap_modules`, with the same default sets),
        `transformer_auto_wrap_policy` (`transformer_layer_cls`), `lambda_auto_wrap_policy` (`lambda_fn`) and
        `always_wrap_policy` have the same parameters in torch 2.13, except the third, which torch_xla names
        `unwrapped_params` and torch `nonwrapped_numel`. The policy and its wrapper migrate together or not at
        all, because each wrapper calls the policy with its own keyword: in a file that uses
        `XlaFullyShardedDataParallel`, NM151's fix moves the policies with the wrapper (and this finding says so),
        or, where NM151 keeps XLA FSDP, the policies stay torch_xla's. In a file with policies only, the policy
        functions are renamed to the native ones. Unsafe: a policy called directly with `unwrapped_params=`
        breaks; `min_num_params=` and `transformer_layer_cls=` are the same.
    """,
    examples=[("import torch_xla.distributed.fsdp.wrap as xw\npolicy = functools.partial(xw.transformer_auto_wrap_policy, transformer_layer_cls={Block})",
               "policy = functools.partial(torch.distributed.fsdp.wrap.transformer_auto_wrap_policy, transformer_layer_cls={Block})")],
)
def xla_fsdp_wrap_policy(site, ctx):
    name = site.key.rsplit(".", 1)[1]
    plan = fsdp_plan(ctx)
    if plan.active:
        if plan.fsdp2 and plan.fsdp2_policy_kept:
            return ctx.finding(site, f"`{name}` becomes torch.distributed.fsdp.wrap's, and _neuron_policy_modules asks it which "
                                     "modules get FSDP2 fully_shard, as XLA FSDP's recursive wrap did (NM151's fix)", fix=plan.fix)
        if plan.fsdp2:
            return ctx.finding(site, f"`{name}` becomes a loop calling FSDP2 fully_shard on each module of its layer "
                                     "class(es) (NM151's fix)", fix=plan.fix)
        if plan.fix is not None:
            return ctx.finding(site, f"`{name}` moves to torch.distributed.fsdp.wrap together with the XLA FSDP wrapper "
                                     "(NM151's fix)")
        return ctx.finding(site, f"`{name}` stays torch_xla's while XlaFullyShardedDataParallel does (it calls the policy with "
                                 "unwrapped_params=, which the native policy lacks): migrate the wrapper and its policy together (NM151)")
    fx = ctx.fixer()
    callee = site.node.func if site.kind == "call" else site.node
    fx.replace(callee, fx.name(f"torch.distributed.fsdp.wrap.{name}", site.scope))
    return ctx.finding(site, f"`{name}`: the torch.distributed.fsdp.wrap policy of the same name takes the same keyword arguments",
                       fix=fx.build(), note="Native policies get (module, recurse, nonwrapped_numel) from FSDP; pass options by keyword "
                                            "(functools.partial(policy, min_num_params=...)). FSDP2 fully_shard has no auto-wrap: call "
                                            "fully_shard on each block instead.")
