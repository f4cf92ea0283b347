import torch.nn as nn
import torch.nn.functional as F

__all__ = ['SmallNet']


class SmallNet(nn.Module):
    def __init__(self, num_classes=10):
        super(SmallNet, self).__init__()
        self.conv = nn.Conv2d(3, 16, kernel_size=3, padding=1)
        self.linear = nn.Linear(16 * 8 * 8, num_classes)

    def forward(self, x):
        out = F.relu(self.conv(x))
        out = out.flatten(1)
        return self.linear(out)
