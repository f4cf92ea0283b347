"""torchrun + init_process_group('xla') + DDP, as PyTorch/XLA's DDP guide and test_train_mp_imagenet.py --ddp do."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def synthetic_data(n=512, features=16, classes=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    y = (x @ torch.randn(features, classes, generator=g)).argmax(dim=1)
    return TensorDataset(x, y)


def main():
    dist.init_process_group("neuron")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = torch.device("neuron")
    torch.manual_seed(rank)  # DDP broadcasts rank 0's weights at construction
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)).to(device)
    model = DDP(model, gradient_as_bucket_view=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    dataset = synthetic_data()
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)
    loss_fn = nn.CrossEntropyLoss()
    losses, steps = [], 0
    for epoch in range(3):
        for data, target in loader:
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(data), target)
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
            steps += 1
        mean_loss = torch.stack(losses[-len(loader):]).mean()
        dist.all_reduce(mean_loss)
        mean_loss *= 1.0 / world_size
        if dist.get_rank() == 0:
            print(f"epoch {epoch} mean loss {mean_loss.item():.4f} (world {world_size})")
    dist.barrier()
    if dist.get_rank() == 0:
        print(f"INITIAL_LOSS {torch.stack(losses[:4]).mean().item():.4f}")
        print(f"FINAL_LOSS {torch.stack(losses[-4:]).mean().item():.4f}")
    print(f"STEPS {steps}")
    print(f"PARAMS {sum(p.detach().sum().item() for p in model.parameters()):.6f}")


if __name__ == "__main__":
    main()
