"""The op recorder (runs in the child process; imports torch).

Technique (verified on torch 2.13, see shared design notes section 4):

- a `TorchDispatchMode` sees every aten overload executed: forward, backward (the autograd engine runs CPU
  work on the calling thread) and the optimizer step;
- the user's call site is the first frame outside torch, site-packages, the standard library and this package;
- a `TorchFunctionMode` (it sits above autograd) tags `out.grad_fn.metadata["nm_site"]` with the forward call
  site; during backward `torch._C._current_autograd_node()` is the node being run, so backward ops are
  attributed to the forward line that created that node;
- global optimizer step hooks mark the optimizer phase; global module hooks find parameters and buffers
  held in float64 and where they were registered.
"""
from __future__ import annotations

import json
import os
import sys
import sysconfig
import threading
import time
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

_F64 = {torch.float64, torch.complex128}

_PROBE_DIR = os.path.dirname(os.path.abspath(__file__))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))


def _excluded_prefixes() -> tuple[str, ...]:
    prefixes = {_PROBE_DIR, _TORCH_DIR}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            prefixes.add(os.path.abspath(p))
    for p in sys.path:
        if p and ("site-packages" in p or "dist-packages" in p):
            prefixes.add(os.path.abspath(p))
    return tuple(sorted(prefixes))


_EXCLUDED = _excluded_prefixes()
_code_is_user: dict[Any, bool] = {}


def _is_user_code(code) -> bool:
    r = _code_is_user.get(code)
    if r is None:
        fn = code.co_filename
        if fn.startswith("<"):
            r = False
        else:
            fn = os.path.abspath(fn)
            r = not (
                fn.startswith(_EXCLUDED)
                or "site-packages" in fn
                or "dist-packages" in fn
            )
        _code_is_user[code] = r
    return r


def user_site(depth: int = 1) -> tuple[str, int] | None:
    """(file, line) of the first frame outside torch, site-packages, the stdlib and the probe."""
    f = sys._getframe(depth)
    while f is not None:
        if _is_user_code(f.f_code):
            return (os.path.abspath(f.f_code.co_filename), f.f_lineno)
        f = f.f_back
    return None


def _in_module_init(f) -> bool:
    """True when an `nn.Module.__init__` is on the stack (model construction, usually on the CPU)."""
    while f is not None:
        if f.f_code.co_name == "__init__":
            try:
                if isinstance(f.f_locals.get("self"), torch.nn.Module):
                    return True
            except Exception:  # noqa: BLE001
                pass
        f = f.f_back
    return False


def site_of_traceback(tb) -> tuple[str, int] | None:
    """The innermost user frame of a traceback."""
    found = None
    while tb is not None:
        if _is_user_code(tb.tb_frame.f_code):
            found = (os.path.abspath(tb.tb_frame.f_code.co_filename), tb.tb_lineno)
        tb = tb.tb_next
    return found


def op_name(func) -> str:
    """`aten::atan2.default` for the OpOverload `aten.atan2.default`."""
    try:
        return f"{func.namespace}::{func._opname}.{func._overloadname}"
    except AttributeError:
        return str(func)


def _dtypes(tree) -> list[str]:
    out = []
    for t in pytree.tree_leaves(tree):
        if isinstance(t, torch.Tensor):
            s = str(t.dtype).replace("torch.", "")
            if s not in out:
                out.append(s)
    return out


def _any_f64(tree) -> bool:
    return any(isinstance(t, torch.Tensor) and t.dtype in _F64 for t in pytree.tree_leaves(tree))


class ProbeStop(BaseException):
    """Raised in the user's process to end a run early (--max-steps, --time-limit). A BaseException so a
    user's `except Exception` does not swallow it."""


class Recorder:
    """Collects op records. Thread-safe enough for the autograd engine (one lock around updates)."""

    def __init__(self, on_tick: Callable[[], None] | None = None, tick_s: float = 0.5):
        self.records: dict[tuple, dict] = {}
        self.phase = "forward"
        self.paused = 0
        self.lock = threading.Lock()
        self.float64_tensors: dict[tuple, dict] = {}
        self.registration_sites: dict[tuple[int, str], tuple[str, int] | None] = {}
        self.seen_modules: set[int] = set()
        self.optimizer_steps = 0
        self.on_tick = on_tick
        self.tick_s = tick_s
        self._last_tick = time.monotonic()
        self._new_keys = False
        self.journal = None
        self.deadline: float | None = None
        self.max_steps: int | None = None
        self.stop_reason: str | None = None
        self._hooks: list = []
        self._modes: list = []

    # ------------------------------------------------------------------ recording
    def record(self, func, args, kwargs, out) -> None:
        if self.paused:
            return
        name = op_name(func)
        if name.startswith("profiler::"):
            return  # record_function markers, not compute
        node = torch._C._current_autograd_node()
        attributed = False
        node_name = None
        if node is not None:
            phase = "backward"
            node_name = node.name()
            site = None
            try:
                site = node.metadata.get("nm_site")
            except Exception:  # noqa: BLE001 - some nodes have no metadata dict
                site = None
            if site is not None:
                attributed = True
            else:
                site = user_site(3)
        else:
            phase = self.phase
            site = user_site(3)
            if phase == "forward" and _in_module_init(sys._getframe(2)):
                phase = "init"
        ins = _dtypes((args, kwargs))
        outs = _dtypes(out)
        f64 = _any_f64((args, kwargs)) or _any_f64(out)
        key = (name, phase, site)
        with self.lock:
            rec = self.records.get(key)
            if rec is None:
                self._new_keys = True
                rec = self.records[key] = {
                    "op": name,
                    "phase": phase,
                    "file": site[0] if site else None,
                    "line": site[1] if site else None,
                    "attributed": attributed,
                    "grad_fn": node_name,
                    "count": 0,
                    "in_dtypes": [],
                    "out_dtypes": [],
                    "float64": False,
                    # float64 produced from no float64 input: a float64 source (torch.tensor(..., float64), .double())
                    "float64_source": False,
                }
                if self.journal is not None:  # one line per new record: survives a hard crash
                    try:
                        self.journal.write(json.dumps(rec) + "\n")
                        self.journal.flush()
                    except Exception:  # noqa: BLE001
                        pass
            rec["count"] += 1
            for d in ins:
                if d not in rec["in_dtypes"]:
                    rec["in_dtypes"].append(d)
            for d in outs:
                if d not in rec["out_dtypes"]:
                    rec["out_dtypes"].append(d)
            if f64:
                rec["float64"] = True
                if not _any_f64((args, kwargs)):
                    rec["float64_source"] = True
        self._maybe_tick()

    def _maybe_tick(self) -> None:
        now = time.monotonic()
        if self.deadline is not None and now > self.deadline and self.stop_reason is None:
            self.stop_reason = "time limit reached"
            raise ProbeStop(self.stop_reason)
        # flush often while new ops appear (a hard crash keeps them), every tick_s otherwise
        due = self.tick_s / 5 if self._new_keys else self.tick_s
        if self.on_tick is not None and now - self._last_tick > due:
            self._new_keys = False
            self._last_tick = now
            try:
                self.on_tick()
            except Exception:  # noqa: BLE001 - never break the user's run for a flush
                pass

    # ------------------------------------------------------------------ float64 state
    def _note_module(self, module) -> None:
        if id(module) in self.seen_modules:
            return
        self.seen_modules.add(id(module))
        cls = type(module).__name__
        for kind, items in (("parameter", module.named_parameters(recurse=False)),
                            ("buffer", module.named_buffers(recurse=False))):
            for name, t in items:
                if t is not None and t.dtype in _F64:
                    site = self.registration_sites.get((id(module), name))
                    key = (id(module), name)
                    self.float64_tensors[key] = {
                        "kind": kind,
                        "name": f"{cls}.{name}",
                        "dtype": str(t.dtype).replace("torch.", ""),
                        "shape": list(t.shape),
                        "file": site[0] if site else None,
                        "line": site[1] if site else None,
                    }

    def scan_model(self, model) -> None:
        """Full names for a root model known to the harness (factory targets)."""
        if not isinstance(model, torch.nn.Module):
            return
        for mname, mod in model.named_modules():
            for kind, items in (("parameter", mod.named_parameters(recurse=False)),
                                ("buffer", mod.named_buffers(recurse=False))):
                for name, t in items:
                    if t is not None and t.dtype in _F64:
                        site = self.registration_sites.get((id(mod), name))
                        self.float64_tensors[(id(mod), name)] = {
                            "kind": kind,
                            "name": f"{mname}.{name}" if mname else name,
                            "dtype": str(t.dtype).replace("torch.", ""),
                            "shape": list(t.shape),
                            "file": site[0] if site else None,
                            "line": site[1] if site else None,
                        }
            self.seen_modules.add(id(mod))

    # ------------------------------------------------------------------ install / remove
    def install(self) -> None:
        from torch.nn.modules import module as mm
        from torch.optim import optimizer as om

        rec = self

        def _buf_hook(module, name, buffer):
            rec.registration_sites[(id(module), name)] = user_site(2)

        def _param_hook(module, name, param):
            rec.registration_sites[(id(module), name)] = user_site(2)

        def _fwd_pre(module, args):
            rec._note_module(module)

        def _opt_pre(opt, args, kwargs):
            rec.phase = "optimizer"

        def _opt_post(opt, args, kwargs):
            rec.phase = "forward"
            rec.optimizer_steps += 1
            if rec.on_tick is not None:
                try:
                    rec.on_tick()
                except Exception:  # noqa: BLE001
                    pass
            if rec.max_steps is not None and rec.optimizer_steps >= rec.max_steps and rec.stop_reason is None:
                rec.stop_reason = f"--max-steps {rec.max_steps} reached"
                raise ProbeStop(rec.stop_reason)

        self._hooks = [
            mm.register_module_buffer_registration_hook(_buf_hook),
            mm.register_module_parameter_registration_hook(_param_hook),
            mm.register_module_forward_pre_hook(_fwd_pre),
            om.register_optimizer_step_pre_hook(_opt_pre),
            om.register_optimizer_step_post_hook(_opt_post),
        ]
        self._modes = [_SiteTagger(self), _OpMode(self)]
        for m in self._modes:
            m.__enter__()

    def uninstall(self) -> None:
        for m in reversed(self._modes):
            try:
                m.__exit__(None, None, None)
            except Exception:  # noqa: BLE001 - mode stack already unwound by an exception
                pass
        self._modes = []
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def __enter__(self):
        self.install()
        return self

    def __exit__(self, *exc):
        self.uninstall()
        return False

    # ------------------------------------------------------------------ results
    def ops(self) -> list[dict]:
        with self.lock:
            return [dict(r, in_dtypes=list(r["in_dtypes"]), out_dtypes=list(r["out_dtypes"]))
                    for r in self.records.values()]

    def float64_state(self) -> list[dict]:
        return list(self.float64_tensors.values())


class _OpMode(TorchDispatchMode):
    def __init__(self, rec: Recorder):
        super().__init__()
        self.rec = rec

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.rec.record(func, args, kwargs, out)
        return out


class _SiteTagger(TorchFunctionMode):
    """Tags each new autograd node with the user line that created it."""

    def __init__(self, rec: Recorder):
        super().__init__()
        self.rec = rec

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        try:
            site = None
            for t in pytree.tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    g = t.grad_fn
                    if g is not None:
                        md = g.metadata
                        if "nm_site" not in md:
                            if site is None:
                                site = user_site(2)
                            md["nm_site"] = site
        except Exception:  # noqa: BLE001 - tagging is best effort
            pass
        return out
