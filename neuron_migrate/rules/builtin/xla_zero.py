"""torch_xla's ZeroRedundancyOptimizer (NM153) becomes torch.distributed.optim.ZeroRedundancyOptimizer plus the
gradient averaging (and clipping) that torch_xla's did inside step().

One decision per file (`zero_plan`): every construction, its import and every step of the optimizer it builds
migrate together, or nothing does and each use keeps a finding naming what blocks it. torch's ZeRO only shards the
optimizer state and expects DDP to have averaged the gradients; swapping the class alone trains each parameter on
the gradient of the rank that owns its shard (issue 41: [-1, -2] where the average is [-1.5, -1.5]).
"""
from __future__ import annotations

import ast

from neuron_migrate.names.analysis import walk
from neuron_migrate.program import cached
from neuron_migrate.program.distributed import Group
from neuron_migrate.program.distributed import facts as distributed_facts
from neuron_migrate.program.distributed import scope_at
from neuron_migrate.rules.api import _dedent_continuation, has_star_args, rule
from neuron_migrate.rules.builtin import xla_distributed_helpers  # noqa: F401  (registers the helpers)
from neuron_migrate.rules.builtin.xla_fsdp import _ELEMENTWISE_OPTIMIZERS, _scope_walk, _terminal
from neuron_migrate.rules.model import Fix

TYPE_CHECKING = False  # typing is not imported at run time (start-up): it serves annotations only
if TYPE_CHECKING:
    from typing import Optional

MODULE = "torch_xla.distributed.zero_redundancy_optimizer"
XLA_ZERO = f"{MODULE}.ZeroRedundancyOptimizer"
TORCH_ZERO = "torch.distributed.optim.ZeroRedundancyOptimizer"
OPTIMIZER_STEP = "torch_xla.core.xla_model.optimizer_step"

# keyword -> (the values that keep meaning when dropped, why another value keeps the finding). `None` in the
# values stands for the literal None.
_DROPPED = {
    "pin_layout": (None, "an XLA layout hint for the collectives"),  # any value: dropped
    "bucket_cap_mb_all_gather": (None, "bucketing of XLA's all-gather (performance only)"),
    "bucket_cap_mb_reduce_scatter": (None, "bucketing of XLA's reduce-scatter (performance only)"),
    "coalesce_cc": (None, "coalescing of XLA's collectives (performance only)"),
}
_DEFAULT_ONLY = {
    "optimizer_dtype": ((None,), "optimizer_dtype= kept fp32 (or another dtype) master shards of the parameters: "
                                 "torch's ZeRO steps the parameters in their own dtype (keep them fp32 and use autocast, "
                                 "or FSDP2 with MixedPrecisionPolicy(param_dtype=torch.bfloat16))"),
    "sharding_groups": ((None,), "sharding_groups= sharded over replica subgroups: torch's ZeRO takes process_group= "
                                 "(dist.new_group), and the gradients must be averaged over the same group"),
    "grad_norm_groups": ((None,), "grad_norm_groups= reduced the clipping norm over model-parallel groups too: clip "
                                  "with torch.nn.utils.clip_grad_norm_ on DTensor gradients (it reduces over the mesh)"),
    "lazy_init": ((False,), "lazy_init=True deferred the sharding to opt.init_zero(), which torch's ZeRO does not have"),
    "save_master_weights": ((False,), "save_master_weights=True put the master shards in the state dict"),
    "higher_cc_precision": ((False,), "higher_cc_precision=True reduced the gradients in fp32"),
    "use_grad_acc_hook": ((False,), "use_grad_acc_hook=True accumulated gradients in hooks of its own"),
    "grad_norm_type": ((2, 2.0), "a norm other than 2 (torch_xla raised on it)"),
}
_OPT_BLOCKERS = {
    "state_dict": "torch_xla's state dict held this rank's shard state ('base_state'); torch's needs "
                  "consolidate_state_dict(to=0) first and holds the whole state on that rank",
    "load_state_dict": "checkpoints of torch_xla's ZeRO (per-rank 'base_state') do not load into torch's",
    "init_zero": "torch_xla's deferred initialisation; torch's ZeRO has none",
    "base_optimizer": "torch_xla's inner optimizer over the shards (torch's is `.optim`, over whole parameters)",
    "sharding_groups": "a torch_xla attribute",
}


class Plan:
    """The file's ZeRO migration: `fix` when everything migrates, else the reasons (node, why)."""

    def __init__(self):
        self.uses: list = []  # (node, qualname)
        self.blockers: list = []
        self.calls: list = []  # constructions
        self.steps: list = []  # (step statement, optimizer expression, clip text or None)
        self.dropped: dict = {}  # id(call) -> keyword names dropped
        self.clip: dict = {}  # id(call) -> max_norm text, or None without clipping
        self.fix: Optional[Fix] = None

    def why(self) -> str:
        found = sorted(self.blockers, key=lambda b: (b[0].lineno, b[0].col_offset))
        shown = "; ".join(f"line {n.lineno}: {r}" for n, r in found[:3])
        return shown + (f"; and {len(found) - 3} more" if len(found) > 3 else "")


def zero_plan(ctx) -> Plan:
    return cached(ctx.analysis, "xla-zero-plan", lambda _a: _build_plan(ctx))


def _build_plan(ctx) -> Plan:
    a = ctx.analysis
    plan = Plan()
    if not any(q.startswith(MODULE) for q in a.qualnames):
        return plan
    imports = []
    for node, scope in _scope_walk(a):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == MODULE:
            imports.append(node)
            for al in node.names:
                plan.uses.append((node, f"{MODULE}.{al.name}"))
                if al.name not in ("ZeroRedundancyOptimizer",):
                    plan.blockers.append((node, f"`{al.name}` imported from {MODULE}: only ZeroRedundancyOptimizer migrates"))
            continue
        if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load):
            parent = a.parent_of.get(node)
            if isinstance(parent, ast.Attribute):
                continue  # the longest chain is resolved
            q = a.resolve(node, scope, count_use=False)
            if q is None or not q.startswith(MODULE):
                continue
            plan.uses.append((node, q))
            if q != XLA_ZERO:
                plan.blockers.append((node, f"`{ctx.src(node)}` is used as a value: where it goes cannot be followed"))
            elif isinstance(parent, ast.Call) and parent.func is node:
                _check_call(ctx, plan, parent)
            else:
                plan.blockers.append((node, "ZeroRedundancyOptimizer is used as a value (subclassed, passed on): its "
                                            "steps cannot be followed"))
    if not plan.calls and not plan.blockers:
        return plan  # imports only: NM100 removes an unused import
    _check_optimizer_uses(ctx, plan)
    if plan.blockers:
        return plan
    fx = ctx.fixer("unsafe")
    for stmt in imports:
        _move_import(ctx, fx, stmt)
    for call in plan.calls:
        _rewrite_call(ctx, fx, call, plan)
    state = {distributed_facts(a).group_at(s) for s, _o, _c in plan.steps}
    helper = fx.helper("_neuron_average_gradients" if state == {Group.ALWAYS} else "_neuron_reduce_gradients")
    for stmt, opt, clip in plan.steps:
        lines = [f"{helper}({ctx.src(opt)})"]
        if clip is not None:
            taken = "clip_grad_norm_" in a.defined_names and a.binding_for("torch.nn.utils.clip_grad_norm_") != "clip_grad_norm_"
            clip_fn = fx.name("torch.nn.utils.clip_grad_norm_") if taken else fx.member("torch.nn.utils.clip_grad_norm_")
            lines.append(f"{clip_fn}([p for group in {ctx.src(opt)}.param_groups for p in group[\"params\"]], {clip})")
        fx.insert_before(stmt, "\n".join(lines))
    plan.fix = fx.build("unsafe", description="torch_xla ZeRO-1 -> torch.distributed.optim.ZeroRedundancyOptimizer + gradient averaging")
    return plan


def _check_call(ctx, plan: Plan, call: ast.Call) -> None:
    a = ctx.analysis
    block = plan.blockers.append
    plan.calls.append(call)
    dropped = plan.dropped.setdefault(id(call), [])
    if has_star_args(call):
        block((call, "ZeroRedundancyOptimizer(*args/**kwargs): the options cannot be checked"))
        return
    if len(call.args) > 2:
        block((call.args[2], "options passed by position (torch_xla's third parameter is optimizer_dtype): pass them by keyword"))
    optimizer_class = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "optimizer_class"), None)
    q = a.resolve(optimizer_class, scope_at(a, call), count_use=False) if isinstance(optimizer_class, (ast.Name, ast.Attribute)) else None
    if q not in _ELEMENTWISE_OPTIMIZERS:
        block((optimizer_class or call, "the optimizer class is not an elementwise torch.optim optimizer (SGD, Adam, AdamW, ...): "
                                        "torch_xla's ZeRO stepped a slice of every parameter, torch's steps whole parameters, "
                                        "which is the same arithmetic only for updates that read each element alone"))
    clipping, max_norm = True, "1.0"
    for kw in call.keywords:
        if kw.arg in _DROPPED:
            dropped.append(kw.arg)
        elif kw.arg in _DEFAULT_ONLY:
            values, why = _DEFAULT_ONLY[kw.arg]
            if isinstance(kw.value, ast.Constant) and kw.value.value in values and type(kw.value.value) in (type(None), bool, int, float):
                dropped.append(kw.arg)
            else:
                block((kw, f"{kw.arg}=: {why}"))
        elif kw.arg == "grad_clipping":
            if isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, bool):
                clipping = kw.value.value
                dropped.append(kw.arg)
            else:
                block((kw, "grad_clipping= is not a constant: whether the gradients are clipped cannot be decided"))
        elif kw.arg == "max_norm":
            dropped.append(kw.arg)
            if not (isinstance(kw.value, ast.Constant) and kw.value.value is None):
                max_norm = ctx.src(kw.value)
        elif kw.arg in ("process_group", "parameters_as_bucket_view", "overlap_with_ddp"):
            block((kw, f"{kw.arg}= is a keyword of torch's ZeroRedundancyOptimizer: torch_xla's passed it to the optimizer class"))
    plan.clip[id(call)] = max_norm if clipping else None  # max_norm is only read with clipping on
    state = distributed_facts(a).group_at(call)
    if state not in (Group.ALWAYS, Group.LAUNCHED):
        block((call, "no process group is started on every path before the optimizer is built: torch_xla's ZeRO used "
                     "the XLA runtime's world, torch's needs init_process_group first"))


def _check_optimizer_uses(ctx, plan: Plan) -> None:
    """Each construction is assigned to a name; that name's steps get the averaging, and nothing else may read it
    in a way that changes (state dicts, torch_xla-only members, code outside the file)."""
    a = ctx.analysis
    block = plan.blockers.append
    names: dict = {}
    for call in plan.calls:
        parent = a.parent_of.get(call)
        targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target] if isinstance(parent, ast.AnnAssign) else None
        name = _terminal(targets[0]) if targets and len(targets) == 1 else None
        if name is None:
            block((call, "the optimizer is not assigned to one name: its steps cannot be followed"))
            continue
        names.setdefault(name, []).append(call)
    if not names:
        return
    # every value assigned to one of these names is a ZeRO construction (else a step of another optimizer would be
    # averaged too), and the clipping is the same for all of them
    for node in walk(a.tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, (ast.Name, ast.Attribute)) and _terminal(t) in names and node.value not in names[_terminal(t)]:
                    block((node, f"`{ctx.src(t)}` is also assigned something other than torch_xla's ZeroRedundancyOptimizer"))
    clip_of = {}
    for name, calls in names.items():
        clips = {plan.clip[id(c)] for c in calls}
        if len(clips) > 1:
            block((calls[-1], f"`{name}` is built with different clipping settings on different paths"))
        clip_of[name] = next(iter(clips))
    facts = distributed_facts(a)
    for node in walk(a.tree):
        if isinstance(node, ast.Return) and node.value is not None:
            values = node.value.elts if isinstance(node.value, (ast.Tuple, ast.List)) else [node.value]
            if any(isinstance(v, (ast.Name, ast.Attribute)) and _terminal(v) in names for v in values):
                block((node, "the optimizer is returned: code in other files may step it without averaging the gradients"))
        if isinstance(node, ast.Attribute) and _terminal(node.value) in names and _is_opt_ref(node.value):
            name = _terminal(node.value)
            parent = a.parent_of.get(node)
            if node.attr == "step":
                stmt = a.parent_of.get(parent)
                if not (isinstance(parent, ast.Call) and parent.func is node and isinstance(stmt, ast.Expr)):
                    block((node, "the optimizer's step() is not a statement of its own (its value used, or not called): "
                                 "the gradient averaging cannot be put before it"))
                elif parent.args or parent.keywords:
                    block((node, "step() with a closure: the gradients are computed inside step(), after the place "
                                 "where they would be averaged"))
                else:
                    plan.steps.append((stmt, node.value, clip_of[name]))
            elif node.attr in _OPT_BLOCKERS:
                block((node, f"the optimizer's {node.attr}: {_OPT_BLOCKERS[node.attr]}"))
        if isinstance(node, ast.Call):
            args = [*node.args, *[k.value for k in node.keywords]]
            if not any(isinstance(x, (ast.Name, ast.Attribute)) and _terminal(x) in names and _is_opt_ref(x) for x in args):
                continue
            q = facts.qualname(node.func) if isinstance(node.func, (ast.Name, ast.Attribute)) else None
            if q == OPTIMIZER_STEP:
                block((node, "xm.optimizer_step(optimizer) on the ZeRO optimizer: replace it by optimizer.step() (torch_xla's "
                             "ZeRO averages the gradients itself) and the ZeRO migration applies"))
            elif (q or "").startswith("torch.optim.lr_scheduler.") or (isinstance(node.func, ast.Name) and node.func.id in ("print", "isinstance")):
                continue
            else:
                block((node, f"the optimizer is passed to `{ctx.src(node.func)}`: whether it steps there cannot be checked"))
    if not plan.steps:
        block((plan.calls[0], "no `optimizer.step()` of this optimizer in the file: the gradient averaging torch_xla's ZeRO "
                              "did inside step() cannot be placed"))


def _is_opt_ref(node) -> bool:
    """`opt` or `self.opt` (not `opt.module` chains, which _terminal would also name)."""
    return isinstance(node, ast.Name) or (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name))


def _move_import(ctx, fx, stmt: ast.ImportFrom) -> None:
    al = stmt.names[0] if len(stmt.names) == 1 else None
    local = (al.asname or al.name) if al else "ZeroRedundancyOptimizer"
    if isinstance(ctx.analysis.parent_of.get(stmt), ast.Module):
        fx.delete(stmt)
        fx.member(TORCH_ZERO, None if local == "ZeroRedundancyOptimizer" else local)
        return
    as_part = "" if local == "ZeroRedundancyOptimizer" else f" as {local}"
    fx.replace(stmt, f"from torch.distributed.optim import ZeroRedundancyOptimizer{as_part}")


def _rewrite_call(ctx, fx, call: ast.Call, plan: Plan) -> None:
    """The callee becomes torch's where it was spelled through the module; each dropped keyword is cut out with
    the comma before it, so the rest of the call keeps its layout and comments."""
    a = ctx.analysis
    dropped = set(plan.dropped[id(call)])
    through_module = isinstance(call.func, ast.Attribute)  # `zro.ZeroRedundancyOptimizer(...)`
    if not dropped and not through_module:
        return
    text = a.source(call)
    rows = text.split("\n")
    first = a.span(call)

    def rel(line: int, col: int) -> int:
        return sum(len(r) + 1 for r in rows[: line - first.line]) + (col - first.col if line == first.line else col)

    cuts = []
    items = [*call.args, *call.keywords]
    for i, kw in enumerate(items):
        if not (isinstance(kw, ast.keyword) and kw.arg in dropped):
            continue
        here = a.span(kw)
        start, end = rel(here.line, here.col), rel(here.end_line, here.end_col)
        line_start = text.rfind("\n", 0, start) + 1
        line_end = text.find("\n", end)
        after = text[end:line_end].strip() if line_end >= 0 else ")"
        if line_start > 0 and not text[line_start:start].strip() and after.lstrip(",").split("#")[0].strip() == "":
            cuts.append((line_start, line_end + 1))  # alone on its line(s): the lines go (a comma before stays, trailing)
        elif i > 0:
            before = a.span(items[i - 1])
            prev_end = rel(before.end_line, before.end_col)
            comma = text.index(",", prev_end)
            if "#" in text[prev_end:start]:  # a comment after the previous argument stays
                cuts += [(comma, comma + 1), (start, end)]
            else:
                cuts.append((comma, end))
        else:  # the first argument: up to the next one
            nxt = a.span(items[i + 1]) if i + 1 < len(items) else None
            cuts.append((start, rel(nxt.line, nxt.col) if nxt else end))
    for start, end in sorted(cuts, reverse=True):
        text = text[:start] + text[end:]
    if through_module:
        func = a.span(call.func)
        text = fx.name(TORCH_ZERO) + text[rel(func.end_line, func.end_col):]
    stmt = a.parent_of.get(call)
    while stmt is not None and not isinstance(stmt, ast.stmt):
        stmt = a.parent_of.get(stmt)
    line = a.lines[(stmt or call).lineno - 1]
    fx.replace(call, _dedent_continuation(text, len(line) - len(line.lstrip(" "))) if "\n" in text else text)


@rule(
    code="NM153",
    name="xla-zero-redundancy-optimizer",
    summary="torch_xla's ZeroRedundancyOptimizer becomes torch's plus the gradient averaging and clipping it did in step()",
    fix="unsafe",
    severity="warning",
    triggers=[(kind, q) for q in (XLA_ZERO, MODULE) for kind in ("call", "ref", "import")],
    docs="""
        `torch_xla.distributed.zero_redundancy_optimizer.ZeroRedundancyOptimizer(params, optimizer_class, **kw)`
        shards the optimizer state **and, inside `step()`, reduce-scatters the gradients averaged over the ranks**,
        then clips them (`grad_clipping=True` and `max_norm=1.0` by default: the norm over all ranks' averaged
        gradients), steps its shard and all-gathers the parameters. The native
        `torch.distributed.optim.ZeroRedundancyOptimizer(params, optimizer_class, process_group=None, **defaults)`
        only shards the optimizer state: it expects DistributedDataParallel to have averaged the gradients.
        Swapping the class alone gives a program in which each parameter is stepped with the gradient of the
        one rank that owns its shard: with two one-element parameters from 0, gradient 1 on rank 0 and 2 on
        rank 1, SGD lr 1, both ranks end at [-1, -2] where the average gives [-1.5, -1.5]. The ranks still hold
        identical parameters, so a check that only compares ranks does not see it.

        The fix (one decision per file: every construction, the import and every step migrate together):

        - the import and the class become torch's; the optimizer class and its keywords (`lr=`, `momentum=`,
          ...) are kept;
        - before each `optimizer.step()` of the optimizer built, the gradients are averaged over the ranks
          (`_neuron_average_gradients(optimizer)`: an all_reduce SUM of each gradient divided by the world
          size, the helper NM110 also inserts), then, unless `grad_clipping=False`, clipped with
          `torch.nn.utils.clip_grad_norm_(params, max_norm)` (the same coefficient, max_norm / (norm + 1e-6)
          when below 1, over the same averaged gradients);
        - `pin_layout=`, `bucket_cap_mb_*=`, `coalesce_cc=` only shaped XLA's collectives: dropped.
          `optimizer_dtype=None`, `sharding_groups=None`, `grad_norm_groups=None`, `lazy_init=False`,
          `save_master_weights=False`, `higher_cc_precision=False`, `use_grad_acc_hook=False`,
          `grad_norm_type=2` spell out the default: dropped; any other value keeps the finding (master
          weights in another dtype, replica subgroups, deferred init, norms over model-parallel groups).

        The finding stays (nothing in the file is rewritten) when: the optimizer class is not an elementwise
        `torch.optim` optimizer (torch_xla stepped a slice of every parameter, torch steps whole parameters:
        the same only for SGD, Adam, AdamW and the like); options come by position or `**kwargs`; no process
        group is started on every path before it is built; it is not assigned to one name, or that name is
        also given another optimizer; a step is not a plain `optimizer.step()` statement (a closure, a used
        value); it is returned or passed to code outside the file (or to `xm.optimizer_step`); its
        `state_dict()`/`load_state_dict()` (torch_xla kept per-rank shard state; torch's needs
        `consolidate_state_dict(to=0)`), `init_zero()` or `base_optimizer` are used; no step is in the file.

        Unsafe: after `step()` the parameters' `.grad` hold the averaged (and clipped) gradients, where
        torch_xla left each rank's own; the optimizer state is sharded by whole parameters, not slices; its
        checkpoints have another layout. Wrapping the model in DistributedDataParallel and dropping the
        inserted average is the faster equivalent (bucketed, overlapped with backward); FSDP2 `fully_shard`
        shards parameters and gradients too. Checked by running (tests/integration/test_fsdp_zero_rewrite.py):
        the rewritten 2-element check ends at [-1.5, -1.5] on both ranks, and a ZeRO-1 MNIST-style program
        rewritten and run with 2 processes matches its 1-process loss per step.
    """,
    examples=[("from torch_xla.distributed.zero_redundancy_optimizer import ZeroRedundancyOptimizer\n"
               "dist.init_process_group(\"xla\", init_method=\"xla://\")\n"
               "opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-4, pin_layout=False)\n"
               "loss.backward()\nopt.step()",
               "from torch.distributed.optim import ZeroRedundancyOptimizer\n"
               "dist.init_process_group(\"neuron\")\n"
               "opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-4)\n"
               "loss.backward()\n_neuron_average_gradients(opt)\n"
               "torch.nn.utils.clip_grad_norm_([p for group in opt.param_groups for p in group[\"params\"]], 1.0)\nopt.step()")],
)
def xla_zero_redundancy_optimizer(site, ctx):
    plan = zero_plan(ctx)
    if plan.fix is None:
        if site.kind == "import" and not plan.calls and not plan.blockers:
            return None
        reason = plan.why() if plan.blockers else "the file's use of it cannot be followed"
        return ctx.finding(site, f"torch_xla's ZeroRedundancyOptimizer stays ({reason}): migrate by hand to "
                                 "torch.distributed.optim.ZeroRedundancyOptimizer(params, optimizer_class, **defaults) with "
                                 "the gradients averaged before each step (DistributedDataParallel, or an all_reduce of each "
                                 "gradient divided by the world size) and clipped with torch.nn.utils.clip_grad_norm_ "
                                 "(torch_xla's default: grad_clipping=True, max_norm=1.0); torch's ZeRO alone never "
                                 "averages gradients")
    if site.kind == "call" and site.node in plan.calls:
        dropped = plan.dropped.get(id(site.node), [])
        clip = plan.clip.get(id(site.node))
        steps = ", ".join(str(s.lineno) for s, _o, _c in plan.steps)
        clipped = f", then clipped to max_norm={clip}" if clip is not None else ""
        extra = f"; dropped: {', '.join(dropped)}" if dropped else ""
        return ctx.finding(site, "torch_xla's ZeroRedundancyOptimizer becomes torch.distributed.optim.ZeroRedundancyOptimizer; "
                                 f"the gradients it averaged inside step() are averaged before each step (line {steps}){clipped}"
                                 f"{extra}", fix=plan.fix,
                           note="After step() the parameters' .grad hold the averaged gradients (torch_xla left each rank's "
                                "own); the optimizer state is sharded by whole parameters and its checkpoints have another "
                                "layout. DistributedDataParallel instead of the inserted average is faster.")
    return ctx.finding(site, "torch_xla's ZeroRedundancyOptimizer: imported from torch.distributed.optim instead", fix=plan.fix)
