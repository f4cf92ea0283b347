"""Multi-core training in the style of PyTorch/XLA's test_train_mp_mnist.py: xmp.spawn, a DistributedSampler
sharded by the XLA ordinal, MpDeviceLoader, xm.optimizer_step to average gradients, mesh_reduce for the metric."""
import argparse
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch_xla.core.xla_model as xm
import torch_xla.distributed.parallel_loader as pl
import torch_xla.distributed.xla_multiprocessing as xmp
import torch_xla.runtime as xr
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def synthetic_data(n=512, features=16, classes=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    y = (x @ torch.randn(features, classes, generator=g)).argmax(dim=1)
    return TensorDataset(x, y)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 64)
        self.fc2 = nn.Linear(64, 4)

    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


def train_mnist(flags):
    torch.manual_seed(1)
    dataset = synthetic_data()
    sampler = DistributedSampler(dataset, num_replicas=xr.world_size(), rank=xr.global_ordinal(), shuffle=True)
    train_loader = DataLoader(dataset, batch_size=flags.batch_size, sampler=sampler, drop_last=True)
    device = xm.xla_device()
    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=flags.lr * xr.world_size(), momentum=0.5)
    loss_fn = nn.NLLLoss()
    train_device_loader = pl.MpDeviceLoader(train_loader, device)
    losses = []
    steps = 0
    for epoch in range(1, flags.num_epochs + 1):
        sampler.set_epoch(epoch)
        for step, (data, target) in enumerate(train_device_loader):
            optimizer.zero_grad()
            loss = loss_fn(model(data), target)
            loss.backward()
            xm.optimizer_step(optimizer)
            losses.append(loss.item())
            steps += 1
        xm.master_print(f"epoch {epoch} loss {losses[-1]:.4f}")
    first = xm.mesh_reduce("first_loss", sum(losses[:4]) / 4, np.mean)
    last = xm.mesh_reduce("last_loss", sum(losses[-4:]) / 4, np.mean)
    xm.master_print(f"INITIAL_LOSS {first:.4f}")
    xm.master_print(f"FINAL_LOSS {last:.4f}")
    print(f"STEPS {steps}")
    print(f"PARAMS {sum(p.detach().sum().item() for p in model.parameters()):.6f}")


def _mp_fn(index, flags):
    torch.set_default_dtype(torch.float32)
    train_mnist(flags)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.03)
    parser.add_argument("--num_epochs", type=int, default=3)
    FLAGS = parser.parse_args()
    xmp.spawn(_mp_fn, args=(FLAGS,), nprocs=None)
