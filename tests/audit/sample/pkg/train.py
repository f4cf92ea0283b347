import numpy as np
import torch
import torch.distributed as dist
import torch_xla.core.xla_model as xm


def train(model, loader, optimizer, rank):
    device = xm.xla_device()
    model = model.to(device)
    model = torch.compile(model, dynamic=True)
    stats = torch.from_numpy(np.random.rand(4))
    for batch in loader:
        loss = model(batch.to(torch.float64)).sum()
        loss.backward()
        optimizer.step()
        xm.mark_step()
    q, r = torch.linalg.qr(stats.view(2, 2))  # noqa: NM310
    if rank == 0:
        dist.barrier()
    return q, r  # neuron-migrate: ignore[NM101]
