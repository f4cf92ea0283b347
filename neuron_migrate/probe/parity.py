"""Numerical parity, in the probe's child process: `python -m neuron_migrate.probe.parity SPEC.json`.

`--save-reference REF`: run the model in this environment and save what a later run is compared with: the inputs,
the seed, the initial weights, the outputs, the loss per step, every parameter's gradient norm per step, and a
summary of every module's output (shape, dtype, mean, std, absmax and an evenly spaced sample), in execution order.

`--compare REF`: run the model again (migrated code, another device, emulated device precision) on the saved
inputs and weights, apply the gates, and when a gate fails say where the divergence starts: the first module whose
output leaves tolerance and, under `--emulate-precision`, the op and line inside it that introduces it, confirmed
by replaying the module with that op in reference precision.

The reference file is a `torch.save` archive of tensors, numbers and strings only, read back with
`weights_only=True` (no pickled code runs when a reference is loaded).
"""
from __future__ import annotations

import copy
import inspect
import json
import math
import os
import statistics
import sys
import time
import traceback
from typing import Any

import torch
import torch.utils._pytree as pytree

from neuron_migrate.probe.precision import EmulatedPrecision, ShadowRun, parse_kinds, relative_error

REFERENCE_VERSION = 1
SAMPLE = 4096  # values kept per activation; a tiny model's activations are kept whole

DEFAULT_GATES = {
    "cosine": 0.99,  # output cosine similarity, at least
    "output_rtol": 0.05,  # output relative error ||a - r|| / ||r||, at most
    "grad_rtol": 0.10,  # per-parameter gradient norm, relative, for gradients that matter
    "grad_floor": 1e-3,  # ... gradients below this fraction of the largest are compared absolutely
    "loss_rtol": 0.05,  # per step |l - l_ref| / |l_ref|
    "act_rtol": 0.05,  # a module's output, for localisation
}


class ParityError(Exception):
    """A reference or run that cannot be compared; the message names what is wrong."""


# ---------------------------------------------------------------------------------------------- capture


def _sample(t: torch.Tensor) -> torch.Tensor:
    flat = t.detach().reshape(-1)
    if flat.numel() > SAMPLE:
        idx = torch.linspace(0, flat.numel() - 1, SAMPLE, device=flat.device).round().long()
        flat = flat[idx]
    flat = flat.to("cpu")
    if flat.is_complex():
        flat = torch.view_as_real(flat).reshape(-1)
    return flat.to(torch.float64)


def summarize(t: torch.Tensor) -> dict[str, Any]:
    x = t.detach().to("cpu")
    xf = (torch.view_as_real(x) if x.is_complex() else x).to(torch.float64)
    finite = xf[torch.isfinite(xf)] if xf.numel() else xf
    return {
        "shape": list(x.shape),
        "dtype": str(x.dtype).replace("torch.", ""),
        "mean": float(finite.mean()) if finite.numel() else 0.0,
        "std": float(finite.std()) if finite.numel() > 1 else 0.0,
        "absmax": float(finite.abs().max()) if finite.numel() else 0.0,
        "nonfinite": int(xf.numel() - finite.numel()),
        "sample": _sample(x),
    }


def _first_tensor(out) -> torch.Tensor | None:
    leaves = pytree.tree_leaves(out.to_tuple() if hasattr(out, "to_tuple") else out)
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor) and (leaf.is_floating_point() or leaf.is_complex()):
            return leaf
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            return leaf
    return None


def _output_leaves(out) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(out.to_tuple() if hasattr(out, "to_tuple") else out)
            if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())]


def module_site(module) -> dict[str, Any]:
    cls = type(module)
    mod = cls.__module__.removeprefix("_nm_probe_target_")  # a factory loaded from a file path
    info: dict[str, Any] = {"class": f"{mod}.{cls.__qualname__}"}
    try:
        info["file"] = os.path.abspath(inspect.getsourcefile(cls.forward) or "")
        info["line"] = inspect.getsourcelines(cls.forward)[1]
    except (TypeError, OSError):
        pass
    return info


def record_activation(names: dict, order: list, summaries: dict, module, args, out) -> str | None:
    """A module's first output (and input) summary, in completion order; the module's name, or None."""
    name = names.get(id(module))
    if name is None or name in summaries:
        return None
    t = _first_tensor(out)
    if t is None:
        return None
    order.append(name)
    summaries[name] = summarize(t)
    x = _first_tensor(args)
    if x is not None:
        summaries[name]["input"] = summarize(x)
    return name


class ActivationRecorder:
    """Forward hooks on every submodule: each module's first output, in completion order (children first)."""

    def __init__(self, model: torch.nn.Module):
        self.names = {id(m): (n or "<model>") for n, m in model.named_modules()}
        self.modules = {id(m): m for m in model.modules()}
        self.order: list[str] = []
        self.summaries: dict[str, dict] = {}
        self.active = False
        self._handles = []
        for m in model.modules():
            self._handles.append(m.register_forward_hook(self._hook))

    def _hook(self, module, args, out):
        if self.active:
            record_activation(self.names, self.order, self.summaries, module, args, out)

    def remove(self):
        for h in self._handles:
            h.remove()


def _make_optimizer(name: str, model):
    from neuron_migrate.probe.child import _make_optimizer as make

    return make(name, model.parameters())


def _compile(model, spec):
    backend = spec.get("compile_backend") or ("neuron" if "neuron" in torch._dynamo.list_backends() else "aot_eager")
    return torch.compile(model, backend=backend), backend


def run_model(model, args, kwargs, spec: dict, precision: tuple[str, ...] = ()) -> dict[str, Any]:
    """Train (or run forward) `steps` steps; the activations, outputs, loss and gradient norms of every step."""
    from neuron_migrate.probe.steps import loss_of

    train = (spec.get("mode") or "train") == "train"
    steps = max(1, int(spec.get("steps") or 3))
    acts = ActivationRecorder(model)
    emulation = EmulatedPrecision(precision) if precision else None
    if emulation is not None:
        args, kwargs = emulation.prepare_inputs((args, kwargs))
    opt = _make_optimizer(spec.get("optimizer") or "adamw", model) if train else None
    runner, backend = (_compile(model, spec) if spec.get("compile") else (model, None))
    losses: list[float] = []
    grad_norms: dict[str, list[float]] = {n: [] for n, p in model.named_parameters() if p.requires_grad}
    outputs: list[torch.Tensor] = []
    times: list[float] = []
    torch.manual_seed(int(spec.get("seed", 0)))
    for step in range(steps):
        acts.active = step == 0
        t0 = time.perf_counter()
        ctx = emulation if emulation is not None else _Null()
        if train:
            model.train()
            with ctx:
                out = runner(*args, **kwargs)
                loss = loss_of(out)
                if loss is None:
                    raise ParityError("the model output has no floating tensor that requires grad; use --mode forward")
                loss.backward()
            losses.append(float(loss.detach().to("cpu").float()))
            for n, p in model.named_parameters():
                if n in grad_norms:
                    g = p.grad
                    grad_norms[n].append(float(torch.linalg.vector_norm(g.detach().to("cpu").double())) if g is not None else 0.0)
            if opt is not None:
                opt.step()
                opt.zero_grad(set_to_none=True)
        else:
            model.eval()
            with torch.no_grad(), ctx:
                out = runner(*args, **kwargs)
        _sync(out)
        times.append(time.perf_counter() - t0)
        if step == 0:
            outputs = [t.detach().to("cpu").clone() for t in _output_leaves(out)]
    acts.active = False
    acts.remove()
    timing: dict[str, Any] = {"first_step_s": times[0], "steps": len(times), "compiled": bool(spec.get("compile"))}
    if backend:
        timing["compile_backend"] = backend
    if len(times) > 1:
        timing["steady_step_s"] = statistics.median(times[1:])
    return {"outputs": outputs, "losses": losses, "grad_norms": grad_norms, "order": acts.order,
            "activations": acts.summaries, "timing": timing,
            "modules": {acts.names[i]: module_site(m) for i, m in acts.modules.items() if acts.names[i] in acts.summaries}}


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _sync(out) -> None:
    t = _first_tensor(out)
    if t is None or t.device.type == "cpu":
        return
    try:
        torch.accelerator.synchronize()
    except Exception:  # noqa: BLE001 - timing only
        pass


class _ScriptDone(BaseException):
    """Ends a script after --steps optimizer steps (a BaseException: a script's `except Exception` lets it through)."""


class ScriptCapture:
    """What `run_model` records, for a script: global module and optimizer hooks find the model (the first module
    called from outside any other module), its first step's activations and outputs, the loss each `backward()`
    is called on, and the gradient norms of the first optimizer's parameters at each step."""

    def __init__(self, steps: int, initial_state: dict | None = None):
        self.steps = steps
        self.initial_state = initial_state  # the reference's weights, loaded into the model at its first call
        self.root = None
        self.names: dict[int, str] = {}
        self.param_names: dict[int, str] = {}
        self.depth = 0
        self.step = 0
        self.order: list[str] = []
        self.summaries: dict[str, dict] = {}
        self.modules: dict[str, dict] = {}
        self.outputs: list[torch.Tensor] = []
        self.losses: list[float] = []
        self.grad_norms: dict[str, list[float]] = {}
        self.optimizer = None
        self.marks: list[float] = []
        self.root_inputs = None
        self.root_state: dict | None = None
        self.root_copy = None
        self.notes: list[str] = []
        self._loss_seen = False

    def _pre(self, module, args):
        if self.depth == 0 and self.root is None:
            self._adopt(module, args)
        self.depth += 1

    def _adopt(self, module, args):
        self.root = module
        self.names = {id(m): (n or "<model>") for n, m in module.named_modules()}
        self.param_names = {id(p): n for n, p in module.named_parameters()}
        if self.initial_state is not None:
            res = module.load_state_dict({k: v.to(next(iter(module.state_dict().values())).device)
                                          for k, v in self.initial_state.items()}, strict=False)
            if res.missing_keys or res.unexpected_keys:
                self.notes.append(f"weights: {len(res.missing_keys)} missing, {len(res.unexpected_keys)} unexpected keys")
        self.root_state = {k: v.detach().to("cpu").clone() for k, v in module.state_dict().items()}
        self.root_inputs = (_cpu_tree(tuple(args)), {})
        try:
            self.root_copy = copy.deepcopy(module).to("cpu")
        except Exception as exc:  # noqa: BLE001 - only op-level localisation needs it
            self.notes.append(f"the model could not be copied to the CPU for localisation ({type(exc).__name__})")
        self.t0 = time.perf_counter()

    def _post(self, module, args, out):
        self.depth = max(0, self.depth - 1)
        if self.step != 0:
            return
        name = record_activation(self.names, self.order, self.summaries, module, args, out)
        if name is None:
            return
        self.modules[name] = module_site(module)
        if module is self.root:
            self.outputs = [o.detach().to("cpu").clone() for o in _output_leaves(out)]

    def _backward(self, tensor):
        if not self._loss_seen and tensor.numel() == 1:
            self._loss_seen = True
            self.losses.append(float(tensor.detach().to("cpu").float()))

    def _opt_pre(self, opt, args, kwargs):
        if self.optimizer is None:
            self.optimizer = opt
        if opt is not self.optimizer:
            return
        for group in opt.param_groups:
            for prm in group["params"]:
                name = self.param_names.get(id(prm))
                if name is None:
                    continue
                g = prm.grad
                self.grad_norms.setdefault(name, []).append(
                    float(torch.linalg.vector_norm(g.detach().to("cpu").double())) if g is not None else 0.0)

    def _opt_post(self, opt, args, kwargs):
        if opt is not self.optimizer:
            return
        self.marks.append(time.perf_counter())
        self.step += 1
        self._loss_seen = False
        if self.step >= self.steps:
            raise _ScriptDone(f"stopped after {self.steps} optimizer steps")

    def run(self, path: str, argv: list[str], precision: tuple[str, ...]) -> dict[str, Any]:
        from torch.nn.modules import module as mm
        from torch.optim import optimizer as om

        hooks = [mm.register_module_forward_pre_hook(self._pre),
                 mm.register_module_forward_hook(self._post, always_call=True),
                 om.register_optimizer_step_pre_hook(self._opt_pre),
                 om.register_optimizer_step_post_hook(self._opt_post)]
        real_backward = torch.Tensor.backward
        capture = self

        def backward(self, *a, **k):
            capture._backward(self)
            return real_backward(self, *a, **k)

        torch.Tensor.backward = backward
        old_argv, old_path = sys.argv, list(sys.path)
        sys.argv = [path] + list(argv)
        sys.path.insert(0, os.path.dirname(path))
        emulation = EmulatedPrecision(precision) if precision else _Null()
        try:
            with emulation:
                import runpy

                runpy.run_path(path, run_name="__main__")
        except _ScriptDone:
            pass
        except SystemExit as exc:
            if exc.code not in (None, 0):
                raise ParityError(f"the script exited with sys.exit({exc.code!r})") from None
        finally:
            torch.Tensor.backward = real_backward
            for h in hooks:
                h.remove()
            sys.argv, sys.path[:] = old_argv, old_path
        if self.root is None:
            raise ParityError("the script never called a torch.nn.Module: nothing to compare")
        starts = [getattr(self, "t0", 0.0)] + self.marks[:-1]
        times = [b - a for a, b in zip(starts, self.marks)]
        timing: dict[str, Any] = {"first_step_s": times[0] if times else 0.0, "steps": len(times), "compiled": False}
        if len(times) > 1:
            timing["steady_step_s"] = statistics.median(times[1:])
        return {"outputs": self.outputs, "losses": self.losses, "grad_norms": self.grad_norms, "order": self.order,
                "activations": self.summaries, "modules": self.modules, "timing": timing}


def run_script(spec: dict, precision: tuple[str, ...] = (), initial_state: dict | None = None):
    path = os.path.abspath(os.path.join(spec["cwd"], spec["target"]["path"]))
    torch.manual_seed(int(spec.get("seed", 0)))
    cap = ScriptCapture(max(1, int(spec.get("steps") or 3)), initial_state)
    return cap, cap.run(path, spec.get("args") or [], precision)


# ---------------------------------------------------------------------------------------------- reference file


def save_reference(path: str, *, spec: dict, inputs, state_dict, result: dict, device: str) -> None:
    doc = {
        "version": REFERENCE_VERSION,
        "meta": {"torch": str(torch.__version__), "device": device, "target": json.dumps(spec["target"]),
                 "mode": spec.get("mode") or "train", "steps": max(1, int(spec.get("steps") or 3)),
                 "optimizer": spec.get("optimizer") or "adamw", "seed": int(spec.get("seed", 0)),
                 "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
        "inputs": inputs,
        "state_dict": {k: v.detach().to("cpu").clone() for k, v in state_dict.items()},
        "outputs": result["outputs"],
        "losses": result["losses"],
        "grad_norms": result["grad_norms"],
        "order": result["order"],
        "activations": result["activations"],
        "modules": result["modules"],
        "timing": result["timing"],
    }
    tmp = f"{path}.tmp{os.getpid()}"
    torch.save(doc, tmp)
    os.replace(tmp, path)


def load_reference(path: str) -> dict:
    try:
        doc = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ParityError(f"{path}: no such reference file") from None
    except Exception as exc:  # noqa: BLE001
        raise ParityError(f"{path}: not a neuron-migrate reference ({type(exc).__name__}: {str(exc)[:200]})") from None
    if not isinstance(doc, dict) or doc.get("version") != REFERENCE_VERSION:
        raise ParityError(f"{path}: not a neuron-migrate reference (version {doc.get('version') if isinstance(doc, dict) else '?'})")
    return doc


# ---------------------------------------------------------------------------------------------- gates


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a = a.detach().to("cpu").reshape(-1).to(torch.float64)
    b = b.detach().to("cpu").reshape(-1).to(torch.float64)
    if a.shape != b.shape:
        return float("nan")
    na, nb = float(torch.linalg.vector_norm(a)), float(torch.linalg.vector_norm(b))
    if na == 0.0 and nb == 0.0:
        return 1.0
    if na == 0.0 or nb == 0.0 or not (math.isfinite(na) and math.isfinite(nb)):
        return 0.0
    return float(torch.dot(a, b)) / (na * nb)


def _gate(name: str, ok: bool, value: float, limit: float, detail: str) -> dict[str, Any]:
    return {"gate": name, "ok": bool(ok), "value": value, "limit": limit, "detail": detail}


def compare(ref: dict, run: dict, gates: dict) -> dict[str, Any]:
    """Gate results (outputs, loss curve, gradients) and the per-module divergence, in execution order."""
    checks: list[dict] = []
    if len(ref["outputs"]) != len(run["outputs"]):
        checks.append(_gate("outputs", False, float(len(run["outputs"])), float(len(ref["outputs"])),
                            f"{len(run['outputs'])} floating outputs, the reference has {len(ref['outputs'])}"))
    for i, (r, a) in enumerate(zip(ref["outputs"], run["outputs"])):
        if list(r.shape) != list(a.shape):
            checks.append(_gate(f"output[{i}] shape", False, 0.0, 0.0, f"{list(a.shape)} vs reference {list(r.shape)}"))
            continue
        c = cosine(a, r)
        checks.append(_gate(f"output[{i}] cosine", c >= gates["cosine"], c, gates["cosine"], "at least"))
        e = relative_error(a, r)
        checks.append(_gate(f"output[{i}] relative error", e <= gates["output_rtol"], e, gates["output_rtol"], "at most"))
    if ref["losses"] and run["losses"]:
        rels = [abs(la - lr) / max(abs(lr), 1e-12) if math.isfinite(la) else float("inf")
                for lr, la in zip(ref["losses"], run["losses"])]
        worst = max(rels)
        at = rels.index(worst) + 1
        checks.append(_gate("loss curve", worst <= gates["loss_rtol"], worst, gates["loss_rtol"],
                            f"worst relative difference at step {at} of {len(rels)}"))
    if ref["grad_norms"]:
        scale = max((v[0] for v in ref["grad_norms"].values() if v), default=0.0)
        floor = gates["grad_floor"] * scale
        worst_name, worst = None, 0.0
        for name, series in ref["grad_norms"].items():
            other = run["grad_norms"].get(name)
            if not series or not other:
                continue
            nr, na = series[0], other[0]
            if nr >= floor and nr > 0:
                score = abs(na - nr) / nr
            else:  # a gradient that hardly matters: compared against the floor, not against itself
                score = abs(na - nr) / floor if floor > 0 else (0.0 if na == nr else float("inf"))
            if not math.isfinite(na):
                score = float("inf")
            if score > worst or worst_name is None:
                worst_name, worst = name, max(score, worst)
        missing = sorted(set(ref["grad_norms"]) - set(run["grad_norms"]))
        detail = f"worst: {worst_name}" + (f"; {len(missing)} parameters missing: {', '.join(missing[:3])}" if missing else "")
        checks.append(_gate("gradients", worst <= gates["grad_rtol"] and not missing, worst, gates["grad_rtol"], detail))
    modules = []
    for name in ref["order"]:
        r = ref["activations"].get(name)
        a = run["activations"].get(name)
        if r is None or a is None:
            continue
        if r["shape"] != a["shape"]:
            err, cos = float("inf"), 0.0
        else:
            err, cos = relative_error(a["sample"], r["sample"]), cosine(a["sample"], r["sample"])
        ri, ai = r.get("input"), a.get("input")
        input_ok = ri is None or ai is None or (ri["shape"] == ai["shape"]
                                                and relative_error(ai["sample"], ri["sample"]) <= gates["act_rtol"])
        modules.append({"module": name, "rel_err": err, "cosine": cos, "ok": err <= gates["act_rtol"],
                        "input_ok": input_ok,
                        "ref": {k: r[k] for k in ("shape", "dtype", "mean", "std", "absmax")},
                        "run": {k: a[k] for k in ("shape", "dtype", "mean", "std", "absmax")},
                        **{k: v for k, v in run["modules"].get(name, ref["modules"].get(name, {})).items()}})
    first = next((m for m in modules if not m["ok"]), None)
    return {"checks": checks, "ok": all(c["ok"] for c in checks), "modules": modules,
            "first_divergent_module": first["module"] if first else None,
            "origin_module": _origin(first, {m["module"]: m for m in modules}) if first else None}


def _parent(name: str) -> str | None:
    if name == "<model>":
        return None
    return name.rpartition(".")[0] or "<model>"


def _origin(first: dict, by_name: dict) -> str:
    """Where the divergence is introduced. The first module whose output leaves tolerance introduced it when
    its input was still within tolerance; otherwise its input was already off, so the code that made that input
    (the enclosing module's own forward, between its children) introduced it."""
    name = first["module"]
    while not by_name.get(name, {}).get("input_ok", True):
        parent = _parent(name)
        if parent is None:
            break
        name = parent
    return name


def parse_gates(value: str | None) -> dict:
    gates = dict(DEFAULT_GATES)
    for item in (value or "").split(","):
        if not item.strip():
            continue
        key, sep, num = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in gates:
            raise ParityError(f"bad gate {item!r}: use NAME=VALUE with NAME one of {', '.join(k.replace('_', '-') for k in gates)}")
        try:
            gates[key] = float(num)
        except ValueError:
            raise ParityError(f"bad gate value {item!r}") from None
    return gates


# ---------------------------------------------------------------------------------------------- localisation


def _module_by_name(model, name: str):
    return model if name == "<model>" else model.get_submodule(name)


def _capture_module_inputs(model, module, args, kwargs, mode=None):
    """Run the model forward once (no grad) and keep `module`'s first inputs; under an emulation `mode`, also which
    of them autocast holds as bf16."""
    seen: dict[str, Any] = {}

    def pre(mod, m_args, m_kwargs):
        if "args" in seen:
            return
        leaves = [t for t in pytree.tree_leaves((m_args, m_kwargs)) if isinstance(t, torch.Tensor)]
        seen["bf16"] = [mode is not None and mode.tags.has(t) for t in leaves]
        seen["args"], seen["kwargs"] = pytree.tree_map(
            lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, (m_args, m_kwargs))

    h = module.register_forward_pre_hook(pre, with_kwargs=True)
    try:
        with torch.no_grad(), (mode if mode is not None else _Null()):
            if mode is not None:
                args, kwargs = mode.prepare_inputs((args, kwargs))
            model(*args, **kwargs)
    finally:
        h.remove()
    return seen.get("args", ()), seen.get("kwargs", {}), seen.get("bf16", [])


def localise_ops(model, module_name: str, args, kwargs, kinds: tuple[str, ...], tol: float, max_sites: int = 4) -> dict:
    """Inside one module: which ops introduce the difference under `kinds`, confirmed by a replay with those ops
    in reference precision. The module is replayed alone on its reference inputs, held the way the device would
    hold them (int64 wrapped to int32; bf16 where autocast made them bf16), so that only its own ops count."""
    module = _module_by_name(model, module_name)
    m_args, m_kwargs, _ = _capture_module_inputs(model, module, args, kwargs)
    _, _, bf16_flags = _capture_module_inputs(model, module, args, kwargs, mode=EmulatedPrecision(kinds))
    with torch.no_grad():
        ref_out = _first_tensor(module(*m_args, **m_kwargs))

    def device_inputs(mode):
        """The reference inputs as the device holds them, registered with `mode` (and their shadows)."""
        flags = iter(bf16_flags)
        pairs = []

        def held(t):
            if not isinstance(t, torch.Tensor):
                return t
            x = t
            if next(flags, False) and t.dtype == torch.float32:
                x = t.to(torch.bfloat16).to(torch.float32)
                emu = mode.emu if isinstance(mode, ShadowRun) else mode
                emu.tags.add(x)
            pairs.append((x, t))
            return x

        a, k = pytree.tree_map(held, (m_args, m_kwargs))
        emu = mode.emu if isinstance(mode, ShadowRun) else mode
        a, k = emu.prepare_inputs((a, k))
        if isinstance(mode, ShadowRun):
            for x, t in pairs:
                mode.remember(x, t)
        return a, k

    def emulated(exempt):
        mode = EmulatedPrecision(kinds, exempt=exempt)
        a, k = device_inputs(mode)
        with torch.no_grad(), mode:
            return _first_tensor(module(*a, **k))

    before = relative_error(emulated(set()), ref_out)
    culprits: list[dict] = []
    exempt: set = set()
    after = before
    for _ in range(max_sites):
        if after <= tol:
            break
        shadow = ShadowRun(kinds, exempt=exempt)
        a, k = device_inputs(shadow)
        with torch.no_grad(), shadow:
            module(*a, **k)
        hit = next((r for r in shadow.records if r["out_err"] > tol and r["in_err"] <= tol
                    and (r["name"], r["site"]) not in exempt), None)
        if hit is None:
            break
        # The op where the difference shows. When running it in reference precision is not enough (a cancellation
        # reveals what an earlier op rounded away), the ops that made its inputs join it, nearest first.
        group = [hit]
        exempt.add((hit["name"], hit["site"]))
        after = relative_error(emulated(exempt), ref_out)
        frontier = [hit]
        for _depth in range(3):
            if after <= tol or not frontier:
                break
            producers = [shadow.records[i] for r in frontier for i in r["inputs_from"]
                         if shadow.records[i]["lossy"] and (shadow.records[i]["name"], shadow.records[i]["site"]) not in exempt]
            for r in producers:
                exempt.add((r["name"], r["site"]))
                group.append(r)
            after = relative_error(emulated(exempt), ref_out)
            frontier = producers
        culprits.append({"op": hit["op"], "file": hit["site"][0] if hit["site"] else None,
                         "line": hit["site"][1] if hit["site"] else None, "input_error": hit["in_err"],
                         "output_error": hit["out_err"], "module_error_after": after,
                         "with": [{"op": r["op"], "file": r["site"][0] if r["site"] else None,
                                   "line": r["site"][1] if r["site"] else None} for r in group[1:]]})
    return {"module": module_name, "precision": list(kinds), "module_error": before, "culprits": culprits,
            "confirmed": bool(culprits) and after <= tol, "module_error_with_culprits_exempt": after}


# ---------------------------------------------------------------------------------------------- main


def _load_target(spec: dict):
    from neuron_migrate.probe.child import MISSING_INPUTS, _split_inputs, call_factory

    model, inputs = call_factory(spec)
    if inputs is None:
        raise ParityError(MISSING_INPUTS.format(ref=spec["target"]["ref"]))
    return model, _split_inputs(inputs)


def _to(tree, device):
    return pytree.tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, tree)


def _cpu_tree(tree):
    return pytree.tree_map(lambda t: t.detach().to("cpu").clone() if isinstance(t, torch.Tensor) else t, tree)


def run(spec: dict) -> dict[str, Any]:
    from neuron_migrate.probe.child import resolve_device

    seed = int(spec.get("seed", 0))
    torch.manual_seed(seed)
    requested = spec.get("device") or "auto"
    if spec.get("save_reference") and requested == "auto":
        # a reference records the environment the model runs in today, not an emulation of the device
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    device, _tnx, why, kind = resolve_device(requested, spec)
    kinds = parse_kinds(spec.get("emulate_precision"))
    gates = parse_gates(spec.get("gates"))
    if spec["target"]["kind"] == "script":
        return _run_script_parity(spec, kinds, gates, {"device": device, "device_kind": kind, "device_reason": why,
                                                       "torch": str(torch.__version__), "precision": list(kinds),
                                                       "gates": gates})
    model, (args, kwargs) = _load_target(spec)
    initial = copy.deepcopy(model.state_dict())
    result: dict[str, Any] = {"device": device, "device_kind": kind, "device_reason": why, "torch": str(torch.__version__),
                              "precision": list(kinds), "gates": gates}
    ref = None
    if spec.get("compare"):
        ref = load_reference(spec["compare"])
        meta = ref["meta"]
        for key in ("mode", "steps", "optimizer"):
            if spec.get(key) is not None and str(spec.get(key)) != str(meta[key]):
                result.setdefault("notes", []).append(
                    f"--{key} {spec.get(key)} differs from the reference's {meta[key]}; using the reference's")
            spec[key] = meta[key]
        missing, unexpected = [], []
        try:
            res = model.load_state_dict(ref["state_dict"], strict=False)
            missing, unexpected = list(res.missing_keys), list(res.unexpected_keys)
        except RuntimeError as exc:
            raise ParityError(f"the reference's weights do not fit this model: {str(exc)[:300]}") from None
        if missing or unexpected:
            result.setdefault("notes", []).append(
                f"weights: {len(missing)} missing, {len(unexpected)} unexpected keys (seeded initialisation used for those)")
        initial = copy.deepcopy(model.state_dict())
        args, kwargs = ref["inputs"]
        args, kwargs = tuple(args), dict(kwargs)
    cpu_inputs = _cpu_tree((args, kwargs))
    dev = torch.device(device)
    model = model.to(dev)
    d_args, d_kwargs = _to((args, kwargs), dev)
    if spec.get("save_reference"):
        if kinds:
            raise ParityError("--save-reference records this environment as it is; drop --emulate-precision")
        torch.manual_seed(seed)
        out = run_model(model, d_args, d_kwargs, spec)
        save_reference(spec["save_reference"], spec=spec, inputs=cpu_inputs, state_dict=initial, result=out,
                       device=device)
        result.update(saved=spec["save_reference"], timing=out["timing"], steps=len(out["losses"]) or 1,
                      losses=out["losses"], modules=len(out["order"]))
        return result
    if ref is None:  # emulated precision against this environment, in one process
        ref_model = copy.deepcopy(model)
        torch.manual_seed(seed)
        ref_run = run_model(ref_model, d_args, d_kwargs, spec)
        ref = {"outputs": ref_run["outputs"], "losses": ref_run["losses"], "grad_norms": ref_run["grad_norms"],
               "order": ref_run["order"], "activations": ref_run["activations"], "modules": ref_run["modules"],
               "timing": ref_run["timing"], "meta": {"device": "the same device in reference precision"}}
        model.load_state_dict(initial)
    torch.manual_seed(seed)
    fresh = copy.deepcopy(model)
    out = run_model(model, d_args, d_kwargs, spec, precision=kinds)
    cmp = compare(ref, out, gates)
    result.update(cmp)
    result["timing"] = {"reference": ref.get("timing"), "run": out["timing"]}
    result["losses"] = {"reference": ref["losses"], "run": out["losses"]}
    result["reference_device"] = ref["meta"].get("device")
    if not cmp["ok"] and cmp["origin_module"] and kinds:
        fresh.load_state_dict(initial)
        result["localisation"] = localise_ops(fresh.to("cpu"), cmp["origin_module"], *cpu_inputs, kinds,
                                              gates["act_rtol"])
    return result


def _run_script_parity(spec: dict, kinds: tuple[str, ...], gates: dict, result: dict) -> dict[str, Any]:
    """A script: its own data, device and loop; the probe finds the model, stops after --steps optimizer steps,
    and feeds the reference's weights into the model at its first call."""
    ref = None
    if spec.get("compare"):
        ref = load_reference(spec["compare"])
        if json.loads(ref["meta"]["target"]).get("kind") != "script":
            raise ParityError("the reference was saved from a factory target; compare it with a factory target")
        if spec.get("steps") is not None and int(spec["steps"]) != int(ref["meta"]["steps"]):
            result.setdefault("notes", []).append(f"--steps {spec['steps']} differs from the reference's "
                                                  f"{ref['meta']['steps']}; using the reference's")
        spec["steps"] = ref["meta"]["steps"]
    if spec.get("save_reference"):
        if kinds:
            raise ParityError("--save-reference records this environment as it is; drop --emulate-precision")
        cap, out = run_script(spec)
        save_reference(spec["save_reference"], spec=spec, inputs=cap.root_inputs, state_dict=cap.root_state,
                       result=out, device=result["device"])
        result.update(saved=spec["save_reference"], timing=out["timing"], steps=len(out["losses"]) or 1,
                      losses=out["losses"], modules=len(out["order"]), notes=cap.notes)
        return result
    if ref is None:  # --parity: the script in reference precision, then emulated, with the same weights
        ref_cap, ref = run_script(spec)
        ref = dict(ref, meta={"device": "the same device in reference precision"})
        initial = ref_cap.root_state
    else:
        initial = ref["state_dict"]
    cap, out = run_script(spec, kinds, initial_state=initial)
    cmp = compare(ref, out, gates)
    r_in = (ref["activations"].get("<model>") or {}).get("input")
    a_in = (out["activations"].get("<model>") or {}).get("input")
    if r_in is not None and a_in is not None:
        same = r_in["shape"] == a_in["shape"] and relative_error(a_in["sample"], r_in["sample"]) <= 1e-6
        cmp["checks"].insert(0, _gate("inputs", same, 0.0 if same else 1.0, 0.0,
                                      "the model saw the reference's first batch" if same else
                                      "the script fed the model other data than the reference run (seed, data order "
                                      "or preprocessing): the other gates compare different inputs"))
        cmp["ok"] = all(c["ok"] for c in cmp["checks"])
    result.update(cmp)
    result["notes"] = result.get("notes", []) + cap.notes
    result["timing"] = {"reference": ref.get("timing"), "run": out["timing"]}
    result["losses"] = {"reference": ref["losses"], "run": out["losses"]}
    result["reference_device"] = ref["meta"].get("device")
    if not cmp["ok"] and cmp["origin_module"] and kinds and cap.root_copy is not None:
        model = cap.root_copy
        model.load_state_dict(initial, strict=False)
        args, kwargs = cap.root_inputs
        result["localisation"] = localise_ops(model, cmp["origin_module"], args, kwargs, kinds, gates["act_rtol"])
    return result


def _jsonable(obj):
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items() if k != "sample"}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(open(argv[0], encoding="utf-8").read())
    out_path = spec["result_file"]
    try:
        doc = {"status": "ok", **run(spec)}
        rc = 0
    except ParityError as exc:
        doc, rc = {"status": "error", "error": {"type": "ParityError", "message": str(exc)}}, 2
    except BaseException as exc:  # noqa: BLE001 - the parent reports it
        from neuron_migrate.probe.recorder import site_of_traceback

        site = site_of_traceback(exc.__traceback__)
        doc = {"status": "error", "error": {
            "type": type(exc).__name__, "message": str(exc)[:4000], "file": site[0] if site else None,
            "line": site[1] if site else None,
            "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-8000:]}}
        rc = 2
    tmp = f"{out_path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(_jsonable(doc), fh)
    os.replace(tmp, out_path)
    return rc


if __name__ == "__main__":
    sys.exit(main())
