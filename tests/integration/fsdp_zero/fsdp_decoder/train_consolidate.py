"""XLA FSDP checkpoints as torch_xla's test_train_mp_mnist_fsdp_with_ckpt.py writes them: after training, each rank
saves its shard with its shard metadata, and the master consolidates the shards into one full model checkpoint
($OUT_DIR/ckpt_consolidated.pth, {"model": full state dict}).
"""
import functools
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torch_xla.core.xla_model as xm
import torch_xla.runtime as xr
from torch_xla.distributed.fsdp import XlaFullyShardedDataParallel as FSDP
from torch_xla.distributed.fsdp import consolidate_sharded_model_checkpoints
from torch_xla.distributed.fsdp.wrap import transformer_auto_wrap_policy

from model import VOCAB, Block, Decoder

GLOBAL_BATCH = 8
STEPS = 3


def train(out_dir):
    device = xm.xla_device()
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (GLOBAL_BATCH * STEPS, 17), generator=g)
    per_rank = GLOBAL_BATCH // xr.world_size()
    torch.manual_seed(1)
    model = Decoder().to(device)
    auto_wrap_policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
    model = FSDP(model, auto_wrap_policy=auto_wrap_policy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for s in range(STEPS):
        batch = tokens[s * GLOBAL_BATCH:(s + 1) * GLOBAL_BATCH][xr.global_ordinal() * per_rank:][:per_rank].to(device)
        optimizer.zero_grad()
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()

    prefix = os.path.join(out_dir, "ckpt")
    ckpt = {
        "model": model.state_dict(),
        "shard_metadata": model.get_shard_metadata(),
        "optimizer": optimizer.state_dict(),
    }
    xm.save(ckpt, f"{prefix}_rank-{xr.global_ordinal():08d}-of-{xr.world_size():08d}.pth", master_only=False)
    xm.rendezvous("ckpt_consolidation")
    if xm.is_master_ordinal(local=False):
        consolidate_sharded_model_checkpoints(ckpt_prefix=prefix, ckpt_suffix="_rank-*-of-*.pth")


def main():
    dist.init_process_group("xla", init_method="xla://")
    train(os.environ["OUT_DIR"])


if __name__ == "__main__":
    main()
