"""Device helpers shared by several backends (the kind of module accelerate/Lightning-style repos carry).

Dispatching code like this must stay as it is after migration: it already picks the right backend per host.
"""
import torch

_MODULES = {"cuda": torch.cuda, "xpu": getattr(torch, "xpu", None), "mps": getattr(torch, "mps", None)}


def best_device():
    if torch.cuda.is_available():
        return torch.device("cuda")
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return torch.device("xpu")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def synchronize(device):
    """Wait for queued kernels (for timing)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    elif device.type == "xpu":
        torch.xpu.synchronize()


def memory_mib(device):
    module = _MODULES.get(device.type)
    if module is None or not module.is_available():
        return 0.0
    return module.max_memory_allocated() / 2**20
