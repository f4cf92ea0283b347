# The training and evaluation loops, in a module of their own: the entry script hands them its device loaders
# (the layout of DeiT/MAE-style engine.py files, ported to XLA).
import torch
import torch.nn.functional as F
import torch_xla.core.xla_model as xm


def train_one_epoch(model, loader, optimizer, epoch):
    model.train()
    total = 0.0
    for step, (x, y) in enumerate(loader):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        xm.optimizer_step(optimizer)
        total += loss.item()
    xm.master_print(f"epoch {epoch} loss {total / len(loader):.4f}")


@torch.no_grad()
def evaluate(model, loader):
    model.eval()
    correct = 0
    for x, y in loader:
        correct += (model(x).argmax(1) == y).sum().item()
    return correct
