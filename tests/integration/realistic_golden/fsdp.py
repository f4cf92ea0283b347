"""torch_xla FSDP with a size-based auto-wrap policy, started by torchrun with the 'xla' process group."""
import functools

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def synthetic_data(n=512, features=16, classes=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    y = (x @ torch.randn(features, classes, generator=g)).argmax(dim=1)
    return TensorDataset(x, y)


def main():
    dist.init_process_group("neuron")
    device = torch.device("neuron")
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)).to(device)
    policy = functools.partial(size_based_auto_wrap_policy, min_num_params=500)
    model = FSDP(model, auto_wrap_policy=policy)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    dataset = synthetic_data()
    sampler = DistributedSampler(dataset, num_replicas=dist.get_world_size(), rank=dist.get_rank())
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)
    loss_fn = nn.CrossEntropyLoss()
    losses, steps = [], 0
    for epoch in range(3):
        for data, target in loader:
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(data), target)
            loss.backward()
            optimizer.step()  # FSDP reduce-scatters the gradients
            losses.append(loss.item())
            steps += 1
    if dist.get_rank() == 0:
        print(f"INITIAL_LOSS {sum(losses[:4]) / 4:.4f}")
        print(f"FINAL_LOSS {sum(losses[-4:]) / 4:.4f}")
    print(f"STEPS {steps}")


if __name__ == "__main__":
    main()
