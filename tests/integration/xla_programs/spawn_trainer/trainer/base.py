"""A reusable trainer for PyTorch/XLA: one process per device, data through MpDeviceLoader, a compiled step."""
import os

import torch
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.distributed.parallel_loader as pl
import torch_xla.runtime as xr
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler


class Trainer:
    """Subclasses define `build_model` and `step_fn` (one optimisation step on a batch on the device)."""

    def __init__(self, flags):
        self.flags = flags
        self.device = torch_xla.device()
        self.world_size = xr.world_size()
        self.rank = xr.global_ordinal()
        torch.manual_seed(flags.seed)  # the same initial weights on every device
        self.model = self.build_model().to(self.device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=flags.lr, momentum=0.9)
        self.compiled_step_fn = torch_xla.compile(self.step_fn, full_graph=True)

    def build_model(self):
        raise NotImplementedError

    def step_fn(self, data, target):
        raise NotImplementedError

    def make_loader(self, dataset):
        sampler = None
        if self.world_size > 1:
            sampler = DistributedSampler(dataset, num_replicas=self.world_size, rank=self.rank, shuffle=True)
        loader = DataLoader(dataset, batch_size=self.flags.batch_size, sampler=sampler, shuffle=sampler is None,
                            drop_last=True)
        return pl.MpDeviceLoader(loader, self.device)

    def train_epoch(self, loader, epoch):
        self.model.train()
        total, count = 0.0, 0
        for step, (data, target) in enumerate(loader):
            loss = self.compiled_step_fn(data, target)
            total += loss.item()
            count += 1
            if step % self.flags.log_steps == 0:
                xm.master_print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
        print(f"rank {self.rank} epoch {epoch} mean loss {total / count:.4f}")

    def save(self, path):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        xm.save(self.model.state_dict(), path)
