"""Device, process group and precision helpers shared by the training scripts."""
import contextlib
import os

import torch
import torch.distributed as dist


def get_device(name: str = "auto") -> torch.device:
    """The device to train on: the one asked for, else the best available."""
    if name != "auto":
        return torch.device(name)
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def setup_distributed(backend: str):
    """(rank, world size); starts the process group when torchrun started us."""
    if "RANK" not in os.environ:
        return 0, 1
    dist.init_process_group(backend=backend)
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    return dist.get_rank(), dist.get_world_size()


def autocast_context(device: torch.device, precision: str):
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    if dtype is None or device.type == "cpu":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)
