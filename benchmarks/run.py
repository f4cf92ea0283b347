"""Time neuron-migrate against TorchFix and Ruff on the pinned real-world corpus; write benchmarks/RESULTS.md.

    python benchmarks/run.py                 # tree "default", 3 runs per tool
    python benchmarks/run.py --quick         # tree "xla", 1 run per tool, no profile
    python benchmarks/run.py --tree xla --repeat 3 --profile

Trees (copied from the corpus to <cache>/tree-<name>/, so caches and writes never touch the corpus):
  xla      the corpus files that mention torch_xla (the set tests/test_corpus.py uses)
  default  all of torch-xla, optimum-neuron, accelerate, lightning and mosaicml, plus the transformers
           files that mention torch_xla
  full     every package, all of transformers included (TorchFix takes many minutes per run here)

Every command runs in a fresh subprocess with output to /dev/null; the tools take turns within each
repetition so that background load hits them alike. Reported per command: median wall time, lines/s, peak
memory (sum of the RSS of the command's process tree, sampled every 20 ms from /proc, and the largest single
process from wait4), and ratios to TorchFix and Ruff. TorchFix and Ruff live in their own virtual
environment (<cache>/venv), never in the project's dependencies. Commands that do not exist (for example
`neuron-migrate audit` before it was written) are marked missing instead of failing the run.
"""
from __future__ import annotations

import argparse
import datetime as dt
import io
import os
import platform
import pstats
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import corpus  # noqa: E402

TOOLS_PINS = ("torchfix==0.7.0", "ruff==0.17.6")
NOTES = "## Notes (hand-written; kept when run.py rewrites this file)"
SMALL_FILE = "optimum-neuron-0.4.5/optimum/neuron/accelerate/utils/misc.py"  # ~200 lines, torch_xla


# ---------------------------------------------------------------------------------------------------------
# environment


def tools_venv(cache: Path) -> Optional[Path]:
    """<cache>/venv with TorchFix and Ruff at pinned versions; None when it cannot be made."""
    venv = cache / "venv"
    bin_dir = venv / "bin"
    marker = venv / ".pins"
    if marker.exists() and marker.read_text() == "\n".join(TOOLS_PINS):
        return bin_dir
    try:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, capture_output=True, timeout=300)
        subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", *TOOLS_PINS],
                       check=True, capture_output=True, timeout=900)
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"warning: cannot build the TorchFix/Ruff venv ({exc}); they will be marked missing", file=sys.stderr)
        return None
    marker.write_text("\n".join(TOOLS_PINS))
    return bin_dir


def build_tree(name: str, cache: Path, limit: int = 0) -> tuple[Path, int, int]:
    """Copy the chosen corpus files to <cache>/tree-<name>/; returns (root, files, lines)."""
    trees = corpus.ensure_corpus(cache=cache, quiet=False)
    picked: list[tuple[str, Path]] = []
    for pkg, root in trees.items():
        for p in corpus.py_files(root):
            if name == "full" or (name == "default" and pkg != "transformers") or corpus.mentions_xla(p):
                picked.append((f"{corpus.BY_NAME[pkg].key}/{p.relative_to(root).as_posix()}", p))
    if limit:
        picked = picked[:limit]
    dest = cache / f"tree-{name}"
    if dest.exists():
        shutil.rmtree(dest)
    for rel, src in picked:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, target)
    return dest, len(picked), corpus.count_lines(p for _, p in picked)


def _version(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        return (out.stdout or out.stderr).strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "missing"


def machine() -> dict[str, str]:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 0
    try:
        mem = int(Path("/proc/meminfo").read_text().split()[1]) // 1024 // 1024
    except (OSError, ValueError, IndexError):
        mem = 0
    return {"cpu": cpu, "cores": str(cores), "memory": f"{mem} GiB", "os": platform.platform(), "python": platform.python_version()}


def git_rev() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "neuron_migrate"], cwd=REPO, capture_output=True, text=True, timeout=30).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


# ---------------------------------------------------------------------------------------------------------
# measuring


@dataclass
class Run:
    wall: float
    tree_rss_kb: int  # sampled sum over the process tree
    max_rss_kb: int  # largest single process (wait4)
    rc: int


@dataclass
class Bench:
    label: str
    cmd: list[str]
    env: dict = field(default_factory=dict)
    before: Optional[object] = None  # callable run before each timed run (e.g. clear a cache)
    runs: list[Run] = field(default_factory=list)
    missing: str = ""

    @property
    def median(self) -> float:
        return statistics.median(r.wall for r in self.runs)

    @property
    def peak_tree_mb(self) -> float:
        return max(r.tree_rss_kb for r in self.runs) / 1024

    @property
    def peak_single_mb(self) -> float:
        return max(r.max_rss_kb for r in self.runs) / 1024


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(d))
    return kids


def _tree_rss_kb(pid: int) -> int:
    kids = _children()
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo.extend(kids.get(p, ()))
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)
        except (OSError, ValueError, IndexError):
            pass
    return total


def measure(cmd: list[str], cwd: Path, env: dict, sample: bool = True) -> Run:
    full_env = dict(os.environ, NO_COLOR="1", **env)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=full_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak = 0
    status = rusage = None
    while True:
        pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if sample and os.path.isdir("/proc"):
            peak = max(peak, _tree_rss_kb(proc.pid))
        time.sleep(0.02)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return Run(wall, max(peak, rusage.ru_maxrss), rusage.ru_maxrss, proc.returncode)


def exists(cmd: list[str], cwd: Path) -> str:
    """'' when the command can run; else why not."""
    if not shutil.which(cmd[0]) and not Path(cmd[0]).exists():
        return f"{cmd[0]} not installed"
    probe = cmd[:2] + ["--help"] if Path(cmd[0]).name == "neuron-migrate" else [cmd[0], "--help"]
    try:
        out = subprocess.run(probe, cwd=cwd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    if out.returncode != 0:
        return f"`{' '.join(probe[1:2] or probe)}` does not exist here"
    return ""


# ---------------------------------------------------------------------------------------------------------
# the run


def neuron_migrate_bin() -> str:
    found = Path(sys.executable).with_name("neuron-migrate")
    return str(found) if found.exists() else (shutil.which("neuron-migrate") or "neuron-migrate")


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tree xla, 1 run per tool, no profile")
    ap.add_argument("--tree", choices=("xla", "default", "full"), default=None)
    ap.add_argument("--repeat", type=int, default=None, help="timed runs per command (default 3; 1 with --quick)")
    ap.add_argument("--profile", action=argparse.BooleanOptionalAction, default=None,
                    help="cProfile `audit` in one process on the tree (default: on, off with --quick)")
    ap.add_argument("--limit", type=int, default=0, help="only the first N files of the tree (smoke tests)")
    ap.add_argument("--out", default=str(HERE / "RESULTS.md"), help="Markdown file to write")
    args = ap.parse_args(argv)
    tree_name = args.tree or ("xla" if args.quick else "default")
    repeat = args.repeat or (1 if args.quick else 3)
    profile = (not args.quick) if args.profile is None else args.profile
    cache = corpus.cache_dir()

    try:
        tree, n_files, n_lines = build_tree(tree_name, cache, args.limit)
    except corpus.CorpusUnavailable as exc:
        print(f"error: corpus unavailable: {exc}", file=sys.stderr)
        return 2
    small = tree / SMALL_FILE
    if not small.exists():
        by_size = sorted(tree.rglob("*.py"), key=lambda p: p.stat().st_size)
        small = by_size[len(by_size) // 2]
    small_lines = corpus.count_lines([small])
    tools = tools_venv(cache)
    nm = neuron_migrate_bin()
    nm_cache = cache / "nm-result-cache"
    clear_cache = lambda: shutil.rmtree(nm_cache, ignore_errors=True)  # noqa: E731
    cache_env = {"NEURON_MIGRATE_CACHE_DIR": str(nm_cache)}
    tf = str(tools / "torchfix") if tools else "torchfix"
    ruff = str(tools / "ruff") if tools else "ruff"
    load_before = os.getloadavg()
    print(f"tree {tree_name}: {n_files} files, {n_lines} lines in {tree}; {repeat} runs per command", file=sys.stderr)

    main_benches = [
        Bench("neuron-migrate audit", [nm, "audit", "--output-format", "concise", "--no-cache", "."]),
        Bench("neuron-migrate rewrite (no write)", [nm, "rewrite", "--quiet", "--no-cache", "."]),
        Bench("torchfix", [tf, "."]),
        Bench("ruff check --select ALL --no-cache", [ruff, "check", "--select", "ALL", "--no-cache", "--exit-zero", "."]),
    ]
    cache_benches = [
        Bench("audit, cache empty (cold)", [nm, "audit", "--output-format", "concise", "."], cache_env, clear_cache),
        Bench("audit, second run (warm)", [nm, "audit", "--output-format", "concise", "."], cache_env),
        Bench("rewrite, cache empty (cold)", [nm, "rewrite", "--quiet", "."], cache_env, clear_cache),
        Bench("rewrite, second run (warm)", [nm, "rewrite", "--quiet", "."], cache_env),
    ]
    small_benches = [
        Bench("neuron-migrate audit FILE", [nm, "audit", "--output-format", "concise", "--no-cache", str(small)]),
        Bench("neuron-migrate rewrite FILE", [nm, "rewrite", "--quiet", "--no-cache", str(small)]),
        Bench("torchfix FILE", [tf, str(small)]),
        Bench("ruff check --select ALL FILE", [ruff, "check", "--select", "ALL", "--no-cache", "--exit-zero", str(small)]),
    ]
    for b in main_benches + cache_benches + small_benches:
        b.missing = exists(b.cmd, tree)
        if not b.missing and b.cmd[1:2] and b.cmd[1] in ("audit", "rewrite") and "--no-cache" in b.cmd:
            help_text = subprocess.run([nm, b.cmd[1], "--help"], capture_output=True, text=True).stdout
            if "--no-cache" not in help_text:
                b.cmd.remove("--no-cache")
        if b.missing:
            print(f"  missing: {b.label}: {b.missing}", file=sys.stderr)

    def timed(b: Bench, sample: bool = True) -> None:
        if b.missing:
            return
        if b.before:
            b.before()
        r = measure(b.cmd, tree, b.env, sample)
        b.runs.append(r)
        print(f"  {b.label}: {r.wall:.2f}s rc={r.rc} tree-rss={r.tree_rss_kb // 1024} MB", file=sys.stderr)

    for b in small_benches:  # warm the page cache and the Python bytecode caches; not counted
        if not b.missing:
            measure(b.cmd, tree, b.env, sample=False)
    for i in range(repeat):
        print(f"repetition {i + 1}/{repeat}", file=sys.stderr)
        for b in main_benches:
            timed(b)
        # cold then warm, pairwise
        for b in cache_benches:
            timed(b)
        for _ in range(3):  # small files are quick: more samples
            for b in small_benches:
                timed(b)
    load_after = os.getloadavg()

    prof_text = run_profile(nm, tree) if profile else ""
    versions = {
        # `neuron-migrate --version` answers "Missing command" at the time of writing: ask the package
        "neuron-migrate": f"{_version([str(Path(nm).with_name('python')), '-c', 'import neuron_migrate; print(neuron_migrate.__version__)'])} (git {git_rev()})",
        "torchfix": _version([tf, "--version"]),
        "ruff": _version([ruff, "--version"]),
        "libcst (torchfix venv)": _version([str(tools / "python"), "-c", "import libcst, importlib.metadata as m; print(m.version('libcst'))"]) if tools else "missing",
        "libcst (neuron-migrate)": _version([sys.executable, "-c", "import importlib.metadata as m; print(m.version('libcst'))"]),
    }
    text = render(tree_name, n_files, n_lines, repeat, main_benches, cache_benches, small_benches, small, small_lines,
                  tree, versions, load_before, load_after, prof_text)
    out = Path(args.out)
    if out.exists() and NOTES in out.read_text():  # the hand-written analysis survives a re-run
        text += "\n" + NOTES + out.read_text().split(NOTES, 1)[1]
    out.write_text(text)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def run_profile(nm: str, tree: Path) -> str:
    """cProfile of `audit` in a single process (-j 1, no cache): top 20 by own time and by cumulative time."""
    out = tree.parent / "audit.prof"
    py = Path(nm).with_name("python")
    py = str(py) if py.exists() else sys.executable
    cmd = [py, "-m", "cProfile", "-o", str(out), "-m", "neuron_migrate", "audit", "--output-format", "concise",
           "--no-cache", "-j", "1", "."]
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    if not out.exists():
        return "(profile failed)"
    parts = [f"Single process (`-j 1 --no-cache`), {wall:.1f} s under the profiler.\n"]
    for key in ("tottime", "cumulative"):
        buf = io.StringIO()
        st = pstats.Stats(str(out), stream=buf)
        st.strip_dirs().sort_stats(key).print_stats(20)
        body = buf.getvalue()
        body = body[body.find("   ncalls"):] if "   ncalls" in body else body
        parts.append(f"Top 20 by {key}:\n\n```\n{body.rstrip()}\n```\n")
    return "\n".join(parts)


def paired(a: Bench, b: Bench) -> Optional[float]:
    """Median over repetitions of b's wall time / a's wall time in the same repetition (a's speed-up over b).

    Both ran back to back within each repetition, so a change of background load between repetitions
    cancels out; the ratio of the two medians does not have that property."""
    pairs = [rb.wall / ra.wall for ra, rb in zip(a.runs, b.runs) if ra.wall > 0]
    return statistics.median(pairs) if pairs else None


def _fmt(x: Optional[float], unit: str = "") -> str:
    return "-" if x is None else f"{x:,.2f}{unit}" if x < 100 else f"{x:,.0f}{unit}"


def render(tree_name, n_files, n_lines, repeat, main_benches, cache_benches, small_benches, small, small_lines, tree,
           versions, load_before, load_after, prof_text) -> str:
    m = machine()
    by = {b.label: b for b in main_benches + cache_benches + small_benches}

    def lps(b: Bench, lines: int) -> Optional[float]:
        return lines / b.median if b.runs else None

    tf, ruff = by["torchfix"], by["ruff check --select ALL --no-cache"]
    lines = [
        "# Benchmark results",
        "",
        f"Written by `python benchmarks/run.py {' '.join(sys.argv[1:])}`".rstrip() + f" on {dt.datetime.now().strftime('%Y-%m-%d %H:%M')}.",
        "",
        f"- machine: {m['cpu']}, {m['cores']} cores, {m['memory']}, {m['os']}, Python {m['python']}",
        f"- load average (1, 5, 15 min): {', '.join(f'{x:.1f}' for x in load_before)} before, "
        f"{', '.join(f'{x:.1f}' for x in load_after)} after (other jobs shared the machine: compare the ratios, "
        "measured in the same run, rather than absolute times)",
        *[f"- {k}: {v}" for k, v in versions.items()],
        f"- tree `{tree_name}`: {n_files} files, {n_lines:,} lines (`{tree}`); corpus: "
        + ", ".join(p.key for p in corpus.PACKAGES) + " (all pinned versions exist on PyPI; none substituted)",
        f"- {repeat} timed run(s) per command, tools taking turns; medians; output to /dev/null",
        "",
        "## Whole tree",
        "",
        "Speed ratios are medians of the per-repetition ratios (the tools ran back to back within a",
        "repetition); `runs` lists every timed run in order.",
        "",
        "| command | median wall (s) | runs (s) | lines/s | peak RSS, process tree (MB) | peak RSS, largest process (MB) | speed vs TorchFix | speed vs Ruff |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for b in main_benches:
        if b.missing or not b.runs:
            lines.append(f"| `{b.label}` | missing: {b.missing or 'no run'} | | | | | | |")
            continue
        rate = lps(b, n_lines)
        vs_tf = paired(b, tf) if tf.runs else None
        vs_ruff = paired(b, ruff) if ruff.runs else None
        runs = ", ".join(f"{r.wall:.2f}" for r in b.runs)
        lines.append(f"| `{b.label}` | {_fmt(b.median)} | {runs} | {_fmt(rate)} | {_fmt(b.peak_tree_mb)} | {_fmt(b.peak_single_mb)} | "
                     f"{_fmt(vs_tf, 'x')} | {_fmt(vs_ruff, 'x')} |")
    lines += ["", "## Cache: cold and warm (same tree, unchanged between the two runs)", "",
              "| command | median wall (s) | warm / cold |", "|---|---:|---:|"]
    for cold, warm in ((cache_benches[0], cache_benches[1]), (cache_benches[2], cache_benches[3])):
        for b in (cold, warm):
            if b.missing or not b.runs:
                lines.append(f"| `{b.label}` | missing: {b.missing or 'no run'} | |")
                continue
            r = paired(cold, warm) if b is warm and cold.runs else None
            ratio = f"{100 * r:.1f}%" if r is not None else ""
            lines.append(f"| `{b.label}` | {_fmt(b.median)} | {ratio} |")
    lines += ["", f"## One small file (the pre-commit case): `{small.relative_to(tree)}`, {small_lines} lines", "",
              "| command | median wall (s) | peak RSS, largest process (MB) |", "|---|---:|---:|"]
    for b in small_benches:
        if b.missing or not b.runs:
            lines.append(f"| `{b.label}` | missing: {b.missing or 'no run'} | |")
            continue
        lines.append(f"| `{b.label}` | {b.median:.3f} | {_fmt(b.peak_single_mb)} |")
    lines += ["", "## Targets", ""]
    lines += targets(by, n_lines)
    if prof_text:
        lines += ["", "## Profile of `neuron-migrate audit` on the tree", "", prof_text]
    return "\n".join(lines) + "\n"


def targets(by: dict, n_lines: int) -> list[str]:
    out = []

    def check(name, value, ok, shown):
        out.append(f"- {name}: {shown if value is not None else 'not measured'} -> "
                   f"{'met' if value is not None and ok else 'NOT met' if value is not None else 'n/a'}")

    A, RW, TF, RUFF = (by["neuron-migrate audit"], by["neuron-migrate rewrite (no write)"], by["torchfix"],
                       by["ruff check --select ALL --no-cache"])
    r1 = paired(A, TF)
    check("audit >= 20x TorchFix lines/s", r1, r1 is not None and r1 >= 20, f"{r1:.1f}x" if r1 else "")
    r2 = paired(RUFF, A)
    check("audit within 5x of Ruff (Ruff lines/s / audit lines/s <= 5)", r2, r2 is not None and r2 <= 5, f"{r2:.1f}x" if r2 else "")
    r3 = paired(RW, TF)
    check("rewrite (no write) >= 5x TorchFix lines/s", r3, r3 is not None and r3 >= 5, f"{r3:.1f}x" if r3 else "")
    for kind in ("audit", "rewrite"):
        cold, warm = by[f"{kind}, cache empty (cold)"], by[f"{kind}, second run (warm)"]
        r = paired(cold, warm)
        check(f"{kind} warm second run <= 10% of cold", r, r is not None and r <= 0.10, f"{100 * r:.1f}%" if r else "")
    s = by["neuron-migrate audit FILE"]
    v = s.median if s.runs else None
    check("audit of one small file <= 0.3 s wall", v, v is not None and v <= 0.3, f"{v:.3f} s" if v else "")
    am, tm = by["neuron-migrate audit"], by["torchfix"]
    r = am.peak_tree_mb / tm.peak_tree_mb if am.runs and tm.runs else None
    check("audit peak memory (process tree) <= TorchFix's", r, r is not None and r <= 1.0,
          f"{am.peak_tree_mb:.0f} MB vs {tm.peak_tree_mb:.0f} MB" if r else "")
    return out


if __name__ == "__main__":
    sys.exit(main())
