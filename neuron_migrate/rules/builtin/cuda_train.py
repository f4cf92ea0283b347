"""CUDA training code to TorchNeuron: autocast, GradScaler, NCCL, DDP device ids, torch.compile settings,
and CUDA-only machinery that needs a human (NM206-NM209, NM213, NM216-NM219, NM229-NM231; torch.compile backend/mode/dynamic are NM401-NM403).

Sources: TorchNeuron landing page (autocast `device_type="neuron"`, backend `"neuron"` for torch.distributed
and torch.compile, remove CUDA-specific compile parameters such as `mode="max-autotune-no-cudagraphs"`):
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/torch/index.html ; torch.compile reference (mode
other than default ignored with a warning, `dynamic=True` rejected, `options` partly read):
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/torch/compile/reference-torch-compile.html
"""
from __future__ import annotations

import ast
import re

from neuron_migrate.names.analysis import walk
from neuron_migrate.program import cached, values
from neuron_migrate.rules.api import const_value, has_star_args, kwarg, rule
from neuron_migrate.rules.builtin import cuda_picker
from neuron_migrate.rules.builtin.xla_core import catches_import_error
from neuron_migrate.rules.builtin.cuda_device import (_ROLE_TEXT, accelerator, agnostic_device, call_args_src, device_type_expr,
                                                      lines_text, set_fix, skip_dispatch, string_quote,
                                                      unscaled_float16_note, cuda_scaler_line, DATA_PARALLEL, data_parallel_guard)

TORCH_DOCS = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/torch/index.html"
COMPILE_DOCS = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/torch/compile/reference-torch-compile.html"


# -- NM206 ------------------------------------------------------------------------------------------
_CUDA_AUTOCAST_PARAMETERS = ("enabled", "dtype", "cache_enabled")  # torch.cuda.amp.autocast's, in order


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
        op lists as CUDA autocast. Arguments are kept, positional ones passed by name (`autocast(use_amp)` is
        `enabled=use_amp`; torch.autocast's second parameter is `dtype`). Without `dtype=`, CUDA autocast meant float16: the fix
        passes `dtype=torch.float16` to keep that, and the note recommends bfloat16 (which needs no GradScaler).
        Where that float16 is loss-scaled (a CUDA GradScaler or timm's NativeScaler in the file, DINO's; or a scaler
        the function is handed and calls, `loss_scaler(loss, optimizer, ...)` in MAE's and DeiT's engine.py), the
        fix writes `dtype=torch.bfloat16` instead (unsafe: numerics change): CUDA's scaler disables itself on Neuron,
        so float16 would train with no loss scaling, and bfloat16 needs none. The file's other float16 CUDA autocasts
        (ConvNeXt's evaluate()) become bfloat16 with it, so that the model runs in one precision.
        Device-style `accelerator` writes `torch.autocast(_accelerator_device().type, ...)`.
        `torch.autocast("cuda")` and `torch.amp.autocast(device_type="cuda")` are NM201 (device strings).
    """,
    examples=[("with torch.cuda.amp.autocast(dtype=torch.bfloat16):\n    pass",
               'with torch.autocast("neuron", dtype=torch.bfloat16):\n    pass')],
)
def cuda_amp_autocast(site, ctx):
    skip, out = skip_dispatch(site, ctx)
    if skip:
        return out
    call = site.call
    if any(isinstance(a, ast.Starred) for a in call.args) or len(call.args) > len(_CUDA_AUTOCAST_PARAMETERS):
        return ctx.finding(site, "torch.cuda.amp.autocast only affects CUDA: use torch.autocast(\"neuron\", ...) with "
                                 "its arguments as keywords (its positional parameters differ: device_type, dtype)")
    fx = ctx.fixer()
    fx.scope = site.scope
    torch = fx.ref("torch")
    device = device_type_expr(site, ctx, fx) if accelerator(ctx) else '"neuron"'
    # torch.cuda.amp.autocast(enabled, dtype, cache_enabled) and torch.autocast(device_type, dtype, enabled, ...) take
    # their parameters in another order: positional arguments are passed by name
    note = ""
    dtype = kwarg(call, "dtype", 1)
    float16 = (dtype is None and not has_star_args(call)) or (isinstance(dtype, (ast.Name, ast.Attribute)) and ctx.analysis.resolve(
        dtype, ctx.analysis.module_scope, count_use=False) in _FP16)
    scaler = _loss_scaler_of(call, ctx) if float16 and not has_star_args(call) else ""
    if float16 and not scaler and not has_star_args(call):
        # ConvNeXt's engine.py: the training step's autocast becomes bfloat16 (its scaler is CUDA's), so evaluate()'s
        # becomes bfloat16 too: the model runs in one precision
        scaled = _scaled_float16_autocasts(ctx)
        if scaled:
            scaler = (f"The training autocast at line {scaled[0]} becomes bfloat16 (its loss scaler is CUDA's): this one "
                      "follows, so that the model runs in one precision.")
    if scaler:
        # float16 with loss scaling: the scaler is CUDA's, which disables itself on Neuron (DINO, MAE, DeiT), so
        # float16 would train unscaled; bfloat16 (Trainium's mixed precision) needs no scaling
        parts = [f"{name}={ctx.src(a)}" for name, a in zip(_CUDA_AUTOCAST_PARAMETERS, call.args) if name != "dtype"]
        parts += [f"{k.arg}={ctx.src(k.value)}" for k in call.keywords if k.arg != "dtype"]
        args = ", ".join([*parts, f"dtype={torch}.bfloat16"])
        fx.replace(call, f"{torch}.autocast({device}, {args})")
        return ctx.finding(site, "torch.cuda.amp.autocast only affects CUDA: use torch.autocast(\"neuron\", ...); its float16 "
                                 "becomes bfloat16, since the loss scaling it relies on is CUDA's", fix=fx.build(safety="unsafe"),
                           note=f"{scaler} bfloat16 has float32's exponent range and needs no loss scaling (the scaler "
                                "stays a pass-through; NM207 removes it where it can). Numerics differ from a float16 run.")
    args = call_args_src(call, ctx, names=_CUDA_AUTOCAST_PARAMETERS)
    if dtype is None and not has_star_args(call):
        args = ", ".join(x for x in [args, f"dtype={torch}.float16"] if x)
        note = "CUDA autocast defaulted to float16 (kept); bfloat16 is the usual choice on Trainium and needs no GradScaler."
    if float16:
        note = " ".join(x for x in (note, unscaled_float16_note(ctx)) if x)
    fx.replace(call, f"{torch}.autocast({device}{', ' + args if args else ''})")
    return ctx.finding(site, "torch.cuda.amp.autocast only affects CUDA: use torch.autocast(\"neuron\", ...)", fix=fx.build(), note=note)


def _scaled_float16_autocasts(ctx) -> list:
    """The lines of the file's float16 CUDA autocasts (NM206's) that a CUDA loss scaler scales (`_loss_scaler_of`)."""
    def build(a):
        out = []
        for c, q in a.resolved_calls:
            if q not in ("torch.cuda.amp.autocast", "torch.cuda.amp.autocast_mode.autocast") or has_star_args(c):
                continue
            dtype = kwarg(c, "dtype", 1)
            if dtype is None or (isinstance(dtype, (ast.Name, ast.Attribute)) and a.resolve(
                    dtype, a.module_scope, count_use=False) in _FP16):
                if _loss_scaler_of(c, ctx):
                    out.append(c.lineno)
        return sorted(out)

    return cached(ctx.analysis, "NM206 scaled float16 autocasts", build)


def _loss_scaler_of(call, ctx) -> str:
    """Why a float16 autocast is loss-scaled by CUDA's scaler, as the start of a note: the file builds a CUDA
    GradScaler (or timm's NativeScaler), or the function around the autocast uses a scaler it is handed
    (`loss_scaler(loss, optimizer, ...)` in MAE's and DeiT's engine.py, `fp16_scaler.scale(loss)`); "" when neither."""
    line = cuda_scaler_line(ctx)
    if line:
        return f"The loss scaler at line {line} is CUDA's, which disables itself on Neuron: float16 would train unscaled."
    from neuron_migrate.program.distributed import function_of

    fn = function_of(ctx.analysis, call)
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return ""
    params = {p.arg for p in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]}
    for node in walk(fn):
        if isinstance(node, ast.Call):
            f = node.func
            while isinstance(f, ast.Attribute):
                f = f.value
            if isinstance(f, ast.Name) and f.id in params and "scaler" in f.id.lower():
                return (f"`{f.id}` (line {node.lineno}) scales the loss, and a CUDA program's scaler disables itself on "
                        "Neuron: float16 would train unscaled.")
    return ""


# -- NM207 ------------------------------------------------------------------------------------------
_AUTOCASTS = {"torch.autocast", "torch.amp.autocast", "torch.cuda.amp.autocast", "torch.cuda.amp.autocast_mode.autocast",
              "torch.amp.autocast_mode.autocast", "torch.cpu.amp.autocast"}
_BF16 = {"torch.bfloat16"}
_FP16 = {"torch.float16", "torch.half"}


def autocast_precision(ctx) -> str:
    """'bf16' when every autocast of the file is bfloat16 and nothing asks for float16; 'fp16' when float16 is
    used; '' when the file shows no autocast precision."""

    def build(a):
        seen = set()
        for node in walk(a.tree):
            if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)):
                q = a.resolve(node.func, a.module_scope, count_use=False)
                if q in _AUTOCASTS:
                    dtype = kwarg(node, "dtype")
                    dq = a.resolve(dtype, a.module_scope, count_use=False) if isinstance(dtype, (ast.Name, ast.Attribute)) else None
                    if dq in _BF16:
                        seen.add("bf16")
                    elif dq in _FP16 or (dtype is None and q.startswith("torch.cuda.")):
                        seen.add("fp16")  # CUDA autocast defaults to float16
                    else:
                        seen.add("?")
                elif isinstance(node.func, ast.Attribute) and node.func.attr == "half" and not node.args:
                    seen.add("fp16")
            elif isinstance(node, (ast.Attribute, ast.Name)) and isinstance(getattr(node, "ctx", None), ast.Load):
                if a.resolve(node, a.module_scope, count_use=False) in _FP16:
                    seen.add("fp16")
        if "fp16" in seen:
            return "fp16"
        return "bf16" if seen == {"bf16"} else ""

    return cached(ctx.analysis, "autocast-precision", build)


def _scaler_removal(site, ctx):
    """Edits that remove `scaler = GradScaler(...)` and unwrap every use, or None when a use cannot be unwrapped."""
    a = ctx.analysis
    stmt = site.parent
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
        return None
    name = stmt.targets[0].id
    owner = next((n for n in site.ancestors() if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), a.tree)
    fx = ctx.fixer("safe")
    fx.scope = site.scope
    fx.delete(stmt)
    for node in walk(owner):
        if not (isinstance(node, ast.Name) and node.id == name) or node is stmt.targets[0]:
            continue
        attr = a.parent_of.get(node)
        call = a.parent_of.get(attr)
        if not (isinstance(node.ctx, ast.Load) and isinstance(attr, ast.Attribute) and isinstance(call, ast.Call)
                and call.func is attr and not call.keywords):
            return None
        method = attr.attr
        holder = a.parent_of.get(call)
        if method == "scale" and len(call.args) == 1:
            inner = call.args[0]
            text = ctx.src(inner)
            if not isinstance(inner, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)):
                text = f"({text})"
            fx.replace(call, text)
        elif method == "step" and len(call.args) == 1 and not isinstance(call.args[0], ast.Starred):
            opt = call.args[0]
            text = ctx.src(opt) if isinstance(opt, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)) else f"({ctx.src(opt)})"
            fx.replace(call, f"{text}.step()")
        elif method in ("update", "unscale_") and isinstance(holder, ast.Expr):
            fx.delete(holder)
        else:
            return None
    return fx


@rule(
    code="NM207",
    name="grad-scaler",
    summary="GradScaler next to bfloat16 autocast is unnecessary and is removed; with float16 it is reported (undocumented on Neuron)",
    fix="safe",
    severity="warning",
    triggers=[("call", "torch.cuda.amp.GradScaler"), ("call", "torch.amp.GradScaler"), ("call", "torch.GradScaler"),
              ("call", "torch.amp.grad_scaler.GradScaler")],
    docs="""
        Loss scaling protects float16 gradients from underflow; bfloat16 has float32's exponent range and needs
        none. Where every autocast of the file is bfloat16 (`torch.autocast("neuron", dtype=torch.bfloat16)`, or
        `torch.cuda.amp.autocast(dtype=torch.bfloat16)`) and nothing asks for float16, the scaler is removed and
        its uses are unwrapped consistently: `scaler.scale(loss).backward()` -> `loss.backward()`,
        `scaler.step(opt)` -> `opt.step()`, `scaler.update()` and `scaler.unscale_(opt)` removed. This keeps what
        the unmigrated script did on Neuron, where `torch.cuda.amp.GradScaler()` disables itself without CUDA;
        against a CUDA run, the scaler no longer skips steps whose gradients overflowed (bfloat16 rarely does).
        A scaler that is used otherwise (`state_dict()`, `get_scale()`, passed on) is reported instead.
        With float16 the scaler stays reported: TorchNeuron does not document loss scaling, and the ops GradScaler
        needs (`_amp_foreach_non_finite_check_and_unscale_`, `_amp_update_scale_`) are not in the pre-release op
        registry, so `torch.amp.GradScaler("neuron")` is unverified. Prefer bfloat16 (then the scaler goes).
        A scaler switched by the program's own precision choice (`GradScaler(enabled=(dtype == 'float16'))`, with
        `dtype = 'bfloat16' if ... is_bf16_supported() else 'float16'`) becomes `torch.amp.GradScaler("neuron",
        enabled=...)` (unsafe): a pass-through when the program picks bfloat16, as on Trainium; with float16 it
        scales on Neuron, unverified ([verify] in the note).
    """,
    examples=[("with torch.autocast('cuda', dtype=torch.bfloat16):\n    loss = model(x)\nscaler = torch.cuda.amp.GradScaler()\n"
               "scaler.scale(loss).backward()\nscaler.step(opt)\nscaler.update()",
               "with torch.autocast('neuron', dtype=torch.bfloat16):\n    loss = model(x)\nloss.backward()\nopt.step()")],
)
def grad_scaler(site, ctx):
    call = site.call
    enabled = kwarg(call, "enabled")
    if site.key != "torch.cuda.amp.GradScaler" and const_value(kwarg(call, "device", 0)) == "neuron" \
            and enabled is not None and not isinstance(enabled, ast.Constant):
        return None  # already on neuron, switched by the program's precision choice (the rewrite's note said [verify])
    precision = autocast_precision(ctx)
    if precision == "bf16":
        fx = _scaler_removal(site, ctx)
        if fx is not None:
            return ctx.finding(site, "GradScaler next to bfloat16 autocast is unnecessary: removed, with its scale/step/update calls",
                               fix=fx.build(), note="bfloat16 needs no loss scaling. Without the scaler an optimizer step "
                                                    "whose gradients overflowed is no longer skipped.")
        return ctx.finding(site, "GradScaler next to bfloat16 autocast is unnecessary: remove it and unwrap its uses "
                                 "(scaler.scale(loss).backward() -> loss.backward(), scaler.step(opt) -> opt.step(), drop "
                                 "scaler.update()); not rewritten: the scaler is used in other ways too")
    follows = _scaler_follows_precision(site, ctx)
    if follows is not None:
        return follows
    why = "with float16" if precision == "fp16" else "with no bfloat16 autocast in this file"
    return ctx.finding(site, f"GradScaler {why}: loss scaling on Neuron is undocumented (torch.cuda.amp.GradScaler() disables "
                             "itself without CUDA, so float16 gradients go unscaled); train in bfloat16 "
                             "(torch.autocast(\"neuron\", dtype=torch.bfloat16), which the rewrite writes where the "
                             "autocast that this scaler serves is loss-scaled, NM206) and remove the scaler, or keep it "
                             "as a pass-through. float16 scaling with torch.amp.GradScaler(\"neuron\") is unverified")


def _scaler_follows_precision(site, ctx):
    """`torch.cuda.amp.GradScaler(enabled=(dtype == 'float16'))`: the program turns the scaler on for float16 only, a
    choice made at run time. The scaler moves to the neuron device with the same `enabled=`: with bfloat16 (what
    the migrated precision choice picks on Trainium) it stays a pass-through, as it was; with float16 it scales
    on Neuron, which TorchNeuron does not document (unsafe, [verify])."""
    call = site.call
    enabled = kwarg(call, "enabled")
    if enabled is None or isinstance(enabled, ast.Constant) or has_star_args(call) or accelerator(ctx):
        return None
    fx = ctx.fixer("unsafe")
    fx.scope = site.scope
    if site.key == "torch.cuda.amp.GradScaler":
        fx.replace(call, f'{fx.ref("torch")}.amp.GradScaler("neuron", {ctx.args_src(call)})')
    else:
        device = kwarg(call, "device", 0)
        if not (isinstance(device, ast.Constant) and device.value == "cuda"):
            return None
        fx.replace(device, ctx.src(device).replace("cuda", "neuron"))
    return ctx.finding(site, f"GradScaler(enabled={ctx.src(enabled)}) follows the program's precision choice: moves to the neuron "
                             "device with the same switch (a pass-through with bfloat16, as before)", fix=fx.build(),
                       note="[verify] With float16 the scaler now scales on Neuron, which TorchNeuron does not document "
                            "(its _amp_* ops are not in the pre-release op registry); prefer bfloat16.")


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
              ("call", "torch.distributed.distributed_c10d.init_process_group"), ("string", "nccl"),
              ("call", "torch.distributed.is_nccl_available"), ("call", "torch.distributed.distributed_c10d.is_nccl_available")],
    docs=f"""
        NCCL needs CUDA. TorchNeuron runs torch.distributed (DDP, FSDP2, DTensor) "natively through the `neuron`
        backend" ({TORCH_DOCS}): `backend="nccl"` becomes `backend="neuron"` and `"cpu:gloo,cuda:nccl"` becomes
        `"cpu:gloo,neuron:neuron"`. A backend name is a value: `backend = 'nccl'` at module level,
        `parser.add_argument('--dist-backend', default='nccl')` read as `backend=args.dist_backend`, a config field
        or a parameter default, and every comparison with it (`args.dist_backend == "nccl"`), change together
        (`neuron_migrate.program.values`); values from the command line or a config must then say `neuron` (a GPU
        run passes `nccl` again). `dist.is_nccl_available()` becomes `dist.is_backend_available("neuron")` (public
        torch.distributed API). With `device-style = "accelerator"` the backend becomes
        `torch.distributed.get_default_backend_for_device(_accelerator_device())`: gloo on CPU, nccl on CUDA and the
        backend TorchNeuron registers for its device; a backend held in a variable is then reported.
    """,
    examples=[('dist.init_process_group(backend="nccl")', 'dist.init_process_group(backend="neuron")'),
              ('parser.add_argument("--dist-backend", default="nccl")\nargs = parser.parse_args()\n'
               'dist.init_process_group(backend=args.dist_backend)',
               'parser.add_argument("--dist-backend", default="neuron")\nargs = parser.parse_args()\n'
               'dist.init_process_group(backend=args.dist_backend)')],
)
def nccl_backend(site, ctx):
    if site.kind == "string":
        return _nccl_value(site, ctx)
    if site.key.endswith("is_nccl_available"):
        return _nccl_available(site, ctx)
    skip, out = skip_dispatch(site, ctx)
    if skip:
        return out
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
    fx.scope = site.scope
    if accelerator(ctx):
        fx.replace(backend, f"{fx.ref('torch.distributed')}.get_default_backend_for_device({agnostic_device(fx, bare=True)})")
        note = "Check on Neuron that the backend TorchNeuron registers for its device is `neuron`."
    else:
        quote = ctx.src(backend)[0]
        fx.replace(backend, f"{quote}{new}{quote}")
        note = ""
    return ctx.finding(site, f"backend {value!r} needs CUDA: use the `neuron` backend", fix=fx.build(), note=note)


def _nccl_value(site, ctx):
    """A 'nccl' string that is a process-group backend value (it reaches init_process_group/new_group): the whole
    value set changes, definitions and comparisons together."""
    node = site.node
    parent = ctx.analysis.parent_of.get(node)
    if isinstance(parent, ast.keyword) or (isinstance(parent, ast.Call) and node in parent.args):
        if isinstance(parent, ast.Call) or isinstance(ctx.analysis.parent_of.get(parent), ast.Call):
            call = parent if isinstance(parent, ast.Call) else ctx.analysis.parent_of.get(parent)
            q = ctx.analysis.resolve(call.func, site.scope, count_use=False) if isinstance(call.func, (ast.Name, ast.Attribute)) else None
            if q and q.startswith("torch.distributed.") and q.rsplit(".", 1)[1] in ("init_process_group", "new_group"):
                return None  # the literal in the call: the call's own finding
    if (isinstance(parent, ast.IfExp) and parent.body is node and isinstance(parent.test, ast.Call)
            and isinstance(parent.test.func, (ast.Name, ast.Attribute))
            and ctx.analysis.resolve(parent.test.func, site.scope, count_use=False) == "torch.cuda.is_available"):
        return None  # `'nccl' if torch.cuda.is_available() else 'neuron'`: the GPU host's choice (NM208's own fix)
    vs = values.facts(ctx.analysis).set_of(node)
    if vs is None or not vs.sink:
        return None
    members = vs.of_kind("nccl")
    member = next(m for m in members if m.node is node)
    lines = vs.lines()
    if vs.split:
        if member is not members[0]:
            return None
        return ctx.finding(site, f"{ctx.src(node)} is the process-group backend, and the default in {', '.join(vs.split)} is the "
                                 "same value, which that file keeps: left unchanged so that the two stay one; change them "
                                 "to 'neuron' together by hand")
    if accelerator(ctx):
        if member is not members[0]:
            return None
        return ctx.finding(site, f"{ctx.src(node)} is the process-group backend held in a value (lines {', '.join(map(str, lines))}): "
                                 "device-style accelerator does not rename it; use `torch.distributed.get_default_backend_for_device(...)` "
                                 "where the process group starts, or device-style neuron")
    fix = set_fix(ctx, vs, "nccl", lambda m, fx: ctx.src(m.node).replace("nccl", "neuron", 1))
    note = ""
    if len(members) > 1 or vs.external:
        note = f"One value with the strings at {lines_text(lines)}: every 'nccl' becomes 'neuron' together."
        if vs.external:
            note += f" Values from {', '.join(vs.external)} must now say 'neuron' (a CUDA run passes 'nccl')."
        if vs.elsewhere:
            note += f" Another file of the program passes it to torch ({', '.join(vs.elsewhere)})."
    return ctx.finding(site, f"{ctx.src(node)} is the process-group backend ({_ROLE_TEXT.get(member.role, 'value')}): becomes 'neuron'",
                       fix=fix, note=note)


def _nccl_available(site, ctx):
    """`dist.is_nccl_available()` -> `dist.is_backend_available("neuron")` (torch.distributed's public API, torch >= 2.4)."""
    call = site.call
    if call.args or call.keywords or accelerator(ctx):
        return ctx.finding(site, "dist.is_nccl_available() is False on Neuron: test the neuron backend "
                                 "(`dist.is_backend_available(\"neuron\")`)")
    fx = ctx.fixer()
    fx.scope = site.scope
    func = call.func
    if isinstance(func, ast.Attribute):
        fx.replace(call, f"{ctx.src(func.value)}.is_backend_available(\"neuron\")")
    else:
        fx.replace(call, f"{fx.ref('torch.distributed')}.is_backend_available(\"neuron\")")
    return ctx.finding(site, "dist.is_nccl_available() is False on Neuron: becomes dist.is_backend_available(\"neuron\")", fix=fx.build())


# -- NM209 ------------------------------------------------------------------------------------------
@rule(
    code="NM209",
    name="ddp-device-ids",
    summary="DistributedDataParallel `device_ids`/`output_device` name CUDA devices: drop them",
    fix="safe",
    severity="error",
    triggers=[("call", "torch.nn.parallel.DistributedDataParallel"), ("call", "torch.nn.parallel.distributed.DistributedDataParallel")],
    docs="""
        `DDP(model, device_ids=[local_rank], output_device=local_rank)` names the CUDA device of this rank. In a
        distributed run TorchNeuron gives each process one NeuronCore (index: its local rank), which is where the
        module already is, and on CPU `device_ids` must be None. For a module on a single device, DDP with `device_ids=None` uses
        the module's device (PyTorch DDP docs), so both arguments are removed. Where the module itself went to that
        index (`model = Net().to(rank); DDP(model, device_ids=[rank])`, the DDP tutorial: an int device is the
        current accelerator's, so the module is on `neuron:<rank>`; or through an attribute, `self.model =
        model.to(self.local_rank)` then `DDP(self.model, device_ids=[self.local_rank])`, minGPT-ddp's trainer)
        `device_ids` names the module's own device and stays: DDP moves the inputs there
        (`ddp_model(torch.randn(20, 10))` relies on it).
    """,
    examples=[("model = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])",
               "model = nn.parallel.DistributedDataParallel(model)")],
)
def ddp_device_ids(site, ctx):
    skip, out = skip_dispatch(site, ctx)
    if skip:
        return out
    call = site.call
    if _module_placed_by_index(call, ctx):
        return None
    drop = [k for k in call.keywords if k.arg in ("device_ids", "output_device") and const_value(k.value, 0) is not None]
    if not drop or len(call.args) > 1:
        return None
    fx = ctx.fixer()
    fx.scope = site.scope
    fx.replace(call, f"{ctx.src(call.func)}({call_args_src(call, ctx, drop={k.arg for k in drop})})")
    return ctx.finding(site, "DDP device_ids/output_device name a CUDA device: drop them (DDP uses the module's device)", fix=fx.build())


def _module_placed_by_index(call, ctx) -> bool:
    """`model = Net().to(rank); DDP(model, device_ids=[rank])`: the module went to the accelerator with that index (an
    int device is the current accelerator's, `neuron:<rank>` on TorchNeuron) and DDP moves the inputs there
    (`ddp_model(torch.randn(20, 10))` relies on it): device_ids names the module's own device and stays."""
    ids = next((k.value for k in call.keywords if k.arg == "device_ids"), None)
    # the module by name, or by attribute (`self.model = model.to(self.local_rank)` / `DDP(self.model,
    # device_ids=[self.local_rank])`, minGPT-ddp's trainer), written the same way at both places
    if not (isinstance(ids, (ast.List, ast.Tuple)) and len(ids.elts) == 1 and call.args
            and isinstance(call.args[0], (ast.Name, ast.Attribute))):
        return False
    index = ctx.src(ids.elts[0])
    if not isinstance(ids.elts[0], (ast.Name, ast.Attribute)):
        return False
    name = ctx.src(call.args[0])
    a = ctx.analysis
    scope = a.parent_of.get(call)
    while scope is not None and not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        scope = a.parent_of.get(scope)
    for node in walk(scope if scope is not None else a.tree):
        value = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], (ast.Name, ast.Attribute)) \
                and ctx.src(node.targets[0]) == name:
            value = node.value
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Attribute) \
                and ctx.src(node.value.func.value) == name:
            value = node.value  # model.to(rank)
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "to" \
                and value.args and ctx.src(value.args[0]) == index:
            return True
    return False


# -- NM229 ------------------------------------------------------------------------------------------
# FSDP (torch_xla's, FSDP1, FSDP2) and DTensor programs: their checkpoints hold DTensors, which torch.load
# rebuilds only with a str/dict map_location, and each rank reloads the per-rank file it saved
_SHARDED = ("torch_xla.distributed.fsdp", "torch.distributed.fsdp", "torch.distributed._composable.fsdp",
            "torch.distributed.tensor", "torch.distributed._tensor", "torch.distributed.checkpoint")
_RESTORE = 'lambda storage, location: storage if location == "cpu" else storage.to(device="neuron")'


@rule(
    code="NM229",
    name="load-map-location",
    summary="torch.load without map_location in a distributed program: device tensors come back on this rank's NeuronCore",
    fix="safe",
    severity="error",
    triggers=[("call", "torch.load"), ("call", "torch.serialization.load")],
    docs=f"""
        `torch.load(path)` with no `map_location` puts each tensor back on the device it was saved from. Rank 0
        saves the checkpoint, so its tensors are tagged `neuron:0`; in a distributed run TorchNeuron gives each
        process one NeuronCore, `neuron:<local rank>`, and any other index fails ("device that doesn't attach to this
        process": torch_neuronx's c10_neuron device), so every rank but 0 dies when it resumes (the DDP tutorial's
        `multigpu_torchrun.py` `_load_snapshot`). On CUDA every process sees every GPU and the same line worked. A
        checkpoint the original CUDA program wrote (tags `cuda:0`) fails to load on a host without CUDA as well.
        In a file that runs in a process group (it starts one, DDP/FSDP-wraps, or a distributed program of the
        repository runs it) `map_location={_RESTORE}` is added: tensors saved on a device (neuron or cuda) come back
        on this rank's NeuronCore (the current device), tensors saved on the CPU stay there, as before (datasets,
        RNG states). A call that passes `map_location` (or a second positional argument) is left as it is, and so
        is a file that uses FSDP or DTensor: torch.load rebuilds DTensors only with a string or dict
        `map_location` ("Callable map_location not supported with _rebuild_wrapper_subclass"), and there each rank
        reloads the shards it saved itself, on its own device.
    """,
    examples=[('torch.distributed.init_process_group("neuron")\nsnapshot = torch.load(snapshot_path)',
               f'torch.distributed.init_process_group("neuron")\nsnapshot = torch.load(snapshot_path, map_location={_RESTORE})')],
)
def load_map_location(site, ctx):
    from neuron_migrate.program.distributed import facts

    call = site.call
    if len(call.args) != 1 or has_star_args(call) or any(k.arg in ("map_location", None) for k in call.keywords):
        return None
    f = facts(ctx.analysis)
    if f.single_device or not (f.starts_group or f.distributed_elsewhere or f.group_elsewhere):
        return None
    if any(q.startswith(_SHARDED) for q in [*f.calls, *f.refs]):
        return None  # DTensor checkpoints refuse a callable map_location; each rank loads the shards it saved
    q = string_quote(site, ctx)
    fx = ctx.fixer()
    fx.scope = site.scope
    fx.replace(call, f"{ctx.src(call.func)}({call_args_src(call, ctx)}, map_location={_RESTORE.replace(chr(34), q)})")
    return ctx.finding(site, "torch.load without map_location puts rank 0's device tensors back on neuron:0, which other "
                             "ranks cannot reach on TorchNeuron: map device tensors to this rank's NeuronCore", fix=fx.build())


# -- NM230 ------------------------------------------------------------------------------------------
def _in_picker_fallback(node, ctx) -> bool:
    """`node` is in the final `else` of a device picker (an if chain that picks among backends, before or after
    NM203 gave it its neuron branch)."""
    parents = ctx.analysis.parent_of
    tops = {id(p.top) for p in cuda_picker.pickers(ctx)}
    p = parents.get(node)
    while p is not None:
        if isinstance(p, ast.If) and any(node is st for st in p.orelse):
            top = p
            while isinstance(parents.get(top), ast.If) and parents[top].orelse == [top]:
                top = parents[top]
            branches, _ = cuda_picker.if_chain(top)
            if id(top) in tops or any("accelerator" in ctx.src(b.test) for b in branches):
                return True
        node, p = p, parents.get(p)
    return False


@rule(
    code="NM230",
    name="data-parallel",
    summary="nn.DataParallel fails on TorchNeuron (CUDA's scatter): the wrap goes where nothing needs it; else DDP by hand",
    fix="unsafe",
    severity="error",
    triggers=[("call", q) for q in DATA_PARALLEL],
    docs="""
        `nn.DataParallel` drives several devices from one process: it splits each batch with
        `torch._C._scatter` and copies the module with `torch._C._broadcast_coalesced`, which exist only in a
        CUDA build of torch. TorchNeuron runs on torch's CPU build (its documented install takes torch from
        download.pytorch.org/whl/cpu), and DataParallel picks the `neuron` device there (`torch._utils._get_available_device_type`), so its forward fails ("module 'torch._C' has
        no attribute '_scatter'"), even with one NeuronCore (measured on the emulated device). Run one process
        per NeuronCore under torchrun and wrap the model in `DistributedDataParallel`, or use the module
        unwrapped (its state_dict keys then lose the `module.` prefix). Where the wrap is guarded by a CUDA device
        count (`if torch.cuda.device_count() > 1: model = nn.DataParallel(model)`), the guard stays CUDA (NM204
        leaves it): 0 on a Trainium host, so the model trains unwrapped on one NeuronCore, as before on a machine
        with one GPU. A wrap in a device picker's final `else` (the CPU fallback, pytorch/examples' imagenet) is
        not reported: once the picker has its neuron branch a Trainium host never reaches it (NM203 reports a picker
        that cannot get one).
        Unsafe fix: the statement `model = nn.DataParallel(model, ...)` (also followed by `.cuda()` or `.to(...)`,
        which then moves the model itself; under any other guard, such as the
        `if device == 'cuda':` of pytorch-cifar, whose test becomes `'neuron'`; under the `torch.cuda.device_count()`
        guard, the whole `if` when the wrap is all it holds) is removed when nothing in the file
        needs the wrapper: `model.module` is read only under a `hasattr(model, "module")` or `isinstance` test, and
        no function returns the wrapped model to its callers. The program then computes the same in one process
        on one NeuronCore. Its `state_dict()` keys lose the `module.` prefix (a checkpoint the CUDA program saved
        loads once the prefix is stripped), and BatchNorm sees the whole batch where, on several GPUs, each
        replica saw its part. Anything else is reported for a hand migration.
    """,
    examples=[("model = Net()\nmodel = torch.nn.DataParallel(model)", "model = Net()"),
              ("def build(model):\n    return torch.nn.DataParallel(model)", None)],
)
def data_parallel(site, ctx):
    if _in_picker_fallback(site.stmt, ctx):
        return None  # a device picker's CPU fallback: unreachable once the picker has its neuron branch (NM203)
    kept = ""
    p = ctx.analysis.parent_of.get(site.stmt)
    while p is not None and not isinstance(p, ast.If):
        p = ctx.analysis.parent_of.get(p)
    counts = [n for n in walk(p.test) if isinstance(n, ast.Call) and ctx.analysis.resolve(
        n.func, ctx.analysis.module_scope, count_use=False) == "torch.cuda.device_count"] if p is not None else []
    if any(data_parallel_guard(n, ctx) is p for n in counts):
        kept = ("; the `torch.cuda.device_count()` guard stays CUDA (0 on a Trainium host), so the model trains "
                "unwrapped on one NeuronCore")
    message = ("nn.DataParallel fails on TorchNeuron (its scatter and broadcast exist only in CUDA builds of torch): "
               "run one process per NeuronCore with torchrun and DistributedDataParallel")
    name, why = _removable_wrap(site, ctx)
    # under the CUDA device count the wrap never runs on Trainium: the whole `if` is the block a hand migration
    # deletes (it stays where more than the wrap sits under it)
    whole_if = bool(kept) and p.body == [site.stmt] and not p.orelse and site.stmt.value is site.call
    if name is None or (kept and not whole_if):
        return ctx.finding(site, message + (kept or why))
    fx = ctx.fixer("unsafe")
    if whole_if:
        fx.delete(p)
        return ctx.finding(site, f"{message}{kept}; the (unsafe) fix removes the whole block, which never runs there",
                           fix=fx.build())
    if site.stmt.value is site.call:
        fx.delete(site.stmt)
    else:  # `model = nn.DataParallel(model).cuda()`: the move stays, on the model itself
        fx.replace(site.call, name)
    return ctx.finding(site, f"{message}; this wrap is removed, so `{name}` trains unwrapped on one NeuronCore (the same "
                             "computation in one process)", fix=fx.build(),
                       note=f"`{name}.state_dict()` keys lose the `module.` prefix DataParallel added: a checkpoint saved "
                            "by the CUDA program loads once the prefix is stripped (`{k.removeprefix('module.'): v ...}`). "
                            "With several GPUs DataParallel split each batch, and BatchNorm saw each part alone; here it "
                            "sees the whole batch. One process now drives one NeuronCore: to train on all of them, start "
                            "one process per core with torchrun and wrap the model in DistributedDataParallel.")


def _removable_wrap(site, ctx):
    """(name, "") of a model wrapped by the statement `model = nn.DataParallel(model, ...)` when nothing in the file
    needs the wrapper: its `.module` is read only under a `hasattr(model, "module")` or `isinstance` test (the
    unwrapped model takes the other branch), and a function does not hand the wrapper to its callers. Else (None,
    why the wrap stays, or "" for other forms and for code that dispatches over backends, whose CUDA branch keeps
    its wrap)."""
    stmt, call = site.stmt, site.call
    value = stmt.value if isinstance(stmt, ast.Assign) else None
    moved = (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.value is call
             and value.func.attr in ("cuda", "to"))  # `model = nn.DataParallel(model).cuda()`
    if not ((value is call or moved) and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name) and call.args and isinstance(call.args[0], ast.Name)
            and call.args[0].id == stmt.targets[0].id and not has_star_args(call)):
        return None, ""
    if site.key == "torch.nn.parallel.data_parallel" or skip_dispatch(site, ctx)[0]:
        return None, ""
    name = stmt.targets[0].id
    a = ctx.analysis
    fn = site.scope.node if site.scope is not a.module_scope else None
    for node in walk(fn if fn is not None else a.tree):
        if isinstance(node, ast.Return) and node.value is not None and any(
                isinstance(n, ast.Name) and n.id == name for n in walk(node.value)):
            return None, f"; the wrap stays (line {node.lineno} returns it to callers that may read its `.module`)"
    for node in walk(a.tree):
        if (isinstance(node, ast.Attribute) and node.attr == "module" and isinstance(node.value, ast.Name)
                and node.value.id == name and not _wrapper_tested(node, ctx)):
            return None, f"; the wrap stays (line {node.lineno} reads its `.module`)"
    return name, ""


def _wrapper_tested(node, ctx) -> bool:
    """`node` (a `model.module` read) sits under a test of whether the model is wrapped: `hasattr(model, "module")`
    or `isinstance(model, ...)`, in an `if` or a conditional expression."""
    name = node.value.id
    parents = ctx.analysis.parent_of
    child, p = node, parents.get(node)
    while p is not None:
        if isinstance(p, (ast.If, ast.IfExp)) and child is not p.test:
            for n in walk(p.test):
                if (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and len(n.args) == 2
                        and isinstance(n.args[0], ast.Name) and n.args[0].id == name
                        and (n.func.id == "isinstance" or n.func.id == "hasattr" and const_value(n.args[1]) == "module")):
                    return True
        child, p = p, parents.get(p)
    return False


# -- NM231 ------------------------------------------------------------------------------------------
_RANK_TIMES = re.compile(r"\b(?:local_rank|rank|gpu|gpu_id|device_id|proc_id)\s*\*\s*\d+")
_DEVICE_TARGET = re.compile(r"dev|gpu|cuda", re.I)


def _several_devices(a) -> list:
    """Assignments such as `dev1 = rank * 2 + 1` in a file that runs in a process group: each process computes
    device indexes of its own, beyond its rank (the DDP tutorial's model-parallel demo)."""
    from neuron_migrate.program.distributed import facts

    f = facts(a)
    if f.single_device or not (f.starts_group or f.distributed_elsewhere or f.group_elsewhere):
        return []
    return [node for node in walk(a.tree) if isinstance(node, ast.Assign) and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name) and _DEVICE_TARGET.search(node.targets[0].id)
            and _RANK_TIMES.search(a.source(node.value))]


@rule(
    code="NM231",
    name="devices-per-process",
    summary="a process that drives several devices (dev1 = rank * 2 + 1): TorchNeuron gives each process one NeuronCore",
    fix="none",
    severity="error",
    triggers=[("call", "torch.distributed.init_process_group"), ("call", "torch.distributed.distributed_c10d.init_process_group")],
    docs="""
        Model parallelism inside a DDP process (the DDP tutorial's `demo_model_parallel`: `dev0 = rank * 2`,
        `dev1 = rank * 2 + 1`, half of the model on each) needs two devices per process. In a distributed run
        TorchNeuron gives each process one NeuronCore, whose index is its local rank (torch_neuronx's process
        group sets NEURON_RT_VISIBLE_CORES to it); any other index fails ("device that doesn't attach to this
        process"). Each such index computation is reported at its line: run the stages as processes of their own
        (`torch.distributed.pipelining`, or tensor parallelism with DTensor) or keep the whole model on this rank's
        NeuronCore (the same values; the memory of one core). The rewrite cannot choose between them.
    """,
    examples=[('torch.distributed.init_process_group("neuron")\ndev1 = rank * 2 + 1', None)],
)
def devices_per_process(site, ctx):
    if cached(ctx.analysis, "NM231-first", lambda _a: site) is not site:
        return None  # one report per file, from its first init_process_group
    found = cached(ctx.analysis, "several-devices", _several_devices)
    return [ctx.finding(node, f"`{ctx.src(node)}`: this process computes a device of its own beyond its rank; on "
                              "TorchNeuron each process owns one NeuronCore (index: its local rank), so this device "
                              "does not exist there: run each stage as its own process (torch.distributed.pipelining) "
                              "or keep the model on this rank's NeuronCore") for node in found] or None


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
    fix="safe",
    severity="info",
    triggers=[("store", "torch.backends.cudnn.*"), ("store", "torch.backends.cuda.*"), ("call", "torch.backends.cudnn.*"),
              ("call", "torch.backends.cuda.*")],
    docs="""
        `torch.backends.cudnn.benchmark = True`, `cudnn.deterministic`, `allow_tf32` and the
        `torch.backends.cuda.*` switches configure CUDA libraries. On Neuron they do nothing: remove them, or for
        reproducible execution order use `torch.use_deterministic_algorithms(True)` (which also disables
        TorchNeuron's Adaptive Eager fusion, per the TorchNeuron FAQ). Safe fix: a setting under
        `if device == 'cuda':` whose 'cuda' NM201 rewrites together with the rest of its value set (the device a
        program picks, as in pytorch-cifar) runs only on the neuron device after the rewrite, and is removed; an
        `if` left empty goes with it. Elsewhere the setting stays for GPU hosts and is reported.
    """,
    examples=[("torch.backends.cudnn.benchmark = True", None),
              ("device = 'cuda' if torch.cuda.is_available() else 'cpu'\nmodel = model.to(device)\n"
               "if device == 'cuda':\n    torch.backends.cudnn.benchmark = True",
               "device = 'neuron' if torch.accelerator.is_available() else 'cpu'\nmodel = model.to(device)\n")],
)
def cudnn_settings(site, ctx):
    message = f"`{site.key}` configures CUDA libraries and does nothing on Neuron"
    guard = _neuron_only_guard(site, ctx)
    if guard is None:
        # harmless where it stays (it still serves GPU hosts): a performance note, not a change the program needs
        return ctx.finding(site, f"{message}: harmless; keep it for GPU hosts or remove it")
    fx = ctx.fixer("safe")
    fx.delete(site.stmt)
    return ctx.finding(site, f"{message}: removed, since it runs only when `{ctx.src(guard.test)}`, which the rewrite makes a "
                             "test for the neuron device", fix=fx.build())


def _neuron_only_guard(site, ctx):
    """The `if device == 'cuda':` a CUDA library setting (a statement of its own) sits in, when NM201 rewrites that
    test's 'cuda' with every other string of its value (pytorch-cifar's `device = 'cuda' if ... else 'cpu'`), so that
    after the rewrite the setting runs only on the neuron device, where it does nothing. None otherwise (a test that
    stays CUDA keeps the setting for GPU hosts)."""
    stmt = site.stmt
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and stmt.targets[0] is site.node
            or isinstance(stmt, ast.Expr) and site.kind == "call" and stmt.value is site.call):
        return None
    parent = ctx.analysis.parent_of.get(stmt)
    if not isinstance(parent, ast.If) or not any(st is stmt for st in parent.body):
        return None
    test = parent.test
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return None
    member = next((n for n in (test.left, test.comparators[0]) if isinstance(n, ast.Constant) and n.value == "cuda"), None)
    if member is None or ctx.ruleset is None or "NM201" not in ctx.ruleset.codes or skip_dispatch(site, ctx)[0]:
        return None
    vs = values.facts(ctx.analysis).set_of(member)
    if vs is None or vs.multi_backend or vs.plan() != "all":
        return None
    return parent


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


# CUDA-only training libraries: why, and what each part (by import prefix; "" for the rest) becomes on TorchNeuron
_APEX_PARTS = {
    "apex.amp": 'torch.autocast("neuron", dtype=torch.bfloat16) for amp.initialize/amp.scale_loss (bfloat16 needs no '
                "loss scaling)",
    # LARC wraps an optimizer (layer-wise adaptive rates, SwAV/SimCLR-style training): no torch.optim equivalent
    "apex.parallel.LARC": "a LARS/LARC optimizer wrapper of the program's own (apex's LARC.py is plain PyTorch: a copy "
                          "into the repository runs on Neuron) around the torch.optim optimizer",
    "apex.parallel": "torch.nn.parallel.DistributedDataParallel (SyncBatchNorm: torch.nn.SyncBatchNorm)",
    "apex.optimizers": "a torch.optim optimizer (FusedAdam -> torch.optim.AdamW, FusedLAMB -> another torch.optim one)",
    "apex.normalization": "torch.nn.LayerNorm / torch.nn.RMSNorm",
}
_CUDA_LIBRARIES = {
    "apex": ("NVIDIA apex (fused CUDA kernels, patched AMP) needs CUDA",
             {**_APEX_PARTS, "": "; ".join(f"{k} -> {v}" for k, v in _APEX_PARTS.items())}),
    "flash_attn": ("flash-attn's kernels are CUDA-only",
                   {"": "torch.nn.functional.scaled_dot_product_attention (TorchNeuron lowers it to its fused attention)"}),
    "xformers": ("xformers' kernels are CUDA-only",
                 {"": "torch.nn.functional.scaled_dot_product_attention for xformers.ops.memory_efficient_attention"}),
    "bitsandbytes": ("bitsandbytes' 8-bit optimizers and 4/8-bit layers need CUDA",
                     {"": "a torch.optim optimizer (AdamW) and unquantized layers in bfloat16"}),
    "transformer_engine": ("Transformer Engine's FP8 layers need NVIDIA GPUs", {"": "torch.nn layers in bfloat16"}),
}


@rule(
    code="NM232",
    name="cuda-only-library",
    summary="CUDA-only training libraries (apex, flash-attn, xformers, bitsandbytes, Transformer Engine) do not run on Neuron",
    fix="none",
    severity="error",
    triggers=[("import", q) for lib in _CUDA_LIBRARIES for q in (lib, lib + ".*")],
    docs="""
        NVIDIA apex (`amp.initialize`, `amp.scale_loss`, `apex.parallel.DistributedDataParallel`, `FusedAdam`,
        `FusedLayerNorm`), flash-attn, xformers, bitsandbytes and Transformer Engine ship CUDA kernels; they do not
        install or run on a Trainium host, so a program that imports them stops at the import. Each import is
        reported with the native replacement: `torch.autocast("neuron", dtype=torch.bfloat16)` for apex AMP,
        `torch.nn.parallel.DistributedDataParallel` for apex's (apex's LARC optimizer wrapper, SwAV's, is plain
        PyTorch: a copy of its LARC.py in the repository runs as it is), `torch.optim` optimizers for the fused and 8-bit
        ones, `torch.nn.LayerNorm`/`RMSNorm` for the fused norms, `F.scaled_dot_product_attention` for the attention
        kernels. Not rewritten: apex AMP's `opt_level` and loss scaling, and the layers' arguments, need a human.
        Imports a program already does without are not reported: inside a function (lazy imports, as libraries
        gate them), under an `if` that asks whether something is available (or `if TYPE_CHECKING:`), or in a
        `try:` that catches ImportError.
    """,
    examples=[("from apex import amp\nmodel, optimizer = amp.initialize(model, optimizer, opt_level='O1')", None)],
)
def cuda_only_library(site, ctx):
    if _import_guarded(site, ctx):
        return None  # the program already runs without it (a lazy, checked or try/except ImportError import)
    lib = site.key.split(".", 1)[0]
    why, parts = _CUDA_LIBRARIES[lib]
    prefix = max((p for p in parts if p and (site.key == p or site.key.startswith(p + "."))), key=len, default="")
    return ctx.finding(site, f"`{site.key}`: {why}; it does not install or run on a Trainium host: use {parts[prefix]}")


def _import_guarded(site, ctx) -> bool:
    """The import is one the program already does without: in a function (a lazy import, as libraries gate them), under
    an `if` that asks whether something is available (`if is_bnb_available():`), or in a `try:` body whose handlers
    catch ImportError (or a base of it)."""
    a = ctx.analysis
    child, up = site.stmt, a.parent_of.get(site.stmt)
    while up is not None:
        if isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return True
        if isinstance(up, ast.If) and any(w in a.source(up.test) for w in ("available", "TYPE_CHECKING")):
            return True
        if isinstance(up, ast.Try) and any(st is child for st in up.body) and any(
                catches_import_error(h) for h in up.handlers):
            return True
        child, up = up, a.parent_of.get(up)
    return False


_TIMM_MIXUP = ("timm.data.Mixup", "timm.data.mixup.Mixup")


@rule(
    code="NM233",
    name="timm-mixup-cuda",
    summary="timm's Mixup of the releases research repositories pin makes its targets on 'cuda'",
    fix="none",
    severity="warning",
    triggers=[("call", q) for q in _TIMM_MIXUP],
    docs="""
        timm 0.3.2 and 0.4.x (the releases DeiT, ConvNeXt, MAE and many research repositories pin) build Mixup's mixed
        targets with `mixup_target(..., device='cuda')`, its default: the input's device is not passed, so on a host
        without CUDA the first mixed batch stops ("Torch not compiled with CUDA enabled"). Later releases pass the
        input's device [verify: the first such release]. Nothing in the program says which timm it gets, so each
        `Mixup(...)` is reported: install a timm whose Mixup passes `x.device`, or give `mixup_target` the neuron
        device (`functools.partial`) before training. Found on ConvNeXt's main.py, whose `--mixup` is on by default.
    """,
    examples=[("from timm.data import Mixup\nmixup_fn = Mixup(mixup_alpha=0.8, num_classes=1000)", None)],
)
def timm_mixup_cuda(site, ctx):
    return ctx.finding(site, "timm's Mixup: the releases research code pins (0.3.2, 0.4.x) make its targets on 'cuda' "
                             "(mixup_target's default device), so the first mixed batch fails on Neuron; use a timm whose "
                             "Mixup passes the input's device, or give timm.data.mixup.mixup_target device='neuron'")


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


_TIMM_SCALER = ("timm.utils.NativeScaler", "timm.utils.cuda.NativeScaler")


@rule(
    code="NM234",
    name="timm-native-scaler-cuda",
    summary="timm's NativeScaler() builds a CUDA GradScaler, which turns itself off on Neuron: float16 loss scaling stops",
    fix="none",
    severity="warning",
    triggers=[("call", q) for q in _TIMM_SCALER],
    docs="""
        `timm.utils.NativeScaler()` (DeiT's, and many research repositories' `loss_scaler`) wraps
        `torch.cuda.amp.GradScaler()` in timm 0.3.2 and 0.4.x, and `torch.amp.GradScaler("cuda")` by default later
        [verify: the release that added `device=`]. On a host without CUDA that scaler disables itself with a warning
        ("CUDA is not available. Disabling"), so a float16 autocast the migration kept (NM206, NM131) trains with
        unscaled gradients, which may underflow where the CUDA run's were scaled; nothing fails. Reported at each
        `NativeScaler()` without a device: train in bfloat16 (`torch.autocast("neuron", dtype=torch.bfloat16)`, which
        needs no scaler) or scale with `torch.amp.GradScaler("neuron")` (`NativeScaler(device="neuron")` in a timm
        that takes it). Found on DeiT's main.py.
    """,
    examples=[("from timm.utils import NativeScaler\nloss_scaler = NativeScaler()", None)],
)
def timm_native_scaler_cuda(site, ctx):
    call = site.call
    if call.args or any(k.arg in ("device", None) for k in call.keywords):
        return None  # a device is given (a later timm): its own rules see it
    return ctx.finding(site, "timm's NativeScaler() builds a CUDA GradScaler, which disables itself on Neuron: a float16 "
                             "autocast then trains with unscaled gradients; use bfloat16 autocast (no scaler needed) or "
                             "torch.amp.GradScaler(\"neuron\") (NativeScaler(device=\"neuron\") in a timm that takes it)")


# -- NM235 ------------------------------------------------------------------------------------------
_SPAWNS = ("torch.multiprocessing.spawn", "torch.multiprocessing.spawn.spawn")


@rule(
    code="NM235",
    name="spawn-local-rank",
    summary="mp.spawn workers get LOCAL_RANK from their spawn index: TorchNeuron binds each process to that NeuronCore",
    fix="safe",
    severity="error",
    triggers=[("call", q) for q in _SPAWNS],
    docs="""
        A CUDA program that starts its workers with `torch.multiprocessing.spawn(main_worker, nprocs=ngpus, ...)`
        (pytorch/examples' imagenet, MoCo, SimSiam, Barlow Twins) picks each worker's GPU with
        `torch.cuda.set_device(gpu)`, `gpu` being the spawn index. TorchNeuron's process group gives each process one
        NeuronCore, the one `LOCAL_RANK` names (the backend sets `NEURON_RT_VISIBLE_CORES` from it when the group
        starts), and only torchrun sets `LOCAL_RANK`: without it the index comes from elsewhere (the emulated device
        takes the global rank, wrong on every node but the first of a multi-node launch, where `--rank` shifts it).
        The worker's first statement becomes `os.environ.setdefault("LOCAL_RANK", str(gpu))` (its spawn index, the
        local one on every node; under `if gpu is not None:` where the script also calls the worker itself, as
        imagenet does under torchrun, whose LOCAL_RANK stands), before it starts the group; `set_device` itself goes (NM204). Only for a worker defined in
        the file that starts the process group there and does not read `LOCAL_RANK` itself. [verify] on a Trainium
        host: the documented runtime wiring reads `LOCAL_RANK`; a multi-node spawn was checked on the emulated device.
    """,
    examples=[("import torch.distributed as dist\nimport torch.multiprocessing as mp\n\n\ndef main_worker(gpu, args):\n"
               "    dist.init_process_group('neuron', rank=gpu, world_size=2)\n\n\nmp.spawn(main_worker, nprocs=2, args=(None,))",
               "import os\nimport torch.distributed as dist\nimport torch.multiprocessing as mp\n\n\ndef main_worker(gpu, args):\n"
               "    os.environ.setdefault(\"LOCAL_RANK\", str(gpu))\n    dist.init_process_group('neuron', rank=gpu, world_size=2)\n\n\n"
               "mp.spawn(main_worker, nprocs=2, args=(None,))")],
)
def spawn_local_rank(site, ctx):
    call = site.call
    fn = kwarg(call, "fn", 0)
    a = ctx.analysis
    if not isinstance(fn, ast.Name) or "torch.distributed.init_process_group" not in a.qualnames:
        return None
    defs = [s for s in a.tree.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name == fn.id]
    if len(defs) != 1:
        return None
    worker = defs[0]
    params = [*worker.args.posonlyargs, *worker.args.args]
    if not params or "LOCAL_RANK" in a.source(worker):
        return None
    if not any(isinstance(n, ast.Call) and isinstance(n.func, (ast.Name, ast.Attribute)) and a.resolve(
            n.func, a.module_scope, count_use=False) == "torch.distributed.init_process_group" for n in walk(worker)):
        return None  # the group starts elsewhere (a helper, another file): where LOCAL_RANK must be set is not seen
    body = worker.body
    first = body[1] if len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
        and isinstance(body[0].value.value, str) else body[0]
    fx = ctx.fixer()
    fx.scope = site.scope
    os_ = fx.ref("os")
    index = params[0].arg
    # torchrun's own LOCAL_RANK stands (setdefault); where the script also calls the worker itself (imagenet's
    # `main_worker(args.gpu, ...)` under torchrun, with args.gpu None), only a spawn index is written
    line = f'{os_}.environ.setdefault("LOCAL_RANK", str({index}))'
    if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == fn.id for n in walk(a.tree)):
        line = f"if {index} is not None:\n    {line}"
    fx.insert_before(first, line)
    return ctx.finding(site, f"mp.spawn starts `{fn.id}` without torchrun's LOCAL_RANK, which TorchNeuron's process group "
                             f"reads to give each process its NeuronCore: the worker sets it from its spawn index "
                             f"`{params[0].arg}` first", fix=fx.build())
