"""`--compile`: what `torch.compile` would see (runs in the child, on CPU, with a capturing backend).

- graph breaks and their reasons: `torch._dynamo.explain`;
- the aten ops inside each captured forward and backward graph: an `aot_autograd` backend whose compilers
  record every `call_function` node (with the user line from `node.meta["stack_trace"]`) and run the graph
  unchanged;
- recompilations with `dynamic=False` (TorchNeuron rejects `dynamic=True`): one compiled forward per new
  input shape, counted over `--shapes`.
"""
from __future__ import annotations

import os
import re
from typing import Any

import torch

_FILE_RE = re.compile(r'File "([^"]+)", line (\d+)')


def _user_line_from_stack(stack: str | None) -> tuple[str | None, int | None]:
    from neuron_migrate.probe.recorder import _EXCLUDED

    if not stack:
        return None, None
    found: tuple[str | None, int | None] = (None, None)
    for fn, line in _FILE_RE.findall(stack):
        a = os.path.abspath(fn)
        if not a.startswith(_EXCLUDED) and "site-packages" not in a:
            found = (a, int(line))
    return found


def _op_name(target) -> str:
    from neuron_migrate.probe.recorder import op_name

    if isinstance(target, torch._ops.OpOverload):
        return op_name(target)
    return getattr(target, "__name__", str(target))


def _run(model, args, kwargs, train: bool):
    from neuron_migrate.probe.steps import forward_backward

    forward_backward(model, args, kwargs, train)


def _explain(model, args, kwargs) -> dict:
    import torch._dynamo

    torch._dynamo.reset()
    ex = torch._dynamo.explain(model)(*args, **kwargs)
    breaks = []
    for br in ex.break_reasons:
        first, reason, f, line, lib_f, lib_line = break_site(br)
        breaks.append({"reason": first[:500], "detail": reason[:2000], "file": f, "line": line,
                       "lib_file": lib_f, "lib_line": lib_line})
    # dynamo can count fewer breaks than it lists reasons for; a listed break is a break
    count = max(int(ex.graph_break_count or 0), len(breaks))
    return {"graph_count": ex.graph_count, "graph_break_count": count, "breaks": breaks}


def graph_ops(gm) -> list[dict]:
    """The aten ops of one FX graph with their user lines and counts: {"op", "file", "line", "count"}."""
    ops: dict[tuple, dict] = {}
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        name = _op_name(node.target)
        f, line = _user_line_from_stack(node.meta.get("stack_trace"))
        ops.setdefault((name, f, line), {"op": name, "file": f, "line": line, "count": 0})["count"] += 1
    return list(ops.values())


def break_site(br) -> tuple:
    """(first line of the reason, whole reason, user file, line, library file, line) of one dynamo graph break:
    the innermost frame in the user's files, and the innermost outside torch when that is a library's."""
    reason = str(getattr(br, "reason", br))
    first = reason.strip().splitlines()[0] if reason.strip() else reason
    f, line, lib_f, lib_line = None, None, None, None
    for fs in getattr(br, "user_stack", []) or []:  # outermost first
        kind = _frame_kind(fs.filename)
        if kind == "user":
            f, line = os.path.abspath(fs.filename), fs.lineno
        if kind in ("user", "lib"):
            lib_f, lib_line = os.path.abspath(fs.filename), fs.lineno
    if (lib_f, lib_line) == (f, line):
        lib_f, lib_line = None, None
    return first, reason, f, line, lib_f, lib_line


def _frame_kind(filename: str) -> str:
    from neuron_migrate.probe.recorder import _LIB, _USER, _classify

    class _Code:  # _classify caches per code object; a filename stands in for one here
        co_filename = filename

    kind = _classify(_Code)[0]
    return {_USER: "user", _LIB: "lib"}.get(kind, "skip")


def _capture(model, args, kwargs, train: bool) -> list[dict]:
    import torch._dynamo
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    graphs: list[dict] = []

    def compiler(kind: str):
        def _c(gm, example_inputs):  # noqa: ARG001
            graphs.append({"index": len(graphs), "kind": kind, "ops": graph_ops(gm)})
            return make_boxed_func(gm.forward)

        return _c

    torch._dynamo.reset()
    backend = aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"))
    compiled = torch.compile(model, backend=backend, dynamic=False)
    _run(compiled, args, kwargs, train)
    return graphs


def _reshape_inputs(args, kwargs, shape: list[int]):
    """New inputs for `shape`, given for the first tensor input: every tensor input whose leading dimensions
    match the first one's (labels, attention masks, ...) gets the same new leading dimensions, so the inputs
    stay consistent (same dtypes; random values in each original's range)."""
    import torch.utils._pytree as pytree

    leaves = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    if not leaves:
        return args, kwargs
    ref = list(leaves[0].shape)

    def new_shape(t) -> list[int]:
        old = list(t.shape)
        if t is leaves[0]:
            return list(shape)
        out = list(old)
        for i in range(min(len(old), len(ref), len(shape))):
            if old[i] != ref[i]:
                break
            out[i] = shape[i]
        return out

    def swap(t):
        if not isinstance(t, torch.Tensor):
            return t
        shp = new_shape(t)
        if shp == list(t.shape):
            return t
        if t.is_floating_point() or t.is_complex():
            return torch.randn(shp, dtype=t.dtype)
        if t.dtype == torch.bool:
            return torch.ones(shp, dtype=t.dtype)
        lo = int(t.min().item()) if t.numel() else 0
        hi = int(t.max().item()) + 1 if t.numel() else 2
        return torch.randint(min(lo, 0) if lo < 0 else lo, max(hi, lo + 1), shp, dtype=t.dtype)

    return pytree.tree_map(swap, (args, kwargs))


def _recompiles(model, args, kwargs, shapes: list[list[int]], train: bool) -> dict:
    import torch._dynamo
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    per_shape: list[dict] = []
    count = {"n": 0}

    def fw(gm, example_inputs):  # noqa: ARG001
        count["n"] += 1
        return make_boxed_func(gm.forward)

    def bw(gm, example_inputs):  # noqa: ARG001
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    old_limit = getattr(torch._dynamo.config, "recompile_limit", None)
    if old_limit is not None:
        torch._dynamo.config.recompile_limit = max(old_limit, len(shapes) + 2)
    try:
        compiled = torch.compile(model, backend=aot_autograd(fw_compiler=fw, bw_compiler=bw), dynamic=False)
        for shape in shapes:
            before = count["n"]
            a, k = _reshape_inputs(args, kwargs, shape)
            err = None
            try:
                _run(compiled, a, k, train)
            except Exception as exc:  # noqa: BLE001 - a shape the model cannot take
                err = f"{type(exc).__name__}: {str(exc)[:300]}"
            per_shape.append({"shape": shape, "new_compiles": count["n"] - before, "error": err})
    finally:
        if old_limit is not None:
            torch._dynamo.config.recompile_limit = old_limit
    ok = [p for p in per_shape if not p["error"]]
    compiles = sum(p["new_compiles"] for p in ok)
    return {
        "shapes": per_shape,
        "total_compiles": compiles,
        # recompilations: compiles after the first, for shapes that ran (a shape the model rejects is an error,
        # not a recompilation)
        "recompilations": max(0, compiles - (ok[0]["new_compiles"] if ok else 0)),
        "failed_shapes": len(per_shape) - len(ok),
        "dynamic": False,
    }


def probe_compile(model, args, kwargs, train: bool = True, shapes: list | None = None) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, fn in (("explain", lambda: _explain(model, args, kwargs)),
                    ("graphs", lambda: _capture(model, args, kwargs, train))):
        try:
            result[key] = fn()
        except Exception as exc:  # noqa: BLE001 - a dynamo failure is a finding, not a probe crash
            result[key + "_error"] = f"{type(exc).__name__}: {str(exc)[:2000]}"
    if shapes:
        try:
            result["recompiles"] = _recompiles(model, args, kwargs, [list(s) for s in shapes], train)
        except Exception as exc:  # noqa: BLE001
            result["recompiles_error"] = f"{type(exc).__name__}: {str(exc)[:2000]}"
    return result
