"""CUDA training programs as people write them, rewritten with the real CLI and trained on the emulated `neuron` device.

Three multi-file programs under `cuda_programs/`, in the style of well-known CUDA examples:
- `cnn_picker/`: the canonical example CNN; the device is picked among cuda, mps and cpu
  (`use_cuda = not args.no_cuda and torch.cuda.is_available()` ... `elif use_mps:` ... `else: cpu`);
- `ddp_trainer/`: an ImageNet-style trainer; the backend comes from `--dist-backend default="nccl"` and is compared
  (`args.dist_backend == "nccl"`, `dist.is_nccl_available()`), an entry function counts devices while the worker
  function picks the device among cuda, mps and cpu, and `if torch.cuda.is_available():` guards CUDA-only logging;
- `gpt_trainer/`: a GPT-style trainer in nanoGPT's shape: config globals (`backend = 'nccl'`, `device = 'cuda'`, a bf16
  check through `torch.cuda.is_bf16_supported()`) overridden by nanoGPT's `configurator.py` (exec'd in train.py's
  globals; it execs the config files named on the command line, here `config/train_small.py` with its own
  `device = 'cuda'` and `backend = 'nccl'`, and sets `--key=value`), `device_type = 'cuda' if 'cuda' in device else
  'cpu'`, autocast, `GradScaler(enabled=(dtype == 'float16'))`, `torch.compile(model)` and DDP from torchrun's
  environment.

- `config_trainer/`: the settings in their own module (`trainer/config.py`: a dataclass with `device: str = "cuda"` and
  `backend: str = "nccl"`, `--dist-backend default="nccl"`), read by the trainer in another (`trainer/engine.py`:
  `init_process_group(backend=cfg.backend)`, `torch.device(cfg.device)`, `args.dist_backend == "nccl"`), tied by the
  entry script (`TrainConfig(backend=args.dist_backend)`): the values are followed across files (repository model);
- `imagenet_spawn/`: pytorch/examples' imagenet/main.py cut down (models, meters and data in `lib/`): `--gpu`,
  `--dist-url tcp://...` with `--multiprocessing-distributed` (mp.spawn of one worker per GPU, `torch.cuda.set_device
  (args.gpu)`, `model.cuda(args.gpu)`, `DDP(device_ids=[args.gpu])`) or `--dist-url env://` under torchrun (`model.cuda()`,
  `DDP(model)`), and a placement chain whose first test, `not torch.cuda.is_available() and not
  torch.backends.mps.is_available()`, is true on a Neuron host (before: the neuron branch added to the chain was dead
  code and the program trained on the host CPU, or not at all), and imagenet's validate, which moves each batch in
  independent `if <backend is available>:` blocks (before: left with a finding; the batches stayed on the CPU), and
  imagenet's `--resume`, whose `if args.gpu is None: ... elif torch.cuda.is_available(): loc = 'cuda:{}'.format(
  args.gpu)` chain has no else (before: a spawned worker on a Neuron host took neither branch and failed);
- `custom_trainer/`: a trainer library without accelerate: a config dataclass whose argparse options are made from its
  fields (`mylib/config.py`: `dist_backend: str = "nccl"`, no literal on any command-line option), device and process
  group helpers in a utils module (`mylib/utils.py`: `get_device()` picks cuda, else mps, else cpu with early returns;
  `setup_distributed(backend)` passes its parameter to `init_process_group`), the trainer (`mylib/trainer.py`: DDP,
  autocast through the utils module, `torch.cuda.amp.GradScaler`), tied by `train.py`
  (`setup_distributed(cfg.dist_backend)`). Before: the early-return picker got no neuron branch (the program trained
  on the host CPU) and the backend field stayed 'nccl' without a finding (2 processes died for want of NCCL);
- `word_lm/`: pytorch/examples' word_language_model (main.py, model.py, data.py): `--cuda` and `--mps` flags choose
  the device (`if args.cuda: ... elif use_mps: ... else: cpu`), whole-model `torch.save`/`torch.load`. Before: left
  with "dispatches over several backends" and trained on the host CPU. One process only: it has no distributed mode;
- `ddp_series/`: in the style of pytorch/examples' ddp-tutorial-series: `multigpu.py` (mp.spawn of one worker per
  GPU, `init_process_group("nccl", rank=rank, world_size=world_size)`, `torch.cuda.set_device(rank)`) and
  `multigpu_torchrun.py` (torchrun, `LOCAL_RANK`, a snapshot that a restarted job resumes from with
  `torch.load(snapshot_path)`); both build the optimizer before `model.to(gpu_id)`. Before: resuming died on rank 1
  (the snapshot's tensors are tagged neuron:0, which rank 1 cannot reach on TorchNeuron), and the emulated device
  made new Parameters on `.to()` (TorchNeuron keeps them), so the optimizer never trained the model there;
- `ddp_spawn/`: the DDP tutorial's basic case and its checkpoint demo (rank 0 saves, every rank loads with
  `map_location = {'cuda:%d' % 0: 'cuda:%d' % rank}`): `n_gpus = torch.cuda.device_count()` workers started with `mp.spawn`,
  `init_process_group("nccl", ...)`, the model moved with `.to(rank)` and `DDP(model, device_ids=[rank])` moving the
  CPU inputs to the device.
- `cifar_dp/`: in the style of pytorch-cifar's main.py (main.py, models/, data.py, utils.py): `device = 'cuda' if
  torch.cuda.is_available() else 'cpu'`, then `if device == 'cuda': net = torch.nn.DataParallel(net); cudnn.benchmark =
  True`, a checkpoint of `net.state_dict()` that `--resume` loads. Before: the test became `device == 'neuron'`, so
  the DataParallel wrap ran on the neuron device and its forward failed (CUDA's scatter); the wrap and the cudnn
  setting are now removed with the emptied `if`, and the program trains and resumes on one NeuronCore.
- `gpt2_picker/`: in the shape of build-nanogpt's train_gpt2.py (and its hundreds of forks; model and data loader in
  their own modules): `if ddp:` asserts `torch.cuda.is_available()`, `init_process_group(backend='nccl')`, `device =
  f'cuda:{ddp_local_rank}'`, `torch.cuda.set_device(device)`; else `device = "cpu"` then `if torch.cuda.is_available():
  device = "cuda"` / `elif mps: device = "mps"` with no else (the assignment before the chain is its fallback),
  `device_type = "cuda" if device.startswith("cuda") else "cpu"`, gradient accumulation with
  `require_backward_grad_sync`, `dist.all_reduce(loss_accum, op=dist.ReduceOp.AVG)`. Before: one finding ("dispatches
  over several backends"), the program trained on the host CPU in one process and died on the assert under torchrun;
  then, with the picker's neuron branch, `device_type` was 'cpu' on the neuron device and the bf16 autocast did nothing.
- `tp_mesh/`: in the style of pytorch/examples' tensor_parallel_example.py: a GPU-count check in a helper module
  (`torch.cuda.is_available()` and `torch.cuda.device_count() >= 2`, else exit), `init_device_mesh(device_type="cuda",
  ...)`, `parallelize_module` with ColwiseParallel/RowwiseParallel (DTensor), inputs made with `device="cuda"`. Trained
  under torchrun in two processes: each rank holds half of the first layer, and both see the same losses.

Fast tests: `rewrite --write --unsafe-fixes` makes the changes each pattern needs (and no half of one). Slow tests: the
rewritten programs train, unchanged, on the EMULATED neuron device (`neuron_emulated/sitecustomize.py`, a real
PrivateUse1 device: nothing is mapped back to the CPU, so a program that still picks `cpu` or `cuda` shows it), in one
process and in two under torchrun: both ranks join one process group (same member pids), DDP all-reduces gradient
buckets, and the ranks end with equal parameters although each trained on its own shard of the data.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from torchrun_util import run_torchrun

REPO = Path(__file__).resolve().parents[2]
PROGRAMS = Path(__file__).resolve().parent / "cuda_programs"
EMULATED = Path(__file__).resolve().parent / "neuron_emulated"


def _cli() -> list[str]:
    exe = Path(sys.executable).parent / "neuron-migrate"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "neuron_migrate"]


def _rewrite(tmp_path: Path, name: str) -> tuple[Path, str]:
    work = tmp_path / name
    shutil.copytree(PROGRAMS / name, work)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([*_cli(), "rewrite", str(work), "--write", "--unsafe-fixes", "--jobs", "1", "--no-cache"],
                          capture_output=True, text=True, timeout=180, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode in (0, 1) and "internal error" not in out and "rewritten" in out, out
    return work, out


# -- what the rewrite does ----------------------------------------------------------------------------------
def test_device_picker_gets_a_neuron_branch(tmp_path):
    work, out = _rewrite(tmp_path, "cnn_picker")
    text = (work / "main.py").read_text()
    assert ('    elif use_mps:\n        device = torch.device("mps")\n'
            '    elif torch.accelerator.is_available() and torch.accelerator.current_accelerator().type == "neuron":\n'
            '        device = torch.device("neuron")\n    else:\n        device = torch.device("cpu")\n') in text
    # the CUDA and MPS branches stay for GPU and Mac hosts, and so does the CUDA-only loader setting
    assert "use_cuda = not args.no_cuda and torch.cuda.is_available()" in text and 'torch.device("cuda")' in text
    assert (work / "net.py").read_bytes() == (PROGRAMS / "cnn_picker" / "net.py").read_bytes()


def test_backend_value_and_worker_picker(tmp_path):
    work, out = _rewrite(tmp_path, "ddp_trainer")
    text = (work / "train.py").read_text()
    original = (PROGRAMS / "ddp_trainer" / "train.py").read_text()
    # the backend is one value: the argparse default, its comparisons and the availability check change together
    assert 'parser.add_argument("--dist-backend", default="neuron"' in text
    assert 'if args.dist_backend == "neuron":\n            assert dist.is_backend_available("neuron")' in text
    assert 'pin_memory=args.dist_backend == "neuron")' in text and '"nccl"' not in text
    assert "Values from the command line (--dist-backend) must now say 'neuron'" in out
    # the guard of CUDA-only logging keeps its CUDA test (never made live on Neuron), with a finding
    assert 'if torch.cuda.is_available():\n        print("GPU:", torch.cuda.get_device_name(0))' in text
    assert "guards CUDA-only code" in out
    # entry and worker: the entry counts accelerators, the worker's picker gets the neuron branch
    assert "ngpus_per_node = torch.accelerator.device_count()" in text
    assert ('    elif torch.accelerator.is_available() and torch.accelerator.current_accelerator().type == "neuron":\n'
            '        device = torch.device("neuron")\n    else:\n        device = torch.device("cpu")') in text
    assert text.count("torch.cuda.set_device(device)") == original.count("torch.cuda.set_device(device)") == 1


def test_gpt_trainer_value_sets_precision_and_compile(tmp_path):
    work, out = _rewrite(tmp_path, "gpt_trainer")
    text = (work / "train.py").read_text()
    assert "backend = 'neuron'" in text and "device = 'neuron'" in text and "device = f'neuron:{ddp_local_rank}'" in text
    # the membership test belongs to the value it tests: both halves of the expression change (issue: only one did)
    assert "device_type = 'neuron' if 'neuron' in device else 'cpu'" in text
    assert "if device_type == 'neuron':" in text
    # precision: the bf16 check asks the neuron device; the scaler follows the precision switch on neuron
    assert "dtype = 'bfloat16' if torch.accelerator.is_available() and torch.get_device_module().is_bf16_supported() else 'float16'" in text
    assert "scaler = torch.amp.GradScaler(\"neuron\", enabled=(dtype == 'float16'))" in text
    assert 'model = torch.compile(model, backend="neuron")' in text
    assert "[verify]" in out
    assert "torch.cuda" not in text
    # nanoGPT's configuration: `exec(open('configurator.py').read())` runs the config files of the command line in
    # train.py's globals; the config file's backend and device are the same values, so they change with train.py's
    # (before: its 'nccl' stayed, and `torchrun train.py config/train_small.py` died for want of NCCL)
    config = (work / "config/train_small.py").read_text()
    assert "device = 'neuron'  # run on cpu only\nbackend = 'neuron'\ndtype = 'bfloat16'\ncompile = True" in config
    assert "'nccl'" not in config and "'cuda'" not in config
    assert ("Values from the command line (`--backend=...`, which configurator.py reads) and the config files that set it "
            "(config/train_small.py: rewritten with it) must now say 'neuron'") in out
    assert "Values from the command line (`--device_type" not in out  # assigned after the exec: no override reaches it
    assert (work / "configurator.py").read_bytes() == (PROGRAMS / "gpt_trainer" / "configurator.py").read_bytes()


def test_imagenet_placement_chain_reaches_its_neuron_branches(tmp_path):
    work, out = _rewrite(tmp_path, "imagenet_spawn")
    text = (work / "main.py").read_text()
    neuron = 'torch.accelerator.is_available() and torch.accelerator.current_accelerator().type == "neuron"'
    # the "no accelerator" test no longer holds on a Neuron host, so the branches after it are reached
    assert f"    if not torch.cuda.is_available() and not torch.backends.mps.is_available() and not ({neuron}):\n" in text
    # the distributed branch's CUDA block gets its neuron twin: without it DDP would never wrap the model
    assert (f"        elif {neuron}:\n            if args.gpu is not None:\n"
            "                torch.accelerator.set_device_index(args.gpu)\n"
            '                model.to(torch.device("neuron", args.gpu))\n') in text
    assert ('            else:\n                model.to("neuron")\n'
            "                model = torch.nn.parallel.DistributedDataParallel(model)\n") in text
    assert text.count(f"elif {neuron}:") == 4  # the nested block, the placement chain, the device chain, the resume
    # resuming picks the checkpoint's location by `if args.gpu is None: ... elif torch.cuda.is_available(): ...`: a
    # spawned worker (args.gpu set) on a Neuron host took neither branch and never loaded it
    assert (f"                checkpoint = torch.load(args.resume, map_location=loc)\n            elif {neuron}:\n"
            "                loc = 'neuron:{}'.format(args.gpu)\n"
            "                checkpoint = torch.load(args.resume, map_location=loc)\n") in text
    # validate moves each batch in independent blocks per backend: the MPS one gets a neuron twin
    assert (f"                    target = target.to('mps')\n                if {neuron}:\n"
            "                    images = images.to('neuron')\n                    target = target.to('neuron')\n") in text
    assert f'        elif {neuron}:\n            device = torch.device("neuron")' in (work / "lib/meters.py").read_text()
    # the CUDA branches stay for GPU hosts; nothing is left for a human, and a second run changes nothing
    assert "torch.cuda.set_device(args.gpu)" in text and "manual migration" not in out and "dispatches over" not in out
    again = subprocess.run([*_cli(), "rewrite", str(work), "--unsafe-fixes", "--no-cache"], capture_output=True, text=True,
                           env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert re.search(r"\b0 of \d+ files would be rewritten", again.stdout + again.stderr), again.stdout + again.stderr


def test_custom_trainer_picker_and_backend_through_a_parameter(tmp_path):
    work, out = _rewrite(tmp_path, "custom_trainer")
    utils = (work / "mylib/utils.py").read_text()
    config = (work / "mylib/config.py").read_text()
    assert ('        return torch.device("mps")\n'
            '    if torch.accelerator.is_available() and torch.accelerator.current_accelerator().type == "neuron":\n'
            '        return torch.device("neuron")\n    return torch.device("cpu")\n') in utils
    assert 'return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))' in utils  # GPU hosts keep theirs
    # the field reaches init_process_group through train.py's call of a utils function: one value, rewritten whole
    assert 'dist_backend: str = "neuron"' in config and "nccl" not in config
    assert "Another file of the program passes it to torch (train.py:22)" in out
    assert "torch.cuda" not in (work / "mylib/trainer.py").read_text()
    assert "manual migration" not in out and (work / "train.py").read_bytes() == (
        PROGRAMS / "custom_trainer" / "train.py").read_bytes()


def test_word_lm_flag_picker_gets_a_neuron_branch(tmp_path):
    work, out = _rewrite(tmp_path, "word_lm")
    text = (work / "main.py").read_text()
    assert ('elif use_mps:\n    device = torch.device("mps")\n'
            'elif torch.accelerator.is_available() and torch.accelerator.current_accelerator().type == "neuron":\n'
            '    device = torch.device("neuron")\nelse:\n    device = torch.device("cpu")\n') in text
    assert 'if args.cuda:\n    device = torch.device("cuda")' in text  # --cuda still asks for CUDA on a GPU host
    assert "manual migration" not in out and "dispatches over" not in out


def test_default_picker_and_ddp_block_keep_both_hosts(tmp_path):
    work, out = _rewrite(tmp_path, "gpt2_picker")
    text = (work / "train_gpt2.py").read_text()
    # the chain with no else gets its neuron branch at its end (the assignment before it is the CPU fallback)
    assert ('    device = "cpu"\n    if torch.cuda.is_available():\n        device = "cuda"\n'
            '    elif hasattr(torch.backends, "mps") and torch.backends.mps.is_available():\n        device = "mps"\n'
            '    elif torch.accelerator.is_available() and torch.accelerator.current_accelerator().type == "neuron":\n'
            '        device = "neuron"\n') in text
    # the DDP block runs on every host: each statement keeps its CUDA form where CUDA is, its neuron form elsewhere
    assert 'assert torch.accelerator.is_available(), "for now i think we need CUDA for DDP"' in text
    assert "init_process_group(backend='nccl' if torch.cuda.is_available() else 'neuron')" in text
    assert "device = f'cuda:{ddp_local_rank}' if torch.cuda.is_available() else f'neuron:{ddp_local_rank}'" in text
    assert "    if torch.cuda.is_available():\n        torch.cuda.set_device(device)\n" in text
    # the device type the autocast reads: the neuron device gets its own answer, not the CPU's
    assert 'device_type = "cuda" if device.startswith("cuda") else "neuron" if device.startswith("neuron") else "cpu"' in text
    assert "dispatches over" not in out, out
    # model.py's `device_type == "cuda"` (fused AdamW) asks about what train_gpt2.py's picker hands out, cuda on GPU
    # hosts: it stays, and says so (repository model: another file of the program picks the device)
    assert (work / "model.py").read_bytes() == (PROGRAMS / "gpt2_picker" / "model.py").read_bytes()
    assert "1 item needs manual migration" in out and "tests whether `device_type`, a parameter, is CUDA" in out, out
    assert (work / "data.py").read_bytes() == (PROGRAMS / "gpt2_picker" / "data.py").read_bytes()


def test_cifar_style_data_parallel_block_goes(tmp_path):
    work, out = _rewrite(tmp_path, "cifar_dp")
    text = (work / "main.py").read_text()
    assert "device = 'neuron' if torch.accelerator.is_available() else 'cpu'" in text
    assert "DataParallel(net)" not in text and "cudnn." not in text and "if device ==" not in text, text
    assert "import torch.backends.cudnn as cudnn\n" not in text  # its only use went with the block
    assert "net = net.to(device)\n\nif args.resume:" in text, text
    assert "NM230" in out and "module." in out  # the finding and its note about the checkpoint keys
    for name in ("data.py", "utils.py", "models/small.py", "models/__init__.py"):
        assert (work / name).read_bytes() == (PROGRAMS / "cifar_dp" / name).read_bytes(), name


def test_tensor_parallel_mesh_moves_to_neuron(tmp_path):
    work, out = _rewrite(tmp_path, "tp_mesh")
    text = (work / "tp_train.py").read_text()
    assert 'init_device_mesh(device_type="neuron", mesh_shape=(world_size,))' in text
    assert 'ToyModel().to("neuron")' in text and 'device="cuda"' not in text
    helpers = (work / "log_utils.py").read_text()
    assert "torch.accelerator.is_available()" in helpers and "torch.accelerator.device_count()" in helpers
    assert "manual migration" not in out


def test_spawned_workers_keep_the_module_device_index(tmp_path):
    work, out = _rewrite(tmp_path, "ddp_spawn")
    text = (work / "main.py").read_text()
    assert 'dist.init_process_group("neuron", rank=rank, world_size=world_size)' in text
    assert "n_gpus = torch.accelerator.device_count()" in text
    # the module went to device `rank` and DDP moves the inputs there: device_ids names the module's own device
    assert "model = ToyModel().to(rank)\n    ddp_model = DDP(model, device_ids=[rank])" in text
    # the checkpoint demo's location map: rank 0's tensors (neuron:0) go to this rank's NeuronCore
    assert "map_location = {'neuron:%d' % 0: 'neuron:%d' % rank}" in text, text


def test_config_values_in_another_module_change_with_their_use(tmp_path):
    work, out = _rewrite(tmp_path, "config_trainer")
    config = (work / "trainer/config.py").read_text()
    engine = (work / "trainer/engine.py").read_text()
    # the defaults live in config.py, what makes them a device and a backend in engine.py and train.py
    assert 'device: str = "neuron"\n    backend: str = "neuron"' in config
    assert 'parser.add_argument("--dist-backend", default="neuron"' in config
    assert 'if args.dist_backend == "neuron":\n                assert dist.is_backend_available("neuron")' in engine
    assert 'self.device_type = "neuron" if "neuron" in cfg.device else "cpu"' in engine  # the whole expression
    assert '"nccl"' not in config + engine and '"cuda"' not in config + engine
    assert (work / "train.py").read_bytes() == (PROGRAMS / "config_trainer" / "train.py").read_bytes()
    assert "Another file of the program passes it to torch (trainer/engine.py:17)" in out, out


# -- training on the emulated neuron device -----------------------------------------------------------------
def _env(log_dir: Path | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TORCHDYNAMO_DISABLE")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=f"{EMULATED}{os.pathsep}{REPO}")
    if log_dir is not None:
        log_dir.mkdir(exist_ok=True)
        env["NEURON_ON_CPU_COLLECTIVES"] = str(log_dir)
    return env


@pytest.fixture(scope="module")
def emulator():
    pytest.importorskip("torch")
    if shutil.which("g++") is None and not os.environ.get("NM_EMULATOR_CXX"):
        pytest.skip("no C++ compiler: the emulated device cannot be built here")
    from neuron_migrate.probe.emulator.build import library_path

    return library_path()  # built once here, not by two ranks at a time


def _groups(log_dir: Path, nproc: int) -> list[dict]:
    logs = [json.loads(p.read_text()) for p in sorted(log_dir.glob("rank*.json"))]
    assert sorted(g["rank"] for g in logs) == list(range(nproc)), logs
    assert all(g["world_size"] == nproc and g["members"] == logs[0]["members"] for g in logs), logs  # one group
    assert all(g["counts"].get("ddp_gradient_bucket", 0) > 0 for g in logs), logs  # gradients were all-reduced
    return logs


def _final(out: str, pattern: str, nproc: int) -> list[re.Match]:
    found = list(re.finditer(pattern, out))  # not anchored: two ranks' lines may interleave on one line
    assert sorted(int(m.group("rank")) for m in found) == list(range(nproc)), out[-4000:]
    assert len({m.group("checksum") for m in found}) == 1, out[-4000:]  # averaged gradients: equal weights
    return found


@pytest.mark.slow
def test_picker_program_trains_on_emulated_neuron(tmp_path, emulator):
    original = subprocess.run([sys.executable, "main.py", "--epochs", "1"], cwd=PROGRAMS / "cnn_picker", env=_env(),
                              capture_output=True, text=True, timeout=300)
    assert original.returncode == 0 and "device cpu" in original.stdout, original.stdout + original.stderr[-3000:]
    work, _ = _rewrite(tmp_path, "cnn_picker")
    proc = subprocess.run([sys.executable, "main.py", "--epochs", "2"], cwd=work, env=_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    losses = [float(x) for x in re.findall(r"^step \S+ loss ([0-9.]+)", proc.stdout, re.M)]
    assert len(losses) >= 4 and losses[-1] < 0.5 * losses[0], proc.stdout
    m = re.search(r"^device (\w+) accuracy ([0-9.]+)", proc.stdout, re.M)
    assert m and m.group(1) == "neuron" and float(m.group(2)) > 0.8, proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
def test_ddp_trainer_trains_under_torchrun(tmp_path, emulator, nproc):
    work, _ = _rewrite(tmp_path, "ddp_trainer")
    logs = tmp_path / "collectives"
    proc = run_torchrun(["train.py", "--epochs", "3"], nproc=nproc, cwd=work, env=_env(logs), timeout=500)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    _final(out, rf"rank (?P<rank>\d) world {nproc} device neuron steps \d+ checksum (?P<checksum>-?[0-9]+\.[0-9]{{6}})", nproc)
    first = [float(x) for x in re.findall(r"rank 0 epoch 0 loss ([0-9.]+)", out)]
    last = [float(x) for x in re.findall(r"rank 0 epoch 2 loss ([0-9.]+)", out)]
    assert first and last and last[0] < first[0], out[-3000:]
    _groups(logs, nproc)


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
def test_config_trainer_trains_under_torchrun(tmp_path, emulator, nproc):
    work, _ = _rewrite(tmp_path, "config_trainer")
    logs = tmp_path / "collectives"
    proc = run_torchrun(["train.py", "--steps", "12"], nproc=nproc, cwd=work, env=_env(logs), timeout=500)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    _final(out, rf"rank (?P<rank>\d) world {nproc} device neuron steps 12 checksum (?P<checksum>-?[0-9]+\.[0-9]{{6}})", nproc)
    losses = [float(x) for x in re.findall(r"rank 0 step \d+ loss ([0-9.]+)", out)]
    assert len(losses) == 12 and losses[-1] < losses[0], out[-3000:]
    _groups(logs, nproc)


@pytest.mark.slow
def test_config_trainer_before_migration_needs_nccl(tmp_path, emulator):
    """The control: unmigrated, 2 processes die for want of NCCL (the backend lives in another module)."""
    shutil.copytree(PROGRAMS / "config_trainer", tmp_path / "config_trainer")
    proc = run_torchrun(["train.py", "--steps", "2"], nproc=2, cwd=tmp_path / "config_trainer", env=_env(), timeout=300)
    assert proc.returncode != 0 and "NCCL" in proc.stdout + proc.stderr


@pytest.mark.slow
def test_ddp_trainer_before_migration_needs_nccl(tmp_path, emulator):
    """The control: unmigrated, the same 2-process run dies for want of NCCL (what the issue saw)."""
    shutil.copytree(PROGRAMS / "ddp_trainer", tmp_path / "ddp_trainer")
    proc = run_torchrun(["train.py", "--epochs", "1"], nproc=2, cwd=tmp_path / "ddp_trainer", env=_env(), timeout=300)
    assert proc.returncode != 0 and "NCCL" in proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
def test_gpt_trainer_trains_under_torchrun(tmp_path, emulator, nproc):
    work, _ = _rewrite(tmp_path, "gpt_trainer")
    logs = tmp_path / "collectives"
    proc = run_torchrun(["train.py", "config/train_small.py", "--max_iters=12"], nproc=nproc, cwd=work, env=_env(logs),
                        timeout=580)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    _final(out, rf"rank (?P<rank>\d) world {nproc} device_type neuron dtype bfloat16 param_device neuron "
                r"checksum (?P<checksum>-?[0-9]+\.[0-9]{6})", nproc)
    losses = [float(x) for x in re.findall(r"^iter \d+: loss ([0-9.]+)", out, re.M)]
    assert len(losses) >= 3 and losses[-1] < losses[0], out[-3000:]
    assert "using fused AdamW: True" in out  # the device_type value reached the model file's choice as 'neuron'
    assert "Overriding config with config/train_small.py" in out and "backend = 'neuron'" in out
    _groups(logs, nproc)


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
def test_spawned_ddp_tutorial_trains(tmp_path, emulator, nproc):
    import socket

    work, _ = _rewrite(tmp_path, "ddp_spawn")
    logs = tmp_path / "collectives"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(_env(logs), NM_EMULATOR_DEVICES=str(nproc), MASTER_PORT=str(port))  # devices seen = workers spawned
    proc = subprocess.run([sys.executable, "main.py"], cwd=work, env=env, capture_output=True, text=True, timeout=400)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    trained = _final(out, rf"rank (?P<rank>\d) world {nproc} device neuron checksum (?P<checksum>-?[0-9]+\.[0-9]{{6}})", nproc)
    # every rank reloaded rank 0's checkpoint onto its own NeuronCore (neuron:0 is not reachable from rank 1)
    reloaded = _final(out, r"rank (?P<rank>\d) reloaded on neuron:(?P<index>\d) checksum (?P<checksum>-?[0-9]+\.[0-9]{6})", nproc)
    assert all(m.group("index") == m.group("rank") for m in reloaded), out[-3000:]
    assert reloaded[0].group("checksum") == trained[0].group("checksum")
    first = float(re.search(r"rank 0 step 0 loss ([0-9.]+)", out).group(1))
    last = float(re.search(r"rank 0 step 29 loss ([0-9.]+)", out).group(1))
    assert last < 0.5 * first, out[-3000:]
    _groups(logs, nproc)


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_imagenet_spawned_on_two_nodes_binds_each_worker_to_its_local_device(tmp_path, emulator):
    """Two "nodes" of one device each (`--world-size 2 --rank 0/1 --multiprocessing-distributed`, two mp.spawn launches
    of one worker): the second node's worker has global rank 1 and spawn index 0. NM235 sets LOCAL_RANK from the spawn
    index, so it takes its node's device 0 (before: the device came from the global rank, and `model.to(neuron:0)`
    failed on the second node)."""
    work, _ = _rewrite(tmp_path, "imagenet_spawn")
    assert "os.environ.setdefault(\"LOCAL_RANK\", str(gpu))" in (work / "main.py").read_text()
    logs = tmp_path / "collectives"
    env = dict(_env(logs), NM_EMULATOR_DEVICES="1")
    url = f"tcp://127.0.0.1:{_port()}"
    nodes = [subprocess.Popen([sys.executable, "main.py", "--epochs", "2", "--multiprocessing-distributed", "--world-size",
                               "2", "--rank", str(node), "--dist-url", url], cwd=work, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for node in (0, 1)]
    outs = [p.communicate(timeout=400)[0] for p in nodes]
    assert all(p.returncode == 0 for p in nodes), "\n".join(o[-3000:] for o in outs)
    _final("\n".join(outs), r"rank (?P<rank>\d) world 2 device neuron checksum (?P<checksum>-?[0-9]+\.[0-9]{6})", 2)
    _groups(logs, 2)


@pytest.mark.slow
@pytest.mark.parametrize("launch", ["spawn-2", "torchrun-1", "torchrun-2"])
def test_imagenet_trains_spawned_and_under_torchrun(tmp_path, emulator, launch):
    work, _ = _rewrite(tmp_path, "imagenet_spawn")
    logs = tmp_path / "collectives"
    nproc = int(launch[-1])
    if launch.startswith("spawn"):  # --multiprocessing-distributed: mp.spawn of one worker per device
        env = dict(_env(logs), NM_EMULATOR_DEVICES=str(nproc))
        proc = subprocess.run([sys.executable, "main.py", "--epochs", "2", "--multiprocessing-distributed", "--world-size",
                               "1", "--rank", "0", "--dist-url", f"tcp://127.0.0.1:{_port()}"], cwd=work, env=env,
                              capture_output=True, text=True, timeout=400)
    else:
        proc = run_torchrun(["main.py", "--epochs", "2", "--dist-url", "env://"], nproc=nproc, cwd=work, env=_env(logs),
                            timeout=400)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    _final(out, rf"rank (?P<rank>\d) world {nproc} device neuron checksum (?P<checksum>-?[0-9]+\.[0-9]{{6}})", nproc)
    first = [float(m) for m in re.findall(r"epoch 0 loss ([0-9.]+)", out)]
    last = [float(m) for m in re.findall(r"epoch 1 loss ([0-9.]+)", out)]
    assert len(first) == len(last) == nproc and max(last) < min(first), out[-3000:]
    val = [float(x) for x in re.findall(r"epoch 1 val acc1 ([0-9.]+)", out)]
    # validate ran on the neuron device; with torchrun every rank prints the accuracy all-reduced over the ranks
    assert len(val) == (nproc if launch.startswith("torchrun") else 1) and len(set(val)) == 1, out[-3000:]
    if nproc > 1:  # one process: imagenet starts no process group (`args.distributed = args.world_size > 1 or ...`)
        _groups(logs, nproc)
    if launch.startswith("spawn"):
        # each spawned worker resumes from rank 0's checkpoint onto its own device (`args.gpu` is its index)
        proc = subprocess.run([sys.executable, "main.py", "--epochs", "3", "--multiprocessing-distributed", "--world-size",
                               "1", "--rank", "0", "--dist-url", f"tcp://127.0.0.1:{_port()}", "--resume",
                               "checkpoint.pth.tar"], cwd=work, env=env, capture_output=True, text=True, timeout=400)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-4000:]
        assert out.count("=> loaded checkpoint 'checkpoint.pth.tar' (epoch 2)") == nproc, out[-3000:]
        again = [float(m) for m in re.findall(r"epoch 2 loss ([0-9.]+)", out)]
        assert len(again) == nproc and "epoch 0 loss" not in out and max(again) < min(first), out[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
def test_custom_trainer_trains_under_torchrun(tmp_path, emulator, nproc):
    work, _ = _rewrite(tmp_path, "custom_trainer")
    logs = tmp_path / "collectives"
    proc = run_torchrun(["train.py", "--steps", "16"], nproc=nproc, cwd=work, env=_env(logs), timeout=400)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    _final(out, rf"rank (?P<rank>\d) world {nproc} device neuron final [0-9.]+ checksum (?P<checksum>-?[0-9]+\.[0-9]{{6}})",
           nproc)
    losses = [float(x) for x in re.findall(r"^step \d+ loss ([0-9.]+)", out, re.M)]
    assert len(losses) == 4 and losses[-1] < losses[0], out[-3000:]
    if nproc > 1:  # one process: the trainer wraps no DDP (`if world_size > 1`), so nothing is all-reduced
        _groups(logs, nproc)


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
def test_gpt2_picker_trains_under_torchrun(tmp_path, emulator, nproc):
    work, _ = _rewrite(tmp_path, "gpt2_picker")
    logs = tmp_path / "collectives"
    proc = run_torchrun(["train_gpt2.py", "8"], nproc=nproc, cwd=work, env=_env(logs), timeout=500)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    # bfloat16: the autocast runs on the neuron device (before the device type fix it was the CPU's, a no-op there)
    _final(out, rf"rank (?P<rank>\d) world {nproc} device neuron logits bfloat16 checksum (?P<checksum>-?[0-9]+\.[0-9]{{6}})",
           nproc)
    losses = [float(x) for x in re.findall(r"^step +\d+ \| loss: ([0-9.]+)", out, re.M)]
    assert len(losses) == 8 and losses[-1] < losses[0], out[-3000:]
    _groups(logs, nproc)


@pytest.mark.slow
def test_gpt2_picker_single_process_picks_neuron(tmp_path, emulator):
    """Without torchrun the picker decides: before migration the host CPU, after it the neuron device."""
    before = subprocess.run([sys.executable, "train_gpt2.py", "2"], cwd=PROGRAMS / "gpt2_picker", env=_env(),
                            capture_output=True, text=True, timeout=300)
    assert before.returncode == 0 and "device cpu logits bfloat16 checksum" in before.stdout, \
        before.stdout + before.stderr[-3000:]
    work, _ = _rewrite(tmp_path, "gpt2_picker")
    after = subprocess.run([sys.executable, "train_gpt2.py", "2"], cwd=work, env=_env(), capture_output=True,
                           text=True, timeout=300)
    assert after.returncode == 0 and "using device: neuron" in after.stdout, after.stdout + after.stderr[-3000:]
    assert "rank 0 world 1 device neuron logits bfloat16 checksum" in after.stdout, after.stdout


@pytest.mark.slow
def test_gpt2_picker_before_migration_needs_cuda(tmp_path, emulator):
    """The control: unmigrated, 2 processes stop at the program's own assert."""
    shutil.copytree(PROGRAMS / "gpt2_picker", tmp_path / "gpt2_picker")
    proc = run_torchrun(["train_gpt2.py", "2"], nproc=2, cwd=tmp_path / "gpt2_picker", env=_env(), timeout=300)
    assert proc.returncode != 0 and "we need CUDA for DDP" in proc.stdout + proc.stderr


@pytest.mark.slow
def test_word_lm_trains_and_reloads_on_emulated_neuron(tmp_path, emulator):
    work, _ = _rewrite(tmp_path, "word_lm")
    proc = subprocess.run([sys.executable, "main.py", "--epochs", "2"], cwd=work, env=_env(), capture_output=True,
                          text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    valid = [float(x) for x in re.findall(r"end of epoch +\d+ \| valid loss +([0-9.]+)", proc.stdout)]
    assert len(valid) == 2 and valid[-1] < 1.0, proc.stdout  # a 20-word cycle: the loss falls far below log(20) = 3.0
    # the best model was saved from the device and loaded back onto it
    assert re.search(r"^device neuron best valid loss", proc.stdout, re.M), proc.stdout


@pytest.mark.slow
def test_cifar_style_program_trains_and_resumes_on_emulated_neuron(tmp_path, emulator):
    before = subprocess.run([sys.executable, "main.py", "--epochs", "1"], cwd=PROGRAMS / "cifar_dp", env=_env(),
                            capture_output=True, text=True, timeout=300)
    shutil.rmtree(PROGRAMS / "cifar_dp" / "checkpoint", ignore_errors=True)
    assert before.returncode == 0 and "device cpu" in before.stdout, before.stdout + before.stderr[-3000:]
    work, _ = _rewrite(tmp_path, "cifar_dp")
    proc = subprocess.run([sys.executable, "main.py", "--epochs", "3"], cwd=work, env=_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    m = re.search(r"^device (\w+) best accuracy ([0-9.]+) keys (\S+)", proc.stdout, re.M)
    # on the neuron device, unwrapped: the checkpoint's keys carry no `module.` prefix
    assert m and m.group(1) == "neuron" and float(m.group(2)) > 80 and m.group(3) == "conv.bias", proc.stdout
    again = subprocess.run([sys.executable, "main.py", "--epochs", "1", "--resume"], cwd=work, env=_env(),
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "resumed at epoch" in again.stdout, again.stdout + again.stderr[-4000:]
    assert re.search(r"^device neuron best accuracy", again.stdout, re.M), again.stdout


@pytest.mark.slow
def test_tensor_parallel_example_trains_under_torchrun(tmp_path, emulator):
    work, _ = _rewrite(tmp_path, "tp_mesh")
    proc = run_torchrun(["tp_train.py"], nproc=2, cwd=work, env=_env(), timeout=400)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    found = re.findall(r"rank (\d) device (\w+) shard \((\d+), (\d+)\) first ([0-9.]+) last ([0-9.]+)", out)
    assert sorted(f[0] for f in found) == ["0", "1"], out[-4000:]
    # each rank holds half of the first layer's rows, on the neuron device; the row-parallel output is all-reduced, so
    # both ranks computed the same losses, and training lowered them
    assert all(f[1] == "neuron" and f[2:4] == ("16", "10") for f in found), found
    assert len({f[4:] for f in found}) == 1 and float(found[0][5]) < float(found[0][4]), found


def test_ddp_series_snapshot_load_maps_device_tensors(tmp_path):
    work, out = _rewrite(tmp_path, "ddp_series")
    text = (work / "multigpu_torchrun.py").read_text()
    assert ('snapshot = torch.load(snapshot_path, map_location=lambda storage, location: storage if location == "cpu" '
            'else storage.to(device="neuron"))') in text, text
    # the module went to this rank's device by its index (`self.model = model.to(self.gpu_id)`): device_ids names that
    # device and stays (NM209), as it does for a module bound to a plain name
    assert 'init_process_group(backend="neuron")' in text and "DDP(self.model, device_ids=[self.gpu_id])" in text
    spawned = (work / "multigpu.py").read_text()
    assert "torch.cuda" not in spawned and "world_size = torch.accelerator.device_count()" in spawned, spawned


def _series_run(work: Path, logs: Path, nproc: int, epochs: int) -> str:
    proc = run_torchrun(["multigpu_torchrun.py", str(epochs), "1", "--batch_size", "16"], nproc=nproc, cwd=work,
                        env=_env(logs), timeout=400)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
def test_ddp_series_trains_and_resumes_under_torchrun(tmp_path, emulator, nproc):
    """The torchrun program trains (its loss falls: the optimizer built before model.to() trains the model on the
    device), ranks end equal in one group, and a restarted job resumes from rank 0's snapshot on every rank."""
    work, _ = _rewrite(tmp_path, "ddp_series")
    out = _series_run(work, tmp_path / "logs1", nproc, 3)
    losses = [float(m.group(1)) for m in re.finditer(r"rank 0 epoch \d loss ([0-9.]+)", out)]
    assert len(losses) == 3 and losses[-1] < 0.95 * losses[0], out[-3000:]  # untrained: equal every epoch
    first = _final(out, r"rank (?P<rank>\d) device neuron checksum (?P<checksum>-?[0-9]+\.[0-9]{6})", nproc)
    _groups(tmp_path / "logs1", nproc)
    assert (work / "snapshot.pt").exists()
    out = _series_run(work, tmp_path / "logs2", nproc, 5)  # resumes at the snapshot's epoch on every rank
    assert "Loading snapshot" in out and "rank 0 epoch 0 loss" not in out, out[-3000:]
    again = _final(out, r"rank (?P<rank>\d) device neuron checksum (?P<checksum>-?[0-9]+\.[0-9]{6})", nproc)
    assert again[0].group("checksum") != first[0].group("checksum")  # it trained on from the snapshot


@pytest.mark.slow
def test_ddp_series_spawned_workers_train(tmp_path, emulator):
    work, _ = _rewrite(tmp_path, "ddp_series")
    logs = tmp_path / "collectives"
    env = dict(_env(logs), NM_EMULATOR_DEVICES="2", TUTORIAL_PORT=str(_port()))  # devices seen = workers spawned
    proc = subprocess.run([sys.executable, "multigpu.py", "3", "1", "--batch_size", "16"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=400)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    losses = [float(m.group(1)) for m in re.finditer(r"rank 0 epoch \d loss ([0-9.]+)", out)]
    assert len(losses) == 3 and losses[-1] < 0.95 * losses[0], out[-3000:]  # untrained: equal every epoch
    _final(out, r"rank (?P<rank>\d) device neuron checksum (?P<checksum>-?[0-9]+\.[0-9]{6})", 2)
    _groups(logs, 2)
