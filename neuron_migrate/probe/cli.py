"""`neuron-migrate probe`: run the user's model and report, per aten op, how TorchNeuron would run it.

Kept light at import time: no torch here (the child process imports it).
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
from enum import Enum
from typing import List, Optional

import typer

INSTALL_HINT = "neuron-migrate probe needs torch: pip install 'neuron-migrate[probe]'"

# exit codes
EXIT_OK, EXIT_FAIL_ON, EXIT_ERROR = 0, 1, 2


class Mode(str, Enum):
    train = "train"
    forward = "forward"


class Device(str, Enum):
    auto = "auto"
    emulate = "emulate"
    cpu = "cpu"
    cuda = "cuda"
    neuron = "neuron"


class Fmt(str, Enum):
    text = "text"
    json = "json"


class Opt(str, Enum):
    adamw = "adamw"
    adam = "adam"
    sgd = "sgd"


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def parse_target(target: str, cwd: str) -> dict:
    """`path/train.py` -> script; `pkg.mod:fn` or `path/file.py:fn` -> factory."""
    head, sep, tail = target.rpartition(":")
    if sep and tail and head and not (len(head) == 1 and head.isalpha()):  # not a Windows drive letter
        return {"kind": "factory", "ref": target}
    path = os.path.join(cwd, target)
    if target.endswith(".py") or os.path.isfile(path):
        if not os.path.isfile(path):
            raise typer.BadParameter(f"no such script: {target}", param_hint="TARGET")
        return {"kind": "script", "path": target}
    raise typer.BadParameter(
        f"{target!r} is neither a script (path/to/train.py) nor a factory (package.module:function)",
        param_hint="TARGET")


def parse_shapes(values: list[str]) -> list[list[int]]:
    shapes = []
    for v in values:
        for piece in v.replace(";", " ").replace(",", " ").split():
            try:
                shapes.append([int(d) for d in piece.lower().split("x")])
            except ValueError:
                raise typer.BadParameter(f"bad shape {piece!r}: use e.g. 8x128", param_hint="--shapes") from None
    return shapes


def parse_fail_on(value: str | None) -> list[str]:
    from neuron_migrate.probe.analyze import FAIL_ON_CHOICES

    if not value:
        return []
    items = [x.strip() for x in value.split(",") if x.strip()]
    bad = [x for x in items if x not in FAIL_ON_CHOICES]
    if bad:
        raise typer.BadParameter(f"unknown {', '.join(bad)}; choose from {', '.join(FAIL_ON_CHOICES)}",
                                 param_hint="--fail-on")
    return items


def _parse_precision(value: str | None) -> tuple[str, ...]:
    from neuron_migrate.probe.precision_kinds import parse_kinds

    try:
        return parse_kinds(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--emulate-precision") from None


def probe(
    ctx: typer.Context,
    target: str = typer.Argument(..., help="path/to/train.py (run as __main__; script args after --), or "
                                 "package.module:factory / path/file.py:factory returning a model or (model, inputs)."),
    mode: Mode = typer.Option(Mode.train, "--mode", help="train: forward, backward, optimizer step; forward: no_grad forward."),
    steps: int = typer.Option(3, "--steps", min=1, help="Steps to run a factory target."),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", min=1, help="Stop a script after N optimizer steps."),
    time_limit: Optional[float] = typer.Option(None, "--time-limit", help="Stop cleanly after S seconds (report as stopped, not an error)."),
    timeout: float = typer.Option(600.0, "--timeout", help="Kill the run after S seconds (exit 2)."),
    max_output_mb: float = typer.Option(4.0, "--max-output-mb", min=0, help="Kill the run when it prints more than this (0: no limit; exit 2)."),
    inputs: Optional[str] = typer.Option(None, "--inputs", help="module:fn returning example inputs (tensor, tuple or dict)."),
    optimizer: Opt = typer.Option(Opt.adamw, "--optimizer", help="Optimizer for factory targets."),
    device: Device = typer.Option(Device.auto, "--device", help="auto: neuron when torch-neuronx and a device are present, "
                                  "else the emulated neuron device; emulate: the emulated device; cpu: the CPU dispatch trace."),
    strict: bool = typer.Option(False, "--strict", help="Stop at the first op or tensor kind TorchNeuron cannot run, "
                                "raising as the device would (default: record it with its line, run it on the host, "
                                "go on, and exit 1)."),
    keep_going: bool = typer.Option(False, "--keep-going", help="The default (kept for scripts that pass it): record ops the table calls unsupported "
                                    "and run them on the host instead of raising as the device would."),
    compile_: bool = typer.Option(False, "--compile", help="Also run through torch.compile with a capturing backend."),
    shapes: List[str] = typer.Option([], "--shapes", help="Input shapes for the recompile count, e.g. --shapes 8x128,16x128 (first tensor input)."),
    numerics: bool = typer.Option(False, "--numerics", help="Compare float64-as-float32 (and neuron vs CPU) results."),
    fmt: Fmt = typer.Option(Fmt.text, "--format", help="text (rich summary) or json on stdout."),
    report: Optional[str] = typer.Option(None, "--report", help="Also write a Markdown report to FILE.md."),
    json_out: Optional[str] = typer.Option(None, "--json-out", help="Also write the JSON report to FILE."),
    fail_on: Optional[str] = typer.Option(None, "--fail-on", help="Exit 1 when found (comma separated): fallback, float64, unsupported, unknown, partial, graph-break, compile."),
    table: Optional[str] = typer.Option(None, "--table", help="Compat table file (default: newest shipped)."),
    nproc_per_node: Optional[int] = typer.Option(None, "--nproc-per-node", "--nproc", min=1, help="Run under torchrun with N ranks; one record per rank, merged."),
    seed: int = typer.Option(0, "--seed"),
    top: int = typer.Option(10, "--top", help="How many fallbacks to list."),
    save_reference: Optional[str] = typer.Option(None, "--save-reference", help="Run here and save a parity reference "
                                                 "(inputs, weights, outputs, losses, gradient norms, module outputs) to FILE.nmref."),
    compare: Optional[str] = typer.Option(None, "--compare", help="Run again and compare with a saved reference; "
                                          "exit 1 when a gate fails, naming where the divergence starts."),
    emulate_precision: Optional[str] = typer.Option(None, "--emulate-precision", help="Run with the device's precision "
                                                    "emulated: float64 (as float32), int64 (as int32), bf16 (autocast); "
                                                    "comma-separated, e.g. float64,int64,bf16."),
    parity: bool = typer.Option(False, "--parity", help="Compare a run under --emulate-precision with the same run in "
                                "this environment's precision, without a saved reference."),
    gates: Optional[str] = typer.Option(None, "--gates", help="Parity gates, e.g. cosine=0.99,output-rtol=0.05,"
                                        "grad-rtol=0.1,grad-floor=0.001,loss-rtol=0.05,act-rtol=0.05."),
) -> None:
    """Run a model or training script and report, per aten op, whether TorchNeuron runs it natively, falls
    back to CPU, downcasts float64 or cannot run it, with your file and line. Exit: 0 ok, 1 an op or namespace
    TorchNeuron cannot run was found (reported with its line; the run went on) or a --fail-on hit, 2 the run
    failed, timed out or torch is missing."""
    cwd = os.getcwd()
    try:
        fail_list = parse_fail_on(fail_on)
        shape_list = parse_shapes(shapes)
        tgt = parse_target(target, cwd)
        precision_kinds = list(_parse_precision(emulate_precision))
    except typer.BadParameter as exc:
        typer.echo(f"neuron-migrate probe: {exc.format_message()}", err=True)
        raise typer.Exit(EXIT_ERROR) from None
    if not torch_available():
        typer.echo(INSTALL_HINT, err=True)
        raise typer.Exit(EXIT_ERROR)
    if save_reference or compare or parity:
        def given(name):  # the reference's settings win over defaults; an explicit option that differs is noted
            source = ctx.get_parameter_source(name)
            return source is not None and source.name != "DEFAULT"

        raise typer.Exit(_parity(tgt, list(ctx.args), cwd=cwd, mode=mode.value if given("mode") else None,
                                 steps=steps if given("steps") else None,
                                 inputs=inputs,
                                 optimizer=optimizer.value if given("optimizer") else None, device=device.value,
                                 compile_=compile_, seed=seed, save_reference=save_reference, compare=compare, emulate_precision=",".join(precision_kinds),
                                 gates=gates, timeout=timeout, fmt=fmt.value, json_out=json_out,
                                 max_output=int(max_output_mb * 1024 * 1024)))
    script_args = list(ctx.args)
    if script_args and tgt["kind"] != "script":
        typer.echo(f"neuron-migrate probe: extra arguments {script_args} only apply to a script target", err=True)
        raise typer.Exit(EXIT_ERROR)
    if strict and keep_going:
        typer.echo("neuron-migrate probe: --strict and --keep-going contradict each other; give one", err=True)
        raise typer.Exit(EXIT_ERROR)
    if "unsupported" not in fail_list:  # what TorchNeuron cannot run always fails the probe (exit 1)
        fail_list.append("unsupported")
    needs_compile = [f for f in fail_list if f in ("graph-break", "compile")]
    if needs_compile and not compile_:
        typer.echo(f"neuron-migrate probe: --fail-on {','.join(needs_compile)} needs --compile; without it nothing "
                   "would be checked", err=True)
        raise typer.Exit(EXIT_ERROR)
    if (numerics or shape_list) and tgt["kind"] == "script":
        typer.echo("neuron-migrate probe: note: --numerics/--shapes need a factory target (module:fn); "
                   "ignored for a script", err=True)
    if compile_ and tgt["kind"] == "script" and device.value in ("cpu", "cuda"):
        typer.echo("neuron-migrate probe: note: --compile on a script reports its torch.compile(backend=\"neuron\") "
                   "calls on the emulated device; ignored with --device " + device.value, err=True)
    spec = {
        "target": tgt, "args": script_args, "cwd": cwd, "mode": mode.value, "steps": steps, "max_steps": max_steps,
        "time_limit": time_limit, "inputs": inputs, "optimizer": optimizer.value, "device": device.value,
        "compile": compile_, "shapes": shape_list if tgt["kind"] == "factory" else [],
        "numerics": numerics and tgt["kind"] == "factory", "seed": seed,
        "strict": strict, "emulate_precision": precision_kinds,
    }
    code = run_and_report(spec, timeout=timeout, nproc=nproc_per_node, fmt=fmt.value, report_md=report,
                          json_out=json_out, fail_on=fail_list, table=table, top=top,
                          max_output=int(max_output_mb * 1024 * 1024))
    raise typer.Exit(code)


def run_and_report(spec: dict, *, timeout: float, nproc: int | None, fmt: str, report_md: str | None,
                   json_out: str | None, fail_on: list[str], table: str | None, top: int,
                   max_output: int | None = None) -> int:
    from neuron_migrate.probe.analyze import Classifier, build_report
    from neuron_migrate.probe.render import print_rich, to_json, write_markdown
    from neuron_migrate.probe.runner import run_child

    from neuron_migrate.probe.runner import DEFAULT_MAX_OUTPUT
    from neuron_migrate.probe.tables import choose_table

    table_path, table_warning = choose_table(table)
    spec = dict(spec, table=table_path)
    if table_warning:
        typer.echo(f"neuron-migrate probe: warning: {table_warning}", err=True)
    prebuild_emulator(spec)
    docs, outcome = run_child(spec, timeout=timeout, nproc=nproc,
                              max_output=DEFAULT_MAX_OUTPUT if max_output is None else max_output)
    rep = build_report(docs, classifier=Classifier(table_path), outcome=outcome, spec=spec, fail_on=fail_on, top=top)
    if table_warning:
        rep["table_warning"] = table_warning
    if fmt == "json":
        sys.stdout.write(to_json(rep) + "\n")
    else:
        print_rich(rep, top=top)
    if report_md:
        write_markdown(rep, report_md, top=top)
    if json_out:
        with open(json_out, "w", encoding="utf-8") as fh:
            fh.write(to_json(rep))
    if rep["status"] != "ok":
        return EXIT_ERROR
    return EXIT_FAIL_ON if rep["failed_checks"] else EXIT_OK


def _parity(tgt: dict, script_args: list[str], *, cwd: str, mode: str | None, steps: int | None, inputs: str | None,
            optimizer: str | None, device: str, compile_: bool, seed: int, save_reference: str | None, compare: str | None,
            emulate_precision: str | None, gates: str | None, timeout: float, fmt: str, json_out: str | None,
            max_output: int) -> int:
    from neuron_migrate.probe.parity_run import EXIT_ERROR as PARITY_ERROR, exit_code, render_text, run_parity_child

    if save_reference and compare:
        typer.echo("neuron-migrate probe: --save-reference and --compare are two runs; give one", err=True)
        return PARITY_ERROR
    if script_args and tgt["kind"] != "script":
        typer.echo(f"neuron-migrate probe: extra arguments {script_args} only apply to a script target", err=True)
        return PARITY_ERROR
    spec = {"target": tgt, "args": script_args, "cwd": cwd, "mode": mode, "steps": steps, "inputs": inputs, "optimizer": optimizer,
            "device": device, "compile": compile_, "seed": seed, "save_reference": save_reference,
            "compare": compare, "emulate_precision": emulate_precision, "gates": gates}
    if not save_reference:
        prebuild_emulator(spec)  # a compare runs on the device (emulated off-Trainium); a reference where it runs today
    doc = run_parity_child(spec, timeout=timeout, max_output=max_output or 1 << 62)
    if fmt == "json":
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    else:
        typer.echo(render_text(doc, cwd))
    if json_out:
        with open(json_out, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1)
    return exit_code(doc)


def prebuild_emulator(spec: dict) -> None:
    """Build the emulated device here, once, before the run (and before torchrun starts N ranks), saying so;
    without a compiler say it in one line and probe on the CPU trace."""
    if spec.get("device") not in ("auto", "emulate"):
        return
    if spec["device"] == "auto" and importlib.util.find_spec("torch_neuronx") is not None:
        return  # a Trn host may use TorchNeuron itself; the child decides
    from neuron_migrate.probe.emulator.build import EmulatorUnavailable, library_path

    try:
        # the child loads this very file (it never builds: one build, here, under the cache's lock)
        spec["emulator_library"] = str(library_path(log=lambda m: typer.echo(f"neuron-migrate probe: {m}", err=True)))
    except EmulatorUnavailable as exc:
        typer.echo(f"neuron-migrate probe: {exc}; probing on the CPU trace instead (--device cpu)", err=True)
        spec["device"] = "cpu"
        spec["device_note"] = str(exc)


def register(app: typer.Typer) -> None:
    app.command(
        "probe",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(probe)
