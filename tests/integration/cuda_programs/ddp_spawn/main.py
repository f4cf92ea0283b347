"""The DDP tutorial's basic use case: the script spawns one worker per GPU itself."""
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP

from toy import ToyModel


def setup(rank, world_size):
    os.environ['MASTER_ADDR'] = 'localhost'
    os.environ.setdefault('MASTER_PORT', '12355')
    # initialize the process group
    dist.init_process_group("nccl", rank=rank, world_size=world_size)


def cleanup():
    dist.destroy_process_group()


def demo_basic(rank, world_size):
    print(f"Running basic DDP example on rank {rank}.")
    setup(rank, world_size)
    torch.manual_seed(0)  # the same initial weights on every rank

    # create model and move it to GPU with id rank
    model = ToyModel().to(rank)
    ddp_model = DDP(model, device_ids=[rank])

    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.05)
    torch.manual_seed(100 + rank)  # each rank its own data
    target = torch.linspace(-1, 1, 5)
    for step in range(30):
        optimizer.zero_grad()
        outputs = ddp_model(torch.randn(20, 10))  # DDP moves the input to device_ids[0]
        labels = target.expand(20, 5).to(rank)
        loss = loss_fn(outputs, labels)
        loss.backward()
        optimizer.step()
        if step % 10 == 0 or step == 29:
            print(f"rank {rank} step {step} loss {loss.item():.4f}")
    checksum = sum(float(p.detach().sum().item()) for p in ddp_model.parameters())
    device = next(ddp_model.parameters()).device.type
    print(f"rank {rank} world {dist.get_world_size()} device {device} checksum {checksum:.6f}")

    # the tutorial's checkpoint demo: rank 0 saves, every rank loads it onto its own GPU
    CHECKPOINT_PATH = os.path.join(os.getcwd(), "model.checkpoint")
    if rank == 0:
        torch.save(ddp_model.state_dict(), CHECKPOINT_PATH)
    dist.barrier()
    map_location = {'cuda:%d' % 0: 'cuda:%d' % rank}
    ddp_model.load_state_dict(torch.load(CHECKPOINT_PATH, map_location=map_location, weights_only=True))
    reloaded = sum(float(p.detach().sum().item()) for p in ddp_model.parameters())
    print(f"rank {rank} reloaded on {next(ddp_model.parameters()).device} checksum {reloaded:.6f}")
    cleanup()


def run_demo(demo_fn, world_size):
    mp.spawn(demo_fn, args=(world_size,), nprocs=world_size, join=True)


if __name__ == "__main__":
    n_gpus = torch.cuda.device_count()
    assert n_gpus >= 1, f"Requires at least 1 GPU to run, but got {n_gpus}"
    world_size = n_gpus
    run_demo(demo_basic, world_size)
