"""Parent side: start the child in its own process group, wait with a timeout, kill everything it started.

The child's stdout/stderr go to files (not pipes), so a model that prints megabytes cannot block on a full
pipe; the report keeps only their sizes and tails. Results come back through `<tmp>/results/rank<N>.json`,
which the child rewrites as it goes.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from neuron_migrate.probe.analyze import load_rank_docs

TAIL_BYTES = 4000
TERM_GRACE_S = 3.0


def _descendants(pid: int) -> list[int]:
    """All descendants of `pid` (Linux /proc); torchrun's workers live in their own sessions."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for e in entries:
        if not e.isdigit():
            continue
        try:
            with open(f"/proc/{e}/stat", "rb") as fh:
                stat = fh.read().decode(errors="replace")
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(e))
    out, stack = [], [pid]
    while stack:
        for c in children.get(stack.pop(), []):
            out.append(c)
            stack.append(c)
    return out


def _signal_all(pgid: int, pids: list[int], sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for p in pids:
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _tail(path: str) -> tuple[int, str]:
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            if size > TAIL_BYTES:
                fh.seek(size - TAIL_BYTES)
            data = fh.read()
        return size, data.decode("utf-8", errors="replace")
    except OSError:
        return 0, ""


def build_command(spec: dict, nproc: int | None) -> list[str]:
    payload = json.dumps(spec)
    if nproc and nproc > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                "-m", "neuron_migrate.probe.child", payload]
    return [sys.executable, "-m", "neuron_migrate.probe.child", payload]


DEFAULT_MAX_OUTPUT = 4 * 1024 * 1024  # bytes of stdout+stderr before a run counts as an output flood


def _wait_watching_output(proc, fout, ferr, timeout: float, max_output: int) -> str:
    """Wait for the child; return "done", "timeout", "flood" (printed more than max_output bytes, still running) or
    "flood-done" (it finished between two looks, having printed more: a flood too, whatever the timing)."""
    deadline = time.monotonic() + timeout

    def flooded() -> bool:
        return bool(max_output) and os.fstat(fout.fileno()).st_size + os.fstat(ferr.fileno()).st_size > max_output

    while True:
        try:
            proc.wait(timeout=min(0.1, max(0.0, deadline - time.monotonic())))
            return "flood-done" if flooded() else "done"
        except subprocess.TimeoutExpired:
            pass
        if flooded():
            return "flood"
        if time.monotonic() >= deadline:
            return "timeout"


class _Finished(Exception):
    pass


def run_child(spec: dict, *, timeout: float, nproc: int | None = None, env: dict | None = None,
              keep_dir: bool = False, max_output: int = DEFAULT_MAX_OUTPUT) -> tuple[list[dict], dict[str, Any]]:
    """Run the probe child; return (per-rank result docs, outcome)."""
    work = tempfile.mkdtemp(prefix="nm-probe-")
    spec = dict(spec, results_dir=os.path.join(work, "results"))
    os.makedirs(spec["results_dir"], exist_ok=True)
    out_path, err_path = os.path.join(work, "stdout.log"), os.path.join(work, "stderr.log")
    child_env = dict(os.environ if env is None else env)
    child_env.setdefault("PYTHONUNBUFFERED", "1")
    # The parent's source tree first, so the child runs this very probe.
    pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    child_env["PYTHONPATH"] = os.pathsep.join([p for p in (pkg_root, child_env.get("PYTHONPATH")) if p])
    outcome: dict[str, Any] = {"timed_out": False, "returncode": None, "timeout_s": timeout}
    t0 = time.monotonic()
    with open(out_path, "wb") as fout, open(err_path, "wb") as ferr:
        proc = subprocess.Popen(build_command(spec, nproc), stdout=fout, stderr=ferr, stdin=subprocess.DEVNULL,
                                cwd=spec.get("cwd") or None, env=child_env, start_new_session=True)
        pgid = proc.pid  # start_new_session: the child leads its own group
        try:
            ended = _wait_watching_output(proc, fout, ferr, timeout, max_output)
            if ended in ("done", "flood-done"):
                outcome["output_flood"] = ended == "flood-done"
                raise _Finished
            outcome["timed_out"] = ended == "timeout"
            outcome["output_flood"] = ended == "flood"
            tree = _descendants(proc.pid)
            _signal_all(pgid, tree, signal.SIGTERM)  # the child writes what it has, then exits
            try:
                proc.wait(timeout=TERM_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
            tree = sorted(set(tree) | set(_descendants(proc.pid)))
            _signal_all(pgid, tree, signal.SIGKILL)
            proc.wait()
            outcome["killed"] = {"process_group": pgid, "descendants": len(tree)}
        except _Finished:
            pass
        except BaseException:  # KeyboardInterrupt: still leave nothing behind
            _signal_all(pgid, _descendants(proc.pid), signal.SIGKILL)
            proc.wait()
            raise
        finally:
            # Anything left in the group (a daemon the user's code started) goes too.
            _signal_all(pgid, [], signal.SIGKILL)
    outcome["returncode"] = proc.returncode
    outcome["wall_s"] = round(time.monotonic() - t0, 3)
    out_size, out_tail = _tail(out_path)
    err_size, err_tail = _tail(err_path)
    outcome["stdout"] = {"bytes": out_size, "tail": out_tail}
    outcome["stderr"] = {"bytes": err_size, "tail": err_tail}
    docs = load_rank_docs(spec["results_dir"])
    rc = proc.returncode
    if outcome.get("output_flood"):
        how = ("the process group was killed (results gathered so far are shown" if outcome.get("killed")
               else "it had finished (its output is cut to the last lines")
        outcome["error"] = {"type": "OutputFlood", "message": f"the model printed more than {max_output // (1024 * 1024)} MiB; "
                            f"{how}; --max-output-mb raises the limit)"}
    elif outcome["timed_out"]:
        outcome["error"] = {"type": "Timeout", "message": f"the model did not finish within {timeout:g} s; "
                            "the process group was killed (results gathered so far are shown)"}
    elif not docs:
        outcome["error"] = {"type": "NoResults", "message": f"the probe child exited with code {rc} before writing results",
                            "traceback": err_tail[-2000:]}
    elif rc != 0 and not any(d.get("error") for d in docs):
        how = f"was killed by signal {signal.Signals(-rc).name}" if rc < 0 else f"exited with code {rc}"
        outcome["error"] = {"type": "ChildExit", "message": f"the probe child {how} before finishing",
                            "traceback": err_tail[-2000:]}
    if keep_dir:
        outcome["work_dir"] = work
    else:
        shutil.rmtree(work, ignore_errors=True)
    return docs, outcome
