"""A base trainer with its own entry point (one device), reused by scripts/train_ddp.py for data parallelism."""
import torch
import torch.nn as nn
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.runtime as xr
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from .config import Config


def synthetic_data(cfg):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(cfg.samples, cfg.features, generator=g)
    y = (x @ torch.randn(cfg.features, cfg.classes, generator=g)).argmax(dim=1)
    return TensorDataset(x, y)


class TrainBase:
    def __init__(self, cfg=None):
        self.cfg = cfg or Config()
        torch.manual_seed(self.cfg.seed)
        self.device = torch_xla.device()
        self.world = xr.world_size()
        self.rank = xr.global_ordinal()
        dataset = synthetic_data(self.cfg)
        sampler = DistributedSampler(dataset, num_replicas=self.world, rank=self.rank, shuffle=False)
        self.loader = DataLoader(dataset, batch_size=self.cfg.batch_size, sampler=sampler)
        self.model = nn.Sequential(nn.Linear(self.cfg.features, 64), nn.ReLU(), nn.Linear(64, self.cfg.classes)).to(self.device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=self.cfg.lr)
        self.loss_fn = nn.CrossEntropyLoss()
        self.compiled_step_fn = torch_xla.compile(self.step_fn, full_graph=True)

    def step_fn(self, data, target):
        self.optimizer.zero_grad()
        loss = self.loss_fn(self.model(data), target)
        loss.backward()
        self.optimizer.step()
        return loss

    def start_training(self):
        print(f"WORLD {self.world} RANK {self.rank}")
        losses, steps = [], 0
        for epoch in range(self.cfg.epochs):
            xm.master_print(f"epoch {epoch} begins")
            for data, target in self.loader:
                loss = self.compiled_step_fn(data.to(self.device), target.to(self.device))
                torch_xla.sync()
                losses.append(loss.item())
                steps += 1
        xm.master_print(f"INITIAL_LOSS {sum(losses[:4]) / 4:.4f}")
        xm.master_print(f"FINAL_LOSS {sum(losses[-4:]) / 4:.4f}")
        print(f"STEPS {steps}")
        print(f"PARAMS {sum(p.detach().sum().item() for p in self.model.parameters()):.6f}")


if __name__ == "__main__":
    TrainBase().start_training()
