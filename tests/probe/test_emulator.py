"""The emulated neuron device itself (a real PrivateUse1 backend built with g++): device API, kernels
chosen from the compat table, tracking, unsupported ops, collectives, the build cache. Each check runs in a
fresh process (see conftest.run_emulated)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from neuron_migrate.probe.emulator import build  # noqa: E402

from .helpers import MODELS, REPO, rel, run_json  # noqa: E402


@pytest.mark.slow
def test_device_api(run_emulated):
    r = run_emulated("""
        x = torch.randn(3, 4).to("neuron")
        m = torch.nn.Linear(4, 2).neuron()
        has = torch._C._dispatch_has_kernel_for_dispatch_key
        result = {
            "device": str(x.device), "is_neuron": x.is_neuron, "param": str(next(m.parameters()).device),
            "accelerator": torch.accelerator.current_accelerator().type, "count": torch.neuron.device_count(),
            "item": torch.ones(2, device="neuron").sum().item(), "roundtrip": bool(torch.equal(x.cpu(), x.to("cpu"))),
            "addmm_kernel": has("aten::addmm", "PrivateUse1"), "atan2_kernel": has("aten::atan2", "PrivateUse1"),
            "view": x.view(12).shape[0], "strided": x.t().contiguous().is_contiguous(),
        }
    """)
    assert r["device"] == "neuron:0" and r["is_neuron"] and r["param"] == "neuron:0"
    assert r["accelerator"] == "neuron" and r["count"] == 1 and r["item"] == 2.0 and r["roundtrip"]
    # the table calls addmm native (a device kernel) and atan2 a CPU fallback (no kernel: the boxed fallback)
    assert r["addmm_kernel"] is True and r["atan2_kernel"] is False
    assert r["view"] == 12 and r["strided"]


@pytest.mark.slow
def test_training_on_the_device_matches_the_cpu(run_emulated):
    r = run_emulated("""
        def train(device):
            torch.manual_seed(0)
            m = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)).to(device)
            opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
            x, y = torch.randn(16, 6).to(device), torch.randn(16, 1).to(device)
            for _ in range(5):
                loss = torch.nn.functional.mse_loss(m(x), y)
                opt.zero_grad(); loss.backward(); opt.step()
            return [p.detach().cpu() for p in m.parameters()], loss.item()
        emu.clear_op_tracking()
        dev, dloss = train("neuron")
        executed, fallback = emu.get_executed_ops(), emu.get_fallback_ops()
        ref, rloss = train("cpu")
        result = {"same": all(torch.allclose(a, b, atol=1e-6) for a, b in zip(dev, ref)), "loss": [dloss, rloss],
                  "executed": executed, "fallback": fallback}
    """)
    assert r["same"] and abs(r["loss"][0] - r["loss"][1]) < 1e-6
    # the device's dispatch path: AdamW takes the _foreach_ kernels on a PrivateUse1 device
    assert {"aten::addmm", "aten::mm", "aten::threshold_backward"} <= set(r["executed"])
    assert any(op.startswith("aten::_foreach_") for op in r["executed"])
    assert "aten::addmm" not in r["fallback"]


@pytest.mark.slow
def test_conjugate_and_negative_views_reach_the_host_kernels(run_emulated):
    """The backward of a complex multiply (rotary embeddings: pytorch/examples' llama2_model.py under FSDP + TP) hands
    conjugate views to the kernels; a host kernel of such a view once recursed until the process crashed (SIGSEGV)."""
    r = run_emulated("""
        torch.manual_seed(0)
        x, w = torch.randn(4, dtype=torch.cfloat), torch.randn(4, dtype=torch.cfloat)
        xd = x.to("neuron").requires_grad_()
        torch.view_as_real(xd * w.to("neuron")).sum().backward()
        xc = x.clone().requires_grad_()
        torch.view_as_real(xc * w).sum().backward()
        n = torch.randn(3)
        result = {"grad": bool(torch.allclose(xd.grad.cpu(), xc.grad)),
                  "conj": bool(torch.equal(torch.exp(w.to("neuron").conj()).cpu(), torch.exp(w.conj()))),
                  "neg": bool(torch.equal(torch._neg_view(n.to("neuron")).exp().cpu(), (-n).exp()))}
    """)
    assert r == {"grad": True, "conj": True, "neg": True}


@pytest.mark.slow
def test_dispatch_path_differs_from_the_cpu(run_emulated):
    r = run_emulated("""
        from torch.utils._python_dispatch import TorchDispatchMode
        class Seen(TorchDispatchMode):
            def __init__(self):
                super().__init__(); self.ops = set()
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                self.ops.add(func._opname); return func(*args, **(kwargs or {}))
        out = {}
        for dev in ("neuron", "cpu"):
            x = torch.randn(4, 8, device=dev, requires_grad=True)
            with Seen() as s:
                torch.nn.functional.dropout(x, 0.5, training=True).sum().backward()
            out[dev] = sorted(s.ops)
        a, b = torch.randn(3, device="neuron"), torch.randn(3, device="neuron")  # normal_: a fallback too
        emu.clear_op_tracking()
        torch.atan2(a, b)
        out["fallback"] = emu.get_fallback_ops()
        out["counts"] = emu.op_counts("fallback")
        result = out
    """)
    assert "native_dropout" in r["neuron"] and "native_dropout" not in r["cpu"]
    assert "bernoulli_" in r["cpu"]
    # structured ops reach a backend without a kernel as their out= overload (the functional one is composite)
    assert r["fallback"] == ["aten::atan2"] and r["counts"] == {"aten::atan2.out": 1}


def _table_with_unsupported(tmp_path: Path, op: str) -> Path:
    shipped = REPO / "compat_table" / "torchneuron-2.13.3.yaml"
    t = tmp_path / "torchneuron-9.9.9.yaml"
    t.write_text(f"extends: {shipped}\nversion: 9.9.9\ntorch_neuronx: 9.9.9.0\nneuron_sdk: 2.33.0\ntorch: 2.13.0\n"
                 "sources: {}\nentries:\n"
                 f"- {{name: '{op}', kind: aten_op, status: unsupported, source: aws_rn_233, note: test entry}}\n")
    return t


@pytest.mark.slow
def test_unsupported_op_raises_like_the_device(run_emulated, tmp_path):
    table = _table_with_unsupported(tmp_path, "aten::atan2")
    code = """
        x = torch.randn(3, device="neuron")
        try:
            y = torch.atan2(x, x).cpu().tolist(); err = None
        except NotImplementedError as exc:
            y, err = None, str(exc)
        result = {"y": y, "err": err, "unsupported": emu.get_unsupported_ops()}
    """
    r = run_emulated(code, table=str(table))
    assert r["y"] is None and "atan2" in r["err"] and "not supported on the neuron device" in r["err"]
    assert r["unsupported"] == ["aten::atan2"]
    r = run_emulated(code, table=str(table), keep_going=True)  # recorded, computed on the host
    assert r["err"] is None and len(r["y"]) == 3 and r["unsupported"] == ["aten::atan2"]


def test_cache_key_follows_the_source(tmp_path, monkeypatch):
    cxx = build.find_compiler() or "g++"
    k1 = build.cache_key(cxx)
    src = tmp_path / "neuron_emulator.cpp"
    src.write_bytes(build.SOURCE.read_bytes() + b"\n// edited\n")
    monkeypatch.setattr(build, "SOURCE", src)
    assert build.cache_key(cxx) != k1 and build.cache_key(cxx).startswith("torch")


@pytest.mark.slow
def test_no_compiler_says_so_and_uses_the_cpu_trace(tmp_path):
    # an empty cache and no compiler on PATH: one clear line, then the CPU-trace probe (exit 0)
    env = {"NM_EMULATOR_CACHE": str(tmp_path / "cache"), "PATH": str(tmp_path / "nobin"), "CXX": "",
           "NM_EMULATOR_CXX": ""}
    rc, rep, p = run_json([f"{rel('mlp.py')}:make", "--steps", "1"], env_extra=env)
    assert rc == 0, p.stderr[-2000:]
    lines = [ln for ln in p.stderr.splitlines() if "no C++ compiler" in ln]
    assert len(lines) == 1 and "CPU trace" in lines[0]
    assert rep["device"] == "cpu" and rep["device_kind"] == "cpu"
    assert "CPU dispatch trace" in rep["device_reason"] and "no C++ compiler" in rep["device_reason"]
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.so"))


def test_device_cpu_is_labelled_as_the_cpu_trace():
    rc, rep, _ = run_json([f"{rel('mlp.py')}:make", "--steps", "1", "--device", "cpu"])
    assert rc == 0 and rep["device_kind"] == "cpu" and "CPU dispatch trace" in rep["device_reason"]
    assert "measured" not in rep  # no device tracking on the CPU trace


@pytest.mark.slow
def test_emulated_probe_reports_device_tracking(emulator_lib):
    rc, rep, p = run_json([f"{rel('fallback_model.py')}:make", "--steps", "2", "--device", "emulate"])
    assert rc == 0, p.stderr[-2000:]
    assert rep["device"] == "neuron" and rep["device_kind"] == "emulated"
    m = rep["measured"]
    assert m["emulated"] and m["source"].startswith("emulated")
    # everything the table does not give a device kernel reached the tracked fallback, with counts
    # (aten::_fft_r2c is rated partial since the complex-decomposition facts were entered, so it gets a kernel)
    assert {"aten::atan2", "aten::linalg_qr"} <= set(m["fallback_ops"])
    assert sum(n for k, n in m["fallback_counts"].items() if k.startswith("aten::atan2.")) == 2  # --steps 2
    assert m["host_untracked"] == []
    assert m["device"]["native_kernels"] > 100
    cmp = {r["op"]: r for r in m["comparison"]}
    assert cmp["aten::atan2"]["measured"] == "cpu_fallback" and cmp["aten::atan2"]["agree"] is True
    assert cmp["aten::addmm"]["measured"] == "native" and cmp["aten::addmm"]["agree"] is True
    assert not rep["timing"]["first_call_reported"]


def test_helpers_module_paths():
    assert (MODELS / "mlp.py").is_file() and os.path.isabs(sys.executable)


_PER_RANK = """
import os, torch, torch.distributed as dist
dist.init_process_group("neuron")
rank, local = dist.get_rank(), int(os.environ["LOCAL_RANK"])
x = torch.ones(2, device="neuron")
dist.all_reduce(x)
print(f"rank {rank} device {x.device} count {torch.neuron.device_count()} "
      f"current {torch.accelerator.current_device_index()} sum {x.sum().item()}", flush=True)
for index in (local, 0):
    try:
        torch.ones(1, device=f"neuron:{index}")
        print(f"rank {rank} index {index} ok", flush=True)
    except RuntimeError as exc:
        print(f"rank {rank} index {index} refused: {exc}", flush=True)
dist.barrier()
dist.destroy_process_group()
"""


def _two_ranks(tmp_path, name: str, text: str) -> str:
    """Output of `text` run as `name` by torchrun in 2 processes on the emulated device; its exit status must be 0."""
    sys.path.insert(0, str(REPO / "tests" / "integration"))
    from torchrun_util import run_torchrun

    (tmp_path / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if k not in ("NM_EMULATOR_DEVICES", "PYTHONPATH")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests" / "integration" / "neuron_emulated"), str(REPO)])
    proc = run_torchrun([name], nproc=2, cwd=tmp_path, env=env, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return out


@pytest.mark.slow
def test_each_distributed_process_owns_its_local_rank_device(emulator_lib, tmp_path):
    """As TorchNeuron's process group does (torch_neuronx/distributed/backend.py, c10_neuron's device.cpp): once the
    group starts, a process owns one NeuronCore whose PyTorch index is its local rank; device_count() is the local
    world size, `torch.device("neuron")` is that device, and any other index (a leftover `neuron:0` on rank 1) is
    refused."""
    out = _two_ranks(tmp_path, "per_rank.py", _PER_RANK)
    for rank in (0, 1):
        assert f"rank {rank} device neuron:{rank} count 2 current {rank} sum 4.0" in out, out[-4000:]
        assert f"rank {rank} index {rank} ok" in out, out[-4000:]
    assert "rank 1 index 0 refused: neuron (emulated): device neuron:0 does not attach to this process" in out, out


_SYNC_BN = """
import torch, torch.distributed as dist, torch.nn as nn
dist.init_process_group("neuron")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
full = torch.randn(8, 3, 5, 5)
mine = slice(rank * 8 // world, (rank + 1) * 8 // world)
scale = torch.arange(1.0, 4.0).view(1, 3, 1, 1)
model = nn.SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(nn.BatchNorm2d(3))).to("neuron")
ddp = nn.parallel.DistributedDataParallel(model)
x = full[mine].to("neuron").requires_grad_()
out = ddp(x)
(out * scale.to("neuron")).pow(2).sum().backward()
ref = nn.BatchNorm2d(3)  # one process, the whole batch: what SyncBatchNorm computes over the ranks' parts
xr = full.clone().requires_grad_()
ref_out = ref(xr)
(ref_out * scale).pow(2).sum().backward()
bn = model[0]
checks = {
    "out": torch.allclose(out.detach().cpu(), ref_out[mine].detach(), atol=1e-5),
    "input_grad": torch.allclose(x.grad.cpu(), xr.grad[mine], atol=1e-4),
    # DDP averages the ranks' weight gradients: each rank's part of the whole batch's gradient, over world
    "weight_grad": torch.allclose(bn.weight.grad.cpu() * world, ref.weight.grad, atol=1e-4),
    "bias_grad": torch.allclose(bn.bias.grad.cpu() * world, ref.bias.grad, atol=1e-4),
    "running": torch.allclose(bn.running_mean.cpu(), ref.running_mean, atol=1e-6)
               and torch.allclose(bn.running_var.cpu(), ref.running_var, atol=1e-5),
    "name": torch.get_device_module().get_device_name(),
    "props": torch.get_device_module().get_device_properties(rank).name,
}
print(f"rank {rank} {checks}", flush=True)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_sync_batch_norm_over_two_processes_matches_one_batch_norm(emulator_lib, tmp_path):
    """nn.SyncBatchNorm (DINO, MoCo, YOLO's --sync-bn) on two ranks: the five batch_norm_* ops TorchNeuron has device
    kernels for, and the all-gather of their statistics into a (1, world * C) tensor, compute what one BatchNorm
    computes over the whole batch. Also the device module's name and properties (torch-neuronx: "neuron:i")."""
    out = _two_ranks(tmp_path, "sync_bn.py", _SYNC_BN)
    for rank in (0, 1):
        assert (f"rank {rank} {{'out': True, 'input_grad': True, 'weight_grad': True, 'bias_grad': True, "
                f"'running': True, 'name': 'neuron:{rank}', 'props': 'neuron:{rank}'}}") in out, out[-4000:]
