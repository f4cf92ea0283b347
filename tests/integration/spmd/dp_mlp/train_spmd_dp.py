"""Data-parallel SPMD training in the style of pytorch/xla's examples/train_resnet_spmd_data_parallel.py and the SPMD
user guide: one process drives every device; the input batch is sharded along the "data" axis of a
(num_devices, 1) mesh, so XLA computes the global batch's loss and gradient with the devices splitting the batch.

Writes its per-step losses to $OUT_DIR/rank<R>.json.
"""
import json
import os

import numpy as np
import torch
import torch.nn as nn
import torch_xla.core.xla_model as xm
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr

from config import GLOBAL_BATCH, LR, SEED, STEPS
from model import Net

xr.use_spmd()


def make_loader():
    g = torch.Generator().manual_seed(0)
    data = torch.randn(GLOBAL_BATCH * STEPS, 16, generator=g)
    target = torch.randint(0, 4, (GLOBAL_BATCH * STEPS,), generator=g)
    dataset = torch.utils.data.TensorDataset(data, target)
    return torch.utils.data.DataLoader(dataset, batch_size=GLOBAL_BATCH, shuffle=True, generator=torch.Generator().manual_seed(2))


def train(out_dir):
    torch.manual_seed(SEED)
    num_devices = xr.global_runtime_device_count()
    device_ids = np.array(range(num_devices))
    mesh = xs.Mesh(device_ids, (num_devices, 1), ("data", "model"))

    device = xm.xla_device()
    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    losses = []
    for step, (data, target) in enumerate(make_loader()):
        data, target = data.to(device), target.to(device)
        xs.mark_sharding(data, mesh, ("data", None))
        xs.mark_sharding(target, mesh, ("data",))
        optimizer.zero_grad()
        loss = loss_fn(model(data), target)
        loss.backward()
        optimizer.step()
        xm.mark_step()
        losses.append(loss.item())
        xm.master_print(f"step {step} loss {loss.item():.6f}")

    with open(os.path.join(out_dir, f"rank{xr.process_index()}.json"), "w") as fh:
        json.dump({"world": num_devices, "losses": losses}, fh)


if __name__ == "__main__":
    train(os.environ["OUT_DIR"])
