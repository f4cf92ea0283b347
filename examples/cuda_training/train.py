"""A typical CUDA data-parallel training script (the input of `neuron-migrate rewrite`).

Launch on GPUs:  torchrun --nproc_per_node=8 train.py --steps 200
It uses what most CUDA scripts use: DDP over NCCL, float16 autocast with a GradScaler,
torch.compile(mode="max-autotune"), cuDNN benchmark mode, per-rank CUDA devices and memory statistics.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class MLP(nn.Module):
    def __init__(self, d_in=16, d_hidden=64, d_out=1):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_hidden)
        self.head = nn.Linear(d_hidden, d_out)

    def forward(self, x):
        x = F.gelu(self.fc1(x))
        x = F.gelu(self.fc2(x))
        return self.head(x)


def make_data(n=512, d_in=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d_in, generator=g)
    w = torch.randn(d_in, 1, generator=g)
    y = torch.tanh(x @ w / 4) + 0.01 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    os.environ.setdefault("NCCL_DEBUG", "WARN")
    dist.init_process_group(backend="nccl")
    rank = dist.get_rank()
    world_size = dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))

    torch.cuda.set_device(local_rank)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.seed)
    torch.cuda.manual_seed_all(args.seed)
    torch.backends.cudnn.benchmark = True

    model = MLP().cuda()
    model = DDP(model, device_ids=[local_rank], output_device=local_rank)
    model = torch.compile(model, mode="max-autotune")
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scaler = torch.cuda.amp.GradScaler()

    data = make_data(seed=args.seed)
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, drop_last=True)

    step = 0
    start = time.time()
    while step < args.steps:
        sampler.set_epoch(step)
        for x, y in loader:
            x = x.to("cuda", non_blocking=True)
            y = y.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            with torch.cuda.amp.autocast(dtype=torch.bfloat16):
                loss = F.mse_loss(model(x).float(), y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()

            step += 1
            if step % 10 == 0 or step == 1:
                reduced = loss.detach().clone()
                dist.all_reduce(reduced)
                torch.cuda.synchronize()
                if rank == 0:
                    mem = torch.cuda.max_memory_allocated() / 2**20
                    print(f"step {step} loss {reduced.item() / world_size:.4f} mem {mem:.1f}MiB", flush=True)
            if step >= args.steps:
                break

    if rank == 0:
        print(f"done {step} steps in {time.time() - start:.1f}s on {x.device.type} (is_cuda={x.is_cuda})", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
