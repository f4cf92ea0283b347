"""Issue 41's check of ZeRO-1, written for torch_xla: two one-element parameters from 0, gradient 1 on rank 0 and 2
on rank 1, SGD lr 1, one step. torch_xla's ZeroRedundancyOptimizer averages the gradients inside step(), so both
ranks end at [-1.5, -1.5]; torch's alone would give [-1, -2]. Each rank writes its parameters to
$OUT_DIR/rank<R>.json. Clipping is off (torch_xla clips at max_norm=1.0 by default).
"""
import json
import os

import torch
import torch.distributed as dist
import torch_xla.core.xla_model as xm
import torch_xla.runtime as xr
from torch_xla.distributed.zero_redundancy_optimizer import ZeroRedundancyOptimizer


class Two(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.zeros(1))
        self.b = torch.nn.Parameter(torch.zeros(1))

    def forward(self, scale):
        return (self.a + self.b).sum() * scale


def main():
    dist.init_process_group("xla", init_method="xla://")
    device = xm.xla_device()
    rank = xr.global_ordinal()
    model = Two().to(device)
    opt = ZeroRedundancyOptimizer(model.parameters(), torch.optim.SGD, lr=1.0, grad_clipping=False, pin_layout=False)
    model(torch.tensor(float(rank + 1), device=device)).backward()  # d/da = d/db = rank + 1
    opt.step()
    with open(os.path.join(os.environ["OUT_DIR"], f"rank{rank}.json"), "w") as fh:
        json.dump([p.item() for p in model.parameters()], fh)


if __name__ == "__main__":
    main()
