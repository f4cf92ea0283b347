"""torch_xla gradient lists: xm._fetch_gradients(optimizer) (NM148).

The AMP training loops of torch_xla fetch the optimizer's gradients as a list and average them with
`xm.all_reduce(xm.REDUCE_SUM, gradients, scale=1.0 / world_size)`; that all_reduce (NM117) becomes a
`dist.all_reduce` loop over the list, and the list is what `_fetch_gradients` always was: the `.grad` of every
parameter of the optimizer's groups that has one.
"""
from __future__ import annotations

import ast

from neuron_migrate.names.analysis import walk
from neuron_migrate.rules.api import has_star_args, kwarg, rule
from neuron_migrate.rules.builtin.xla_distributed import XM, atom

FETCH = f"{XM}._fetch_gradients"


@rule(
    code="NM148",
    name="xla-fetch-gradients",
    summary="xm._fetch_gradients(optimizer) becomes the list of the optimizer's parameter gradients",
    fix="safe",
    severity="warning",
    triggers=[("call", FETCH), ("ref", FETCH)],
    docs="""
        `xm._fetch_gradients(optimizer)` (private, but the usual first half of gradient averaging in torch_xla
        AMP loops) returns the `.grad` of every parameter in the optimizer's `param_groups` that has one. It
        becomes that list, written out: `[p.grad for group in optimizer.param_groups for p in group["params"]
        if p.grad is not None]`. The tensors are the gradients themselves, so an in-place reduction of the list
        changes them, as before. The second half, `xm.all_reduce(xm.REDUCE_SUM, gradients, scale=s)` on that
        list, becomes a `dist.all_reduce` of each gradient followed by `grad.mul_(s)` when more than one process
        runs (NM117): the gradients are averaged over the ranks as torch_xla averaged them (torch_xla skipped
        the reduction and the scale in one process, and so does the rewrite). DDP does this bucketed and
        overlapped with backward, if the model can be wrapped. Used as a value it is reported.
    """,
    examples=[("gradients = xm._fetch_gradients(optimizer)",
               'gradients = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]'),
              ("gradients = xm._fetch_gradients(optimizer)\nxm.all_reduce(xm.REDUCE_SUM, gradients, scale=1.0 / world_size)",
               'gradients = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]\n'
               "if dist.is_initialized() and dist.get_world_size() > 1:\n    for grad in gradients:\n"
               "        dist.all_reduce(grad)\n        grad.mul_(1.0 / world_size)")],
)
def xla_fetch_gradients(site, ctx):
    if site.kind == "ref":
        return ctx.finding(site, "xm._fetch_gradients used as a value: use a function returning "
                                 '[p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]')
    call = site.call
    optimizer = kwarg(call, "optimizer", 0)
    if optimizer is None or has_star_args(call) or len(call.args) + len(call.keywords) != 1:
        return ctx.finding(site, "xm._fetch_gradients without one plain optimizer argument: migrate by hand")
    names = {n.id for n in walk(optimizer) if isinstance(n, ast.Name)}
    p = next(x for x in ("p", "param", "_p") if x not in names)
    group = next(x for x in ("group", "param_group", "_group") if x not in names)
    fx = ctx.fixer()
    fx.replace(call, f'[{p}.grad for {group} in {atom(ctx, optimizer)}.param_groups for {p} in {group}["params"] '
                     f"if {p}.grad is not None]")
    return ctx.finding(site, "xm._fetch_gradients: becomes the list of the optimizer's parameter gradients", fix=fx.build())
