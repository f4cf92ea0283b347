"""XLA FSDP with per-rank sharded checkpoints, as torch_xla's test_train_mp_mnist_fsdp_with_ckpt.py saves them: each
rank writes its own shard of the model and optimizer (`model.state_dict()`, `xm.save(..., master_only=False)`), and
a fresh run loads it back. Trained twice: 5 steps straight, and 3 steps, checkpoint, a new model and optimizer that
load the checkpoint, 2 more steps; with the state restored the two give the same losses.

Each rank writes both runs' per-step losses to $OUT_DIR/rank<R>.json.
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
from torch_xla.distributed.fsdp.wrap import transformer_auto_wrap_policy

from model import VOCAB, Block, Decoder

GLOBAL_BATCH = 8
STEPS = 5


def make_batches():
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (GLOBAL_BATCH * STEPS, 17), generator=g)
    per_rank = GLOBAL_BATCH // xr.world_size()
    return [tokens[s * GLOBAL_BATCH:(s + 1) * GLOBAL_BATCH][xr.global_ordinal() * per_rank:][:per_rank]
            for s in range(STEPS)]


def build(device, seed):
    torch.manual_seed(seed)
    model = Decoder().to(device)
    auto_wrap_policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
    model = FSDP(model, auto_wrap_policy=auto_wrap_policy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, optimizer


def step(model, optimizer, tokens):
    optimizer.zero_grad()
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    loss.backward()
    optimizer.step()
    return loss.item()


def train(out_dir):
    device = xm.xla_device()
    batches = [b.to(device) for b in make_batches()]
    model, optimizer = build(device, 1)
    straight = [step(model, optimizer, b) for b in batches]

    model, optimizer = build(device, 1)
    resumed = [step(model, optimizer, b) for b in batches[:3]]
    ckpt = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    path = os.path.join(out_dir, f"ckpt_rank{xr.global_ordinal()}.pt")
    xm.save(ckpt, path, master_only=False)
    model, optimizer = build(device, 2)  # another start: everything comes from the checkpoint
    ckpt = torch.load(path)
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    resumed += [step(model, optimizer, b) for b in batches[3:]]

    with open(os.path.join(out_dir, f"rank{xr.global_ordinal()}.json"), "w") as fh:
        json.dump({"world": xr.world_size(), "losses": straight, "resumed": resumed}, fh)


def main():
    dist.init_process_group("xla", init_method="xla://")
    train(os.environ["OUT_DIR"])


if __name__ == "__main__":
    main()
