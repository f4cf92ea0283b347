"""A small trainer: DDP when there are several processes, autocast, a loss scaler for fp16 on CUDA."""
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .utils import autocast_context


class Trainer:
    def __init__(self, model, cfg, device, rank, world_size):
        self.cfg = cfg
        self.device = device
        self.rank = rank
        self.world_size = world_size
        model = model.to(device)
        if world_size > 1:
            model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        self.model = model
        self.optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
        self.scaler = torch.cuda.amp.GradScaler(enabled=cfg.precision == "fp16" and device.type == "cuda")
        self.loss_fn = nn.CrossEntropyLoss()

    def step(self, x, y):
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        with autocast_context(self.device, self.cfg.precision):
            loss = self.loss_fn(self.model(x), y)
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return loss.detach()

    def fit(self, batches):
        for i, (x, y) in enumerate(batches):
            loss = self.step(x, y)
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            if self.rank == 0 and i % self.cfg.log_every == 0:
                print(f"step {i} loss {loss.item():.4f}")
        return loss.item()
