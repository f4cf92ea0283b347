"""torch_xla.launch with the process group behind a flag (the script only builds one for --ddp), gradients
averaged by xm.optimizer_step: the pattern where a rewrite used to leave every rank training alone."""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.runtime as xr
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def synthetic_data(n=512, features=16, classes=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    y = (x @ torch.randn(features, classes, generator=g)).argmax(dim=1)
    return TensorDataset(x, y)


def _mp_fn(index, flags):
    if flags.ddp:
        dist.init_process_group("xla", init_method="xla://")
    device = torch_xla.device()
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    dataset = synthetic_data()
    sampler = DistributedSampler(dataset, num_replicas=xr.world_size(), rank=xr.global_ordinal())
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)
    loss_fn = nn.CrossEntropyLoss()
    losses, steps = [], 0
    for epoch in range(3):
        for data, target in loader:
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(data), target)
            loss.backward()
            xm.optimizer_step(optimizer)
            losses.append(loss.item())
            steps += 1
        xm.master_print(f"[{index}] epoch {epoch} loss {losses[-1]:.4f}")
    xm.master_print(f"INITIAL_LOSS {sum(losses[:4]) / 4:.4f}")
    xm.master_print(f"FINAL_LOSS {sum(losses[-4:]) / 4:.4f}")
    print(f"STEPS {steps}")
    print(f"PARAMS {sum(p.detach().sum().item() for p in model.parameters()):.6f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--ddp", action="store_true")
    torch_xla.launch(_mp_fn, args=(parser.parse_args(),))
