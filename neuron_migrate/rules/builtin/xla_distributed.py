"""torch_xla distributed: the shared context facts, ranks, gradient averaging, master printing, rendezvous (NM110-NM116).

The collectives (NM117-NM124) are in xla_collectives.py, saving, process groups and launching (NM125-NM129) in
xla_launch.py; both use the context facts defined here.

torch_xla's multi-process API (`xm.*` collectives, `xr.*` topology, `xmp.spawn`) maps onto `torch.distributed`
with the `neuron` backend under torchrun. Where one expression keeps the behaviour it is written inline; where
it does not (out-of-place all_reduce, local-master save, gradient averaging) a `_neuron_*` helper is inserted
(see xla_distributed_helpers.py). Helpers behave like torch_xla did in a single process, so a rewritten script
still runs without torchrun.
"""
from __future__ import annotations

import ast
import re

from neuron_migrate.names.analysis import walk
from neuron_migrate.program import cached
from neuron_migrate.program.distributed import WRAPPERS, DistributedFacts, Group
from neuron_migrate.program.distributed import facts as distributed_facts
from neuron_migrate.rules.api import const_value, has_star_args, indent_statement, kwarg, rule
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


def _stmt_of(analysis, node):
    while not isinstance(node, ast.stmt):
        node = analysis.parent_of[node]
    return node


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
    if site.kind == "call" and not has_star_args(site.call):
        call = site.call
        if not is_none(kwarg(call, "groups", 1)):
            return ctx.finding(site, "xm.reduce_gradients with groups=: create the subgroup once with dist.new_group and all-reduce over it")
        opt = kwarg(call, "optimizer", 0)
        if opt is not None:  # the helper takes the optimizer alone: `pin_layout=` was an XLA layout hint
            fx = ctx.fixer()
            fx.replace(call, f"{fx.helper('_neuron_reduce_gradients')}({ctx.src(opt)})")
            return ctx.finding(site, "xm.reduce_gradients: becomes _neuron_reduce_gradients (all-reduce average of each gradient)",
                               fix=fx.build())
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
        The helpers only know the rank after `dist.init_process_group("neuron")`: call it first. A file that calls a
        helper only once or twice gets its one-line form there instead, with no helper inserted:
        `dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", 0))` (`WORLD_SIZE`, 1 likewise).

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
    if site.kind == "call" and _plain_master_prints(ctx):
        return replace_callee(site, ctx, "_neuron_rank0_print", "xm.master_print: becomes _neuron_rank0_print (prints on global rank 0)")
    return replace_callee(site, ctx, "_neuron_master_print", "xm.master_print: becomes _neuron_master_print (prints on global rank 0)")


def _plain_master_prints(ctx) -> bool:
    """Every xm.master_print of the file is a call that passes only what to print: the short helper serves them
    (not where the helpers go into one shared module: there one form serves every file)."""
    if ctx.settings is not None and ctx.settings.helpers_module:
        return False

    def every_call_is_plain(a) -> bool:
        for node in program(ctx).uses([f"{XM}.master_print"]):
            if not isinstance(node, ast.Call) or has_star_args(node) or node.keywords:
                return False
        return True

    return cached(ctx.analysis, "NM115 plain prints", every_call_is_plain)


def _plain_print(site, ctx):
    """print(...) in a single-device program; `if dist.get_rank() == 0: print(...)` after a sure init."""
    call = site.call
    local = None
    for kw in call.keywords:
        if kw.arg == "local":
            local = const_value(kw.value, None)
            if not isinstance(local, bool):
                return None
    text = _print_text(ctx, call)
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
        fx.replace(stmt, f"if {test}:\n" + "".join(indent_statement(p) + "\n" for p in prints))
    return ctx.finding(site, f"xm.master_print: becomes print() on {'rank 0 of each host' if local else 'global rank 0'} (`if {test}:`)",
                       fix=fx.build())


def _print_text(ctx, call) -> str:
    """`print(...)` with the arguments of an `xm.master_print(...)` call (`fd=` becomes `file=`, `local=` goes), their
    continuation lines relative to the statement, as a fix's text is written."""
    parts = [ctx.src_relative(a) for a in call.args]
    for kw in call.keywords:
        if kw.arg == "fd":
            parts.append(f"file={ctx.src_relative(kw.value)}")
        elif kw.arg != "local":
            parts.append(f"{kw.arg}={ctx.src_relative(kw.value)}")
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
        it is removed (a finding at its line says so). A file with only one or two such barriers gets
        `if dist.is_initialized(): dist.barrier()` there instead of the helper.
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
        return ctx.finding(site, "rendezvous without a payload: becomes dist.barrier() where a process group exists (nobody to wait for without one)", fix=fx.build())
    args = [tag_src or "None"]
    if not no_payload:
        args.append(ctx.src(payload))
    fx.replace(call, f"{fx.helper('_neuron_rendezvous')}({', '.join(args)})")
    return ctx.finding(site, "rendezvous whose payloads are used: becomes _neuron_rendezvous (dist.all_gather_object of the payloads)",
                       fix=fx.build())
