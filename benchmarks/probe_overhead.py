"""Probe overhead per training step on the emulated neuron device: `neuron-migrate probe` vs a plain loop.

For each model (a probe factory target) the same step (forward, loss, backward, AdamW step) runs

- plain: in a fresh process with the emulated device installed and nothing else (no recorder);
- probed: under `neuron-migrate probe TARGET --steps N` (recorder, site tagging, device tracking);

and the ratio of the steady-state step times (median over steps 2..N) is reported. Target: <= 3x.

    python benchmarks/probe_overhead.py                      # the example models (+ tiny transformers if installed)
    python benchmarks/probe_overhead.py --models mlp,gpt2 --steps 8 --out /tmp/overhead.md

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

PLAIN = r'''
import json, sys, time, torch
sys.path.insert(0, ".")
from neuron_migrate.probe import emulator
from neuron_migrate.probe.child import _load_callable, _split_inputs, _to_device
from neuron_migrate.probe.steps import loss_of
from neuron_migrate.probe.tables import choose_table
from neuron_migrate.table import load_table
emulator.install(load_table(choose_table(None)[0]))
torch.manual_seed(0)
made = _load_callable(sys.argv[1], ".")()
model, inputs = made if isinstance(made, tuple) else (made, None)
args, kwargs = _split_inputs(inputs)
dev = torch.device("neuron")
model = model.to(dev)
args, kwargs = _to_device((args, kwargs), dev)
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
times = []
for _ in range(int(sys.argv[2])):
    t0 = time.perf_counter()
    model.train()
    loss = loss_of(model(*args, **kwargs))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    times.append(time.perf_counter() - t0)
print("@@" + json.dumps(times))
'''


def plain_steps(target: str, steps: int) -> list[float]:
    p = subprocess.run([sys.executable, "-c", PLAIN, target, str(steps)], cwd=REPO, capture_output=True, text=True,
                       timeout=1800)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("@@")), None)
    if p.returncode != 0 or line is None:
        raise RuntimeError(f"plain loop failed for {target}: {p.stderr[-1500:]}")
    return json.loads(line[2:])


def probed_steps(target: str, steps: int) -> list[float]:
    p = subprocess.run([sys.executable, "-m", "neuron_migrate", "probe", target, "--format", "json", "--steps",
                        str(steps), "--device", "emulate"], cwd=REPO, capture_output=True, text=True, timeout=1800)
    try:
        rep = json.loads(p.stdout)
    except ValueError:
        raise RuntimeError(f"probe failed for {target}: {p.stderr[-1500:]}") from None
    if rep.get("status") != "ok":
        raise RuntimeError(f"probe failed for {target}: {rep.get('error')}")
    return rep["timing"]["step_times_s"]


def steady(times: list[float]) -> float:
    return statistics.median(times[1:] if len(times) > 1 else times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=None, help="comma-separated: " + ",".join(MODELS))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", default=None, help="also write the Markdown table here")
    a = ap.parse_args()
    names = a.models.split(",") if a.models else list(MODELS)
    if not a.models:
        try:
            import transformers  # noqa: F401
        except ImportError:
            names = [n for n in names if not MODELS[n].startswith("tests/probe/hf_models")]
    rows = []
    for name in names:
        target = MODELS.get(name, name)
        t0 = time.monotonic()
        plain = steady(plain_steps(target, a.steps))
        probed = steady(probed_steps(target, a.steps))
        rows.append((name, plain, probed, probed / plain))
        print(f"{name}: plain {plain * 1e3:.1f} ms/step, probed {probed * 1e3:.1f} ms/step, "
              f"{probed / plain:.2f}x ({time.monotonic() - t0:.0f} s)", flush=True)
    lines = ["| model | plain step (emulated) | probed step | ratio |", "|---|---:|---:|---:|"]
    for name, plain, probed, ratio in rows:
        mark = "" if ratio <= TARGET_RATIO else " (over target)"
        lines.append(f"| {name} | {plain * 1e3:.1f} ms | {probed * 1e3:.1f} ms | {ratio:.2f}x{mark} |")
    table = "\n".join(lines)
    print("\n" + table)
    if a.out:
        Path(a.out).write_text(f"Probe overhead per step, emulated device, {a.steps} steps, "
                               f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs\n\n{table}\n", encoding="utf-8")
    return 0 if all(r[3] <= TARGET_RATIO for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
