"""Multi-process training with xmp.spawn, started by launch.sh / job.slurm / the Dockerfile with a plain `python train.py`."""
import numpy as np
import torch
import torch_xla.core.xla_model as xm
import torch_xla.distributed.parallel_loader as pl
import torch_xla.distributed.xla_multiprocessing as xmp
import torch_xla.runtime as xr
from torch import nn
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from common import MLP, make_dataset


def _mp_fn(index, flags):
    torch.manual_seed(flags["seed"])
    device = xm.xla_device()
    xm.master_print(f"WORLD_SIZE {xm.xrt_world_size()}")
    dataset = make_dataset()
    xm.rendezvous("dataset_ready")
    sampler = DistributedSampler(dataset, num_replicas=xm.xrt_world_size(), rank=xm.get_ordinal())
    loader = pl.MpDeviceLoader(DataLoader(dataset, batch_size=32, sampler=sampler), device)
    model = MLP().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=flags["lr"] * xm.xrt_world_size())
    loss_fn = nn.CrossEntropyLoss()
    losses = []
    for epoch in range(flags["epochs"]):
        for data, target in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(data), target)
            loss.backward()
            xm.optimizer_step(optimizer)
            losses.append(loss.detach())
        epoch_loss = xm.all_reduce(xm.REDUCE_SUM, torch.stack(losses[-len(loader):]).mean(), scale=1.0 / xm.xrt_world_size())
        xm.master_print(f"epoch {epoch} mean loss {epoch_loss.item():.4f}")
    first = xm.mesh_reduce("first_loss", torch.stack(losses[:5]).mean().item(), np.mean)
    last = xm.mesh_reduce("last_loss", torch.stack(losses[-5:]).mean().item(), np.mean)
    xm.master_print(f"INITIAL_LOSS {first:.4f}")
    xm.master_print(f"FINAL_LOSS {last:.4f}")


if __name__ == "__main__":
    flags = {"seed": 1, "lr": 0.05, "epochs": 3}
    xmp.spawn(_mp_fn, args=(flags,))
