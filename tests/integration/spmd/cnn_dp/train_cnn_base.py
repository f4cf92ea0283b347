"""The training loop shared by the CNN examples, in the style of pytorch/xla's examples/train_resnet_base.py: the base
class builds the device loader, the model and its optimizer; a subclass (data_parallel/) decides how the batches are
sharded. Fake data (one fixed batch, as xu.SampleGenerator yields).

Writes each process's per-step losses to $OUT_DIR/rank<R>.json.
"""
from torch_xla import runtime as xr
import torch_xla.utils.utils as xu
import torch_xla.core.xla_model as xm
import torch_xla.distributed.parallel_loader as pl

import json
import os
import time
import itertools

import torch
import torch_xla
import torch.optim as optim
import torch.nn as nn

import config
from cnn_model import SmallCNN


def fake_batch(batch_size, img_dim):
  g = torch.Generator().manual_seed(0)
  return (torch.randn(batch_size, 3, img_dim, img_dim, generator=g),
          torch.randint(0, 10, (batch_size,), generator=g))


class TrainCNNBase():

  def __init__(self):
    self.img_dim = config.IMG_DIM
    self.batch_size = config.BATCH_SIZE
    self.num_steps = config.NUM_STEPS
    self.num_epochs = 1
    self.train_dataset_len = 1200
    train_loader = xu.SampleGenerator(
        data=fake_batch(self.batch_size, self.img_dim),
        sample_count=self.train_dataset_len // self.batch_size //
        xr.world_size())

    torch.manual_seed(config.SEED)
    self.device = torch_xla.device()
    self.train_device_loader = pl.MpDeviceLoader(train_loader, self.device)
    self.model = SmallCNN().to(self.device)
    self.optimizer = optim.SGD(self.model.parameters(), lr=config.LR, momentum=0.9, weight_decay=1e-4)
    self.loss_fn = nn.CrossEntropyLoss()
    self.compiled_step_fn = torch_xla.compile(
        self.step_fn, full_graph=True, name="cnn_step_fn")
    self.losses = []

  def _train_update(self, step, loss, tracker, epoch):
    print(f'epoch: {epoch}, step: {step}, loss: {loss}, rate: {tracker.rate()}')

  def run_optimizer(self):
    self.optimizer.step()

  def step_fn(self, data, target):
    self.optimizer.zero_grad()
    output = self.model(data)
    loss = self.loss_fn(output, target)
    loss.backward()
    self.run_optimizer()
    return loss

  def train_loop_fn(self, loader, epoch):
    tracker = xm.RateTracker()
    self.model.train()
    loader = itertools.islice(loader, self.num_steps)
    for step, (data, target) in enumerate(loader):
      loss = self.compiled_step_fn(data, target)
      self.losses.append(loss.detach())
      tracker.add(self.batch_size)
      xm.add_step_closure(
          self._train_update, args=(step, loss, tracker, epoch))

  def start_training(self):

    for epoch in range(1, self.num_epochs + 1):
      xm.master_print('Epoch {} train begin {}'.format(
          epoch, time.strftime('%l:%M%p %Z on %b %d, %Y')))
      self.train_loop_fn(self.train_device_loader, epoch)
      xm.master_print('Epoch {} train end {}'.format(
          epoch, time.strftime('%l:%M%p %Z on %b %d, %Y')))
    xm.wait_device_ops()
    with open(os.path.join(os.environ["OUT_DIR"], f"rank{xr.process_index()}.json"), "w") as fh:
      json.dump({"world": xr.world_size(), "losses": [loss.item() for loss in self.losses]}, fh)


if __name__ == '__main__':
  base = TrainCNNBase()
  base.start_training()
