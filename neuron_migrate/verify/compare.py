"""Compare two recorded runs step by step, and localise where they part.

Gates by dtype (the recorded loss's dtype; ../shared/design/VERIFY.md has the measurements behind them):
- float64 (`--float64`, or a program that trains in float64): every quantity within 1e-6. Measured noise between
  XLA:CPU and native CPU: <= 2.5e-8 on the loss, 5e-16 on the project's example; planted one-line defects
  gave >= 3e-5.
- autocast (either side entered a bfloat16/float16 autocast region): loose gates, gross changes only.
- float32: the loss within 1e-4 relative (measured noise: <= 5e-7 on an MLP, <= 3e-5 on a CNN with BatchNorm);
  gradients and parameters with magnitude-aware gates (max difference over the largest value <= 1e-2, gradient
  cosine >= 0.999), because in float32 single parameters drift far more than the loss while the loss agrees.
  A float32 gate misses defects smaller than the program's own noise (a dropped weight decay on a CNN was 3x its
  noise): use --float64 where the program allows it.
Gradients are compared as the optimizer saw them (after clipping); a uniformly scaled loss keeps cosine 1, so
the magnitude is gated too. Optimizer hyperparameters (lr, momentum, weight decay, ...) are compared exactly.
"""
from __future__ import annotations

import math

GATES = {
    "float64": {"loss": 1e-6, "grad": 1e-6, "param": 1e-6, "cosine": 1 - 1e-9, "module": 1e-6},
    "float32": {"loss": 1e-4, "grad": 1e-2, "param": 1e-2, "cosine": 0.999, "module": 1e-3},
    # autocast to bfloat16/float16 on either side: 8 (or 11) mantissa bits, and XLA rounds its matmuls
    # differently from the host kernels; only gross changes show (measured on the bundled new_style.py:
    # loss 2e-4, gradients 1.3e-1 of their largest value, cosine 0.9994)
    "autocast": {"loss": 1e-2, "grad": 0.5, "param": 0.2, "cosine": 0.99, "module": 5e-2},
}
HPARAM_REL = 1e-9
# a gradient whose largest entry is below this fraction of the step's largest gradient entry (over every parameter,
# both runs) carries only rounding noise (pytorch/xla's decoder example: constant token ids make the attention uniform
# and the query projection's true gradient zero): it is not compared on its own scale
GRAD_FLOOR = {"float64": 1e-9, "float32": 1e-5, "autocast": 1e-3}
# optimizer settings that choose an implementation, not a result (torch.compile of a step turns `capturable` on)
IMPLEMENTATION_HPARAMS = frozenset({"capturable", "foreach", "fused", "differentiable"})


def mode_of(meta_a: dict, meta_b: dict) -> str:
    if any(d in ("bfloat16", "float16") for d in [*meta_a.get("autocast", []), *meta_b.get("autocast", [])]):
        return "autocast"
    return "float64" if meta_a.get("dtype") == "float64" and meta_b.get("dtype") == "float64" else "float32"


def loss_rel(a: float, b: float) -> float:
    if math.isnan(a) or math.isnan(b):
        return 0.0 if math.isnan(a) and math.isnan(b) else math.inf
    return abs(a - b) / max(abs(a), abs(b), 1e-6)


def _as_tensor(x):
    if isinstance(x, dict):  # a big tensor kept as its head and norm
        return x["head"]
    return x


def largest(x) -> float:
    """max |x| of a kept tensor (0 for None)."""
    x = _as_tensor(x)
    if x is None or x.numel() == 0:
        return 0.0
    return float(x.detach().double().abs().max().item())


def tensor_diff(a, b, floor: float = 0.0) -> tuple[float, float]:
    """(max |a - b| over max |a|, |b|; cosine) of two tensors of one shape (inf, 0 when shapes differ). `floor`:
    the smallest scale the difference is measured against; two tensors whose entries all stay below it are the
    same (their cosine is noise)."""
    import torch

    a, b = _as_tensor(a), _as_tensor(b)
    if a is None or b is None:
        return (0.0, 1.0) if a is None and b is None else (math.inf, 0.0)
    if tuple(a.shape) != tuple(b.shape):
        return math.inf, 0.0
    a = a.detach().double().reshape(-1)
    b = b.detach().double().reshape(-1)
    if a.numel() == 0:
        return 0.0, 1.0
    if torch.equal(a, b):
        return 0.0, 1.0
    scale = max(a.abs().max().item(), b.abs().max().item())
    if not math.isfinite(scale):
        same = bool(torch.equal(a.nan_to_num(), b.nan_to_num()))
        return (0.0, 1.0) if same else (math.inf, 0.0)
    if scale <= floor:
        return 0.0, 1.0
    diff = (a - b).abs().max().item()
    rel = diff / max(scale, floor) if scale > 0 else 0.0
    na, nb = a.norm().item(), b.norm().item()
    cos = 1.0 if na == 0 and nb == 0 else (float(a @ b) / (na * nb) if na > 0 and nb > 0 else 0.0)
    return rel, cos


def _hparam_diffs(ha: list, hb: list) -> list[dict]:
    out = []
    for gi, (ga, gb) in enumerate(zip(ha, hb)):
        for key in sorted((set(ga) & set(gb)) - IMPLEMENTATION_HPARAMS):
            va, vb = ga[key], gb[key]
            if isinstance(va, (int, float)) and isinstance(vb, (int, float)) and not isinstance(va, bool):
                if va == vb or (math.isfinite(va) and abs(va - vb) <= HPARAM_REL * max(abs(va), abs(vb))):
                    continue
            elif va == vb:
                continue
            out.append({"group": gi, "key": key, "original": va, "migrated": vb})
    if len(ha) != len(hb):
        out.append({"group": None, "key": "param groups", "original": len(ha), "migrated": len(hb)})
    return out


def _same_names_other_order(meta_a: dict, meta_b: dict) -> list | None:
    """With one optimizer on each side holding the same named parameters in another order: for each of the
    original's, its index in the migrated program's list; else None (compared by position)."""
    opts_a, opts_b = meta_a.get("optimizers") or [], meta_b.get("optimizers") or []
    if len(opts_a) != 1 or len(opts_b) != 1:
        return None
    na, nb = opts_a[0].get("params", []), opts_b[0].get("params", [])
    if na == nb or len(set(na)) != len(na) or set(na) != set(nb) or len(na) != len(nb):
        return None
    return [nb.index(n) for n in na]


def compare_runs(meta_a: dict, data_a: dict, meta_b: dict, data_b: dict, mode: str | None = None) -> dict:
    """a: the original, b: the migrated. Returns {'mode', 'gates', 'steps', 'rows', 'first', 'equivalent', ...};
    `first` is None or {'step', 'what': 'loss'|'grad'|'param'|'hparams'|'steps', 'detail', ...}."""
    mode = mode or mode_of(meta_a, meta_b)
    gates = GATES[mode]
    names = (meta_b.get("optimizers") or meta_a.get("optimizers") or [{}])[0].get("params", [])
    losses_a, losses_b = data_a.get("losses", []), data_b.get("losses", [])
    steps_a, steps_b = meta_a.get("loss_steps", []), meta_b.get("loss_steps", [])
    grads_a, grads_b = data_a.get("grads", []), data_b.get("grads", [])
    params_a, params_b = data_a.get("params", []), data_b.get("params", [])
    order = _same_names_other_order(meta_a, meta_b)
    if order is not None:  # e.g. XLA FSDP lists a wrapper's own parameters before its wrapped children's
        names = meta_a["optimizers"][0]["params"]
        grads_b = [[ts[i] for i in order] for ts in grads_b]
        params_b = [[ts[i] for i in order] for ts in params_b]
    n_steps = min(len(params_a), len(params_b))
    rows: list[dict] = []
    first = None
    worst = {"loss": 0.0, "grad": 0.0, "param": 0.0, "cosine": 1.0}

    first_numeric = None  # the first failure of the numbers themselves (not of the settings)

    def fail(step, what, detail, **kw):
        nonlocal first, first_numeric
        if first is None:
            first = {"step": step, "what": what, "detail": detail, **kw}
        if first_numeric is None and what != "hparams":
            first_numeric = {"step": step, "what": what, "detail": detail, **kw}

    by_step_a: dict = {}
    by_step_b: dict = {}
    for s, t in zip(steps_a, losses_a):
        by_step_a.setdefault(s, []).append(float(t))
    for s, t in zip(steps_b, losses_b):
        by_step_b.setdefault(s, []).append(float(t))
    last = max([n_steps, *(s + 1 for s in by_step_a), *(s + 1 for s in by_step_b)] or [0])
    last = min(last, n_steps + 1)  # the loss of the step after the last compared optimizer step still counts
    eval_a, eval_b = meta_a.get("eval_modules"), meta_b.get("eval_modules")
    for step in range(last):
        row: dict = {"step": step}
        if eval_a is not None and eval_b is not None and step < n_steps:
            diff = mode_difference(set(eval_a.get(str(step), [])), set(eval_b.get(str(step), [])),
                                   {**(meta_a.get("module_classes") or {}), **(meta_b.get("module_classes") or {})})
            if diff:
                fail(step, "mode", diff["detail"], module=diff["module"], modules=diff["modules"],
                     migrated_mode=diff["migrated_mode"])
        la, lb = by_step_a.get(step, []), by_step_b.get(step, [])
        if la and lb:
            rel = max(loss_rel(x, y) for x, y in zip(la, lb))
            row.update(loss_original=la[-1], loss_migrated=lb[-1], loss_rel=rel)
            worst["loss"] = max(worst["loss"], rel)
            if len(la) != len(lb):
                fail(step, "loss", f"backward() was called {len(la)} times in the original, {len(lb)} in the migrated program")
            elif rel > gates["loss"]:
                fail(step, "loss", f"loss {la[-1]:.9g} (original) vs {lb[-1]:.9g} (migrated): relative difference {rel:.2e} > {gates['loss']:.0e}")
        elif la or lb:
            if step < n_steps:
                fail(step, "loss", "backward() was called in only one of the runs")
        if step < n_steps:
            ha = (meta_a.get("hparams") or [])[step] if step < len(meta_a.get("hparams") or []) else []
            hb = (meta_b.get("hparams") or [])[step] if step < len(meta_b.get("hparams") or []) else []
            diffs = _hparam_diffs(ha, hb)
            if diffs:
                row["hparams"] = diffs
                fail(step, "hparams", "optimizer settings differ: " + ", ".join(
                    f"{d['key']} {d['original']!r} (original) vs {d['migrated']!r} (migrated)" for d in diffs),
                     hparams=diffs)
            ga, gb = grads_a[step], grads_b[step]
            pa, pb = params_a[step], params_b[step]
            if len(ga) != len(gb) or len(pa) != len(pb):
                fail(step, "param", f"the optimizer holds {len(pa)} parameters in the original, {len(pb)} in the migrated program")
            else:
                g_worst = (0.0, 1.0, "")
                floor = GRAD_FLOOR[mode] * max([largest(t) for t in [*ga, *gb]], default=0.0)
                for i, (x, y) in enumerate(zip(ga, gb)):
                    rel, cos = tensor_diff(x, y, floor)
                    if rel > g_worst[0] or cos < g_worst[1]:
                        g_worst = (max(rel, g_worst[0]), min(cos, g_worst[1]), names[i] if i < len(names) else f"#{i}")
                    if rel > gates["grad"] or cos < gates["cosine"]:
                        fail(step, "grad", f"gradient of {names[i] if i < len(names) else f'parameter #{i}'}: max difference "
                             f"{rel:.2e} of its largest value, cosine {cos:.6f}", param=names[i] if i < len(names) else f"#{i}")
                        break
                p_worst = (0.0, "")
                for i, (x, y) in enumerate(zip(pa, pb)):
                    rel, _ = tensor_diff(x, y)
                    if rel > p_worst[0]:
                        p_worst = (rel, names[i] if i < len(names) else f"#{i}")
                    if rel > gates["param"]:
                        fail(step, "param", f"{names[i] if i < len(names) else f'parameter #{i}'} after the optimizer step: "
                             f"max difference {rel:.2e} of its largest value", param=names[i] if i < len(names) else f"#{i}")
                        break
                row.update(grad_rel=g_worst[0], grad_cos=g_worst[1], param_rel=p_worst[0])
                worst["grad"] = max(worst["grad"], g_worst[0])
                worst["cosine"] = min(worst["cosine"], g_worst[1])
                worst["param"] = max(worst["param"], p_worst[0])
        rows.append(row)
    if first is None and len(params_a) != len(params_b):
        fail(n_steps, "steps", f"the original ran {len(params_a)} optimizer steps, the migrated program {len(params_b)}")
    collectives = {side: collective_counts(collectives_per_step(m).get(0, [])) for side, m in
                   (("original", meta_a), ("migrated", meta_b))}
    return {"mode": mode, "gates": gates, "steps": n_steps, "rows": rows, "first": first, "first_numeric": first_numeric,
            "equivalent": first is None and n_steps > 0, "worst": worst, "collectives": collectives}


# modules whose forward depends on `training` (the others compute the same in both modes)
MODE_SENSITIVE = ("Dropout", "BatchNorm", "InstanceNorm", "SyncBatchNorm", "AlphaDropout", "RReLU", "LSTM", "GRU",
                  "RNN", "MultiheadAttention", "Transformer")


def mode_difference(eval_a: set, eval_b: set, classes: dict | None = None) -> dict | None:
    """The modules called (with gradients enabled) in eval mode on one side only: a lost `model.train()`, or a
    `model.eval()` left in. Names the module whose behaviour the mode changes (a Dropout, a BatchNorm) first."""
    if eval_a == eval_b:
        return None
    only_b, only_a = sorted(eval_b - eval_a), sorted(eval_a - eval_b)
    names, migrated_mode = (only_b, "eval") if only_b else (only_a, "training")
    other = "training" if migrated_mode == "eval" else "eval"
    classes = classes or {}
    sensitive = [n for n in names if any(k in classes.get(n, "") for k in MODE_SENSITIVE)]
    module = (sensitive or sorted(names, key=lambda n: (n.count("."), n)))[0]
    more = [n for n in names if n != module]
    label = f"{module} ({classes[module]})" if module in classes else module
    detail = (f"{label} runs in {migrated_mode} mode in the migrated program and in {other} mode in the original"
              + (f" (so do {len(more)} more: {', '.join(more[:4])}{', ...' if len(more) > 4 else ''})" if more else ""))
    return {"module": module, "modules": names, "migrated_mode": migrated_mode, "detail": detail}


def localise_module(meta_a: dict, data_a: dict, meta_b: dict, data_b: dict, mode: str) -> dict | None:
    """From a replay of one step with module hooks: the first module (in call order) whose output diverges, else
    the first (in backward order) whose output's gradient does. None when every module agrees."""
    gate = GATES[mode]["module"]
    rows_a, rows_b = meta_a.get("modules", []), meta_b.get("modules", [])
    outs_a, outs_b = data_a.get("module_outs", []), data_b.get("module_outs", [])
    for i, (ra, rb) in enumerate(zip(rows_a, rows_b)):
        if ra["class"] != rb["class"]:
            return {"module": rb["name"], "row": rb, "phase": "calls",
                    "detail": f"module call #{i} is {ra['name']} in the original, {rb['name']} in the migrated program"}
        rel, _ = tensor_diff(outs_a[i], outs_b[i])
        if rel > gate:
            ins_a, ins_b = data_a.get("module_ins") or [], data_b.get("module_ins") or []
            rel_in = tensor_diff(ins_a[i], ins_b[i])[0] if i < min(len(ins_a), len(ins_b)) else 0.0
            parent = rb["name"].rpartition(".")[0]
            owner = next((r for r in rows_b[i + 1:] if r["name"] == parent), None) if parent else None
            if rel_in > gate and owner is not None:  # it was handed a different input: the parent's own code
                return {"module": owner["name"], "row": owner, "phase": "forward",
                        "detail": f"{owner['name']}'s own code (not a submodule) changed the input of {rb['name']}: "
                                  f"max difference {rel_in:.2e} of its largest value"}
            return {"module": rb["name"], "row": rb, "phase": "forward",
                    "detail": f"output of {rb['name']} differs: max difference {rel:.2e} of its largest value"}
    if len(rows_a) != len(rows_b):
        i = min(len(rows_a), len(rows_b))
        return {"module": None, "row": None, "phase": "calls",
                "detail": f"{len(rows_a)} module calls in the original step, {len(rows_b)} in the migrated one"}
    ga, gb = data_a.get("module_grads", {}), data_b.get("module_grads", {})
    for i in sorted(set(ga) & set(gb), reverse=True):
        rel, _ = tensor_diff(ga[i], gb[i])
        if rel > gate:
            rb = rows_b[i]
            return {"module": rb["name"], "row": rb, "phase": "backward",
                    "detail": f"gradient flowing into {rb['name']}'s output differs: max difference {rel:.2e}"}
    return None


RANK_GATE = {"float64": 1e-12, "float32": 1e-6, "autocast": 1e-3}


def compare_ranks(metas: list[dict], datas: list[dict], nproc: int, mode: str) -> dict:
    """The migrated program under torchrun with `nproc` processes: what one process cannot show. Every rank must
    have joined one process group of `nproc` (a world size that became 1 trains N separate models), and the
    parameters must be the same on every rank after each step (gradients averaged). The N-process trajectory is
    not compared with the 1-process one: that depends on how the program splits its data."""
    gate = RANK_GATE.get(mode, 1e-6)
    first = None
    sizes = [m.get("world_sizes") or [] for m in metas]
    for r, ws in enumerate(sizes):
        bad = next((s for s in ws if s != nproc), None)
        if bad is not None:
            first = {"step": ws.index(bad), "what": "world size",
                     "detail": f"rank {r} trained in a process group of {bad}, not the {nproc} processes torchrun started "
                               "(each process trains alone)"}
            break
    steps = min(len(d.get("params", [])) for d in datas) if datas else 0
    worst = 0.0
    names = (metas[0].get("optimizers") or [{}])[0].get("params", []) if metas else []
    for step in range(steps):
        ref = datas[0]["params"][step]
        for r in range(1, len(datas)):
            for i, (x, y) in enumerate(zip(ref, datas[r]["params"][step])):
                rel, _ = tensor_diff(x, y)
                worst = max(worst, rel)
                if rel > gate and first is None:
                    first = {"step": step, "what": "ranks",
                             "detail": f"{names[i] if i < len(names) else f'parameter #{i}'} differs between rank 0 and rank {r} "
                                       f"after the optimizer step (max difference {rel:.2e} of its largest value): "
                                       "gradients are not averaged across the processes"}
    counts = [len(d.get("params", [])) for d in datas]
    if first is None and len(set(counts)) > 1:
        first = {"step": min(counts), "what": "ranks", "detail": f"the ranks ran different numbers of steps: {counts}"}
    return {"nproc": nproc, "world_sizes": [ws[0] if ws else None for ws in sizes], "steps": steps,
            "worst_rank_difference": worst, "gate": gate, "first": first, "ok": first is None and steps > 0}


# ------------------------------------------------------------------------------------------------ collectives

REDUCING = ("all_reduce", "all_reduce (DDP)", "reduce_scatter", "reduce")


def collectives_per_step(meta: dict) -> dict[int, list]:
    """{step: [[kind, on gradients, path, line, count], ...]} as the bootstrap recorded them."""
    return {int(k): v for k, v in (meta.get("collectives") or {}).items()}


def collective_counts(entries: list) -> dict[str, int]:
    """{'all_reduce (gradients)': 2, 'mark_step': 1, ...} of one step."""
    out: dict[str, int] = {}
    for kind, grad, _path, _line, n in entries:
        key = f"{kind} (gradients)" if grad and kind != "all_reduce (DDP)" else kind
        out[key] = out.get(key, 0) + n
    return dict(sorted(out.items()))


def _grad_sites(entries: list) -> set:
    return {(path, line) for kind, grad, path, line, _ in entries if grad}


def _reducing(entries: list) -> int:
    return sum(n for kind, _g, _p, _l, n in entries if kind in REDUCING)


def compare_collectives(meta_orig: dict, meta_multi: dict, steps: int, nproc: int) -> dict:
    """The collectives of the original (one replica: the calls the program makes, whether or not XLA then skips
    the communication) against those of rank 0 of the migrated program under torchrun with `nproc` processes.

    Gated: the gradient reductions. The migrated run must reduce gradients at every step where the original does
    (xm.optimizer_step, xm.reduce_gradients, an all_reduce of parameters' .grad) and must not reduce them at more
    places (call sites) than the original reduces anything. Counted but not gated: every other kind, and
    mark_step (XLA's graph cut, which has no native counterpart), because a program may issue them for logging
    only, and XLA with one replica against torch.distributed with N may legitimately call different numbers of
    them; gradients reduced through a flattened buffer count as a plain all_reduce (so the drop check then asks
    only for some reduction in the step)."""
    per_a, per_b = collectives_per_step(meta_orig), collectives_per_step(meta_multi)
    first = None
    rows = []
    for step in range(steps):
        a, b = per_a.get(step, []), per_b.get(step, [])
        ga, gb = _grad_sites(a), _grad_sites(b)
        rows.append({"step": step, "original": collective_counts(a), "migrated": collective_counts(b)})
        if first is not None:
            continue
        if ga and not gb and _reducing(b) == 0:
            path, line = sorted(ga)[0]
            first = {"step": step, "what": "collectives", "dropped": True,
                     "detail": f"the original reduces the gradients at step {step} "
                               f"({', '.join(sorted({k for k, g, *_ in a if g}))} at {_short(path)}:{line}); rank 0 of the "
                               f"migrated program under torchrun ({nproc} processes) calls no all-reduce in that step: "
                               "the gradient collective was dropped"}
        elif len(gb) > max(len(ga), _distinct_reducing_sites(a)):
            extra = sorted(gb)
            first = {"step": step, "what": "collectives", "added": True, "sites": [list(s) for s in extra],
                     "detail": f"rank 0 of the migrated program reduces the gradients at {len(gb)} places in step {step} "
                               f"({'; '.join(f'{_short(p)}:{ln}' for p, ln in extra)}), the original at {len(ga)}: "
                               "a gradient collective was added (the gradients are reduced twice)"}
    same = all(r["original"] == rows[0]["original"] and r["migrated"] == rows[0]["migrated"] for r in rows) if rows else True
    return {"rows": rows, "first": first, "same_every_step": same,
            "compared": "gradient reductions per step: the original (1 replica) against rank 0 of the migrated "
                        f"program ({nproc} processes); other kinds and mark_step are counted, not gated"}


def _distinct_reducing_sites(entries: list) -> int:
    return len({(p, ln) for kind, _g, p, ln, _n in entries if kind in REDUCING})


def _short(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def names_of(meta: dict) -> list:
    return (meta.get("optimizers") or [{}])[0].get("params", [])


def compare_with_one_process(meta1: dict, data1: dict, metas: list[dict], datas: list[dict], nproc: int,
                             mode: str) -> dict:
    """The N-process trajectory against the 1-process one, where the program's data split makes them
    comparable: the processes' step-0 losses (computed before any update, from the same initial parameters)
    must average to the 1-process step-0 loss (each rank a shard of the same global batch, a mean loss), and
    the optimizer settings must not depend on the world size. Then the mean of the ranks' losses, and rank 0's
    gradients (as the optimizer saw them, after the reduction) and parameters are compared with the 1-process
    run's: a collective whose scale changed (a sum left unaveraged, a scale of 1/world_size lost, invisible
    with one process where 1/world_size is 1) shows at the first step. Returns {'comparable', 'why', ...}."""
    gates = GATES[mode]
    steps = [m.get("loss_steps", []) for m in metas]
    if any(s != steps[0] for s in steps[1:]):
        return {"comparable": False, "why": "the processes called backward() at different steps"}
    s1 = meta1.get("loss_steps", [])
    if not s1 or not steps[0] or s1.count(0) != steps[0].count(0):
        return {"comparable": False, "why": "the 1-process and the N-process runs called backward() a different "
                                            "number of times in the first step"}
    losses = [[float(t) for t in d.get("losses", [])] for d in datas]
    mean = [sum(col) / len(col) for col in zip(*losses)]
    n0 = steps[0].count(0)
    one = [float(t) for t in data1.get("losses", [])[:n0]]
    rel0 = max(loss_rel(x, y) for x, y in zip(one, mean[:n0]))
    if rel0 > gates["loss"]:
        return {"comparable": False, "step0_loss_rel": rel0,
                "why": f"the mean of the {nproc} processes' first losses ({mean[0]:.6g}) is not the 1-process first loss "
                       f"({one[0]:.6g}): each process sees other data than a shard of the 1-process batch (its own "
                       "sampler, shuffling or random numbers), so the trajectories are not expected to match"}
    h1, hn = (meta1.get("hparams") or [[]])[0], (metas[0].get("hparams") or [[]])[0]
    diffs = _hparam_diffs(h1, hn)
    if diffs:
        return {"comparable": False, "why": "the optimizer settings depend on the world size: " + ", ".join(
            f"{d['key']} {d['original']!r} with 1 process, {d['migrated']!r} with {nproc}" for d in diffs)}
    merged_meta = dict(metas[0], loss_steps=steps[0])
    merged_data = dict(datas[0], losses=mean)
    cmp = compare_runs(meta1, data1, merged_meta, merged_data, mode)
    first = cmp["first"]
    if first is not None:
        ratio = ""
        if first["what"] == "grad" and first.get("param") in names_of(merged_meta):
            i = names_of(merged_meta).index(first["param"])
            a, b = _as_tensor(data1["grads"][first["step"]][i]), _as_tensor(datas[0]["grads"][first["step"]][i])
            if a is not None and b is not None and float(a.double().norm()) > 0:
                ratio = (f"; its norm is {float(b.double().norm()) / float(a.double().norm()):.4g}x the 1-process one "
                         "(a scale in the reduction)")
        first = dict(first, what=f"{first['what']} ({nproc} processes against 1)",
                     detail=f"{nproc} processes against 1: {first['detail']}{ratio}")
    return {"comparable": True, "step0_loss_rel": rel0, "steps": cmp["steps"], "worst": cmp["worst"],
            "first": first, "kind": first and cmp["first"]["what"]}
