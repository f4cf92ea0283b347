"""Parent side of `probe --save-reference / --compare / --emulate-precision`: run the parity child, show the result.

No torch here (the child, `parity.py`, imports it). Exit codes as for the probe: 0 every gate passed (or the
reference was saved), 1 a gate failed, 2 the run failed.
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

from neuron_migrate.probe.runner import TERM_GRACE_S, _descendants, _signal_all, _tail, _wait_watching_output

EXIT_OK, EXIT_GATE, EXIT_ERROR = 0, 1, 2


def run_parity_child(spec: dict, *, timeout: float, max_output: int) -> dict[str, Any]:
    work = tempfile.mkdtemp(prefix="nm-parity-")
    try:
        spec = dict(spec, result_file=os.path.join(work, "result.json"))
        for key in ("save_reference", "compare"):
            if spec.get(key):
                spec[key] = os.path.abspath(os.path.join(spec["cwd"], spec[key]))
        spec_path = os.path.join(work, "spec.json")
        with open(spec_path, "w", encoding="utf-8") as fh:
            json.dump(spec, fh)
        env = dict(os.environ)
        pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join([p for p in (pkg_root, env.get("PYTHONPATH")) if p])
        env.setdefault("PYTHONUNBUFFERED", "1")
        out_path, err_path = os.path.join(work, "stdout.log"), os.path.join(work, "stderr.log")
        t0 = time.monotonic()
        with open(out_path, "wb") as fout, open(err_path, "wb") as ferr:
            proc = subprocess.Popen([sys.executable, "-m", "neuron_migrate.probe.parity", spec_path], stdout=fout,
                                    stderr=ferr, stdin=subprocess.DEVNULL, cwd=spec.get("cwd") or None, env=env,
                                    start_new_session=True)
            try:
                ended = _wait_watching_output(proc, fout, ferr, timeout, max_output)
                if ended != "done":
                    tree = _descendants(proc.pid)
                    _signal_all(proc.pid, tree, signal.SIGTERM)
                    try:
                        proc.wait(timeout=TERM_GRACE_S)
                    except subprocess.TimeoutExpired:
                        pass
                    _signal_all(proc.pid, sorted(set(tree) | set(_descendants(proc.pid))), signal.SIGKILL)
                    proc.wait()
                    why = (f"the model did not finish within {timeout:g} s" if ended == "timeout"
                           else f"the model printed more than {max_output // (1024 * 1024)} MiB")
                    return {"status": "error", "error": {"type": "Timeout" if ended == "timeout" else "OutputFlood",
                                                         "message": why + "; the process group was killed"}}
            finally:
                _signal_all(proc.pid, [], signal.SIGKILL)
        try:
            with open(spec["result_file"], encoding="utf-8") as fh:
                doc = json.load(fh)
        except (OSError, ValueError):
            _, tail = _tail(err_path)
            return {"status": "error", "error": {"type": "NoResults", "message":
                    f"the parity child exited with code {proc.returncode} before writing results",
                    "traceback": tail[-2000:]}}
        doc["wall_s"] = round(time.monotonic() - t0, 3)
        return doc
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _fmt(v: Any, digits: int = 4) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)


def _where(d: dict, cwd: str) -> str:
    f = d.get("file")
    if not f:
        return "?"
    try:
        rel = os.path.relpath(f, cwd)
        f = f if rel.startswith("..") else rel
    except ValueError:
        pass
    return f"{f}:{d.get('line')}"


def render_text(doc: dict, cwd: str) -> str:
    lines: list[str] = []
    if doc.get("status") != "ok":
        err = doc.get("error", {})
        lines.append(f"parity run failed: {err.get('type')}: {err.get('message')}")
        if err.get("file"):
            lines.append(f"  at {_where(err, cwd)}")
        return "\n".join(lines)
    for note in doc.get("notes", []):
        lines.append(f"note: {note}")
    if doc.get("saved"):
        t = doc.get("timing", {})
        lines.append(f"Reference saved to {_where({'file': doc['saved']}, cwd).rpartition(':')[0]}: device {doc['device']}, torch "
                     f"{doc['torch']}, {doc.get('steps')} step(s), {doc.get('modules')} module outputs.")
        lines.append(_timing_line("this run", t))
        return "\n".join(lines)
    against = doc.get("reference_device") or "?"
    prec = ", ".join(doc.get("precision") or []) or "none"
    device = "neuron (EMULATED on the host)" if doc.get("device_kind") == "emulated" else doc["device"]
    lines.append(f"Parity: device {device} vs reference ({against}); emulated precision: {prec}")
    for c in doc.get("checks", []):
        mark = "PASS" if c["ok"] else "FAIL"
        if c["gate"] == "inputs":
            lines.append(f"  {mark}  inputs: {c['detail']}")
            continue
        rel = ">=" if c["detail"] == "at least" else "<="
        detail = "" if c["detail"] in ("at least", "at most") else f"  ({c['detail']})"
        digits = 6 if "cosine" in c["gate"] else 4
        lines.append(f"  {mark}  {c['gate']}: {_fmt(c['value'], digits)} (gate {rel} {_fmt(c['limit'], digits)}){detail}")
    first = doc.get("first_divergent_module")
    origin = doc.get("origin_module")
    if first:
        mods = {m["module"]: m for m in doc.get("modules", [])}
        m = mods.get(origin) or mods.get(first, {})
        lines.append(f"Divergence starts in module {origin!r} ({m.get('class', '?')}, {_where(m, cwd)})"
                     + (f"; first output out of tolerance: {first!r}" if first != origin else ""))
        loc = doc.get("localisation")
        if loc:
            for c in loc.get("culprits", []):
                extra = "".join(f", with {w['op']} at {_where(w, cwd)}" for w in c.get("with", []))
                lines.append(f"  {c['op']} at {_where(c, cwd)} introduces it (error in {_fmt(c['input_error'])} -> "
                             f"out {_fmt(c['output_error'])}){extra}")
            verdict = "confirmed" if loc.get("confirmed") else "not fully explained"
            lines.append(f"  replaying {loc['module']!r} with {'these ops' if loc.get('culprits') else 'no op'} in "
                         f"reference precision: module error {_fmt(loc['module_error'])} -> "
                         f"{_fmt(loc['module_error_with_culprits_exempt'])} ({verdict})")
    elif doc.get("checks") and doc.get("ok"):
        lines.append("Every module output is within tolerance.")
    elif doc.get("checks"):
        lines.append("Every module output is within tolerance: the divergence is made after the model's forward "
                     "(the loss computation, the backward pass, the optimizer step or the code between them).")
    timing = doc.get("timing") or {}
    if timing.get("reference"):
        lines.append(_timing_line("reference", timing["reference"]))
    if timing.get("run"):
        lines.append(_timing_line("this run", timing["run"]))
    lines.append("All gates passed." if doc.get("ok") else "A gate failed.")
    return "\n".join(lines)


def _timing_line(label: str, t: dict) -> str:
    s = f"  time ({label}): first step {_fmt(t.get('first_step_s', 0.0))} s"
    if t.get("compiled"):
        s += f" (includes compilation, backend {t.get('compile_backend')})"
    if "steady_step_s" in t:
        s += f", steady state {_fmt(t['steady_step_s'])} s/step"
    return s


def exit_code(doc: dict) -> int:
    if doc.get("status") != "ok":
        return EXIT_ERROR
    if doc.get("saved"):
        return EXIT_OK
    return EXIT_OK if doc.get("ok") else EXIT_GATE
