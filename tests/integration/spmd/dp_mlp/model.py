"""A small classifier for the data-parallel SPMD program."""
import torch.nn as nn


class Net(nn.Module):
    def __init__(self, features=16, hidden=32, classes=4):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(features, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.head(self.body(x))
