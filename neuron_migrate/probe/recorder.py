"""The op recorder (runs in the child process; imports torch).

Technique (verified on torch 2.13, see shared design notes section 4):

- a `TorchDispatchMode` sees every aten overload executed: forward, backward (the autograd engine runs CPU
  work on the calling thread) and the optimizer step; on the emulated `neuron` device it sees the ops the
  device's dispatcher receives (native_dropout, _foreach_*, device-type branches in libraries);
- each op gets two locations from one walk of the Python stack: the innermost frame outside torch, the stdlib
  and this package (an installed library such as transformers counts: `lib_file`), and the innermost frame
  in the user's own files (`file`); the first is what points into `modeling_vit.py:545`, the second is the
  user's line that led there;
- the outputs of each forward op get their autograd node (set by autograd after the op returns) tagged with
  the op's locations when the next op is dispatched (`grad_fn.metadata["nm_site"]`); during backward
  `torch._C._current_autograd_node()` is the node being run, so backward ops are attributed to the forward
  call that created that node;
- cost per op is kept small (the probe's overhead target is <= 3x a plain step): op names and namespace hints
  are derived once per overload, the walk through the caller's stack stops at the first frame outside torch
  and reuses the rest of the walk for the same suspended caller frame and instruction, consecutive ops from
  one calling frame and instruction reuse its answer, code objects are cached by id (hashing one hashes its
  constants) and line numbers are read only for the frames reported, dtypes and layouts are read in one pass
  over the arguments, and an op seen before with the same site and dtypes only bumps a counter;
- namespace use is seen at run time: sparse layouts and nested tensors on an op's inputs or outputs (or in
  its name), ops run from torch.distributions code, calls of the torch.func transforms (wrapped while the
  recorder is installed);
- global optimizer step hooks mark the optimizer phase; global module hooks find parameters and buffers
  held in float64, or sparse/nested, and where they were registered;
- report, don't crash (`rescue`, the default on a device): an op the device cannot run because it has no kernel
  for a tensor kind (sparse, nested: the dispatcher's "Could not run ... 'Sparseneuron' backend") is recorded with
  its line and run on the host instead (dense results go back to the device, sparse/nested ones stay on the host),
  so the rest of the program is seen; `--strict` raises as the device would.
"""
from __future__ import annotations

import functools
import json
import os
import sys
import sysconfig
import threading
import time
import weakref
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from neuron_migrate.probe.messages import device_cannot

_F64 = {torch.float64, torch.complex128}
_STRIDED = torch.strided
_Tensor = torch.Tensor
_current_autograd_node = torch._C._current_autograd_node
_OpOverload = torch._ops.OpOverload
_grad_enabled = torch.is_grad_enabled
try:  # dynamo's per-code-object "never compile this frame nor what it calls" (C); None where this torch lacks it
    _eval_frame = torch._C._dynamo.eval_frame
    _DYNAMO_SKIP = (_eval_frame.set_code_exec_strategy,
                    _eval_frame._FrameExecStrategy(_eval_frame._FrameAction.SKIP, _eval_frame._FrameAction.SKIP))
except AttributeError:
    _DYNAMO_SKIP = None

_PROBE_DIR = os.path.dirname(os.path.abspath(__file__))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))

# torch-internal folders whose code on the stack means the op came from that namespace
_TORCH_NAMESPACES = (
    (os.path.join(_TORCH_DIR, "distributions") + os.sep, "torch.distributions"),
    (os.path.join(_TORCH_DIR, "_functorch") + os.sep, "torch.func"),
    (os.path.join(_TORCH_DIR, "func") + os.sep, "torch.func"),
    (os.path.join(_TORCH_DIR, "nested") + os.sep, "torch.nested"),
    (os.path.join(_TORCH_DIR, "sparse") + os.sep, "torch.sparse"),
)
# torch.compile's machinery inside torch/_functorch (aot_autograd and its runtime wrappers, which run every compiled
# graph): its frames on the stack are compile, not a use of torch.func
_FUNCTORCH_COMPILE = tuple(os.path.join(_TORCH_DIR, "_functorch", x) for x in (
    "_aot_autograd" + os.sep, "aot_autograd.py", "partitioners.py", "compilers.py", "compile_utils.py",
    "_activation_checkpointing" + os.sep, "fx_minifier.py"))
# the public torch.func transforms, wrapped while the recorder is installed
_FUNC_TRANSFORMS = ("vmap", "grad", "grad_and_value", "vjp", "jvp", "jacrev", "jacfwd", "hessian", "linearize",
                    "functional_call", "functionalize", "stack_module_state")


def _lib_prefixes() -> tuple[str, ...]:
    out = set()
    for key in ("purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            out.add(os.path.abspath(p) + os.sep)
    for p in sys.path:
        if p and ("site-packages" in p or "dist-packages" in p):
            out.add(os.path.abspath(p) + os.sep)
    return tuple(sorted(out))


def _stdlib_prefixes() -> tuple[str, ...]:
    out = set()
    for key in ("stdlib", "platstdlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            out.add(os.path.abspath(p) + os.sep)
    return tuple(sorted(out))


_LIB_PREFIXES = _lib_prefixes()
_STDLIB_PREFIXES = _stdlib_prefixes()
# everything that is not the user's own code (kept for compile_probe)
_EXCLUDED = tuple(sorted({_PROBE_DIR, _TORCH_DIR, *(p.rstrip(os.sep) for p in _LIB_PREFIXES + _STDLIB_PREFIXES)}))

_SKIP, _LIB, _USER, _STOP = 0, 1, 2, 3
# by id(code): hashing a code object hashes its constants, names and nested code (microseconds for a big
# forward), which a stack walk would pay at every frame of every op. The entry holds the code object, so the
# id stays that code's while the entry exists.
_code_info: dict[int, tuple[int, str | None, str, bool, Any]] = {}


class _StopCodes(set):
    """Code objects of the probe harness (the loop that calls the model): a stack walk stops there, nothing the
    user wrote lies further out. Adding one drops its cached classification (the walk reads only that)."""

    def add(self, code) -> None:
        super().add(code)
        _code_info.pop(id(code), None)

    def update(self, *iterables) -> None:
        for it in iterables:
            for code in it:
                self.add(code)


STOP_CODES: set = _StopCodes()


def _classify(code) -> tuple[int, str | None, str, bool, Any]:
    """(kind, torch namespace tag, absolute file, is an `__init__`, the code) for a code object, cached."""
    info = _code_info.get(id(code))
    if info is not None:
        return info
    info = _classify_file(code.co_filename)
    if code in STOP_CODES:
        info = (_STOP, None, info[2])
    info = (*info, getattr(code, "co_name", None) == "__init__", code)
    _code_info[id(code)] = info
    return info


def _classify_file(fn: str) -> tuple[int, str | None, str]:
    if fn.startswith("<"):
        info = (_SKIP, None, fn)
    else:
        a = os.path.abspath(fn)
        if a.startswith(_TORCH_DIR + os.sep):
            tag = None if a.startswith(_FUNCTORCH_COMPILE) else next((t for p, t in _TORCH_NAMESPACES if a.startswith(p)), None)
            info = (_SKIP, tag, a)
        elif a.startswith(_PROBE_DIR + os.sep):
            info = (_SKIP, None, a)
        elif a.startswith(_LIB_PREFIXES) or "site-packages" in a or "dist-packages" in a:
            info = (_LIB, None, a)
        elif a.startswith(_STDLIB_PREFIXES):
            info = (_SKIP, None, a)
        else:
            info = (_USER, None, a)
    return info


def _is_user_code(code) -> bool:
    return _classify(code)[0] == _USER


def _module_init(f) -> bool:
    if f.f_code.co_name != "__init__":
        return False
    try:
        return isinstance(f.f_locals.get("self"), torch.nn.Module)
    except Exception:  # noqa: BLE001
        return False


def locate(f, want_init: bool = False):
    """(user site, library site, torch namespace tag, inside an nn.Module.__init__) from frame `f` outward.

    The library site is the innermost frame outside torch, the stdlib and the probe (the user's own file when
    no installed library is in between); the user site is the innermost frame in the user's files."""
    lib = None
    tag = None
    init = False
    info = _code_info
    while f is not None:
        code = f.f_code
        kind, t, path, is_init, _ = info.get(id(code)) or _classify(code)
        if kind == _STOP:
            break
        if want_init and is_init and not init:
            init = _module_init(f)
        if kind == _SKIP:
            if t is not None and tag is None:
                tag = t
        elif kind == _USER:
            site = (path, f.f_lineno)
            return site, lib or site, tag, init
        elif lib is None:  # f_lineno scans the code's line table: read it only for the frames that are reported
            lib = (path, f.f_lineno)
        f = f.f_back
    return None, lib, tag, init


_GENERATOR_FLAGS = 0x20 | 0x80 | 0x100 | 0x200  # generator, coroutine, iterable coroutine, async generator
# The outer part of a stack walk, per suspended caller frame and instruction: while that frame waits at that
# instruction everything outside it is fixed, and holding the frame keeps its identity from being reused. Cleared at
# every flush and optimizer step (and when large), so the frames held here live for a fraction of a second.
_outer_cache: dict[tuple, tuple] = {}
_OUTER_CACHE_MAX = 4096


# The whole answer of `locate_fast(frame, want_init=True)` for the last forward op's calling frame and instruction:
# one Python call often dispatches several aten ops (linear: t + addmm; matmul: views + bmm; a composite loss), and
# while that frame waits at that instruction the answer is fixed. One entry only, so at most one frame is held.
# One tuple (frame, f_lasti, answer) in one slot, read and replaced whole: threads never see a torn entry.
_last_site: list = [None]


def clear_location_cache() -> None:
    _outer_cache.clear()
    _last_site[0] = None


# (id(code), instruction) -> ((file, line), code): f_lineno scans a table; the code checks the id is still its
_line_cache: dict[tuple, tuple[tuple[str, int], Any]] = {}


def locate_fast(f, want_init: bool = False):
    """`locate` for the per-op hot path: the same answer, walking only the frames up to the first one outside
    torch (the library site) and taking the rest of the walk from a cache kept per (caller frame, instruction)."""
    tag = None
    init = False
    info = _code_info
    while f is not None:
        code = f.f_code
        kind, t, path, is_init, _ = info.get(id(code)) or _classify(code)
        if is_init and want_init and not init:
            init = _module_init(f)
        if kind != _SKIP:
            if kind == _STOP:
                return None, None, tag, init
            break
        if t is not None and tag is None:
            tag = t
        f = f.f_back
    else:
        return None, None, tag, init
    lkey = (id(code), f.f_lasti)
    hit = _line_cache.get(lkey)
    if hit is not None and hit[1] is code:
        lib = hit[0]
    else:
        lib = (path, f.f_lineno)
        _line_cache[lkey] = (lib, code)
    if kind == _USER:
        return lib, lib, tag, init
    caller = f.f_back
    if caller is None:
        return None, lib, tag, init
    if caller.f_code.co_flags & _GENERATOR_FLAGS:  # a generator's outer frames change between resumptions
        user, _, t2, i2 = locate(caller, want_init=True)
    else:
        key = (caller, caller.f_lasti)
        hit = _outer_cache.get(key)
        if hit is None:
            if len(_outer_cache) >= _OUTER_CACHE_MAX:
                _outer_cache.clear()
            user, _, t2, i2 = locate(caller, want_init=True)
            _outer_cache[key] = (user, t2, i2)
        else:
            user, t2, i2 = hit
    return user, lib, tag or t2, init or (want_init and i2)


def user_site(depth: int = 1) -> tuple[str, int] | None:
    """(file, line) of the innermost frame in the user's files."""
    return locate(sys._getframe(depth))[0]


def site_of_traceback(tb) -> tuple[str, int] | None:
    """The innermost user frame of a traceback."""
    found = None
    while tb is not None:
        if _is_user_code(tb.tb_frame.f_code):
            found = (os.path.abspath(tb.tb_frame.f_code.co_filename), tb.tb_lineno)
        tb = tb.tb_next
    return found


def lib_site_of_traceback(tb) -> tuple[str, int] | None:
    """The innermost frame outside torch/stdlib/probe of a traceback (a library's line, or the user's)."""
    found = None
    while tb is not None:
        kind = _classify(tb.tb_frame.f_code)[0]
        if kind in (_LIB, _USER):
            found = (os.path.abspath(tb.tb_frame.f_code.co_filename), tb.tb_lineno)
        tb = tb.tb_next
    return found


def op_name(func) -> str:
    """`aten::atan2.default` for the OpOverload `aten.atan2.default`."""
    try:
        return f"{func.namespace}::{func._opname}.{func._overloadname}"
    except AttributeError:
        return str(func)


# per OpOverload, by id (OpOverload.__hash__ is Python code; the entry keeps the overload alive, so its id
# stays its own): (name, not compute (profiler markers), namespace its name implies, the overload)
_func_info: dict[int, tuple[str, bool, str | None, Any]] = {}


def _info_of(func) -> tuple[str, bool, str | None, Any]:
    info = _func_info.get(id(func))
    if info is None or info[3] is not func:
        name = op_name(func)
        info = _func_info[id(func)] = (name, name.startswith("profiler::"), _name_namespace(name), func)
    return info


_dtype_names: dict[Any, str] = {}


def _dtype_name(dt) -> str:
    s = _dtype_names.get(dt)
    if s is None:
        s = _dtype_names[dt] = str(dt).replace("torch.", "")
    return s


def _tensors(x, out: list) -> None:
    """Tensors in an op's arguments or results (one level of lists/tuples, dict values): cheaper than pytree."""
    if isinstance(x, _Tensor):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for y in x:
            if isinstance(y, _Tensor):
                out.append(y)
            elif isinstance(y, (list, tuple)):
                out.extend(z for z in y if isinstance(z, _Tensor))
    elif isinstance(x, dict):
        for y in x.values():
            _tensors(y, out)


def _layout_namespace(tensors: list) -> str | None:
    for t in tensors:
        try:
            if t.layout is not _STRIDED:
                return "torch.sparse"
            if t.is_nested:
                return "torch.nested"
        except Exception:  # noqa: BLE001
            continue
    return None


def _name_namespace(name: str) -> str | None:
    if "sparse" in name:
        return "torch.sparse"
    if "nested" in name:
        return "torch.nested"
    return None


def _signature(tensors: list) -> tuple[tuple, str | None]:
    """(dtypes, namespace implied by a sparse layout or a nested tensor) of an op's tensors, in one pass."""
    ns = None
    try:
        dts = tuple([t.dtype for t in tensors])
        for t in tensors:
            if t.layout is not _STRIDED:
                ns = "torch.sparse"
                break
            if t.is_nested:
                ns = "torch.nested"
                break
    except Exception:  # noqa: BLE001 - a tensor without these (rare subclasses): fall back to the slow checks
        dts = tuple(getattr(t, "dtype", None) for t in tensors)
        ns = _layout_namespace(tensors)
    return dts, ns


def _args_signature(args, kwargs) -> tuple[tuple, str | None]:
    """`_signature` of the tensors in an op's arguments (what `_tensors` collects, in its order), in one pass
    without the intermediate list: the per-op hot path. Anything unusual takes the plain two-step way."""
    dts: list = []
    ns = None
    try:
        for x in args:
            if isinstance(x, _Tensor):
                dts.append(x.dtype)
                if ns is None and (x.layout is not _STRIDED or x.is_nested):
                    ns = "torch.sparse" if x.layout is not _STRIDED else "torch.nested"
            elif isinstance(x, (list, tuple)):
                for y in x:
                    if isinstance(y, _Tensor):
                        dts.append(y.dtype)
                        if ns is None and (y.layout is not _STRIDED or y.is_nested):
                            ns = "torch.sparse" if y.layout is not _STRIDED else "torch.nested"
                    elif isinstance(y, (list, tuple)):
                        raise _SlowPath
            elif isinstance(x, dict):
                raise _SlowPath
    except Exception:  # noqa: BLE001 - nested containers, dicts, tensors without these attributes: the plain way
        ins: list = []
        _tensors(args, ins)
        if kwargs:
            _tensors(kwargs, ins)
        return _signature(ins)
    if kwargs:
        ins = []
        _tensors(kwargs, ins)
        if ins:  # a tensor keyword (rare): the plain way over all of them, in order
            ins = []
            _tensors(args, ins)
            _tensors(kwargs, ins)
            return _signature(ins)
    return tuple(dts), ns


class _SlowPath(Exception):
    pass


class ProbeStop(BaseException):
    """Raised in the user's process to end a run early (--max-steps, --time-limit). A BaseException so a
    user's `except Exception` does not swallow it."""


class Recorder:
    """Collects op records. Thread-safe enough for the autograd engine (one lock around updates)."""

    def __init__(self, on_tick: Callable[[], None] | None = None, tick_s: float = 0.5):
        self.records: dict[tuple, dict] = {}
        self.namespace_calls: dict[tuple, dict] = {}
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
        self.extra_modes: list = []  # dispatch modes entered below the recorder (e.g. float64 as float32)
        self._hooks: list = []
        self._modes: list = []
        self._patched: list[tuple[Any, str, Any]] = []
        # (the last op's outputs, their site): their autograd nodes are tagged when the next op is dispatched
        # (autograd sets them after the op returns; before the next op, which may rebase them in place)
        self._last: tuple | None = None
        # (overload, phase, sites, namespace, dtypes) -> its record: a repeated op only bumps a counter
        self._seen: dict[tuple, dict] = {}
        self._ops_since_tick = 0
        self.flush_cost = 0.0  # seconds the last on_tick took: ticks are spaced so flushing stays a small cost
        self.rescue = False  # run ops the device has no kernel for (sparse, nested) on the host instead of raising
        self.host_runs: dict[tuple, dict] = {}  # (op, sites) -> what ran on the host and why
        self.layout_tensors: dict[tuple, dict] = {}  # sparse/nested parameters and buffers, with where registered
        # sparse/nested tensors kept on the host for a device (rescue) -> the device they were meant for: ops on them
        # run on the host and their dense results go to that device
        # (by id, with a weak reference: a WeakKeyDictionary would compare tensors with ==)
        self.kept: dict[int, tuple] = {}

    # ------------------------------------------------------------------ recording
    def record(self, func, args, kwargs, out, raised: bool = False) -> None:
        # the hot path of the probe (every aten op): keep it free of calls that are not needed on a repeat
        last = self._last
        if last is not None:  # autograd set the last op's output nodes after it returned: tag them with its site
            self._last = None
            out0 = last[0]
            if type(out0) is _Tensor:
                g = None
                try:
                    g = out0.grad_fn
                    if g is not None:
                        md = g.metadata
                        if "nm_site" not in md:  # `_tag(g, site)` with its first level inline: mostly tagged already
                            site = md["nm_site"] = last[1]
                            for nxt, _ in g.next_functions:
                                if nxt is not None and type(nxt) is not _ACCUMULATE and "nm_site" not in nxt.metadata:
                                    _tag(nxt, site)
                except Exception:  # noqa: BLE001 - tagging is best effort
                    if g is not None:
                        _tag_children(g, last[1])
            else:
                self._tag_pending(last)
        info = _func_info.get(id(func))
        if info is None or info[3] is not func:
            info = _info_of(func)
        name, skip, name_ns, _ = info
        if skip:
            return  # record_function markers, not compute
        node = _current_autograd_node()
        attributed = False
        if node is not None:
            phase = "backward"
            try:
                site = node.metadata.get("nm_site")
            except Exception:  # noqa: BLE001 - some nodes have no metadata dict
                site = None
            if site is not None:
                attributed = True
                user, lib, tag = site
            else:  # from the dispatch mode's caller (None on a thread with no Python frames)
                user, lib, tag, _ = locate_fast(sys._getframe(1).f_back)
        else:
            phase = self.phase
            frame = sys._getframe(1).f_back  # the dispatch mode's caller
            cached = _last_site[0]
            if cached is not None and cached[0] is frame and cached[1] == frame.f_lasti:
                user, lib, tag, init = cached[2]
            else:
                loc = locate_fast(frame, want_init=True)
                user, lib, tag, init = loc
                if frame is not None and not frame.f_code.co_flags & _GENERATOR_FLAGS:
                    _last_site[0] = (frame, frame.f_lasti, loc)
            if init and phase == "forward":
                phase = "init"
            if out is not None and _grad_enabled():
                self._last = (out, (user, lib, tag))
        if self.paused:
            return
        in_sig, ns = _args_signature(args, kwargs)
        if out is None:
            out_sig = ()
        elif type(out) is _Tensor:
            try:
                out_sig = (out.dtype,)
                if ns is None and (out.layout is not _STRIDED or out.is_nested):
                    ns = "torch.sparse" if out.layout is not _STRIDED else "torch.nested"
            except Exception:  # noqa: BLE001
                out_sig, out_ns = _signature([out])
                ns = ns or out_ns
        elif isinstance(out, (list, tuple)):
            out_sig, out_ns = _args_signature(out, None)
            ns = ns or out_ns
        else:
            outs: list = []
            _tensors(out, outs)
            out_sig, out_ns = _signature(outs)
            ns = ns or out_ns
        ns = ns or name_ns or tag
        fast_key = (name, phase, user, lib, ns, in_sig, out_sig)
        rec = self._seen.get(fast_key)
        if rec is None:
            with self.lock:
                rec = self._seen.get(fast_key)
                if rec is None:
                    rec = self._new_record(name, phase, user, lib, ns, attributed, node, in_sig, out_sig)
                    self._seen[fast_key] = rec
        lock = self.lock  # the count of an existing record: acquire/release (cheaper than `with`; nothing between raises)
        lock.acquire()
        rec["count"] += 1
        if raised:
            rec["raised"] += 1
        lock.release()
        self._ops_since_tick += 1
        if self._ops_since_tick >= 32:  # the clock is read every 32 ops
            self._ops_since_tick = 0
            self._maybe_tick()

    def _new_record(self, name, phase, user, lib, ns, attributed, node, in_sig, out_sig) -> dict:
        """The record for (op, phase, sites, namespace), created on first sight; merges a new dtype signature."""
        key = (name, phase, user, lib, ns)
        rec = self.records.get(key)
        if rec is None:
            self._new_keys = True
            rec = self.records[key] = {
                "op": name,
                "phase": phase,
                "file": user[0] if user else None,
                "line": user[1] if user else None,
                "lib_file": lib[0] if lib and lib != user else None,
                "lib_line": lib[1] if lib and lib != user else None,
                "namespace": ns,
                "attributed": attributed,
                "grad_fn": node.name() if node is not None else None,
                "count": 0,
                "raised": 0,
                "in_dtypes": [],
                "out_dtypes": [],
                "float64": False,
                # float64 produced from no float64 input: a float64 source (torch.tensor(..., float64), .double())
                "float64_source": False,
            }
            new = True
        else:
            new = False
        for sig, field in ((in_sig, "in_dtypes"), (out_sig, "out_dtypes")):
            names = rec[field]
            for dt in sig:
                s = _dtype_name(dt)
                if s not in names:
                    names.append(s)
        f64_in = any(dt in _F64 for dt in in_sig)
        f64_out = any(dt in _F64 for dt in out_sig)
        if f64_in or f64_out:
            rec["float64"] = True
            if not f64_in:
                rec["float64_source"] = True
        if new and self.journal is not None:  # one line per new record: survives a hard crash
            try:
                self.journal.write(json.dumps(rec) + "\n")
                self.journal.flush()
            except Exception:  # noqa: BLE001
                pass
        return rec

    def _tag_pending(self, last: tuple) -> None:
        out, site = last
        try:
            if isinstance(out, _Tensor):
                g = out.grad_fn
                if g is not None and "nm_site" not in g.metadata:
                    _tag(g, site)
            elif isinstance(out, (tuple, list)):
                for t in out:
                    if isinstance(t, _Tensor):
                        g = t.grad_fn
                        if g is not None and "nm_site" not in g.metadata:
                            _tag(g, site)
        except Exception:  # noqa: BLE001 - tagging is best effort
            pass

    def flush_pending(self) -> None:
        last = self._last
        if last is not None:
            self._last = None
            self._tag_pending(last)

    def note_namespace(self, namespace: str, api: str, depth: int = 2) -> None:
        """A call of a namespace API seen by a wrapper (torch.func transforms). A call from torch's own code
        (torch.compile's aot_autograd runs functionalize and vmap) is torch's, not a use of the namespace."""
        caller = sys._getframe(depth)
        if caller.f_code.co_filename.startswith(_TORCH_DIR + os.sep):
            return
        user, lib, _, _ = locate(caller)
        key = (namespace, api, user, lib)
        with self.lock:
            r = self.namespace_calls.get(key)
            if r is None:
                r = self.namespace_calls[key] = {
                    "namespace": namespace, "api": api, "file": user[0] if user else None,
                    "line": user[1] if user else None, "lib_file": lib[0] if lib and lib != user else None,
                    "lib_line": lib[1] if lib and lib != user else None, "count": 0, "phase": self.phase}
                self._new_keys = True
            r["count"] += 1

    def _maybe_tick(self) -> None:
        now = time.monotonic()
        if self.deadline is not None and now > self.deadline and self.stop_reason is None:
            self.stop_reason = "time limit reached"
            raise ProbeStop(self.stop_reason)
        # flush often while new ops appear (the journal already keeps them through a hard crash), every tick_s
        # otherwise; never more often than 25x the time a flush takes (a big report must not slow the run)
        due = max(self.tick_s / 5 if self._new_keys else self.tick_s, 25 * self.flush_cost)
        if self.on_tick is not None and now - self._last_tick > due:
            self.tick()

    def tick(self) -> None:
        self._new_keys = False
        clear_location_cache()
        t0 = time.monotonic()
        try:
            self.on_tick()
        except Exception:  # noqa: BLE001 - never break the user's run for a flush
            pass
        self._last_tick = time.monotonic()
        self.flush_cost = self._last_tick - t0

    # ------------------------------------------------------------------ float64 state
    def _f64_entry(self, kind, name, t, site) -> dict:
        return {"kind": kind, "name": name, "dtype": _dtype_name(t.dtype), "shape": list(t.shape),
                "file": site[0] if site else None, "line": site[1] if site else None}

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
                    self.float64_tensors[(id(module), name)] = self._f64_entry(kind, f"{cls}.{name}", t, site)
                if t is not None and (t.layout is not _STRIDED or t.is_nested):
                    self._layout_entry(module, kind, name, f"{cls}.{name}", t)

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
                        self.float64_tensors[(id(mod), name)] = self._f64_entry(
                            kind, f"{mname}.{name}" if mname else name, t, site)
                    if t is not None and (t.layout is not _STRIDED or t.is_nested):
                        self._layout_entry(mod, kind, name, f"{mname}.{name}" if mname else name, t)
            self.seen_modules.add(id(mod))

    def _layout_entry(self, module, kind: str, name: str, full: str, t) -> None:
        site = self.registration_sites.get((id(module), name))
        self.layout_tensors[(id(module), name)] = {
            "kind": kind, "name": full, "namespace": "torch.nested" if t.is_nested else "torch.sparse",
            "layout": "nested" if t.is_nested else str(t.layout).replace("torch.", ""),
            "file": site[0] if site else None, "line": site[1] if site else None}

    # ------------------------------------------------------------------ ops the device cannot run
    def host_route(self, func, args, kwargs) -> tuple | None:
        """(op, namespace, reason, device) when `func` must run on the host before it is tried on the device: an op
        making or reading sparse/nested tensors (by its name) with device tensors or a device argument, or an op on
        a sparse/nested tensor kept on the host for a device. None: dispatch as usual."""
        name_ns = _info_of(func)[2]
        dev = None
        kept = None
        for x in pytree.tree_leaves((args, kwargs or {})):
            if isinstance(x, _Tensor):
                if dev is None and x.device.type not in ("cpu", "meta"):
                    dev = x.device
                if kept is None and self.kept:
                    k = self.kept.get(id(x))
                    if k is not None and k[0]() is x:
                        kept = k[1:]
            elif isinstance(x, torch.device) and dev is None and x.type not in ("cpu", "meta"):
                dev = x
        if name_ns is not None and dev is not None:
            return _info_of(func)[0], name_ns, "the device has no such tensors", dev
        if kept is not None:
            return _info_of(func)[0], kept[1], "on a tensor kept on the host", dev or kept[0]
        return None

    def run_on_host(self, func, args, kwargs, why: tuple):
        """Run `func` on the host for a device that has no kernel for its tensors (report, don't crash):
        device tensors and `device=` arguments go to the CPU, mutated device arguments get the host's result
        back, dense results go to the device and sparse/nested ones stay on the host (remembered in `kept`)."""
        dev: list = []

        def to_host(x):
            if isinstance(x, _Tensor) and x.device.type not in ("cpu", "meta"):
                dev.append(x.device)
                return x.cpu()
            if isinstance(x, torch.device) and x.type not in ("cpu", "meta"):
                dev.append(x)
                return torch.device("cpu")
            return x

        kwargs = kwargs or {}
        hargs, hkwargs = pytree.tree_map(to_host, (args, kwargs))
        out = func(*hargs, **hkwargs)
        leaves, hleaves = pytree.tree_leaves((args, kwargs)), pytree.tree_leaves((hargs, hkwargs))
        pairs = {id(h): o for o, h in zip(leaves, hleaves) if isinstance(o, _Tensor) and h is not o}
        schema = getattr(func, "_schema", None)
        if schema is not None and schema.is_mutable:  # the arguments the op writes get the host's result back
            for i, a in enumerate(schema.arguments):
                if a.alias_info is None or not a.alias_info.is_write:
                    continue
                o, h = (args[i], hargs[i]) if i < len(args) else (kwargs.get(a.name), hkwargs.get(a.name))
                for ot, ht in zip(pytree.tree_leaves(o), pytree.tree_leaves(h)):
                    if isinstance(ot, _Tensor) and ht is not ot and ot.layout is _STRIDED and not ot.is_nested:
                        ot.copy_(ht)
        op, ns, reason = why[0], why[1], why[2]
        target = why[3] if len(why) > 3 and why[3] is not None else (dev[0] if dev else None)

        def back(t):
            if not isinstance(t, _Tensor):
                return t
            if id(t) in pairs:
                return pairs[id(t)]
            if t.device.type == "cpu" and (t.layout is not _STRIDED or t.is_nested):
                if target is not None and id(t) not in self.kept:
                    self.kept[id(t)] = (weakref.ref(t), target, "torch.nested" if t.is_nested else "torch.sparse")
                    weakref.finalize(t, self.kept.pop, id(t), None)
                return t
            if target is not None and t.device.type == "cpu":
                return t.to(target)
            return t

        out = pytree.tree_map(back, out)
        user, lib, _, _ = locate(sys._getframe(1).f_back)  # (the autograd engine's thread has a shallow stack)
        if user is None and lib is None:  # a backward op: the forward line that created its autograd node
            node = _current_autograd_node()
            try:
                site = node.metadata.get("nm_site") if node is not None else None
            except Exception:  # noqa: BLE001
                site = None
            if site:
                user, lib = site[0], site[1]
        key = (op_name(func), user, lib)
        with self.lock:
            r = self.host_runs.get(key)
            if r is None:
                r = self.host_runs[key] = {
                    "op": op_name(func), "failed_op": op, "namespace": ns, "why": reason,
                    "file": user[0] if user else None, "line": user[1] if user else None,
                    "lib_file": lib[0] if lib and lib != user else None,
                    "lib_line": lib[1] if lib and lib != user else None, "count": 0}
            r["count"] += 1
        return out

    def host_run_list(self) -> list[dict]:
        with self.lock:
            return [dict(r) for r in self.host_runs.values()]

    def layout_state(self) -> list[dict]:
        return list(self.layout_tensors.values())

    # ------------------------------------------------------------------ install / remove
    def _wrap_transforms(self) -> None:
        import torch.func as tfunc

        rec = self
        for owner, prefix in ((tfunc, "torch.func"), (torch, "torch")):
            for name in _FUNC_TRANSFORMS:
                orig = getattr(owner, name, None)
                if orig is None or getattr(orig, "_nm_wrapped", False):
                    continue

                def make(orig=orig, api=f"{prefix}.{name}"):
                    @functools.wraps(orig)
                    def wrapper(*a, **k):
                        rec.note_namespace("torch.func", api, depth=2)
                        return orig(*a, **k)

                    wrapper._nm_wrapped = True
                    return wrapper

                self._patched.append((owner, name, orig))
                setattr(owner, name, make())

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
            clear_location_cache()
            rec.optimizer_steps += 1
            if rec.on_tick is not None and time.monotonic() - rec._last_tick > max(rec.tick_s, 25 * rec.flush_cost):
                rec.tick()
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
        self._wrap_transforms()
        # dispatch modes: the last entered runs first, so the recorder sees each op before the extra modes
        self._modes = [*self.extra_modes, _OpMode(self)]
        for m in self._modes:
            m.__enter__()

    def uninstall(self) -> None:
        self.flush_pending()
        clear_location_cache()
        for m in reversed(self._modes):
            try:
                m.__exit__(None, None, None)
            except Exception:  # noqa: BLE001 - mode stack already unwound by an exception
                pass
        self._modes = []
        for h in self._hooks:
            h.remove()
        self._hooks = []
        for owner, name, orig in reversed(self._patched):
            setattr(owner, name, orig)
        self._patched = []

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

    def namespaces(self) -> list[dict]:
        with self.lock:
            return [dict(r) for r in self.namespace_calls.values()]

    def float64_state(self) -> list[dict]:
        return list(self.float64_tensors.values())


class _OpMode(TorchDispatchMode):
    def __init__(self, rec: Recorder):
        super().__init__()
        self.rec = rec

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps __torch_dispatch__ in torch._dynamo.disable (several Python calls per op); marking the
        # handler's code object as skipped, recursively, once (below the class) keeps dynamo out at no cost per op
        return _DYNAMO_SKIP is None

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # off during dynamo's tracing, on while the compiled graphs run: a script's torch.compile still compiles
        # (dynamo skips compiling under a mode without this) and the recorder sees the ops the graphs execute
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # an OpOverload's __call__ is `self._op(*args, **kwargs)`: calling `_op` saves a Python frame per op
        call = func._op if type(func) is _OpOverload else func
        rec = self.rec
        if rec.rescue and (rec.kept or _info_of(func)[2] is not None):
            route = rec.host_route(func, args, kwargs)
            if route is not None:
                try:
                    out = rec.run_on_host(func, args, kwargs, route)
                except ProbeStop:
                    raise
                except BaseException:
                    rec.record(func, args, kwargs, None, raised=True)
                    raise
                rec.record(func, args, kwargs, out)
                return out
        try:
            out = call(*args, **kwargs) if kwargs else call(*args)
        except ProbeStop:
            raise
        except BaseException as exc:
            why = device_cannot(str(exc)) if rec.rescue and isinstance(exc, (RuntimeError, NotImplementedError)) \
                else None
            if why is None:
                rec.record(func, args, kwargs, None, raised=True)
                raise
            try:
                out = rec.run_on_host(func, args, kwargs, (why[0], why[1], f"no {why[2]} kernel"))
            except BaseException:
                rec.record(func, args, kwargs, None, raised=True)
                raise exc from None
        self.rec.record(func, args, kwargs, out)
        return out


if _DYNAMO_SKIP is not None:
    _DYNAMO_SKIP[0](_OpMode.__torch_dispatch__.__code__, _DYNAMO_SKIP[1])


def _tag(node, site) -> None:
    """Tag `node` and the untagged nodes behind it: a composite call (cross_entropy, scaled_dot_product_attention)
    creates several nodes but returns only the last; the earlier ones are untagged and were made by the same call.
    Tagged nodes (earlier calls) and leaves stop the walk, so each node is visited once."""
    stack = [node]
    while stack:
        n = stack.pop()
        try:
            md = n.metadata
        except Exception:  # noqa: BLE001
            continue
        if "nm_site" in md:
            continue
        md["nm_site"] = site
        for nxt, _ in n.next_functions:
            if nxt is not None and not isinstance(nxt, _ACCUMULATE):
                stack.append(nxt)


def _tag_children(g, site) -> None:
    """The slow way of the inline tagging in `Recorder.record` (a node whose metadata raised on the way)."""
    try:
        md = g.metadata
        if "nm_site" not in md:
            md["nm_site"] = site
        for nxt, _ in g.next_functions:
            if nxt is not None and not isinstance(nxt, _ACCUMULATE):
                _tag(nxt, site)
    except Exception:  # noqa: BLE001 - tagging is best effort
        pass


try:
    _ACCUMULATE = type(torch.ones(1, requires_grad=True).expand(1).grad_fn.next_functions[0][0])
except Exception:  # noqa: BLE001
    _ACCUMULATE = ()


__all__ = ["Recorder", "ProbeStop", "locate", "locate_fast", "clear_location_cache", "user_site", "site_of_traceback", "lib_site_of_traceback", "op_name",
           "pytree"]
