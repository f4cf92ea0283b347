import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, 1)
        self.conv2 = nn.Conv2d(8, 16, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.fc1 = nn.Linear(16 * 5 * 5, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        return F.log_softmax(self.fc2(x), dim=1)


def synthetic_digits(n, seed=0):
    """Ten fixed random 14x14 patterns plus noise: a dataset a small CNN learns in a few steps."""
    g = torch.Generator().manual_seed(seed)
    patterns = torch.randn(10, 1, 14, 14, generator=g)
    labels = torch.randint(0, 10, (n,), generator=g)
    images = patterns[labels] + 0.3 * torch.randn(n, 1, 14, 14, generator=g)
    return torch.utils.data.TensorDataset(images, labels)
