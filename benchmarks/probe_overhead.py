"""Probe overhead per training step on the emulated neuron device: the probe's recorder vs a plain loop.

For each model (a probe factory target) one fresh process installs the emulated device, builds the model and an
AdamW optimizer, and then alternates, round after round, a few plain steps (forward, loss, backward, AdamW step;
nothing installed) with the same steps under the probe's recorder set up exactly as the probe's child sets it up
(op records, locations, backward attribution, float64/namespace tracking, the crash journal and the results file
rewritten on its timer). Plain and probed steps are measured in the same process, interleaved, so a busy machine
slows both alike; the ratio of the medians is the overhead. Both wall-clock and process CPU time are reported: on a
shared machine a process waits for a core for part of every step, which inflates wall-clock time unevenly, so the
CPU-time ratio is the one checked against the target (<= 3x per step; exit status 1 when a model is over it). On an
idle machine the two agree.

    python benchmarks/probe_overhead.py                      # the example models (+ tiny transformers if installed)
    python benchmarks/probe_overhead.py --models mlp,gpt2 --rounds 5 --out benchmarks/PROBE_OVERHEAD.md
    python benchmarks/probe_overhead.py --end-to-end         # also `neuron-migrate probe TARGET --steps N` (separate runs)

Wall-clock numbers depend on the machine and its load; the ratio is what to compare.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODELS = {
    "mlp": "examples/probe_models/mlp.py:make",
    "fallback_model": "examples/probe_models/fallback_model.py:make",
    "gpt2": "tests/probe/hf_models.py:gpt2",
    "bert": "tests/probe/hf_models.py:bert",
    "llama": "tests/probe/hf_models.py:llama",
    "vit": "tests/probe/hf_models.py:vit",
    "fnet": "tests/probe/hf_models.py:fnet",
}
TARGET_RATIO = 3.0

# One process per model: plain and probed steps interleaved. Prints one JSON line prefixed with @@.
INTERLEAVED = r'''
import json, os, statistics, sys, tempfile, time
sys.path.insert(0, ".")
import torch
from neuron_migrate.probe import emulator
from neuron_migrate.probe.child import Writer, _load_callable, _split_inputs, _to_device
from neuron_migrate.probe.recorder import STOP_CODES, Recorder
from neuron_migrate.probe.steps import loss_of
from neuron_migrate.probe.tables import choose_table
from neuron_migrate.table import load_table

target, rounds, per_round = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
emulator.install(load_table(choose_table(None)[0]))
torch.manual_seed(0)
made = _load_callable(target, ".")()
model, inputs = made if isinstance(made, tuple) else (made, None)
args, kwargs = _split_inputs(inputs)
dev = torch.device("neuron")
model = model.to(dev)
args, kwargs = _to_device((args, kwargs), dev)
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)

# the recorder as child.py sets it up: results file rewritten on the recorder's timer, journal of new records
out_dir = tempfile.mkdtemp(prefix="nm-overhead-")
writer = Writer(os.path.join(out_dir, "rank0.json"), {"status": "running"})
rec = Recorder(on_tick=lambda: writer.flush(), tick_s=0.5)
writer.recorder = rec
rec.journal = open(os.path.join(out_dir, "rank0.ops.jsonl"), "a", encoding="utf-8")


def step(probed):
    # the probe's factory step: the loss is computed with the recorder paused, the seed runs as backward
    model.train()
    out = model(*args, **kwargs)
    if probed:
        rec.paused += 1
    loss = loss_of(out)
    if probed:
        rec.paused -= 1
        rec.phase = "backward"
    loss.backward()
    if probed:
        rec.phase = "forward"
    opt.step()
    opt.zero_grad(set_to_none=True)


def steps(probed, n):
    wall, cpu = [], []
    for _ in range(n):
        t0, c0 = time.perf_counter(), time.process_time()
        step(probed)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return wall, cpu


STOP_CODES.update({step.__code__, steps.__code__})
steps(False, 2)  # warm-up: first-call costs of kernels and of the model itself
with rec:
    steps(True, 2)  # the probe's first steps create its records; the steady state is what is measured
res = {"plain_wall": [], "plain_cpu": [], "probed_wall": [], "probed_cpu": []}
for _ in range(rounds):
    w, c = steps(False, per_round)
    res["plain_wall"] += w
    res["plain_cpu"] += c
    with rec:
        w, c = steps(True, per_round)
    res["probed_wall"] += w
    res["probed_cpu"] += c
res["records"] = len(rec.records)
res["ops_per_step"] = sum(r["count"] for r in rec.records.values()) / (2 + rounds * per_round)
print("@@" + json.dumps(res))
'''


def interleaved(target: str, rounds: int, per_round: int) -> dict:
    p = subprocess.run([sys.executable, "-c", INTERLEAVED, target, str(rounds), str(per_round)], cwd=REPO,
                       capture_output=True, text=True, timeout=3600)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("@@")), None)
    if p.returncode != 0 or line is None:
        raise RuntimeError(f"benchmark process failed for {target}: {p.stderr[-1500:]}")
    return json.loads(line[2:])


def end_to_end(target: str, steps: int) -> float:
    """Steady-state step of `neuron-migrate probe TARGET --steps N` (a separate run; noisier)."""
    p = subprocess.run([sys.executable, "-m", "neuron_migrate", "probe", target, "--format", "json", "--steps",
                        str(steps), "--device", "emulate"], cwd=REPO, capture_output=True, text=True, timeout=1800)
    try:
        rep = json.loads(p.stdout)
    except ValueError:
        raise RuntimeError(f"probe failed for {target}: {p.stderr[-1500:]}") from None
    if rep.get("status") != "ok":
        raise RuntimeError(f"probe failed for {target}: {rep.get('error')}")
    times = rep["timing"]["step_times_s"]
    return statistics.median(times[1:] if len(times) > 1 else times)


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=30).stdout.strip() or "?"
    except OSError:
        return "?"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=None, help="comma-separated: " + ",".join(MODELS))
    ap.add_argument("--rounds", type=int, default=5, help="plain/probed rounds per model (default 5)")
    ap.add_argument("--steps-per-round", type=int, default=3)
    ap.add_argument("--end-to-end", action="store_true", help="also time `neuron-migrate probe --steps N` runs")
    ap.add_argument("--out", default=None, help="also write the Markdown report here")
    a = ap.parse_args()
    names = a.models.split(",") if a.models else list(MODELS)
    if not a.models:
        try:
            import transformers  # noqa: F401
        except ImportError:
            names = [n for n in names if not MODELS[n].startswith("tests/probe/hf_models")]
    load_before = os.getloadavg()
    rows = []
    for name in names:
        target = MODELS.get(name, name)
        t0 = time.monotonic()
        r = interleaved(target, a.rounds, a.steps_per_round)
        med = {k: statistics.median(v) for k, v in r.items() if isinstance(v, list)}
        row = {"name": name, **med, "wall_ratio": med["probed_wall"] / med["plain_wall"],
               "cpu_ratio": med["probed_cpu"] / med["plain_cpu"], "ops": r["ops_per_step"], "records": r["records"]}
        if a.end_to_end:
            row["e2e"] = end_to_end(target, 2 + a.rounds * a.steps_per_round)
        rows.append(row)
        print(f"{name}: plain {row['plain_wall'] * 1e3:.1f} ms, probed {row['probed_wall'] * 1e3:.1f} ms, "
              f"{row['wall_ratio']:.2f}x wall, {row['cpu_ratio']:.2f}x CPU ({row['ops']:.0f} ops/step, "
              f"{time.monotonic() - t0:.0f} s)", flush=True)
    load_after = os.getloadavg()
    head = ["| model | aten ops / step | plain step | probed step | ratio (wall) | plain CPU | probed CPU | ratio (CPU) |"
            + (" `probe --steps` step |" if a.end_to_end else ""),
            "|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if a.end_to_end else "")]
    lines = list(head)
    for r in rows:
        mark = lambda x: f"{x:.2f}x" + ("" if x <= TARGET_RATIO else " (over target)")  # noqa: E731
        lines.append(f"| {r['name']} | {r['ops']:.0f} | {r['plain_wall'] * 1e3:.1f} ms | {r['probed_wall'] * 1e3:.1f} ms | "
                     f"{mark(r['wall_ratio'])} | {r['plain_cpu'] * 1e3:.1f} ms | {r['probed_cpu'] * 1e3:.1f} ms | "
                     f"{mark(r['cpu_ratio'])} |" + (f" {r['e2e'] * 1e3:.1f} ms |" if a.end_to_end else ""))
    table = "\n".join(lines)
    print("\n" + table)
    if a.out:
        meta = (f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {_commit()}, "
                f"torch {_torch_version()}, {os.cpu_count()} CPUs\n"
                f"- load average (1/5/15 min) before: {'/'.join(f'{x:.2f}' for x in load_before)}, after: "
                f"{'/'.join(f'{x:.2f}' for x in load_after)}\n"
                f"- per model: {a.rounds} rounds of {a.steps_per_round} plain + {a.steps_per_round} probed steps in one "
                f"process (after 2 warm-up steps of each); medians; target <= {TARGET_RATIO:g}x, checked on the CPU-time "
                f"ratio (the wall-clock one includes waiting for a core on a loaded machine)\n")
        Path(a.out).write_text("# Probe overhead per step (emulated neuron device)\n\n"
                               "Written by `benchmarks/probe_overhead.py`; see its docstring for the method.\n\n"
                               f"{meta}\n{table}\n", encoding="utf-8")
    return 0 if all(r["cpu_ratio"] <= TARGET_RATIO for r in rows) else 1


def _torch_version() -> str:
    try:
        return subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                              text=True, timeout=120).stdout.strip()
    except OSError:
        return "?"


if __name__ == "__main__":
    sys.exit(main())
