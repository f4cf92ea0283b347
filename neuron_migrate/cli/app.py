"""The `neuron-migrate` command line.

Each stage (table, probe, audit, rewrite) owns its commands in `neuron_migrate/<stage>/cli.py` and adds them
here through `register(app)`. Those modules must stay light at import time (no torch, no libcst): the CLI
starts for every pre-commit run.
"""
from __future__ import annotations

import importlib
import sys

import typer

app = typer.Typer(
    name="neuron-migrate",
    help="Move PyTorch/XLA and CUDA code to TorchNeuron (device 'neuron'), and find what will not run well there.",
    no_args_is_help=True,
    invoke_without_command=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

# Order is the order of `neuron-migrate --help`.
STAGES = ("rewrite", "audit", "report", "probe", "table", "rules")


def _register_stages() -> None:
    for stage in STAGES:
        try:
            module = importlib.import_module(f"neuron_migrate.{stage}.cli")
        except ModuleNotFoundError as exc:  # a stage not built yet must not break the others
            if exc.name and exc.name.startswith(f"neuron_migrate.{stage}"):
                continue
            raise
        module.register(app)


@app.callback()
def _root(
    ctx: typer.Context,
    version: bool = typer.Option(False, "--version", help="Print the version and exit.", is_eager=True),
) -> None:
    if version:
        from neuron_migrate import __version__

        typer.echo(f"neuron-migrate {__version__}")
        raise typer.Exit(0)
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())
        raise typer.Exit(2)


_register_stages()


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.stderr.write("neuron-migrate: interrupted\n")
        sys.exit(130)


if __name__ == "__main__":
    main()
