"""torchrun + init_process_group('xla'); DDP only with --ddp, otherwise xm.optimizer_step averages the
gradients (the ImageNet example's structure): the rewrite must keep the average on the plain path."""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch_xla.core.xla_model as xm
import torch_xla.distributed.xla_backend  # noqa: F401
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def synthetic_data(n=512, features=16, classes=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    y = (x @ torch.randn(features, classes, generator=g)).argmax(dim=1)
    return TensorDataset(x, y)


def train_loop(model, optimizer, loader, device, epochs):
    loss_fn = nn.CrossEntropyLoss()
    losses, steps = [], 0
    for epoch in range(epochs):
        for data, target in loader:
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(data), target)
            loss.backward()
            xm.optimizer_step(optimizer)
            losses.append(loss.item())
            steps += 1
    return losses, steps


def main(args):
    dist.init_process_group("xla", init_method="xla://")
    device = xm.xla_device()
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)).to(device)
    if args.ddp:
        model = DDP(model, gradient_as_bucket_view=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    dataset = synthetic_data()
    sampler = DistributedSampler(dataset, num_replicas=xm.xrt_world_size(), rank=xm.get_ordinal())
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)
    losses, steps = train_loop(model, optimizer, loader, device, args.epochs)
    xm.master_print(f"INITIAL_LOSS {sum(losses[:4]) / 4:.4f}")
    xm.master_print(f"FINAL_LOSS {sum(losses[-4:]) / 4:.4f}")
    print(f"STEPS {steps}")
    print(f"PARAMS {sum(p.detach().sum().item() for p in model.parameters()):.6f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--ddp", action="store_true")
    parser.add_argument("--epochs", type=int, default=3)
    main(parser.parse_args())
