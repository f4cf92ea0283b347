"""A synthetic stand-in for CIFAR-10: each class brightens one of ten fixed 3x8x8 patterns (learnable in a few epochs)."""
import torch
from torch.utils.data import DataLoader, TensorDataset


def _split(n, generator, patterns):
    labels = torch.randint(0, 10, (n,), generator=generator)
    images = 0.3 * torch.randn(n, 3, 8, 8, generator=generator) + patterns[labels]
    return TensorDataset(images, labels)


def make_loaders():
    g = torch.Generator().manual_seed(0)
    patterns = torch.randn(10, 3, 8, 8, generator=g)
    trainset = _split(512, g, patterns)
    testset = _split(256, g, patterns)
    trainloader = DataLoader(trainset, batch_size=64, shuffle=True, num_workers=0, generator=g)
    testloader = DataLoader(testset, batch_size=128, shuffle=False, num_workers=0)
    return trainloader, testloader
