"""A clean MLP: no CPU fallback and no float64 expected."""
import torch
from torch import nn


def make():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    return model, (torch.randn(16, 32),)


def make_model_only():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))


def inputs():
    return torch.randn(4, 32)
