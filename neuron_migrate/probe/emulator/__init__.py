"""The emulated `neuron` device: a real PrivateUse1 backend on any Linux machine with a C++ compiler.

`install()` builds the C++ backend once (`build.py`, cached per source/torch/ABI), loads it, names
PrivateUse1 `neuron` (`torch.device("neuron")`, `.to("neuron")`, `tensor.is_neuron`, `Module.neuron()`,
`torch.neuron.*`, `torch.accelerator`), registers device kernels for the op overloads the compatibility table
calls native (they compute on the host), raising kernels for the ones it calls unsupported, routes c10d
collectives on device tensors to gloo under the backend name `neuron`, and gives `torch.compile` a backend
named `neuron` (`compile.py`: dynamo + aot_autograd, graphs run eagerly, breaks recorded).

Op tracking mirrors torch_neuronx (`clear_op_tracking()`, `get_fallback_ops()`, `get_executed_ops()`, names
`aten::<op>`), so the probe's measured path is one code path for the emulated device and a Trn2 host.

Importing this module does not import torch.
"""
from __future__ import annotations

import os
import sys
import types
import warnings
from typing import Any, Iterable

from neuron_migrate.probe.emulator.build import EmulatorUnavailable, find_compiler, library_path

__all__ = ["EmulatorUnavailable", "install", "installed", "clear_op_tracking", "get_fallback_ops",
           "get_executed_ops", "get_unsupported_ops", "get_upcast_ops", "op_counts", "kernel_sets", "find_compiler", "library_path"]

__version__ = "emulated"
EMULATED = True
BACKEND_NAME = "neuron"

_state: dict[str, Any] = {}


def installed() -> bool:
    return bool(_state.get("installed"))


# ---------------------------------------------------------------------------------------------- kernel sets


# Data movement the host computation itself uses (a device kernel for these would call itself), and what the C++
# side defines: these keep their default paths.
_CORE_OPS = frozenset({
    "_to_copy", "copy_", "_copy_from", "_copy_from_and_resize", "empty", "empty_strided", "resize_", "set_",
    "_local_scalar_dense", "lift_fresh", "_has_compatible_shallow_copy_type", "to", "_pin_memory", "is_pinned",
})


def _is_view(op) -> bool:
    return any(r.alias_info is not None and not r.alias_info.is_write for r in op._schema.returns)


def kernel_sets(table) -> dict[str, list[str]]:
    """{'native': [...], 'unsupported': [...]}: the aten overloads that get device kernels / raising kernels.

    An overload is looked up in the table as the probe's report does (`table.op("aten::x.overload")`). Left out,
    because a backend kernel would not be reached or would break the op: composite-implicit overloads (they
    decompose into other ops before reaching a backend), views (real views, done by the core kernels),
    overloads without a CPU kernel to compute with, and the core kernels the C++ side already defines.
    """
    import torch

    has = torch._C._dispatch_has_kernel_for_dispatch_key
    computed = torch._C._dispatch_has_computed_kernel_for_dispatch_key
    out: dict[str, list[str]] = {"native": [], "unsupported": []}
    if table is None:
        return out
    for name in torch._C._dispatch_get_all_op_names():
        if not name.startswith("aten::"):
            continue
        entry = table.op(name)
        if entry is None:
            continue
        status = str(getattr(entry.status, "value", entry.status))
        kind = {"native": "native", "partial": "native", "unsupported": "unsupported"}.get(status)
        if kind is None:
            continue
        try:
            if has(name, "CompositeImplicitAutograd") or has(name, "PrivateUse1"):
                continue
            if kind == "native" and not computed(name, "CPU"):
                continue
            base, _, ovl = name[len("aten::"):].partition(".")
            if base in _CORE_OPS:
                continue
            if _is_view(getattr(getattr(torch.ops.aten, base), ovl or "default")):
                continue
        except Exception:  # noqa: BLE001 - an op the Python bindings cannot see: leave it to the fallback
            continue
        out[kind].append(name)
    return out


# ---------------------------------------------------------------------------------------------- tracking


def _ops():
    import torch

    return torch.ops.neuron_emu


def op_counts(kind: str) -> dict[str, int]:
    """Calls per overload (`aten::addmm.default` style keys) seen by the device: kind is fallback, executed or
    unsupported."""
    names, counts = _ops().tracked(kind)
    return {(n if "." in n.split("::", 1)[-1] else n + ".default"): int(c) for n, c in zip(names, counts)}


def _bases(kind: str) -> list[str]:
    names, _ = _ops().tracked(kind)
    return sorted({n.split(".", 1)[0] for n in names})


def clear_op_tracking() -> None:
    _ops().clear_tracking()


def get_fallback_ops() -> list[str]:
    """Ops that reached the boxed CPU fallback (`aten::<op>`, like torch_neuronx.get_fallback_ops())."""
    return _bases("fallback")


def get_executed_ops() -> list[str]:
    """Ops that ran on a device kernel (`aten::<op>`, like torch_neuronx.get_executed_ops())."""
    return _bases("executed")


def get_upcast_ops() -> list[str]:
    """Native ops whose host kernel lacked an input dtype the device has, run upcast and cast back
    (`aten::histc.default:Int->Double`)."""
    names, _ = _ops().tracked("upcast")
    return sorted(names)


def get_unsupported_ops() -> list[str]:
    """Ops the table rates unsupported that were called (with keep-going they ran on the host)."""
    return _bases("unsupported")


def set_keep_going(on: bool) -> None:
    _ops().set_keep_going(bool(on))


# ---------------------------------------------------------------------------------------------- torch.neuron


def _device_module(torch) -> types.ModuleType:
    ops = torch.ops.neuron_emu
    mod = types.ModuleType("torch.neuron")
    mod.__doc__ = "torch.neuron on neuron-migrate's EMULATED device (host memory; not TorchNeuron)."
    mod.EMULATED = True
    mod.is_available = lambda: True
    mod.is_initialized = lambda: True
    mod._is_in_bad_fork = lambda: False
    mod.device_count = lambda: int(ops.device_count())
    mod.current_device = lambda: int(ops.current_device())

    def set_device(device) -> None:
        idx = torch.device("neuron", device).index if isinstance(device, int) else torch.device(device).index
        ops.set_device(0 if idx is None else int(idx))

    mod.set_device = set_device

    class device:
        """`with torch.neuron.device(i):` makes device i current inside, as torch.cuda.device does (torch.load of a
        tensor saved on the device enters it: torch/_utils.py `_to`)."""

        def __init__(self, dev):
            self.idx = _index(torch, dev) if dev is not None else None
            self.prev = None

        def __enter__(self):
            if self.idx is not None and self.idx >= 0:
                self.prev = int(ops.current_device())
                ops.set_device(int(self.idx))
            return self

        def __exit__(self, *exc):
            if self.prev is not None:
                ops.set_device(self.prev)
            return False

    mod.device = device
    mod.synchronize = lambda device=None: None
    mod.empty_cache = lambda: None
    # memory: the device allocator's statistics (as torch.cuda.memory_*; the emulated device's memory is host
    # memory, so the numbers are what the program keeps on the device, not what a NeuronCore would hold)
    acc = torch.accelerator
    mod.memory_allocated = lambda device=None: acc.memory_allocated(_index(torch, device))
    mod.max_memory_allocated = lambda device=None: acc.max_memory_allocated(_index(torch, device))
    mod.memory_reserved = lambda device=None: acc.memory_reserved(_index(torch, device))
    mod.max_memory_reserved = lambda device=None: acc.max_memory_reserved(_index(torch, device))
    mod.memory_stats = lambda device=None: acc.memory_stats(_index(torch, device))
    mod.reset_peak_memory_stats = lambda device=None: acc.reset_peak_memory_stats(_index(torch, device))
    mod.reset_accumulated_memory_stats = lambda device=None: acc.reset_accumulated_memory_stats(_index(torch, device))
    mod.mem_get_info = lambda device=None: acc.get_memory_info(_index(torch, device))
    # streams and events: torch.Stream / torch.Event on the device (no-ops: the host computes synchronously)
    mod.Stream = lambda device=None, priority=0, **kw: torch.Stream(_device(torch, device), priority=priority)
    mod.Event = lambda enable_timing=False, blocking=False, interprocess=False: torch.Event(
        "neuron", enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)
    mod.current_stream = lambda device=None: acc.current_stream(_index(torch, device))
    mod.default_stream = lambda device=None: acc.current_stream(_index(torch, device))
    mod.set_stream = lambda stream: acc.set_stream(stream)
    mod.stream = _stream_context
    # random numbers: each device has its default generator (torch.manual_seed seeds them all through
    # manual_seed_all, as for CUDA); a random op on the device without a generator draws from it
    gen = lambda device=None: ops.default_generator(-1 if device is None else _index(torch, device))  # noqa: E731
    mod.default_generator = gen
    mod.manual_seed = lambda seed: gen().manual_seed(int(seed)) and None
    mod.manual_seed_all = lambda seed: [gen(i).manual_seed(int(seed)) for i in range(mod.device_count())] and None
    mod.seed = lambda: gen().seed() and None
    mod.seed_all = lambda: mod.manual_seed_all(gen(0).seed())
    mod.initial_seed = lambda: gen().initial_seed()
    mod.get_rng_state = lambda device="neuron": gen(device).get_state()
    mod.set_rng_state = lambda state, device="neuron": gen(device).set_state(state)
    mod.get_rng_state_all = lambda: [gen(i).get_state() for i in range(mod.device_count())]
    mod.set_rng_state_all = lambda states: [gen(i).set_state(s) for i, s in enumerate(states)] and None
    mod.get_amp_supported_dtype = lambda: [torch.bfloat16, torch.float16, torch.float32]
    mod.is_bf16_supported = lambda including_emulation=True: True  # torch-neuronx neuron.py has it; Trainium has bf16
    # torch-neuronx neuron.py: get_device_name(i) is "neuron:i"; the properties carry name and total_memory (here the
    # host's memory, the emulated device's)
    mod.get_device_name = lambda device=None: f"neuron:{_device(torch, device).index}"
    mod.get_device_properties = lambda device=None: types.SimpleNamespace(
        name=mod.get_device_name(device), total_memory=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    return mod


def _index(torch, device) -> int | None:
    if device is None:
        return None
    if isinstance(device, int):
        return device
    d = torch.device(device)
    return d.index if d.index is not None else torch.accelerator.current_device_index()


def _device(torch, device):
    if device is None:
        return torch.device("neuron", torch.accelerator.current_device_index())
    return torch.device("neuron", device) if isinstance(device, int) else torch.device(device)


class _stream_context:
    """torch.neuron.stream(s): as torch.cuda.stream (the stream is current inside; streams are no-ops here)."""

    def __init__(self, stream):
        self.stream = stream

    def __enter__(self):
        import torch

        if self.stream is not None:
            self.saved = torch.accelerator.current_stream()
            torch.accelerator.set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc):
        import torch

        if self.stream is not None:
            torch.accelerator.set_stream(self.saved)
        return False


# ---------------------------------------------------------------------------------------------- distributed


def _register_process_group_backend(torch) -> None:
    """Backend `neuron`: gloo underneath. Device tensors reach it through host aliases (see the C++
    collective kernel), so DDP and plain collectives on `neuron` tensors run unchanged."""
    try:
        import torch.distributed as dist
    except ImportError:
        return
    if not dist.is_available() or "neuron" in dist.Backend.backend_list:
        return
    from torch.distributed import ProcessGroupGloo

    def make(store, rank, size, timeout):
        if torch.ops.neuron_emu.local_device() < 0:
            # as TorchNeuron's backend does when the first group starts: this process owns one device, whose index
            # is its local rank (LOCAL_RANK/LOCAL_WORLD_SIZE from torchrun; else, on one host, the rank: mp.spawn)
            local, local_size = os.environ.get("LOCAL_RANK"), os.environ.get("LOCAL_WORLD_SIZE")
            if local is not None and local_size is not None:
                torch.ops.neuron_emu.set_local_device(int(local), int(local_size))
            elif local is not None:  # set by the program itself (an mp.spawn worker, NM235): the host's devices
                count = torch.ops.neuron_emu.device_count()
                torch.ops.neuron_emu.set_local_device(int(local), max(count, int(local) + 1))
            else:
                torch.ops.neuron_emu.set_local_device(rank, size)
        return ProcessGroupGloo(store, rank, size, timeout)

    dist.Backend.register_backend(BACKEND_NAME, make, devices=["cpu", "neuron"])
    _cpu_route_for_default_groups(dist)
    c10d = [n for n in torch._C._dispatch_get_all_op_names() if n.startswith("c10d::")
            and torch._C._dispatch_has_kernel_for_dispatch_key(n, "PrivateUse1")]
    with warnings.catch_warnings(), _quiet_stderr():
        warnings.simplefilter("ignore")  # "overriding a previously registered kernel": intended
        failed = torch.ops.neuron_emu.register_kernels("collective", c10d)
    _state["collectives"] = [n for n in c10d if not any(f.startswith(n + ":") for f in failed)]


def _register_sync_batch_norm(torch):
    """Device kernels for the five ops nn.SyncBatchNorm calls (torch/nn/modules/_functions.py). TorchNeuron registers
    them for its device (the pre-release op list: batch_norm_stats, batch_norm_gather_stats_with_counts,
    batch_norm_elemt, batch_norm_backward_reduce, batch_norm_backward_elemt); the host has no CPU kernel for them
    (CUDA-only in ATen), so the boxed fallback cannot run them. Written here from ATen's formulas, computed on host
    copies in float32 (the accumulation type) and returned on the input's device. Returns the library (kept alive)."""
    lib = torch.library.Library("aten", "IMPL")

    def shape(t, x):  # a per-channel vector broadcast over x (N, C, ...)
        return t.view(1, -1, *([1] * (x.dim() - 2)))

    def dims(x):
        return [d for d in range(x.dim()) if d != 1]

    def stats(x, eps):
        h = x.cpu().float()
        mean = h.mean(dims(h))
        var = h.var(dims(h), unbiased=False)
        return mean.to(x.device), torch.rsqrt(var + eps).to(x.device)

    def gather(x, mean, invstd, running_mean, running_var, momentum, eps, counts):
        n = counts.cpu().float().view(-1, 1)
        m, inv = mean.cpu().float(), invstd.cpu().float()
        total = n.sum()
        g_mean = (m * n).sum(0) / total
        var = (1 / inv.pow(2) - eps) + (m - g_mean).pow(2)
        g_var = (var * n).sum(0) / total
        if running_mean is not None:
            running_mean.copy_(((1 - momentum) * running_mean.cpu().float() + momentum * g_mean).to(running_mean.dtype))
        if running_var is not None:
            unbiased = g_var * total / (total - 1) if total > 1 else g_var
            running_var.copy_(((1 - momentum) * running_var.cpu().float() + momentum * unbiased).to(running_var.dtype))
        return g_mean.to(x.device), torch.rsqrt(g_var + eps).to(x.device)

    def elemt(x, weight, bias, mean, invstd, eps):
        h = x.cpu().float()
        out = (h - shape(mean.cpu(), h)) * shape(invstd.cpu(), h)
        if weight is not None:
            out = out * shape(weight.cpu().float(), h)
        if bias is not None:
            out = out + shape(bias.cpu().float(), h)
        return out.to(x.dtype).to(x.device)

    def backward_reduce(grad_out, x, mean, invstd, weight, input_g, weight_g, bias_g):
        h, dy = x.cpu().float(), grad_out.cpu().float()
        sum_dy = dy.sum(dims(h))
        sum_dy_xmu = (dy * (h - shape(mean.cpu(), h))).sum(dims(h))
        grad_weight = sum_dy_xmu * invstd.cpu() if weight_g else torch.empty(0)
        grad_bias = sum_dy if bias_g else torch.empty(0)
        dtype = weight.dtype if weight is not None else x.dtype
        return (sum_dy.to(x.device), sum_dy_xmu.to(x.device), grad_weight.to(dtype).to(x.device),
                grad_bias.to(dtype).to(x.device))

    def backward_elemt(grad_out, x, mean, invstd, weight, sum_dy, sum_dy_xmu, count):
        h, dy = x.cpu().float(), grad_out.cpu().float()
        total = count.cpu().float().sum()
        inv = shape(invstd.cpu(), h)
        factor = inv.pow(2) * shape(sum_dy_xmu.cpu() / total, h)
        grad = (dy - shape(sum_dy.cpu() / total, h) - (h - shape(mean.cpu(), h)) * factor) * inv
        if weight is not None:
            grad = grad * shape(weight.cpu().float(), h)
        return grad.to(x.dtype).to(x.device)

    for name, fn in (("batch_norm_stats", stats), ("batch_norm_gather_stats_with_counts", gather),
                     ("batch_norm_elemt", elemt), ("batch_norm_backward_reduce", backward_reduce),
                     ("batch_norm_backward_elemt", backward_elemt)):
        lib.impl(name, fn, "PrivateUse1")
    return lib


def _cpu_route_for_default_groups(dist) -> None:
    """A group started without a backend (`init_process_group()`, as `init_device_mesh("neuron")` does) maps only the
    accelerator's device type to its backend (torch's BackendConfig). The emulator's collectives on `neuron` tensors
    run on their host aliases, through the group's CPU route, so such a group gets the `neuron` backend for `cpu`
    too, as `init_process_group("neuron")` has (its devices are cpu and neuron). TorchNeuron's own backend takes the
    device tensors directly: this is the emulator's need, not the program's."""
    from torch.distributed import distributed_c10d as c10d

    config = c10d.BackendConfig
    if getattr(config, "_neuron_emulator", False):
        return
    original = config.__init__

    def __init__(self, backend):
        original(self, backend)
        if str(backend) == dist.Backend.UNDEFINED and list(self.device_backend_map) == [BACKEND_NAME]:
            self.device_backend_map["cpu"] = self.device_backend_map[BACKEND_NAME]

    config.__init__ = __init__
    config._neuron_emulator = True


class _quiet_stderr:
    """Silence C++ warnings printed straight to file descriptor 2 (c10's default warning handler)."""

    def __enter__(self):
        try:
            sys.stderr.flush()
            self._saved = os.dup(2)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)
            os.close(devnull)
        except OSError:
            self._saved = None
        return self

    def __exit__(self, *exc):
        if self._saved is not None:
            os.dup2(self._saved, 2)
            os.close(self._saved)
        return False


def _default_device_count() -> int:
    env = os.environ.get("NM_EMULATOR_DEVICES")
    if env and env.isdigit():
        return max(1, int(env))
    return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))


def install(table=None, *, keep_going: bool = False, device_count: int | None = None, log=None,
            library: str | None = None) -> dict[str, Any]:
    """Make `neuron` a real (emulated) device in this process. Idempotent. Raises EmulatorUnavailable.
    `library`: a library the caller built or found (the probe's parent); otherwise it is found or built here."""
    if _state.get("installed"):
        set_keep_going(keep_going)
        return _state
    from pathlib import Path

    path = Path(library) if library and Path(library).is_file() else library_path(log=log)
    import torch

    current = torch._C._get_privateuse1_backend_name()
    if current not in ("privateuseone", BACKEND_NAME):
        raise EmulatorUnavailable(f"PrivateUse1 is already taken by {current!r} in this process")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.ops.load_library(str(path))
        except OSError as exc:
            raise EmulatorUnavailable(f"cannot load the emulated device {path}: {exc}") from exc
    if current != BACKEND_NAME:
        torch.utils.rename_privateuse1_backend(BACKEND_NAME)
        torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True,
                                                             for_packed_sequence=True, for_storage=True)
    torch.ops.neuron_emu.set_device_count(device_count or _default_device_count())
    mod = _device_module(torch)
    torch._register_device_module(BACKEND_NAME, mod)
    sys.modules.setdefault("torch.neuron", mod)
    sets = kernel_sets(table)
    # $NM_EMULATOR_NO_KERNEL=aten::addmm,...: leave these ops to the fallback although the table calls them
    # native (what a TorchNeuron release missing a kernel would do; predicted vs measured then disagree)
    no_kernel = {x.strip() for x in os.environ.get("NM_EMULATOR_NO_KERNEL", "").split(",") if x.strip()}
    if no_kernel:
        sets["native"] = [n for n in sets["native"] if n.split(".", 1)[0] not in no_kernel and n not in no_kernel]
    failed: list[str] = []
    for kind in ("native", "unsupported"):
        failed += list(torch.ops.neuron_emu.register_kernels(kind, sets[kind]))
    set_keep_going(keep_going)
    _register_process_group_backend(torch)
    _state["sync_batch_norm"] = _register_sync_batch_norm(torch)
    from neuron_migrate.probe.emulator.compile import patch_torch_compile

    patch_torch_compile(torch, strict=not keep_going)
    _state.update(installed=True, library=str(path), native=sets["native"], unsupported=sets["unsupported"],
                  failed=failed, table_version=getattr(table, "version", None))
    return _state


def summary() -> dict[str, Any]:
    """What was installed (for the probe report)."""
    return {"library": _state.get("library"), "native_kernels": len(_state.get("native") or []),
            "unsupported_kernels": len(_state.get("unsupported") or []),
            "registration_failures": list(_state.get("failed") or [])[:20],
            "table_version": _state.get("table_version"), "collectives": len(_state.get("collectives") or [])}


def iter_names(xs: Iterable[str]) -> list[str]:
    return sorted(set(xs))
