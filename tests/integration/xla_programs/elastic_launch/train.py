# The launch of pytorch/xla's test/test_train_mp_imagenet.py: under torchrun the script calls the worker itself and
# torch_xla's runtime joins the processes (a process group is started only for --ddp); otherwise xmp.spawn starts them.
import args_parse

FLAGS = args_parse.parse_common_options()

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torch_xla
import torch_xla.core.xla_env_vars as xenv
import torch_xla.core.xla_model as xm
import torch_xla.distributed.parallel_loader as pl
import torch_xla.distributed.xla_multiprocessing as xmp
import torch_xla.runtime as xr
import torch_xla.utils.utils as xu
from torch.nn.parallel import DistributedDataParallel as DDP

from model import Net


def train(flags):
    if flags.ddp:
        dist.init_process_group("xla", init_method="xla://")
    torch.manual_seed(1)
    data = torch.randn(128, 16)
    labels = (data[:, :4].argmax(1)).long()
    dataset = torch.utils.data.TensorDataset(data, labels)
    sampler = torch.utils.data.distributed.DistributedSampler(
        dataset, num_replicas=xr.world_size(), rank=xr.global_ordinal(), shuffle=False)
    loader = torch.utils.data.DataLoader(dataset, batch_size=flags.batch_size, sampler=sampler)
    device = xm.xla_device()
    torch.manual_seed(xr.global_ordinal() + 7)  # a different initialisation on each rank: the broadcast aligns them
    model = Net().to(device)
    # Initialization is nondeterministic with multiple threads in PjRt.
    # Synchronize model parameters across replicas manually.
    if xr.using_pjrt():
        xm.broadcast_master_param(model)
    if flags.ddp:
        model = DDP(model, gradient_as_bucket_view=True, broadcast_buffers=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=flags.lr)
    train_loader = pl.MpDeviceLoader(loader, device)
    for epoch in range(flags.num_epochs):
        total = 0.0
        for step, (x, y) in enumerate(train_loader):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            if flags.ddp:
                optimizer.step()
            else:
                xm.optimizer_step(optimizer)
            total += loss.item()
        xm.master_print(f"epoch {epoch} loss {total:.4f}")
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    print(f"rank {xr.global_ordinal()} world {xr.world_size()} device {next(model.parameters()).device.type} "
          f"checksum {checksum:.6f}", flush=True)


def _mp_fn(index, flags):
    torch.set_default_dtype(torch.float32)
    train(flags)


if __name__ == "__main__":
    if dist.is_torchelastic_launched():
        _mp_fn(xu.getenv_as(xenv.LOCAL_RANK, int), FLAGS)
    else:
        xmp.spawn(_mp_fn, args=(FLAGS,), nprocs=FLAGS.num_cores)
