"""The training loop shared by the decoder-only examples, in the style of pytorch/xla's
examples/train_decoder_only_base.py: a subclass decides how the model and the batches are sharded. The token data
is the same for any batch size (batch_size * num_steps sequences from one seed).

Writes each process's per-step losses to $OUT_DIR/rank<R>.json.
"""
import json
import os

import torch
import torch.nn as nn
import torch_xla.core.xla_model as xm
import torch_xla.distributed.parallel_loader as pl
import torch_xla.runtime as xr

import decoder_only_model


class TrainDecoderOnlyBase:

    def __init__(self, batch_size=2):
        torch.manual_seed(1)
        self.config = decoder_only_model.DecoderOnlyConfig()
        self.batch_size = batch_size  # per device
        self.seq_len = 16
        self.num_steps = 6
        self.device = xm.xla_device()
        self.train_loader = self.make_loader(self.batch_size)
        self.train_device_loader = pl.MpDeviceLoader(self.train_loader, self.device)
        self.model = decoder_only_model.DecoderOnlyModel(self.config).to(self.device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.loss_fn = nn.CrossEntropyLoss()

    def make_loader(self, batch_size):
        g = torch.Generator().manual_seed(0)
        tokens = torch.randint(0, self.config.vocab_size, (batch_size * self.num_steps, self.seq_len + 1), generator=g)
        dataset = torch.utils.data.TensorDataset(tokens[:, :-1], tokens[:, 1:])
        return torch.utils.data.DataLoader(dataset, batch_size=batch_size)

    def step_fn(self, data, target):
        self.optimizer.zero_grad()
        logits = self.model(data)
        loss = self.loss_fn(logits.view(-1, self.config.vocab_size), target.reshape(-1))
        loss.backward()
        self.optimizer.step()
        return loss

    def start_training(self):
        self.model.train()
        losses = []
        for step, (data, target) in enumerate(self.train_device_loader):
            loss = self.step_fn(data, target)
            xm.mark_step()
            losses.append(loss.item())
            xm.master_print(f"step {step} loss {loss.item():.6f}")
        with open(os.path.join(os.environ["OUT_DIR"], f"rank{xr.process_index()}.json"), "w") as fh:
            json.dump({"world": xr.world_size(), "losses": losses}, fh)
