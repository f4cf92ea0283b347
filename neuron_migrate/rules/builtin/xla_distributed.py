"""torch_xla distributed: ranks, collectives, gradient averaging, saving, process groups and launching (NM110-NM129).

torch_xla's multi-process API (`xm.*` collectives, `xr.*` topology, `xmp.spawn`) maps onto `torch.distributed`
with the `neuron` backend under torchrun. Where one expression keeps the behaviour it is written inline; where
it does not (out-of-place all_reduce, local-master save, gradient averaging) a `_neuron_*` helper is inserted
(see xla_distributed_helpers.py). Helpers behave like torch_xla did in a single process, so a rewritten script
still runs without torchrun.
"""
from __future__ import annotations

import ast
import os
import re
from collections import Counter

from neuron_migrate.names.analysis import walk
from neuron_migrate.program import cached
from neuron_migrate.program.distributed import WRAPPERS, DistributedFacts, Group
from neuron_migrate.program.distributed import facts as distributed_facts
from neuron_migrate.rules.api import const_value, has_star_args, kwarg, rule
from neuron_migrate.rules.builtin import xla_distributed_helpers  # noqa: F401  (registers the helpers)

XM = "torch_xla.core.xla_model"
XR = "torch_xla.runtime"
PJRT = "torch_xla.experimental.pjrt"
XMP = "torch_xla.distributed.xla_multiprocessing"
DIST = "torch.distributed"

RELEASE_NOTES = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/release-notes/components/torchneuron.html"
DIST_GUIDE = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/torch/guides/torch-distributed.html"


# -- context facts -------------------------------------------------------------------------------
# Launch mode, process-group state, DDP wrapping and API families come from the whole-program model
# (neuron_migrate/program/distributed.py); these helpers only phrase its answers for the rules below.


def program(ctx) -> DistributedFacts:
    return distributed_facts(ctx.analysis)


def group_at(ctx, site) -> Group:
    return program(ctx).group_at(site.node)


def wrapped_in_ddp(ctx) -> bool:
    """Some DDP/FSDP wrapper is used in the file (for notes only: whether it applies is `always_wrapped`)."""
    return any(q.startswith(WRAPPERS) for q in ctx.analysis.qualnames)


def dropped(ctx, site, items, main_line=None) -> list:
    """Pattern 15: each argument a fix drops is a finding at its own line (unless the main finding's line)."""
    main_line = main_line or site.node.lineno
    out = []
    for node, what in items:
        if node is None:
            continue
        line = node.lineno if hasattr(node, "lineno") else main_line
        if line != main_line:
            out.append(ctx.finding(node, f"dropped by the rewrite: {what}"))
    return out


def dropped_words(ctx, items) -> str:
    names = [what.split(" (")[0] for node, what in items if node is not None]
    return f" (dropped: {', '.join(names)})" if names else ""


def starts_line(ctx, stmt: ast.stmt) -> bool:
    """The statement begins its line (not after `if x:` or `;`), so statements can be inserted before it."""
    line = ctx.analysis.lines[stmt.lineno - 1]
    return line[: stmt.col_offset].strip() == ""


def alone_on_lines(ctx, stmt: ast.stmt) -> bool:
    """The statement begins its line and nothing but a comment follows it."""
    if not starts_line(ctx, stmt):
        return False
    sp = ctx.analysis.span(stmt)
    rest = ctx.analysis.lines[sp.end_line - 1][sp.end_col:].strip()
    return rest == "" or rest.startswith("#")


def inside_deferred(site) -> bool:
    """Between the node and its statement there is a lambda, comprehension or short-circuit (evaluated later or maybe not)."""
    for anc in site.ancestors():
        if isinstance(anc, ast.stmt):
            return False
        if isinstance(anc, (ast.Lambda, ast.IfExp, ast.BoolOp, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            return True
    return False


def simple_ref(node: ast.AST) -> bool:
    """A name or attribute chain: evaluating it twice is harmless."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name)


def atom(ctx, node: ast.AST) -> str:
    src = ctx.src(node)
    if isinstance(node, (ast.Name, ast.Attribute, ast.Call, ast.Subscript, ast.Constant, ast.List, ast.Tuple, ast.Dict)):
        return src
    return f"({src})"


def wrap_for_parent(site, text: str) -> str:
    """Parenthesise a comparison that replaces a call where it would otherwise bind differently."""
    parent = site.parent
    if isinstance(parent, (ast.Compare, ast.BinOp, ast.Attribute, ast.Subscript, ast.Await)) or (
        isinstance(parent, ast.UnaryOp) and not isinstance(parent.op, ast.Not)
    ):
        return f"({text})"
    return text


_CMP = {ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b, ast.Lt: lambda a, b: a < b,
        ast.LtE: lambda a, b: a <= b, ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b}


def known_value(site, ctx, fx, value) -> str:
    """Write a call whose value the program fixes (rank 0, world 1 in a single-device program) as that value.

    `if xm.get_ordinal() == 0:` keeps its body without the test, `if not xm.is_master_ordinal():` goes (a dropped
    statement: the finding says so), `rank = xm.get_ordinal()` becomes `rank = 0`. Returns what happened."""
    a = ctx.analysis
    expr, val = site.node, value
    parent = a.parent_of.get(expr)
    if (isinstance(parent, ast.Compare) and len(parent.ops) == 1 and type(parent.ops[0]) in _CMP
            and isinstance(val, int) and not isinstance(val, bool)):
        other = parent.comparators[0] if parent.left is expr else parent.left
        if isinstance(other, ast.Constant) and isinstance(other.value, int) and not isinstance(other.value, bool):
            left, right = (val, other.value) if parent.left is expr else (other.value, val)
            expr, val = parent, _CMP[type(parent.ops[0])](left, right)
            parent = a.parent_of.get(expr)
    if isinstance(val, bool) and isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.Not):
        expr, val = parent, not val
        parent = a.parent_of.get(expr)
    if isinstance(val, bool) and isinstance(parent, ast.BoolOp) and isinstance(parent.op, ast.And) and val:
        rest = [v for v in parent.values if v is not expr]
        fx.replace(parent, " and ".join(atom(ctx, v) if isinstance(v, (ast.BoolOp, ast.IfExp, ast.Lambda, ast.NamedExpr)) else ctx.src(v) for v in rest))
        return "the condition is always true here: dropped from the `and`"
    if isinstance(val, bool) and isinstance(parent, ast.If) and parent.test is expr and not parent.orelse:
        if val:
            fx.unwrap(parent)
            return "the condition is always true here: its body is kept without the `if`"
        fx.delete(parent)
        return f"the condition is always false here: the `if` block (lines {parent.lineno}-{parent.end_lineno}) is removed"
    fx.replace(expr, wrap_for_parent(_AtNode(site, expr), repr(val)))
    return f"written as {val!r}"


class _AtNode:
    """A site-like view of another node (for wrap_for_parent)."""

    def __init__(self, site, node):
        self.parent = site.analysis.parent_of.get(node)


def is_none(node) -> bool:
    return node is None or (isinstance(node, ast.Constant) and node.value is None)


def replace_callee(site, ctx, helper: str, message: str, note: str = "", safety=None):
    """Keep the arguments, call a helper with the same signature instead."""
    fx = ctx.fixer(safety)
    name = fx.helper(helper)
    fx.replace(site.node if site.kind == "ref" else site.call.func, name)
    return ctx.finding(site, message, fix=fx.build(), note=note)


def xm_keys(*names: str) -> list[str]:
    return [f"{XM}.{n}" for n in names]


def call_and_ref(*qualnames: str) -> list[tuple[str, str]]:
    return [(kind, q) for q in qualnames for kind in ("call", "ref")]


# -- NM110 xm.optimizer_step -----------------------------------------------------------------------
_PATCH = re.compile(r"\.optimizer_step\s*=[^=]|setattr\([^)]*['\"]optimizer_step['\"]")


def optimizer_step_patched(ctx) -> bool:
    def patched(a) -> bool:
        if any(s.kind == "store" and s.key == f"{XM}.optimizer_step" for s in a.sites):
            return True
        return bool(_PATCH.search(a.text))

    return cached(ctx.analysis, "optimizer_step_patched", patched)  # asked per site: answer once per file


@rule(
    code="NM110",
    name="optimizer-step",
    summary="xm.optimizer_step(opt) averages gradients over all processes before opt.step(); keep that on TorchNeuron",
    fix="safe",
    severity="warning",
    triggers=[*call_and_ref(f"{XM}.optimizer_step"), ("store", f"{XM}.optimizer_step")],
    docs=f"""
        `xm.optimizer_step(optimizer, barrier=False, optimizer_args={{}}, groups=None)` all-reduces and averages
        every gradient over the world (`xm.reduce_gradients`), then returns `optimizer.step(**optimizer_args)`.
        A plain `optimizer.step()` is only equivalent when something else averages the gradients.

        - The optimizer's model is wrapped in `DistributedDataParallel` or FSDP on every path to the step (the
          program model follows the optimizer to `model.parameters()` and the model to its wrapper, also through
          function parameters), or the program is single-device (it never starts a process group): the call
          becomes `optimizer.step(**optimizer_args)`. A wrap behind a flag (`if flags.ddp: model = DDP(model)`)
          does not count: the reduction is kept (on the DDP path a second average changes nothing).
        - Otherwise `_neuron_reduce_gradients(optimizer)` (an inserted helper: all_reduce SUM of each gradient divided
          by the world size; nothing in one process or before `init_process_group`) is called before the step;
          after an `init_process_group` that always runs, the shorter `_neuron_average_gradients(optimizer)`.
          Where no statement can be inserted (inside a lambda, a condition), the call becomes the helper
          `_neuron_optimizer_step(...)` with the same signature. Wrapping the model in DDP is faster (bucketed,
          overlapped all-reduce); see {DIST_GUIDE}.
        - `barrier=True` only cut the lazy graph: dropped (TorchNeuron runs eagerly). `pin_layout` is dropped. A
          dropped argument on a line of its own gets a finding there.
        - A used return value is kept (`x = optimizer.step(...)`).
        - `groups=` (replica subgroups) is reported: make the subgroup once with `dist.new_group` and reduce over it.
        - When the file monkey-patches `xm.optimizer_step` (as transformers did under XLA FSDP), every call is
          reported instead: the patched behaviour has to be migrated by hand.
        Used as a value, the name becomes `_neuron_optimizer_step`.
    """,
    examples=[
        ("xm.optimizer_step(optimizer)", "_neuron_reduce_gradients(optimizer)\noptimizer.step()"),
        ("model = nn.parallel.DistributedDataParallel(model)\nxm.optimizer_step(opt, barrier=True)",
         "model = nn.parallel.DistributedDataParallel(model)\nopt.step()"),
    ],
)
def optimizer_step(site, ctx):
    if site.kind == "store":
        return ctx.finding(site, "xm.optimizer_step is monkey-patched: the patched step does not exist on TorchNeuron; "
                                 "replace the patch and every xm.optimizer_step call by the optimizer step you need")
    if optimizer_step_patched(ctx):
        return ctx.finding(site, "xm.optimizer_step is monkey-patched in this file: migrate this call by hand "
                                 "(opt.step() when DDP/FSDP averages gradients, else average them first)")
    if site.kind == "ref":
        return replace_callee(site, ctx, "_neuron_optimizer_step",
                              "xm.optimizer_step used as a value: becomes _neuron_optimizer_step (averages gradients, then steps)")
    call = site.call
    if has_star_args(call):
        return replace_callee(site, ctx, "_neuron_optimizer_step",
                              "xm.optimizer_step with *args/**kwargs: becomes _neuron_optimizer_step with the same arguments")
    opt = kwarg(call, "optimizer", 0)
    groups = kwarg(call, "groups", 3)
    if opt is None:
        return ctx.finding(site, "xm.optimizer_step without an optimizer argument: migrate by hand")
    if not is_none(groups):
        return ctx.finding(site, "xm.optimizer_step with groups=: create the subgroup once with dist.new_group, "
                                 "all-reduce the gradients over it, then call optimizer.step()")
    args = kwarg(call, "optimizer_args", 2)
    if args is None or (isinstance(args, ast.Dict) and not args.keys):
        step_args = ""
    elif isinstance(args, ast.Dict) and all(isinstance(k, ast.Constant) and isinstance(k.value, str) and k.value.isidentifier() for k in args.keys):
        step_args = ", ".join(f"{k.value}={ctx.src(v)}" for k, v in zip(args.keys, args.values))
    else:
        step_args = f"**{atom(ctx, args)}"
    step = f"{atom(ctx, opt)}.step({step_args})"
    drops = [(kwarg(call, "barrier", 1), "barrier= (it only cut the XLA graph; TorchNeuron runs eagerly)"),
             (kwarg(call, "pin_layout", 4), "pin_layout= (an XLA layout hint)")]
    drops = [(n, w) for n, w in drops if n is not None and not (isinstance(n, ast.Constant) and n.value is False)]
    extra = dropped(ctx, site, drops)
    fx = ctx.fixer()
    facts = program(ctx)
    wrapped = facts.always_wrapped(opt, call)
    if wrapped is None:  # the optimizer comes from code this file does not show: any wrap behind a flag keeps the average
        wrapped = facts.wraps_unconditionally()
    state = facts.group_at(call)
    if wrapped:
        fx.replace(call, step)
        return [ctx.finding(site, "xm.optimizer_step with the model always wrapped in DDP/FSDP: becomes optimizer.step() "
                                  "(the wrapper averages the gradients)" + dropped_words(ctx, drops), fix=fx.build()), *extra]
    if state is Group.NONE:
        fx.replace(call, step)
        return [ctx.finding(site, "xm.optimizer_step in a single-device program: becomes optimizer.step()" + dropped_words(ctx, drops),
                            fix=fx.build(), note="If this script is started with torchrun, average the gradients first (wrap the model in DDP)."),
                *extra]
    note = ("Gradients are averaged by an all-reduce per parameter; wrapping the model in "
            "torch.nn.parallel.DistributedDataParallel does this bucketed and overlapped with backward.")
    if wrapped is False and wrapped_in_ddp(ctx):
        note = ("The model is not DDP-wrapped on every path (e.g. only behind a flag), so the gradient average is kept; "
                "where DDP does wrap it the second average leaves the values unchanged. ") + note
    stmt = site.stmt
    if (simple_ref(opt) and isinstance(stmt, (ast.Expr, ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Return))
            and starts_line(ctx, stmt) and not inside_deferred(site)):
        # after a sure init the helper need not ask whether a group exists (nor take xm's unused arguments)
        helper = fx.helper("_neuron_average_gradients" if state is Group.ALWAYS and _short_average_fits(ctx) else "_neuron_reduce_gradients")
        fx.insert_before(stmt, f"{helper}({ctx.src(opt)})")
        fx.replace(call, step)
        return [ctx.finding(site, f"xm.optimizer_step averaged gradients over all processes: {helper}(optimizer) "
                                  "now does that before optimizer.step()" + dropped_words(ctx, drops), fix=fx.build(), note=note), *extra]
    return replace_callee(site, ctx, "_neuron_optimizer_step",
                          "xm.optimizer_step: becomes _neuron_optimizer_step (averages gradients, then steps)", note=note)


def _short_average_fits(ctx) -> bool:
    """Every gradient average of the file is a statement after a sure init, so the short helper serves them all
    (one helper per file, never both it and _neuron_reduce_gradients). Asked per site: answered once per file."""
    return cached(ctx.analysis, "NM110 short average", lambda a: _every_average_is_short(ctx))


def _every_average_is_short(ctx) -> bool:
    facts = program(ctx)
    if facts.uses([f"{XM}.reduce_gradients"]) or optimizer_step_patched(ctx):
        return False
    a = ctx.analysis
    for node in facts.uses([f"{XM}.optimizer_step"]):
        if not isinstance(node, ast.Call) or has_star_args(node):
            return False
        opt = kwarg(node, "optimizer", 0)
        if opt is None or not is_none(kwarg(node, "groups", 3)):
            continue  # reported: no helper
        wrapped = facts.always_wrapped(opt, node)
        if wrapped is None:
            wrapped = facts.wraps_unconditionally()
        state = facts.group_at(node)
        if wrapped or state is Group.NONE:
            continue  # a plain optimizer.step()
        stmt = _stmt_of(a, node)
        deferred, up = False, a.parent_of.get(node)
        while up is not None and not isinstance(up, ast.stmt):
            deferred = deferred or isinstance(up, (ast.Lambda, ast.IfExp, ast.BoolOp, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp))
            up = a.parent_of.get(up)
        if (state is not Group.ALWAYS or deferred or not simple_ref(opt) or not starts_line(ctx, stmt)
                or not isinstance(stmt, (ast.Expr, ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Return))):
            return False
    return True


# -- NM111 xm.reduce_gradients ---------------------------------------------------------------------
@rule(
    code="NM111",
    name="reduce-gradients",
    summary="xm.reduce_gradients(opt) becomes the inserted helper _neuron_reduce_gradients(opt)",
    fix="safe",
    severity="warning",
    triggers=call_and_ref(f"{XM}.reduce_gradients"),
    docs=f"""
        `xm.reduce_gradients(optimizer)` averages the gradients of the optimizer's parameters over all processes.
        It becomes `_neuron_reduce_gradients(optimizer)`, an inserted helper that all-reduces (SUM, then divides by
        the world size) each gradient with `torch.distributed` and does nothing in one process. `groups=` is
        reported (make the subgroup once with `dist.new_group`). Wrapping the model in DDP averages gradients
        bucketed and overlapped with backward ({DIST_GUIDE}).
    """,
    examples=[("xm.reduce_gradients(optimizer)", "_neuron_reduce_gradients(optimizer)")],
)
def reduce_gradients(site, ctx):
    if site.kind == "call" and not has_star_args(site.call) and not is_none(kwarg(site.call, "groups", 1)):
        return ctx.finding(site, "xm.reduce_gradients with groups=: create the subgroup once with dist.new_group and all-reduce over it")
    return replace_callee(site, ctx, "_neuron_reduce_gradients",
                          "xm.reduce_gradients: becomes _neuron_reduce_gradients (all-reduce average of each gradient)")


# -- NM112 global rank and world size --------------------------------------------------------------
_RANK = {f"{XM}.get_ordinal", f"{XR}.global_ordinal", f"{XR}.process_index", f"{PJRT}.global_ordinal"}
_WORLD = {f"{XM}.xrt_world_size", f"{XR}.world_size", f"{XR}.process_count", f"{PJRT}.world_size"}


@rule(
    code="NM112",
    name="ordinal-world-size",
    summary="xm.get_ordinal()/xr.global_ordinal() and xm.xrt_world_size()/xr.world_size() become guarded torch.distributed calls",
    fix="safe",
    severity="warning",
    triggers=call_and_ref(*sorted(_RANK | _WORLD)),
    docs="""
        The global ordinal and the world size come from the process group: `dist.get_rank()` and
        `dist.get_world_size()`. Those raise when no process group is initialised, where torch_xla returned 0 and
        1, so the calls become the inserted helpers `_neuron_rank()` and `_neuron_world_size()`, which return 0
        and 1 then. `xr.process_index()`/`xr.process_count()` are the same under torchrun (one NeuronCore per
        process). A non-default `defval=` becomes `_neuron_ordinal(defval)` / `_neuron_xrt_world_size(defval)`.
        Used as a value (`world_size_function=xr.world_size`), the name becomes the helper function itself.
        The helpers only know the rank after `dist.init_process_group("neuron")`: call it first.

        Where the program model knows more, the plain form is written: after an `init_process_group` that runs
        on every path, `dist.get_rank()` / `dist.get_world_size()`; in a single-device program (one that never
        starts a process group), the values 0 and 1 (`if xm.get_ordinal() == 0:` keeps just its body).
    """,
    examples=[("rank = xm.get_ordinal()\nworld = xr.world_size()", "rank = _neuron_rank()\nworld = _neuron_world_size()")],
)
def ordinal_world_size(site, ctx):
    is_rank = site.key in _RANK
    base, with_default, dflt = ("_neuron_rank", "_neuron_ordinal", 0) if is_rank else ("_neuron_world_size", "_neuron_xrt_world_size", 1)
    what = "global ordinal" if is_rank else "world size"
    takes_defval = site.key.startswith(XM)
    fx = ctx.fixer()
    if site.kind == "ref":
        name = fx.helper(with_default if takes_defval else base)
        fx.replace(site.node, name)
        return ctx.finding(site, f"{what} function used as a value: becomes the helper {name}", fix=fx.build())
    call = site.call
    if has_star_args(call):
        return replace_callee(site, ctx, with_default if takes_defval else base, f"{what} with *args: becomes a guarded helper")
    state = group_at(ctx, site)
    if state is Group.NONE:
        how = known_value(site, ctx, fx, dflt)
        return ctx.finding(site, f"{what} in a single-device program (it never starts a process group) is {dflt}: {how}", fix=fx.build(),
                           note="If this script is started with torchrun, call dist.init_process_group(\"neuron\") and use dist.get_rank().")
    if state is Group.ALWAYS:
        text = f"{fx.ref(DIST, site.scope)}.{'get_rank' if is_rank else 'get_world_size'}()"
        fx.replace(call, text)
        return ctx.finding(site, f"{what} after init_process_group: becomes {text}", fix=fx.build())
    defval = kwarg(call, "defval", 0) if takes_defval else None
    if defval is None or const_value(defval, object()) == dflt:
        text = f"{fx.helper(base)}()"
    else:
        text = f"{fx.helper(with_default)}({ctx.src(defval)})"
    fx.replace(call, text)
    return ctx.finding(site, f"{what}: becomes {text} (torch.distributed, {dflt} without a process group)", fix=fx.build())


# -- NM113 local ordinal and local process count ---------------------------------------------------
_LOCAL_RANK = {f"{XM}.get_local_ordinal", f"{XR}.local_ordinal", f"{PJRT}.local_ordinal"}
_LOCAL_WORLD = {f"{XR}.local_process_count"}


@rule(
    code="NM113",
    name="local-ordinal",
    summary="xm.get_local_ordinal()/xr.local_ordinal() and xr.local_process_count() read LOCAL_RANK / LOCAL_WORLD_SIZE",
    fix="safe",
    severity="warning",
    triggers=call_and_ref(*sorted(_LOCAL_RANK | _LOCAL_WORLD)),
    docs="""
        The rank within a host is what torchrun exports as `LOCAL_RANK`, and the number of processes on the host
        `LOCAL_WORLD_SIZE`. The calls become `dist.get_node_local_rank(fallback_rank=0)` (public torch API: reads
        LOCAL_RANK, 0 when unset; `defval=` becomes the fallback) and `int(os.environ.get("LOCAL_WORLD_SIZE", 1))`;
        in a single-device program, 0 and 1. Used as a value, the name becomes a small helper function.
    """,
    examples=[("local = xm.get_local_ordinal()", "local = dist.get_node_local_rank(fallback_rank=0)")],
)
def local_ordinal(site, ctx):
    is_rank = site.key in _LOCAL_RANK
    base = "_neuron_local_rank" if is_rank else "_neuron_local_world_size"
    fx = ctx.fixer()
    takes_defval = site.key == f"{XM}.get_local_ordinal"
    name = site.key.rsplit('.', 1)[1]
    if site.kind == "ref":
        helper = fx.helper("_neuron_local_ordinal" if takes_defval else base)
        fx.replace(site.node, helper)
        return ctx.finding(site, f"{name} used as a value: becomes the helper {helper}", fix=fx.build())
    call = site.call
    if has_star_args(call):
        return replace_callee(site, ctx, "_neuron_local_ordinal" if takes_defval else base, "local ordinal with *args: becomes a helper")
    defval = kwarg(call, "defval", 0) if takes_defval else None
    if group_at(ctx, site) is Group.NONE and (defval is None or const_value(defval, object()) == 0):
        how = known_value(site, ctx, fx, 0 if is_rank else 1)
        return ctx.finding(site, f"{name}() in a single-device program is {0 if is_rank else 1}: {how}", fix=fx.build())
    if is_rank:
        fallback = "0" if defval is None else ctx.src(defval)
        text = f"{fx.ref(DIST, site.scope)}.get_node_local_rank(fallback_rank={fallback})"
    else:
        text = f'int({fx.ref("os", site.scope)}.environ.get("LOCAL_WORLD_SIZE", 1))'
    fx.replace(call, wrap_for_parent(site, text) if not is_rank else text)
    env = "LOCAL_RANK" if is_rank else "LOCAL_WORLD_SIZE"
    return ctx.finding(site, f"{name}(): becomes {text} (reads {env}, set by torchrun)", fix=fx.build())


# -- NM114 xm.is_master_ordinal --------------------------------------------------------------------
@rule(
    code="NM114",
    name="is-master-ordinal",
    summary="xm.is_master_ordinal() is True on rank 0 of each host (local=True by default), not only on global rank 0",
    fix="safe",
    severity="warning",
    triggers=call_and_ref(f"{XM}.is_master_ordinal"),
    docs="""
        `xm.is_master_ordinal(local=True)` defaults to the **local** master: rank 0 of each host. It becomes
        `dist.get_node_local_rank(fallback_rank=0) == 0` (LOCAL_RANK); `local=False` becomes
        `dist.get_rank() == 0` after an init that always runs, else `_neuron_rank() == 0` (global rank 0). In a
        single-device program it is True: `if xm.is_master_ordinal():` keeps just its body.
        Rewriting the default form to `rank == 0` would make a multi-node job skip per-host work (dataset
        downloads, local caches). A non-literal `local=` or a use as a value becomes the helper
        `_neuron_is_master_ordinal(local)`.
    """,
    examples=[("if xm.is_master_ordinal():\n    download()", "if dist.get_node_local_rank(fallback_rank=0) == 0:\n    download()"),
              ("if xm.is_master_ordinal(local=False):\n    log()", "if _neuron_rank() == 0:\n    log()")],
)
def is_master_ordinal(site, ctx):
    if site.kind == "ref" or has_star_args(site.call):
        return replace_callee(site, ctx, "_neuron_is_master_ordinal", "xm.is_master_ordinal: becomes the helper _neuron_is_master_ordinal")
    local = kwarg(site.call, "local", 0)
    value = True if local is None else const_value(local, None)
    if not isinstance(value, bool):
        return replace_callee(site, ctx, "_neuron_is_master_ordinal", "xm.is_master_ordinal with a computed local=: becomes the helper _neuron_is_master_ordinal")
    fx = ctx.fixer()
    state = group_at(ctx, site)
    which = "rank 0 of this host (LOCAL_RANK)" if value else "global rank 0"
    if state is Group.NONE:
        how = known_value(site, ctx, fx, True)
        return ctx.finding(site, f"xm.is_master_ordinal() in a single-device program is True: {how}", fix=fx.build())
    if value:
        rank = f"{fx.ref(DIST, site.scope)}.get_node_local_rank(fallback_rank=0)"
    elif state is Group.ALWAYS:
        rank = f"{fx.ref(DIST, site.scope)}.get_rank()"
    else:
        rank = f"{fx.helper('_neuron_rank')}()"
    text = f"{rank} == 0"
    parent = site.parent
    if isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.Not):  # `not x == 0` reads better as `x != 0`
        text = f"{rank} != 0"
        fx.replace(parent, wrap_for_parent(_AtNode(site, parent), text))
    else:
        fx.replace(site.call, wrap_for_parent(site, text))
    return ctx.finding(site, f"xm.is_master_ordinal({'' if local is None else 'local=' + repr(value)}) means {which}: becomes {text}", fix=fx.build())


# -- NM115 xm.master_print -------------------------------------------------------------------------
@rule(
    code="NM115",
    name="master-print",
    summary="xm.master_print(...) prints on global rank 0 only: becomes the helper _neuron_master_print(...)",
    fix="safe",
    severity="warning",
    triggers=call_and_ref(f"{XM}.master_print"),
    docs="""
        `xm.master_print(*args, fd=sys.stdout, local=False, flush=False)` prints only on the **global** master
        (unlike `xm.is_master_ordinal`, whose default is local). It becomes `_neuron_master_print(...)`, an
        inserted helper with the same signature that prints when `_neuron_rank() == 0` (`local=True`: on LOCAL_RANK 0).
        Used as a value (`self.logger = xm.master_print`) it becomes the helper name. Where the program model knows
        more: `print(...)` in a single-device program, and `if dist.get_rank() == 0: print(...)` after an
        `init_process_group` that always runs (`fd=` becomes `file=`). Inside an `if` that already tests for rank 0
        (`if is_root:` with `is_root = xm.is_master_ordinal(local=False)`, `if xm.get_ordinal() == 0:`) it is a
        plain `print(...)`; inside `if is_root:` on the local master alone, that test becomes the global one
        (global rank 0 is a local master), never a second guard.
    """,
    examples=[("xm.master_print('loss', loss.item())", "_neuron_master_print('loss', loss.item())")],
)
def master_print(site, ctx):
    if site.kind == "call" and not has_star_args(site.call):
        plain = _plain_print(site, ctx)
        if plain is not None:
            return plain
    return replace_callee(site, ctx, "_neuron_master_print", "xm.master_print: becomes _neuron_master_print (prints on global rank 0)")


def _plain_print(site, ctx):
    """print(...) in a single-device program; `if dist.get_rank() == 0: print(...)` after a sure init."""
    call = site.call
    local = None
    parts = [ctx.src(a) for a in call.args]
    for kw in call.keywords:
        if kw.arg == "local":
            local = const_value(kw.value, None)
            if not isinstance(local, bool):
                return None
        elif kw.arg == "fd":
            parts.append(f"file={ctx.src(kw.value)}")
        else:
            parts.append(f"{kw.arg}={ctx.src(kw.value)}")
    text = f"print({', '.join(parts)})"
    state = group_at(ctx, site)
    fx = ctx.fixer()
    if state is Group.NONE:
        fx.replace(call, text)
        return ctx.finding(site, "xm.master_print in a single-device program: becomes print()", fix=fx.build())
    if state is not Group.ALWAYS and not local:
        return None
    stmt = site.stmt
    if not (site.is_statement and alone_on_lines(ctx, stmt)):
        return None
    dist = fx.ref(DIST, site.scope)
    test = f"{dist}.get_node_local_rank(fallback_rank=0) == 0" if local else f"{dist}.get_rank() == 0"
    outer = ctx.analysis.parent_of.get(stmt)
    held = (isinstance(outer, ast.If) and any(s_ is stmt for s_ in outer.body)
            and _rank0_test(ctx, outer.test, site.scope.node) or None)
    if _inside_test(ctx, stmt, test) or held == "global" or (held == "local" and local):
        fx.replace(call, text)  # the `if` around it already asks for (at least) this rank: no second guard
    elif held == "local" and outer.body == [stmt] and not outer.orelse and alone_on_lines(ctx, outer):
        # `if is_root: xm.master_print(...)` (local master): global rank 0 is a local master, so asking for
        # global rank 0 alone is the same test
        fx.replace(outer.test, test)
        fx.replace(call, text)
    else:
        block = _block_around(ctx, stmt)
        i = next(k for k, s_ in enumerate(block) if s_ is stmt)
        if i > 0 and _plain_print_run_member(ctx, block[i - 1], local):
            return ctx.finding(site, "xm.master_print: printed under the `if` of the master_print just above it",
                               fix=fx.build())  # no edits of its own: the first of the run rewrites it
        run = [stmt]
        for nxt in block[i + 1:]:
            if not _plain_print_run_member(ctx, nxt, local):
                break
            run.append(nxt)
        prints = [text] + [_print_text(ctx, r.value) for r in run[1:]]
        for r in run[1:]:
            fx.delete(r)
        fx.replace(stmt, f"if {test}:\n" + "".join(f"    {p}\n" for p in prints))
    return ctx.finding(site, f"xm.master_print: becomes print() on {'rank 0 of each host' if local else 'global rank 0'} (`if {test}:`)",
                       fix=fx.build())


def _print_text(ctx, call) -> str:
    parts = [ctx.src(a) for a in call.args]
    for kw in call.keywords:
        if kw.arg == "fd":
            parts.append(f"file={ctx.src(kw.value)}")
        elif kw.arg != "local":
            parts.append(f"{kw.arg}={ctx.src(kw.value)}")
    return f"print({', '.join(parts)})"


def _block_around(ctx, stmt) -> list:
    parent = ctx.analysis.parent_of.get(stmt) or ctx.analysis.tree
    for f in ("body", "orelse", "finalbody"):
        block = getattr(parent, f, None)
        if isinstance(block, list) and any(s is stmt for s in block):
            return block
    return [stmt]


def _plain_print_run_member(ctx, stmt, local) -> bool:
    """Another `xm.master_print(...)` statement with the same `local` that can share one `if rank == 0:`."""
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and alone_on_lines(ctx, stmt)):
        return False
    call = stmt.value
    if not isinstance(call.func, (ast.Name, ast.Attribute)) or program(ctx).qualname(call.func) != f"{XM}.master_print":
        return False
    if has_star_args(call):
        return False
    kw_local = next((kw.value for kw in call.keywords if kw.arg == "local"), None)
    value = False if kw_local is None else const_value(kw_local, None)
    return value is (bool(local))


def _rank0_test(ctx, test, scope_node, depth: int = 0):
    """"global" when `test` is true on global rank 0 only, "local" when on rank 0 of each host, else None. Reads
    `xm.is_master_ordinal(local=...)`, `xm.get_ordinal() == 0`, `xm.get_local_ordinal() == 0`, their rewrites
    (`dist.get_rank() == 0`, `dist.get_node_local_rank(...) == 0`) and a name its function binds once to one."""
    if depth > 3:
        return None
    qual = program(ctx).qualname
    if isinstance(test, ast.Name) and isinstance(scope_node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        values = [n.value for n in walk(scope_node) if isinstance(n, ast.Assign)
                  and any(isinstance(t, ast.Name) and t.id == test.id for t in n.targets)]
        stores = [n for n in walk(scope_node) if isinstance(n, ast.Name) and n.id == test.id and not isinstance(n.ctx, ast.Load)]
        if len(values) == 1 and len(stores) == 1:
            return _rank0_test(ctx, values[0], scope_node, depth + 1)
        return None
    if isinstance(test, ast.Call) and isinstance(test.func, (ast.Name, ast.Attribute)):
        if qual(test.func) == f"{XM}.is_master_ordinal" and not has_star_args(test):
            local = kwarg(test, "local", 0)
            return "local" if local is None or const_value(local, None) is True else \
                "global" if const_value(local, None) is False else None
        return None
    if (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)
            and const_value(test.comparators[0], None) == 0 and not isinstance(test.comparators[0].value, bool)):
        left = test.left
        if isinstance(left, ast.Name):
            values = [n.value for n in walk(scope_node) if isinstance(n, ast.Assign)
                      and any(isinstance(t, ast.Name) and t.id == left.id for t in n.targets)]
            if len(values) != 1:
                return None
            left = values[0]
        if isinstance(left, ast.Call) and isinstance(left.func, (ast.Name, ast.Attribute)):
            q = qual(left.func)
            if q in (f"{XM}.get_ordinal", f"{XR}.global_ordinal", "torch.distributed.get_rank"):
                return "global"
            if q in (f"{XM}.get_local_ordinal", f"{XR}.local_ordinal", "torch.distributed.get_node_local_rank"):
                return "local"
    return None


def _inside_test(ctx, stmt, test: str) -> bool:
    """The statement already sits in `if <test>:` (no need to ask twice)."""
    parent = ctx.analysis.parent_of.get(stmt)
    return isinstance(parent, ast.If) and any(s is stmt for s in parent.body) and ctx.src(parent.test) == test


# -- NM116 xm.rendezvous ---------------------------------------------------------------------------
@rule(
    code="NM116",
    name="rendezvous",
    summary="xm.rendezvous(tag) becomes a barrier; with a payload, an all_gather_object of the payloads",
    fix="safe",
    severity="warning",
    triggers=call_and_ref(f"{XM}.rendezvous", f"{XM}.xla_rendezvous"),
    docs="""
        `xm.rendezvous(tag, payload=b'', replicas=[])` makes every process wait for the others and returns the list
        of all payloads (`xm.xla_rendezvous(payload, ordinals, tag)` likewise). As a statement without a payload it
        becomes `_neuron_barrier(tag)`, an inserted helper that calls `dist.barrier()` when a process group with
        more than one process exists (`dist.barrier()` itself raises without one). With a payload, or when the
        result is used, it becomes `_neuron_rendezvous(tag, payload)`, which returns the payloads gathered with
        `dist.all_gather_object`. `replicas=`/`ordinals=` (a subset of processes) is reported: make the group once
        with `dist.new_group`. TorchNeuron implements barrier on the default group only. After an
        `init_process_group` that always runs, the statement becomes `dist.barrier()`; in a single-device program
        it is removed (a finding at its line says so).
    """,
    examples=[("xm.rendezvous('download done')", "_neuron_barrier('download done')")],
)
def rendezvous(site, ctx):
    xla_form = site.key.endswith("xla_rendezvous")
    if site.kind == "ref":
        if xla_form:
            return ctx.finding(site, "xm.xla_rendezvous used as a value: call dist.all_gather_object (payloads) or dist.barrier() instead")
        return replace_callee(site, ctx, "_neuron_rendezvous", "xm.rendezvous used as a value: becomes the helper _neuron_rendezvous")
    call = site.call
    if has_star_args(call):
        return ctx.finding(site, "rendezvous with *args/**kwargs: replace with dist.barrier() or dist.all_gather_object by hand")
    if xla_form:
        payload, subset, tag = kwarg(call, "payload", 0), kwarg(call, "ordinals", 1), kwarg(call, "tag", 2)
    else:
        tag, payload, subset = kwarg(call, "tag", 0), kwarg(call, "payload", 1), kwarg(call, "replicas", 2)
    if subset is not None and not (isinstance(subset, (ast.List, ast.Tuple)) and not subset.elts) and not is_none(subset):
        return ctx.finding(site, "rendezvous among a subset of processes: make the group once with dist.new_group and "
                                 "call dist.barrier(group) / dist.all_gather_object(..., group=group) on its members")
    no_payload = payload is None or (isinstance(payload, ast.Constant) and payload.value in (b"", ""))
    fx = ctx.fixer()
    tag_src = ctx.src(tag) if tag is not None else ""
    state = group_at(ctx, site)
    if state is Group.NONE:
        if site.is_statement:
            fx.delete(site.stmt)
            return ctx.finding(site, "rendezvous in a single-device program: removed (one process has nobody to wait for)", fix=fx.build())
        payload_src = ctx.src(payload) if payload is not None else 'b""'
        fx.replace(call, f"[{payload_src}]")
        return ctx.finding(site, "rendezvous in a single-device program: the list of payloads is this process's alone", fix=fx.build())
    if site.is_statement and no_payload and state is Group.ALWAYS:
        fx.replace(call, f"{fx.ref(DIST, site.scope)}.barrier()")
        return ctx.finding(site, "rendezvous after init_process_group: becomes dist.barrier()", fix=fx.build())
    if site.is_statement and no_payload:
        fx.replace(call, f"{fx.helper('_neuron_barrier')}({tag_src})")
        return ctx.finding(site, "rendezvous without a payload: becomes _neuron_barrier() (dist.barrier() when distributed)", fix=fx.build())
    args = [tag_src or "None"]
    if not no_payload:
        args.append(ctx.src(payload))
    fx.replace(call, f"{fx.helper('_neuron_rendezvous')}({', '.join(args)})")
    return ctx.finding(site, "rendezvous whose payloads are used: becomes _neuron_rendezvous (dist.all_gather_object of the payloads)",
                       fix=fx.build())


# -- NM117 xm.all_reduce ---------------------------------------------------------------------------
@rule(
    code="NM117",
    name="all-reduce",
    summary="xm.all_reduce returns a new tensor (tensor input) or reduces a list in place: becomes _neuron_all_reduce",
    fix="safe",
    severity="warning",
    triggers=call_and_ref(f"{XM}.all_reduce"),
    docs="""
        `xm.all_reduce(reduce_type, inputs, scale=1.0, groups=None)` is out of place for a tensor (returns a new
        tensor, the input is unchanged) and in place for a list of tensors; `scale` multiplies the result; in one
        process it returns a copy and skips `scale`. `dist.all_reduce` is always in place and returns None, so the
        call becomes `_neuron_all_reduce(...)`, an inserted helper with the same signature and semantics
        (reduce types sum/mul/and/or/min/max map to `ReduceOp.SUM/PRODUCT/BAND/BOR/MIN/MAX`).

        Where the program model knows more: after an `init_process_group` that always runs,
        `total = xm.all_reduce(xm.REDUCE_SUM, t, scale=s)` on a tensor becomes `total = t.clone()`,
        `dist.all_reduce(total)`, `total *= s`; in a single-device program the call is the copy torch_xla returned
        (`t.clone()`). The gradient list of `gradients = xm._fetch_gradients(optimizer)` (NM148), reduced in place
        by `xm.all_reduce(xm.REDUCE_SUM, gradients, scale=s)`, becomes `dist.all_reduce(grad)` and `grad.mul_(s)`
        for each gradient when more than one process runs (torch_xla skipped both in one process).

        Reported instead: a single tensor reduced as a statement with the result discarded (under XLA that was a
        no-op; write `dist.all_reduce(t)` if an in-place reduction was meant), an argument that may be either a
        tensor or a list in statement form, and `groups=` (replica subgroups must be created once on every rank
        with `dist.new_group` and passed as `group=`). The xm.all_reduce calls of a file migrate together: when one
        is reported, every other one is left as it is too (with a finding naming the line that blocks them).
    """,
    examples=[("total = xm.all_reduce(xm.REDUCE_SUM, loss)", "total = _neuron_all_reduce(xm.REDUCE_SUM, loss)"),
              ("xm.all_reduce('sum', [a, b], scale=0.5)", "_neuron_all_reduce('sum', [a, b], scale=0.5)")],
)
def all_reduce(site, ctx):
    facts = program(ctx)
    # every call's plan decides each site (they migrate together): made once per file, not once per site
    plans = cached(ctx.analysis, "NM117 plans",
                   lambda a: [(node, _all_reduce_plan(ctx, node)) for node in facts.uses([f"{XM}.all_reduce"])])
    mine = next((p for n, p in plans if n is site.node), None) or _all_reduce_plan(ctx, site.node)
    if mine[0] == "report":
        return ctx.finding(site, mine[1])
    blockers = [(n, p) for n, p in plans if p[0] == "report"]
    if blockers:
        lines = ", ".join(str(n.lineno) for n, _ in blockers)
        return ctx.finding(site, f"xm.all_reduce left as it is: the xm.all_reduce call{'s' if len(blockers) > 1 else ''} at line "
                                 f"{lines} cannot be migrated automatically, and the {len(plans)} all_reduce calls of this file "
                                 "migrate together or not at all (half a migration mixes two collective stacks)")
    kind, message, _ = mine
    fx = ctx.fixer()
    if kind == "helper":
        return replace_callee(site, ctx, "_neuron_all_reduce", message)
    call = site.call
    inputs = kwarg(call, "inputs", 1)
    if kind == "copy":  # one process: torch_xla returned a copy (tensor) or the list itself, and skipped the scale
        if site.is_statement:
            fx.delete(site.stmt)
            return ctx.finding(site, "xm.all_reduce of a list in a single-device program reduced nothing: removed", fix=fx.build())
        fx.replace(call, f"{atom(ctx, inputs)}.clone()" if _tensor_like(ctx, inputs) else ctx.src(inputs))
        return ctx.finding(site, message, fix=fx.build())
    if kind == "grads":  # `xm.all_reduce(op, gradients, scale=s)` on xm._fetch_gradients's list: in place
        dist = fx.ref(DIST, site.scope)
        op = _reduce_op(ctx, kwarg(call, "reduce_type", 0))
        used = {n.id for n in walk(site.scope.node) if isinstance(n, ast.Name)} | {n.arg for n in walk(site.scope.node) if isinstance(n, ast.arg)}
        grad = next(x for x in ("grad", "gradient", "_grad", "_neuron_grad") if x not in used)
        lines = [f"if {dist}.is_initialized() and {dist}.get_world_size() > 1:",
                 f"    for {grad} in {ctx.src(inputs)}:",
                 f"        {dist}.all_reduce({grad}{'' if op == 'SUM' else f', op={dist}.ReduceOp.{op}'})"]
        scale = kwarg(call, "scale", 2)
        if scale is not None and const_value(scale, None) != 1.0:
            lines.append(f"        {grad}.mul_({ctx.src_relative(scale)})")
        fx.replace(site.stmt, "\n".join(lines) + "\n")
        return ctx.finding(site, message, fix=fx.build())
    # kind == "inline": `x = xm.all_reduce(op, t, scale=s)` after a sure init
    stmt = site.stmt
    target = ctx.src(stmt.targets[0])
    dist = fx.ref(DIST, site.scope)
    op = _reduce_op(ctx, kwarg(call, "reduce_type", 0))
    copy = ctx.src(inputs) if _fresh_tensor(ctx, inputs) else f"{atom(ctx, inputs)}.clone()"
    lines = [f"{target} = {copy}",
             f"{dist}.all_reduce({target}{'' if op == 'SUM' else f', op={dist}.ReduceOp.{op}'})"]
    scale = kwarg(call, "scale", 2)
    note = ""
    if scale is not None and const_value(scale, None) != 1.0:
        lines.append(f"{target} *= {ctx.src(scale)}")
        note = ("torch_xla skipped the scale when the world size was 1; it is now applied in one process too "
                "(no change when the scale is 1/world_size).")
    fx.replace(stmt, "\n".join(lines) + "\n")
    return ctx.finding(site, message, fix=fx.build(), note=note)


_OPS = {"sum": "SUM", "mul": "PRODUCT", "and": "BAND", "or": "BOR", "min": "MIN", "max": "MAX"}
_TENSOR_METHODS = {
    "clone", "detach", "sum", "mean", "float", "double", "half", "bfloat16", "long", "int", "to", "cpu", "reshape",
    "view", "unsqueeze", "squeeze", "abs", "max", "min", "sqrt", "pow", "div", "mul", "add", "sub", "contiguous",
    "new_tensor", "new_zeros", "new_ones", "flatten", "type_as", "norm", "argmax", "eq", "count_nonzero",
}


def _reduce_op(ctx, node):
    """ReduceOp name of a reduce type written as xm.REDUCE_X or its string, else None."""
    value = const_value(node, None)
    if value is None and isinstance(node, ast.Attribute):
        q = program(ctx).qualname(node)
        if q and q.startswith(XM + ".REDUCE_"):
            value = _REDUCE_CONSTANTS.get(q.rsplit(".", 1)[1])
    return _OPS.get(value) if isinstance(value, str) else None


_FRESH_FACTORIES = {"tensor", "ones", "zeros", "full", "empty", "stack", "cat", "rand", "randn", "arange", "ones_like", "zeros_like"}
_FRESH_METHODS = {"sum", "mean", "norm", "clone", "argmax", "argmin", "count_nonzero", "prod", "std", "var"}


def _fresh_tensor(ctx, node) -> bool:
    """The expression builds a new tensor (a factory, a reduction, arithmetic): reducing it in place needs no clone."""
    if isinstance(node, ast.BinOp):
        return _tensor_like(ctx, node)
    if not isinstance(node, ast.Call):
        return False
    if isinstance(node.func, (ast.Name, ast.Attribute)):
        q = program(ctx).qualname(node.func)
        if q is not None:
            return q.startswith("torch.") and q.count(".") == 1 and q.split(".")[1] in _FRESH_FACTORIES
    return isinstance(node.func, ast.Attribute) and node.func.attr in _FRESH_METHODS and not node.args and not node.keywords


def _tensor_like(ctx, node, depth: int = 0) -> bool:
    """The expression is a tensor (not a list of them) as far as this file shows."""
    if depth > 3 or node is None:
        return False
    if isinstance(node, ast.Call):
        q = program(ctx).qualname(node.func) if isinstance(node.func, (ast.Name, ast.Attribute)) else None
        if q is not None:
            return q.startswith("torch.") and q.rsplit(".", 1)[1] not in ("split", "chunk", "unbind", "tensor_split")
        return isinstance(node.func, ast.Attribute) and node.func.attr in _TENSOR_METHODS
    if isinstance(node, ast.BinOp):
        return _tensor_like(ctx, node.left, depth + 1) or _tensor_like(ctx, node.right, depth + 1)
    if isinstance(node, ast.UnaryOp):
        return _tensor_like(ctx, node.operand, depth + 1)
    if isinstance(node, ast.Name):
        fn = ctx.analysis.parent_of.get(node)
        while fn is not None and not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.Module)):
            fn = ctx.analysis.parent_of.get(fn)
        scope = fn.body if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)) else []
        values = [s.value for body_stmt in scope for s in walk(body_stmt)
                  if isinstance(s, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and s.value is not None
                  and any(isinstance(t, ast.Name) and t.id == node.id for t in (s.targets if isinstance(s, ast.Assign) else [s.target]))]
        return bool(values) and all(_tensor_like(ctx, v, depth + 1) for v in values)
    return False


def _all_reduce_plan(ctx, node):
    """(kind, message, None): "helper", "inline" (clone + dist.all_reduce + scale), "copy" (one process) or "report"."""
    a = ctx.analysis
    if not isinstance(node, ast.Call):
        return ("helper", "xm.all_reduce used as a value: becomes the helper _neuron_all_reduce", None)
    call = node
    if has_star_args(call):
        return ("helper", "xm.all_reduce with *args/**kwargs: becomes _neuron_all_reduce (same signature)", None)
    inputs = kwarg(call, "inputs", 1)
    if not is_none(kwarg(call, "groups", 3)):
        return ("report", "xm.all_reduce with groups=: create each subgroup once with dist.new_group (on every rank) and "
                          "call dist.all_reduce(t, op, group=subgroup)", None)
    if inputs is None:
        return ("report", "xm.all_reduce without inputs: migrate by hand", None)
    is_list = isinstance(inputs, (ast.List, ast.Tuple)) or _gradient_list(ctx, inputs)
    statement = isinstance(a.parent_of.get(call), ast.Expr)
    if statement and not is_list:
        if isinstance(inputs, (ast.Name, ast.Attribute, ast.Subscript)):
            return ("report", f"xm.all_reduce result discarded: for a tensor `{ctx.src(inputs)}` this did nothing under XLA "
                              "(the tensor form is out of place); assign the result, or use dist.all_reduce for an in-place "
                              "reduction; for a list use _neuron_all_reduce / a dist.all_reduce loop", None)
        return ("report", "xm.all_reduce of a tensor with the result discarded did nothing under XLA: assign the result", None)
    facts = program(ctx)
    state = facts.group_at(call)
    tensor = _tensor_like(ctx, inputs)
    if state is Group.NONE and (tensor or is_list):
        return ("copy", "xm.all_reduce in a single-device program: a copy of the input (torch_xla reduced nothing and "
                        "skipped the scale in one process)", None)
    stmt = _stmt_of(a, call)
    if (statement and _gradient_list(ctx, inputs) and _reduce_op(ctx, kwarg(call, "reduce_type", 0))
            and alone_on_lines(ctx, stmt)):
        return ("grads", "xm.all_reduce of the gradient list: becomes dist.all_reduce of each gradient, then the scale, "
                         "when more than one process runs (torch_xla skipped both in one process)", None)
    if (state is Group.ALWAYS and tensor and isinstance(stmt, ast.Assign) and stmt.value is call and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], (ast.Name, ast.Attribute)) and _reduce_op(ctx, kwarg(call, "reduce_type", 0))
            and alone_on_lines(ctx, stmt) and simple_ref(stmt.targets[0])):
        return ("inline", "xm.all_reduce of a tensor: becomes dist.all_reduce on a clone (xm.all_reduce left its input "
                          "unchanged), then the scale", None)
    return ("helper", "xm.all_reduce: becomes _neuron_all_reduce (out of place for a tensor, in place for a list, as before)", None)


def _gradient_list(ctx, node) -> bool:
    """A name that its function binds only to `xm._fetch_gradients(...)` (NM148 makes it the list of gradients)."""
    if not isinstance(node, ast.Name):
        return False
    fn = ctx.analysis.parent_of.get(node)
    while fn is not None and not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.Module)):
        fn = ctx.analysis.parent_of.get(fn)
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        return False
    values = []
    for n in walk(fn):
        if isinstance(n, ast.Name) and n.id == node.id and not isinstance(n.ctx, ast.Load):
            holder = ctx.analysis.parent_of.get(n)
            if not (isinstance(holder, ast.Assign) and holder.targets == [n]):
                return False
            values.append(holder.value)
        elif isinstance(n, ast.arg) and n.arg == node.id:
            return False
    return bool(values) and all(isinstance(v, ast.Call) and program(ctx).qualname(v.func) == f"{XM}._fetch_gradients"
                                for v in values)


def _stmt_of(analysis, node):
    while not isinstance(node, ast.stmt):
        node = analysis.parent_of[node]
    return node


# -- NM118 xm.REDUCE_* constants -------------------------------------------------------------------
_REDUCE_CONSTANTS = {"REDUCE_SUM": "sum", "REDUCE_MUL": "mul", "REDUCE_AND": "and", "REDUCE_OR": "or", "REDUCE_MIN": "min", "REDUCE_MAX": "max"}


@rule(
    code="NM118",
    name="reduce-type-constant",
    summary="xm.REDUCE_SUM and the other reduce-type constants become their string values",
    fix="safe",
    severity="warning",
    triggers=[("ref", f"{XM}.{n}") for n in _REDUCE_CONSTANTS],
    docs="""
        `xm.REDUCE_SUM`, `REDUCE_MUL`, `REDUCE_AND`, `REDUCE_OR`, `REDUCE_MIN` and `REDUCE_MAX` are the strings
        `'sum'`, `'mul'`, `'and'`, `'or'`, `'min'`, `'max'`; the helpers that replace the XLA collectives accept
        the strings, so the constants become string literals and the torch_xla import can go. For a direct
        `dist.all_reduce`, use `dist.ReduceOp.SUM` etc.
    """,
    examples=[("op = xm.REDUCE_MAX", "op = 'max'")],
)
def reduce_type_constant(site, ctx):
    value = _REDUCE_CONSTANTS[site.key.rsplit(".", 1)[1]]
    fx = ctx.fixer()
    fx.replace(site.node, repr(value))
    return ctx.finding(site, f"{site.key.rsplit('.', 1)[1]} is the string '{value}': written as the literal", fix=fx.build())


# -- NM119 xm.all_gather ---------------------------------------------------------------------------
@rule(
    code="NM119",
    name="all-gather",
    summary="xm.all_gather returns one tensor concatenated along dim: becomes _neuron_all_gather",
    fix="safe",
    severity="warning",
    triggers=call_and_ref(f"{XM}.all_gather"),
    docs="""
        `xm.all_gather(value, dim=0, groups=None, output=None)` returns a single tensor with every rank's `value`
        concatenated along `dim` (`dist.all_gather` fills a list instead). The call becomes
        `_neuron_all_gather(...)`, an inserted helper with the same signature: `dist.all_gather` into a list,
        then `torch.cat(..., dim)`; `output=` is filled in place; a list input gathers each item. `groups=`,
        `channel_id=` and `use_global_device_ids=` are reported (make subgroups once with `dist.new_group`).
    """,
    examples=[("gathered = xm.all_gather(preds, dim=0)", "gathered = _neuron_all_gather(preds, dim=0)")],
)
def all_gather(site, ctx):
    if site.kind == "call" and not has_star_args(site.call):
        call = site.call
        if not is_none(kwarg(call, "groups", 2)) or not is_none(kwarg(call, "channel_id", 5)) or not is_none(kwarg(call, "use_global_device_ids", 6)):
            return ctx.finding(site, "xm.all_gather over replica groups: create each subgroup once with dist.new_group and "
                                     "call dist.all_gather(parts, t, group=subgroup), then torch.cat(parts, dim)")
    return replace_callee(site, ctx, "_neuron_all_gather", "xm.all_gather: becomes _neuron_all_gather (dist.all_gather + torch.cat along dim)")


# -- NM120 xm.reduce_scatter -----------------------------------------------------------------------
@rule(
    code="NM120",
    name="reduce-scatter",
    summary="xm.reduce_scatter(reduce_type, t, scale, dim, shard_count) becomes _neuron_reduce_scatter",
    fix="safe",
    severity="warning",
    triggers=call_and_ref(f"{XM}.reduce_scatter"),
    docs="""
        `xm.reduce_scatter(reduce_type, input, scale, scatter_dim, shard_count, groups=None, output=None)` reduces
        `input` over all ranks and returns this rank's shard along `scatter_dim`, multiplied by `scale`. It becomes
        `_neuron_reduce_scatter(...)`, an inserted helper with the same signature built on `dist.reduce_scatter`
        (implemented by the TorchNeuron backend). A list input (coalesced form) and `groups=` are reported.
    """,
    examples=[("shard = xm.reduce_scatter(xm.REDUCE_SUM, grad, 1.0, 0, world)",
               "shard = _neuron_reduce_scatter(xm.REDUCE_SUM, grad, 1.0, 0, world)")],
)
def reduce_scatter(site, ctx):
    if site.kind == "call" and not has_star_args(site.call):
        call = site.call
        if not is_none(kwarg(call, "groups", 5)):
            return ctx.finding(site, "xm.reduce_scatter over replica groups: create the subgroup once with dist.new_group and "
                                     "call dist.reduce_scatter_tensor(out, t, op, group=subgroup)")
        if isinstance(kwarg(call, "input", 1), (ast.List, ast.Tuple)):
            return ctx.finding(site, "coalesced xm.reduce_scatter of a list: call dist.reduce_scatter_tensor per tensor")
    return replace_callee(site, ctx, "_neuron_reduce_scatter", "xm.reduce_scatter: becomes _neuron_reduce_scatter (dist.reduce_scatter)")


# -- NM121 xm.mesh_reduce --------------------------------------------------------------------------
@rule(
    code="NM121",
    name="mesh-reduce",
    summary="xm.mesh_reduce(tag, data, reduce_fn) becomes dist.all_gather_object into a list, then reduce_fn of the list",
    fix="safe",
    severity="warning",
    triggers=call_and_ref(f"{XM}.mesh_reduce"),
    docs="""
        `xm.mesh_reduce(tag, data, reduce_fn)` moves `data` to the CPU, gathers every rank's copy and returns
        `reduce_fn(list_of_copies)` (it is also used as a broadcast: `lambda xs: xs[0]`); the tag only named the
        rendezvous.

        Where the program model knows the process group, the plain form is written, with the data as it is when
        it is a Python value (built from `.item()`, numbers, lists of them) and `.detach().cpu()` when it is a
        tensor:
        - after an `init_process_group` that always runs, `x = xm.mesh_reduce(tag, data, fn)` (or `return ...`)
          becomes `gathered = [None] * dist.get_world_size()`, `dist.all_gather_object(gathered, data)`,
          `x = fn(gathered)` (a one-argument lambda's body is written with its parameter as the list's name);
        - in a single-device program, `fn([data])`.
        Elsewhere (a group that may not exist, data of unknown type, the call inside a larger expression), it
        becomes `_neuron_mesh_reduce(...)`, an inserted helper doing the same with `dist.all_gather_object` and
        returning `reduce_fn([data])` without a process group.
    """,
    examples=[("acc = xm.mesh_reduce('acc', acc, np.mean)", "acc = _neuron_mesh_reduce('acc', acc, np.mean)"),
              ("dist.init_process_group('xla')\nacc = xm.mesh_reduce('acc', correct.item(), np.mean)",
               "dist.init_process_group(\"neuron\")\ngathered = [None] * dist.get_world_size()\n"
               "dist.all_gather_object(gathered, correct.item())\nacc = np.mean(gathered)")],
)
def mesh_reduce(site, ctx):
    if site.kind == "call" and not has_star_args(site.call):
        plain = _plain_mesh_reduce(site, ctx)
        if plain is not None:
            return plain
    return replace_callee(site, ctx, "_neuron_mesh_reduce", "xm.mesh_reduce: becomes _neuron_mesh_reduce (dist.all_gather_object, then reduce_fn)")


def _plain_mesh_reduce(site, ctx):
    """The inline form of xm.mesh_reduce where the group state and the data's kind are known, else None."""
    call = site.call
    tag, data, reduce_fn = kwarg(call, "tag", 0), kwarg(call, "data", 1), kwarg(call, "reduce_fn", 2)
    if data is None or reduce_fn is None or inside_deferred(site) or not _plain_tag(tag):
        return None
    if _python_value(ctx, data):
        data_src = ctx.src_relative(data)
    elif _tensor_like(ctx, data):
        data_src = f"{atom(ctx, data)}.detach().cpu()"
    else:
        return None
    state = group_at(ctx, site)
    fx = ctx.fixer()
    if state is Group.NONE:
        if isinstance(reduce_fn, ast.Lambda):
            return None
        fx.replace(call, f"{atom(ctx, reduce_fn)}([{data_src}])")
        return ctx.finding(site, "xm.mesh_reduce in a single-device program: reduce_fn of this process's value alone", fix=fx.build())
    if state is not Group.ALWAYS:
        return None
    stmt = site.stmt
    if not (isinstance(stmt, (ast.Assign, ast.Return)) and stmt.value is call and alone_on_lines(ctx, stmt)):
        return None
    if isinstance(stmt, ast.Assign) and not (len(stmt.targets) == 1 and isinstance(stmt.targets[0], (ast.Name, ast.Attribute, ast.Tuple))):
        return None
    param = _lambda_param(reduce_fn)
    if param is not None and site.scope.lookup(param)[1] is None and not _used_outside(ctx, param, site.scope.node, reduce_fn):
        gathered, reduced = param, ctx.src_relative(reduce_fn.body)
    else:
        gathered = _free_name(ctx, "gathered")
        reduced = f"{atom(ctx, reduce_fn)}({gathered})"
    dist = fx.ref(DIST, site.scope)
    head = "return " if isinstance(stmt, ast.Return) else f"{ctx.src(stmt.targets[0])} = "
    lines = [f"{gathered} = [None] * {dist}.get_world_size()",
             f"{dist}.all_gather_object({gathered}, {data_src})",
             f"{head}{reduced}"]
    fx.replace(stmt, "\n".join(lines) + "\n")
    return ctx.finding(site, "xm.mesh_reduce after init_process_group: becomes dist.all_gather_object into a list, then reduce_fn "
                             "of the list (the tag only named the rendezvous)", fix=fx.build())


def _plain_tag(tag) -> bool:
    """The tag (dropped: it only named the rendezvous) has no side effects: a literal, a name, an f-string of them."""
    if isinstance(tag, (ast.Constant, ast.Name)):
        return True
    if isinstance(tag, ast.JoinedStr):
        return all(isinstance(v, ast.Constant) or (isinstance(v, ast.FormattedValue) and simple_ref(v.value)) for v in tag.values)
    return False


def _lambda_param(node):
    """The parameter of `lambda xs: ...` (one plain positional parameter, nothing else), else None."""
    if not isinstance(node, ast.Lambda):
        return None
    a = node.args
    if a.posonlyargs or a.kwonlyargs or a.vararg or a.kwarg or a.defaults or len(a.args) != 1:
        return None
    return a.args[0].arg


def _name_counts(node) -> Counter:
    """How often each name is used or bound under `node` (parameters included)."""
    out, stack = Counter(), [node]
    while stack:
        n = stack.pop()
        if isinstance(n, ast.Name):
            out[n.id] += 1
        elif isinstance(n, ast.arg):
            out[n.arg] += 1
        stack.extend(ast.iter_child_nodes(n))
    return out


def _used_outside(ctx, name: str, node, inner) -> bool:
    """`name` is used or bound under `node` outside `inner` (a node under it). The counts of a scope are made once
    per file, not per site (a long function with many mesh_reduce calls was quadratic)."""
    counts = cached(ctx.analysis, f"name counts:{id(node)}", lambda a: _name_counts(node))
    return counts[name] > _name_counts(inner)[name]


def _free_name(ctx, base: str) -> str:
    """`base`, or `base_2`, ... : a name nothing in the file binds or uses."""
    taken = ctx.analysis.defined_names | cached(ctx.analysis, "names in file", lambda a: set(_name_counts(a.tree)))
    name, k = base, 2
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    return name


_PLAIN_CALLS = {"float", "int", "round", "len", "abs", "bool", "str"}
_PLAIN_OF_ARGS = {"sum", "max", "min", "list", "tuple", "sorted"}


def _python_value(ctx, node, depth: int = 0) -> bool:
    """The expression is a Python value with no tensor in it (numbers, `.item()`, lists of them), as far as this
    file shows: what xm.mesh_reduce gathered unchanged."""
    if depth > 8 or node is None:
        return False
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, (ast.List, ast.Tuple)):
        return all(_python_value(ctx, e, depth + 1) for e in node.elts)
    if isinstance(node, (ast.ListComp, ast.GeneratorExp)):
        return _python_value(ctx, node.elt, depth + 1)
    if isinstance(node, ast.Call) and not has_star_args(node):
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr in ("item", "tolist") and not node.args and not node.keywords:
            return True
        if isinstance(f, ast.Name) and ctx.analysis.module_scope.lookup(f.id)[1] is None:  # a builtin, not rebound
            if f.id in _PLAIN_CALLS:
                return True
            if f.id in _PLAIN_OF_ARGS and node.args and not node.keywords:
                return all(_python_value(ctx, x, depth + 1) for x in node.args)
        return False
    if isinstance(node, ast.BinOp):
        return _python_value(ctx, node.left, depth + 1) and _python_value(ctx, node.right, depth + 1)
    if isinstance(node, ast.UnaryOp):
        return _python_value(ctx, node.operand, depth + 1)
    if isinstance(node, ast.Subscript):
        return _python_value(ctx, node.value, depth + 1)
    if isinstance(node, ast.Name):
        values = _local_values(ctx, node)
        return values is not None and all(_python_value(ctx, v, depth + 1) for v in values)
    return False


def _binding_nodes(a, fn) -> dict:
    """name -> the nodes under `fn` (in walk order) that may bind it or add to it: `global`/`nonlocal`, assignments
    whose targets mention it, stores, and `name.append/extend/insert(...)` calls. Built once per scope, so that
    asking about many names in a large module stays linear."""
    def build(_a) -> dict:
        index: dict = {}

        def add(n, node):
            lst = index.setdefault(n, [])
            if not lst or lst[-1] is not node:
                lst.append(node)

        for node in walk(fn):
            t = type(node)
            if t is ast.Global or t is ast.Nonlocal:
                for n in node.names:
                    add(n, node)
            elif t is ast.Assign:
                for target in node.targets:
                    for sub in walk(target):
                        if type(sub) is ast.Name:
                            add(sub.id, node)
            elif (t is ast.AugAssign or t is ast.AnnAssign) and type(node.target) is ast.Name:
                add(node.target.id, node)
            elif t is ast.Name and type(node.ctx) is not ast.Load:
                add(node.id, node)
            elif t is ast.Call and type(node.func) is ast.Attribute and type(node.func.value) is ast.Name:
                add(node.func.value.id, node)
        return index

    return cached(a, f"binding_nodes:{id(fn)}", build)


def _local_values(ctx, name: ast.Name):
    """Every value a local variable of the enclosing function (or module) is given: assignments, `+=`, and what
    `.append`/`.extend`/`.insert` put into it. None when it is bound any other way (a parameter, a loop target,
    a `global`) or stored into by subscript, so its values are not all visible."""
    a = ctx.analysis
    fn = a.parent_of.get(name)
    while fn is not None and not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.Module)):
        fn = a.parent_of.get(fn)
    if fn is None or isinstance(fn, ast.Lambda):
        return None
    if not isinstance(fn, ast.Module):
        params = fn.args
        if name.id in {p.arg for p in [*params.posonlyargs, *params.args, *params.kwonlyargs, params.vararg, params.kwarg] if p}:
            return None
    values = []
    for node in _binding_nodes(a, fn).get(name.id, ()):
        if isinstance(node, (ast.Global, ast.Nonlocal)) and name.id in node.names:
            return None
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name) and t.id == name.id:
                    values.append(node.value)
                elif (isinstance(t, ast.Tuple) and isinstance(node.value, ast.Tuple) and len(t.elts) == len(node.value.elts)
                      and not any(isinstance(e, ast.Starred) for e in [*t.elts, *node.value.elts])):
                    values.extend(v for e, v in zip(t.elts, node.value.elts) if isinstance(e, ast.Name) and e.id == name.id)
                    if any(not isinstance(e, ast.Name) and any(isinstance(n, ast.Name) and n.id == name.id for n in ast.walk(e)) for e in t.elts):
                        return None
                elif any(isinstance(n, ast.Name) and n.id == name.id for n in ast.walk(t)):
                    return None  # unpacked or subscript-stored: values not visible
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)) and isinstance(node.target, ast.Name) and node.target.id == name.id:
            if node.value is not None:
                values.append(node.value)
        elif isinstance(node, ast.Name) and node.id == name.id and isinstance(node.ctx, (ast.Store, ast.Del)):
            parent = a.parent_of.get(node)
            if isinstance(parent, ast.Tuple):
                parent = a.parent_of.get(parent)
            if not isinstance(parent, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                return None  # a loop target, `with ... as`, a walrus, `del`
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
              and node.func.value.id == name.id and node.func.attr in ("append", "extend", "insert")):
            if not node.args or node.keywords:
                return None
            item = node.args[-1]
            values.append(ast.List(elts=[item], ctx=ast.Load()) if node.func.attr != "extend" else item)
    return values or None


# -- NM122 xm.collective_broadcast -----------------------------------------------------------------
@rule(
    code="NM122",
    name="collective-broadcast",
    summary="xm.collective_broadcast(tensors, root_ordinal) becomes _neuron_collective_broadcast (dist.broadcast per tensor)",
    fix="safe",
    severity="warning",
    triggers=call_and_ref(f"{XM}.collective_broadcast"),
    docs="""
        `xm.collective_broadcast(tensors, root_ordinal=0, groups=None)` overwrites each tensor in place with the
        root's values. It becomes `_neuron_collective_broadcast(...)`, an inserted helper calling
        `dist.broadcast(t, src=root_ordinal)` for each tensor (`src` is a global rank). `groups=` is reported.
    """,
    examples=[("xm.collective_broadcast([w])", "_neuron_collective_broadcast([w])")],
)
def collective_broadcast(site, ctx):
    if site.kind == "call" and not has_star_args(site.call) and not is_none(kwarg(site.call, "groups", 2)):
        return ctx.finding(site, "xm.collective_broadcast over replica groups: create the subgroup once with dist.new_group and "
                                 "call dist.broadcast(t, src, group=subgroup)")
    return replace_callee(site, ctx, "_neuron_collective_broadcast", "xm.collective_broadcast: becomes _neuron_collective_broadcast")


# -- NM123 xm.broadcast_master_param ---------------------------------------------------------------
@rule(
    code="NM123",
    name="broadcast-master-param",
    summary="xm.broadcast_master_param(model) becomes _neuron_broadcast_master_param(model); DDP already does it",
    fix="safe",
    severity="warning",
    triggers=call_and_ref(f"{XM}.broadcast_master_param"),
    docs="""
        `xm.broadcast_master_param(model)` copies rank 0's parameters and buffers to every rank. It becomes
        `_neuron_broadcast_master_param(model)`, an inserted helper looping `dist.broadcast(t.data, src=0)`.
        When the file wraps the model in `DistributedDataParallel`, which broadcasts rank 0's state when it is
        constructed, the finding says so: delete the call if it runs before the DDP wrapper is built.
    """,
    examples=[("xm.broadcast_master_param(model)", "_neuron_broadcast_master_param(model)")],
)
def broadcast_master_param(site, ctx):
    note = "DistributedDataParallel broadcasts rank 0's parameters when constructed: this call can go if DDP wraps the model afterwards." if wrapped_in_ddp(ctx) else ""
    return replace_callee(site, ctx, "_neuron_broadcast_master_param",
                          "xm.broadcast_master_param: becomes _neuron_broadcast_master_param (dist.broadcast from rank 0)", note=note)


# -- NM124 collectives without an equivalent -------------------------------------------------------
_NO_EQUIVALENT = {
    "send": "TorchNeuron implements no send/recv; exchange the data with dist.all_gather (or dist.all_to_all) instead",
    "recv": "TorchNeuron implements no send/recv; exchange the data with dist.all_gather (or dist.all_to_all) instead",
    "collective_permute": "TorchNeuron implements no send/recv for a permute; express it with dist.all_gather and pick your source's slice",
    "all_to_all": "rewrite with dist.all_to_all_single (dim 0, equal splits only on TorchNeuron), transposing split/concat dims to 0",
    "all_gather_bucketized": "call _neuron_all_gather / dist.all_gather per tensor (or use DDP/FSDP, which bucket)",
    "reduce_scatter_bucketized": "call dist.reduce_scatter per tensor (or use FSDP, which buckets)",
    "all_reduce_bucketized_gradients": "wrap the model in DistributedDataParallel, which buckets gradient all-reduces",
    "do_on_ordinals": "write `if _neuron_rank() in ordinals: target(*data)` followed by dist.barrier()",
}


@rule(
    code="NM124",
    name="collective-without-equivalent",
    summary="xm.send/recv/collective_permute/all_to_all and bucketized collectives have no direct TorchNeuron equivalent",
    fix="none",
    severity="error",
    triggers=call_and_ref(*xm_keys(*_NO_EQUIVALENT)),
    docs=f"""
        These collectives address devices by XLA channel ids or replica groups, or bucket tensors for the XLA
        compiler. The TorchNeuron `neuron` process group implements no send/recv (so no collective permute) and
        all_to_all with equal splits only (torch_neuronx `distributed/backend.py`; {DIST_GUIDE}). Each use is
        reported with the construct to rewrite it with.
    """,
    examples=[("xm.send(t, channel_id=1)", None)],
)
def collective_without_equivalent(site, ctx):
    name = site.key.rsplit(".", 1)[1]
    return ctx.finding(site, f"xm.{name} has no TorchNeuron equivalent: {_NO_EQUIVALENT[name]}")


# -- NM125 xm.save ---------------------------------------------------------------------------------
@rule(
    code="NM125",
    name="xla-save",
    summary="xm.save writes CPU copies from each host's rank 0: becomes _neuron_save with the same defaults",
    fix="safe",
    severity="warning",
    triggers=call_and_ref(f"{XM}.save"),
    docs="""
        `xm.save(data, file_or_path, master_only=True, global_master=False)` is called by every rank: it moves the
        tensors in `data` to the CPU, writes on rank 0 of **each host** (`global_master=True`: global rank 0 only;
        `master_only=False`: every rank), and then waits for all ranks. A plain `torch.save` on every rank races on
        the file; on `rank == 0` only it changes multi-node behaviour and saves device tensors. The call becomes
        `_neuron_save(...)`, an inserted helper with the same signature and defaults (tensors are moved with
        public API only: dicts, lists and tuples are walked). Used as a value (`save_function=xm.save`) it becomes
        the helper name. Where the program model knows more, the plain form is written: in a single-device program
        `torch.save(<CPU copy>, path)`; after an `init_process_group` that always runs, `if
        dist.get_node_local_rank(fallback_rank=0) == 0: torch.save(<CPU copy>, path)` then `dist.barrier()`. The
        CPU copy of a model's `state_dict()` is `{k: v.cpu() for k, v in model.state_dict().items()}`.
    """,
    examples=[("xm.save(model.state_dict(), 'model.pt')", "_neuron_save(model.state_dict(), 'model.pt')")],
)
def xla_save(site, ctx):
    if site.kind == "call" and not has_star_args(site.call):
        plain = _plain_save(site, ctx)
        if plain is not None:
            return plain
    return replace_callee(site, ctx, "_neuron_save", "xm.save: becomes _neuron_save (CPU copy, written by each host's rank 0, then a barrier)")


def _plain_save(site, ctx):
    """torch.save of a CPU copy: directly in a single-device program, on the saving rank then a barrier after a sure init."""
    call = site.call
    data, path = kwarg(call, "data", 0), kwarg(call, "file_or_path", 1)
    master_only = const_value(kwarg(call, "master_only", 2), True) if kwarg(call, "master_only", 2) is not None else True
    global_master = const_value(kwarg(call, "global_master", 3), False) if kwarg(call, "global_master", 3) is not None else False
    if data is None or path is None or not isinstance(master_only, bool) or not isinstance(global_master, bool):
        return None
    state = group_at(ctx, site)
    if state not in (Group.NONE, Group.ALWAYS):
        return None
    fx = ctx.fixer()
    cpu = _cpu_copy(ctx, fx, data)
    save = f"{fx.ref('torch', site.scope)}.save({cpu}, {ctx.src(path)})"
    if state is Group.NONE:
        fx.replace(call, save)
        return ctx.finding(site, "xm.save in a single-device program: becomes torch.save of a CPU copy", fix=fx.build())
    stmt = site.stmt
    if not (site.is_statement and alone_on_lines(ctx, stmt)):
        return None
    dist = fx.ref(DIST, site.scope)
    lines = []
    if not master_only:
        lines.append(save)
    else:
        test = f"{dist}.get_rank() == 0" if global_master else f"{dist}.get_node_local_rank(fallback_rank=0) == 0"
        lines += [f"if {test}:", f"    {save}"]
    lines.append(f"{dist}.barrier()")
    fx.replace(stmt, "\n".join(lines) + "\n")
    who = "every rank" if not master_only else ("global rank 0" if global_master else "rank 0 of each host")
    return ctx.finding(site, f"xm.save: becomes torch.save of a CPU copy on {who}, then dist.barrier() (xm.save waited for all ranks)",
                       fix=fx.build())


def _cpu_copy(ctx, fx, data) -> str:
    """A CPU copy of `data` as one expression: a comprehension for a module's state_dict (also as a value of a dict
    literal whose other values are constants), else the small helper."""
    plain = _plain_cpu_copy(ctx, data)
    if plain is not None:
        return plain
    return f"{fx.helper('_neuron_to_cpu')}({ctx.src(data)})"


def _plain_cpu_copy(ctx, data):
    if (isinstance(data, ast.Call) and isinstance(data.func, ast.Attribute) and data.func.attr == "state_dict"
            and not data.args and not data.keywords and _is_module(ctx, data.func.value)):
        return f"{{k: v.cpu() for k, v in {ctx.src(data)}.items()}}"
    if isinstance(data, ast.Constant):
        return ctx.src(data)
    if isinstance(data, ast.Dict) and all(k is not None for k in data.keys) and ctx.analysis.span(data).line == ctx.analysis.span(data).end_line:
        values = [_plain_cpu_copy(ctx, v) for v in data.values]
        if all(v is not None for v in values):
            return "{" + ", ".join(f"{ctx.src(k)}: {v}" for k, v in zip(data.keys, values)) + "}"
    return None


def _is_module(ctx, node) -> bool:
    """`node` is a model: the file takes its .parameters() (an optimizer's, so its state_dict holds tensors only)."""
    if not simple_ref(node):
        return False

    def owners(a) -> set:  # the text of every `X` in `X.parameters()` / `X.named_parameters()` (once per file)
        return {ctx.src(n.func.value) for n in walk(a.tree)
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("parameters", "named_parameters")}

    return ctx.src(node) in cached(ctx.analysis, "parameters owners", owners)


# -- NM126 init_process_group('xla') ---------------------------------------------------------------
_XLA_INIT_METHODS = ("xla://", "pjrt://")


@rule(
    code="NM126",
    name="xla-process-group",
    summary="dist.init_process_group('xla', init_method='xla://') becomes dist.init_process_group(\"neuron\")",
    fix="safe",
    severity="warning",
    triggers=[("call", f"{DIST}.init_process_group"), ("call", f"{DIST}.distributed_c10d.init_process_group")],
    docs=f"""
        The XLA process group backend `'xla'` and its rendezvous `init_method='xla://'` (`'pjrt://'` before
        torch_xla 2.2) become the TorchNeuron backend `"neuron"` with the default `env://` rendezvous, whose
        `MASTER_ADDR`/`MASTER_PORT`/`RANK`/`WORLD_SIZE` torchrun provides ({DIST_GUIDE}). `rank=` and
        `world_size=` keep their meaning. The `neuron` backend must be initialised before the first tensor is put
        on the device; the finding notes it. `import torch_xla.distributed.xla_backend` is removed by NM100 once
        nothing uses it. An `if not dist.is_initialized(): dist.init_process_group(...)` that can never run, because
        the program model knows a group is always started before it (a `setup()` that the launched worker calls
        after the launch rewrite's own init), is removed.
    """,
    examples=[("dist.init_process_group('xla', init_method='xla://')", 'dist.init_process_group("neuron")')],
)
def xla_process_group(site, ctx):
    call = site.call
    if has_star_args(call):
        return None
    backend = kwarg(call, "backend", 0)
    init = kwarg(call, "init_method", 1)
    xla_backend = isinstance(backend, ast.Constant) and backend.value == "xla"
    xla_init = isinstance(init, ast.Constant) and isinstance(init.value, str) and init.value.startswith(_XLA_INIT_METHODS)
    guard = program(ctx).launch_inits() and not _guarded_init(ctx, site)
    if not xla_backend and not xla_init and not guard:
        return None
    if xla_init and not xla_backend and backend is not None:
        return ctx.finding(site, f"init_method {init.value!r} needs the XLA backend: use init_method='env://' (torchrun) with backend \"neuron\"")
    dead = _dead_guarded_init(ctx, site)
    if dead is not None:
        fx = ctx.fixer()
        fx.delete(dead)
        return ctx.finding(site, f"`if {ctx.src(dead.test)}: init_process_group(...)` can never run: the process group is "
                                 "always started before this point (by the launch rewrite's init, or the program's own): removed",
                           fix=fx.build())
    fx = ctx.fixer()
    new_call = ctx.src(call)
    drops = []
    if xla_backend or xla_init:
        parts = []
        for i, a in enumerate(call.args):
            if a is backend:
                parts.append('"neuron"')
            elif a is init:
                drops.append((a, f"init_method={ctx.src(a)} (torchrun's env:// rendezvous replaces it)"))
                if i == len(call.args) - 1:
                    continue
                parts.append("None")
            else:
                parts.append(ctx.src(a))
        for kw in call.keywords:
            if kw.value is init:
                drops.append((kw, f"init_method={ctx.src(kw.value)} (torchrun's env:// rendezvous replaces it)"))
                continue
            parts.append(f'{kw.arg}="neuron"' if kw.value is backend else f"{kw.arg}={ctx.src(kw.value)}")
        if backend is None:
            parts.insert(0, '"neuron"')
        new_call = f"{ctx.src(call.func)}({', '.join(parts)})"
    extra = dropped(ctx, site, drops)
    message = "XLA process group: becomes init_process_group(\"neuron\") with the env:// rendezvous (torchrun)" if (xla_backend or xla_init) else ""
    note = ("Call it before any tensor is moved to the neuron device: the backend cannot start once the Neuron runtime "
            "is initialised.")
    if guard:
        stmt = site.stmt
        dist = fx.ref(DIST, site.scope)
        parent = ctx.analysis.parent_of.get(stmt)
        if not (isinstance(stmt, ast.Expr) and stmt.value is call):
            return [ctx.finding(site, "init_process_group in a program whose launch now starts the group: guard it with "
                                      "`if not dist.is_initialized():` by hand (its value is used)"), *extra]
        if isinstance(parent, ast.If) and parent.body == [stmt] and not parent.orelse and starts_line(ctx, stmt):
            test = parent.test
            test_src = ctx.src(test) if not isinstance(test, (ast.BoolOp, ast.IfExp, ast.Lambda, ast.NamedExpr)) or (
                isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And)) else f"({ctx.src(test)})"
            fx.replace(test, f"{test_src} and not {dist}.is_initialized()")
            fx.replace(call, new_call)
        elif alone_on_lines(ctx, stmt):
            fx.replace(stmt, f"if not {dist}.is_initialized():\n    {new_call}\n")
        else:
            return [ctx.finding(site, "init_process_group on a shared line in a program whose launch now starts the group: "
                                      "guard it with `if not dist.is_initialized():` by hand"), *extra]
        message = (message + "; " if message else "") + ("guarded with `not dist.is_initialized()`: the launch rewrite already "
                                                         "starts the group whenever torchrun runs the script")
        return [ctx.finding(site, message[0].upper() + message[1:], fix=fx.build(), note=note), *extra]
    fx.replace(call, new_call)
    return [ctx.finding(site, message, fix=fx.build(), note=note), *extra]


def _dead_guarded_init(ctx, site):
    """The `if not dist.is_initialized():` statement around this init (its only statement, no else) when the program
    model knows a group is always started before it runs (e.g. a `setup()` the launched worker calls after the
    launch rewrite's init): that init can never run. Else None."""
    stmt = site.stmt
    parent = ctx.analysis.parent_of.get(stmt)
    if not (isinstance(stmt, ast.Expr) and stmt.value is site.call and isinstance(parent, ast.If)
            and parent.body == [stmt] and not parent.orelse and alone_on_lines(ctx, parent)):
        return None
    test = parent.test
    if not (isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and isinstance(test.operand, ast.Call)
            and isinstance(test.operand.func, ast.Attribute) and test.operand.func.attr == "is_initialized"
            and not test.operand.args and program(ctx).qualname(test.operand.func) in (f"{DIST}.is_initialized", None)):
        return None
    if program(ctx).group_at(parent) is not Group.ALWAYS:
        return None
    # the group the model counts on may be the launch rewrite's: only when NM127 really rewrites every launch
    for launch in program(ctx).uses(sorted(_SPAWN | _LAUNCH)):
        if not (isinstance(launch, ast.Call) and _launch_rewritable(ctx, launch)):
            return None
    return parent


def _launch_rewritable(ctx, call) -> bool:
    """NM127 rewrites this xmp.spawn / torch_xla.launch call (else it only reports it)."""
    what = "xmp.spawn" if program(ctx).qualname(call.func) in _SPAWN else "torch_xla.launch"
    fn = kwarg(call, "fn", 0)
    if has_star_args(call) or fn is None:
        return False
    method = kwarg(call, "start_method", 5 if what == "xmp.spawn" else 2)
    if const_value(method) == "fork" and _fork_shared(ctx, None, fn):
        return False
    stmt = _stmt_of(ctx.analysis, call)
    return isinstance(stmt, ast.Expr) and stmt.value is call and alone_on_lines(ctx, stmt)


def _guarded_init(ctx, site) -> bool:
    """An `if` around the init already asks `dist.is_initialized()` (or the WORLD_SIZE check of the launch rewrite)."""
    for anc in site.ancestors():
        if isinstance(anc, ast.If):
            for n in walk(anc.test):
                if isinstance(n, ast.Attribute) and n.attr == "is_initialized" or isinstance(n, ast.Constant) and n.value == "WORLD_SIZE":
                    return True
        if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return False
    return False


# -- NM127 xmp.spawn / torch_xla.launch ------------------------------------------------------------
_SPAWN = {f"{XMP}.spawn"}
_LAUNCH = {"torch_xla.launch", "torch_xla.torch_xla.launch"}


@rule(
    code="NM127",
    name="xmp-spawn",
    summary="xmp.spawn(fn, args) / torch_xla.launch(fn, args) become a direct fn(rank, *args) call started by torchrun",
    fix="safe",
    severity="warning",
    triggers=call_and_ref(*sorted(_SPAWN | _LAUNCH)),
    docs=f"""
        `xmp.spawn(fn, args=(...))` started one process per device and called `fn(global_ordinal, *args)` in each;
        `torch_xla.launch(fn, args)` did the same, or under torchrun called `fn(LOCAL_RANK, *args)`. TorchNeuron
        runs one process per NeuronCore started by torchrun ({DIST_GUIDE}), so the call becomes a direct call
        `fn(dist.get_rank(), *args)`: both pass the global ordinal, as torch_xla documents for both (on one host
        it is also the LOCAL_RANK torch_xla.launch passed under torchrun). Unless the worker always starts the
        group itself first, the rewrite starts it before the call: torchrun's group (`dist.init_process_group(
        "neuron")` when torchrun set `WORLD_SIZE`), else a group of one process (`store=dist.HashStore(), rank=0,
        world_size=1`), so the script still runs as one process without torchrun and every rewritten collective,
        rank and barrier is a plain `torch.distributed` call that works in both. The script's own init (behind a
        flag, say) is then guarded with `not dist.is_initialized()` (NM126). When the worker always starts the
        group itself, the index is `int(os.environ.get("RANK", 0))`. The group is destroyed after the worker
        returns. `nprocs`, `join`,
        `daemon`, `start_method` are dropped (each is a finding on its own line). The finding's note
        gives the launch command: `torchrun --nproc_per_node=<NeuronCores per instance, e.g. 64 on
        trn2.48xlarge> script.py`. `start_method='fork'` is dropped like the others when nothing is shared through
        the fork: the worker is a module-level function that reads no module-level name the program binds to a
        computed object (a constant, the command line or the environment is computed alike in every torchrun
        process) and the file has no `xmp.MpModelWrapper`/`MpSerialExecutor`. Otherwise it is reported, naming
        what is shared: the Neuron runtime cannot be initialised in a forked process (torch_neuronx raises
        "Cannot re-initialize Neuron runtime in forked subprocess"), and fork-based sharing (a model built once
        in the parent, `xmp.MpModelWrapper`) has to be replaced by each process building its own.
    """,
    examples=[
        ("if __name__ == '__main__':\n    xmp.spawn(_mp_fn, args=(flags,))",
         "if __name__ == '__main__':\n    if \"WORLD_SIZE\" in os.environ:  # started by torchrun\n        dist.init_process_group(\"neuron\")\n"
         "    else:  # run without torchrun: a group of one process\n"
         "        dist.init_process_group(\"neuron\", store=dist.HashStore(), rank=0, world_size=1)\n"
         "    _mp_fn(dist.get_rank(), flags)\n"
         "    dist.destroy_process_group()"),
    ],
)
def xmp_spawn(site, ctx):
    what = "xmp.spawn" if site.key in _SPAWN else "torch_xla.launch"
    script = os.path.basename(ctx.analysis.path) if ctx.analysis.path and not ctx.analysis.path.startswith("<") else "script.py"
    note = f"Launch with: torchrun --nproc_per_node=<NeuronCores per instance, e.g. 64 on trn2.48xlarge> {script}"
    if site.kind == "ref":
        return ctx.finding(site, f"{what} used as a value: start the script with torchrun and call the function with its rank directly", note=note)
    call = site.call
    if has_star_args(call):
        return ctx.finding(site, f"{what} with *args/**kwargs: start the script with torchrun and call fn(rank, *args) directly", note=note)
    fn = kwarg(call, "fn", 0)
    args = kwarg(call, "args", 1)
    method = kwarg(call, "start_method", 5 if what == "xmp.spawn" else 2)
    if fn is None:
        return ctx.finding(site, f"{what} without a function: start the script with torchrun and call fn(rank, *args) directly", note=note)
    forked = const_value(method) == "fork"
    if forked:
        shared = _fork_shared(ctx, site, fn)
        if shared:
            return ctx.finding(site, f"{what} with start_method='fork' shares {shared} with the workers through the fork: "
                                     "the Neuron runtime cannot start in a forked process; launch with torchrun, build it in "
                                     "each process (no MpModelWrapper sharing) and call fn(rank, *args) directly", note=note)
    if not site.is_statement or not alone_on_lines(ctx, site.stmt):
        return ctx.finding(site, f"{what} inside an expression or on a shared line: replace it with a direct fn(rank, *args) call "
                                 "and launch with torchrun", note=note)
    fx = ctx.fixer()
    os_ = fx.ref("os")
    dist = fx.ref(DIST)
    fn_src = atom(ctx, fn) if not isinstance(fn, ast.Lambda) else f"({ctx.src(fn)})"
    owns_group = program(ctx).launch_needs_init(fn.id if isinstance(fn, ast.Name) else None)
    # torch_xla documents the index as the global ordinal for both (launch wraps xmp.spawn's docs); on one host
    # it equals LOCAL_RANK, which torch_xla.launch passed under torchrun
    call_args = [f"{dist}.get_rank()" if owns_group else f'int({os_}.environ.get("RANK", 0))']
    if isinstance(args, (ast.Tuple, ast.List)):
        call_args += [ctx.src(e) for e in args.elts]
    elif args is not None and not is_none(args):
        call_args.append(f"*{atom(ctx, args)}")
    lines = []
    if owns_group:  # the worker's own init (if any) is conditional: every rewritten collective needs a group
        lines += [f'if "WORLD_SIZE" in {os_}.environ:  # started by torchrun',
                  f'    {dist}.init_process_group("neuron")',
                  "else:  # run without torchrun: a group of one process",
                  f'    {dist}.init_process_group("neuron", store={dist}.HashStore(), rank=0, world_size=1)']
    lines.append(f"{fn_src}({', '.join(call_args)})")
    destroys = any(q.endswith("destroy_process_group") for q in ctx.analysis.qualnames)
    if owns_group and not destroys:
        lines.append(f"{dist}.destroy_process_group()")
    else:
        lines += [f"if {dist}.is_initialized():", f"    {dist}.destroy_process_group()"]
    fx.replace(site.stmt, "\n".join(lines) + "\n")
    if what == "xmp.spawn":
        named = [("nprocs", 2), ("join", 3), ("daemon", 4), ("start_method", 5)]
    else:
        named = [("start_method", 2), ("debug_single_process", 3)]
    drops = []
    for name, pos in named:
        node = kwarg(call, name, pos)
        if node is None:
            continue
        for kw in call.keywords:
            if kw.value is node:
                node = kw
        value = node.value if isinstance(node, ast.keyword) else node
        if name == "nprocs" and const_value(value, 0) not in (None, 1):
            note += f" (nprocs={ctx.src(value)} becomes --nproc_per_node={ctx.src(value)})"
        why = ("nothing is shared through the fork: each torchrun process builds what the worker reads"
               if name == "start_method" and forked else "torchrun decides how processes start")
        drops.append((node, f"{name}={ctx.src(value)} ({why})"))
    return [ctx.finding(site, f"{what}: becomes a direct call of the worker with its global rank; torchrun starts one process "
                              "per NeuronCore" + ("; a process group is started first (torchrun's, else one of a single process)"
                                                  if owns_group else "")
                              + dropped_words(ctx, drops), fix=fx.build(), note=note), *dropped(ctx, site, drops)]


_FORK_SHARERS = {f"{XMP}.MpModelWrapper", f"{XMP}.MpSerialExecutor"}


def _fork_shared(ctx, site, fn) -> str:
    """What an `xmp.spawn(fn, ..., start_method="fork")` hands its workers through the fork's memory, in words ("" when
    nothing): an object the file wraps for sharing (MpModelWrapper, MpSerialExecutor), a closure over the spawning
    function's variables, or a module-level name that the worker reads and that the program binds to something it
    computes (not an import, def, class or constant), at module level or in the block that spawns."""
    a = ctx.analysis
    q = a.qualnames
    for sharer in sorted(_FORK_SHARERS):
        if sharer in q:
            return f"an xmp.{sharer.rsplit('.', 1)[1]}"
    if not isinstance(fn, ast.Name):
        return f"`{ctx.src(fn)}`"
    defs = [s for s in a.tree.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name == fn.id]
    if len(defs) != 1:
        return f"`{fn.id}` (not a function defined once at module level, maybe a closure)"
    worker = defs[0]
    computed = set()
    for stmt in walk(a.tree):
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)) and stmt is not a.tree:
            continue
        for n in _bound_at_module(stmt, a):
            computed.add(n)
    local = {n.id for n in walk(worker) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    local |= {arg.arg for arg in walk(worker) if isinstance(arg, ast.arg)}
    glob = {name for n in walk(worker) if isinstance(n, ast.Global) for name in n.names}
    read = sorted({n.id for n in walk(worker) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
                   and n.id in computed and (n.id not in local or n.id in glob)})
    return ", ".join(f"`{n}`" for n in read)


def _bound_at_module(stmt, a):
    """Names a module-level (or `if __name__ == "__main__":`) statement binds to a computed value."""
    if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        value = stmt.value
        if value is None or all(_same_in_every_process(c) for c in walk(value) if isinstance(c, ast.Call)):
            return []  # a constant, or what every process computes alike (its command line, its environment)
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        return [n.id for t in targets for n in walk(t) if isinstance(n, ast.Name)]
    if isinstance(stmt, (ast.For, ast.AsyncFor, ast.With, ast.AsyncWith, ast.NamedExpr)):
        targets = [stmt.target] if isinstance(stmt, (ast.For, ast.AsyncFor, ast.NamedExpr)) else [i.optional_vars for i in stmt.items if i.optional_vars]
        return [n.id for t in targets for n in walk(t) if isinstance(n, ast.Name)]
    return []


_SAME_CALLS = {"parse_args", "parse_known_args", "parse_common_options", "get", "getenv", "int", "float", "str", "bool",
               "dict", "list", "tuple", "set", "len", "range", "getLogger"}


def _same_in_every_process(call) -> bool:
    func = call.func
    return (isinstance(func, ast.Name) and func.id in _SAME_CALLS) or (isinstance(func, ast.Attribute) and func.attr in _SAME_CALLS)


# -- NM128 xmp.MpModelWrapper ----------------------------------------------------------------------
@rule(
    code="NM128",
    name="mp-model-wrapper",
    summary="xmp.MpModelWrapper(model) becomes model",
    fix="safe",
    severity="warning",
    triggers=call_and_ref(f"{XMP}.MpModelWrapper"),
    docs="""
        `xmp.MpModelWrapper(model)` shared one CPU copy of the model between forked device processes;
        `.to(device)` on it returned the model on the device. Under torchrun each process has its own model, and
        `model.to(device)` does the same, so the wrapper is dropped: `xmp.MpModelWrapper(model)` becomes `model`.
        Used as a value, it becomes `(lambda model: model)`.
    """,
    examples=[("WRAPPED_MODEL = xmp.MpModelWrapper(net)", "WRAPPED_MODEL = net")],
)
def mp_model_wrapper(site, ctx):
    fx = ctx.fixer()
    if site.kind == "ref":
        fx.replace(site.node, "(lambda model: model)")
        return ctx.finding(site, "xmp.MpModelWrapper used as a value: becomes an identity function", fix=fx.build())
    call = site.call
    model = kwarg(call, "model", 0)
    if model is None or has_star_args(call):
        return ctx.finding(site, "xmp.MpModelWrapper: use the model itself")
    fx.replace(call, atom(ctx, model))
    return ctx.finding(site, "xmp.MpModelWrapper is not needed: each torchrun process owns its model", fix=fx.build())


# -- NM129 xmp.MpSerialExecutor --------------------------------------------------------------------
@rule(
    code="NM129",
    name="mp-serial-executor",
    summary="xmp.MpSerialExecutor() becomes _neuron_serial_executor(): .run(fn) runs fn on one local process at a time",
    fix="safe",
    severity="warning",
    triggers=call_and_ref(f"{XMP}.MpSerialExecutor"),
    docs="""
        `xmp.MpSerialExecutor().run(fn)` ran `fn` in the processes of a host one after the other (typically a
        dataset download that must not run concurrently) and returned its result in each. It becomes
        `_neuron_serial_executor()`, an inserted helper whose `.run(fn)` lets each local rank (LOCAL_RANK) run `fn`
        in turn, separated by barriers. Every process must call `.run` the same number of times, as before.

        When `X = xmp.MpSerialExecutor()` is only used as `X.run(fn)` (the usual module-level `SERIAL_EXEC`), the
        assignment goes and each `X.run(fn)` becomes `fn()` in a single-device program; after an init that always
        runs, `result = X.run(fn)` becomes a loop over LOCAL_WORLD_SIZE turns in which the process whose local rank
        has the turn calls `result = fn()`, with `dist.barrier()` after each turn; elsewhere
        `_neuron_run_serially(fn)`. This keeps module-level code from calling a helper that is defined further
        down the file.
    """,
    examples=[("SERIAL_EXEC = xmp.MpSerialExecutor()", "SERIAL_EXEC = _neuron_serial_executor()")],
)
def mp_serial_executor(site, ctx):
    if site.kind == "call" and (site.call.args or site.call.keywords):
        return ctx.finding(site, "xmp.MpSerialExecutor with arguments: run fn on each local rank in turn with dist.barrier() between")
    runs = _serial_runs(ctx, site) if site.kind == "call" else None
    if runs is None:
        return replace_callee(site, ctx, "_neuron_serial_executor", "xmp.MpSerialExecutor: becomes _neuron_serial_executor (turns by local rank)")
    fx = ctx.fixer()
    facts = program(ctx)
    fx.delete(site.stmt)
    direct = 0
    for run in runs:
        fn = run.args[0]
        state = facts.group_at(run)
        stmt = _stmt_of(ctx.analysis, run)
        if state is Group.NONE:
            fx.replace(run, f"{atom(ctx, fn)}()")
            direct += 1
        elif state is Group.ALWAYS and alone_on_lines(ctx, stmt) and (
                isinstance(stmt, ast.Expr) and stmt.value is run
                or isinstance(stmt, ast.Assign) and stmt.value is run and all(simple_ref(t) for t in stmt.targets)):
            # each process of this host in turn, a barrier between turns: what the executor did, written out
            dist, os_ = fx.ref(DIST, site.scope), fx.ref("os", site.scope)
            call = ctx.src(stmt)[: run.col_offset - stmt.col_offset] + f"{atom(ctx, fn)}()"
            fx.replace(stmt, f'for turn in range(int({os_}.environ.get("LOCAL_WORLD_SIZE", 1))):  # one process of this host at a time\n'
                             f"    if {dist}.get_node_local_rank(fallback_rank=0) == turn:\n"
                             f"        {call}\n"
                             f"    {dist}.barrier()\n")
        else:
            fx.replace(run, f"{fx.helper('_neuron_run_serially')}({ctx.src(fn)})")
    how = "a direct call fn() (single-device program)" if direct == len(runs) else "fn() run by each local rank in turn"
    name = site.stmt.targets[0].id
    return ctx.finding(site, f"xmp.MpSerialExecutor: the executor `{name}` goes and each {name}.run(fn) becomes {how}", fix=fx.build())


def _serial_runs(ctx, site):
    """The `X.run(fn)` calls of `X = xmp.MpSerialExecutor()` when they are all the file does with X, else None.

    Rewriting the uses instead of the construction keeps module-level code free of inserted helpers, which are only
    defined further down the file (issue: inserted code used before it is defined)."""
    stmt = site.stmt
    if not (isinstance(stmt, ast.Assign) and stmt.value is site.call and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name) and alone_on_lines(ctx, stmt)):
        return None
    name = stmt.targets[0].id
    runs = []
    for node in walk(ctx.analysis.tree):
        if isinstance(node, ast.Global) and name in node.names:
            return None
        if not (isinstance(node, ast.Name) and node.id == name) or node is stmt.targets[0]:
            continue
        attr = ctx.analysis.parent_of.get(node)
        call = ctx.analysis.parent_of.get(attr)
        if not (isinstance(node.ctx, ast.Load) and isinstance(attr, ast.Attribute) and attr.attr == "run"
                and isinstance(call, ast.Call) and call.func is attr and len(call.args) == 1 and not call.keywords
                and not isinstance(call.args[0], ast.Starred)):
            return None
        runs.append(call)
    return runs or None
