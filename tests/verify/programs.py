"""A small two-file training program (model.py + train.py) in two forms: torch_xla (the original a user has) and
plain PyTorch on the CPU (a native stand-in for the original when the XLA environment is absent), and the
one-line defects the tests plant in a migrated copy."""
from __future__ import annotations

from pathlib import Path

MODEL = '''\
import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        return x + self.drop(F.gelu(self.fc(x)))


class Net(nn.Module):
    def __init__(self, d=16, classes=4):
        super().__init__()
        self.inp = nn.Linear(8, d)
        self.block = Block(d)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        return self.head(self.block(torch.relu(self.inp(x))))
'''

TRAIN = '''\
import argparse

import torch
{imports}from torch import nn

from model import Net


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--opt", default="sgd")
    args = parser.parse_args()
    device = {device}
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 8, generator=g)
    y = x[:, :4].argmax(dim=1)
    model = Net().to(device)
    if args.opt == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.05)
    loss_fn = nn.CrossEntropyLoss()
    model.eval()  # a first look at the untrained model
    with torch.no_grad():
        print(f"initial loss {{loss_fn(model(x[:64].to(device)), y[:64].to(device)).item():.5f}}")
    model.train()
    for step in range(args.steps):
        idx = torch.randint(0, 256, (32,))
        data, target = x[idx].to(device), y[idx].to(device)
        optimizer.zero_grad()
        loss = loss_fn(model(data), target)
        loss.backward()
        {step}
        print(f"step {{step}} loss {{loss.item():.5f}}")


if __name__ == "__main__":
    main()
'''

XLA = {"imports": "import torch_xla.core.xla_model as xm\n", "device": "xm.xla_device()",
       "step": "xm.optimizer_step(optimizer)\n        xm.mark_step()"}
NATIVE = {"imports": "", "device": 'torch.device("cpu")', "step": "optimizer.step()"}

# name -> (file, old, new, script arguments)
DEFECTS = {
    "lr x1.001": ("train.py", "lr=0.05,", "lr=0.05 * 1.001,", []),
    "momentum 0.9 -> 0.899": ("train.py", "momentum=0.9)", "momentum=0.899)", []),
    "weight decay dropped": ("train.py", "lr=0.01, weight_decay=0.05)", "lr=0.01)", ["--opt", "adamw"]),
    "gelu made approximate": ("model.py", "F.gelu(self.fc(x))", 'F.gelu(self.fc(x), approximate="tanh")', []),
    # the model stays in the eval mode of the first look: its dropout is off from the first step
    "model.train() lost": ("train.py", "    model.train()\n", "", []),
    "model.eval() left in": ("train.py", "    model.train()\n", "    model.eval()\n", []),
}
MODE_DEFECTS = ("model.train() lost", "model.eval() left in")


def write_program(folder: Path, kind: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(MODEL, encoding="utf-8")
    (folder / "train.py").write_text(TRAIN.format(**(XLA if kind == "xla" else NATIVE)), encoding="utf-8")
    return folder


def plant(folder: Path, defect: str) -> list[str]:
    """Plant one defect; returns the script arguments it needs. The line it changed: `planted_line`."""
    name, old, new, args = DEFECTS[defect]
    path = folder / name
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, (defect, old)
    path.write_text(text.replace(old, new), encoding="utf-8")
    return list(args)


def planted_line(folder: Path, defect: str, original: Path | None = None) -> tuple[str, int]:
    """The planted line: with `original`, the first line where the two differ (for a defect that only removes
    lines, the first removed line of the original); without, the line of `folder` holding the new text."""
    name, _, new, _ = DEFECTS[defect]
    lines = (folder / name).read_text(encoding="utf-8").splitlines()
    if original is not None:
        old_lines = (original / name).read_text(encoding="utf-8").splitlines()
        return name, next(i for i, (a, b) in enumerate(zip(old_lines, lines), 1) if a != b)
    return name, next(i for i, line in enumerate(lines, 1) if new in line)


DDP_TRAIN = '''\
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from model import Net


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(512, 8, generator=g)
    y = x[:, :4].argmax(dim=1)
    model = DDP(Net())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    for step in range(20):
        start = (step * 64 + rank * 32) % 512  # each rank its own shard of every batch
        data, target = x[start:start + 32], y[start:start + 32]
        optimizer.zero_grad()
        loss = loss_fn(model(data), target)
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''

DDP_DEFECTS = {
    "gradient averaging dropped": ("model = DDP(Net())", "model = Net()"),
    "world size became 1": ('dist.init_process_group("gloo")',
                            'dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)'),
}


def write_ddp_program(folder: Path, defect: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(MODEL, encoding="utf-8")
    text = DDP_TRAIN
    if defect:
        old, new = DDP_DEFECTS[defect]
        text = text.replace(old, new)
    (folder / "train.py").write_text(text, encoding="utf-8")
    return folder


# Every rank takes its shard of one global batch (the same indices on every rank: the host generator is seeded
# alike) and the gradients are summed then divided by the world size: the N-process trajectory is the 1-process
# one, so a changed scale in the collective shows. No dropout (a rank's masks are not a shard of the 1-process
# masks).
ALLREDUCE_TRAIN = '''\
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from model import Net


def average_gradients(model, world):
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(512, 8, generator=g)
    y = x[:, :4].argmax(dim=1)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    for step in range(20):
        idx = torch.randint(0, 512, (64,))[rank::world]  # this rank's shard of the global batch
        optimizer.zero_grad()
        loss = loss_fn(model(x[idx]), y[idx])
        loss.backward()
        average_gradients(model, world)
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''

# name -> (old, new): one-line changes that one process cannot show
ALLREDUCE_DEFECTS = {
    "scale of the gradient all_reduce dropped": ("        p.grad /= world\n", ""),  # a sum, not an average
    "gradient all_reduce added (DDP too)": ("    model = Net()\n", "    model = DDP(Net())\n"),
    "gradient all_reduce dropped": ("        dist.all_reduce(p.grad)\n", ""),
}


def write_allreduce_program(folder: Path, defect: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(MODEL.replace("nn.Dropout(0.1)", "nn.Dropout(0.0)"), encoding="utf-8")
    text = ALLREDUCE_TRAIN
    if defect:
        old, new = ALLREDUCE_DEFECTS[defect]
        assert text.count(old) == 1
        text = text.replace(old, new)
    (folder / "train.py").write_text(text, encoding="utf-8")
    return folder


# The torch_xla form of ALLREDUCE_TRAIN, as xmp.spawn programs write it: each replica takes its shard of one global
# batch, and the gradient list is summed and scaled by 1/world_size in xm.all_reduce (in place for a list). The
# rewrite makes it _neuron_all_reduce on the gradient list and a torchrun program; XLA's CPU backend runs the
# original with one replica, where xm.all_reduce skips both the reduction and the scale.
XLA_ALLREDUCE_TRAIN = '''\
import torch
import torch_xla.core.xla_model as xm
import torch_xla.distributed.xla_multiprocessing as xmp
import torch_xla.runtime as xr
from torch import nn

from model import Net


def _mp_fn(index):
    device = xm.xla_device()
    rank, world = xr.global_ordinal(), xr.world_size()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(512, 8, generator=g)
    y = x[:, :4].argmax(dim=1)
    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    for step in range(20):
        idx = torch.randint(0, 512, (64,))[rank::world]  # this replica's shard of the global batch
        data, target = x[idx].to(device), y[idx].to(device)
        optimizer.zero_grad()
        loss = loss_fn(model(data), target)
        loss.backward()
        xm.all_reduce(xm.REDUCE_SUM, [p.grad for p in model.parameters()], scale=1.0 / world)
        optimizer.step()
        xm.mark_step()


if __name__ == "__main__":
    xmp.spawn(_mp_fn, args=())
'''

# name -> (old, new) in the rewritten train.py
XLA_ALLREDUCE_DEFECTS = {
    "scale of the gradient all_reduce changed": ("scale=1.0 / world)", "scale=1.0)"),  # summed, not averaged
}


def write_xla_allreduce_program(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(MODEL.replace("nn.Dropout(0.1)", "nn.Dropout(0.0)"), encoding="utf-8")
    (folder / "train.py").write_text(XLA_ALLREDUCE_TRAIN, encoding="utf-8")
    return folder


# xm.all_reduce's scale in one replica (torch_xla 2.9 skips it: the reduction of one is a copy) against the rewrite
# in one and two processes. Printed: a tensor scaled by a constant, by 1/world_size, unscaled, and a list in place.
XLA_SCALE_PROGRAM = '''\
import sys

import torch
import torch.distributed as dist
import torch_xla.core.xla_model as xm
import torch_xla.distributed.xla_backend  # noqa: F401
import torch_xla.runtime as xr


def main():
    dist.init_process_group("xla", init_method="xla://")
    device = xm.xla_device()
    t = torch.tensor([1.0, 2.0], device=device)
    half = xm.all_reduce(xm.REDUCE_SUM, t, scale=0.5)
    mean = xm.all_reduce(xm.REDUCE_SUM, t, scale=1.0 / xr.world_size())
    total = xm.all_reduce(xm.REDUCE_SUM, t)
    grad = torch.tensor([4.0], device=device)
    xm.all_reduce(xm.REDUCE_SUM, [grad], scale=0.25)
    # one write per rank: two ranks share torchrun's stdout, and print() of several parts may interleave
    sys.stdout.write(f"RESULT {half.cpu().tolist()} {mean.cpu().tolist()} {total.cpu().tolist()} {grad.cpu().tolist()}\\n")


if __name__ == "__main__":
    main()
'''


# Which modules XLA FSDP's auto-wrap gives their own unit (argv[1]: a size-based min_num_params, or "classes":
# transformer_auto_wrap_policy of {Block, RMSNorm}), on the decoder of tests/integration/fsdp_zero/fsdp_decoder.
XLA_FSDP_UNITS = '''\
import functools
import sys

import torch_xla.core.xla_model as xm
from torch_xla.distributed.fsdp import XlaFullyShardedDataParallel as FSDP
from torch_xla.distributed.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy

from model import Block, Decoder, RMSNorm

policy = (functools.partial(size_based_auto_wrap_policy, min_num_params=int(sys.argv[1])) if sys.argv[1] != "classes"
          else functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block, RMSNorm}))
model = FSDP(Decoder().to(xm.xla_device()), auto_wrap_policy=policy)
for name, m in model.named_modules():
    if isinstance(m, FSDP) and name:
        print("UNIT", ".".join(p for p in name.split(".") if p not in ("_fsdp_wrapped_module", "_fpw_module")))
'''
