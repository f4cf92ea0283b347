"""What a PrivateUse1 `neuron` device dispatches where a CPU run takes another path (shared by the generators).

- `F.dropout` / `torch.dropout` in training: PyTorch's `is_fused_kernel_acceptable` (aten/src/ATen/native/Dropout.cpp)
  accepts CUDA, XPU, lazy and PrivateUse1 tensors, not CPU ones, so a device tensor gets `aten::native_dropout`
  where a CPU trace records `empty_like + bernoulli_ + div_ + mul`.
- SDPA on 4-D query/key/value: the pre-release TorchNeuron `_fused_sdp_choice` stub (csrc/aten/SdpBackendSelection.cpp)
  selects the 'overrideable' fused attention, which applies dropout itself; a CPU run with dropout_p > 0 takes the
  math path (`bernoulli_` again). Recording with dropout_p=0 lets the CPU pick its flash kernel, renamed below.
"""
from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

OP_RENAMES = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": "aten::_scaled_dot_product_fused_attention_overrideable",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward":
        "aten::_scaled_dot_product_fused_attention_overrideable_backward",
}

_DROPOUTS = {torch.nn.functional.dropout, torch.dropout, torch.dropout_}


class DeviceSubstitutes(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in _DROPOUTS:
            x = args[0]
            names = ("p", "training", "inplace") if func is torch.nn.functional.dropout else ("p", "train")
            vals = dict(zip(names, args[1:]))
            vals.update({k: v for k, v in kwargs.items() if k in names})
            p = vals.get("p", 0.5)
            training = vals.get("training", vals.get("train", True))
            inplace = vals.get("inplace", func is torch.dropout_)
            if training and 0 < p < 1 and x.numel() > 0:
                out = torch.native_dropout(x, p, True)[0]
                return x.copy_(out) if inplace else out
        if func is torch.nn.functional.scaled_dot_product_attention:
            q, k, v = (list(args) + [kwargs.get(n) for n in ("query", "key", "value")][len(args):])[:3]
            if all(t is not None and t.dim() == 4 for t in (q, k, v)):
                if len(args) > 4:
                    args = (*args[:4], 0.0, *args[5:])
                else:
                    kwargs["dropout_p"] = 0.0
        return func(*args, **kwargs)
