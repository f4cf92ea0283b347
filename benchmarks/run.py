"""Time neuron-migrate against TorchFix and Ruff on the pinned real-world corpus; write benchmarks/RESULTS.md.

    python benchmarks/run.py                 # tree "torch", 3 runs per tool, every issue-14 target
    python benchmarks/run.py --quick         # tree "xla", 1 run per tool, 1 MB generated file, no profile
    python benchmarks/run.py --quick --limit 12 --out /tmp/smoke.md    # smoke test of the runner itself
    python benchmarks/run.py --tree packages --repeat 3 --profile

Trees (copied from the corpus to <cache>/tree-<name>/, so caches and writes never touch the corpus):
  torch     the torch-heavy tree (default): the files of torch-xla, optimum-neuron, accelerate, lightning
            and mosaicml that import torch or torch_xla, plus the transformers files that import torch_xla
            (all 1,330 transformers files that import torch would make TorchFix take ~8 min per pass)
  xla       the corpus files that mention torch_xla (the set tests/test_corpus.py uses)
  packages  all of torch-xla, optimum-neuron, accelerate, lightning and mosaicml, plus the transformers
            files that mention torch_xla (called "default" before the torch tree existed; still accepted)
  full      every package, all of transformers included (TorchFix takes many minutes per run here)

Besides the tree, every run times `audit FILE` and `rewrite FILE` on a fixed set of single files (copied to
<cache>/single/), and `audit` on a generated file of --big-mb MB (written once to <cache>/generated/, never
to the repository). Every command runs in a fresh subprocess with output to /dev/null; the tools take turns
within each repetition so that background load hits them alike. Reported per command: median wall time,
lines/s, peak memory (sum of the RSS of the command's process tree, sampled every 20 ms from /proc, and the
largest single process, read through GNU time where it is installed), and ratios to TorchFix and Ruff. TorchFix and Ruff live in their own
virtual environment (<cache>/venv), never in the project's dependencies. Commands that do not exist are
marked missing instead of failing the run. No unit test is ever timed: speed targets live here only.
"""
from __future__ import annotations

import argparse
import datetime as dt
import ast
import hashlib
import io
import json
import os
import re
import signal
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
# The single files timed with `audit FILE` and `rewrite FILE` (corpus-relative), and why each is there.
SINGLE_FILES: tuple[tuple[str, str], ...] = (
    (SMALL_FILE, "small torch_xla file"),
    ("lightning-2.6.6/lightning/pytorch/utilities/compile.py", "calls torch.compile (touches the table)"),
    ("transformers-5.24.0/transformers/trainer.py", "large torch_xla file"),
    ("lightning-2.6.6/lightning/pytorch/trainer/trainer.py", "large torch file"),
)
# The template of the generated large file: a torch_xla training file whose top-level functions and classes
# are repeated with renamed names.
BIG_TEMPLATE = "optimum-neuron-0.4.5/optimum/neuron/trainers/transformers.py"
BIG_LIMIT_S = 300  # a generated-file audit still running after this is killed and reported as such
TORCH_IMPORT = re.compile(rb"^[ \t]*(?:import|from)[ \t]+torch(?:_xla)?(?:[. \t,]|$)", re.M)
XLA_IMPORT = re.compile(rb"^[ \t]*(?:import|from)[ \t]+torch_xla(?:[. \t,]|$)", re.M)


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


def _imports(path: Path, pattern: re.Pattern) -> bool:
    try:
        return bool(pattern.search(path.read_bytes()))
    except OSError:
        return False


def picks(name: str, pkg: str, path: Path) -> bool:
    """Whether corpus file `path` of package `pkg` belongs to tree `name`."""
    if name == "full":
        return True
    if name == "packages":
        return pkg != "transformers" or corpus.mentions_xla(path)
    if name == "torch":
        return _imports(path, XLA_IMPORT if pkg == "transformers" else TORCH_IMPORT)
    return corpus.mentions_xla(path)  # xla


def build_tree(name: str, cache: Path, limit: int = 0) -> tuple[Path, int, int]:
    """Copy the chosen corpus files to <cache>/tree-<name>/; returns (root, files, lines)."""
    trees = corpus.ensure_corpus(cache=cache, quiet=False)
    picked: list[tuple[str, Path]] = []
    for pkg, root in trees.items():
        for p in corpus.py_files(root):
            if picks(name, pkg, p):
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


def copy_singles(cache: Path) -> list[tuple[Path, str]]:
    """The single files, copied to <cache>/single/ (away from any tree and its cache); [(path, why)]."""
    dest_root = cache / "single"
    if dest_root.exists():
        shutil.rmtree(dest_root)
    out = []
    for rel, why in SINGLE_FILES:
        src = cache / "corpus" / rel
        if not src.exists():
            print(f"warning: single file {rel} is not in the corpus; skipped", file=sys.stderr)
            continue
        target = dest_root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, target)
        out.append((target, why))
    return out


def generate_big(cache: Path, megabytes: float) -> tuple[Path, int]:
    """A deterministic generated file of at least `megabytes` MB (10**6 bytes): BIG_TEMPLATE's imports once,
    then its top-level functions and classes again and again, every name they bind suffixed with _<n>.
    Written once to <cache>/generated/; returns (path, lines)."""
    src = (cache / "corpus" / BIG_TEMPLATE).read_text(encoding="utf-8")
    module = ast.parse(src)
    first = next(i for i, st in enumerate(module.body) if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))
    st = module.body[first]
    start = min([st.lineno] + [d.lineno for d in getattr(st, "decorator_list", [])])
    lines = src.splitlines(keepends=True)
    header, body = "".join(lines[:start - 1]), "".join(lines[start - 1:])
    bound: set[str] = set()
    for st in module.body[first:]:
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(st.name)
        elif isinstance(st, (ast.Assign, ast.AnnAssign)):
            for t in (st.targets if isinstance(st, ast.Assign) else [st.target]):
                bound.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
    rename = re.compile(r"\b(" + "|".join(map(re.escape, sorted(bound))) + r")\b")
    key = hashlib.sha256(src.encode() + repr(megabytes).encode()).hexdigest()[:10]
    path = cache / "generated" / f"generated-{megabytes:g}mb-{key}.py"
    if path.exists():
        return path, corpus.count_lines([path])
    target = int(megabytes * 1_000_000)
    parts, size, n = [header], len(header.encode()), 0
    while size < target:
        chunk = f"\n\n# copy {n}\n" + rename.sub(lambda m: f"{m.group(1)}_{n}", body)
        if n == 0:
            compile(header + chunk, str(path), "exec", ast.PyCF_ONLY_AST)  # a renamed copy still parses
        parts.append(chunk)
        size += len(chunk.encode())
        n += 1
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(parts), encoding="utf-8")
    os.replace(tmp, path)
    return path, corpus.count_lines([path])


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
    timed_out: bool = False
    cpu: float = 0.0  # user + system seconds of the process and the children it waited for (wait4)


@dataclass
class Bench:
    label: str
    cmd: list[str]
    env: dict = field(default_factory=dict)
    before: Optional[object] = None  # callable run before each timed run (e.g. clear a cache)
    runs: list[Run] = field(default_factory=list)
    missing: str = ""
    cwd: Optional[Path] = None  # default: the tree
    sample: bool = True  # sample the process tree's RSS (costs a little CPU; off for sub-second commands)
    limit: Optional[float] = None  # kill after this many seconds
    lines: int = 0  # lines the command reads (for lines/s)

    @property
    def median(self) -> float:
        return statistics.median(r.wall for r in self.runs)

    @property
    def cpu(self) -> float:
        """Median CPU seconds: less sensitive to other jobs than wall time, though not immune (caches, SMT)."""
        return statistics.median(r.cpu for r in self.runs)

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


def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)
    except (OSError, ValueError, IndexError):
        return 0


def _tree_rss_kb(pid: int) -> int:
    kids = _children()
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo.extend(kids.get(p, ()))
        total += _rss_kb(p)
    return total


def _gnu_time() -> Optional[str]:
    """GNU time, when installed: the largest process's peak RSS is read through it (see measure)."""
    path = shutil.which("time") or ("/usr/bin/time" if os.path.exists("/usr/bin/time") else None)
    if path is None:
        return None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return path if "GNU" in out.stdout + out.stderr else None


GNU_TIME = _gnu_time()
# The peak RSS wait4 reports for a child includes the RSS its parent had when it forked it (Linux keeps the
# high-water mark across fork and exec): a command started by this runner, once the runner has grown (it writes
# the 15 MB generated file), would report at least the runner's size. GNU time, a small process, starts the
# command and reports its own child's peak instead; without it the figure is a floor of the runner's size.
RSS_SOURCE = ("GNU time's report of the command's own process (%M)" if GNU_TIME else
              "wait4 (no GNU time here: at least this runner's own RSS when it started the command)")


def measure(cmd: list[str], cwd: Path, env: dict, sample: bool = True, limit: Optional[float] = None) -> Run:
    import tempfile
    import threading

    full_env = dict(os.environ, NO_COLOR="1", **env)
    # Users run with bytecode caches (pip writes them at install); a PYTHONDONTWRITEBYTECODE=1 left in the
    # environment would recompile every module of neuron-migrate on every run (~0.1-0.5 s of CPU here).
    full_env.pop("PYTHONDONTWRITEBYTECODE", None)
    rss_file = None
    if GNU_TIME:
        fd, rss_file = tempfile.mkstemp(prefix="nm-bench-rss-")
        os.close(fd)
        cmd = [GNU_TIME, "-f", "%M", "-o", rss_file, "--", *cmd]
    peak = [0]
    timed_out = [False]
    stop = threading.Event()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=full_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)

    def watch() -> None:
        # RSS samples and the time limit, every 20 ms, in a thread: the main thread waits for the exit itself,
        # so the wall time ends when the command does (polling would round it up to the next 20 ms)
        while not stop.wait(0.02):
            if sample and os.path.isdir("/proc"):
                kb = _tree_rss_kb(proc.pid)
                if GNU_TIME:
                    kb -= _rss_kb(proc.pid)  # GNU time itself is not part of the command
                peak[0] = max(peak[0], kb)
            if limit is not None and not timed_out[0] and time.perf_counter() - t0 > limit:
                timed_out[0] = True
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    _, status, rusage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    stop.set()
    watcher.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    max_rss = rusage.ru_maxrss
    if rss_file is not None:
        try:
            lines = Path(rss_file).read_text().split()
            max_rss = int(lines[-1])
        except (OSError, ValueError, IndexError):
            max_rss = peak[0]  # killed before GNU time wrote it: the samples (wait4's figure is the runner's)
        finally:
            os.unlink(rss_file)
    return Run(wall, max(peak[0], max_rss), max_rss, proc.returncode, timed_out[0],
               rusage.ru_utime + rusage.ru_stime)


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


def installed_bin(cache: Path) -> Optional[str]:
    """`neuron-migrate` from a regular (not editable) install of this checkout, as `pip install neuron-migrate` gives
    users: an editable install starts through an import hook that costs ~50 ms per run, a third of a one-file
    audit. The venv reuses this interpreter's installed dependencies (a .pth line) and is kept per commit. None
    (and the caller falls back to this venv's command) when it cannot be built or the tree has uncommitted changes."""
    rev = git_rev()
    if rev in ("unknown",) or rev.endswith("+dirty"):
        return None
    venv = cache / "nm-installed"
    bin_path = venv / "bin" / "neuron-migrate"
    marker = venv / ".rev"
    if marker.exists() and marker.read_text() == rev and bin_path.exists():
        return str(bin_path)
    try:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, capture_output=True, timeout=300)
        py = venv / "bin" / "python"
        site_dir = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  check=True, capture_output=True, text=True, timeout=60).stdout.strip()
        # this interpreter's site directories (with those its .pth files add): plain paths, so their own .pth hooks
        # (the editable install's finder among them) do not run in the installed copy
        deps = [p for p in sys.path if p.rstrip("/").endswith("site-packages")]
        Path(site_dir, "zz-bench-deps.pth").write_text("".join(d + "\n" for d in deps))
        subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", str(REPO)],
                       check=True, capture_output=True, timeout=900)
        found = subprocess.run([str(py), "-c", "import neuron_migrate; print(neuron_migrate.__file__)"], cwd=str(venv),
                               check=True, capture_output=True, text=True, timeout=60).stdout.strip()
        if not found.startswith(str(venv)):
            raise RuntimeError(f"the installed copy is shadowed by {found}")
    except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
        print(f"warning: cannot build an installed copy of neuron-migrate ({exc}); timing this venv's", file=sys.stderr)
        return None
    marker.write_text(rev)
    return str(bin_path)


def _load() -> tuple[float, float, float]:
    try:
        return os.getloadavg()
    except OSError:
        return (0.0, 0.0, 0.0)


# The editor case: the language server (`neuron-migrate server`) is a resident process, so what an edit costs is one
# check of the buffer's new text in a process that has already loaded the rules and the table. Timed in one process
# per repetition (an editor session with these files open), through the server's own Checker, without LSP framing.
EDITOR_CHECKS = 10  # checks of an edited buffer per file and repetition
EDITOR_SCRIPT = r"""
import json, sys, time
from neuron_migrate.server.core import Checker
try:
    from neuron_migrate.pipeline.parallel import tune_gc
    tune_gc()  # what `neuron-migrate server` does when it starts (older versions: nothing)
except ImportError:
    pass
out = {}
checker = Checker()
for path in sys.argv[2:]:
    text = open(path, encoding="utf-8").read()
    checker.check(text, path)  # the document's first check (didOpen): not counted
    times = []
    for i in range(int(sys.argv[1])):
        edited = text + f"\n# edit {i}\n"  # each didChange hands the server a new text
        t = time.perf_counter()
        findings, error = checker.check(edited, path)
        times.append(time.perf_counter() - t)
        assert error is None, error
    out[path] = times
print(json.dumps(out))
"""


def editor_checks(py: Path, paths: list, checks: int) -> dict:
    """{path: [seconds per check]} from one resident Checker, or {} when the server's code is missing."""
    try:
        r = subprocess.run([str(py), "-c", EDITOR_SCRIPT, str(checks), *map(str, paths)], capture_output=True,
                           text=True, timeout=600)
        return {Path(k): v for k, v in json.loads(r.stdout).items()} if r.returncode == 0 else {}
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return {}


MODEL_TIMER = """
import resource, sys, tempfile, time
from pathlib import Path
from neuron_migrate.repository.model import RepositoryModel as M
from neuron_migrate.pipeline import repository_facts as rf
def clock():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), r.ru_utime + r.ru_stime
def since(t):
    w, c = clock()
    return [w - t[0], c - t[1]]
t = clock(); m = M.build(sys.argv[1]); m.all_facts(); cold = since(t)
t = clock(); M.build(sys.argv[1], m.records).all_facts(); records = since(t)
folder = Path(tempfile.mkdtemp())
rf.root_facts(sys.argv[1], folder); rf._KNOWN.clear()
t = clock(); rf.root_facts(sys.argv[1], folder); unchanged = since(t)
print(*cold, *records, *unchanged, len(m.py), len(set(m.entries)), sum(1 for v in m.modes.values() if v != {"single"}))
"""


def repository_model_times(py: str, tree: Path, repeat: int) -> dict:
    """The repository model's own cost on the tree (neuron_migrate/repository/), in a fresh process each time, as
    (wall, CPU) seconds: cold (every file read and line-scanned, every file's answers computed), from cached scan
    records (a walk, a stat per file, the graph and the answers), and unchanged (a walk, then the cached answers)."""
    runs: dict = {"cold": [], "records": [], "unchanged": []}
    info = None
    for _ in range(repeat):
        p = subprocess.run([py, "-c", MODEL_TIMER, str(tree)], capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            return {"error": (p.stderr or p.stdout).strip().splitlines()[-1:] or ["failed"]}
        v = p.stdout.split()
        for k, i in (("cold", 0), ("records", 2), ("unchanged", 4)):
            runs[k].append((float(v[i]), float(v[i + 1])))
        info = [int(x) for x in v[6:9]]
    return {**runs, "files": info[0], "entries": info[1], "distributed": info[2]}


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tree xla, 1 run per tool, 1 MB generated file, no profile")
    ap.add_argument("--tree", choices=("torch", "xla", "packages", "default", "full"), default=None,
                    help="default: torch (xla with --quick); `default` is the old name of `packages`")
    ap.add_argument("--repeat", type=int, default=None, help="timed runs per command (default 3; 1 with --quick)")
    ap.add_argument("--samples", type=int, default=None,
                    help="timed runs per single-file command in each repetition (default 3; 1 with --quick)")
    ap.add_argument("--big-mb", type=float, default=None,
                    help="size of the generated file in MB, 0 to skip it (default 15; 1 with --quick)")
    ap.add_argument("--profile", action=argparse.BooleanOptionalAction, default=None,
                    help="cProfile `audit` in one process on the tree (default: on, off with --quick)")
    ap.add_argument("--limit", type=int, default=0, help="only the first N files of the tree (smoke tests)")
    ap.add_argument("--out", default=str(HERE / "RESULTS.md"), help="Markdown file to write")
    args = ap.parse_args(argv)
    tree_name = args.tree or ("xla" if args.quick else "torch")
    tree_name = "packages" if tree_name == "default" else tree_name
    repeat = args.repeat or (1 if args.quick else 3)
    samples = args.samples or (1 if args.quick else 3)
    big_mb = (1.0 if args.quick else 15.0) if args.big_mb is None else args.big_mb
    profile = (not args.quick) if args.profile is None else args.profile
    cache = corpus.cache_dir()
    started = time.perf_counter()

    try:
        tree, n_files, n_lines = build_tree(tree_name, cache, args.limit)
    except corpus.CorpusUnavailable as exc:
        print(f"error: corpus unavailable: {exc}", file=sys.stderr)
        return 2
    singles = copy_singles(cache)
    small = cache / "single" / SMALL_FILE
    big, big_lines = generate_big(cache, big_mb) if big_mb > 0 else (None, 0)
    tools = tools_venv(cache)
    installed = installed_bin(cache)
    nm = installed or neuron_migrate_bin()
    nm_cache = cache / "nm-result-cache"
    clear_cache = lambda: shutil.rmtree(nm_cache, ignore_errors=True)  # noqa: E731
    cache_env = {"NEURON_MIGRATE_CACHE_DIR": str(nm_cache)}
    tf = str(tools / "torchfix") if tools else "torchfix"
    ruff = str(tools / "ruff") if tools else "ruff"
    audit = [nm, "audit", "--output-format", "concise"]
    print(f"tree {tree_name}: {n_files} files, {n_lines} lines in {tree}; {repeat} runs per command", file=sys.stderr)

    main_benches = [
        Bench("neuron-migrate audit", audit + ["--no-cache", "."], lines=n_lines),
        Bench("neuron-migrate rewrite (no write)", [nm, "rewrite", "--quiet", "--no-cache", "."], lines=n_lines),
        Bench("torchfix", [tf, "."], lines=n_lines),
        Bench("ruff check --select ALL --no-cache", [ruff, "check", "--select", "ALL", "--no-cache", "--exit-zero", "."],
              lines=n_lines),
    ]
    jobs_benches = [
        Bench(f"neuron-migrate audit -j {j}", audit + ["--no-cache", "-j", str(j), "."], lines=n_lines) for j in (1, 2)
    ]
    cache_benches = [
        Bench("audit, cache empty (cold)", audit + ["."], cache_env, clear_cache, lines=n_lines),
        Bench("audit, second run (warm)", audit + ["."], cache_env, lines=n_lines),
        Bench("rewrite, cache empty (cold)", [nm, "rewrite", "--quiet", "."], cache_env, clear_cache, lines=n_lines),
        Bench("rewrite, second run (warm)", [nm, "rewrite", "--quiet", "."], cache_env, lines=n_lines),
    ]
    single_benches = []  # [(path, why, lines, changes, audit bench, rewrite bench)]
    for path, why in singles:
        check = subprocess.run([nm, "rewrite", "--check", "--no-cache", str(path)], cwd=path.parent,
                               capture_output=True, timeout=600)
        changes = {0: False, 1: True}.get(check.returncode)  # None: rewrite failed on it
        kw = dict(cwd=path.parent, sample=False, lines=corpus.count_lines([path]))
        short = f"{path.parent.name}/{path.name}"
        single_benches.append((path, why, kw["lines"], changes,
                               Bench(f"audit FILE ({short})", audit + ["--no-cache", str(path)], **kw),
                               Bench(f"rewrite FILE ({short})", [nm, "rewrite", "--quiet", "--no-cache", str(path)], **kw)))
    py = Path(nm).with_name("python")
    small_ref = [
        Bench("python -c pass (interpreter start-up)", [str(py) if py.exists() else sys.executable, "-c", "pass"],
              cwd=small.parent, sample=False),
        Bench("neuron-migrate --version (CLI start-up)", [nm, "--version"], cwd=small.parent, sample=False),
        Bench("torchfix FILE", [tf, str(small)], cwd=small.parent, sample=False),
        Bench("ruff check --select ALL FILE", [ruff, "check", "--select", "ALL", "--no-cache", "--exit-zero", str(small)],
              cwd=small.parent, sample=False),
    ] if small.exists() else []
    big_benches = [
        Bench("neuron-migrate audit BIG", audit + ["--no-cache", str(big)], cwd=big.parent, limit=BIG_LIMIT_S, lines=big_lines),
        Bench("ruff check --select ALL BIG", [ruff, "check", "--select", "ALL", "--no-cache", "--exit-zero", str(big)],
              cwd=big.parent, limit=BIG_LIMIT_S, lines=big_lines),
    ] if big else []
    # the single files in one command, as a pre-commit run of a commit touching them all gets them: on every core,
    # and with -j 1 for comparison
    few = [path for path, _why in singles]
    few_kw = dict(cwd=corpus.cache_dir() / "single", sample=False, lines=corpus.count_lines(few))
    few_benches = [
        Bench(f"audit {len(few)} FILES", audit + ["--no-cache", *map(str, few)], **few_kw),
        Bench(f"audit -j 1 {len(few)} FILES", audit + ["--no-cache", "-j", "1", *map(str, few)], **few_kw),
    ] if len(few) >= 2 else []
    file_benches = [b for s in single_benches for b in s[4:]] + small_ref + few_benches
    everything = main_benches + jobs_benches + cache_benches + file_benches + big_benches
    for b in everything:
        b.missing = exists(b.cmd, b.cwd or tree)
        if not b.missing and b.cmd[1:2] and b.cmd[1] in ("audit", "rewrite") and "--no-cache" in b.cmd:
            help_text = subprocess.run([nm, b.cmd[1], "--help"], capture_output=True, text=True).stdout
            if "--no-cache" not in help_text:
                b.cmd.remove("--no-cache")
        if b.missing:
            print(f"  missing: {b.label}: {b.missing}", file=sys.stderr)
    cache_clean = subprocess.run([nm, "cache", "clean", "--help"], capture_output=True, timeout=120).returncode == 0

    def timed(b: Bench) -> None:
        if b.missing:
            return
        if b.before:
            b.before()
        r = measure(b.cmd, b.cwd or tree, b.env, b.sample, b.limit)
        b.runs.append(r)
        print(f"  {b.label}: {r.wall:.2f}s cpu={r.cpu:.2f}s rc={r.rc}{' TIMED OUT' if r.timed_out else ''} "
              f"tree-rss={r.tree_rss_kb // 1024} MB", file=sys.stderr)

    load_before = _load()
    loads = []
    editor: dict = {}  # path -> seconds per check of an edited buffer in the resident server
    for b in file_benches:  # warm the page cache and the Python bytecode caches; not counted
        if not b.missing and not args.quick:
            measure(b.cmd, b.cwd, b.env, sample=False)
    for i in range(repeat):
        loads.append(_load())
        print(f"repetition {i + 1}/{repeat} (load {loads[-1][0]:.1f})", file=sys.stderr)
        for b in main_benches + jobs_benches:
            timed(b)
        for b in cache_benches:  # cold then warm, pairwise
            timed(b)
        for _ in range(samples):  # single files are quick: more samples, every tool in turn
            for b in file_benches:
                timed(b)
        if py.exists():
            for path, times in editor_checks(py, few, EDITOR_CHECKS).items():
                editor.setdefault(path, []).extend(times)
    if big_benches:  # once: it is long, and the target is absolute (seconds, MB), not a ratio
        print("generated file", file=sys.stderr)
        for b in big_benches:
            timed(b)
    load_after = _load()

    model = repository_model_times(str(py) if py.exists() else sys.executable, tree, repeat)
    prof_text = run_profile(nm, tree) if profile else ""
    versions = {
        "neuron-migrate": f"{_version([str(Path(nm).with_name('python')), '-c', 'import neuron_migrate; print(neuron_migrate.__version__)'])} (git {git_rev()}, `{nm}`, {'a regular install of this commit, as users get it' if installed else 'this venv: an editable install when developing'})",
        "torchfix": _version([tf, "--version"]),
        "ruff": _version([ruff, "--version"]),
        "libcst (torchfix venv)": _version([str(tools / "python"), "-c", "import libcst, importlib.metadata as m; print(m.version('libcst'))"]) if tools else "missing",
        "libcst (neuron-migrate)": _version([str(Path(nm).with_name('python')), "-c", "import importlib.metadata as m; print(m.version('libcst'))"]),
    }
    ctx = dict(tree_name=tree_name, n_files=n_files, n_lines=n_lines, repeat=repeat, samples=samples, tree=tree,
               main=main_benches, jobs=jobs_benches, cache=cache_benches, singles=single_benches, small_ref=small_ref,
               few=few_benches, editor=editor, model=model,
               big=big_benches, big_path=big, big_lines=big_lines, big_mb=big_mb, cache_clean=cache_clean,
               versions=versions, load_before=load_before, load_after=load_after, loads=loads, prof_text=prof_text,
               elapsed=time.perf_counter() - started, argv=sys.argv[1:] if argv is None else argv)
    text = render(ctx)
    out = Path(args.out)
    if out.exists() and NOTES in out.read_text():  # the hand-written analysis survives a re-run
        text += "\n" + NOTES + out.read_text().split(NOTES, 1)[1]
    out.write_text(text)
    print(f"wrote {args.out} ({ctx['elapsed']:.0f} s)", file=sys.stderr)
    return 0


def run_profile(nm: str, tree: Path) -> str:
    """cProfile of `audit` in a single process (-j 1, no cache): top 20 by own time and by cumulative time."""
    out = tree.parent / "audit.prof"
    py = Path(nm).with_name("python")
    py = str(py) if py.exists() else sys.executable
    cmd = [py, "-m", "cProfile", "-o", str(out), "-m", "neuron_migrate", "audit", "--output-format", "concise",
           "--no-cache", "-j", "1", "."]
    t0 = time.perf_counter()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run(cmd, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    wall = time.perf_counter() - t0
    if not out.exists():
        return "(profile failed)"
    parts = [f"Single process (`-j 1 --no-cache`), {wall:.1f} s under the profiler (not part of the timings above).\n"]
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


def _ok(b: Bench) -> bool:
    return bool(b.runs) and not b.missing


def _failed(b: Bench) -> str:
    """' (exit 2 in 1 of 3 runs)' when a run failed or timed out: a number from a failed run means little."""
    bad = [r for r in b.runs if r.timed_out or r.rc not in (0, 1)]
    if not bad:
        return ""
    what = "timed out" if all(r.timed_out for r in bad) else f"exit {bad[0].rc}"
    return f" ({what} in {len(bad)} of {len(b.runs)} runs)"


def render(c: dict) -> str:
    m = machine()
    main, jobs, cache = c["main"], c["jobs"], c["cache"]
    by = {b.label: b for b in main + jobs + cache + c["small_ref"] + c["big"]}
    tf, ruff = by["torchfix"], by["ruff check --select ALL --no-cache"]
    load = lambda t: ", ".join(f"{x:.1f}" for x in t)  # noqa: E731
    out = [
        "# Benchmark results",
        "",
        f"Written by `python benchmarks/run.py {' '.join(c['argv'])}`".rstrip()
        + f" on {dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M')} UTC, in {c['elapsed'] / 60:.1f} min.",
        "",
        f"- machine: {m['cpu']}, {m['cores']} cores, {m['memory']}, {m['os']}, Python {m['python']}",
        f"- load average (1, 5, 15 min): {load(c['load_before'])} before, {load(c['load_after'])} after; 1-min load at "
        f"the start of each repetition: {', '.join(f'{t[0]:.1f}' for t in c['loads'])} (compare the ratios, measured "
        "in the same run, rather than absolute times)",
        *[f"- {k}: {v}" for k, v in c["versions"].items()],
        f"- tree `{c['tree_name']}`: {c['n_files']} files, {c['n_lines']:,} lines (`{c['tree']}`); corpus: "
        + ", ".join(p.key for p in corpus.PACKAGES) + " (all pinned versions exist on PyPI; none substituted)",
        f"- {c['repeat']} timed run(s) per tree command and {c['repeat'] * c['samples']} per single-file command, "
        "tools taking turns within each repetition; medians; output to /dev/null; wall time from the start to the "
        "command's exit (a blocking wait; RSS is sampled in a thread)",
        f"- peak RSS of the largest process: {RSS_SOURCE}",
        "",
        "## Targets (issue 14)",
        "",
    ]
    out += targets(c, by)
    out += [
        "",
        "## Whole tree",
        "",
        "Speed ratios are medians of the per-repetition ratios (the tools ran back to back within a",
        "repetition); `runs` lists every timed run in order. `audit` without `-j` uses every core.",
        "",
        "| command | median wall (s) | runs (s) | median CPU (s) | lines/s | peak RSS, process tree (MB) | peak RSS, largest process (MB) | speed vs TorchFix | speed vs Ruff |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for b in main + jobs:
        if not _ok(b):
            out.append(f"| `{b.label}` | missing: {b.missing or 'no run'} | | | | | | | |")
            continue
        runs = ", ".join(f"{r.wall:.2f}" for r in b.runs)
        out.append(f"| `{b.label}`{_failed(b)} | {_fmt(b.median)} | {runs} | {_fmt(b.cpu)} | {_fmt(b.lines / b.median)} | {_fmt(b.peak_tree_mb)} | "
                   f"{_fmt(b.peak_single_mb)} | {_fmt(paired(b, tf) if _ok(tf) else None, 'x')} | "
                   f"{_fmt(paired(b, ruff) if _ok(ruff) else None, 'x')} |")
    j1, j2 = jobs
    if _ok(j1) and _ok(j2):
        eff = statistics.median(r1.wall / (2 * r2.wall) for r1, r2 in zip(j1.runs, j2.runs))
        out += ["", f"Workers: `-j 1` {c['n_lines'] / j1.median:,.0f} lines/s, `-j 2` {c['n_lines'] / j2.median:,.0f} lines/s; "
                f"per-worker efficiency t1 / (2 * t2) = {100 * eff:.0f}% (median of the per-repetition values; 100% would be "
                "perfect scaling; the machine's other load takes from the second core first)."]
    model = c.get("model") or {}
    if model.get("cold"):
        def med(key: str, i: int) -> float:
            return statistics.median(r[i] for r in model[key])

        cold_audit = by.get("neuron-migrate audit")
        share = (f" The cold build's wall time is {100 * med('cold', 0) / cold_audit.median:.1f}% of the median `audit` "
                 "of the tree above (which includes it).") if cold_audit is not None and _ok(cold_audit) else ""
        out += ["", "## Repository model", "",
                f"The import graph, entry points and launch modes of the tree's {model['files']} Python files "
                f"({model['entries']} programs; {model['distributed']} modules run by a distributed program), in a fresh "
                f"process; medians of wall and CPU seconds (CPU time is less moved by the machine's other load).{share}",
                "", "| build | wall (s) | CPU (s) |", "|---|---:|---:|",
                f"| cold: every file read and line-scanned | {med('cold', 0):.3f} | {med('cold', 1):.3f} |",
                f"| from cached scan records: a walk, a stat per file, graph and answers | {med('records', 0):.3f} | {med('records', 1):.3f} |",
                f"| unchanged tree: a walk, then the cached answers | {med('unchanged', 0):.3f} | {med('unchanged', 1):.3f} |"]
    elif model.get("error"):
        out += ["", "## Repository model", "", f"Not measured: {model['error'][0]}"]
    out += ["", "## Cache: cold and warm (same tree, unchanged between the two runs)", "",
            "| command | median wall (s) | runs (s) | warm / cold |", "|---|---:|---|---:|"]
    for cold, warm in ((cache[0], cache[1]), (cache[2], cache[3])):
        for b in (cold, warm):
            if not _ok(b):
                out.append(f"| `{b.label}` | missing: {b.missing or 'no run'} | | |")
                continue
            r = paired(cold, warm) if b is warm and _ok(cold) else None
            out.append(f"| `{b.label}`{_failed(b)} | {_fmt(b.median)} | {', '.join(f'{x.wall:.2f}' for x in b.runs)} | "
                       f"{f'{100 * r:.1f}%' if r is not None else ''} |")
    out += ["", "## Single files (the pre-commit and editor case)", "",
            "`rewrite` changes: what `rewrite --check` said before the timings (only files it leaves unchanged count",
            "for the rewrite target). Peak RSS is the largest process (see the header for how it is read).", "",
            "`server check`: one check of the file's edited text in the resident language server (the editor case, "
            f"{EDITOR_CHECKS} per repetition in one process; see EDITOR_SCRIPT in run.py), median.", "",
            "| file | why | lines | `rewrite` changes | `audit FILE` median wall (s) | audit CPU (s) | `rewrite FILE` median wall (s) | rewrite CPU (s) | audit peak RSS (MB) | `server check` (s) |",
            "|---|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for path, why, lines, changes, a, rw in c["singles"]:
        rel = path.relative_to(corpus.cache_dir() / "single")
        server = f"{statistics.median(c['editor'][path]):.3f}" if path in c.get("editor", {}) else "-"
        out.append(f"| `{rel}` | {why} | {lines:,} | {'?' if changes is None else 'yes' if changes else 'no'} | "
                   f"{f'{a.median:.3f}' if _ok(a) else 'missing'}{_failed(a)} | {f'{a.cpu:.3f}' if _ok(a) else '-'} | "
                   f"{f'{rw.median:.3f}' if _ok(rw) else 'missing'}{_failed(rw)} | {f'{rw.cpu:.3f}' if _ok(rw) else '-'} | "
                   f"{_fmt(a.peak_single_mb) if _ok(a) else '-'} | {server} |")
    for b in c["small_ref"]:
        if _ok(b):
            where = f"`{SMALL_FILE}`" if "FILE" in b.label else "(no file)"
            out.append(f"| {where} | reference: `{b.label}` | | | {b.median:.3f} | {b.cpu:.3f} | | | {_fmt(b.peak_single_mb)} | |")
    if c.get("few"):
        every, one = c["few"]
        out += ["", "## A few files in one command (a pre-commit run)", "",
                f"The {len(c['singles'])} files above ({every.lines:,} lines) given to one `audit`, as a pre-commit hook gives "
                "it the files of a commit: on every core (fewer than 24 files still use the workers when the files "
                "besides the largest hold enough work), and with `-j 1`.", "",
                "| command | median wall (s) | runs (s) | median CPU (s) |", "|---|---:|---|---:|"]
        for b in (every, one):
            if _ok(b):
                out.append(f"| `{b.label}`{_failed(b)} | {b.median:.3f} | {', '.join(f'{x.wall:.2f}' for x in b.runs)} | {b.cpu:.3f} |")
        if _ok(every) and _ok(one):
            out += ["", f"Every core / `-j 1`: {every.median / one.median:.2f} of the time."]
    if c["big"]:
        out += ["", f"## Generated file: `{c['big_path'].name}`", "",
                f"{c['big_path'].stat().st_size / 1e6:.1f} MB, {c['big_lines']:,} lines: `{BIG_TEMPLATE}`'s imports once, then its "
                "top-level classes and functions repeated with every name they bind suffixed `_<n>` (generated by run.py, "
                f"deterministically, into `{c['big_path'].parent}`). One run each (killed after {BIG_LIMIT_S} s).", "",
                "| command | wall (s) | CPU (s) | lines/s | peak RSS, process tree (MB) | peak RSS, largest process (MB) |", "|---|---:|---:|---:|---:|---:|"]
        for b in c["big"]:
            if not _ok(b):
                out.append(f"| `{b.label}` | missing: {b.missing or 'no run'} | | | | |")
                continue
            out.append(f"| `{b.label}`{_failed(b)} | {_fmt(b.median)} | {_fmt(b.cpu)} | {_fmt(b.lines / b.median)} | {_fmt(b.peak_tree_mb)} | "
                       f"{_fmt(b.peak_single_mb)} |")
    if c["prof_text"]:
        out += ["", "## Profile of `neuron-migrate audit` on the tree", "", c["prof_text"]]
    return "\n".join(out) + "\n"


def _short(p: Path) -> str:
    return f"{p.parent.name}/{p.name}"


def targets(c: dict, by: dict) -> list[str]:
    out = []

    def check(name: str, ok: Optional[bool], shown: str) -> None:
        verdict = "not measured" if ok is None else "**met**" if ok else "**not met**"
        out.append(f"- {name}: {shown or '-'} -> {verdict}")

    A, RW, TF, RUFF = (by["neuron-migrate audit"], by["neuron-migrate rewrite (no write)"], by["torchfix"],
                       by["ruff check --select ALL --no-cache"])
    def worst_single(label: str, limit: float, runs: list, none_note: str) -> None:
        """The slowest of the single-file runs against its wall-clock limit, every file's median shown."""
        if not runs:
            check(label, None, none_note)
            return
        worst_p, worst = max(runs, key=lambda pr: pr[1].median)
        each = ", ".join(f"{_short(p)} {b.median:.3f} s" for p, b in runs)
        check(label, worst.median <= limit and not _failed(worst),
              f"worst {worst.median:.3f} s wall, {worst.cpu:.3f} s CPU ({_short(worst_p)}); {each}")

    worst_single("`audit FILE` <= 0.10 s wall on any single file", 0.10,
                 [(p, a) for p, _, _, _, a, _ in c["singles"] if _ok(a)], "")
    worst_single("`rewrite FILE` <= 0.20 s when nothing changes", 0.20,
                 [(p, rw) for p, _, _, changes, _, rw in c["singles"] if changes is False and _ok(rw)],
                 "no single file that rewrite leaves unchanged")
    if c.get("editor"):
        worst_p, worst = max(c["editor"].items(), key=lambda kv: statistics.median(kv[1]))
        each = ", ".join(f"{_short(p)} {1000 * statistics.median(t):.0f} ms" for p, t in c["editor"].items())
        out.append(f"- the editor case, reported beside it: one check of an edited buffer in the resident language "
                   f"server, median {1000 * statistics.median(worst):.0f} ms at worst ({_short(worst_p)}; "
                   f"{'within' if statistics.median(worst) <= 0.10 else 'over'} 0.10 s); {each}")
    tree = f"on tree `{c['tree_name']}` ({c['n_lines']:,} lines)"
    r = paired(A, RUFF) if _ok(A) and _ok(RUFF) else None
    check(f"audit lines/s >= Ruff `--select ALL` lines/s {tree}", None if r is None else r >= 1.0,
          "" if r is None else f"audit {A.lines / A.median:,.0f} lines/s, Ruff {RUFF.lines / RUFF.median:,.0f}; "
          f"audit/Ruff speed {r:.2f}x")
    r = paired(A, TF) if _ok(A) and _ok(TF) else None
    check("audit >= 100x TorchFix", None if r is None else r >= 100, "" if r is None else f"{r:.1f}x")
    r = paired(A, RW) if _ok(A) and _ok(RW) else None
    check("rewrite (no write) within 2x of audit (rewrite time / audit time <= 2)", None if r is None else r <= 2,
          "" if r is None else f"{r:.2f}x (rewrite {RW.median:.2f} s, audit {A.median:.2f} s)")
    r = paired(RW, TF) if _ok(RW) and _ok(TF) else None
    check("rewrite (no write) >= 30x TorchFix", None if r is None else r >= 30, "" if r is None else f"{r:.1f}x")
    cache = c["cache"]
    for kind, cold, warm in (("audit", cache[0], cache[1]), ("rewrite", cache[2], cache[3])):
        r = paired(cold, warm) if _ok(cold) and _ok(warm) else None
        name = f"{kind} warm second run <= 5% of cold on a tree over 40k lines"
        if c["n_lines"] <= 40_000:
            check(name, None, f"tree has only {c['n_lines']:,} lines" + (f" ({100 * r:.1f}% here)" if r is not None else ""))
        else:
            check(name, None if r is None else r <= 0.05,
                  "" if r is None else f"{100 * r:.1f}% ({warm.median:.2f} s / {cold.median:.2f} s)")
    check("`neuron-migrate cache clean` exists", c["cache_clean"], "yes" if c["cache_clean"] else "no")
    big = by.get("neuron-migrate audit BIG")
    if big and _ok(big):
        mb = c["big_path"].stat().st_size / 1e6
        name = f"a {mb:.0f} MB file audits in <= 10 s and <= 300 MB"
        if c["big_mb"] < 15:
            name += " (smoke size: the target is for 15 MB)"
        run = big.runs[0]
        check(name, None if c["big_mb"] < 15 else (run.rc in (0, 1) and big.median <= 10 and big.peak_tree_mb <= 300),
              f"{'killed after ' if run.timed_out else ''}{big.median:.1f} s, {big.peak_tree_mb:.0f} MB (process tree), "
              f"exit {run.rc}")
    else:
        check("a 15 MB file audits in <= 10 s and <= 300 MB", None, "skipped (--big-mb 0)" if not big else big.missing)
    j1, j2 = c["jobs"]
    if _ok(j1) and _ok(j2):
        eff = statistics.median(r1.wall / (2 * r2.wall) for r1, r2 in zip(j1.runs, j2.runs))
        out.append(f"- throughput with 1 and 2 workers (reported; no threshold in the issue): `-j 1` "
                   f"{c['n_lines'] / j1.median:,.0f} lines/s ({j1.median:.2f} s), `-j 2` {c['n_lines'] / j2.median:,.0f} lines/s "
                   f"({j2.median:.2f} s); per-worker efficiency t1 / (2 * t2) = {100 * eff:.0f}%")
        if big and _ok(big) and not big.runs[0].timed_out and c["big_mb"] >= 15:
            lin = (big.lines / big.median) / (c["n_lines"] / j1.median)
            out.append(f"- time linear in file size (reported): the generated file's lines/s is {100 * lin:.0f}% of the "
                       "tree's single-worker lines/s (100% = linear; a single file gets one worker)")
    return out


if __name__ == "__main__":
    sys.exit(main())
