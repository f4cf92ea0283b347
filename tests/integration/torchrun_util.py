"""Run a script under torchrun for the integration tests, tolerating one known environment flake.

torch 2.13's CPU gloo backend sometimes aborts a worker *after* the script has finished ("terminate called
without an active exception" while the interpreter tears down gloo's threads; reproduced here with a
ten-line all_reduce script, also with destroy_process_group). Such a run is retried, up to three times;
any other failure, or the abort on every attempt, fails the test with the full output.
"""
from __future__ import annotations

import subprocess
import sys

TEARDOWN_ABORT = "terminate called without an active exception"


def run_torchrun(script_args: list[str], nproc: int = 2, attempts: int = 3, **kwargs) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *script_args]
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    for _ in range(attempts):
        p = subprocess.run(cmd, **kwargs)
        if p.returncode == 0 or TEARDOWN_ABORT not in (p.stderr or "") + (p.stdout or ""):
            return p
    return p
