"""A plain training script, probed by path: `neuron-migrate probe train_script.py -- --steps 5 --lr 0.01`."""
import argparse

import torch
from torch import nn


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    for _ in range(args.steps):
        pred = model(x)
        loss = nn.functional.mse_loss(pred, y)  # PROBE: loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
