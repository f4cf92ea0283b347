"""TEST-ONLY CPU STAND-IN FOR THE `neuron` DEVICE. Never ship this; the product never imports it.

Integration tests rewrite real training scripts to TorchNeuron (`torch.device("neuron")`,
`init_process_group(backend="neuron")`, `torch.compile(backend="neuron")`, `torch.autocast("neuron")`,
`torch.neuron.*`) and then *run* them on a CPU-only machine. Put this folder first on PYTHONPATH of the
child process (torchrun passes PYTHONPATH on to its workers) and Python imports this module at start-up,
before the script, which then runs with:

| script says                                        | runs as                                    |
|----------------------------------------------------|--------------------------------------------|
| `torch.device("neuron"[, i])`, `"neuron:0"`         | `torch.device("cpu")`                      |
| `.to("neuron")` on tensors and modules              | `.to("cpu")`                               |
| `device="neuron"` in torch factory functions        | `device="cpu"`                             |
| `torch.autocast("neuron", ...)`                     | `torch.autocast("cpu", ...)`               |
| `init_process_group(backend="neuron")` (or unset)   | backend `gloo`                             |
| `dist.is_backend_available("neuron")`               | `True` (gloo stands in for it)             |
| `torch.compile(backend="neuron")` (or unset)        | backend `eager` (`aot_eager` if `NEURON_ON_CPU_COMPILE_BACKEND=aot_eager`) |
| `torch.neuron.*` (device module)                    | CPU no-ops / `torch.manual_seed` / zeros   |
| `FullyShardedDataParallel(module)` (FSDP1)          | with `device_id=cpu` (FSDP1 refuses CPU modules otherwise) |
| `init_device_mesh("neuron", ...)`, `DeviceMesh("neuron", ...)` | a `cpu` mesh (DTensor TP, FSDP2 `fully_shard`) |
| `torch.accelerator.synchronize()`, `memory_*`, ... | no-ops / 0 (is_available() stays False)    |
| `tensor.neuron()`, `tensor.is_neuron`               | the tensor itself, `True` for CPU tensors  |

Settings (environment):
- `NEURON_ON_CPU=0` disables the shim (the folder may stay on PYTHONPATH).
- `NEURON_ON_CPU_COLLECTIVES=DIR` counts collectives and records the process group joined (see
  `_count_collectives`), written to DIR at exit.
- `NEURON_ON_CPU_DEVICE_TYPES` comma-separated device types mapped to cpu (default `neuron`; add `xla` or
  `cuda` to run un-migrated code the same way).
- `NEURON_ON_CPU_COMPILE_BACKEND` backend used instead of `neuron`/`inductor`/unset (default `eager`).

Limits (by design: this is a stand-in, not an emulator): device *comparisons* see `cpu`
(`x.device.type == "neuron"` is False); only the factory functions listed in `_FACTORIES` map `device=`;
`torch.compile` modes are dropped and `dynamic` is passed through. `torch._neuron_on_cpu` is set to True
so that a test can assert the shim was active in the child.
"""
from __future__ import annotations

import os
import sys
import types


def _install() -> None:
    import functools

    import torch

    mapped = {t.strip() for t in os.environ.get("NEURON_ON_CPU_DEVICE_TYPES", "neuron").split(",") if t.strip()}
    compile_backend = os.environ.get("NEURON_ON_CPU_COMPILE_BACKEND", "eager")
    RealDevice = torch.device

    def map_str(s: str) -> str:
        kind = s.split(":", 1)[0]
        return "cpu" if kind in mapped else s

    def map_device(d):
        """A device argument (str, torch.device, int or None) with mapped types turned into cpu."""
        if isinstance(d, str):
            return map_str(d)
        if isinstance(d, RealDevice) and d.type in mapped:
            return RealDevice("cpu")
        return d

    # -- torch.device ---------------------------------------------------------------------------
    class _DeviceMeta(type):
        def __instancecheck__(cls, obj):
            return isinstance(obj, RealDevice)

        def __subclasscheck__(cls, sub):
            return issubclass(sub, RealDevice)

    class device(metaclass=_DeviceMeta):  # noqa: N801 - stands in for torch.device
        """torch.device that turns mapped device types into cpu (and drops their index)."""

        def __new__(cls, type_or_str=None, index=None, **kwargs):
            if "type" in kwargs:
                type_or_str = kwargs.pop("type")
            if isinstance(type_or_str, str) and type_or_str.split(":", 1)[0] in mapped:
                return RealDevice("cpu")
            if isinstance(type_or_str, RealDevice):
                return map_device(type_or_str)
            return RealDevice(type_or_str) if index is None else RealDevice(type_or_str, index)

    torch.device = device

    # -- .to() on tensors and modules -------------------------------------------------------------
    def wrap_to(orig):
        @functools.wraps(orig)
        def to(self, *args, **kwargs):
            args = tuple(map_device(a) for a in args)
            if "device" in kwargs:
                kwargs["device"] = map_device(kwargs["device"])
            return orig(self, *args, **kwargs)

        return to

    torch.Tensor.to = wrap_to(torch.Tensor.to)
    torch.nn.Module.to = wrap_to(torch.nn.Module.to)

    # -- factories with device= --------------------------------------------------------------------
    def wrap_factory(orig):
        @functools.wraps(orig)
        def factory(*args, **kwargs):
            if "device" in kwargs:
                kwargs["device"] = map_device(kwargs["device"])
            return orig(*args, **kwargs)

        return factory

    wrapped = []
    for name in _FACTORIES:
        if hasattr(torch, name):
            setattr(torch, name, wrap_factory(getattr(torch, name)))
            wrapped.append(name)
    # TorchScript compiles `torch.zeros(...)` in scripted code (torch.distributed.optim's functional optimizers, which
    # ZeroRedundancyOptimizer imports) by looking the function up in its table of aten builtins: the wrappers are
    # entered there as the ops they wrap, or scripting fails on them
    try:
        from torch.jit._builtins import _register_builtin

        for name in wrapped:
            _register_builtin(getattr(torch, name), "aten::" + name)
    except ImportError:
        pass

    # -- autocast ----------------------------------------------------------------------------------
    RealAutocast = torch.autocast

    class autocast(RealAutocast):  # noqa: N801
        def __init__(self, device_type, *args, **kwargs):
            super().__init__(map_str(device_type) if isinstance(device_type, str) else device_type, *args, **kwargs)

    torch.autocast = autocast
    torch.amp.autocast = autocast
    for fname in ("is_autocast_available",):
        orig = getattr(torch.amp, fname, None)
        if orig is not None:
            setattr(torch.amp, fname, lambda device_type, _o=orig: _o(map_str(device_type)))

    # -- torch.distributed ---------------------------------------------------------------------------
    import torch.distributed as dist

    real_init = dist.init_process_group

    @functools.wraps(real_init)
    def init_process_group(*args, **kwargs):
        backend = kwargs.get("backend", args[0] if args else None)
        if backend is None or any(p.split(":")[-1] in mapped or p.split(":")[0] in mapped or p.endswith("nccl")
                                  for p in str(backend).split(",")):
            backend = "gloo"
        if args:
            args = (backend, *args[1:])
        else:
            kwargs["backend"] = backend
        if "device_id" in kwargs:
            kwargs.pop("device_id")
        _install_fast_exit()
        _patch_fsdp(map_device, RealDevice)
        result = real_init(*args, **kwargs)
        if _COLLECTIVES["dir"]:
            _record_group(dist)
        return result

    dist.init_process_group = init_process_group
    real_available = dist.is_backend_available

    @functools.wraps(real_available)
    def is_backend_available(backend):
        return True if str(backend) in mapped else real_available(backend)

    dist.is_backend_available = is_backend_available
    if os.environ.get("NEURON_ON_CPU_COLLECTIVES"):
        _count_collectives(dist, os.environ["NEURON_ON_CPU_COLLECTIVES"])

    _patch_device_mesh(map_str)

    # -- torch.compile -------------------------------------------------------------------------------
    real_compile = torch.compile

    @functools.wraps(real_compile)
    def compile(model=None, **kwargs):  # noqa: A001
        if kwargs.get("backend") in (None, "inductor", *mapped):
            kwargs["backend"] = compile_backend
        kwargs.pop("mode", None)
        kwargs.pop("options", None)
        return real_compile(model, **kwargs) if model is not None else real_compile(**kwargs)

    torch.compile = compile

    # -- torch.accelerator: calls that need an accelerator become CPU no-ops -------------------------
    # is_available()/current_accelerator()/device_count() keep their real CPU answers (False/None/0):
    # Dynamo and device-agnostic code read them. Calls that would raise "Cannot access accelerator
    # device when none is available" return what a single idle device would.
    acc = torch.accelerator
    cpu_defaults = {
        "current_device_index": 0, "current_device_idx": 0, "set_device_index": None, "set_device_idx": None,
        "synchronize": None, "empty_cache": None, "memory_allocated": 0, "max_memory_allocated": 0,
        "memory_reserved": 0, "max_memory_reserved": 0, "reset_peak_memory_stats": None, "memory_stats": {},
    }
    real_available = acc.is_available

    def cpu_fallback(orig, default):
        @functools.wraps(orig)
        def call(*args, **kwargs):
            if real_available():
                return orig(*args, **kwargs)
            return dict(default) if isinstance(default, dict) else default

        return call

    for name, default in cpu_defaults.items():
        if hasattr(acc, name):
            setattr(acc, name, cpu_fallback(getattr(acc, name), default))

    # -- torch.neuron device module -------------------------------------------------------------------
    neuron = types.ModuleType("torch.neuron")
    neuron.__doc__ = "Test-only CPU stand-in for TorchNeuron's torch.neuron device module."
    neuron.is_available = lambda: True
    neuron.device_count = lambda: 1
    neuron.current_device = lambda: 0
    neuron.set_device = lambda device: None
    neuron.synchronize = lambda device=None: None
    neuron.manual_seed = lambda seed: torch.manual_seed(seed) and None
    neuron.manual_seed_all = lambda seed: torch.manual_seed(seed) and None
    neuron.seed = lambda: None
    neuron.seed_all = lambda: None
    neuron.initial_seed = torch.initial_seed
    neuron.get_rng_state = lambda device="neuron": torch.get_rng_state()
    neuron.set_rng_state = lambda new_state, device="neuron": torch.set_rng_state(new_state)
    neuron.empty_cache = lambda: None
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"):
        setattr(neuron, name, lambda device=None: 0)
    neuron.reset_peak_memory_stats = lambda device=None: None
    neuron.memory_stats = lambda device=None: {}
    neuron.is_bf16_supported = lambda: True
    torch.neuron = neuron
    sys.modules["torch.neuron"] = neuron

    # -- generated privateuse1-style methods ---------------------------------------------------------
    torch.Tensor.neuron = lambda self, device=None, non_blocking=False, **kw: self
    torch.Tensor.is_neuron = property(lambda self: self.device.type == "cpu")
    torch.nn.Module.neuron = lambda self, device=None: self

    torch._neuron_on_cpu = True


_FACTORIES = (
    "tensor", "as_tensor", "zeros", "ones", "empty", "full", "rand", "randn", "randint", "randperm",
    "arange", "linspace", "logspace", "eye", "zeros_like", "ones_like", "empty_like", "full_like",
    "rand_like", "randn_like", "randint_like", "empty_strided",
)

_EXIT = {"code": 0, "installed": False}
_COLLECTIVES = {"dir": None, "counts": {}, "group": None}
# torch 2.13 names the tensor forms *_single (FSDP1 calls reduce_scatter_single); the old names stay for older code
_COUNTED = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "reduce_scatter",
            "reduce_scatter_tensor", "reduce_scatter_single", "broadcast",
            "barrier", "all_gather_object", "broadcast_object_list", "all_to_all_single", "reduce")


def _patch_device_mesh(map_str) -> None:
    """`init_device_mesh("neuron", ...)` and `DeviceMesh("neuron", ...)` build a CPU mesh (gloo): DTensor tensor
    parallelism (parallelize_module) and FSDP2 (fully_shard) then run on it as on CPU."""
    import functools

    try:
        import torch.distributed.device_mesh as dm
    except ImportError:  # a torch built without distributed
        return
    if getattr(dm.init_device_mesh, "_neuron_on_cpu", False):
        return
    real_init = dm.init_device_mesh

    @functools.wraps(real_init)
    def init_device_mesh(device_type, *args, **kwargs):
        return real_init(map_str(device_type) if isinstance(device_type, str) else device_type, *args, **kwargs)

    init_device_mesh._neuron_on_cpu = True
    dm.init_device_mesh = init_device_mesh
    real_mesh_init = dm.DeviceMesh.__init__

    @functools.wraps(real_mesh_init)
    def mesh_init(self, device_type, *args, **kwargs):
        real_mesh_init(self, map_str(device_type) if isinstance(device_type, str) else device_type, *args, **kwargs)

    dm.DeviceMesh.__init__ = mesh_init


def _patch_fsdp(map_device, real_device) -> None:
    """torch FSDP1 takes its device from the module's parameters and refuses CPU ones ("FSDP needs a non-CPU
    accelerator device"). On TorchNeuron a module moved to `neuron` gives the neuron device; here that device is
    the CPU, so FSDP is told so (`device_id=cpu` where none is given; a given `neuron` device_id is mapped).
    Patched when a process group starts, so that scripts without one do not import FSDP."""
    import functools

    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    if getattr(FSDP.__init__, "_neuron_on_cpu", False):
        return
    real = FSDP.__init__

    @functools.wraps(real)
    def init(self, module, *args, **kwargs):
        if len(args) < 9:  # device_id is the tenth parameter after module; positional use leaves it alone
            kwargs["device_id"] = map_device(kwargs.get("device_id")) if kwargs.get("device_id") is not None else real_device("cpu")
        real(self, module, *args, **kwargs)

    init._neuron_on_cpu = True
    FSDP.__init__ = init


def _count_collectives(dist, log_dir: str) -> None:
    """NEURON_ON_CPU_COLLECTIVES=DIR: count the collectives this process calls, and record the group it joined.

    Each `torch.distributed` collective is wrapped (counted by name; all_reduce also by tensor shape), DDP's
    gradient buckets are counted through a comm hook (DDP reduces them in C++, past the Python functions), and at
    init every rank gathers the process ids of the group's members. At exit DIR/rank<RANK>-<pid>.json holds
    {"rank", "world_size", "members", "counts", "all_reduce_shapes"}: a test can then assert that two ranks joined
    one group and that gradients were all-reduced, not only that the loss fell.
    """
    import functools

    _COLLECTIVES["dir"] = log_dir
    counts = _COLLECTIVES["counts"]
    shapes = _COLLECTIVES.setdefault("shapes", {})

    def wrap(name, orig):
        @functools.wraps(orig)
        def collective(*args, **kwargs):
            counts[name] = counts.get(name, 0) + 1
            if name == "all_reduce" and args and hasattr(args[0], "shape"):
                key = "x".join(map(str, args[0].shape)) or "scalar"
                shapes[key] = shapes.get(key, 0) + 1
            return orig(*args, **kwargs)

        return collective

    for name in _COUNTED:
        orig = getattr(dist, name, None)
        if orig is not None:
            setattr(dist, name, wrap(name, orig))

    from torch.nn.parallel import DistributedDataParallel

    real_ddp_init = DistributedDataParallel.__init__

    @functools.wraps(real_ddp_init)
    def ddp_init(self, *args, **kwargs):
        real_ddp_init(self, *args, **kwargs)
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        def counting_hook(state, bucket):
            counts["ddp_gradient_bucket"] = counts.get("ddp_gradient_bucket", 0) + 1
            return default_hooks.allreduce_hook(state, bucket)

        self.register_comm_hook(None, counting_hook)

    DistributedDataParallel.__init__ = ddp_init


def _record_group(dist) -> None:
    """After init: every member's pid (gathered with the unwrapped function), and a log written at exit."""
    import atexit
    import json
    from torch.distributed import distributed_c10d

    members = [None] * dist.get_world_size()
    distributed_c10d.all_gather_object(members, os.getpid())
    _COLLECTIVES["group"] = {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "members": members}

    def write_log():
        data = dict(_COLLECTIVES["group"], counts=_COLLECTIVES["counts"], all_reduce_shapes=_COLLECTIVES.get("shapes", {}))
        os.makedirs(_COLLECTIVES["dir"], exist_ok=True)  # a run by hand may name a folder it has not made
        path = os.path.join(_COLLECTIVES["dir"], f"rank{data['rank']}-{os.getpid()}.json")
        with open(path, "w") as f:
            json.dump(data, f)

    atexit.register(write_log)  # registered after the fast exit handler, so it runs before it


def _install_fast_exit() -> None:
    """Skip C++ teardown at exit in processes that used a gloo process group (or the emulated device's autograd thread).

    torch 2.13's CPU gloo backend aborts some workers *after* a script that ran backward passes and
    collectives has finished ("terminate called without an active exception" while static destructors
    run; reproduced with a 12-line script, with destroy_process_group called). A CPU artefact of the
    stand-in backend, not of the code under test: after every other atexit handler has run, this exits
    with the status Python would have used (1 after an uncaught exception, the sys.exit code; a bare
    `raise SystemExit(n)` is not seen and exits 0). Exit handlers registered before it (the emulated shim installs
    it before torch is imported) are skipped, and so is the flush of a file the program never closed.
    NEURON_ON_CPU_FAST_EXIT=0 turns it off.
    """
    if _EXIT["installed"] or os.environ.get("NEURON_ON_CPU_FAST_EXIT", "1") == "0":
        return
    import atexit

    _EXIT["installed"] = True
    real_hook, real_exit = sys.excepthook, sys.exit

    def excepthook(*args):
        _EXIT["code"] = 1
        real_hook(*args)

    def exit_(code=0):
        _EXIT["code"] = code if isinstance(code, int) else (0 if code is None else 1)
        if not isinstance(code, (int, type(None))):
            print(code, file=sys.stderr)
        real_exit(code)

    def fast_exit():
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # closed (a multiprocessing child closes its stdio before exiting)
                pass
        os._exit(_EXIT["code"])

    sys.excepthook = excepthook
    sys.exit = exit_
    atexit.register(fast_exit)  # registered early: atexit runs it last


if os.environ.get("NEURON_ON_CPU", "1") != "0":
    try:
        import torch  # noqa: F401
    except ImportError:  # a child without torch (e.g. a tool) runs untouched
        pass
    else:
        _install()
