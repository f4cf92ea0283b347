"""A model that prints megabytes (the probe must not block on a full pipe, and must keep the output short)."""
import sys

import torch
from torch import nn


class Noisy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        line = "x" * 1023 + "\n"
        for _ in range(4096):  # 4 MiB on stdout, 1 MiB on stderr
            sys.stdout.write(line)
        sys.stderr.write(line * 1024)
        sys.stdout.flush()
        return self.fc(x)


def make():
    return Noisy(), (torch.randn(2, 4),)
