"""FAKE torch_neuronx -- FOR TESTS ONLY. This is NOT AWS torch-neuronx and runs nothing on a Neuron device.

It imitates just enough of the documented TorchNeuron surface for `neuron-migrate probe --device neuron` to
take its measured path on a CPU-only machine:

- the `neuron` device name (PrivateUse1 renamed) and a `torch.neuron` module whose `is_available()` is True;
  `Tensor.to` / `Module.to` to a `neuron` device are mapped to the CPU (the harness-side mapping described in
  shared/design/NOTES.md section 5), so every tensor really lives on the CPU;
- the op tracking API of torch_neuronx (`clear_op_tracking`, `get_fallback_ops`, `get_executed_ops`), fed by a
  dispatch mode: ops named in $NM_FAKE_NEURONX_FALLBACK (default aten::atan2,aten::_fft_r2c) are reported as
  fallbacks, the host-computed linalg ops are reported as neither (like the real wrappers), everything else
  as executed on Neuron. Names are `aten::<op>` without overload, as in the pre-release source.
"""
from __future__ import annotations

import os
import types

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__version__ = "0.0.0+FAKE"
FAKE = True

_FALLBACK = set(filter(None, os.environ.get("NM_FAKE_NEURONX_FALLBACK", "aten::atan2,aten::_fft_r2c").split(",")))
_HOST_UNTRACKED = {"aten::linalg_qr", "aten::_linalg_svd", "aten::_linalg_eigh", "aten::triangular_solve"}
_fallback_ops: set[str] = set()
_executed_ops: set[str] = set()

torch.utils.rename_privateuse1_backend("neuron")
_neuron = types.ModuleType("torch.neuron")
_neuron.is_available = lambda: True
_neuron.device_count = lambda: 1
_neuron.synchronize = lambda device=None: None
_neuron.FAKE = True
torch._register_device_module("neuron", _neuron)


def _cpu_for_neuron(x):
    if isinstance(x, torch.device) and x.type == "neuron":
        return torch.device("cpu")
    if isinstance(x, str) and x.startswith("neuron"):
        return "cpu"
    return x


_real_tensor_to = torch.Tensor.to


def _fake_to(self, *args, **kwargs):
    args = tuple(_cpu_for_neuron(a) for a in args)
    if "device" in kwargs:
        kwargs["device"] = _cpu_for_neuron(kwargs["device"])
    return _real_tensor_to(self, *args, **kwargs)


torch.Tensor.to = _fake_to
_real_module_to = torch.nn.Module.to


def _fake_module_to(self, *args, **kwargs):
    args = tuple(_cpu_for_neuron(a) for a in args)
    if "device" in kwargs:
        kwargs["device"] = _cpu_for_neuron(kwargs["device"])
    return _real_module_to(self, *args, **kwargs)


torch.nn.Module.to = _fake_module_to


class _Tracker(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = f"{func.namespace}::{func._opname}"
        if name in _FALLBACK:
            _fallback_ops.add(name)
        elif name not in _HOST_UNTRACKED:
            _executed_ops.add(name)
        return func(*args, **(kwargs or {}))


_tracker = None


def clear_op_tracking():
    global _tracker
    _fallback_ops.clear()
    _executed_ops.clear()
    if _tracker is None:
        _tracker = _Tracker()
        _tracker.__enter__()


def get_fallback_ops():
    return sorted(_fallback_ops)


def get_executed_ops():
    return sorted(_executed_ops)
