"""The helpers NM110-NM129 insert behave like the torch_xla calls they replace (CPU, gloo).

Each helper's source is formatted as a fix would insert it and executed; then it runs in one process without a
process group (torch_xla's single-device behaviour) and in two gloo processes.
"""
from __future__ import annotations

import importlib.util
import io
import os
import sys
import tempfile
from contextlib import redirect_stdout

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.utils._pytree as pytree  # noqa: E402

from neuron_migrate.rules.helpers import HELPERS  # noqa: E402
from neuron_migrate.rules.builtin import xla_distributed_helpers  # noqa: E402,F401

HAVE_NUMPY = importlib.util.find_spec("numpy") is not None
SPELLING = {"torch.distributed": "dist", "torch": "torch", "os": "os", "torch.utils._pytree": "pytree"}


def helpers_namespace() -> dict:
    ns = {"dist": dist, "torch": torch, "os": os, "pytree": pytree}
    for name, spec in HELPERS.items():
        if not name.startswith("_neuron_"):
            continue
        names = {ph: SPELLING[module] for ph, module in (spec.imports or {}).items()}
        exec(compile(spec.source.format(**names), f"<{name}>", "exec"), ns)
    return ns


def test_single_process_matches_torch_xla(tmp_path, monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    assert not dist.is_initialized()
    h = helpers_namespace()
    t = torch.tensor([1.0, 2.0])
    out = h["_neuron_all_reduce"]("sum", t, scale=0.5)
    assert out is not t and torch.equal(out, t)  # a copy; one process skips the scale, as XLA did
    lst = [t]
    assert h["_neuron_all_reduce"]("max", lst) is lst
    assert torch.equal(h["_neuron_all_gather"](t.view(1, 2), dim=1), t.view(1, 2))
    assert torch.equal(h["_neuron_reduce_scatter"]("sum", t, 2.0, 0, 1), t * 2)
    with pytest.raises(ValueError):
        h["_neuron_reduce_scatter"]("sum", t, 1.0, 0, 2)
    assert h["_neuron_rendezvous"]("tag", b"x") == [b"x"]
    assert h["_neuron_mesh_reduce"]("acc", t, lambda xs: len(xs)) == 1
    assert h["_neuron_ordinal"](5) == 5 and h["_neuron_xrt_world_size"](3) == 3
    assert h["_neuron_is_master_ordinal"]() and h["_neuron_is_master_ordinal"](local=False)
    buf = io.StringIO()
    with redirect_stdout(buf):
        h["_neuron_master_print"]("hello", 1)
    assert buf.getvalue() == "hello 1\n"

    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    model(torch.ones(1, 2)).sum().backward()
    before = model.weight.detach().clone()
    assert h["_neuron_optimizer_step"](opt, barrier=True) is None
    assert torch.equal(model.weight.detach(), before - 1.0)

    shared = torch.ones(2)
    path = tmp_path / "ckpt.pt"
    h["_neuron_save"]({"a": shared, "b": shared, "n": (1, shared)}, str(path))
    loaded = torch.load(path)
    assert loaded["a"] is loaded["b"] and loaded["n"][0] == 1  # shared tensors stay shared
    monkeypatch.setenv("LOCAL_RANK", "1")
    h["_neuron_save"]({"x": 1}, str(tmp_path / "not_master.pt"))
    assert not (tmp_path / "not_master.pt").exists()
    h["_neuron_save"]({"x": 1}, str(tmp_path / "every.pt"), master_only=False)
    assert (tmp_path / "every.pt").exists()
    monkeypatch.delenv("LOCAL_RANK")
    assert h["_neuron_serial_executor"]().run(lambda: 7) == 7


def _worker(rank: int, world: int, store: str, tmp: str) -> None:
    os.environ["LOCAL_RANK"] = str(rank)
    os.environ["LOCAL_WORLD_SIZE"] = str(world)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        h = helpers_namespace()
        t = torch.tensor([float(rank + 1)])
        out = h["_neuron_all_reduce"]("sum", t, scale=0.5)
        assert t.item() == rank + 1 and out.item() == 1.5, out  # out of place, scaled
        lst = [torch.tensor([float(rank)]), torch.tensor([2.0 + rank])]
        assert h["_neuron_all_reduce"]("max", lst) is lst and lst[0].item() == 1.0 and lst[1].item() == 3.0
        g = h["_neuron_all_gather"](torch.full((1, 2), float(rank)), dim=1)
        assert g.tolist() == [[0.0, 0.0, 1.0, 1.0]], g
        if HAVE_NUMPY:  # dist.all_gather_object needs numpy
            assert h["_neuron_rendezvous"]("x", f"p{rank}") == ["p0", "p1"]
            assert h["_neuron_mesh_reduce"]("m", torch.tensor(rank), lambda xs: [int(x) for x in xs]) == [0, 1]
        w = [torch.tensor([float(rank)])]
        h["_neuron_collective_broadcast"](w, root_ordinal=1)
        assert w[0].item() == 1.0

        torch.manual_seed(rank)
        model = torch.nn.Linear(2, 1)
        h["_neuron_broadcast_master_param"](model)
        ref = [torch.zeros_like(model.weight) for _ in range(world)]
        dist.all_gather(ref, model.weight.detach())
        assert torch.equal(ref[0], ref[1])
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        model(torch.full((1, 2), float(rank + 1))).sum().backward()
        h["_neuron_reduce_gradients"](opt)
        assert model.weight.grad.tolist() == [[1.5, 1.5]]  # mean of 1 and 2

        h["_neuron_save"]({"rank": rank}, os.path.join(tmp, "local.pt"))
        assert torch.load(os.path.join(tmp, "local.pt"))["rank"] == 0  # only local rank 0 wrote
        assert h["_neuron_is_master_ordinal"]() == (rank == 0)
        assert h["_neuron_rank"]() == rank and h["_neuron_world_size"]() == world
        order = h["_neuron_serial_executor"]().run(lambda: rank)
        assert order == rank
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not dist.is_available() or sys.platform == "win32", reason="needs torch.distributed with gloo")
@pytest.mark.slow
def test_two_processes_match_torch_xla():
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(2, os.path.join(tmp, "store"), tmp), nprocs=2, join=True)
