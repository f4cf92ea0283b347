"""Device precision without the device: float64 computed as float32, int64 held as int32, and bf16 autocast.

What TorchNeuron does, per its sources (the project's research notes on TorchNeuron's source and docs):
- float64: every op casts float64 inputs to float32, computes, and stores the result back as float64.
- int64: a dtype autocast maps int64 to int32, so values outside the int32 range wrap.
- bf16: `torch.autocast("neuron", torch.bfloat16)` registers PyTorch's CUDA-style op lists: matmul-like ops run
  in bf16 (their outputs are bf16, so the elementwise ops after them run in bf16 too), numerically sensitive ops
  (softmax, log, pow, norms, losses, sums) run in float32.

`EmulatedPrecision` reproduces those effects on the CPU, below autograd, without changing any tensor's dtype
(bf16 is emulated by rounding to bf16 and back), so backward and optimizer steps run unchanged. Each op is
attributed to a source site (the innermost frame outside torch and this package), and chosen (op, site) pairs
can be exempted: that op then runs in reference precision, which is how a culprit is confirmed.

`ShadowRun` runs the same emulation and, beside it, every op again in reference precision on the reference
("shadow") values of its inputs. An op whose inputs still agree with their shadows while its output does not is
the op that introduces the difference.
"""
from __future__ import annotations

import os
import sys
import weakref
from typing import Any, Iterable

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from neuron_migrate.probe.precision_kinds import KINDS, parse_kinds  # noqa: F401 - re-exported


_F64_LOW = {torch.float64: torch.float32, torch.complex128: torch.complex64}
_INT32_MIN, _INT32_SPAN = -(2**31), 2**32

# PyTorch's CUDA autocast lists at the aten level (what a dispatch mode sees, after composite decompositions:
# linear -> addmm/mm, matmul -> mm/bmm, sdpa math -> bmm). TorchNeuron registers the same lists for
# AutocastPrivateUse1 (torchneuron.md, `csrc/amp/autocast_mode.cpp` [SRC]).
BF16_LOWER = frozenset({
    "mm", "addmm", "bmm", "baddbmm", "addbmm", "addmv", "addr", "mv", "dot", "vdot", "convolution", "_convolution",
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "prelu", "_prelu_kernel",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention", "linalg_vecdot", "einsum",
})
BF16_FP32 = frozenset({
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt", "sinh",
    "tan", "pow", "softplus", "native_layer_norm", "layer_norm", "native_group_norm", "group_norm", "frobenius_norm",
    "nuclear_norm", "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss_forward",
    "nll_loss2d", "nll_loss2d_forward", "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss",
    "mse_loss", "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
    "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "prod", "_softmax", "softmax", "_log_softmax", "log_softmax", "cumprod", "cumsum", "linalg_vector_norm",
    "linalg_matrix_norm", "sum", "norm",
})
# Ops that move or describe data without computing on it.
_PASSTHROUGH = frozenset({
    "_to_copy", "copy_", "clone", "detach", "alias", "lift_fresh", "lift_fresh_copy", "empty_like", "zeros_like",
    "ones_like", "full_like", "empty", "empty_strided", "new_empty", "new_empty_strided", "new_zeros", "new_ones",
    "new_full", "_local_scalar_dense", "set_", "resize_", "zero_", "_unsafe_view", "is_same_size", "equal",
    "fill_", "t", "transpose", "permute", "view", "reshape", "expand", "squeeze", "unsqueeze", "select", "slice",
    "as_strided", "split", "split_with_sizes", "chunk", "unbind", "contiguous", "_reshape_alias", "unfold",
})

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def op_site(depth: int = 2) -> tuple[str, int] | None:
    """(file, line) of the innermost frame outside torch and neuron-migrate: the line of model code (the user's or
    an installed library's) that issued the op."""
    f = sys._getframe(depth)
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith("<"):
            fn = os.path.abspath(fn)
            if not fn.startswith(_TORCH_DIR) and not fn.startswith(_OWN_DIR):
                return fn, f.f_lineno
        f = f.f_back
    return None


def _round_bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).to(t.dtype)


def _wrap_int32(t: torch.Tensor) -> torch.Tensor:
    """int64 values as int32 storage holds them (two's complement wrap-around), kept in an int64 tensor."""
    return t.to(torch.int32).to(torch.int64)


class _Bf16Tags:
    """Which float32 tensors autocast would hold as bf16. By identity, without keeping tensors alive."""

    def __init__(self):
        self._refs: dict[int, weakref.ref] = {}

    def add(self, t: torch.Tensor) -> None:
        self._refs[id(t)] = weakref.ref(t)

    def has(self, t: torch.Tensor) -> bool:
        r = self._refs.get(id(t))
        return r is not None and r() is t


class EmulatedPrecision(TorchDispatchMode):
    """Run every op the way the device's precision would (see the module docstring)."""

    def __init__(self, kinds: Iterable[str], exempt: Iterable[tuple[str, tuple[str, int] | None]] = ()):
        super().__init__()
        self.kinds = frozenset(kinds)
        self.exempt = set(exempt)
        self.tags = _Bf16Tags()
        self.counts = {k: 0 for k in KINDS}
        self.need_site = bool(self.exempt)

    # The emulated computation of one op; shared with ShadowRun.
    def emulate(self, func, args, kwargs, site=None):
        name = func.overloadpacket.__name__
        if (name, site) in self.exempt:
            return func(*args, **kwargs)
        if getattr(func, "is_view", False) or name in _PASSTHROUGH:
            out = func(*args, **kwargs)
            if "bf16" in self.kinds and not getattr(func, "is_view", False):
                # a copy of a bf16 value is a bf16 value (same tag)
                src = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
                if src and self.tags.has(src[0]):
                    for o in pytree.tree_leaves(out):
                        if isinstance(o, torch.Tensor) and o.is_floating_point():
                            self.tags.add(o)
            return out
        leaves = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if "int64" in self.kinds and any(t.dtype == torch.int64 for t in leaves):
            self.counts["int64"] += 1
        bf16_out = False
        if "bf16" in self.kinds:
            floats = [t for t in leaves if t.dtype == torch.float32]
            if name in BF16_LOWER and floats:
                args, kwargs = pytree.tree_map(
                    lambda t: _round_bf16(t) if isinstance(t, torch.Tensor) and t.dtype == torch.float32 else t,
                    (args, kwargs))
                bf16_out = True
                self.counts["bf16"] += 1
            elif name not in BF16_FP32 and floats and all(self.tags.has(t) for t in floats):
                bf16_out = True  # every floating input is bf16 under autocast: the op computes in bf16
                self.counts["bf16"] += 1
        if "float64" in self.kinds and any(t.dtype in _F64_LOW for t in leaves):
            out = self._as_float32(func, args, kwargs)
        else:
            out = func(*args, **kwargs)
        return self._finish(out, bf16_out)

    def _finish(self, out, bf16_out: bool):
        def fix(o):
            if not isinstance(o, torch.Tensor):
                return o
            if bf16_out and o.dtype == torch.float32:
                with torch.no_grad():
                    o.copy_(_round_bf16(o))
                self.tags.add(o)
            if "int64" in self.kinds and o.dtype == torch.int64:
                with torch.no_grad():
                    o.copy_(_wrap_int32(o))
            return o

        return pytree.tree_map(fix, out)

    def _as_float32(self, func, args, kwargs):
        self.counts["float64"] += 1
        new_args, new_kwargs = pytree.tree_map(
            lambda t: t.to(_F64_LOW[t.dtype]) if isinstance(t, torch.Tensor) and t.dtype in _F64_LOW else t,
            (args, kwargs))
        out = func(*new_args, **new_kwargs)
        # arguments the op writes: copy the float32 result back into the caller's float64 tensor
        written: dict[int, torch.Tensor] = {}
        for i, a in enumerate(func._schema.arguments):
            if a.alias_info is None or not a.alias_info.is_write:
                continue
            if a.kwarg_only or i >= len(args):
                orig, new = kwargs.get(a.name), new_kwargs.get(a.name)
            else:
                orig, new = args[i], new_args[i]
            for o, n in zip(pytree.tree_leaves(orig), pytree.tree_leaves(new)):
                if isinstance(o, torch.Tensor) and o is not n:
                    o.copy_(n)
                    written[id(n)] = o
        high = {v: k for k, v in _F64_LOW.items()}

        def back(t):
            if isinstance(t, torch.Tensor):
                if id(t) in written:
                    return written[id(t)]
                if t.dtype in high:
                    return t.to(high[t.dtype])
            return t

        return pytree.tree_map(back, out)

    def prepare_inputs(self, tree):
        """Model inputs as the device holds them (int64 wrapped to the int32 range)."""
        if "int64" not in self.kinds:
            return tree
        return pytree.tree_map(
            lambda t: _wrap_int32(t) if isinstance(t, torch.Tensor) and t.dtype == torch.int64 else t, tree)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        site = op_site(3) if self.need_site else None
        return self.emulate(func, args, kwargs, site)


def relative_error(actual: torch.Tensor, reference: torch.Tensor) -> float:
    """||a - r|| / ||r|| in float64 (complex: on the real and imaginary parts); 0 for two empty tensors."""
    a = actual.detach().to("cpu")
    r = reference.detach().to("cpu")
    if a.shape != r.shape:
        return float("inf")
    if a.is_complex() or r.is_complex():
        a, r = torch.view_as_real(a.to(torch.complex128)), torch.view_as_real(r.to(torch.complex128))
    a, r = a.to(torch.float64), r.to(torch.float64)
    if a.numel() == 0:
        return 0.0
    finite = torch.isfinite(a) & torch.isfinite(r)
    if not bool(finite.all()):
        same = (a == r) | (torch.isnan(a) & torch.isnan(r))
        if not bool(same[~finite].all()):
            return float("inf")
        a, r = a[finite], r[finite]
        if a.numel() == 0:
            return 0.0
    num = float(torch.linalg.vector_norm(a - r))
    den = float(torch.linalg.vector_norm(r))
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den


class ShadowRun(TorchDispatchMode):
    """Emulated precision with a reference-precision shadow of every tensor; records, per op, the error its
    inputs carried in and the error its output carries out."""

    def __init__(self, kinds: Iterable[str], exempt: Iterable = ()):
        super().__init__()
        self.emu = EmulatedPrecision(kinds, exempt=exempt)
        self._shadow: dict[int, tuple[weakref.ref, torch.Tensor]] = {}
        self._producer: dict[int, tuple[weakref.ref, int]] = {}  # tensor -> index of the record that made it
        self.records: list[dict[str, Any]] = []

    def _shadow_of(self, t: torch.Tensor) -> torch.Tensor:
        hit = self._shadow.get(id(t))
        if hit is not None and hit[0]() is t:
            return hit[1]
        return t

    def remember(self, actual: torch.Tensor, shadow: torch.Tensor) -> None:
        self._shadow[id(actual)] = (weakref.ref(actual), shadow)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        site = op_site(3)
        # the reference: the op on the shadows of its inputs, in reference precision (inputs the op writes are
        # cloned so that the shadow run cannot touch the actual tensors)
        def shadow_arg(t):
            if not isinstance(t, torch.Tensor):
                return t
            return self._shadow_of(t).clone()

        s_args, s_kwargs = pytree.tree_map(shadow_arg, (args, kwargs))
        in_err = 0.0
        for t in pytree.tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex() or t.dtype == torch.int64):
                s = self._shadow_of(t)
                if s is not t and t.numel():
                    in_err = max(in_err, relative_error(t, s))
        s_out = func(*s_args, **s_kwargs)
        out = self.emu.emulate(func, args, kwargs, site)
        # outputs (and inputs the op wrote) get their shadows
        for i, a in enumerate(func._schema.arguments):
            if a.alias_info is not None and a.alias_info.is_write:
                src = kwargs.get(a.name) if (a.kwarg_only or i >= len(args)) else args[i]
                dst = s_kwargs.get(a.name) if (a.kwarg_only or i >= len(args)) else s_args[i]
                for o, so in zip(pytree.tree_leaves(src), pytree.tree_leaves(dst)):
                    if isinstance(o, torch.Tensor) and isinstance(so, torch.Tensor):
                        self.remember(o, so)
        out_err = 0.0
        name = func.overloadpacket.__name__
        for o, so in zip(pytree.tree_leaves(out), pytree.tree_leaves(s_out)):
            if isinstance(o, torch.Tensor) and isinstance(so, torch.Tensor) and o.shape == so.shape:
                self.remember(o, so)
                if (o.is_floating_point() or o.is_complex() or o.dtype == torch.int64) and o.numel():
                    out_err = max(out_err, relative_error(o, so))
        inputs_from = []
        for t in pytree.tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor):
                hit = self._producer.get(id(t))
                if hit is not None and hit[0]() is t and hit[1] not in inputs_from:
                    inputs_from.append(hit[1])
        if getattr(func, "is_view", False) or name in _PASSTHROUGH:
            # a view or copy carries its source's producer
            for o in pytree.tree_leaves(out):
                if isinstance(o, torch.Tensor) and inputs_from:
                    self._producer[id(o)] = (weakref.ref(o), inputs_from[0])
            return out
        index = len(self.records)
        # lossy: the emulated op stored something other than the reference value (rounded, wrapped)
        self.records.append({"op": f"aten::{name}", "name": name, "site": site, "in_err": in_err,
                             "out_err": out_err, "inputs_from": inputs_from, "lossy": out_err > 0.0})
        for o in pytree.tree_leaves(out):
            if isinstance(o, torch.Tensor):
                self._producer[id(o)] = (weakref.ref(o), index)
        return out

    def culprit(self, tol: float) -> dict[str, Any] | None:
        """The first op whose output leaves tolerance while its inputs were within it."""
        for r in self.records:
            if r["out_err"] > tol and r["in_err"] <= tol:
                return r
        return None
