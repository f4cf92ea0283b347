import torch


def forward(x):
    return torch.relu(x) + 1
