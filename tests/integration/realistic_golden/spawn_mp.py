"""Multi-core training in the style of PyTorch/XLA's test_train_mp_mnist.py: xmp.spawn, a DistributedSampler
sharded by the XLA ordinal, MpDeviceLoader, xm.optimizer_step to average gradients, mesh_reduce for the metric."""
import argparse
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def average_gradients(optimizer):
    """Average the gradients over all processes (xm.optimizer_step did this before stepping)."""
    world_size = dist.get_world_size()
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= world_size


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
    sampler = DistributedSampler(dataset, num_replicas=dist.get_world_size(), rank=dist.get_rank(), shuffle=True)
    train_loader = DataLoader(dataset, batch_size=flags.batch_size, sampler=sampler, drop_last=True)
    device = torch.device("neuron")
    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=flags.lr * dist.get_world_size(), momentum=0.5)
    loss_fn = nn.NLLLoss()
    losses = []
    steps = 0
    for epoch in range(1, flags.num_epochs + 1):
        sampler.set_epoch(epoch)
        for step, (data, target) in enumerate(train_loader):
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(data), target)
            loss.backward()
            average_gradients(optimizer)
            optimizer.step()
            losses.append(loss.item())
            steps += 1
        if dist.get_rank() == 0:
            print(f"epoch {epoch} loss {losses[-1]:.4f}")
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (sum(losses[:4]) / 4, sum(losses[-4:]) / 4))
    first, last = np.mean(gathered, axis=0)
    if dist.get_rank() == 0:
        print(f"INITIAL_LOSS {first:.4f}")
        print(f"FINAL_LOSS {last:.4f}")
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
    if "WORLD_SIZE" in os.environ:  # started by torchrun
        dist.init_process_group("neuron")
    else:  # run without torchrun: a group of one process
        dist.init_process_group("neuron", store=dist.HashStore(), rank=0, world_size=1)
    _mp_fn(dist.get_rank(), FLAGS)
    dist.destroy_process_group()
