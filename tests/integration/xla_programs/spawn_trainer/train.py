"""Entry point: python train.py --epochs 3 (one process per XLA device, through xmp.spawn)."""
import argparse

import torch
import torch_xla.core.xla_model as xm
import torch_xla.distributed.xla_multiprocessing as xmp
from torch.utils.data import TensorDataset

from tasks.classify import ClassifyTrainer


def get_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--log_steps", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default="out/model.pt")
    return parser.parse_args()


def synthetic(n=512):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 16, generator=g)
    y = (x @ torch.randn(16, 4, generator=g)).argmax(dim=1)
    return TensorDataset(x, y)


def _mp_fn(index, flags):
    trainer = ClassifyTrainer(flags)
    loader = trainer.make_loader(synthetic())
    for epoch in range(flags.epochs):
        trainer.train_epoch(loader, epoch)
    trainer.save(flags.out)
    checksum = sum(float(p.detach().sum().item()) for p in trainer.model.parameters())
    print(f"rank {trainer.rank} world {trainer.world_size} device {trainer.device.type} checksum {checksum:.6f}")
    xm.master_print("saved", flags.out)


if __name__ == "__main__":
    xmp.spawn(_mp_fn, args=(get_args(),))
