"""Single-device training in the classic PyTorch/XLA style."""
import argparse

import torch
import torch_xla.core.xla_model as xm
import torch_xla.distributed.parallel_loader as pl
from torch import nn
from torch.utils.data import DataLoader

from common import MLP, make_dataset


def train(args):
    device = xm.xla_device()
    model = MLP().to(device)
    loader = DataLoader(make_dataset(), batch_size=args.batch_size, shuffle=True)
    train_loader = pl.MpDeviceLoader(loader, device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    losses = []
    for epoch in range(args.epochs):
        for step, (data, target) in enumerate(train_loader):
            optimizer.zero_grad()
            loss = loss_fn(model(data), target)
            loss.backward()
            xm.optimizer_step(optimizer)
            losses.append(loss.item())
        xm.master_print(f"epoch {epoch} loss {losses[-1]:.4f}")
    xm.master_print(f"INITIAL_LOSS {sum(losses[:5]) / 5:.4f}")
    xm.master_print(f"FINAL_LOSS {sum(losses[-5:]) / 5:.4f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    train(parser.parse_args())
