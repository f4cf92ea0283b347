"""Logging with xm.RateTracker and torch_xla.test.test_utils, as PyTorch/XLA's test_train_mp_* scripts do."""
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
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


def _train_update(device, step, loss, rate, epoch):
    print(f"[{device}]({step}) Loss={loss.item():.5f} Rate={rate:.2f} Epoch={epoch} Time={time.asctime()}", flush=True)


def _mp_fn(index):
    device = torch.device("neuron")
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    dataset = synthetic_data()
    sampler = DistributedSampler(dataset, num_replicas=dist.get_world_size(), rank=dist.get_rank())
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)
    loss_fn = nn.CrossEntropyLoss()
    losses, steps = [], 0
    for epoch in range(3):
        start, seen = time.time(), 0
        for step, (data, target) in enumerate(loader):
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(data), target)
            loss.backward()
            average_gradients(optimizer)
            optimizer.step()
            seen += data.shape[0]
            if step % 8 == 0:
                _train_update(device, step, loss, seen / (time.time() - start), epoch)
            losses.append(loss.item())
            steps += 1
        if dist.get_rank() == 0:
            print(f"Epoch {epoch} finished at {time.strftime('%H:%M:%S')}")
    if dist.get_rank() == 0:
        print(f"INITIAL_LOSS {sum(losses[:4]) / 4:.4f}")
        print(f"FINAL_LOSS {sum(losses[-4:]) / 4:.4f}")
    print(f"STEPS {steps}")
    print(f"PARAMS {sum(p.detach().sum().item() for p in model.parameters()):.6f}")


if __name__ == "__main__":
    if "WORLD_SIZE" in os.environ:  # started by torchrun
        dist.init_process_group("neuron")
    else:  # run without torchrun: a group of one process
        dist.init_process_group("neuron", store=dist.HashStore(), rank=0, world_size=1)
    _mp_fn(dist.get_rank())
    dist.destroy_process_group()
