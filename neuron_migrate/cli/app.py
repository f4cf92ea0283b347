"""The `neuron-migrate` entry point.

The one-line forms of `audit` and `rewrite` run through cli/fast.py without importing typer; everything else goes
to the typer app in cli/typer_app.py. `app` is that typer app, imported on first use (for tests and embedding).
"""
from __future__ import annotations

import sys


def main() -> None:
    try:
        from neuron_migrate.cli.fast import run

        code = run(sys.argv[1:])
        if code is not None:
            sys.exit(code)
        from neuron_migrate.cli.typer_app import app

        app()
    except KeyboardInterrupt:
        sys.stderr.write("neuron-migrate: interrupted\n")
        sys.exit(130)
    except Exception as exc:
        from neuron_migrate.pipeline.parallel import WorkerError

        if not isinstance(exc, WorkerError):
            raise
        # a worker killed from outside (out of memory): one line, not a traceback (writes are atomic: no file is
        # left half-written)
        sys.stderr.write(f"neuron-migrate: error: {exc}\n")
        sys.exit(2)


def __getattr__(name: str):
    if name == "app":
        from neuron_migrate.cli.typer_app import app

        return app
    raise AttributeError(name)


if __name__ == "__main__":
    main()
