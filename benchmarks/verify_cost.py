"""What `neuron-migrate verify` costs against running the two programs plainly.

For a torch_xla script of examples/xla_project (default: single_device.py, one epoch = 16 steps):
- plain original: `PJRT_DEVICE=CPU <xla python> script.py` (torch 2.9 + torch_xla 2.9, XLA's CPU backend);
- plain migrated: the rewrite of the project (in a temporary copy) run with the emulated `neuron` device;
- verify: `neuron-migrate verify script.py --steps N` (both sides recorded and compared; no replay: the example
  is equivalent).
Each is run `--rounds` times (interleaved, so a busy machine slows all alike); the medians of wall-clock time and
of the children's CPU time are reported, with the per-step figures (whole run over its optimizer steps, start-up
and compilation included: that is what a user waits for).

    python benchmarks/verify_cost.py --rounds 3 --out benchmarks/VERIFY_COST.md
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _timed(cmd, **kw) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0,):
        raise SystemExit(f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    from neuron_migrate.verify.harness import copy_tree, rewrite_tree
    from neuron_migrate.verify.xla_env import find_python

    ap = argparse.ArgumentParser()
    ap.add_argument("--script", default="single_device.py")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out")
    a = ap.parse_args()
    xla = find_python()
    tmp = Path(tempfile.mkdtemp(prefix="nm-verify-cost-"))
    try:
        orig = tmp / "original"
        copy_tree(REPO / "examples" / "xla_project", orig)
        mig = tmp / "migrated"
        copy_tree(orig, mig)
        rewrite_tree(mig)
        env_x = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env_x.update(PJRT_DEVICE="CPU", OMP_NUM_THREADS="1", TF_CPP_MIN_LOG_LEVEL="3")
        env_n = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        run_migrated = ("import runpy, sys; from neuron_migrate.probe.emulator import install; install(); "
                        f"sys.argv = [{a.script!r}, '--epochs', '1']; sys.path.insert(0, '.'); "
                        f"runpy.run_path({a.script!r}, run_name='__main__')")
        cmds = {
            "plain original (torch_xla, XLA:CPU)": ([xla, a.script, "--epochs", "1"], dict(cwd=orig, env=env_x)),
            "plain migrated (emulated neuron)": ([sys.executable, "-c", run_migrated], dict(cwd=mig, env=env_n)),
            "verify (both sides, recorded, compared)": (
                [sys.executable, "-m", "neuron_migrate", "verify", str(orig / a.script), "--steps", str(a.steps),
                 "--format", "json", "--", "--epochs", "1"], dict(cwd=REPO, env=env_n)),
        }
        times: dict = {k: [] for k in cmds}
        for _ in range(a.rounds):
            for name, (cmd, kw) in cmds.items():
                times[name].append(_timed(cmd, timeout=1800, **kw))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rows = []
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in times.items()}
    plain = sum(w for k, (w, _) in med.items() if k.startswith("plain"))
    plain_cpu = sum(c for k, (_, c) in med.items() if k.startswith("plain"))
    for name, (wall, cpu) in med.items():
        rows.append(f"| {name} | {wall:.1f} s | {cpu:.1f} s | {wall / a.steps:.2f} s |")
    verify_wall, verify_cpu = med["verify (both sides, recorded, compared)"]
    text = (f"# verify's cost\n\n`python benchmarks/verify_cost.py --rounds {a.rounds}` on examples/xla_project/{a.script}, "
            f"{a.steps} optimizer steps, medians of {a.rounds} interleaved rounds (machine: {os.cpu_count()} cores, "
            f"shared).\n\n| run | wall | CPU | wall per step |\n|---|---|---|---|\n" + "\n".join(rows) +
            f"\n\nverify against the two plain runs one after the other: {verify_wall / plain:.2f}x "
            f"({verify_wall:.1f} s against {plain:.1f} s) wall-clock, {verify_cpu / plain_cpu:.2f}x in CPU time "
            f"({verify_cpu:.1f} s against {plain_cpu:.1f} s; on a shared machine wall-clock time includes waiting for "
            "a core). Most of each run is start-up (importing torch, torch_xla's "
            "PJRT client, the emulated device) and XLA's compilation of its two graphs; the recording itself keeps "
            "a detached copy of the loss, gradients and parameters per step. A diverging run also replays the first "
            "diverging step on both sides (about one more run of each, up to that step).\n")
    print(text)
    if a.out:
        Path(a.out).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
