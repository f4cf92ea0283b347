"""Dispatcher messages translated into one line a user can act on (no torch import).

A dense-only device asked for a sparse or nested tensor answers with the dispatcher's message: "Could not run
'aten::_sparse_coo_tensor_with_dims_and_tensors' with arguments from the 'Sparseneuron' backend. This could be
because ..." followed by every dispatch key it knows (5 kB). What the user needs is the op, the namespace, the
TorchNeuron status and the line.
"""
from __future__ import annotations

import re

_COULD_NOT_RUN = re.compile(r"Could not run '([\w:.]+)' with arguments from the '(\w+)' backend")
_DENSE_ONLY = re.compile(r"only strided \(dense\) tensors exist on the device, got layout (\w+)")

# dispatch-key families of a backend that only has dense tensors -> the torch namespace that needs them
_FAMILIES = (("SparseCsr", "torch.sparse"), ("Sparse", "torch.sparse"), ("NestedTensor", "torch.nested"),
             ("Quantized", "torch.ao.quantization"), ("Mkldnn", "torch.mkldnn"))


def device_cannot(message: str) -> tuple[str, str, str] | None:
    """(op, namespace, backend) when `message` says the device has no kernel for a tensor kind it does not have
    (sparse, nested, quantized); None for anything else (a real error of the program)."""
    m = _COULD_NOT_RUN.search(message)
    if m:
        op, backend = m.group(1), m.group(2)
        for prefix, ns in _FAMILIES:
            if backend.startswith(prefix) and backend[len(prefix):].lower() not in ("cpu", "meta"):
                return op, ns, backend
        return None
    m = _DENSE_ONLY.search(message)
    if m:
        layout = m.group(1)
        return "aten::empty", "torch.sparse" if "sparse" in layout.lower() else "torch.nested", layout
    return None


def translate(message: str, status: str = "unsupported") -> str | None:
    """One line for a dispatcher message about a tensor kind the device does not have; None when it is not one."""
    hit = device_cannot(message)
    if hit is None:
        return None
    op, ns, backend = hit
    return (f"{ns}: {status} on TorchNeuron: {op} has no kernel for {ns.rsplit('.', 1)[-1]} tensors on the device "
            f"(dispatch key {backend})")
