"""Single-device training in the style of PyTorch/XLA's test_train_mnist.py run on one core.

Synthetic data stands in for MNIST (nothing is downloaded); the model, loop and logging are the usual ones.
"""
import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def synthetic_data(n=512, features=16, classes=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    y = (x @ torch.randn(features, classes, generator=g)).argmax(dim=1)
    return TensorDataset(x, y)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 64)
        self.fc2 = nn.Linear(64, 4)

    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


def train(flags):
    torch.manual_seed(1)
    device = torch.device("neuron")
    train_loader = DataLoader(synthetic_data(), batch_size=flags.batch_size, shuffle=True)
    model = Net().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=flags.lr, momentum=0.5)
    loss_fn = nn.NLLLoss()
    losses = []
    for epoch in range(1, flags.num_epochs + 1):
        model.train()
        for step, (data, target) in enumerate(train_loader):
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(data), target)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if step % flags.log_steps == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
    torch.save({k: v.cpu() for k, v in model.state_dict().items()}, os.path.join(flags.ckpt_dir, "single_device.pt"))
    print(f"INITIAL_LOSS {sum(losses[:4]) / 4:.4f}")
    print(f"FINAL_LOSS {sum(losses[-4:]) / 4:.4f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--num_epochs", type=int, default=3)
    parser.add_argument("--log_steps", type=int, default=8)
    parser.add_argument("--ckpt_dir", default=os.environ.get("CKPT_DIR", "/tmp"))
    train(parser.parse_args())
