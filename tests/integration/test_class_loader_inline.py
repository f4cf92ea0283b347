"""Issue 36 point 3: a trainer class that wraps its loader in one method and iterates it in another gets no inserted
helpers when no subclass can override those methods (the repository model says no other file imports the class):
the batch is moved where the loop unpacks it and the rate is timed inline. A subclass in another file that overrides
none of those methods (pytorch/xla's train_resnet_ddp.py extends only __init__) changes nothing; one that overrides
`train_loop_fn` (and may expect device batches), or a file that reads the loader attribute, keeps the helpers.

The rewritten trainer is run with the test-only `neuron` stand-in (tests/integration/neuron_on_cpu: neuron -> cpu).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from neuron_migrate.cli.app import app
from test_cuda_programs import _env, emulator  # noqa: F401 (a fixture)

SHIM = Path(__file__).resolve().parent / "neuron_on_cpu"

TRAINER = '''\
import itertools
import time

import torch
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.distributed.parallel_loader as pl
import torch_xla.utils.utils as xu


class Trainer:

  def __init__(self):
    self.batch_size = 8
    self.num_steps = 30
    torch.manual_seed(0)
    x = torch.randn(self.batch_size, 4)
    train_loader = xu.SampleGenerator(data=(x, (x.sum(-1) > 0).long()), sample_count=40)
    self.device = torch_xla.device()
    self.train_device_loader = pl.MpDeviceLoader(train_loader, self.device)
    self.model = torch.nn.Linear(4, 2).to(self.device)
    self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.5)
    self.losses = []

  def _train_update(self, step, loss, tracker, epoch):
    print(f"epoch: {epoch}, step: {step}, loss: {loss.item():.4f}, rate: {tracker.rate():.1f}")

  def train_loop_fn(self, loader, epoch):
    tracker = xm.RateTracker()
    loader = itertools.islice(loader, self.num_steps)
    for step, (data, target) in enumerate(loader):
      self.optimizer.zero_grad()
      loss = torch.nn.functional.cross_entropy(self.model(data), target)
      loss.backward()
      self.optimizer.step()
      self.losses.append(loss.item())
      tracker.add(self.batch_size)
      if step % 10 == 0:
        xm.add_step_closure(self._train_update, args=(step, loss, tracker, epoch))

  def start_training(self):
    for epoch in range(1, 3):
      self.train_loop_fn(self.train_device_loader, epoch)
    print("batches:", len(self.train_device_loader), "first", self.losses[0], "last", self.losses[-1])
    assert self.losses[-1] < self.losses[0] * 0.5, self.losses


if __name__ == "__main__":
  Trainer().start_training()
'''

SUBCLASS = '''\
from trainer import Trainer

import torch_xla.core.xla_model as xm


class QuietTrainer(Trainer):

  def train_loop_fn(self, loader, epoch):
    for data, target in loader:
      self.model(data)
'''


# pytorch/xla's examples/data_parallel/train_resnet_ddp.py: the subclass only extends __init__ (a process group, DDP)
EXTENDS_INIT = '''\
from trainer import Trainer

import torch


class TunedTrainer(Trainer):

  def __init__(self):
    super().__init__()
    self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.25)


if __name__ == "__main__":
  TunedTrainer().start_training()
'''

# pytorch/xla's examples/fsdp/train_decoder_only_fsdp_v2.py: the subclass gives the attribute another device loader
STORES_LOADER = '''\
import torch
import torch_xla.distributed.parallel_loader as pl
import torch_xla.utils.utils as xu

from trainer import Trainer


class SmallBatchTrainer(Trainer):

  def __init__(self):
    super().__init__()
    self.batch_size = 4
    x = torch.randn(self.batch_size, 4)
    small = xu.SampleGenerator(data=(x, (x.sum(-1) > 0).long()), sample_count=40)
    self.train_device_loader = pl.MpDeviceLoader(small, self.device)


if __name__ == "__main__":
  SmallBatchTrainer().start_training()
'''

READS_LOADER = '''\
from trainer import Trainer

for data, target in Trainer().train_device_loader:
  assert data.device.type != "cpu"
'''


def _rewrite(root: Path) -> None:
    r = CliRunner().invoke(app, ["rewrite", "--write", "--unsafe-fixes", "--no-cache", str(root)], catch_exceptions=False)
    assert r.exit_code in (0, 1), r.output


def _repo(tmp_path: Path, files: dict) -> Path:
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return tmp_path


def test_closed_trainer_gets_no_helpers_and_trains(tmp_path):
    pytest.importorskip("torch")
    root = _repo(tmp_path, {"trainer.py": TRAINER})
    _rewrite(root)
    out = (root / "trainer.py").read_text()
    assert "torch_xla" not in out
    for helper in ("_batch_to_device", "_DeviceLoader", "_RateTracker"):
        assert helper not in out, out
    assert "self.train_device_loader = train_loader" in out
    assert "data, target = data.to(self.device), target.to(self.device)" in out
    assert "tracker.seen / (time.time() - tracker.start)" in out
    env = {**os.environ, "PYTHONPATH": str(SHIM), "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "trainer.py"], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "batches: 40" in p.stdout and "rate:" in p.stdout


def test_subclass_that_only_extends_init_gets_no_helpers_and_trains(tmp_path):
    """Issue 36 point 3 on pytorch/xla's layout: another file subclasses the trainer but overrides none of the methods
    that use the loader or the tracker, and touches neither attribute: the base module gets no inserted helper, and
    both programs (the base's own and the subclass's) train."""
    pytest.importorskip("torch")
    root = _repo(tmp_path, {"trainer.py": TRAINER, "tuned.py": EXTENDS_INIT})
    _rewrite(root)
    out = (root / "trainer.py").read_text()
    for helper in ("_batch_to_device", "_DeviceLoader", "_RateTracker"):
        assert helper not in out, out
    assert "self.train_device_loader = train_loader" in out
    assert "data, target = data.to(self.device), target.to(self.device)" in out
    env = {**os.environ, "PYTHONPATH": str(SHIM), "OMP_NUM_THREADS": "1"}
    for script in ("trainer.py", "tuned.py"):
        p = subprocess.run([sys.executable, script], cwd=root, env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stdout + p.stderr
        assert "batches: 40" in p.stdout and "rate:" in p.stdout


def test_subclass_that_stores_another_device_loader_leaves_the_base_plain(tmp_path, emulator):  # noqa: F811
    """The subclass's own MpDeviceLoader keeps its wrapper in its file (its batches arrive on the device), the base's
    loop moves each batch again (a no-op there) and its own loader is the plain one: the base module gets no helper.
    Both programs train on the emulated `neuron` device, where a batch left on the CPU would fail the step."""
    root = _repo(tmp_path, {"trainer.py": TRAINER, "small.py": STORES_LOADER})
    _rewrite(root)
    out = (root / "trainer.py").read_text()
    for helper in ("_batch_to_device", "_DeviceLoader"):
        assert helper not in out, out
    assert "self.train_device_loader = train_loader" in out
    assert "self.train_device_loader = _DeviceLoader(small, self.device)" in (root / "small.py").read_text()
    for script in ("trainer.py", "small.py"):
        p = subprocess.run([sys.executable, script], cwd=root, env=_env(), capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stdout + p.stderr
        assert "batches: 40" in p.stdout


@pytest.mark.parametrize("other", [SUBCLASS, READS_LOADER], ids=["overrides-loop", "reads-loader"])
def test_trainer_imported_elsewhere_keeps_its_loader_object(tmp_path, other):
    """A subclass iterates the loader without moving batches, or a script iterates the attribute itself: the batches
    must still arrive on the device."""
    root = _repo(tmp_path, {"trainer.py": TRAINER, "other.py": other})
    _rewrite(root)
    out = (root / "trainer.py").read_text()
    assert "self.train_device_loader = _DeviceLoader(train_loader, self.device)" in out, out
    if other is SUBCLASS:  # it overrides train_loop_fn: the rate stays the smoothed one, which its caller may expect
        assert "tracker.seen" not in out
