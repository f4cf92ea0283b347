"""pytorch/xla test_train_mp_*-style leftovers the issues saw: a try/except ImportError around the torch_xla imports,
xm.master_print inside an existing rank guard, and a metrics report printed behind a flag (issue 36 point 7)."""
import argparse

import torch
import torch.nn as nn

try:
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met
    import torch_xla.distributed.parallel_loader as pl
    import torch_xla.runtime as xr
except ImportError:
    raise ModuleNotFoundError("This example needs PyTorch XLA: install PyTorch XLA first")

parser = argparse.ArgumentParser()
parser.add_argument("--metrics_debug", action="store_true")
FLAGS = parser.parse_args()


def train():
    device = torch_xla.device()
    model = nn.Linear(4, 2).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    is_root = xr.global_ordinal() == 0
    for step in range(4):
        x = torch.randn(8, 4, device=device)
        loss = model(x).sum()
        opt.zero_grad()
        loss.backward()
        xm.optimizer_step(opt)
        if is_root:
            xm.master_print(f"step {step} loss {loss.item()}")
        if xm.is_master_ordinal():
            xm.master_print("checkpoint")
    if FLAGS.metrics_debug:
        xm.master_print(met.metrics_report())


def _mp_fn(index):
    train()


if __name__ == "__main__":
    torch_xla.launch(_mp_fn, args=())
