"""Data-parallel training launched with torchrun, using the XLA process-group backend and DDP.

    torchrun --nproc_per_node=2 torchrun_ddp.py
"""
import os

import torch
import torch.distributed as dist
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.distributed.xla_backend  # registers the 'xla' backend
import torch_xla.runtime as xr
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from common import MLP, make_dataset

dist.init_process_group("xla", init_method="xla://")


def main():
    device = xm.xla_device()
    dataset = make_dataset()
    sampler = DistributedSampler(dataset, num_replicas=xr.world_size(), rank=xr.global_ordinal(), shuffle=True)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    model = DDP(MLP().to(device), gradient_as_bucket_view=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = nn.CrossEntropyLoss()
    losses = []
    for epoch in range(4):
        sampler.set_epoch(epoch)
        for data, target in loader:
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(data), target)
            loss.backward()
            optimizer.step()
            xm.mark_step()
            losses.append(loss.detach())
    if xm.is_master_ordinal(local=False):
        first = torch.stack(losses[:5]).mean().item()
        last = torch.stack(losses[-5:]).mean().item()
        print(f"rank {xr.global_ordinal()} of {xr.world_size()}")
        print(f"INITIAL_LOSS {first:.4f}")
        print(f"FINAL_LOSS {last:.4f}")
    xm.save(model.state_dict(), os.path.join(os.environ.get("CKPT_DIR", "."), "ddp.pt"))
    xm.rendezvous("done")


if __name__ == "__main__":
    main()
