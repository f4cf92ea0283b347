"""xmp.spawn with the module-level SERIAL_EXEC / WRAPPED_MODEL of the old TPU Colab notebooks and fastai scripts."""
import torch
import torch.nn as nn
import torch_xla.core.xla_model as xm
import torch_xla.distributed.xla_multiprocessing as xmp

torch.manual_seed(1234)  # every process builds the same WRAPPED_MODEL
SERIAL_EXEC = xmp.MpSerialExecutor()
WRAPPED_MODEL = xmp.MpModelWrapper(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)))

import time  # noqa: E402  (late import, as in the notebooks these scripts came from)
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402


def get_dataset():
    time.sleep(0.01)  # stands in for a download that must not run in two processes at once
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 16, generator=g)
    y = (x @ torch.randn(16, 4, generator=g)).argmax(dim=1)
    return TensorDataset(x, y)


def _mp_fn(rank, flags):
    torch.manual_seed(1)
    dataset = SERIAL_EXEC.run(get_dataset)
    sampler = DistributedSampler(dataset, num_replicas=xm.xrt_world_size(), rank=xm.get_ordinal(), shuffle=True)
    loader = DataLoader(dataset, batch_size=flags["batch_size"], sampler=sampler)
    device = xm.xla_device()
    model = WRAPPED_MODEL.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=flags["lr"])
    loss_fn = nn.CrossEntropyLoss()
    losses, steps = [], 0
    for epoch in range(flags["epochs"]):
        for data, target in loader:
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(data), target)
            loss.backward()
            xm.optimizer_step(optimizer)
            losses.append(loss.item())
            steps += 1
    xm.master_print(f"INITIAL_LOSS {sum(losses[:4]) / 4:.4f}")
    xm.master_print(f"FINAL_LOSS {sum(losses[-4:]) / 4:.4f}")
    print(f"STEPS {steps}")
    print(f"PARAMS {sum(p.detach().sum().item() for p in model.parameters()):.6f}")


if __name__ == "__main__":
    FLAGS = {"batch_size": 16, "lr": 0.05, "epochs": 3}
    xmp.spawn(_mp_fn, args=(FLAGS,), nprocs=8, start_method="spawn")
