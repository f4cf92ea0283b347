"""CUDA training code to TorchNeuron: autocast, GradScaler, NCCL, DDP device ids, torch.compile settings,
and CUDA-only machinery that needs a human (NM206-NM209, NM213, NM216-NM219; torch.compile backend/mode/dynamic are NM401-NM403).

Sources: TorchNeuron landing page (autocast `device_type="neuron"`, backend `"neuron"` for torch.distributed
and torch.compile, remove CUDA-specific compile parameters such as `mode="max-autotune-no-cudagraphs"`):
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/torch/index.html ; torch.compile reference (mode
other than default ignored with a warning, `dynamic=True` rejected, `options` partly read):
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/torch/compile/reference-torch-compile.html
"""
from __future__ import annotations

import ast

from neuron_migrate.rules.api import const_value, has_star_args, kwarg, rule
from neuron_migrate.rules.builtin.cuda_device import accelerator, agnostic_device, call_args_src

TORCH_DOCS = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/torch/index.html"
COMPILE_DOCS = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/torch/compile/reference-torch-compile.html"


# -- NM206 ------------------------------------------------------------------------------------------
@rule(
    code="NM206",
    name="cuda-amp-autocast",
    summary="`torch.cuda.amp.autocast(...)` becomes `torch.autocast(\"neuron\", ...)`",
    fix="safe",
    severity="error",
    triggers=[("call", "torch.cuda.amp.autocast"), ("call", "torch.cuda.amp.autocast_mode.autocast")],
    docs=f"""
        `torch.cuda.amp.autocast` only casts CUDA ops: on Neuron the model silently runs in full precision.
        TorchNeuron's mixed precision is `torch.autocast(device_type="neuron")` ({TORCH_DOCS}); it uses the same
        op lists as CUDA autocast. Arguments are kept. Without `dtype=`, CUDA autocast meant float16: the fix
        passes `dtype=torch.float16` to keep that, and the note recommends bfloat16 (which needs no GradScaler).
        Device-style `accelerator` writes `torch.autocast(_accelerator_device().type, ...)`.
        `torch.autocast("cuda")` and `torch.amp.autocast(device_type="cuda")` are NM201 (device strings).
    """,
    examples=[("with torch.cuda.amp.autocast(dtype=torch.bfloat16):\n    pass",
               'with torch.autocast("neuron", dtype=torch.bfloat16):\n    pass')],
)
def cuda_amp_autocast(site, ctx):
    call = site.call
    fx = ctx.fixer()
    torch = fx.ref("torch")
    device = f"{agnostic_device(fx)}.type" if accelerator(ctx) else '"neuron"'
    args = call_args_src(call, ctx)
    note = ""
    if kwarg(call, "dtype", 1) is None and not has_star_args(call):
        args = ", ".join(x for x in [args, f"dtype={torch}.float16"] if x)
        note = "CUDA autocast defaulted to float16 (kept); bfloat16 is the usual choice on Trainium and needs no GradScaler."
    fx.replace(call, f"{torch}.autocast({device}{', ' + args if args else ''})")
    return ctx.finding(site, "torch.cuda.amp.autocast only affects CUDA: use torch.autocast(\"neuron\", ...)", fix=fx.build(), note=note)


# -- NM207 ------------------------------------------------------------------------------------------
@rule(
    code="NM207",
    name="grad-scaler",
    summary="GradScaler is for float16 on CUDA; with bfloat16 on Neuron it is not needed",
    fix="none",
    severity="warning",
    triggers=[("call", "torch.cuda.amp.GradScaler"), ("call", "torch.amp.GradScaler"), ("call", "torch.GradScaler"),
              ("call", "torch.amp.grad_scaler.GradScaler")],
    docs="""
        Loss scaling protects float16 gradients from underflow. `torch.cuda.amp.GradScaler()` on a machine
        without CUDA disables itself with a warning, so on Neuron it does nothing. Train with
        `torch.autocast("neuron", dtype=torch.bfloat16)`: bfloat16 has float32's exponent range and needs no
        scaler (TorchNeuron's autocast follows the CUDA op lists). Remove the scaler
        (`scaler.scale(loss).backward()` -> `loss.backward()`, `scaler.step(opt)` -> `opt.step()`, drop
        `scaler.update()`). float16 loss scaling on Neuron is unverified: no TorchNeuron document mentions a
        `GradScaler("neuron")`, and the ops a scaler runs (`_amp_foreach_non_finite_check_and_unscale_`,
        `_amp_update_scale_`) have no kernel in the pre-release operator registry, so at best they take the CPU
        fallback (`neuron-migrate table show torch.amp.GradScaler`). Not rewritten: removing the scaler changes the
        training loop in several places.
    """,
    examples=[("scaler = torch.cuda.amp.GradScaler()", None)],
)
def grad_scaler(site, ctx):
    return ctx.finding(site, "GradScaler: train in bfloat16 (torch.autocast(\"neuron\", dtype=torch.bfloat16)), which needs no "
                             "scaler, and remove it; float16 loss scaling on Neuron is unverified (no documented "
                             "GradScaler(\"neuron\"); its _amp_* ops have no known Neuron kernel)")


# -- NM208 ------------------------------------------------------------------------------------------
def _neuron_backend(value: str):
    parts = []
    changed = False
    for p in value.split(","):
        dev, sep, be = p.strip().rpartition(":")
        if be == "nccl":
            be, changed = "neuron", True
        if dev == "cuda":
            dev, changed = "neuron", True
        parts.append(f"{dev}{sep}{be}")
    return ",".join(parts) if changed else None


@rule(
    code="NM208",
    name="nccl-backend",
    summary="torch.distributed backend `nccl` becomes `neuron`",
    fix="safe",
    severity="error",
    triggers=[("call", "torch.distributed.init_process_group"), ("call", "torch.distributed.new_group"),
              ("call", "torch.distributed.distributed_c10d.init_process_group")],
    docs=f"""
        NCCL needs CUDA. TorchNeuron runs torch.distributed (DDP, FSDP2, DTensor) "natively through the `neuron`
        backend" ({TORCH_DOCS}): `backend="nccl"` becomes `backend="neuron"` and `"cpu:gloo,cuda:nccl"` becomes
        `"cpu:gloo,neuron:neuron"`. With `device-style = "accelerator"` the backend becomes
        `torch.distributed.get_default_backend_for_device(_accelerator_device())`: gloo on CPU, nccl on CUDA and the
        backend TorchNeuron registers for its device.
    """,
    examples=[('dist.init_process_group(backend="nccl")', 'dist.init_process_group(backend="neuron")')],
)
def nccl_backend(site, ctx):
    call = site.call
    pos = 0 if site.key.endswith("init_process_group") else 1
    backend = kwarg(call, "backend", pos)
    value = const_value(backend)
    if not isinstance(value, str):
        return None
    new = _neuron_backend(value)
    if new is None:
        return None
    fx = ctx.fixer()
    if accelerator(ctx):
        fx.replace(backend, f"{fx.ref('torch.distributed')}.get_default_backend_for_device({agnostic_device(fx)})")
        note = "Check on Neuron that the backend TorchNeuron registers for its device is `neuron`."
    else:
        quote = ctx.src(backend)[0]
        fx.replace(backend, f"{quote}{new}{quote}")
        note = ""
    return ctx.finding(site, f"backend {value!r} needs CUDA: use the `neuron` backend", fix=fx.build(), note=note)


# -- NM209 ------------------------------------------------------------------------------------------
@rule(
    code="NM209",
    name="ddp-device-ids",
    summary="DistributedDataParallel `device_ids`/`output_device` name CUDA devices: drop them",
    fix="safe",
    severity="error",
    triggers=[("call", "torch.nn.parallel.DistributedDataParallel"), ("call", "torch.nn.parallel.distributed.DistributedDataParallel")],
    docs="""
        `DDP(model, device_ids=[local_rank], output_device=local_rank)` names the CUDA device of this rank. Under
        torchrun TorchNeuron shows each process only its own NeuronCore, so `local_rank` is not a valid index,
        and on CPU `device_ids` must be None. For a module on a single device, DDP with `device_ids=None` uses
        the module's device (PyTorch DDP docs), so both arguments are removed.
    """,
    examples=[("model = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])",
               "model = nn.parallel.DistributedDataParallel(model)")],
)
def ddp_device_ids(site, ctx):
    call = site.call
    drop = [k for k in call.keywords if k.arg in ("device_ids", "output_device") and const_value(k.value, 0) is not None]
    if not drop or len(call.args) > 1:
        return None
    fx = ctx.fixer()
    fx.replace(call, f"{ctx.src(call.func)}({call_args_src(call, ctx, drop={k.arg for k in drop})})")
    return ctx.finding(site, "DDP device_ids/output_device name a CUDA device: drop them (DDP uses the module's device)", fix=fx.build())


# -- torch.compile ------------------------------------------------------------------------------------
# backend, mode and dynamic=True are NM401-NM403 (rules/builtin/compile.py); only Inductor options are here.
COMPILE = [("call", "torch.compile")]
_NEURON_OPTIONS = {"model_name", "fallback_execution"}


def _compile_call(site):
    call = site.call
    return None if has_star_args(call) else call


@rule(
    code="NM213",
    name="compile-inductor-options",
    summary="torch.compile `options` that only Inductor reads have no effect on Neuron",
    fix="none",
    severity="info",
    triggers=COMPILE,
    docs=f"""
        `options={{...}}` is passed to the backend. Inductor keys (`triton.cudagraphs`, `max_autotune`,
        `epilogue_fusion`, `shape_padding`, ...) mean nothing to the Neuron backend, which reads only a few keys
        such as `model_name` and `fallback_execution` ({COMPILE_DOCS}). Each other key is reported: remove it.
    """,
    examples=[('model = torch.compile(model, options={"triton.cudagraphs": True})', None)],
)
def compile_inductor_options(site, ctx):
    call = _compile_call(site)
    options = kwarg(call, "options") if call is not None else None
    if not isinstance(options, ast.Dict):
        return None
    out = []
    for key in options.keys:
        name = const_value(key)
        if isinstance(name, str) and name not in _NEURON_OPTIONS:
            out.append(ctx.finding(key, f"compile option {name!r} is read only by Inductor: remove it (the Neuron backend ignores it)"))
    return out or None


# -- reports ------------------------------------------------------------------------------------------
@rule(
    code="NM216",
    name="triton-kernels",
    summary="Triton kernels are CUDA-only: rewrite them as NKI kernels or plain PyTorch",
    fix="none",
    severity="error",
    triggers=[("import", "triton"), ("import", "triton.*")],
    docs="""
        Triton compiles for NVIDIA/AMD GPUs; there is no Triton on Trainium. Kernels written with `@triton.jit`
        must become PyTorch ops (which TorchNeuron runs or compiles) or NKI kernels (`nki.jit`, which need
        `import torch_neuronx`). Reported once per import.
    """,
    examples=[("import triton", None)],
)
def triton_kernels(site, ctx):
    return ctx.finding(site, f"`{site.key}` is CUDA-only: replace its kernels with PyTorch ops or NKI kernels")


@rule(
    code="NM217",
    name="cudnn-settings",
    summary="torch.backends.cudnn / torch.backends.cuda settings have no effect on Neuron",
    fix="none",
    severity="info",
    triggers=[("store", "torch.backends.cudnn.*"), ("store", "torch.backends.cuda.*"), ("call", "torch.backends.cudnn.*"),
              ("call", "torch.backends.cuda.*")],
    docs="""
        `torch.backends.cudnn.benchmark = True`, `cudnn.deterministic`, `allow_tf32` and the
        `torch.backends.cuda.*` switches configure CUDA libraries. On Neuron they do nothing: remove them, or for
        reproducible execution order use `torch.use_deterministic_algorithms(True)` (which also disables
        TorchNeuron's Adaptive Eager fusion, per the TorchNeuron FAQ).
    """,
    examples=[("torch.backends.cudnn.benchmark = True", None)],
)
def cudnn_settings(site, ctx):
    return ctx.finding(site, f"`{site.key}` configures CUDA libraries and does nothing on Neuron: remove it")


@rule(
    code="NM218",
    name="nccl-env",
    summary="NCCL_* environment variables do nothing with the neuron backend",
    fix="none",
    severity="info",
    triggers=[("string", "NCCL_*")],
    docs="""
        `NCCL_DEBUG`, `NCCL_SOCKET_IFNAME`, `NCCL_P2P_DISABLE`, ... tune NCCL, which the `neuron` backend does
        not use. Remove them; the Neuron runtime has its own settings (for example `NEURON_RT_VISIBLE_CORES`,
        set per rank by the backend, and the collective bucket variables).
    """,
    examples=[('os.environ["NCCL_DEBUG"] = "INFO"', None)],
)
def nccl_env(site, ctx):
    return ctx.finding(site, f"{ctx.src(site.node)} configures NCCL, unused by the neuron backend: remove it")


@rule(
    code="NM219",
    name="cupy",
    summary="CuPy arrays live on CUDA: use torch tensors",
    fix="none",
    severity="error",
    triggers=[("import", "cupy"), ("import", "cupy.*"), ("import", "cupyx"), ("import", "cupyx.*")],
    docs="""
        CuPy is a CUDA array library; it does not run on Trainium. Replace its arrays with torch tensors on the
        `neuron` device (or NumPy on the host). Reported once per import.
    """,
    examples=[("import cupy as cp", None)],
)
def cupy(site, ctx):
    return ctx.finding(site, f"`{site.key}` needs CUDA: use torch tensors on the neuron device instead")
