"""torch_xla collectives: all_reduce, the REDUCE_* constants, all_gather, reduce_scatter, mesh_reduce, broadcasts
and the collectives without an equivalent (NM117-NM124); the shared context facts are in xla_distributed.py."""
from __future__ import annotations

import ast
from collections import Counter

from neuron_migrate.names.analysis import walk
from neuron_migrate.program import cached
from neuron_migrate.program.distributed import Group
from neuron_migrate.rules.api import const_value, has_star_args, kwarg, rule
from neuron_migrate.rules.builtin.xla_distributed import (
    DIST, DIST_GUIDE, XM, alone_on_lines, atom, call_and_ref, group_at,
    inside_deferred, is_none, program, replace_callee, simple_ref, wrapped_in_ddp,
    xm_keys, _stmt_of)


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
        `total = xm.all_reduce(xm.REDUCE_SUM, t, scale=1.0 / xr.world_size())` on a tensor becomes
        `total = t.clone()`, `dist.all_reduce(total)`, `total *= 1.0 / dist.get_world_size()` (only for no scale, 1
        or 1/world_size, which is 1 in one process: another scale, such as 0.5, stays with the helper, since torch_xla
        skips it when the world size is 1 and `total *= 0.5` would not); in a single-device program the call is the copy torch_xla returned
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
    if scale is not None and const_value(scale, None) != 1.0:  # 1/world_size: 1.0 in one process, as XLA skipped it
        lines.append(f"{target} *= {ctx.src(scale)}")
    fx.replace(stmt, "\n".join(lines) + "\n")
    return ctx.finding(site, message, fix=fx.build())


_WORLD_SIZE = {f"{XM}.xrt_world_size", "torch_xla.runtime.world_size", "torch_xla.runtime.process_count",
               "torch_xla.experimental.pjrt.world_size", "torch.distributed.get_world_size"}


def _scale_same_in_one_process(ctx, scale) -> bool:
    """torch_xla skips `scale` when the world size is 1; `t *= scale` after dist.all_reduce applies it always. The
    two agree for no scale, 1, and 1/world_size (1.0 in one process); any other scale keeps the helper, which
    skips it in one process as XLA did."""
    if scale is None or const_value(scale, None) == 1.0:
        return True
    if not (isinstance(scale, ast.BinOp) and isinstance(scale.op, ast.Div) and const_value(scale.left, None) == 1):
        return False
    return _world_size_value(ctx, scale.right) or (isinstance(scale.right, ast.Name)
                                                    and _bound_only_to_world_size(ctx, scale.right))


def _world_size_value(ctx, node) -> bool:
    return (isinstance(node, ast.Call) and not node.args and not node.keywords
            and isinstance(node.func, (ast.Name, ast.Attribute)) and program(ctx).qualname(node.func) in _WORLD_SIZE)


def _bound_only_to_world_size(ctx, name: ast.Name) -> bool:
    """Every binding of `name` in its function is `name = <world size call>` (or its place in `a, name = x, ws()`)."""
    fn = ctx.analysis.parent_of.get(name)
    while fn is not None and not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.Module)):
        fn = ctx.analysis.parent_of.get(fn)
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        return False
    values = []
    for n in walk(fn):
        if isinstance(n, ast.arg) and n.arg == name.id:
            return False
        if not (isinstance(n, ast.Name) and n.id == name.id and not isinstance(n.ctx, ast.Load)):
            continue
        holder = ctx.analysis.parent_of.get(n)
        if isinstance(holder, ast.Assign) and holder.targets == [n]:
            values.append(holder.value)
        elif (isinstance(holder, ast.Tuple) and isinstance(stmt := ctx.analysis.parent_of.get(holder), ast.Assign)
              and stmt.targets == [holder] and isinstance(stmt.value, ast.Tuple)
              and len(stmt.value.elts) == len(holder.elts) and not any(isinstance(e, ast.Starred) for e in holder.elts)):
            values.append(stmt.value.elts[holder.elts.index(n)])
        else:
            return False
    return bool(values) and all(_world_size_value(ctx, v) for v in values)


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
    is_list = isinstance(inputs, (ast.List, ast.Tuple, ast.ListComp)) or _gradient_list(ctx, inputs)
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
    if (state is Group.ALWAYS and tensor and _scale_same_in_one_process(ctx, kwarg(call, "scale", 2))
            and isinstance(stmt, ast.Assign) and stmt.value is call and len(stmt.targets) == 1
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
        Where the file replaces torch_xla's function with its own (`xm.mesh_reduce = mesh_reduce`, AWS's zero1_gpt2
        sample), the call goes to that function, which the other rules migrate; the patch itself is NM191's.
    """,
    examples=[("acc = xm.mesh_reduce('acc', acc, np.mean)", "acc = _neuron_mesh_reduce('acc', acc, np.mean)"),
              ("dist.init_process_group('xla')\nacc = xm.mesh_reduce('acc', correct.item(), np.mean)",
               "dist.init_process_group(\"neuron\")\ngathered = [None] * dist.get_world_size()\n"
               "dist.all_gather_object(gathered, correct.item())\nacc = np.mean(gathered)")],
)
def mesh_reduce(site, ctx):
    patch = _file_patch(ctx, f"{XM}.mesh_reduce")
    if patch is not None and site.kind == "call":
        # aws-neuron-samples' zero1_gpt2: `xm.mesh_reduce = mesh_reduce` replaced torch_xla's with the file's own
        name, line = patch
        fx = ctx.fixer()
        fx.replace(site.call.func, name)
        return ctx.finding(site, f"xm.mesh_reduce is the file's own `{name}` (patched in at line {line}): called directly",
                           fix=fx.build())
    if site.kind == "call" and not has_star_args(site.call):
        plain = _plain_mesh_reduce(site, ctx)
        if plain is not None:
            return plain
    return replace_callee(site, ctx, "_neuron_mesh_reduce", "xm.mesh_reduce: becomes _neuron_mesh_reduce (dist.all_gather_object, then reduce_fn)")


def _file_patch(ctx, qualname: str):
    """(name, line) of a module-level `xm.<fn> = name` that replaces `qualname` with a function the file defines at
    module level, or None."""
    a = ctx.analysis
    defs = {s.name for s in a.tree.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for stmt in a.tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Attribute) \
                and isinstance(stmt.value, ast.Name) and stmt.value.id in defs \
                and a.resolve(stmt.targets[0], a.module_scope, count_use=False) == qualname:
            return stmt.value.id, stmt.lineno
    return None


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
                    if any(not isinstance(e, ast.Name) and any(isinstance(n, ast.Name) and n.id == name.id for n in walk(e)) for e in t.elts):
                        return None
                elif any(isinstance(n, ast.Name) and n.id == name.id for n in walk(t)):
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
        `xm.broadcast_master_param(model)` copies rank 0's parameters and buffers to every rank. Where the program
        model knows the process group always exists (a statement of its own), it becomes that loop,
        `for tensor in [*model.parameters(), *model.buffers()]: dist.broadcast(tensor.data, src=0)`; elsewhere
        `_neuron_broadcast_master_param(model)`, an inserted helper doing the same when a group of several exists.
        When the file wraps the model in `DistributedDataParallel`, which broadcasts rank 0's state when it is
        constructed, the finding says so: delete the call if it runs before the DDP wrapper is built.
    """,
    examples=[("xm.broadcast_master_param(model)", "_neuron_broadcast_master_param(model)")],
)
def broadcast_master_param(site, ctx):
    note = "DistributedDataParallel broadcasts rank 0's parameters when constructed: this call can go if DDP wraps the model afterwards." if wrapped_in_ddp(ctx) else ""
    call = site.call
    model = kwarg(call, "model", 0) if call is not None else None
    if (model is not None and len(call.args) + len(call.keywords) == 1 and not has_star_args(call) and site.is_statement
            and alone_on_lines(ctx, site.stmt) and group_at(ctx, site) is Group.ALWAYS
            and isinstance(model, (ast.Name, ast.Attribute))):
        # the group always exists here (the program model): the loop itself, as one would write it
        fx = ctx.fixer()
        dist = fx.ref(DIST)
        t = _free_name(ctx, "tensor")  # the loop's variable stays bound after it: a name nothing else uses
        fx.replace(site.stmt, f"for {t} in [*{ctx.src(model)}.parameters(), *{ctx.src(model)}.buffers()]:\n"
                              f"    {dist}.broadcast({t}.data, src=0)\n")
        return ctx.finding(site, "xm.broadcast_master_param: rank 0's parameters and buffers are broadcast with "
                                 "dist.broadcast", fix=fx.build(), note=note)
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
