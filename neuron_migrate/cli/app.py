"""The `neuron-migrate` entry point.

The one-line forms of `audit` and `rewrite` run through cli/fast.py without importing typer; everything else goes
to the typer app in cli/typer_app.py. `app` is that typer app, imported on first use (for tests and embedding).
"""
from __future__ import annotations

import sys


def main(exit_at_once: bool = False) -> None:
    """Run the command line in sys.argv. `exit_at_once` (the console script and `python -m neuron_migrate`, never
    an embedding caller): a one-line audit or rewrite ends the process without tearing the interpreter down."""
    try:
        from neuron_migrate.cli.fast import run

        code = run(sys.argv[1:])
        if code is not None:
            if exit_at_once:
                _exit_at_once(code)
            sys.exit(code)
        from neuron_migrate.cli.typer_app import app

        app()
    except KeyboardInterrupt:
        sys.stderr.write("neuron-migrate: interrupted\n")
        sys.exit(130)
    except BrokenPipeError:
        _reader_gone()
        sys.exit(1)
    except Exception as exc:
        from neuron_migrate.pipeline.parallel import WorkerError

        if not isinstance(exc, WorkerError):
            raise
        # a worker killed from outside (out of memory): one line, not a traceback (writes are atomic: no file is
        # left half-written)
        sys.stderr.write(f"neuron-migrate: error: {exc}\n")
        sys.exit(2)


def entry() -> None:
    """The console script `neuron-migrate`."""
    main(exit_at_once=True)


def _exit_at_once(code: int) -> None:
    """Exit now with `code`, the run being over: its output written, its files closed, its workers reaped. Freeing
    every module and object at interpreter shutdown costs a few milliseconds of each run (a tenth of a warm audit)
    and does nothing a finished run needs. Exit handlers still run and output is flushed; the normal exit is taken
    when threads are alive (shutdown joins them), a profiler, tracer or monitoring tool is attached (`python -m
    cProfile` writes its data once the program returns) or a flush fails (its usual message and status)."""
    import atexit
    import os

    threading = sys.modules.get("threading")
    if threading is not None and threading.active_count() > 1:
        sys.exit(code)
    if sys.getprofile() is not None or sys.gettrace() is not None or _monitored():
        sys.exit(code)
    atexit._run_exitfuncs()
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except BrokenPipeError:
        _reader_gone()
        os._exit(1)
    except (OSError, ValueError):
        sys.exit(code)
    os._exit(code)


def _reader_gone() -> None:
    """The reader of the output went away (`neuron-migrate audit . | head`): the run stops without a traceback and
    with status 1, as click stops the other commands. Standard output is pointed at /dev/null first, so that the
    exit's flush of what is still buffered cannot fail again."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def _monitored() -> bool:
    """A sys.monitoring tool is registered (Python 3.12+: coverage, profilers and debuggers that do not use
    sys.settrace)."""
    monitoring = getattr(sys, "monitoring", None)
    return monitoring is not None and any(monitoring.get_tool(i) is not None for i in range(6))


def __getattr__(name: str):
    if name == "app":
        from neuron_migrate.cli.typer_app import app

        return app
    raise AttributeError(name)


if __name__ == "__main__":
    entry()
