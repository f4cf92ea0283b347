"""torch_xla FSDP with a size-based auto-wrap policy, started by torchrun with the 'xla' process group."""
import functools

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def wrapped_by_policy(model, policy):
    """fully_shard has no auto_wrap_policy: the submodules XLA FSDP's recursive wrap gave their own unit, inner
    ones first (the policy sees a module's parameters, then those its wrapped children left)."""
    found = []

    def walk(module, top):
        total = sum(p.numel() for p in module.parameters())
        if not policy(module=module, recurse=True, nonwrapped_numel=total):
            return 0
        inner = sum(walk(child, False) for child in module.children())
        if top or not policy(module=module, recurse=False, nonwrapped_numel=total - inner):
            return inner
        found.append(module)
        return total

    walk(model, True)
    return found


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
    for block in wrapped_by_policy(model, policy):
        fully_shard(block)
    fully_shard(model)
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
