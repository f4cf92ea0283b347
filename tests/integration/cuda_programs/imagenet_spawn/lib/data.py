import torch
from torch.utils.data import Dataset


class FakeImages(Dataset):
    """Ten classes of noisy 8x8 images around fixed centres (ImageNet's folder reader, without the disk)."""

    def __init__(self, n, seed=0):
        centers = torch.randn(10, 3, 8, 8, generator=torch.Generator().manual_seed(0))  # the same classes in every split
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, 10, (n,), generator=g)
        self.images = centers[self.labels] + 0.5 * torch.randn(n, 3, 8, 8, generator=g)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i], self.labels[i]
