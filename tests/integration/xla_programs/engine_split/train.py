# Entry script: builds the data, the model and the device loaders, and hands the loaders to engine.py's loops.
import torch
import torch_xla.core.xla_model as xm
import torch_xla.distributed.parallel_loader as pl
import torch_xla.distributed.xla_multiprocessing as xmp
import torch_xla.runtime as xr

from config import Config
from engine import evaluate, train_one_epoch
from model import Net


def _dataset(cfg, seed):
    g = torch.Generator().manual_seed(seed)
    data = torch.randn(cfg.samples, 16, generator=g)
    return torch.utils.data.TensorDataset(data, data[:, :4].argmax(1))


def _mp_fn(index, cfg):
    device = xm.xla_device()
    train_set = _dataset(cfg, 1)
    sampler = torch.utils.data.distributed.DistributedSampler(
        train_set, num_replicas=xr.world_size(), rank=xr.global_ordinal(), shuffle=False)
    train_dl = torch.utils.data.DataLoader(train_set, batch_size=cfg.batch_size, sampler=sampler)
    eval_dl = torch.utils.data.DataLoader(_dataset(cfg, 2), batch_size=cfg.batch_size)
    torch.manual_seed(xr.global_ordinal() + 7)  # a different initialisation on each rank: the broadcast aligns them
    model = Net().to(device)
    xm.broadcast_master_param(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    train_loader = pl.MpDeviceLoader(train_dl, device)
    eval_loader = pl.MpDeviceLoader(eval_dl, device)
    for epoch in range(cfg.epochs):
        train_one_epoch(model, train_loader, optimizer, epoch)
    correct = evaluate(model, eval_loader)
    xm.master_print(f"accuracy {correct / cfg.samples:.3f}")
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    print(f"rank {xr.global_ordinal()} world {xr.world_size()} device {next(model.parameters()).device.type} "
          f"checksum {checksum:.6f}", flush=True)


if __name__ == "__main__":
    xmp.spawn(_mp_fn, args=(Config(),))
