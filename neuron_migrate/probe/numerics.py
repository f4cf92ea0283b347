"""`--numerics`: how much the model's results move when float64 is computed in float32, as TorchNeuron does
(it casts float64 inputs of an op to float32, computes, and stores the result back in a float64 tensor), and,
on a Trn2/Trn3 host, how far the neuron run is from a CPU run.

Runs in the child. Differences are reported per output, for the loss and per parameter gradient:
`max_abs` = max |a - b|; `max_rel` = max |a - b| / max |a| (relative to the reference's largest magnitude,
which stays finite where the reference crosses zero).
"""
from __future__ import annotations

import copy
from typing import Any

import torch
import torch.utils._pytree as pytree

from neuron_migrate.probe.precision import EmulatedPrecision

class Float64AsFloat32(EmulatedPrecision):
    """Every op that reads a float64 (complex128) tensor computes in float32 (complex64); results are stored
    back as float64, in place where the op writes its inputs (`precision.EmulatedPrecision`, float64 only)."""

    def __init__(self):
        super().__init__(["float64"])

    @property
    def downcast_ops(self) -> int:
        return self.counts["float64"]


def _diff(ref, other) -> dict[str, Any]:
    a = ref.detach().to("cpu")
    b = other.detach().to("cpu")
    if a.shape != b.shape:
        return {"error": f"shape {list(a.shape)} vs {list(b.shape)}"}
    hi = torch.complex128 if (a.is_complex() or b.is_complex()) else torch.float64
    a, b = a.to(hi), b.to(hi)
    if a.numel() == 0:
        return {"max_abs": 0.0, "max_rel": 0.0, "dtype": str(ref.dtype).replace("torch.", "")}
    d = (a - b).abs()
    max_abs = float(d.max())
    scale = float(a.abs().max())
    return {
        "max_abs": max_abs,
        "max_rel": max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf")),
        "dtype": str(ref.dtype).replace("torch.", ""),
    }


def _run_once(model, args, kwargs, seed: int, train: bool, mode=None) -> dict[str, Any]:
    from neuron_migrate.probe.steps import forward_backward

    torch.manual_seed(seed)
    ctx = mode if mode is not None else _Null()
    with ctx:
        out, loss = forward_backward(model, args, kwargs, train)
    leaves = [t for t in pytree.tree_leaves(out if not hasattr(out, "to_tuple") else out.to_tuple())
              if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())]
    grads = {}
    if train and hasattr(model, "named_parameters"):
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return {"outputs": leaves, "loss": loss, "grads": grads}


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _compare(ref: dict, other: dict) -> dict[str, Any]:
    res: dict[str, Any] = {"outputs": [], "grads": {}}
    for i, (a, b) in enumerate(zip(ref["outputs"], other["outputs"])):
        res["outputs"].append({"index": i, **_diff(a, b)})
    if ref["loss"] is not None and other["loss"] is not None:
        res["loss"] = _diff(ref["loss"], other["loss"])
    for name, g in ref["grads"].items():
        if name in other["grads"]:
            res["grads"][name] = _diff(g, other["grads"][name])
    worst = [d.get("max_rel", 0.0) for d in res["outputs"] + list(res["grads"].values()) + [res.get("loss", {})]
             if isinstance(d, dict) and "max_rel" in d]
    res["worst_rel"] = max(worst) if worst else 0.0
    return res


def probe_numerics(model, args, kwargs, device: str = "cpu", seed: int = 0, train: bool = True) -> dict[str, Any]:
    """`model`, `args`, `kwargs` are on the CPU (an untouched copy taken before the probed steps)."""
    result: dict[str, Any] = {}
    ref = _run_once(copy.deepcopy(model), args, kwargs, seed, train)
    mode = Float64AsFloat32()
    emu = _run_once(copy.deepcopy(model), args, kwargs, seed, train, mode=mode)
    result["float64_as_float32"] = {**_compare(ref, emu), "ops_downcast": mode.downcast_ops}
    if device not in ("cpu",):
        dev = torch.device(device)
        moved = copy.deepcopy(model).to(dev)
        d_args, d_kwargs = pytree.tree_map(lambda t: t.to(dev) if isinstance(t, torch.Tensor) else t, (args, kwargs))
        run = _run_once(moved, d_args, d_kwargs, seed, train)
        result[f"{device}_vs_cpu"] = _compare(ref, run)
    return result
