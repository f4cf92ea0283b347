"""FSDPv2 (SPMD fully sharded data parallel) training of the Llama-like decoder, in the style of pytorch/xla's
examples/fsdp/train_decoder_only_fsdp_v2.py: one process drives every device; a (num_devices, 1) ("fsdp", "model")
mesh set as the global mesh; the model wrapped by SpmdFullyShardedDataParallel (parameters sharded along the
"fsdp" axis); each batch of token sequences sharded along "fsdp" by annotation.

Writes its per-step losses to $OUT_DIR/rank<R>.json.
"""
import json
import os

import numpy as np
import torch
import torch.nn.functional as F
import torch_xla.core.xla_model as xm
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr

from config import BATCH, LR, SEED, SEQ, STEPS, VOCAB
from model import LlamaLike
from torch_xla.experimental.spmd_fully_sharded_data_parallel import (
    SpmdFullyShardedDataParallel as FSDPv2,
)


def main(out_dir):
    xr.use_spmd()
    torch.manual_seed(SEED)
    num_devices = xr.global_runtime_device_count()
    mesh_shape = (num_devices, 1)
    device_ids = np.array(range(num_devices))
    mesh = xs.Mesh(device_ids, mesh_shape, ("fsdp", "model"))
    xs.set_global_mesh(mesh)

    device = xm.xla_device()
    model = LlamaLike().to(device)
    model = FSDPv2(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)

    g = torch.Generator().manual_seed(0)
    losses = []
    for step in range(STEPS):
        tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g).to(device)
        xs.mark_sharding(tokens, mesh, ("fsdp", None))
        optimizer.zero_grad()
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        xm.mark_step()
        losses.append(loss.item())
        xm.master_print(f"step {step} loss {loss.item():.6f}")

    with open(os.path.join(out_dir, f"rank{xr.process_index()}.json"), "w") as fh:
        json.dump({"world": num_devices, "losses": losses}, fh)


if __name__ == "__main__":
    main(os.environ["OUT_DIR"])
