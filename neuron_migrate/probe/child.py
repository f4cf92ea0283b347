"""The probe's child process: `python -m neuron_migrate.probe.child <json spec | spec file>`.

Runs the user's model or script under the recorder and keeps rewriting `<results dir>/rank<RANK>.json`
(atomically), so a crash, `os._exit` or a kill by the parent leaves what was gathered so far. The parent
(`runner.py`) classifies the records against the compat table; this module only measures.
"""
from __future__ import annotations

import copy
import importlib
import importlib.util
import json
import os
import runpy
import signal
import statistics
import sys
import threading
import time
import traceback
from typing import Any

RESULTS_VERSION = 1
_TB_LIMIT = 12000


class Writer:
    """Holds the result document and rewrites it atomically."""

    def __init__(self, path: str, state: dict):
        self.path = path
        self.state = state
        self.recorder = None
        self.lock = threading.RLock()  # reentrant: the SIGTERM handler may run while the main thread flushes

    def flush(self, **updates: Any) -> None:
        with self.lock:
            self.state.update(updates)
            doc = dict(self.state)
            if self.recorder is not None:
                doc["ops"] = self.recorder.ops()
                doc["float64_tensors"] = self.recorder.float64_state()
                doc["optimizer_steps"] = self.recorder.optimizer_steps
                doc["namespace_calls"] = self.recorder.namespaces()
                doc["host_runs"] = self.recorder.host_run_list()
                doc["layout_tensors"] = self.recorder.layout_state()
            tmp = f"{self.path}.tmp{os.getpid()}"
            text = json.dumps(doc, default=str)  # dumps: json.dump streams through the slow pure-Python encoder
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.replace(tmp, self.path)


def _error_record(exc: BaseException, phase: str) -> dict:
    from neuron_migrate.probe.recorder import site_of_traceback

    site = site_of_traceback(exc.__traceback__)
    from neuron_migrate.probe.recorder import lib_site_of_traceback

    lib = lib_site_of_traceback(exc.__traceback__)
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    if len(tb) > _TB_LIMIT:
        tb = tb[:2000] + "\n...\n" + tb[-(_TB_LIMIT - 2000):]
    from neuron_migrate.probe.messages import translate

    message = str(exc)
    line = translate(message)  # a dispatcher dump about sparse/nested tensors: one line, not 5 kB of dispatch keys
    extra = {}
    if line is not None:
        extra["dispatcher_message"] = message.split("\n", 1)[0][:600]
        message = line
        tb = tb.split("NotImplementedError: Could not run", 1)[0] + f"{type(exc).__name__}: {line}\n"
    return {
        **extra,
        "type": type(exc).__name__,
        "message": message[:4000],
        "phase": phase,
        "file": site[0] if site else None,
        "line": site[1] if site else None,
        "lib_file": lib[0] if lib and lib != site else None,
        "lib_line": lib[1] if lib and lib != site else None,
        "traceback": tb,
    }


# ---------------------------------------------------------------------------------------------- targets


def _load_callable(ref: str, cwd: str):
    """`pkg.mod:fn` or `path/to/file.py:fn`."""
    mod_part, _, attr = ref.rpartition(":")
    if not mod_part or not attr:
        raise ValueError(f"expected module:function or file.py:function, got {ref!r}")
    if mod_part.endswith(".py") or os.sep in mod_part:
        path = os.path.abspath(os.path.join(cwd, mod_part))
        name = "_nm_probe_target_" + os.path.splitext(os.path.basename(path))[0]
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        sys.path.insert(0, os.path.dirname(path))
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(mod_part)
    obj = module
    for piece in attr.split("."):
        obj = getattr(obj, piece)
    return obj


def _split_inputs(inputs) -> tuple[tuple, dict]:
    import torch

    if inputs is None:
        return (), {}
    if isinstance(inputs, torch.Tensor):
        return (inputs,), {}
    if isinstance(inputs, dict):
        return (), dict(inputs)
    if isinstance(inputs, (tuple, list)):
        if len(inputs) == 2 and isinstance(inputs[0], (tuple, list)) and isinstance(inputs[1], dict):
            return tuple(inputs[0]), dict(inputs[1])
        return tuple(inputs), {}
    return (inputs,), {}


def _to_device(tree, device):
    import torch
    import torch.utils._pytree as pytree

    return pytree.tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, tree)


def _sync(device: str) -> None:
    import torch

    if device == "cpu":
        return
    try:
        if device == "cuda":
            torch.cuda.synchronize()
        elif hasattr(torch, "neuron") and hasattr(torch.neuron, "synchronize"):
            torch.neuron.synchronize()
        else:
            torch.accelerator.synchronize()
    except Exception:  # noqa: BLE001
        pass


# ---------------------------------------------------------------------------------------------- device


def neuron_available() -> tuple[bool, Any, str]:
    """(available, torch_neuronx module or None, why). Imports torch_neuronx only here."""
    try:
        import torch_neuronx  # type: ignore[import-not-found]
    except Exception as exc:  # noqa: BLE001
        return False, None, f"torch_neuronx not importable ({type(exc).__name__}: {exc})"
    import torch

    try:
        acc = torch.accelerator.current_accelerator()
        if acc is not None and acc.type == "neuron":
            return True, torch_neuronx, "torch.accelerator reports neuron"
    except Exception:  # noqa: BLE001
        pass
    mod = getattr(torch, "neuron", None)
    try:
        if mod is not None and hasattr(mod, "is_available") and mod.is_available():
            return True, torch_neuronx, "torch.neuron.is_available()"
        if mod is not None and hasattr(mod, "device_count") and mod.device_count() > 0:
            return True, torch_neuronx, "torch.neuron.device_count() > 0"
    except Exception as exc:  # noqa: BLE001
        return False, torch_neuronx, f"neuron device check failed: {exc}"
    return False, torch_neuronx, "torch_neuronx imported but no neuron device is available"


CPU_TRACE_NOTE = "CPU dispatch trace: ops as the CPU dispatches them, not the neuron device's dispatch path"


def _emulate(spec: dict, why_not_real: str | None) -> tuple[str, Any, str, str]:
    from neuron_migrate.probe import emulator
    from neuron_migrate.table import load_table

    table = None
    if spec.get("table"):
        try:
            table = load_table(spec["table"])
        except Exception:  # noqa: BLE001 - the parent reports a bad table; the device then has no native kernels
            table = None
    emulator.install(table, keep_going=not spec.get("strict"), library=spec.get("emulator_library"),
                     log=lambda m: sys.stderr.write(f"neuron-migrate probe: {m}\n"))
    why = "emulated neuron device (PrivateUse1 on the host; kernel set from the compat table)"
    if why_not_real:
        why += f"; {why_not_real}"
    return "neuron", emulator, why, "emulated"


def resolve_device(requested: str, spec: dict | None = None) -> tuple[str, Any, str, str]:
    """(torch device type, op tracker module or None, reason, kind: neuron|emulated|cpu|cuda)."""
    import torch

    spec = spec or {}
    if requested in ("auto", "neuron"):
        ok, tnx, why = neuron_available()
        if ok:
            return "neuron", tnx, why, "neuron"
        if requested == "neuron":
            raise RuntimeError(f"--device neuron: {why}")
        requested, not_real = "emulate", why
    else:
        not_real = None
    if requested == "emulate":
        from neuron_migrate.probe.emulator import EmulatorUnavailable

        try:
            return _emulate(spec, not_real)
        except EmulatorUnavailable as exc:
            sys.stderr.write(f"neuron-migrate probe: {exc}; using the CPU trace instead\n")
            return "cpu", None, f"{CPU_TRACE_NOTE} (emulated device unavailable: {exc})", "cpu"
    if requested == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda: torch.cuda.is_available() is False")
        return "cuda", None, "requested", "cuda"
    if spec.get("device_note"):  # the parent could not build the emulated device
        return "cpu", None, f"{CPU_TRACE_NOTE} (emulated device unavailable: {spec['device_note']})", "cpu"
    return "cpu", None, f"{CPU_TRACE_NOTE} (--device cpu)", "cpu"


def _measure_start(tnx) -> None:
    if tnx is not None:
        tnx.clear_op_tracking()


def _measure_end(tnx, writer: Writer) -> None:
    """The device's own op tracking: torch_neuronx on a Trn host, the same API on the emulated device."""
    if tnx is None:
        return
    try:
        m = {
            "fallback_ops": sorted(str(o) for o in tnx.get_fallback_ops()),
            "executed_ops": sorted(str(o) for o in tnx.get_executed_ops()),
            "module_file": getattr(tnx, "__file__", None),
            "emulated": bool(getattr(tnx, "EMULATED", False)),
        }
        if m["emulated"]:
            m["unsupported_ops"] = sorted(str(o) for o in tnx.get_unsupported_ops())
            m["fallback_counts"] = tnx.op_counts("fallback")
            m["unsupported_counts"] = tnx.op_counts("unsupported")
            m["upcast_ops"] = list(tnx.get_upcast_ops())
            m["device"] = tnx.summary()
        writer.state["measured"] = m
    except Exception as exc:  # noqa: BLE001
        writer.state["measured"] = {"error": f"{type(exc).__name__}: {exc}"}


# ---------------------------------------------------------------------------------------------- runs


def _run_script(spec: dict, writer: Writer, rec) -> None:
    from neuron_migrate.probe.recorder import ProbeStop

    path = os.path.abspath(os.path.join(spec["cwd"], spec["target"]["path"]))
    sys.argv = [path] + list(spec.get("args") or [])
    sys.path.insert(0, os.path.dirname(path))
    step_marks: list[float] = []
    t0 = time.perf_counter()
    from torch.optim import optimizer as om

    h = om.register_optimizer_step_post_hook(lambda *a: step_marks.append(time.perf_counter()))
    writer.flush(status="running", phase="script")
    try:
        with rec:
            runpy.run_path(path, run_name="__main__")
        writer.state["status"] = "ok"
    except ProbeStop as stop:
        writer.state.update(status="ok", stopped=str(stop))
    except SystemExit as exc:
        code = exc.code
        if code in (None, 0):
            writer.state["status"] = "ok"
        else:
            writer.state.update(status="error", error={
                "type": "SystemExit", "message": f"script exited with sys.exit({code!r})", "phase": "script",
                **_site_dict(exc), "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-_TB_LIMIT:]})
    finally:
        h.remove()
    times = [b - a for a, b in zip([t0] + step_marks[:-1], step_marks)]
    writer.state["timing"] = _timing(times)


class _NotEmulated:
    def __init__(self, kind: str):
        self.kind = kind

    def report(self) -> dict:
        return {"explain_error": f"--compile on a script is reported on the emulated device only (this run: {self.kind})"}


def _script_compile_log(spec: dict, kind: str):
    """--compile on a script: the emulated `neuron` compile backend records what the script's own
    torch.compile(..., backend="neuron") calls capture (None when not asked, or not on the emulated device)."""
    if not spec.get("compile"):
        return None
    if kind != "emulated":
        return _NotEmulated(kind)
    from neuron_migrate.probe.emulator import compile as compile_log

    compile_log.reset_log()
    return compile_log


def _site_dict(exc: BaseException) -> dict:
    from neuron_migrate.probe.recorder import site_of_traceback

    s = site_of_traceback(exc.__traceback__)
    return {"file": s[0] if s else None, "line": s[1] if s else None}


def _timing(times: list[float]) -> dict:
    if not times:
        return {"steps": 0}
    d: dict[str, Any] = {"steps": len(times), "first_step_s": times[0], "step_times_s": times[:50]}
    if len(times) > 1:
        d["steady_step_s"] = statistics.median(times[1:])
    return d


def _make_optimizer(name: str, params):
    import torch

    params = [p for p in params if p.requires_grad]
    if not params:
        return None
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-3)
    return torch.optim.AdamW(params, lr=1e-3)


MISSING_INPUTS = "{ref} returned a model without example inputs; return (model, inputs) or pass --inputs module:fn"


def call_factory(spec: dict) -> tuple[Any, Any]:
    """The target factory's model and example inputs (its own, or --inputs'); inputs None when neither gives any.
    Shared by the probe and the parity run."""
    import torch

    factory = _load_callable(spec["target"]["ref"], spec["cwd"])
    made = factory()
    if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], torch.nn.Module):
        model, inputs = made
    else:
        model, inputs = made, None
    if spec.get("inputs"):
        inputs = _load_callable(spec["inputs"], spec["cwd"])()
    return model, inputs


def _load_factory(spec: dict, writer: Writer, rec):
    """Call the factory (and --inputs) under the recorder (phase 'init': float64 creation sites)."""
    rec.phase = "init"
    writer.flush(status="running", phase="init")
    with rec:
        model, inputs = call_factory(spec)
    if inputs is None:
        raise ValueError(MISSING_INPUTS.format(ref=spec["target"]["ref"]))
    rec.scan_model(model)
    return model, _split_inputs(inputs)


def _run_factory(spec: dict, writer: Writer, rec, device: str, tnx) -> tuple[Any, tuple, dict] | None:
    import torch

    from neuron_migrate.probe.recorder import ProbeStop
    from neuron_migrate.probe.steps import loss_of, set_mode

    model, (args, kwargs) = _load_factory(spec, writer, rec)
    dev = torch.device(device)
    model_cpu = copy.deepcopy(model) if (spec.get("numerics") or spec.get("compile")) else None
    with rec:  # under the recorder: a tensor the device cannot hold (sparse, nested) is reported, kept on the host
        model = model.to(dev) if hasattr(model, "to") else model
        args, kwargs = _to_device((args, kwargs), dev)
    train = spec.get("mode", "train") == "train"
    opt = _make_optimizer(spec.get("optimizer", "adamw"), model.parameters()) if train and hasattr(model, "parameters") else None
    steps = max(1, int(spec.get("steps") or 1))
    times: list[float] = []
    _measure_start(tnx)
    try:
        with rec:
            for step in range(steps):
                writer.flush(status="running", phase=f"step {step + 1}/{steps}")
                t0 = time.perf_counter()
                rec.phase = "forward"
                set_mode(model, train)
                if train:
                    out = model(*args, **kwargs)
                    rec.paused += 1
                    try:
                        loss = loss_of(out)
                    finally:
                        rec.paused -= 1
                    if loss is None:
                        raise ValueError("the model output has no floating tensor that requires grad; use --mode forward")
                    rec.phase = "backward"  # the gradient seed (ones_like) runs before the first autograd node
                    loss.backward()
                    rec.phase = "forward"
                    if opt is not None:
                        opt.step()  # phase 'optimizer' via the global step hooks
                        opt.zero_grad(set_to_none=True)
                else:
                    with torch.no_grad():
                        model(*args, **kwargs)
                _sync(device)
                times.append(time.perf_counter() - t0)
        writer.state["status"] = "ok"
    except ProbeStop as stop:
        writer.state.update(status="ok", stopped=str(stop))
    finally:
        writer.state["timing"] = _timing(times)
        writer.state["steps_run"] = len(times)
        _measure_end(tnx, writer)
    return model_cpu, args, kwargs


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        sys.stderr.write("usage: python -m neuron_migrate.probe.child <json spec | spec file>\n")
        return 2
    raw = argv[0]
    spec = json.loads(raw if raw.lstrip().startswith("{") else open(raw, encoding="utf-8").read())
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    os.makedirs(spec["results_dir"], exist_ok=True)
    writer = Writer(
        os.path.join(spec["results_dir"], f"rank{rank}.json"),
        {"version": RESULTS_VERSION, "rank": rank, "world_size": world, "pid": os.getpid(), "status": "starting",
         "target": spec["target"], "mode": spec.get("mode", "train"), "started": time.time()},
    )
    writer.flush()

    real_exit = os._exit

    # A kill from the parent (timeout) or an os._exit in user code: write what we have first.
    def _on_term(signum, frame):  # noqa: ARG001
        try:
            writer.flush(status="killed", killed_by=signal.Signals(signum).name)
        finally:
            real_exit(128 + signum)

    signal.signal(signal.SIGTERM, _on_term)

    def _exit_hook(code=0):
        from neuron_migrate.probe.recorder import user_site

        site = user_site(2)
        try:
            writer.flush(status="error", error={
                "type": "os._exit", "message": f"user code called os._exit({code})", "phase": writer.state.get("phase"),
                "file": site[0] if site else None, "line": site[1] if site else None, "traceback": ""})
        finally:
            real_exit(code)

    os._exit = _exit_hook  # type: ignore[assignment]

    try:
        import torch  # noqa: F401
    except ImportError as exc:
        writer.flush(status="error", error={"type": "ImportError", "message": f"torch is not importable: {exc}",
                                            "phase": "setup", "file": None, "line": None, "traceback": ""})
        return 2

    from neuron_migrate.probe.recorder import STOP_CODES, Recorder

    STOP_CODES.update({_run_factory.__code__, _load_factory.__code__})
    rec = Recorder(on_tick=lambda: writer.flush(), tick_s=0.5)
    rec.rescue = not spec.get("strict")  # report, don't crash: ops the device has no kernel for run on the host
    writer.recorder = rec
    rec.journal = open(os.path.join(spec["results_dir"], f"rank{rank}.ops.jsonl"), "a", encoding="utf-8")
    if spec.get("max_steps"):
        rec.max_steps = int(spec["max_steps"])
    if spec.get("time_limit"):
        rec.deadline = time.monotonic() + float(spec["time_limit"])
    import torch

    torch.manual_seed(int(spec.get("seed", 0)))
    try:
        device, tnx, why, kind = resolve_device(spec.get("device", "auto"), spec)
    except Exception as exc:  # noqa: BLE001
        writer.flush(status="error", error=_error_record(exc, "setup"))
        return 2
    writer.state.update(device=device, device_kind=kind, device_reason=why, torch_version=torch.__version__)
    if spec.get("emulate_precision"):
        from neuron_migrate.probe.precision import EmulatedPrecision, parse_kinds

        kinds = parse_kinds(spec["emulate_precision"])
        rec.extra_modes.append(EmulatedPrecision(kinds))
        writer.state["emulate_precision"] = list(kinds)
    if tnx is not None:
        writer.state["torch_neuronx_version"] = getattr(tnx, "__version__", None)

    rc = 0
    phase = "run"
    try:
        if spec["target"]["kind"] == "script":
            compile_log = _script_compile_log(spec, kind)
            _measure_start(tnx)
            try:
                _run_script(spec, writer, rec)
            finally:
                _measure_end(tnx, writer)
                if compile_log is not None:
                    writer.state["compile"] = compile_log.report()
                elif kind == "emulated":  # without --compile: graphs the backend refused (they ran eagerly)
                    from neuron_migrate.probe.emulator import compile as emulated_compile

                    writer.state["compile_refusals"] = emulated_compile.report()["refusals"]
        else:
            model_cpu, args, kwargs = _run_factory(spec, writer, rec, device, tnx)
            cpu_args = _to_device((args, kwargs), torch.device("cpu"))
            if spec.get("compile") and writer.state.get("status") == "ok":
                phase = "compile"
                writer.flush(phase="compile")
                from neuron_migrate.probe.compile_probe import probe_compile

                writer.state["compile"] = probe_compile(
                    copy.deepcopy(model_cpu), cpu_args[0], cpu_args[1],
                    train=spec.get("mode", "train") == "train", shapes=spec.get("shapes") or [])
            if spec.get("numerics") and writer.state.get("status") == "ok":
                phase = "numerics"
                writer.flush(phase="numerics")
                from neuron_migrate.probe.numerics import probe_numerics

                writer.state["numerics"] = probe_numerics(
                    model_cpu, cpu_args[0], cpu_args[1], device=device, seed=int(spec.get("seed", 0)),
                    train=spec.get("mode", "train") == "train")
    except BaseException as exc:  # noqa: BLE001 - report everything, including KeyboardInterrupt
        writer.state.update(status="error", error=_error_record(exc, writer.state.get("phase") or phase))
        rc = 1
    finally:
        try:
            rec.uninstall()
        except Exception:  # noqa: BLE001
            pass
        writer.flush(phase="done", finished=time.time())
    return rc


_REAL_EXIT = os._exit  # main() replaces os._exit with a hook that reports user code calling it
_EXIT_CODE: list = []


def _exit_without_finalizing() -> None:
    """The child's last exit handler (registered before anything of the run, so it runs after every other one, and
    after the interpreter joined the run's threads): end the process without Python's finalization. Autograd's
    device thread may still be releasing a finished backward pass's state, which takes the GIL; once finalization
    has begun that makes libstdc++ abort the process (SIGABRT), and a run that wrote its results would be reported
    as a crash (seen on the emulated device, about a third of runs on a loaded machine)."""
    if not _EXIT_CODE:
        return  # main() did not return: exit as Python does
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - a closed stream must not change the exit code
        pass
    _REAL_EXIT(_EXIT_CODE[0])


if __name__ == "__main__":
    import atexit

    atexit.register(_exit_without_finalizing)
    code = main()
    _EXIT_CODE.append(code)
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)
