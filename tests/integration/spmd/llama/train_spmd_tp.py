"""Tensor-parallel SPMD training of a Llama-like decoder, in the style of pytorch/xla's SPMD user guide and its
decoder-only examples: one process drives every device; a ("data", "model") mesh of shape (1, num_devices); the
attention and MLP projections are sharded over the "model" axis by annotation (q/k/v, gate/up by output rows,
o/down by input columns), the LM head by vocabulary rows. XLA computes the same values as the unsharded model.

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


def main(out_dir):
    xr.use_spmd()
    torch.manual_seed(SEED)
    num_devices = xr.global_runtime_device_count()
    mesh = xs.Mesh(np.arange(num_devices), (1, num_devices), ("data", "model"))

    device = xm.xla_device()
    model = LlamaLike().to(device)
    for layer in model.layers:
        xs.mark_sharding(layer.q_proj.weight, mesh, ("model", None))
        xs.mark_sharding(layer.k_proj.weight, mesh, ("model", None))
        xs.mark_sharding(layer.v_proj.weight, mesh, ("model", None))
        xs.mark_sharding(layer.o_proj.weight, mesh, (None, "model"))
        xs.mark_sharding(layer.gate_proj.weight, mesh, ("model", None))
        xs.mark_sharding(layer.up_proj.weight, mesh, ("model", None))
        xs.mark_sharding(layer.down_proj.weight, mesh, (None, "model"))
    xs.mark_sharding(model.lm_head.weight, mesh, ("model", None))
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)

    g = torch.Generator().manual_seed(0)
    losses = []
    for step in range(STEPS):
        tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g).to(device)
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
