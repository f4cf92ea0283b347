"""A model that calls os._exit mid-forward (the probe must report the exit and what it gathered)."""
import os

import torch
from torch import nn


class Exits(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = torch.atan2(self.fc(x), x)
        os._exit(3)  # PROBE: exit
        return h


def make():
    return Exits(), (torch.randn(2, 4),)
