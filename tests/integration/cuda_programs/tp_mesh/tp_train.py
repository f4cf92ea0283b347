"""Tensor parallelism on a two-layer MLP with DTensor (Megatron style: the first Linear split by columns, the second
by rows), in the shape of pytorch/examples' tensor_parallel_example.py: a device mesh over every rank started by
torchrun, the model moved to "cuda", inputs made on "cuda" with the same seed on every rank."""
import os
import sys

import torch
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from log_utils import get_logger, rank_log, verify_min_gpu_count

if not verify_min_gpu_count(min_gpus=2):
    print("Unable to locate 2 gpus to run this example. Exiting.")
    sys.exit()


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.in_proj = nn.Linear(10, 32)
        self.relu = nn.ReLU()
        self.out_proj = nn.Linear(32, 5)

    def forward(self, x):
        return self.out_proj(self.relu(self.in_proj(x)))


logger = get_logger()
world_size = int(os.environ["WORLD_SIZE"])
device_mesh = init_device_mesh(device_type="cuda", mesh_shape=(world_size,))
rank = device_mesh.get_rank()

torch.manual_seed(0)
tp_model = ToyModel().to("cuda")
tp_model = parallelize_module(module=tp_model, device_mesh=device_mesh,
                              parallelize_plan={"in_proj": ColwiseParallel(), "out_proj": RowwiseParallel()})
# built after the sharding, as pytorch/examples' tensor_parallel_example.py does: parallelize_module replaces the
# parameters, and an optimizer built before would step the old ones (NM166)
optimizer = torch.optim.AdamW(tp_model.parameters(), lr=0.05, foreach=True)

target = torch.zeros(20, 5, device="cuda")
losses = []
for i in range(10):
    torch.manual_seed(i)  # every rank of the mesh must see the same input
    inp = torch.rand(20, 10, device="cuda")
    loss = ((tp_model(inp) - target) ** 2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    losses.append(loss.item())
    rank_log(rank, logger, f"iter {i} loss {loss.item():.4f}")

shard = tp_model.in_proj.weight.to_local()
print(f"rank {rank} device {shard.device.type} shard {tuple(shard.shape)} first {losses[0]:.4f} last {losses[-1]:.4f}")
