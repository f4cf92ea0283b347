"""`neuron-migrate verify`: run the original torch_xla program and its migration step by step and compare them.

Exit codes: 0 equivalent, 1 diverged (or not deterministic), 2 could not run, 3 no torch_xla environment (the
message says how to install it). Light at import time: no torch here.
"""
from __future__ import annotations

from enum import Enum
from pathlib import Path

import typer


class Fmt(str, Enum):
    text = "text"
    json = "json"


def register(app: typer.Typer) -> None:
    app.command("verify", context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
                help="Run the original torch_xla program (XLA on CPU) and the migrated one (native) with the same "
                     "seeds and random numbers, and compare losses, gradients and parameters step by step.")(verify)


def verify(
    ctx: typer.Context,
    script: str = typer.Argument(..., help="The training script (script arguments after --)."),
    root: str | None = typer.Option(None, "--root", help="The project folder the script runs in (default: the script's folder)."),
    original: str | None = typer.Option(None, "--original", help="The unmigrated project folder (default: the files as they are when they use torch_xla, else git HEAD)."),
    steps: int = typer.Option(20, "--steps", min=1, help="Optimizer steps to compare."),
    nproc: int = typer.Option(1, "--nproc", min=1, help="Also run the migrated program under torchrun with N processes: every rank in one group of N, the same parameters on every rank after each step."),
    float64: bool = typer.Option(False, "--float64", help="Make float64 the default dtype on both sides: a gate of 1e-6 instead of float32's 1e-4."),
    seed: int = typer.Option(0, "--seed", help="Seed of Python, numpy, torch and the host random-number generator."),
    timeout: float = typer.Option(900.0, "--timeout", help="Give up on a side after S seconds (exit 2)."),
    xla_python: str | None = typer.Option(None, "--xla-python", help="Interpreter with torch_xla for the original (default: $NM_VERIFY_XLA_PYTHON, else the cached environment)."),
    check_determinism: bool = typer.Option(False, "--check-determinism", help="Run the original twice first: a program that differs from itself is reported as such."),
    no_localise: bool = typer.Option(False, "--no-localise", help="Do not replay the first diverging step with module hooks."),
    unsafe_fixes: bool | None = typer.Option(None, "--unsafe-fixes/--no-unsafe-fixes", help="When verify makes the migrated copy: apply unsafe fixes too (default: the project's [tool.neuron-migrate] setting)."),
    fmt: Fmt = typer.Option(Fmt.text, "--format", help="text or json on stdout."),
    json_out: str | None = typer.Option(None, "--json-out", help="Also write the JSON result to FILE."),
    native_original: bool = typer.Option(False, "--native-original", hidden=True, help="Run the original natively too (no torch_xla: tests, programs already native)."),
    keep: str | None = typer.Option(None, "--keep", help="Keep the runs' files (trees, logs, recorded tensors) in DIR."),
) -> None:
    import importlib.util
    import sys

    from neuron_migrate.verify.harness import (
        EXIT_CANNOT_RUN,
        EXIT_DIVERGED,
        EXIT_EQUIVALENT,
        EXIT_NO_XLA,
    )
    from neuron_migrate.verify.xla_env import XlaEnvMissing, find_python

    def err(msg: str) -> None:
        typer.echo(f"error: {msg}", err=True)

    path = Path(script)
    if not path.is_file():
        err(f"no such script: {script}")
        raise typer.Exit(EXIT_CANNOT_RUN)
    if importlib.util.find_spec("torch") is None:
        err("verify runs the migrated program and needs torch: pip install 'neuron-migrate[probe]'")
        raise typer.Exit(EXIT_CANNOT_RUN)
    project = Path(root) if root else path.resolve().parent
    try:
        rel = path.resolve().relative_to(project.resolve()).as_posix()
    except ValueError:
        err(f"{script} is not inside --root {root}")
        raise typer.Exit(EXIT_CANNOT_RUN) from None
    python = ""
    if not native_original:
        try:
            python = find_python(xla_python)
        except XlaEnvMissing as exc:
            err(str(exc))
            raise typer.Exit(EXIT_NO_XLA) from None
    from neuron_migrate.verify.harness import CannotRun
    from neuron_migrate.verify.harness import verify as run_verify
    from neuron_migrate.verify.render import render_text, to_json

    quiet = fmt == Fmt.json
    try:
        result = run_verify(project, rel, list(ctx.args), xla_python=python, steps=steps, seed=seed, float64=float64,
                            timeout=timeout, original=Path(original) if original else None,
                            native_original=native_original, nproc=nproc, localise=not no_localise, check_determinism=check_determinism,
                            keep=Path(keep) if keep else None, unsafe_fixes=unsafe_fixes,
                            log=None if quiet else (lambda m: print(m, file=sys.stderr, flush=True)))
    except CannotRun as exc:
        err(f"verify could not run: {exc}")
        raise typer.Exit(EXIT_CANNOT_RUN) from None
    if json_out:
        Path(json_out).write_text(to_json(result) + "\n", encoding="utf-8")
    typer.echo(to_json(result) if quiet else render_text(result))
    verdict = result.get("verdict")
    raise typer.Exit(EXIT_EQUIVALENT if verdict == "equivalent" else EXIT_DIVERGED if verdict in ("diverged", "not-deterministic")
                     else EXIT_CANNOT_RUN)
