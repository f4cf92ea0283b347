"""xmp.spawn with the module-level SERIAL_EXEC / WRAPPED_MODEL of the old TPU Colab notebooks and fastai scripts."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn

torch.manual_seed(1234)  # every process builds the same WRAPPED_MODEL
WRAPPED_MODEL = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))

import time  # noqa: E402  (late import, as in the notebooks these scripts came from)
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402


def average_gradients(optimizer):
    """Average the gradients over all processes (xm.optimizer_step did this before stepping)."""
    world_size = dist.get_world_size()
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= world_size


def get_dataset():
    time.sleep(0.01)  # stands in for a download that must not run in two processes at once
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 16, generator=g)
    y = (x @ torch.randn(16, 4, generator=g)).argmax(dim=1)
    return TensorDataset(x, y)


def _mp_fn(rank, flags):
    torch.manual_seed(1)
    for turn in range(int(os.environ.get("LOCAL_WORLD_SIZE", 1))):  # one process of this host at a time
        if dist.get_node_local_rank(fallback_rank=0) == turn:
            dataset = get_dataset()
        dist.barrier()
    sampler = DistributedSampler(dataset, num_replicas=dist.get_world_size(), rank=dist.get_rank(), shuffle=True)
    loader = DataLoader(dataset, batch_size=flags["batch_size"], sampler=sampler)
    device = torch.device("neuron")
    model = WRAPPED_MODEL.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=flags["lr"])
    loss_fn = nn.CrossEntropyLoss()
    losses, steps = [], 0
    for epoch in range(flags["epochs"]):
        for data, target in loader:
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(data), target)
            loss.backward()
            average_gradients(optimizer)
            optimizer.step()
            losses.append(loss.item())
            steps += 1
    if dist.get_rank() == 0:
        print(f"INITIAL_LOSS {sum(losses[:4]) / 4:.4f}")
        print(f"FINAL_LOSS {sum(losses[-4:]) / 4:.4f}")
    print(f"STEPS {steps}")
    print(f"PARAMS {sum(p.detach().sum().item() for p in model.parameters()):.6f}")


if __name__ == "__main__":
    FLAGS = {"batch_size": 16, "lr": 0.05, "epochs": 3}
    if "WORLD_SIZE" in os.environ:  # started by torchrun
        dist.init_process_group("neuron")
    else:  # run without torchrun: a group of one process
        dist.init_process_group("neuron", store=dist.HashStore(), rank=0, world_size=1)
    _mp_fn(dist.get_rank(), FLAGS)
    dist.destroy_process_group()
