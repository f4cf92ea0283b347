import torch


class AverageMeter:
    """Computes and stores the average and current value"""

    def __init__(self, name):
        self.name = name
        self.sum = 0.0
        self.count = 0

    def update(self, val, n=1):
        self.sum += val * n
        self.count += n

    @property
    def avg(self):
        return self.sum / max(self.count, 1)


def accuracy(output, target):
    with torch.no_grad():
        return (output.argmax(dim=1) == target).float().mean().item() * 100.0


def synthetic_images(n, seed):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(10, 3, 8, 8, generator=g)
    labels = torch.randint(0, 10, (n,), generator=g)
    images = centers[labels] + 0.5 * torch.randn(n, 3, 8, 8, generator=g)
    return torch.utils.data.TensorDataset(images, labels)
