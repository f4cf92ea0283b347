"""Logging with xm.RateTracker and torch_xla.test.test_utils, as PyTorch/XLA's test_train_mp_* scripts do."""
import torch
import torch.nn as nn
import torch_xla.core.xla_model as xm
import torch_xla.distributed.xla_multiprocessing as xmp
import torch_xla.runtime as xr
import torch_xla.test.test_utils as test_utils
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def synthetic_data(n=512, features=16, classes=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    y = (x @ torch.randn(features, classes, generator=g)).argmax(dim=1)
    return TensorDataset(x, y)


def _train_update(device, step, loss, tracker, epoch):
    test_utils.print_training_update(device, step, loss.item(), tracker.rate(), tracker.global_rate(), epoch)


def _mp_fn(index):
    device = xm.xla_device()
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    dataset = synthetic_data()
    sampler = DistributedSampler(dataset, num_replicas=xr.world_size(), rank=xr.global_ordinal())
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)
    loss_fn = nn.CrossEntropyLoss()
    losses, steps = [], 0
    for epoch in range(3):
        tracker = xm.RateTracker()
        for step, (data, target) in enumerate(loader):
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(data), target)
            loss.backward()
            xm.optimizer_step(optimizer)
            tracker.add(data.shape[0])
            if step % 8 == 0:
                xm.add_step_closure(_train_update, args=(device, step, loss, tracker, epoch))
            losses.append(loss.item())
            steps += 1
        xm.master_print(f"Epoch {epoch} finished at {test_utils.now()}")
    xm.master_print(f"INITIAL_LOSS {sum(losses[:4]) / 4:.4f}")
    xm.master_print(f"FINAL_LOSS {sum(losses[-4:]) / 4:.4f}")
    print(f"STEPS {steps}")
    print(f"PARAMS {sum(p.detach().sum().item() for p in model.parameters()):.6f}")


if __name__ == "__main__":
    xmp.spawn(_mp_fn, args=())
