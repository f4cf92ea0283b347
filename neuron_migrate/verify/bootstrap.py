"""One side of a verify run, in its own process: `python bootstrap.py SPEC.json`.

Runs the user's script as `__main__` and records, without changing what the program computes:
- every scalar `backward()` is called on (the loss), as a detached device tensor read after the run (no extra
  XLA graph cuts);
- at each optimizer step: the gradients as the optimizer sees them (after clipping), the parameters after the
  step, and the param groups' hyperparameters; where each optimizer was constructed (file:line);
- at each optimizer step: the modules called in eval mode (`training` False) while gradients were enabled, and
  every `Module.train()` / `eval()` call the program made (file:line, mode): a lost `model.train()` shows exactly;
- at each optimizer step: the collectives the program called (kind, whether on gradients, file:line), from
  torch.distributed (and DDP's gradient all-reduce) natively or torch_xla's xm.* functions on the XLA side;
- at one chosen step (`hook_step`, the replay that localises a divergence): each module's output and the
  gradient flowing into it, in call order, with the module's qualified name and source lines.
It seeds Python, numpy and torch before the script runs, pins the thread count, optionally makes float64 the
default dtype, and draws every random number (factories, in-place samplers, dropout) from one seeded host
generator so that both sides see the same numbers whatever their device's own generator does. On the XLA side
it supplies the torch_xla APIs that 2.9 removed (`xm.xrt_world_size`, `xm.get_ordinal`, ...).

Standalone on purpose: it runs under the XLA environment's interpreter, where neuron_migrate is not installed
(the native side adds it to sys.path only to install the emulated device).
"""
from __future__ import annotations

import json
import os
import random
import runpy
import sys
import traceback


class _Stop(BaseException):
    """Raised from the optimizer hook once the requested steps ran (BaseException: user `except Exception`
    blocks do not swallow it)."""


def _user_frame(skip_dirs: tuple) -> tuple[str, int]:
    """The program's line that made the call: outside torch and this file, and outside the helpers the rewrite
    inserts (`_neuron_*`: the line a reader looks at, and the line a change map names, is the helper's call)."""
    f = sys._getframe(2)
    while f is not None:
        name = f.f_code.co_filename
        if not name.startswith(skip_dirs) and name != __file__ and not f.f_code.co_name.startswith("_neuron_"):
            return name, f.f_lineno
        f = f.f_back
    return "", 0


def _logical(t, param):
    """The parameter (or its gradient) as the model defines it, whichever way a sharding wrapper holds it: an FSDP2
    DTensor gathered whole (a collective: every rank records at the same step), an XLA FSDP shard (one replica:
    the whole parameter, flattened and padded) cut and reshaped to the parameter's size."""
    if hasattr(t, "full_tensor") and hasattr(t, "placements"):
        return t.full_tensor()
    size = getattr(param, "_orig_size", None)
    if getattr(param, "_is_sharded", False) and size is not None and t.dim() == 1 and t.numel() >= size.numel():
        return t[:size.numel()].view(size)
    return t


# the module names sharding wrappers insert (XLA FSDP, torch FSDP1), and XLA FSDP's own parameter names
_WRAPPER_PARTS = ("_fsdp_wrapped_module", "_fpw_module", "_fsdp_shard")


def _param_name(name: str) -> str:
    """`_fsdp_wrapped_module.0._fsdp_shard_FSDP_SHARD_SEPARATOR__fsdp_wrapped_module_FSDP_SHARD_SEPARATOR_weight` ->
    `0.weight`: the name in the unwrapped model, as FSDP2 keeps it."""
    parts = name.replace("_FSDP_SHARD_SEPARATOR_", ".").split(".")
    return ".".join(p for p in parts if p not in _WRAPPER_PARTS)


def _scalar_hparams(group: dict) -> dict:
    out = {}
    for k, v in group.items():
        if k == "params":
            continue
        if isinstance(v, (bool, int, float, str)) or v is None:
            out[k] = v
        elif isinstance(v, tuple) and all(isinstance(x, (int, float)) for x in v):
            out[k] = list(v)
        elif hasattr(v, "item") and getattr(v, "numel", lambda: 2)() == 1:  # a tensor lr
            out[k] = float(v.detach().cpu().item())
    return out


class Recorder:
    def __init__(self, torch, spec: dict):
        self.torch = torch
        self.spec = spec
        self.max_steps = spec.get("steps")
        self.hook_step = spec.get("hook_step")
        self.step = 0
        self.losses: list = []  # (step, detached scalar)
        self.grads: list = []  # per step: [tensor | None]
        self.params: list = []
        self.hparams: list = []
        self.opt_index: dict = {}
        self.opt_sites: list = []
        self.world_sizes: list = []  # the process group's size at each optimizer step (1: none)
        self.autocast: set = set()  # dtypes of the autocast regions entered
        self.names: dict = {}  # id(param) -> qualified name
        self.module_names: dict = {}  # id(module) -> qualified name
        self.depth = 0
        self.module_rows: list = []  # hook step: dicts
        self.module_outs: list = []
        self.module_ins: list = []
        self.module_grads: dict = {}
        self.cap = int(spec.get("max_elements", 2_000_000))
        self.eval_modules: dict = {}  # step -> names of the modules called in eval mode with gradients enabled
        self.module_classes: dict = {}  # name -> class, of the modules in eval_modules
        self.mode_calls: list = []  # {'step', 'path', 'line', 'mode', 'class'} per Module.train()/eval() of the program
        self.collectives: dict = {}  # step -> {(kind, on gradients, path, line): count}
        self.coll_depth = 0
        self.train_depth = 0
        self.optimizers: list = []
        torch_dir = os.path.dirname(torch.__file__)
        self.skip_dirs = (torch_dir, os.path.dirname(torch_dir) + os.sep + "torch_xla")

    # -- capture ---------------------------------------------------------------------------------
    def install(self) -> None:
        torch = self.torch
        rec = self
        orig_backward = torch.Tensor.backward

        def backward(tensor, *args, **kwargs):
            if tensor.numel() == 1:
                rec.losses.append((rec.step, tensor.detach().clone().reshape(())))
            return orig_backward(tensor, *args, **kwargs)

        torch.Tensor.backward = backward

        orig_init = torch.optim.Optimizer.__init__

        def opt_init(opt, *args, **kwargs):
            if not hasattr(opt, "_nm_verify_site"):
                path, line = _user_frame(rec.skip_dirs)
                opt._nm_verify_site = {"class": type(opt).__name__, "path": path, "line": line}
                rec.optimizers.append(opt)
            return orig_init(opt, *args, **kwargs)

        torch.optim.Optimizer.__init__ = opt_init

        orig_enter = torch.autocast.__enter__

        def autocast_enter(ctx):
            if getattr(ctx, "_enabled", True):
                rec.autocast.add(str(getattr(ctx, "fast_dtype", "")).replace("torch.", ""))
            return orig_enter(ctx)

        torch.autocast.__enter__ = autocast_enter

        orig_train = torch.nn.Module.train

        def module_train(module, mode=True):
            if rec.train_depth == 0:  # the outermost call (eval() calls train(False), train() its children's)
                path, line = _user_frame(rec.skip_dirs)
                if path:
                    rec.mode_calls.append({"step": rec.step, "path": path, "line": line, "mode": bool(mode),
                                           "class": type(module).__name__})
            rec.train_depth += 1
            try:
                return orig_train(module, mode)
            finally:
                rec.train_depth -= 1

        torch.nn.Module.train = module_train
        self._install_collectives()
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        # inside a compiled step (torch.compile of a function that calls optimizer.step(), the migration of
        # torch_xla.compile) Dynamo would trace the recorder into the graph and keep what it saw while tracing: the
        # hooks run eagerly instead, on the tensors of the run (a graph break there changes no number)
        eager = getattr(getattr(torch, "compiler", None), "disable", None) or (lambda fn: fn)
        register_optimizer_step_pre_hook(eager(self._pre_step))
        register_optimizer_step_post_hook(eager(self._post_step))
        from torch.nn.modules.module import (
            register_module_forward_hook,
            register_module_forward_pre_hook,
        )

        register_module_forward_pre_hook(eager(self._module_pre))
        register_module_forward_hook(eager(self._module_post))

    def _count(self, kind: str, grad: bool) -> None:
        path, line = _user_frame(self.skip_dirs)
        key = (kind, grad, path, line)
        step = self.collectives.setdefault(self.step, {})
        step[key] = step.get(key, 0) + 1

    def _is_grad(self, tensors) -> bool:
        torch = self.torch
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        if not isinstance(tensors, (list, tuple)):
            return False
        grads = {id(p.grad) for opt in self.optimizers for g in opt.param_groups for p in g["params"]
                 if p.grad is not None}
        return any(id(t) in grads for t in tensors)

    def _wrap(self, owner, name: str, kind: str, grad=None) -> None:
        """Count each call of owner.name (the outermost one: a collective calling another counts once).
        `grad`: True (always on gradients), or None (on gradients when its tensor argument is a parameter's
        .grad)."""
        orig = getattr(owner, name, None)
        if orig is None or getattr(orig, "_nm_verify_counted", False):
            return
        rec = self

        def counted(*args, **kwargs):
            if rec.coll_depth == 0:
                on_grad = grad if grad is not None else rec._is_grad(
                    next((a for a in args if isinstance(a, (rec.torch.Tensor, list, tuple))), None))
                rec._count(kind, bool(on_grad))
            rec.coll_depth += 1
            try:
                return orig(*args, **kwargs)
            finally:
                rec.coll_depth -= 1

        counted._nm_verify_counted = True
        counted.__wrapped__ = orig
        setattr(owner, name, counted)

    def _install_collectives(self) -> None:
        dist = self.torch.distributed
        if not dist.is_available():
            return
        for name, kind in (("all_reduce", "all_reduce"), ("all_gather", "all_gather"),
                           ("all_gather_into_tensor", "all_gather"), ("all_gather_object", "all_gather"),
                           ("all_gather_single", "all_gather"),  # torch 2.13's tensor forms (FSDP1, FSDP2 call them)
                           ("reduce_scatter", "reduce_scatter"), ("reduce_scatter_tensor", "reduce_scatter"),
                           ("reduce_scatter_single", "reduce_scatter"),
                           ("broadcast", "broadcast"), ("broadcast_object_list", "broadcast"), ("barrier", "barrier"),
                           ("all_to_all", "all_to_all"), ("all_to_all_single", "all_to_all"), ("reduce", "reduce"),
                           ("gather", "gather"), ("scatter", "scatter")):
            self._wrap(dist, name, kind)
        try:
            from torch.nn.parallel import DistributedDataParallel as DDP
        except ImportError:
            return
        rec = self
        orig_init, orig_forward = DDP.__init__, DDP.forward

        def ddp_init(ddp, *args, **kwargs):
            ddp._nm_verify_site = _user_frame(rec.skip_dirs)
            rec.coll_depth += 1  # its parameter broadcast is part of wrapping the model, not of a step
            try:
                return orig_init(ddp, *args, **kwargs)
            finally:
                rec.coll_depth -= 1

        def ddp_forward(ddp, *args, **kwargs):
            # DDP's reducer all-reduces the gradients in C++ during the backward this forward leads to
            if rec.torch.is_grad_enabled() and ddp.require_backward_grad_sync and rec.coll_depth == 0:
                path, line = getattr(ddp, "_nm_verify_site", ("", 0))
                step = rec.collectives.setdefault(rec.step, {})
                key = ("all_reduce (DDP)", True, path, line)
                step[key] = step.get(key, 0) + 1
            return orig_forward(ddp, *args, **kwargs)

        DDP.__init__, DDP.forward = ddp_init, ddp_forward

    def install_xla_collectives(self) -> None:
        """torch_xla's collectives and graph cuts, counted as the program calls them (one replica: XLA may skip
        the communication itself, the call is what the program asked for)."""
        import torch_xla
        import torch_xla.core.xla_model as xm

        for name, kind, grad in (("all_reduce", "all_reduce", None), ("all_gather", "all_gather", None),
                                 ("reduce_scatter", "reduce_scatter", None), ("all_to_all", "all_to_all", None),
                                 ("collective_permute", "send/recv", None), ("mesh_reduce", "all_gather", False),
                                 ("rendezvous", "barrier", False), ("reduce_gradients", "all_reduce", True),
                                 ("optimizer_step", "all_reduce", True), ("mark_step", "mark_step", False)):
            self._wrap(xm, name, kind, grad)
        self._wrap(torch_xla, "sync", "mark_step", False)

    def _params_of(self, opt):
        return [p for g in opt.param_groups for p in g["params"]]

    def _keep(self, tensors, params=None):
        if params is not None:
            tensors = [None if t is None else _logical(t, p) for t, p in zip(tensors, params)]
        total = sum(t.numel() for t in tensors if t is not None)
        if total > self.cap:  # too big to keep every step: a fixed slice and the norm of each
            return [None if t is None else {"norm": t.detach().float().norm().clone(),
                                            "head": t.detach().reshape(-1)[:4096].clone()} for t in tensors]
        return [None if t is None else t.detach().clone() for t in tensors]

    def _pre_step(self, opt, args, kwargs):
        if id(opt) not in self.opt_index:
            self.opt_index[id(opt)] = len(self.opt_sites)
            site = dict(getattr(opt, "_nm_verify_site", {"class": type(opt).__name__, "path": "", "line": 0}))
            site["params"] = [self.names.get(id(p), f"group{gi}.{pi}") for gi, g in enumerate(opt.param_groups)
                              for pi, p in enumerate(g["params"])]
            self.opt_sites.append(site)
        params = self._params_of(opt)
        self.grads.append((self.opt_index[id(opt)], self._keep([p.grad for p in params], params)))
        self.hparams.append([_scalar_hparams(g) for g in opt.param_groups])

    def _post_step(self, opt, args, kwargs):
        params = self._params_of(opt)
        self.params.append(self._keep(params, params))
        dist = self.torch.distributed
        self.world_sizes.append(dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1)
        self.step += 1
        if self.max_steps is not None and self.step >= self.max_steps:
            raise _Stop()

    def _module_pre(self, module, inputs):
        if self.depth == 0 and id(module) not in self.module_names:
            root = type(module).__name__
            for n, m in module.named_modules():
                self.module_names.setdefault(id(m), f"{root}.{n}" if n else root)
            for n, p in module.named_parameters():
                self.names.setdefault(id(p), _param_name(n))
        if not module.training and self.torch.is_grad_enabled():
            name = self.module_names.get(id(module), type(module).__name__)
            self.eval_modules.setdefault(self.step, set()).add(name)
            self.module_classes[name] = type(module).__name__
        self.depth += 1

    def _module_post(self, module, inputs, output):
        self.depth = max(0, self.depth - 1)
        if self.hook_step is None or self.step != self.hook_step or len(self.module_rows) >= 2000:
            return
        torch = self.torch
        out = output
        while isinstance(out, (tuple, list)) and out:
            out = out[0]
        if isinstance(out, dict):
            out = next((v for v in out.values() if isinstance(v, torch.Tensor)), None)
        if not isinstance(out, torch.Tensor) or not out.is_floating_point():
            return
        index = len(self.module_rows)
        row = {"index": index, "name": self.module_names.get(id(module), type(module).__name__),
               "class": type(module).__name__}
        try:
            import inspect

            lines, first = inspect.getsourcelines(type(module))
            row.update(path=inspect.getsourcefile(type(module)) or "", first=first, last=first + len(lines) - 1)
        except (OSError, TypeError):
            row.update(path="", first=0, last=0)
        self.module_rows.append(row)
        self.module_outs.append(out.detach().clone())
        first_in = next((x for x in inputs if isinstance(x, torch.Tensor) and x.is_floating_point()), None)
        self.module_ins.append(None if first_in is None else first_in.detach().clone())
        if out.requires_grad:
            def grad_hook(g, i=index):
                self.module_grads[i] = g.detach().clone()

            out.register_hook(grad_hook)
        return

    # -- results ---------------------------------------------------------------------------------
    def dump(self, out_dir: str, status: str, error: str, extra: dict) -> None:
        torch = self.torch

        def host(x):
            if x is None:
                return None
            if isinstance(x, dict):
                return {k: host(v) for k, v in x.items()}
            return x.detach().to("cpu").clone()

        data = {
            "losses": [host(t) for _, t in self.losses],
            "grads": [[host(t) for t in ts] for _, ts in self.grads],
            "params": [[host(t) for t in ts] for ts in self.params],
            "module_outs": [host(t) for t in self.module_outs],
            "module_ins": [host(t) for t in self.module_ins],
            "module_grads": {i: host(t) for i, t in self.module_grads.items()},
        }
        meta = {
            "status": status, "error": error, "steps": self.step,
            "loss_steps": [s for s, _ in self.losses],
            "grad_opts": [o for o, _ in self.grads],
            "hparams": self.hparams, "optimizers": self.opt_sites, "modules": self.module_rows,
            "autocast": sorted(self.autocast), "world_sizes": self.world_sizes,
            "eval_modules": {str(k): sorted(v) for k, v in self.eval_modules.items()},
            "module_classes": self.module_classes, "mode_calls": self.mode_calls[:200],
            "collectives": {str(k): [[kind, grad, path, line, n] for (kind, grad, path, line), n in v.items()]
                            for k, v in self.collectives.items()},
            "dtype": str(self.losses[0][1].dtype).replace("torch.", "") if self.losses else "",
            "torch": torch.__version__,
            **extra,
        }
        torch.save(data, os.path.join(out_dir, "tensors.pt"))
        with open(os.path.join(out_dir, "meta.json"), "w", encoding="utf-8") as fh:
            json.dump(meta, fh, indent=1)


# ------------------------------------------------------------------------------------- host random numbers


def align_random(torch, seed: int) -> None:
    """Draw every random number on the host from one seeded generator, then move it to the device."""
    gen = torch.Generator().manual_seed(seed)
    F = torch.nn.functional

    def _factory(orig):
        def f(*args, generator=None, device=None, out=None, requires_grad=False, pin_memory=False, **kw):
            if generator is not None or out is not None:
                return orig(*args, generator=generator, device=device, out=out, requires_grad=requires_grad,
                            pin_memory=pin_memory, **kw)
            t = orig(*args, generator=gen, **kw)
            if device is not None and torch.device(device).type != "cpu":
                t = t.to(device)
            return t.requires_grad_() if requires_grad else t
        return f

    for name in ("rand", "randn", "randint", "randperm"):
        setattr(torch, name, _factory(getattr(torch, name)))

    def _like(kind):
        def f(input, *args, dtype=None, device=None, requires_grad=False, memory_format=None, layout=None, **kw):
            dev = device if device is not None else input.device
            if kind == "randint_like":
                low, high = (0, args[0]) if len(args) == 1 else args[:2]
                t = torch.randint(low, high, tuple(input.shape), dtype=dtype or input.dtype)
            else:
                t = getattr(torch, kind[:-5])(tuple(input.shape), dtype=dtype or input.dtype)
            t = t.to(dev)
            return t.requires_grad_() if requires_grad else t
        return f

    for name in ("rand_like", "randn_like", "randint_like"):
        setattr(torch, name, _like(name))

    def _inplace(orig):
        def m(self, *args, generator=None, **kw):
            if generator is not None:
                return orig(self, *args, generator=generator, **kw)
            args = tuple(a.cpu() if isinstance(a, torch.Tensor) else a for a in args)
            if self.device.type == "cpu":
                return orig(self, *args, generator=gen, **kw)
            tmp = torch.empty(tuple(self.shape), dtype=self.dtype)
            orig(tmp, *args, generator=gen, **kw)
            with torch.no_grad():
                self.copy_(tmp)
            return self
        return m

    for name in ("uniform_", "normal_", "bernoulli_", "random_", "exponential_", "geometric_", "log_normal_",
                 "cauchy_"):
        setattr(torch.Tensor, name, _inplace(getattr(torch.Tensor, name)))
    orig_bernoulli_ = torch.Tensor.bernoulli_  # patched: draws on the host

    def _on_host(orig):
        def f(input, *args, generator=None, **kw):
            if generator is not None or not isinstance(input, torch.Tensor):
                return orig(input, *args, generator=generator, **kw)
            args = tuple(a.cpu() if isinstance(a, torch.Tensor) else a for a in args)
            return orig(input.detach().cpu(), *args, generator=gen, **kw).to(input.device)
        return f

    for name in ("bernoulli", "multinomial", "poisson"):
        setattr(torch, name, _on_host(getattr(torch, name)))

    orig_dropout = F.dropout

    def dropout(input, p=0.5, training=True, inplace=False):
        if not training or p == 0 or p == 1:
            return orig_dropout(input, p, training, inplace)
        mask = orig_bernoulli_(torch.empty(tuple(input.shape), dtype=input.dtype, device=input.device), 1 - p)
        mask = mask.div_(1 - p)
        return input.mul_(mask) if inplace else input * mask

    F.dropout = dropout


# ---------------------------------------------------------------------------------------------- XLA side


REMOVED_XM = {  # torch_xla.core.xla_model names that torch_xla 2.9 removed -> the runtime function now
    "xrt_world_size": "world_size", "get_ordinal": "global_ordinal", "get_local_ordinal": "local_ordinal",
}


def supply_removed_xla_apis() -> list[str]:
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    supplied = []
    for old, new in REMOVED_XM.items():
        if not hasattr(xm, old) and hasattr(xr, new):
            fn = getattr(xr, new)
            setattr(xm, old, lambda *a, _fn=fn, **k: _fn())
            supplied.append(f"torch_xla.core.xla_model.{old}")
    # One replica, in this process: XLA's CPU backend cannot run two (xmp.spawn with two CPU devices deadlocks at
    # the first all-reduce), and a spawned child would run without this file's recording and supplied names.
    from torch_xla._internal import pjrt

    orig_spawn = pjrt.spawn

    def spawn(fn, nprocs=None, start_method="spawn", args=()):
        return orig_spawn(fn, 1, start_method, args)

    pjrt.spawn = spawn
    if not hasattr(xm, "is_master_ordinal"):
        xm.is_master_ordinal = lambda local=True: (xr.local_ordinal() if local else xr.global_ordinal()) == 0
        supplied.append("torch_xla.core.xla_model.is_master_ordinal")
    return supplied


def _user_traceback() -> str:
    """The exception being handled, without the frames of this file and runpy (the user's frames only)."""
    te = traceback.TracebackException(*sys.exc_info())
    te.stack = traceback.StackSummary.from_list(
        [f for f in te.stack if f.filename != __file__ and "runpy" not in f.filename][-8:])
    text = "".join(te.format())
    return text if len(text) <= 4000 else text[:2000] + "\n[...]\n" + text[-1000:]


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as fh:
        spec = json.load(fh)
    out_dir = spec["out"]
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # one of N processes under torchrun: its own results folder
        out_dir = os.path.join(out_dir, f"rank{os.environ.get('RANK', '0')}")
        os.makedirs(out_dir, exist_ok=True)
    extra: dict = {"side": spec["side"], "supplied": []}
    import torch

    torch.set_num_threads(int(spec.get("threads", 1)))
    if spec.get("float64"):
        torch.set_default_dtype(torch.float64)
    if spec.get("emulate"):
        sys.path.insert(0, spec["nm_root"])
        from neuron_migrate.probe.emulator import install
        from neuron_migrate.table import load_table

        # with the table, as the probe and the test runs install it: the ops TorchNeuron runs natively get device
        # kernels (a convolution reaches the device as convolution_overrideable, which the host fallback lacks)
        install(load_table())
        sys.path.remove(spec["nm_root"])
    if spec["side"] == "xla":
        import torch_xla

        extra["supplied"] = supply_removed_xla_apis()
        extra["torch_xla"] = torch_xla.__version__
    seed = int(spec.get("seed", 0))
    random.seed(seed)
    try:
        import numpy

        numpy.random.seed(seed)
    except ImportError:
        pass
    torch.manual_seed(seed)
    if spec.get("host_rng", True):
        align_random(torch, seed)
    rec = Recorder(torch, spec)
    rec.install()
    if spec["side"] == "xla":
        rec.install_xla_collectives()
    script = spec["script"]
    sys.argv = [script, *spec.get("args", [])]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    os.chdir(spec.get("cwd") or os.path.dirname(os.path.abspath(script)))
    status, error = "finished", ""
    try:
        runpy.run_path(script, run_name="__main__")
    except _Stop:
        status = "stopped"
    except SystemExit as exc:
        if exc.code not in (None, 0):
            status, error = "error", f"the program exited with status {exc.code}"
    except BaseException:  # noqa: BLE001  (reported to the parent)
        status, error = "error", _user_traceback()
    try:
        rec.dump(out_dir, status, error, extra)
    except BaseException:  # noqa: BLE001
        with open(os.path.join(out_dir, "meta.json"), "w", encoding="utf-8") as fh:
            json.dump({"status": "error", "error": "could not save the results:\n" + traceback.format_exc()}, fh)
        return 2
    sys.stdout.flush()
    os._exit(0)  # skip the program's atexit work (XLA runtime teardown, loader workers)


if __name__ == "__main__":
    # Run under a module name of its own, not `__main__`: the user's script becomes `__main__` (runpy), and
    # torch.compile resolves the globals of this file's hooks through sys.modules[fn.__module__].
    import importlib.util

    _spec = importlib.util.spec_from_file_location("_nm_verify_bootstrap", __file__)
    _mod = importlib.util.module_from_spec(_spec)
    sys.modules["_nm_verify_bootstrap"] = _mod
    _spec.loader.exec_module(_mod)
    sys.exit(_mod.main())
