"""`torch.compile(backend="neuron")` on the emulated device (EMULATED: not TorchNeuron's compiler).

A rewritten script says `torch.compile(model, backend="neuron")`; off-Trainium dynamo knows no such backend and the
script would stop there. `patch_torch_compile()` (called by `emulator.install()`, so only in the probe's child
and only when TorchNeuron is absent) wraps `torch.compile` so that the first call naming backend "neuron"
registers an emulated backend of that name. Registering at install time would import torch._dynamo (seconds)
in every probe run; the wrapper costs nothing until a script asks for the backend.

The backend is a compile backend for readiness purposes: dynamo captures the graph exactly as it would for
TorchNeuron (same graph breaks, same guards and recompiles, `dynamic=False` unless the script asks otherwise),
then `aot_autograd` lowers each graph to aten ops and the graphs run eagerly on the emulated device. It records
what the probe reports for a script under `--compile`: how many graphs were compiled, each graph break with its
reason and location (the user's line and the innermost library line), and the aten ops of every forward and
backward graph with their lines. Device compile times and what neuronx-cc accepts are not emulated.
"""
from __future__ import annotations

import functools
from typing import Any

BACKEND_NAME = "neuron"

_log: dict[str, Any] = {"graphs": [], "dynamo_graphs": 0, "calls": [], "registered": False, "refusals": [],
                        "strict": False}


def reset_log() -> None:
    _log.update(graphs=[], dynamo_graphs=0, calls=[], refusals=[])
    try:
        from torch._dynamo import output_graph

        output_graph.graph_break_reasons.clear()
    except Exception:  # noqa: BLE001 - dynamo not imported yet: nothing to clear
        pass


def _capture(kind: str, dynamo_index: int):
    from torch._functorch.aot_autograd import make_boxed_func

    from neuron_migrate.probe.compile_probe import graph_ops

    def compiler(gm, example_inputs):  # noqa: ARG001
        ops = graph_ops(gm)
        _log["graphs"].append({"index": len(_log["graphs"]), "kind": kind, "dynamo_graph": dynamo_index,
                               "ops": ops})
        return make_boxed_func(gm.forward)

    return compiler


def neuron_backend(gm, example_inputs, **options):  # noqa: ARG001 - TorchNeuron's options are not emulated
    """The emulated backend: aot_autograd with capturing compilers that run the graphs unchanged."""
    from torch._dynamo.backends.common import aot_autograd

    index = _log["dynamo_graphs"]
    _log["dynamo_graphs"] += 1
    try:
        return aot_autograd(fw_compiler=_capture("forward", index), bw_compiler=_capture("backward", index))(
            gm, example_inputs)
    except Exception as exc:  # noqa: BLE001 - a graph the backend refuses
        if _log.get("strict"):
            raise
        # report, don't crash: the refusal is recorded with the graph's first user line and the graph runs eagerly
        site = _graph_site(gm)
        _log["refusals"].append({"graph": index, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}",
                                 **site})
        return gm.forward


def _graph_site(gm) -> dict:
    """The user's line of a dynamo graph's first node that has one (its stack trace)."""
    import re

    for node in gm.graph.nodes:
        trace = node.meta.get("stack_trace") or ""
        frames = re.findall(r'File "([^"]+)", line (\d+)', trace)
        if frames:
            f, line = frames[-1]
            return {"file": f, "line": int(line)}
    return {"file": None, "line": None}


def _register() -> None:
    if _log["registered"]:
        return
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

    if BACKEND_NAME not in _COMPILER_FNS:
        register_backend(neuron_backend, name=BACKEND_NAME)
    _log["registered"] = True


def _call_site() -> dict:
    import sys

    from neuron_migrate.probe.recorder import locate

    user, lib, _, _ = locate(sys._getframe(2))
    return {"file": user[0] if user else None, "line": user[1] if user else None,
            "lib_file": lib[0] if lib and lib != user else None, "lib_line": lib[1] if lib and lib != user else None}


def patch_torch_compile(torch, strict: bool = False) -> None:
    """Wrap `torch.compile`: backend "neuron" registers the emulated backend first. Idempotent."""
    _log["strict"] = strict
    orig = torch.compile
    if getattr(orig, "_nm_emulated_neuron", False):
        return

    @functools.wraps(orig)
    def compile(model=None, *args, **kwargs):  # noqa: A001 - the name users call
        if kwargs.get("backend") == BACKEND_NAME:
            _register()
            call = _call_site()
            call.update(dynamic=kwargs.get("dynamic"), fullgraph=bool(kwargs.get("fullgraph", False)),
                        mode=kwargs.get("mode"))
            _log["calls"].append(call)
        return orig(model, *args, **kwargs)

    compile._nm_emulated_neuron = True  # type: ignore[attr-defined]
    torch.compile = compile


def report() -> dict:
    """What the emulated backend saw, in the shape of the probe's compile section."""
    from neuron_migrate.probe.compile_probe import break_site

    breaks: list[dict] = []
    seen: set = set()
    try:
        from torch._dynamo import output_graph

        reasons = list(output_graph.graph_break_reasons)
    except Exception:  # noqa: BLE001 - dynamo never imported: the script compiled nothing
        reasons = []
    for br in reasons:
        first, reason, f, line, lib_f, lib_line = break_site(br)
        key = (first, f, line, lib_f, lib_line)
        if key in seen:  # the same break met again (a recompile, another step) is one break
            continue
        seen.add(key)
        breaks.append({"reason": first[:500], "detail": reason[:2000], "file": f, "line": line,
                       "lib_file": lib_f, "lib_line": lib_line})
    return {
        "backend": f"{BACKEND_NAME} (emulated: dynamo capture, aot_autograd, graphs run eagerly on the emulated device)",
        "calls": list(_log["calls"]),
        "explain": {"graph_count": _log["dynamo_graphs"], "graph_break_count": len(breaks), "breaks": breaks},
        "graphs": list(_log["graphs"]),
        # graphs the backend refused (the run went on with them eager; --strict raises instead)
        "refusals": list(_log["refusals"]),
    }
