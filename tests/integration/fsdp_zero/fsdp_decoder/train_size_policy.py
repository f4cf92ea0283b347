"""train_fsdp.py with a size-based auto-wrap policy (min_num_params=6000): XLA FSDP wraps the embedding, the LM head,
the MLP projections inside each decoder layer and then each layer around them (nested units), then the model.

Each rank writes its per-step losses to $OUT_DIR/rank<R>.json.
"""
import functools
import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torch_xla.core.xla_model as xm
import torch_xla.runtime as xr
from torch_xla.distributed.fsdp import XlaFullyShardedDataParallel as FSDP
from torch_xla.distributed.fsdp.wrap import size_based_auto_wrap_policy

from model import VOCAB, Decoder

GLOBAL_BATCH = 8
STEPS = 5


def make_dataset():
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (GLOBAL_BATCH * STEPS, 17), generator=g)
    return torch.utils.data.TensorDataset(tokens)


def train(out_dir):
    torch.manual_seed(1)
    dataset = make_dataset()
    sampler = torch.utils.data.distributed.DistributedSampler(
        dataset, num_replicas=xr.world_size(), rank=xr.global_ordinal(), shuffle=False)
    loader = torch.utils.data.DataLoader(dataset, batch_size=GLOBAL_BATCH // xr.world_size(), sampler=sampler)

    device = xm.xla_device()
    model = Decoder().to(device)
    model = FSDP(model, auto_wrap_policy=functools.partial(size_based_auto_wrap_policy, min_num_params=6000))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    losses = []
    for (tokens,) in loader:
        tokens = tokens.to(device)
        optimizer.zero_grad()
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())

    with open(os.path.join(out_dir, f"rank{xr.global_ordinal()}.json"), "w") as fh:
        json.dump({"world": xr.world_size(), "losses": losses}, fh)


def main():
    dist.init_process_group("xla", init_method="xla://")
    train(os.environ["OUT_DIR"])


if __name__ == "__main__":
    main()
