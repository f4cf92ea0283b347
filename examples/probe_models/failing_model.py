"""A model whose forward raises (the probe must report the error, the line and exit 2)."""
import torch
from torch import nn


class Failing(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = torch.relu(self.fc(x))
        raise ValueError("shape mismatch in user code")  # PROBE: raise


def make():
    return Failing(), (torch.randn(2, 4),)
