"""The emulated neuron device follows torch's rules for accelerators, measured.

A program that runs on CUDA and on the CPU must run on the emulated device (unless the compatibility table says
TorchNeuron cannot run it), and a program CUDA rejects must be rejected here too, at the same op. Each semantic
is measured in one fresh process (the device installed, see conftest.run_emulated) and compared with torch's
rule for it:

- mixed devices: CPU tensors with 0 dims (what a Python number becomes: `1 - x` reaches a backend as
  `sub(cpu_scalar, x)`) may meet device tensors and the result is on the device; any other CPU tensor raises
  "Expected all tensors to be on the same device". For the TensorIterator ops, torch's own implementation of the
  rule is measured too: the `meta` device, in the same process, must accept and reject the same cases;
- gradients land on the device of the tensor they are for (autograd moves a 0-dim gradient to its tensor);
- pinned memory is pinned, non_blocking copies are copies;
- a `torch.Generator("neuron")` is a device generator; a CPU generator in a device op raises, as on CUDA; random ops
  without a generator draw from the device's default generator (seeded by torch.manual_seed), not the host's;
- torch.accelerator queries, streams and events (no-ops; `record_stream` on a device stream too), the
  allocator's statistics;
- an op the table calls native runs for dtypes its host kernel lacks (upcast, cast back, recorded); an op the
  device runs through the CPU fallback does not (TorchNeuron's fallback runs the same host kernel).
"""
from __future__ import annotations

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

# (name, expression on x = ones(2, 3) on the device DEV, a CUDA program runs it?, a TensorIterator op (meta
# implements the same rule)?)
MIXED = [
    ("python number first (rsub)", "1 - x", True, True),
    ("0-dim CPU tensor first", "torch.tensor(2.0) * x", True, True),
    ("0-dim CPU tensor second", "x * torch.tensor(2.0)", True, True),
    ("0-dim CPU tensor in where", "torch.where(x > 0, x, torch.tensor(0.0))", True, True),
    ("0-dim CPU bounds in clamp", "torch.clamp(x, torch.tensor(0.0), torch.tensor(1.0))", True, True),
    ("0-dim CPU weight in lerp", "torch.lerp(x, x, torch.tensor(0.5))", True, True),
    ("CPU tensor second", "x * torch.ones(2, 3)", False, True),
    ("CPU tensor first", "torch.ones(2, 3) * x", False, True),
    ("CPU tensor in where", "torch.where(x > 0, x, torch.ones(2, 3))", False, True),
    ("CPU tensor in cat", "torch.cat([x, torch.ones(2, 3)])", False, True),
    ("CPU tensor in addmm", "torch.addmm(torch.ones(3), x, torch.ones(3, 3))", False, True),
    ("CPU index list", "x[torch.tensor([0, 1])]", True, True),
    ("CPU boolean mask", "x[torch.tensor([True, False])]", True, False),
    ("CPU tensor into an in-place op", "x.clone().add_(torch.ones(2, 3))", False, False),
    ("device tensor into a CPU 0-dim in-place op", "torch.tensor(1.0).add_(x.sum())", False, False),
    ("packed sequence (CPU lengths)",
     "torch.nn.utils.rnn.pad_packed_sequence(torch.nn.utils.rnn.pack_padded_sequence("
     "x.unsqueeze(-1), torch.tensor([3, 2]), batch_first=True), batch_first=True)[0]", True, False),
]

SNIPPET = r'''
import math
MIXED = %(mixed)r

def outcome(expr, dev):
    x = torch.ones(2, 3, device=dev)
    try:
        out = eval(expr)
    except (RuntimeError, NotImplementedError) as exc:
        return {"ok": False, "error": str(exc).splitlines()[0][:300]}
    return {"ok": True, "device": out.device.type}

mixed = {name: {"neuron": outcome(expr, "neuron"), "meta": outcome(expr, "meta")} for name, expr, _, _ in MIXED}

# the model pattern of issue 40 (TimeSeriesTransformer's weighted_average after a Student-t log_prob)
p = torch.randn(2, 4).to("neuron").requires_grad_()
loss = 1 - p.exp()
w = torch.ones(2, 4, device="neuron")
weighted = torch.where(w != 0, loss * w, torch.zeros_like(loss))
weighted.sum().backward()
where_backward = {"loss": loss.device.type, "grad": p.grad.device.type}

# gradient devices
s = torch.tensor(2.0, requires_grad=True)
leaf = torch.arange(3.0).to("neuron").requires_grad_()
(leaf * s).sum().backward()
s_cpu = torch.tensor(2.0, requires_grad=True)
(torch.arange(3.0) * s_cpu).sum().backward()
grads = {"leaf": str(leaf.grad.device), "scalar": str(s.grad.device), "scalar_value": s.grad.item(),
         "scalar_value_cpu": s_cpu.grad.item(), "leaf_value": leaf.grad.cpu().tolist()}

# pinned memory and non_blocking copies
h = torch.arange(6.0)
dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(4, 2)), batch_size=2, pin_memory=True)
d = h.to("neuron", non_blocking=True)
memory = {"pinned": h.pin_memory().is_pinned(), "plain": h.is_pinned(),
          "empty_pinned": torch.empty(3, pin_memory=True).is_pinned(),
          "pinned_view": h.pin_memory()[2:].is_pinned(),
          "dataloader": next(iter(dl))[0].is_pinned(),
          "to_device": d.device.type, "to_device_equal": torch.equal(d.cpu(), h),
          "to_host_equal": torch.equal(d.to("cpu", non_blocking=True), h)}

# generators
g = torch.Generator("neuron").manual_seed(7)
a = torch.randn(4, device="neuron", generator=g)
g.manual_seed(7)
b = torch.randn(4, device="neuron", generator=g)
state = g.get_state()
c1 = torch.rand(3, device="neuron", generator=g)
g.set_state(state)
c2 = torch.rand(3, device="neuron", generator=g)
try:
    torch.randn(2, device="neuron", generator=torch.Generator("cpu"))
    cpu_gen = None
except RuntimeError as exc:
    cpu_gen = str(exc)
# the device's default generator: random ops on the device without a generator draw from it (torch.manual_seed
# seeds it through torch.neuron.manual_seed_all), so a draw on the host in between does not move it, as on CUDA
torch.manual_seed(0)
r1, d1 = torch.rand(3, device="neuron"), torch.nn.functional.dropout(torch.ones(16, device="neuron"), 0.5)
torch.manual_seed(0)
host_draw = torch.rand(5)
r2, d2 = torch.rand(3, device="neuron"), torch.nn.functional.dropout(torch.ones(16, device="neuron"), 0.5)
rng = torch.neuron.get_rng_state()
x1 = torch.randperm(8, device="neuron")
torch.neuron.set_rng_state(rng)
x2 = torch.randperm(8, device="neuron")
torch.manual_seed(3)
torch.neuron.manual_seed(5)
default_generator = {"host_draw_does_not_move_it": torch.equal(r1, r2) and torch.equal(d1, d2),
                     "state_roundtrip": torch.equal(x1, x2) and x1.device.type == "neuron",
                     "seeds": [torch.neuron.initial_seed(), torch.initial_seed()],
                     "generator": str(torch.neuron.default_generator().device)}
generators = {"device": str(g.device), "same_seed_same_values": torch.equal(a, b), "on_device": a.device.type,
              "state_roundtrip": torch.equal(c1, c2), "cpu_generator_error": cpu_gen,
              "dropout": torch.nn.functional.dropout(torch.ones(8, device="neuron"), 0.5).device.type}

# torch.accelerator, streams, events
acc = torch.accelerator
st = torch.Stream("neuron")
e1, e2 = torch.Event("neuron", enable_timing=True), torch.Event("neuron", enable_timing=True)
e1.record(); e2.record(); e2.synchronize()
with torch.neuron.stream(torch.neuron.Stream()):
    in_stream = (torch.ones(2, device="neuron") + 1).sum().item()
r = torch.ones(2, device="neuron")
r.record_stream(acc.current_stream())  # FSDP1 calls it on every unsharded parameter
try:
    r.record_stream(torch.Stream("cpu"))
    record_cpu = None
except RuntimeError as exc:
    record_cpu = str(exc)
accel = {"available": acc.is_available(), "count": acc.device_count(), "index": acc.current_device_index(),
         "type": acc.current_accelerator().type, "sync": acc.synchronize() is None,
         "stream_device": str(st.device), "stream_query": st.query(), "current_stream": str(acc.current_stream().device),
         "event_query": e1.query(), "elapsed_ms": e1.elapsed_time(e2), "in_stream": in_stream,
         "record_stream_cpu": record_cpu,
         "neuron_module": [torch.neuron.is_available(), torch.neuron.device_count(), torch.neuron.current_device()]}

# the allocator's statistics
acc.reset_peak_memory_stats()
before = acc.memory_allocated()
t = torch.empty(1000, dtype=torch.float32, device="neuron")
during = acc.memory_allocated()
del t
after = acc.memory_allocated()
stats = acc.memory_stats()
alloc = {"grew": during - before, "freed": during - after, "peak_at_least": acc.max_memory_allocated() - before,
         "neuron_module": torch.neuron.memory_allocated() == acc.memory_allocated(),
         "has_stats": "allocated_bytes.all.current" in stats, "info": list(acc.get_memory_info())}

# dtypes the host kernel lacks: histc on int32 (what transformers' MoE code runs on an accelerator)
emu.clear_op_tracking()
ids = torch.tensor([0, 1, 1, 3, 3, 3], dtype=torch.int32)
hist = torch.histc(ids.to("neuron"), bins=4, min=0, max=3)
upcast = {"dtype": str(hist.dtype), "device": hist.device.type, "values": hist.cpu().tolist(),
          "reference": torch.histc(ids.double(), bins=4, min=0, max=3).int().tolist(),
          "recorded": emu.get_upcast_ops()}
try:
    torch.histc(ids, bins=4, min=0, max=3)
    upcast["host"] = "runs"
except (RuntimeError, NotImplementedError) as exc:
    upcast["host"] = str(exc)

result = {"mixed": mixed, "where_backward": where_backward, "grads": grads, "memory": memory,
          "generators": generators, "default_generator": default_generator, "accel": accel, "alloc": alloc, "upcast": upcast}
'''


@pytest.fixture(scope="module")
def measured(run_emulated):
    return run_emulated(SNIPPET % {"mixed": MIXED})


@pytest.mark.parametrize("name,expr,cuda_runs,iterator", MIXED, ids=[m[0] for m in MIXED])
def test_mixed_devices_follow_the_cuda_rule(measured, name, expr, cuda_runs, iterator):
    got = measured["mixed"][name]["neuron"]
    assert got["ok"] is cuda_runs, (expr, got)
    if cuda_runs:
        assert got["device"] == "neuron", (expr, got)
    else:
        assert "same device" in got["error"] or "Expected" in got["error"], got
    if iterator:  # torch's own implementation of the rule agrees
        assert measured["mixed"][name]["meta"]["ok"] is cuda_runs, measured["mixed"][name]


def test_issue_40_where_backward_runs_and_stays_on_the_device(measured):
    # `1 - x` used to come back on the CPU (the host kernel put the result where its first tensor, a CPU scalar,
    # was) and WhereBackward0 then failed: "expected device cpu but got neuron:0"
    assert measured["where_backward"] == {"loss": "neuron", "grad": "neuron"}


def test_gradients_land_on_their_tensors_device(measured):
    g = measured["grads"]
    assert g["leaf"] == "neuron:0" and g["leaf_value"] == [2.0, 2.0, 2.0]
    # a 0-dim CPU tensor used with device tensors gets a CPU gradient, equal to an all-CPU run
    assert g["scalar"] == "cpu" and g["scalar_value"] == g["scalar_value_cpu"] == 3.0


def test_pinned_memory_and_non_blocking_copies(measured):
    m = measured["memory"]
    assert m["pinned"] and m["empty_pinned"] and m["pinned_view"] and m["dataloader"]
    assert not m["plain"]
    assert m["to_device"] == "neuron" and m["to_device_equal"] and m["to_host_equal"]


def test_device_generators(measured):
    g = measured["generators"]
    assert g["device"] == "neuron:0" and g["on_device"] == "neuron"
    assert g["same_seed_same_values"] and g["state_roundtrip"]
    assert "Expected a 'neuron' device type for generator but found 'cpu'" in g["cpu_generator_error"]
    assert g["dropout"] == "neuron"


def test_random_ops_draw_from_the_devices_default_generator(measured):
    g = measured["default_generator"]
    assert g["host_draw_does_not_move_it"] and g["state_roundtrip"]
    assert g["seeds"] == [5, 3]  # torch.neuron.manual_seed seeds the device's generator, not the host's
    assert g["generator"] == "neuron:0"


def test_accelerator_queries_streams_and_events(measured):
    a = measured["accel"]
    assert a["available"] and a["count"] == 1 and a["index"] == 0 and a["type"] == "neuron" and a["sync"]
    assert a["stream_device"] == "neuron:0" and a["stream_query"] and a["current_stream"] == "neuron:0"
    assert a["event_query"] and a["elapsed_ms"] >= 0.0  # measured host time; only its sign is checked
    assert a["in_stream"] == 4.0 and a["neuron_module"] == [True, 1, 0]
    assert "expected a neuron stream" in a["record_stream_cpu"]  # a neuron stream was recorded without error


def test_allocator_statistics(measured):
    a = measured["alloc"]
    assert a["grew"] == 4000 and a["freed"] == 4000 and a["peak_at_least"] >= 4000
    assert a["neuron_module"] and a["has_stats"]
    free, total = a["info"]
    assert 0 < free <= total


def test_native_op_missing_a_host_dtype_runs_upcast(measured):
    u = measured["upcast"]
    assert "not implemented for 'Int'" in u["host"]  # the host kernel really lacks it
    assert u["dtype"] == "torch.int32" and u["device"] == "neuron"
    assert u["values"] == u["reference"] == [1, 2, 0, 3]
    assert u["recorded"] == ["aten::histc:Int->Double"]


def test_fallback_op_missing_a_host_dtype_still_fails(run_emulated):
    # TorchNeuron's CPU fallback runs the same host kernel: without a device kernel, histc on int32 fails there too
    r = run_emulated("""
        try:
            torch.histc(torch.tensor([0, 1], dtype=torch.int32, device="neuron"), bins=2, min=0, max=1)
            result = "runs"
        except (RuntimeError, NotImplementedError) as exc:
            result = str(exc)
    """, env={"NM_EMULATOR_NO_KERNEL": "aten::histc"})
    assert "not implemented for 'Int'" in r


def test_module_to_keeps_its_parameter_objects(run_emulated):
    """TorchNeuron lets a CPU and a neuron tensor swap contents through `.data =` (its
    _has_compatible_shallow_copy_type), as CUDA does for CPU and CUDA tensors: `model.to("neuron")` keeps each
    Parameter object, so an optimizer built before the move (the DDP tutorial's Trainer: model.to(gpu_id) after
    load_train_objs built the optimizer) trains the model. torch's default for a PrivateUse1 backend makes new
    Parameters instead, and such a program silently never trained here."""
    r = run_emulated("""
        model = torch.nn.Linear(2, 1)
        weight = model.weight
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        model.to("neuron")
        before = model.weight.detach().cpu().clone()
        model(torch.ones(4, 2, device="neuron")).sum().backward()
        opt.step()
        result = [model.weight is weight, str(weight.device), (model.weight.detach().cpu() - before).abs().sum().item()]
    """)
    assert r[0] is True and r[1] == "neuron:0" and r[2] == pytest.approx(4.0), r


def test_batch_norm_running_statistics_update_on_the_device(run_emulated):
    """native_batch_norm updates its running mean and variance in training mode without its schema marking them as
    written (`Tensor? running_mean`), so the boxed CPU fallback updated a host copy and dropped it: every BatchNorm
    model kept zeros and ones as its statistics on the emulated device, and its eval outputs and checkpoints were
    wrong (found running a UNet sample). They are handed to the host kernel as aliases now: the same numbers as on
    the CPU."""
    r = run_emulated("""
        torch.manual_seed(0)
        x = torch.randn(4, 3, 5, 5) + 2.0
        out = {}
        for dev in ("cpu", "neuron"):
            bn = torch.nn.BatchNorm2d(3).to(dev)
            bn(x.to(dev))
            bn(x.to(dev) * 2)
            bn.eval()
            out[dev] = [bn.running_mean.cpu().tolist(), bn.running_var.cpu().tolist(), int(bn.num_batches_tracked),
                        bn(x.to(dev)).cpu().sum().item()]
        result = out
    """)
    cpu, dev = r["cpu"], r["neuron"]
    assert dev[0] == pytest.approx(cpu[0]) and dev[1] == pytest.approx(cpu[1]) and dev[2] == cpu[2] == 2, r
    assert cpu[0] != pytest.approx([0.0, 0.0, 0.0]) and dev[3] == pytest.approx(cpu[3], rel=1e-5), r
