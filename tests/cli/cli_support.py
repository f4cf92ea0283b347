"""Helpers for driving the command line as a user does: in-process (CliRunner) and under a pseudo-terminal.

Test modules import these by this module's own name (`from cli_support import cli`), never from `conftest`:
several conftest.py files share that module name, and which one `import conftest` finds depends on the order
pytest collected them in (tests/table first breaks it). pytest puts this folder on sys.path for the test
modules in it (the default `prepend` import mode); the folder's conftest.py adds it too, so any import mode works.
"""
from __future__ import annotations

import os
import pty
import select
import subprocess
import sys

from typer.testing import CliRunner

from neuron_migrate.cli.app import app

XLA = "import torch_xla.core.xla_model as xm\n\ndevice = xm.xla_device()\nxm.mark_step()\n"


def cli(*args, input=None):
    return CliRunner().invoke(app, [*args], input=input, catch_exceptions=False)


def tty_run(args: list, cwd, env_extra: dict | None = None, timeout: float = 300) -> str:
    """Run `python -m neuron_migrate ARGS` with stdout and stderr on a pseudo-terminal; return what it printed."""
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "TERM")}
    env.update({"TERM": "xterm-256color", "COLUMNS": "120"}, **(env_extra or {}))
    proc = subprocess.Popen([sys.executable, "-m", "neuron_migrate", *args], cwd=cwd, stdin=subprocess.DEVNULL,
                            stdout=slave, stderr=slave, env=env)
    os.close(slave)
    chunks = []
    try:
        while True:
            r, _, _ = select.select([master], [], [], timeout)
            if not r:
                proc.kill()
                raise AssertionError("no output before the timeout")
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(master)
        proc.wait(timeout=timeout)
    return b"".join(chunks).decode("utf-8", "replace")
