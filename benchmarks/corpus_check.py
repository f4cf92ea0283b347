"""Corpus check (issue 10) and output metrics (issue 12) of `neuron-migrate rewrite` on real torch_xla code.

    python benchmarks/corpus_check.py                      # corpus + realistic scripts; writes benchmarks/CORPUS_CHECK.md
    python benchmarks/corpus_check.py --paths a.py b.py --out /tmp/check.md   # a tree of your own
    python benchmarks/corpus_check.py --limit 20 --out /tmp/check.md         # the first 20 corpus files only

Files: every `.py` file of the pinned PyPI corpus (benchmarks/corpus.py) whose text mentions `torch_xla`, plus
tests/integration/realistic/*.py (or the files given with --paths). They are copied to a temporary tree, then, in
the same run:

1. `ruff check --select F401,F821,F822,F823,F811 --output-format json` over the copy (before);
2. `neuron-migrate rewrite --write --unsafe-fixes --no-cache` over the copy;
3. the same ruff check again (after), and `neuron-migrate audit --output-format json` of the rewritten copy.

Lint failures: a (code, name) finding of a file (undefined name, name used before it is bound, unused import,
redefinition; and a syntax error) that the rewrite added, found by comparing before and after per file and per
(code, name): occurrences after beyond those before are new, each matched back by its source line text.

Start failures: every rewritten script (a module-level `if __name__ == "__main__":` block, or a realistic script)
that has no torch_xla finding left (no NM1xx finding of any severity in the audit of the rewritten file) is run
with torch_xla made unimportable (every meta-path finder is wrapped to find nothing for `torch_xla` and its
submodules: `import torch_xla` raises ModuleNotFoundError and `importlib.util.find_spec` answers None), as `<script> --help` under `timeout`. Corpus scripts run inside a copy of their whole package with
the rewritten files laid over it (`python -m package.module`; files of the torch_xla package itself run as plain
scripts, since their package is what is missing). The test-only `neuron` -> cpu stand-in of the integration tests
(tests/integration/neuron_on_cpu) is on the path, so a script that does not parse `--help` trains on the CPU. A
start counts as a failure for SyntaxError, NameError/UnboundLocalError, an ImportError that names torch_xla or a
rewritten module, and any other error; a script that needs another third-party package that is not installed
here is "not judgeable here: needs <pkg>", listed on its own, never counted as passing.

Output metrics (issue 12), over the rewritten files: files changed, helper definitions inserted (module-level
defs/classes named like one of the rewrite's helpers, `neuron_migrate.rules.helpers.HELPERS`, that the original did
not have), lines added per changed file (net growth, and `+` lines of the diff: mean, median, max), and private
torch API uses (the regex of tests/integration/test_golden.py) in rewritten output that the original did not have.

Import check (beyond the issue's scripts): every rewritten module that is not a script and has no torch_xla finding
left is imported the same way (`import package.module` inside the overlay), classified like a start.

Exit status: 0 when the lint-failure, start-failure, import-failure and private-API counts are all 0; 1 otherwise;
2 when the check could not run (no ruff, corpus unavailable, the rewrite crashed).
"""
from __future__ import annotations

import argparse
import ast
import collections
import datetime as dt
import difflib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import corpus  # noqa: E402

sys.path.insert(0, str(REPO))  # helper_names() reads this checkout's rules, as the runs below use its code
REALISTIC = REPO / "tests" / "integration" / "realistic"
SHIM = REPO / "tests" / "integration" / "neuron_on_cpu"
RUFF_PIN = "0.17.6"
RUFF_SELECT = "F401,F821,F822,F823,F811"
# the same pattern as tests/integration/test_golden.py
PRIVATE = re.compile(r"\btorch\.(?:_C\b|_[a-z]\w*|utils\._\w+)|from torch\._|import torch\._")
BACKTICK = re.compile(r"`([^`]+)`")

# Runs a script (modes "path", "module": as __main__ with --help) or imports a module ("import", "import-path") with
# torch_xla made unimportable. argv: mode, target (a file, or a dotted name), root (sys.path[0] for the dotted modes).
START_WRAPPER = r'''
import os, runpy, sys
class _HideTorchXla:
    """torch_xla is not installed: every finder answers None for it and its submodules, so `import torch_xla`
    raises ModuleNotFoundError and importlib.util.find_spec("torch_xla") is None, as without the package."""
    def __init__(self, inner):
        self.inner = inner
    def find_spec(self, name, path=None, target=None):
        if name == "torch_xla" or name.startswith("torch_xla."):
            return None
        find = getattr(self.inner, "find_spec", None)
        return find(name, path, target) if find is not None else None
    def __getattr__(self, attr):
        return getattr(self.inner, attr)
for _m in [m for m in sys.modules if m == "torch_xla" or m.startswith("torch_xla.")]:
    del sys.modules[_m]
sys.meta_path[:] = [_HideTorchXla(f) for f in sys.meta_path]
mode, target, root = sys.argv[1:4]
sys.argv = [target, "--help"]
if mode == "path":
    sys.path[0] = os.path.dirname(os.path.abspath(target))
    runpy.run_path(target, run_name="__main__")
elif mode == "module":
    sys.path[0] = root
    runpy.run_module(target, run_name="__main__", alter_sys=True)
elif mode == "import-path":  # a library file outside any package we can import: executed, not as __main__
    sys.path[0] = os.path.dirname(os.path.abspath(target))
    runpy.run_path(target, run_name="corpus_check_import")
else:  # "import": a library module, imported in its package
    import importlib
    sys.path[0] = root
    importlib.import_module(target)
'''


# ---------------------------------------------------------------------------------------------------------
# inputs


@dataclass
class Source:
    rel: str  # path in the work tree: "<package-key>/<path in package>", "realistic/<name>" or "paths/<name>"
    src: Path  # original file
    origin: str  # package key, "realistic" or "paths"
    package_root: Optional[Path] = None  # extracted corpus package (for the start check's overlay)


def corpus_sources(limit: int = 0) -> list[Source]:
    trees = corpus.ensure_corpus()
    out = []
    for name, root in trees.items():
        key = corpus.BY_NAME[name].key
        for p in corpus.py_files(root):
            if corpus.mentions_xla(p):
                out.append(Source(f"{key}/{p.relative_to(root).as_posix()}", p, key, root))
    return out[:limit] if limit else out


def realistic_sources() -> list[Source]:
    return [Source(f"realistic/{p.name}", p, "realistic") for p in sorted(REALISTIC.glob("*.py"))]


def path_sources(paths: list[str]) -> list[Source]:
    out, seen = [], set()
    for arg in paths:
        p = Path(arg).resolve()
        files = sorted(p.rglob("*.py")) if p.is_dir() else [p]
        for f in files:
            rel = f.relative_to(p).as_posix() if p.is_dir() else f.name
            rel = f"paths/{p.name}/{rel}" if p.is_dir() else f"paths/{rel}"
            if rel not in seen:
                seen.add(rel)
                out.append(Source(rel, f, "paths"))
    return out


# ---------------------------------------------------------------------------------------------------------
# tools


def find_ruff(explicit: Optional[str] = None) -> Optional[str]:
    """The ruff to use: --ruff, next to this Python, the benchmark venv's, or on PATH."""
    candidates = [explicit] if explicit else [
        str(Path(sys.executable).parent / "ruff"), str(corpus.cache_dir() / "venv" / "bin" / "ruff"), shutil.which("ruff")]
    for c in candidates:
        if c and Path(c).exists():
            return c
    return None


def tool_version(cmd: list[str]) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        return (p.stdout or p.stderr).strip().splitlines()[0] if (p.stdout or p.stderr).strip() else f"exit {p.returncode}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable ({exc})"


def git_rev() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=30)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":(exclude)benchmarks/CORPUS_CHECK.md"], cwd=REPO, capture_output=True, text=True, timeout=30)
        return rev.stdout.strip() + (" (uncommitted changes)" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def nm_cmd() -> list[str]:
    return [sys.executable, "-m", "neuron_migrate"]


def nm_env() -> dict:
    """The environment of a neuron-migrate run: this checkout's code (a worktree's, not an installed copy's)."""
    env = clean_env()
    env["PYTHONPATH"] = str(REPO)
    return env


def clean_env() -> dict:
    env = dict(os.environ, NO_COLOR="1", COLUMNS="200")
    env.pop("PYTHONPATH", None)
    return env


@dataclass(frozen=True)
class LintFinding:
    code: str  # F401 ..., or "syntax" for a parse error
    name: str  # the name the message is about ("" when none)
    line: int
    message: str


def run_ruff(ruff: str, root: Path) -> dict[str, list[LintFinding]]:
    cmd = [ruff, "check", "--isolated", "--no-cache", "--select", RUFF_SELECT, "--output-format", "json", "--exit-zero", "."]
    p = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=1800, env=clean_env())
    if p.returncode != 0:
        raise RuntimeError(f"ruff exited {p.returncode}: {p.stderr.strip()[-2000:]}")
    out: dict[str, list[LintFinding]] = {}
    for d in json.loads(p.stdout or "[]"):
        rel = Path(d["filename"]).resolve().relative_to(root.resolve()).as_posix()
        code = d.get("code") or "syntax"
        m = BACKTICK.search(d.get("message") or "")
        name = m.group(1) if m and code != "syntax" else ""
        out.setdefault(rel, []).append(LintFinding(code, name, d["location"]["row"], d.get("message") or ""))
    return out


def new_lint(before_text: str, after_text: str, before: list[LintFinding], after: list[LintFinding]) -> list[LintFinding]:
    """Findings of `after` that `before` had not: per (code, name), matched back by the stripped source line."""
    b_lines, a_lines = before_text.splitlines(), after_text.splitlines()

    def line_text(lines, n):
        return lines[n - 1].strip() if 0 < n <= len(lines) else ""

    pool: dict[tuple, list[str]] = collections.defaultdict(list)
    for f in before:
        pool[(f.code, f.name)].append(line_text(b_lines, f.line))
    new = []
    unmatched: list[LintFinding] = []
    for f in after:  # same key and same line text: the same finding, moved
        texts = pool[(f.code, f.name)]
        t = line_text(a_lines, f.line)
        if t in texts:
            texts.remove(t)
        else:
            unmatched.append(f)
    for f in unmatched:  # same key on a changed line: still the old finding while before has one left over
        texts = pool[(f.code, f.name)]
        if texts:
            texts.pop()
        else:
            new.append(f)
    return new


def run_audit(root: Path) -> dict[str, list[tuple[str, str, int, str]]]:
    """{rel: [(code, severity, line, message)]} of `neuron-migrate audit` over root."""
    p = subprocess.run([*nm_cmd(), "audit", "--output-format", "json", "--no-cache", "--no-color", "--exit-zero", "."],
                       cwd=root, capture_output=True, text=True, timeout=3600, env=nm_env())
    if "Traceback" in p.stderr or p.returncode not in (0, 1):
        raise RuntimeError(f"audit exited {p.returncode}: {p.stderr.strip()[-3000:]}")
    data = json.loads(p.stdout or "[]")
    items = data.get("findings", data) if isinstance(data, dict) else data
    out: dict[str, list] = {}
    for f in items:
        loc = f["location"]
        path = Path(loc["path"])
        rel = (path.resolve().relative_to(root.resolve()) if path.is_absolute() else path).as_posix()
        out.setdefault(rel, []).append((f["code"], f.get("severity") or "", loc["row"], f.get("message") or ""))
    return out


# ---------------------------------------------------------------------------------------------------------
# metrics


def helper_names() -> set[str]:
    from neuron_migrate.rules.registry import RuleSet
    from neuron_migrate.rules.helpers import HELPERS

    RuleSet.select()  # the builtin rule modules register their helpers on import
    names = set()
    for key, h in HELPERS.items():
        names.add(key)
        m = re.search(r"^(?:def|class)\s+(\w+)", h.source, re.M)
        if m:
            names.add(m.group(1))
    return names


def module_defs(text: str) -> list[str]:
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    return [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]


def has_main_block(text: str) -> bool:
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return False
    for n in tree.body:
        if isinstance(n, ast.If) and isinstance(n.test, ast.Compare) and len(n.test.comparators) == 1:
            sides = [n.test.left, n.test.comparators[0]]
            if any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides) and any(
                    isinstance(s, ast.Constant) and s.value == "__main__" for s in sides):
                return True
    return False


def private_uses(text: str) -> list[tuple[int, str]]:
    return [(i, m.group(0)) for i, line in enumerate(text.splitlines(), 1) for m in PRIVATE.finditer(line)]


def new_private(before_text: str, after_text: str) -> list[tuple[int, str]]:
    have = collections.Counter(m for _i, m in private_uses(before_text))
    out = []
    for i, m in private_uses(after_text):
        if have[m] > 0:
            have[m] -= 1
        else:
            out.append((i, m))
    return out


def diff_added(before_text: str, after_text: str) -> int:
    return sum(1 for line in difflib.unified_diff(before_text.splitlines(), after_text.splitlines(), lineterm="", n=0)
               if line.startswith("+") and not line.startswith("+++"))


# ---------------------------------------------------------------------------------------------------------
# start check


@dataclass
class Start:
    rel: str
    how: str  # the command, in words
    verdict: str  # "ok", "fail", "needs"
    detail: str = ""
    counted: bool = True  # False: the script still has torch_xla findings (run, reported apart)


def wheel_module(rel: str) -> Optional[str]:
    """Dotted module name of a file at `rel` in an installed wheel (namespace packages such as `optimum` included)."""
    parts = rel[:-3].split("/") if rel.endswith(".py") else rel.split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts) if parts and all(p.isidentifier() for p in parts) else None


def build_overlay(src: Source, work: Path, overlays: Path, rewritten: set[str]) -> Path:
    """A copy (symlinks) of the whole extracted package with every rewritten file of that package laid over it."""
    dest = overlays / src.origin
    if dest.exists():
        return dest
    shutil.copytree(src.package_root, dest, symlinks=False, copy_function=os.symlink,
                    ignore=shutil.ignore_patterns("__pycache__", ".complete"))
    prefix = src.origin + "/"
    for rel in rewritten:
        if rel.startswith(prefix):
            target = dest / rel[len(prefix):]
            if target.is_symlink() or target.exists():
                target.unlink()
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(work / rel, target)
    return dest


LAST_EXC = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Warning|Exit)|KeyboardInterrupt)(?:: (.*))?$")
MISSING = re.compile(r"No module named '([\w.]+)'")


def _module_in(root: Path, dotted: str) -> bool:
    base = root.joinpath(*dotted.split("."))
    return base.with_suffix(".py").exists() or base.is_dir()


def classify(rc: Optional[int], out: str, own_modules: set[str], overlay: Optional[Path] = None) -> tuple[str, str]:
    """(verdict, detail) of a start: "ok", "fail", or "needs" (a cause outside the rewrite). `overlay`: the package copy."""
    if rc == 0:
        return "ok", "exit 0"
    if rc is None:
        return "ok", "still running at the time limit (got past start-up)"
    last = ""
    for line in out.splitlines():
        if LAST_EXC.match(line.strip()) and not line.startswith(" "):
            last = line.strip()
    if not last:
        return "fail", f"exit {rc}: {out.strip().splitlines()[-1][:300] if out.strip() else 'no output'}"
    exc, _, msg = last.partition(": ")
    exc = exc.rsplit(".", 1)[-1]
    if exc == "FileNotFoundError" and overlay is not None and str(overlay) in msg and not re.search(r"\.py'", msg):
        return "needs", f"needs the package's data files (the corpus keeps only .py files) ({last[:200]})"
    if exc == "ImportError" and "no known parent package" in msg:
        # a file of the torch_xla package itself run on its own: its package is the one that is absent
        return "needs", f"needs its own package (torch_xla) for its relative imports ({last[:160]})"
    m = MISSING.search(msg)
    if exc in ("ModuleNotFoundError", "ImportError") and m:
        top = m.group(1).split(".")[0]
        if top != "torch_xla" and top not in own_modules:
            return "needs", f"needs {top} ({last[:200]})"
        if top != "torch_xla" and overlay is not None and not _module_in(overlay, m.group(1)):
            # the package's own wheel never had that module: another distribution of a namespace package
            # (optimum-neuron's `optimum.exporters.tasks` is in `optimum`)
            return "needs", f"needs {m.group(1)} (not in this wheel; another distribution provides it) ({last[:160]})"
    if exc == "ImportError" and "torch_xla" not in msg and not any(f"'{o}" in msg for o in own_modules):
        # e.g. "cannot import name X from transformers" (an installed package of another version)
        if re.search(r"from '(?!torch_xla)[\w.]+' \(/", msg) and "site-packages" in msg:
            return "needs", f"needs other versions of installed packages ({last[:200]})"
    return "fail", last[:300]


def start_check(src: Source, work: Path, overlays: Path, rewritten: set[str], timeout: float, library: bool = False) -> Start:
    """Start a script (`--help`) or, with `library`, import a module, with torch_xla made unimportable."""
    env = clean_env()
    env["PYTHONPATH"] = str(SHIM)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    own: set[str] = set()
    if src.package_root is not None:
        root = build_overlay(src, work, overlays, rewritten)
        target = root / src.rel[len(src.origin) + 1:]
        own = {p.name for p in root.iterdir() if p.is_dir() or p.suffix == ".py"} - {"__pycache__"}
        own = {o[:-3] if o.endswith(".py") else o for o in own}
        dotted = wheel_module(src.rel[len(src.origin) + 1:])
        in_package = dotted and dotted.split(".")[0] != "torch_xla"
        if library:
            mode, what = ("import", dotted) if in_package else ("import-path", str(target))
            how = f"import {dotted}" if in_package else f"runpy.run_path({src.rel[len(src.origin) + 1:]})"
        elif in_package:
            mode, what, how = "module", dotted, f"python -m {dotted} --help"
        else:
            mode, what, how = "path", str(target), f"python {src.rel[len(src.origin) + 1:]} --help"
    else:
        root = (work / src.rel).parent
        if library:
            mode, what, how = "import-path", str(work / src.rel), f"runpy.run_path({Path(src.rel).name})"
        else:
            mode, what, how = "path", str(work / src.rel), f"python {Path(src.rel).name} --help"
    cmd = ["timeout", "-k", "5", str(int(timeout)), sys.executable, "-c", START_WRAPPER, mode, what, str(root)]
    rc, out = _run_start(cmd, root, env, timeout)
    if rc and TORCHRUN_ONLY.search(out):
        # a script made for torchrun (init_process_group from env://): start it the way torchrun starts one process
        env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(_free_port()))
        how += " (RANK=0 WORLD_SIZE=1 MASTER_ADDR... set, as torchrun --nproc_per_node=1 does)"
        rc, out = _run_start(cmd, root, env, timeout)
    verdict, detail = classify(rc, out, own, root if src.package_root is not None else None)
    return Start(src.rel, how, verdict, detail)


TORCHRUN_ONLY = re.compile(r"environment variable (?:RANK|WORLD_SIZE|MASTER_ADDR|MASTER_PORT) expected, but not set")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_start(cmd: list[str], root: Path, env: dict, timeout: float) -> tuple[Optional[int], str]:
    try:
        p = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=timeout + 30, env=env,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None, ""
    return (None if p.returncode in (124, 137) else p.returncode), p.stdout[-4000:] + "\n" + p.stderr[-8000:]


# ---------------------------------------------------------------------------------------------------------
# the check


@dataclass
class FileResult:
    rel: str
    changed: bool
    before_lines: int
    after_lines: int
    diff_added: int
    helpers: list[str] = field(default_factory=list)
    new_lint: list[LintFinding] = field(default_factory=list)
    new_private: list[tuple[int, str]] = field(default_factory=list)
    script: bool = False
    xla_findings: list[tuple[str, str, int, str]] = field(default_factory=list)
    start: Optional[Start] = None
    imported: Optional[Start] = None  # library modules: the import check
    after_text: str = ""
    internal_errors: int = 0  # findings of a rule that raised on this file (issue 38)
    neuron_writes: int = 0  # `torch.neuron.` spellings the rewrite added
    probes_constant: int = 0  # try/except ImportError probes whose import the rewrite removed (answer now constant)


def probes_without_import(text: str) -> int:
    """try blocks caught by an ImportError handler that give a constant answer (`return True`, `FLAG = True`) and
    import nothing: a probe whose import is gone answers the same whatever is installed."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError):
        return 0
    n = 0
    for t in ast.walk(tree):
        if not isinstance(t, ast.Try) or not t.handlers:
            continue
        names = {getattr(x, "id", getattr(x, "attr", "")) for h in t.handlers if h.type is not None
                 for x in (h.type.elts if isinstance(h.type, ast.Tuple) else [h.type])}
        if not names & {"ImportError", "ModuleNotFoundError"}:
            continue
        if any(isinstance(s, (ast.Import, ast.ImportFrom)) for s in ast.walk(t) if s not in [x for h in t.handlers for x in ast.walk(h)]):
            continue
        answers = [s for s in [*t.body, *t.orelse] if (isinstance(s, ast.Return) and isinstance(s.value, ast.Constant))
                   or (isinstance(s, ast.Assign) and isinstance(s.value, ast.Constant) and s.value.value is not None)]
        # a handler that answers the same (`try: return True / except ImportError: return True`) asks nothing:
        # the answer was constant whatever was installed (NM107's "same answer" case), so it is no probe lost
        same = {ast.dump(a) for a in answers}
        if answers and all(h.body and all(ast.dump(b) in same for b in h.body) for h in t.handlers):
            continue
        n += bool(answers)
    return n


@dataclass
class Report:
    files: list[FileResult]
    sources: list[Source]
    rewrite_summary: str
    versions: dict
    started: dt.datetime
    seconds: float
    start_skipped: bool
    rewrite_errors: list[str] = field(default_factory=list)  # per-file errors of the rewrite (those files stay as they were)


def run_check(sources: list[Source], ruff: str, start_timeout: float = 60, do_start: bool = True,
              keep: Optional[Path] = None, log=print) -> Report:
    t0 = dt.datetime.now(dt.timezone.utc)
    tmp = Path(tempfile.mkdtemp(prefix="nm-corpus-check-")) if keep is None else keep
    work, overlays = tmp / "work", tmp / "start"
    try:
        for s in sources:
            dest = work / s.rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(s.src, dest)
        log(f"{len(sources)} files copied to {work}")
        before = run_ruff(ruff, work)
        log("ruff (before) done")
        p = subprocess.run([*nm_cmd(), "rewrite", "--write", "--unsafe-fixes", "--no-cache", "--quiet", "--no-color", "."],
                           cwd=work, capture_output=True, text=True, timeout=3600, env=nm_env())
        if p.returncode not in (0, 1) or "Traceback" in p.stderr:
            raise RuntimeError(f"rewrite exited {p.returncode}: {p.stderr.strip()[-3000:]}")
        summary = "; ".join(l.strip().rstrip(".") for l in p.stdout.splitlines()
                            if re.search(r"files rewritten|need manual migration|^Fixes applied", l.strip()))
        rewrite_errors = [l.strip() for l in p.stderr.splitlines() if l.startswith("error")]
        log(f"rewrite done: {summary}")
        after = run_ruff(ruff, work)
        log("ruff (after) done")
        audit = run_audit(work)
        log("audit done")
        helpers = helper_names()
        results: list[FileResult] = []
        for s in sources:
            old = s.src.read_text(encoding="utf-8", errors="replace")
            new = (work / s.rel).read_text(encoding="utf-8", errors="replace")
            old_defs = set(module_defs(old))
            r = FileResult(
                rel=s.rel, changed=old != new, before_lines=len(old.splitlines()), after_lines=len(new.splitlines()),
                diff_added=diff_added(old, new) if old != new else 0,
                helpers=[d for d in module_defs(new) if d in helpers and d not in old_defs],
                new_lint=new_lint(old, new, before.get(s.rel, []), after.get(s.rel, [])),
                new_private=new_private(old, new),
                script=s.origin == "realistic" or has_main_block(new),
                xla_findings=[f for f in audit.get(s.rel, []) if f[0].startswith("NM1")],
                after_text=new,
                internal_errors=sum(1 for f in audit.get(s.rel, []) if f[3].startswith("internal error in rule")),
                neuron_writes=max(0, new.count("torch.neuron.") - old.count("torch.neuron.")),
                probes_constant=max(0, probes_without_import(new) - probes_without_import(old)) if old != new else 0,
            )
            results.append(r)
        if do_start:
            rewritten = {r.rel for r in results if r.changed}
            # the set: rewritten, no torch_xla finding left; the scripts left with torch_xla findings are run
            # too and reported apart (not counted): whether they start anyway says how much is left by hand
            todo = [(s, r) for s, r in zip(sources, results) if r.script and (r.changed or r.xla_findings)]
            log(f"start check: {len(todo)} scripts")
            for s, r in todo:
                r.start = start_check(s, work, overlays, rewritten, start_timeout)
                r.start.counted = not r.xla_findings
                log(f"  {r.start.verdict:5} {s.rel}: {r.start.detail[:160]}")
            # beyond the scripts: every rewritten library module with no torch_xla finding left imports
            mods = [(s, r) for s, r in zip(sources, results) if not r.script and r.changed and not r.xla_findings]
            log(f"import check: {len(mods)} modules")
            for s, r in mods:
                r.imported = start_check(s, work, overlays, rewritten, start_timeout, library=True)
                log(f"  {r.imported.verdict:5} {s.rel}: {r.imported.detail[:160]}")
        versions = {
            "neuron-migrate": tool_version([*nm_cmd(), "--version"]).split()[-1],
            "ruff": tool_version([ruff, "--version"]).split()[-1],
            "python": sys.version.split()[0],
            "torch": _module_version("torch"),
            "transformers": _module_version("transformers"),
            "libcst": _module_version("libcst"),
        }
        return Report(results, sources, summary, versions, t0, (dt.datetime.now(dt.timezone.utc) - t0).total_seconds(),
                      not do_start, rewrite_errors)
    finally:
        if keep is None:
            shutil.rmtree(tmp, ignore_errors=True)


def _module_version(name: str) -> str:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # noqa: BLE001 - not installed
        return "not installed"


# ---------------------------------------------------------------------------------------------------------
# result


def counts(rep: Report) -> dict:
    changed = [f for f in rep.files if f.changed]
    growth = [f.after_lines - f.before_lines for f in changed]
    added = [f.diff_added for f in changed]
    starts = [f.start for f in rep.files if f.start and f.start.counted]
    extra = [f.start for f in rep.files if f.start and not f.start.counted]
    imports = [f.imported for f in rep.files if f.imported]
    return {
        "files": len(rep.files),
        "changed": len(changed),
        "lint_failures": sum(len(f.new_lint) for f in rep.files),
        "private_new": sum(len(f.new_private) for f in rep.files),
        "private_kept": sum(len(private_uses(f.after_text)) for f in rep.files) - sum(len(f.new_private) for f in rep.files),
        "helpers": sum(len(f.helpers) for f in rep.files),
        "internal_errors": sum(f.internal_errors for f in rep.files) + sum("internal error" in e for e in rep.rewrite_errors),
        "neuron_writes": sum(f.neuron_writes for f in rep.files),
        "probes_constant": sum(f.probes_constant for f in rep.files),
        "files_with_helpers": sum(1 for f in rep.files if f.helpers),
        "max_helpers": max((len(f.helpers) for f in rep.files), default=0),
        "growth": growth,
        "added": added,
        "scripts": sum(1 for f in rep.files if f.script),
        "scripts_xla_left": sum(1 for f in rep.files if f.script and f.xla_findings),
        "scripts_info_left": sum(1 for f in rep.files if f.script and f.xla_findings and all(x[1] == "info" for x in f.xla_findings)),
        "extra_started": len(extra),
        "extra_ok": sum(1 for s in extra if s.verdict == "ok"),
        "extra_failures": sum(1 for s in extra if s.verdict == "fail"),
        "extra_needs": sum(1 for s in extra if s.verdict == "needs"),
        "scripts_unchanged": sum(1 for f in rep.files if f.script and not f.changed and not f.xla_findings),
        "started": len(starts),
        "start_ok": sum(1 for s in starts if s.verdict == "ok"),
        "start_failures": sum(1 for s in starts if s.verdict == "fail"),
        "start_needs": sum(1 for s in starts if s.verdict == "needs"),
        "imports": len(imports),
        "import_ok": sum(1 for s in imports if s.verdict == "ok"),
        "import_failures": sum(1 for s in imports if s.verdict == "fail"),
        "import_needs": sum(1 for s in imports if s.verdict == "needs"),
    }


def passed(c: dict) -> bool:
    return c["lint_failures"] == 0 and c["start_failures"] == 0 and c["import_failures"] == 0 and c["private_new"] == 0


def _stats(xs: list[int]) -> str:
    if not xs:
        return "n/a"
    return f"mean {statistics.mean(xs):.1f}, median {statistics.median(xs):g}, max {max(xs)}"


def render(rep: Report, title_args: str) -> str:
    c = counts(rep)
    origins = collections.Counter(s.origin for s in rep.sources)
    ok = passed(c)
    L = [
        "# Corpus check: does the rewrite keep real code importable and clean? (issues 10 and 12)",
        "",
        f"Written by `python benchmarks/corpus_check.py{title_args}` on {rep.started:%Y-%m-%d %H:%M} UTC "
        f"({rep.seconds:.0f} s), commit {git_rev()}.",
        "",
        "Tools: " + ", ".join(f"{k} {v}" for k, v in rep.versions.items()) + ".",
        "",
        "Files: " + ", ".join(f"{n} from {o}" for o, n in sorted(origins.items())) +
        " (corpus packages: the files whose text mentions `torch_xla`).",
        "",
        f"Rewrite (`neuron-migrate rewrite --write --unsafe-fixes --no-cache .`): {rep.rewrite_summary}; "
        f"per-file errors (files left as they were): {len(rep.rewrite_errors)}"
        + "".join(f"\n- {e}" for e in rep.rewrite_errors[:20]),
        "",
        "## Result",
        "",
        "| check | count | target |",
        "|---|---:|---:|",
        f"| lint failures (new F401/F821/F822/F823/F811 or syntax error after rewrite) | {c['lint_failures']} | 0 |",
        f"| start failures (scripts with no torch_xla finding left that do not start without torch_xla) | "
        f"{c['start_failures'] if not rep.start_skipped else 'not run'} | 0 |",
        f"| import failures (rewritten library modules with no torch_xla finding left that do not import without "
        f"torch_xla; beyond the issue's scripts) | {c['import_failures'] if not rep.start_skipped else 'not run'} | 0 |",
        f"| private torch API uses added by the rewrite | {c['private_new']} | 0 |",
        "",
        f"**{'PASS' if ok else 'FAIL'}**" + ("" if not rep.start_skipped else " (start check not run)"),
        "",
        "## Output metrics (issue 12)",
        "",
        f"- files changed: {c['changed']} of {c['files']}",
        f"- helper definitions inserted: {c['helpers']} in {c['files_with_helpers']} files (at most {c['max_helpers']} in one file)",
        f"- internal errors (a rule that raised, issue 38): {c['internal_errors']}; `torch.neuron.` spellings added: "
        f"{c['neuron_writes']}; import probes turned constant (a try/except ImportError with a constant answer left "
        f"without its import): {c['probes_constant']}",
        f"- lines added per changed file, net (after - before): {_stats(c['growth'])}",
        f"- lines added per changed file, `+` lines of the diff: {_stats(c['added'])}",
        f"- private torch API uses added: {c['private_new']} (uses the original files already had, left as they were: "
        f"{c['private_kept']})",
        "",
    ]
    by_helper = collections.Counter(h for f in rep.files for h in f.helpers)
    if by_helper:
        L += ["| helper | files |", "|---|---:|"] + [f"| `{h}` | {n} |" for h, n in by_helper.most_common()] + [""]
    top = sorted((f for f in rep.files if f.changed), key=lambda f: -(f.after_lines - f.before_lines))[:10]
    if top:
        L += ["Largest growth:", "", "| file | lines before | after | helpers |", "|---|---:|---:|---|"]
        L += [f"| {f.rel} | {f.before_lines} | {f.after_lines} | {', '.join(f.helpers) or '-'} |" for f in top] + [""]
    L += ["## Lint failures", ""]
    lint = [(f.rel, x) for f in rep.files for x in f.new_lint]
    L += [f"- `{rel}:{x.line}`: {x.code} {x.message}" for rel, x in lint] or ["None."]
    L += ["", "## Private torch API added", ""]
    L += [f"- `{f.rel}:{i}`: `{m}`" for f in rep.files for i, m in f.new_private] or ["None."]
    L += ["", "## Start check (torch_xla absent)", ""]
    if rep.start_skipped:
        L += ["Not run (`--no-start`).", ""]
    else:
        L += [
            f"Scripts (a `__main__` block, or a realistic script): {c['scripts']}. With a torch_xla (NM1xx) finding "
            f"left after the rewrite: {c['scripts_xla_left']}. Unchanged and without torch_xla findings: "
            f"{c['scripts_unchanged']}. Rewritten with no torch_xla finding left (the issue's set, counted): "
            f"{c['started']}: {c['start_ok']} started, {c['start_failures']} failed, {c['start_needs']} not judgeable "
            f"here. Also run, not counted (torch_xla findings left; of them with info-level findings only, such as a "
            f"kept import probe or version gate: {c['scripts_info_left']}): {c['extra_started']}: {c['extra_ok']} "
            f"started, {c['extra_failures']} failed, {c['extra_needs']} not judgeable here.",
            "",
            "| script | run as | result |",
            "|---|---|---|",
        ]
        order = {"fail": 0, "needs": 1, "ok": 2}
        for f in sorted((f for f in rep.files if f.start), key=lambda f: (not f.start.counted, order[f.start.verdict], f.rel)):
            word = {"ok": "started", "fail": "**FAILED**", "needs": "not judgeable here"}[f.start.verdict]
            if not f.start.counted:
                codes = collections.Counter(x[0] for x in f.xla_findings)
                left = ", ".join(f"{k} x{v}" if v > 1 else k for k, v in sorted(codes.items()))
                word = ("failed" if f.start.verdict == "fail" else word) + f" (not counted: {left} left)"
            detail = f.start.detail.replace("|", "\\|")
            L.append(f"| {f.rel} | `{f.start.how}` | {word}: {detail} |")
        L.append("")
        L += [
            "## Import check (library modules, torch_xla absent)",
            "",
            f"Every rewritten module that is not a script and has no torch_xla finding left is imported the same way "
            f"(`import package.module` in the overlay; a file of the torch_xla package itself is executed on its own): "
            f"{c['imports']}: {c['import_ok']} imported, {c['import_failures']} failed, {c['import_needs']} not "
            f"judgeable here.",
            "",
            "| module | run as | result |",
            "|---|---|---|",
        ]
        for f in sorted((f for f in rep.files if f.imported), key=lambda f: (order[f.imported.verdict], f.rel)):
            word = {"ok": "imported", "fail": "**FAILED**", "needs": "not judgeable here"}[f.imported.verdict]
            detail = f.imported.detail.replace("|", "\\|")
            L.append(f"| {f.rel} | `{f.imported.how}` | {word}: {detail} |")
        L.append("")
        left = [f for f in rep.files if f.script and f.xla_findings and not f.start]
        if left:
            L += ["Scripts left with torch_xla findings (not run):", ""]
            for f in left:
                codes = collections.Counter(x[0] for x in f.xla_findings)
                L.append(f"- {f.rel}: " + ", ".join(f"{k} x{v}" if v > 1 else k for k, v in sorted(codes.items())))
            L.append("")
    return "\n".join(L) + "\n"


NOTES = "## Notes (hand-written; kept when corpus_check.py rewrites this file)"


def write_report(text: str, out: Path) -> None:
    if out.exists():
        old = out.read_text(encoding="utf-8")
        if NOTES in old:
            text = text + "\n" + old[old.index(NOTES):]
    out.write_text(text, encoding="utf-8")


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--paths", nargs="+", help="check these files/folders instead of the corpus and realistic scripts")
    ap.add_argument("--limit", type=int, default=0, help="only the first N corpus files")
    ap.add_argument("--no-corpus", action="store_true", help="leave out the PyPI corpus")
    ap.add_argument("--no-realistic", action="store_true", help="leave out tests/integration/realistic")
    ap.add_argument("--no-start", action="store_true", help="skip the start check")
    ap.add_argument("--start-timeout", type=float, default=60, help="seconds per script start (default 60)")
    ap.add_argument("--ruff", help=f"ruff executable (ruff {RUFF_PIN}; default: next to this Python, the benchmark venv, PATH)")
    ap.add_argument("--out", default=str(HERE / "CORPUS_CHECK.md"), help="markdown result (default benchmarks/CORPUS_CHECK.md)")
    ap.add_argument("--json", help="also write the counts and failures as JSON here")
    ap.add_argument("--keep", help="work in this (new) folder and keep it")
    ap.add_argument("-q", "--quiet", action="store_true")
    args = ap.parse_args(argv)
    log = (lambda *a: None) if args.quiet else (lambda *a: print(*a, file=sys.stderr, flush=True))

    ruff = find_ruff(args.ruff)
    if ruff is None:
        print(f"error: ruff not found (pip install ruff=={RUFF_PIN}, or pass --ruff)", file=sys.stderr)
        return 2
    try:
        if args.paths:
            sources = path_sources(args.paths)
        else:
            sources = ([] if args.no_corpus else corpus_sources(args.limit)) + ([] if args.no_realistic else realistic_sources())
    except corpus.CorpusUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not sources:
        print("error: no files to check", file=sys.stderr)
        return 2
    keep = Path(args.keep) if args.keep else None
    if keep is not None:
        if keep.exists() and any(keep.iterdir()):
            print(f"error: --keep {keep} is not empty", file=sys.stderr)
            return 2
        keep.mkdir(parents=True, exist_ok=True)
    try:
        rep = run_check(sources, ruff, args.start_timeout, not args.no_start, keep, log)
    except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    shown = "".join(f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
    write_report(render(rep, shown), Path(args.out))
    c = counts(rep)
    if args.json:
        Path(args.json).write_text(json.dumps({
            **{k: v for k, v in c.items() if not isinstance(v, list)},
            "lint": [f"{f.rel}:{x.line}: {x.code} {x.message}" for f in rep.files for x in f.new_lint],
            "private": [f"{f.rel}:{i}: {m}" for f in rep.files for i, m in f.new_private],
            "start": {f.rel: {"verdict": f.start.verdict, "detail": f.start.detail, "counted": f.start.counted} for f in rep.files if f.start},
            "import": {f.rel: {"verdict": f.imported.verdict, "detail": f.imported.detail} for f in rep.files if f.imported},
        }, indent=1), encoding="utf-8")
    print(f"lint failures {c['lint_failures']}, start failures {c['start_failures']} "
          f"(+{c['start_needs']} not judgeable), import failures {c['import_failures']} (+{c['import_needs']} not "
          f"judgeable), private API added {c['private_new']}; "
          f"{c['changed']} of {c['files']} files changed, {c['helpers']} helpers inserted -> {args.out}")
    return 0 if passed(c) else 1


if __name__ == "__main__":
    sys.exit(main())
