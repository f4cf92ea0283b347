"""python train.py [--steps N] [--device cuda|cpu|auto]; torchrun --nproc_per_node=N train.py for data parallelism."""
import torch
import torch.distributed as dist
import torch.nn as nn

from mylib.config import TrainConfig
from mylib.trainer import Trainer
from mylib.utils import get_device, setup_distributed


def batches(cfg, rank, world_size):
    g = torch.Generator().manual_seed(1234)
    w = torch.randn(20, 5, generator=g)
    for step in range(cfg.steps):
        x = torch.randn(cfg.batch_size * world_size, 20, generator=g)
        y = (x @ w).argmax(dim=1)
        yield x[rank::world_size], y[rank::world_size]  # this rank's shard of the global batch


def main():
    cfg = TrainConfig.from_args()
    rank, world_size = setup_distributed(cfg.dist_backend)
    device = get_device(cfg.device)
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank
    model = nn.Sequential(nn.Linear(20, 64), nn.GELU(), nn.Linear(64, 5))
    trainer = Trainer(model, cfg, device, rank, world_size)
    final = trainer.fit(batches(cfg, rank, world_size))
    checksum = sum(float(p.detach().float().sum().item()) for p in trainer.model.parameters())
    print(f"rank {rank} world {world_size} device {device.type} final {final:.4f} checksum {checksum:.6f}")
    if world_size > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
