"""Synthetic data and a small model shared by the example scripts."""
import torch
from torch import nn
from torch.utils.data import TensorDataset


def make_dataset(n=512, features=16, classes=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    w = torch.randn(features, classes, generator=g)
    y = (x @ w).argmax(dim=1)
    return TensorDataset(x, y)


class MLP(nn.Module):
    def __init__(self, features=16, hidden=64, classes=4):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, classes))

    def forward(self, x):
        return self.net(x)


def parity_model(batch=32, seed=0):
    """The model and one batch, for `neuron-migrate probe common.py:parity_model --save-reference/--compare`."""
    torch.manual_seed(seed)
    x, _ = make_dataset(n=batch, seed=seed).tensors
    return MLP(), x
