"""The `neuron-migrate` command line, as a typer app (every command, `--help`, error messages).

Each command group lives in a module with a `register(app)` function (`COMMAND_MODULES`, in the order of
`neuron-migrate --help`): rewrite, audit and rules here in `cli/`, probe and table in their own stages. Those modules must stay light at import time (no torch, no libcst): the CLI
starts for every pre-commit run.
"""
from __future__ import annotations

import importlib

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
COMMAND_MODULES = (
    "neuron_migrate.cli.rewrite",
    "neuron_migrate.cli.audit",
    "neuron_migrate.cli.report",
    "neuron_migrate.probe.cli",
    "neuron_migrate.cli.verify",
    "neuron_migrate.table.cli",
    "neuron_migrate.cli.rules",
    "neuron_migrate.cli.cache",
    "neuron_migrate.server.cli",
)


def _register_commands() -> None:
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(app)


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


_register_commands()
