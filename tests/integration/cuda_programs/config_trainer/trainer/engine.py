"""The trainer: starts the process group from the config, moves the model to the config's device."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Trainer:
    def __init__(self, cfg, args):
        self.cfg = cfg
        self.distributed = "RANK" in os.environ  # started by torchrun
        if self.distributed:
            if args.dist_backend == "nccl":
                assert dist.is_nccl_available(), "NCCL is not available"
            dist.init_process_group(backend=cfg.backend)
            self.rank, self.world = dist.get_rank(), dist.get_world_size()
        else:
            self.rank, self.world = 0, 1
        self.device = torch.device(cfg.device)
        self.device_type = "cuda" if "cuda" in cfg.device else "cpu"
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1)).to(self.device)
        self.model = DDP(model) if self.distributed else model
        self.opt = torch.optim.SGD(self.model.parameters(), lr=cfg.lr)

    def batch(self, step):
        g = torch.Generator().manual_seed(1000 * step + self.rank)  # each rank its own shard of the data
        x = torch.randn(self.cfg.batch_size, 8, generator=g)
        y = x.sum(dim=1, keepdim=True)
        return x.to(self.device), y.to(self.device)

    def fit(self):
        for step in range(self.cfg.steps):
            x, y = self.batch(step)
            with torch.autocast(device_type=self.device_type, dtype=torch.bfloat16):
                out = self.model(x)
            loss = nn.functional.mse_loss(out.float(), y)
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            if self.rank == 0:
                print(f"rank 0 step {step} loss {loss.item():.4f}")
        checksum = sum(p.detach().double().sum().item() for p in self.model.parameters())
        print(f"rank {self.rank} world {self.world} device {self.device.type} steps {self.cfg.steps} "
              f"checksum {checksum:.6f}")
        if self.distributed:
            dist.destroy_process_group()
