"""A model that never returns (the probe must time out, kill it and exit 2)."""
import time

import torch
from torch import nn


class Hangs(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        while True:  # PROBE: hang
            time.sleep(0.05)
        return h


def make():
    return Hangs(), (torch.randn(2, 4),)
