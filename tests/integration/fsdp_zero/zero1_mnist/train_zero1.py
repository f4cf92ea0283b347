"""ZeRO-1 training in the style of torch_xla's test/test_train_mp_mnist_zero1.py, started by torchrun (torch_xla's
`xla://` init): a fixed synthetic data set split over the ranks by DistributedSampler, a global batch of 16 cut
into per-rank batches, torch_xla's ZeroRedundancyOptimizer with its gradient clipping (on by default) at max_norm=0.25.

Each rank writes its per-step losses and final parameters to $OUT_DIR/rank<R>.json.
"""
import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
import torch_xla.core.xla_model as xm
import torch_xla.distributed.parallel_loader as pl
import torch_xla.runtime as xr
from torch_xla.distributed.zero_redundancy_optimizer import ZeroRedundancyOptimizer

from model import MNIST

GLOBAL_BATCH = 16
STEPS = 6


def make_dataset():
    g = torch.Generator().manual_seed(0)
    images = torch.randn(GLOBAL_BATCH * STEPS, 1, 16, 16, generator=g)
    labels = torch.randint(0, 10, (GLOBAL_BATCH * STEPS,), generator=g)
    return torch.utils.data.TensorDataset(images, labels)


def train(out_dir):
    torch.manual_seed(1)
    dataset = make_dataset()
    sampler = torch.utils.data.distributed.DistributedSampler(
        dataset, num_replicas=xr.world_size(), rank=xr.global_ordinal(), shuffle=False)
    loader = torch.utils.data.DataLoader(dataset, batch_size=GLOBAL_BATCH // xr.world_size(), sampler=sampler)

    device = xm.xla_device()
    model = MNIST().to(device)
    optimizer = ZeroRedundancyOptimizer(
        model.parameters(),
        optim.SGD,
        lr=0.5,
        momentum=0.5,
        max_norm=0.25,  # below the gradients' norm (about 0.6): every step is clipped
        pin_layout=False)
    loss_fn = nn.NLLLoss()

    losses = []
    device_loader = pl.MpDeviceLoader(loader, device)
    model.train()
    for data, target in device_loader:
        optimizer.zero_grad()
        output = model(data)
        loss = loss_fn(output, target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())

    params = [p.detach().cpu().flatten().tolist() for p in model.parameters()]
    with open(os.path.join(out_dir, f"rank{xr.global_ordinal()}.json"), "w") as fh:
        json.dump({"world": xr.world_size(), "losses": losses, "params": params}, fh)


def main():
    dist.init_process_group("xla", init_method="xla://")
    train(os.environ["OUT_DIR"])


if __name__ == "__main__":
    main()
