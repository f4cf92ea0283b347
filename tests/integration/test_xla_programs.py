"""torch_xla training programs as people write them, rewritten with the real CLI and trained on the emulated `neuron`
device (`neuron_emulated/sitecustomize.py`) in one process and in two under torchrun.

- `xla_programs/spawn_trainer/`: a reusable trainer package (`trainer/base.py`: `torch_xla.device()`, `xr.world_size()`,
  `xr.global_ordinal()`, a DistributedSampler, `pl.MpDeviceLoader`, `xm.master_print`, `xm.save`, and
  `self.compiled_step_fn = torch_xla.compile(self.step_fn, full_graph=True)` of an abstract `step_fn`), a task module
  that subclasses it (`tasks/classify.py`: the training step, with `xm.optimizer_step`), and the entry script
  (`train.py`: argparse, `xmp.spawn(_mp_fn, args=(flags,))`). Judged alone, base.py compiles a `step_fn` that only
  raises, and does not know that a process group exists where its methods run; the repository model tells it that
  the override is a training step (so `fullgraph` is left out: it would raise at the first step) and that every
  program running it starts through xmp.spawn (so its ranks and rank-0 guards are plain `torch.distributed` calls,
  not helpers that test for a group).
- `xla_programs/hf_trainer_fixup/`: the Hugging Face Trainer as AWS's torch-neuronx samples use it on XLA (train.py:
  `init_process_group("xla")` under torchrun and the "Fixup to enable distributed training with XLA" that patches
  `Trainer._wrap_model`; data.py: the dataset). The fixup goes (NM163); the Trainer then trains on the emulated device
  under torchrun with DDP. Slow, and only where accelerate is installed (the Trainer needs it; it is not a dependency
  here); transformers finds the neuron device through a clearly labelled stand-in `torch_neuronx` package
  (`hf_neuronx_standin/`), since the emulated device ships none.
- `xla_programs/elastic_launch/`: the launch of pytorch/xla's test/test_train_mp_imagenet.py (train.py: `if
  dist.is_torchelastic_launched(): _mp_fn(xu.getenv_as(xenv.LOCAL_RANK, int), FLAGS) else: xmp.spawn(...)`, a
  process group only behind --ddp, `if xr.using_pjrt(): xm.broadcast_master_param(model)`, xm.optimizer_step;
  args_parse.py: the options; model.py). Under torchrun torch_xla's runtime, not a process group, joined the
  processes: the rewrite starts torchrun's group in that branch too, or the migrated gradient average would find
  no group and do nothing (each rank then trained alone, silently).
- `xla_programs/engine_split/`: the entry script (train.py: xmp.spawn, a DistributedSampler, `xm.broadcast_master_param`,
  two `pl.MpDeviceLoader`s) hands its loaders to the loops of another module (engine.py: `train_one_epoch` with
  xm.optimizer_step and `len(loader)`, an `@torch.no_grad()` `evaluate`); config.py holds the settings, model.py the
  net. The repository model finds every call of those functions handing them a device loader, so the entry passes the
  plain DataLoaders and engine.py's loops move each batch, with no inserted loader class.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_cuda_programs import REPO, _cli, _env, _final, _groups, emulator  # noqa: F401 (a fixture)
from torchrun_util import run_torchrun

PROGRAMS = Path(__file__).resolve().parent / "xla_programs"


def _rewrite(tmp_path: Path, name: str, edits: dict = None, extra: dict = None) -> tuple[Path, str]:
    """The program copied and rewritten; `edits`: {file: (old text, new text) or a list of them} applied to the copy
    first; `extra`: {file: text} added to it."""
    work = tmp_path / name
    shutil.copytree(PROGRAMS / name, work, ignore=shutil.ignore_patterns("__pycache__"))
    for rel, text in (extra or {}).items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(text)
    for rel, pairs in (edits or {}).items():
        text = (work / rel).read_text()
        for old, new in [pairs] if isinstance(pairs[0], str) else pairs:
            assert old in text
            text = text.replace(old, new)
        (work / rel).write_text(text)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([*_cli(), "rewrite", str(work), "--write", "--unsafe-fixes", "--jobs", "1", "--no-cache"],
                          capture_output=True, text=True, timeout=180, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode in (0, 1) and "internal error" not in out and "rewritten" in out, out
    return work, out


def test_spawn_trainer_rewrite(tmp_path):
    work, out = _rewrite(tmp_path, "spawn_trainer")
    base = (work / "trainer/base.py").read_text()
    # the compiled method is the subclass's training step: fullgraph would refuse its backward()
    assert 'self.compiled_step_fn = torch.compile(self.step_fn, backend="neuron")\n' in base
    assert "`step_fn` (the override in tasks/classify.py) calls zero_grad()/backward()/step()" in out
    # xmp.spawn's rewrite starts the group before the worker runs: the base module's methods run inside it
    assert "self.world_size = dist.get_world_size()\n        self.rank = dist.get_rank()\n" in base
    assert '                if dist.get_rank() == 0:\n                    print(f"epoch {epoch}' in base
    assert "_neuron_rank" not in base and "_neuron_master_print" not in base and "_neuron_save" not in base
    assert "torch_xla" not in base + (work / "tasks/classify.py").read_text() + (work / "train.py").read_text()
    assert "manual migration" not in out
    # make_loader's MpDeviceLoader reaches only train_epoch (train.py: `trainer.train_epoch(loader, epoch)`): the
    # plain DataLoader is returned and the batch is moved where train_epoch unpacks it, with no inserted helper
    assert "        return loader\n" in base
    assert ("        for step, (data, target) in enumerate(loader):\n"
            "            data, target = data.to(self.device), target.to(self.device)\n") in base
    assert "_DeviceLoader" not in base and "_batch_to_device" not in base


LOOP_IN_ENTRY = ("        trainer.train_epoch(loader, epoch)\n",
                 "        trainer.train_epoch(loader, epoch)\n        for data, _target in loader:\n"
                 "            assert data.device == trainer.device\n")


@pytest.mark.parametrize("edits", [
    {"train.py": LOOP_IN_ENTRY},  # the entry script iterates the returned loader itself
    {"tasks/classify.py": ("    def step_fn(", "    def train_epoch(self, loader, epoch):\n"
                                               "        return super().train_epoch(loader, epoch)\n\n    def step_fn(")}])
def test_spawn_trainer_loader_the_rewrite_cannot_follow_keeps_its_wrapper(tmp_path, edits):
    """Where the returned loader is iterated outside the class, or a subclass overrides the method that iterates it,
    the batches must still arrive on the device: make_loader returns `_DeviceLoader(loader, self.device)`."""
    work, _ = _rewrite(tmp_path, "spawn_trainer", edits)
    base = (work / "trainer/base.py").read_text()
    assert "        return _DeviceLoader(loader, self.device)\n" in base, base
    assert "data.to(self.device)" not in base


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
def test_spawn_trainer_trains_under_torchrun(tmp_path, emulator, nproc):  # noqa: F811
    work, _ = _rewrite(tmp_path, "spawn_trainer")
    logs = tmp_path / "collectives"
    proc = run_torchrun(["train.py", "--epochs", "2"], nproc=nproc, cwd=work, env=_env(logs), timeout=400)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    _final(out, rf"rank (?P<rank>\d) world {nproc} device neuron checksum (?P<checksum>-?[0-9]+\.[0-9]{{6}})", nproc)
    first = [float(x) for x in re.findall(r"rank \d epoch 0 mean loss ([0-9.]+)", out)]
    last = [float(x) for x in re.findall(r"rank \d epoch 1 mean loss ([0-9.]+)", out)]
    assert len(first) == len(last) == nproc and max(last) < min(first), out[-3000:]
    assert out.count("saved out/model.pt") == 1 and (work / "out/model.pt").exists()  # rank 0 writes, once
    logs_ = _groups_allreduce(logs, nproc)
    assert all(g["counts"].get("barrier", 0) >= 1 for g in logs_)  # xm.save's wait for the writer


# the loop already moves the batch itself (a no-op under MpDeviceLoader, kept in many scripts)
MOVED_IN_LOOP = {"trainer/base.py": (
    "        for step, (data, target) in enumerate(loader):\n",
    "        for step, (data, target) in enumerate(loader):\n"
    "            data, target = data.to(self.device), target.to(self.device)\n")}


def test_loop_that_moves_its_batch_gets_no_second_move(tmp_path):
    work, _ = _rewrite(tmp_path, "spawn_trainer", MOVED_IN_LOOP)
    base = (work / "trainer/base.py").read_text()
    assert "        return loader\n" in base
    assert base.count("data, target = data.to(self.device), target.to(self.device)\n") == 1, base


@pytest.mark.slow
def test_loop_that_moves_its_batch_trains_in_two_processes(tmp_path, emulator):  # noqa: F811
    work, _ = _rewrite(tmp_path, "spawn_trainer", MOVED_IN_LOOP)
    logs = tmp_path / "collectives"
    proc = run_torchrun(["train.py", "--epochs", "1"], nproc=2, cwd=work, env=_env(logs), timeout=400)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    _final(out, r"rank (?P<rank>\d) world 2 device neuron checksum (?P<checksum>-?[0-9]+\.[0-9]{6})", 2)
    _groups_allreduce(logs, 2)


# AWS's DDP sample with xmp.spawn (torch-neuronx/training/ddp) has the worker call a setup() that reads the ordinal
# and world size from torch_xla, then starts the group itself, unguarded
SETUP_INIT = {"train.py": [
    ("from torch.utils.data import TensorDataset\n",
     "import torch.distributed as dist\nfrom torch.utils.data import TensorDataset\n"),
    ("def _mp_fn(index, flags):\n",
     "def setup():\n"
     "    rank = xm.get_ordinal()\n"
     "    world_size = xm.xrt_world_size()\n"
     "    dist.init_process_group(\"xla\", init_method=\"xla://\", rank=rank, world_size=world_size)\n"
     "    return rank, world_size\n\n\n"
     "def _mp_fn(index, flags):\n"
     "    rank, world_size = setup()\n"
     "    print(f\"setup rank {rank} of {world_size}\")\n")]}


SETUP_DEF = "def setup():\n    rank = dist.get_rank()\n    world_size = dist.get_world_size()\n"


def test_worker_setup_init_goes(tmp_path):
    work, _ = _rewrite(tmp_path, "spawn_trainer", SETUP_INIT)
    train = (work / "train.py").read_text()
    assert SETUP_DEF + "    return rank, world_size\n" in train, train
    assert "is_initialized" not in train


@pytest.mark.parametrize("change", ["imported", "call_arg"])
def test_worker_setup_init_that_may_run_elsewhere_stays_guarded(tmp_path, change):
    """The init stays (guarded) where another file imports the module (a program there may call setup() without a
    group), or where an argument calls a function of the program (dropping it could drop what that call does)."""
    edits = dict(SETUP_INIT)
    if change == "call_arg":
        edits["train.py"] = [*SETUP_INIT["train.py"], (
            'world_size=world_size)\n', 'world_size=world_size, timeout=default_timeout())\n'), (
            "def setup():\n", "def default_timeout():\n    import datetime\n\n"
                              "    return datetime.timedelta(minutes=5)\n\n\ndef setup():\n")]
    extra = {"check_setup.py": "from train import setup\n\nsetup()\n"} if change == "imported" else None
    work, _ = _rewrite(tmp_path, "spawn_trainer", edits, extra)
    train = (work / "train.py").read_text()
    assert SETUP_DEF + "    if not dist.is_initialized():\n        dist.init_process_group(" in train, train


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
def test_worker_setup_init_goes_and_the_program_trains(tmp_path, emulator, nproc):  # noqa: F811
    """The worker's own unguarded init can never run once the launch rewrite starts the group before the worker
    (it would raise: a second init of the default group), and a guard around it would be dead code: it goes, and the
    program trains in one process and in two under torchrun, in one group."""
    work, out = _rewrite(tmp_path, "spawn_trainer", SETUP_INIT)
    train = (work / "train.py").read_text()
    assert ("def setup():\n    rank = dist.get_rank()\n    world_size = dist.get_world_size()\n"
            "    return rank, world_size\n") in train, train
    assert train.count("init_process_group") == 2 and "is_initialized" not in train  # the launch rewrite's two
    logs = tmp_path / "collectives"
    proc = run_torchrun(["train.py", "--epochs", "1"], nproc=nproc, cwd=work, env=_env(logs), timeout=400)
    got = proc.stdout + proc.stderr
    assert proc.returncode == 0, got[-4000:]
    assert sorted(re.findall(r"setup rank (\d) of (\d)", got)) == [(str(r), str(nproc)) for r in range(nproc)], got[-3000:]
    _groups_allreduce(logs, nproc)


def _groups_allreduce(log_dir: Path, nproc: int) -> list:
    """One group of `nproc` ranks whose gradients were all-reduced (xm.optimizer_step's migration: per parameter)."""
    import json

    logs = [json.loads(p.read_text()) for p in sorted(log_dir.glob("rank*.json"))]
    assert sorted(g["rank"] for g in logs) == list(range(nproc)), logs
    assert all(g["world_size"] == nproc and g["members"] == logs[0]["members"] for g in logs), logs
    assert all(g["counts"].get("all_reduce", 0) > 0 for g in logs), logs
    return logs


def test_hf_trainer_fixup_goes(tmp_path):
    work, out = _rewrite(tmp_path, "hf_trainer_fixup")
    train = (work / "train.py").read_text()
    assert "_wrap_model" not in train and "local_rank" not in train and "Fixup" not in train, train
    assert 'torch.distributed.init_process_group("neuron")' in train and "torch_xla" not in train
    assert "from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments" in train
    assert "NM163" in out and (work / "data.py").read_bytes() == (PROGRAMS / "hf_trainer_fixup" / "data.py").read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
def test_hf_trainer_program_trains_under_torchrun(tmp_path, emulator, nproc):  # noqa: F811
    import importlib.util

    spec = importlib.util.find_spec("accelerate")
    if spec is None or spec.origin is None:
        pytest.skip("accelerate is not installed: transformers' Trainer needs it (not a dependency of this project)")
    work, _ = _rewrite(tmp_path, "hf_trainer_fixup")
    logs = tmp_path / "collectives"
    env = _env(logs)
    # the stand-in torch_neuronx package, and accelerate wherever it is installed (a --target folder too)
    extra = [str(Path(__file__).resolve().parent / "hf_neuronx_standin"), str(Path(spec.origin).parent.parent)]
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], *extra])
    proc = run_torchrun(["train.py"], nproc=nproc, cwd=work, env=env, timeout=500)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    found = _final(out, rf"rank (?P<rank>\d) world {nproc} device neuron steps (?P<steps>\d+) loss [0-9.]+ "
                        r"checksum (?P<checksum>-?[0-9]+\.[0-9]{6})", nproc)
    assert all(int(m.group("steps")) == 16 // nproc for m in found), out[-3000:]  # each rank its share of the data
    if nproc > 1:  # one group; DDP all-reduced gradient buckets (the Trainer wraps the model when there are two)
        _groups(logs, nproc)


def test_elastic_launch_rewrite_starts_the_group_in_the_torchrun_branch(tmp_path):
    work, out = _rewrite(tmp_path, "elastic_launch")
    train = (work / "train.py").read_text()
    assert ('    if dist.is_torchelastic_launched():\n        dist.init_process_group("neuron")  # started by torchrun\n'
            '        _mp_fn(int(os.environ["LOCAL_RANK"]), FLAGS)\n    else:\n'
            '        dist.init_process_group("neuron", store=dist.HashStore(), rank=0, world_size=1)\n') in train, train
    # every path has the group: ranks are plain torch.distributed calls, and the using_pjrt() branch runs always
    assert "rank=dist.get_rank()" in train and "_neuron_rank" not in train and "using_pjrt" not in train
    assert "import torch_xla" not in train and "Left for you" not in out, out


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
def test_elastic_launch_trains_under_torchrun(tmp_path, emulator, nproc):  # noqa: F811
    """Each rank starts from other weights (seeded by its rank) and reads its own half of the data: equal checksums
    at the end need both the broadcast of rank 0's weights and the gradient average, in one group."""
    _trains_with_broadcast(tmp_path, "elastic_launch", nproc)


def _trains_with_broadcast(tmp_path, name: str, nproc: int) -> str:
    """The rewritten program under torchrun: equal checksums on every rank, two epoch losses (rank 0 prints, once per
    epoch) that fall, one group whose ranks all-reduced and (with 2) broadcast rank 0's weights. Its output."""
    work, _ = _rewrite(tmp_path, name)
    logs = tmp_path / "collectives"
    proc = run_torchrun(["train.py"], nproc=nproc, cwd=work, env=_env(logs), timeout=400)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    _final(out, rf"rank (?P<rank>\d) world {nproc} device neuron checksum (?P<checksum>-?[0-9]+\.[0-9]{{6}})", nproc)
    losses = [float(x) for x in re.findall(r"epoch \d loss ([0-9.]+)", out)]
    assert len(losses) == 2 and losses[1] < losses[0], out[-3000:]
    got = _groups_allreduce(logs, nproc)
    if nproc > 1:
        assert all(g["counts"].get("broadcast", 0) > 0 for g in got), got
    return out


def test_engine_split_hands_plain_loaders_to_the_loops_of_another_module(tmp_path):
    work, out = _rewrite(tmp_path, "engine_split")
    train, engine = (work / "train.py").read_text(), (work / "engine.py").read_text()
    assert "_DeviceLoader" not in train + engine and "_batch_to_device" not in train + engine, train
    assert "        train_one_epoch(model, train_dl, optimizer, epoch)\n" in train
    assert "    correct = evaluate(model, eval_dl)\n" in train and "pl." not in train
    assert engine.count('        x, y = x.to("neuron"), y.to("neuron")\n') == 2, engine
    assert "torch_xla" not in train + engine and "Left for you" not in out, out


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
def test_engine_split_trains_under_torchrun(tmp_path, emulator, nproc):  # noqa: F811
    """Per-rank initial weights and per-rank halves of the data: equal checksums need the broadcast and the gradient
    average in one group; the batches reach the device only through engine.py's inserted moves."""
    out = _trains_with_broadcast(tmp_path, "engine_split", nproc)
    assert re.search(r"accuracy [0-9.]+", out), out[-3000:]
