"""The repository model: the import graph of a repository's Python files, its programs and their launch modes.

Built from line scans (scan.py), never a parse: the cost is reading the files once (and with a record cache, only
the changed ones). What it answers, per module: the launch modes of every program whose imports reach it.

- A *program* is an entry point: a file with `if __name__ == "__main__":`, a script a launcher or job file starts
  (`python x.py`, `torchrun ... x.py`, `python -m pkg.mod`), or a console script's module (pyproject.toml,
  setup.py, setup.cfg).
- Its *closure* is every repository file its imports reach: absolute imports (from the importing file's folder,
  its package root, the folders it or any file adds to `sys.path`, the repository root and `src/`), relative
  imports, and `importlib.import_module("literal")`; the packages above an imported module come with it.
- Its *modes*: "torchrun" when a launcher starts it with torchrun (or `accelerate launch`), and what starts
  processes or a process group anywhere in its closure: "xmp.spawn", "torch_xla.launch", "mp.spawn",
  "process group" (init_process_group, DDP/FSDP, torchrun's environment variables, xr.use_spmd(), which NM150
  rewrites to one process per device). What another module does only under its own `__main__` guard does not count
  for a program that imports it. No mode: "single".

A module's *closed* classes are those no other repository file imports (by name, by star, or through the whole
module): no subclass elsewhere can override their methods, so a rewrite may follow a value from one method into
another (NM130's loader stored on `self`, NM144's tracker handed to `self._train_update`).

A module's modes are the union over the programs that reach it; any mode but "single" means the module runs in a
distributed program somewhere, so no per-file decision may treat it as single-process.
"""
from __future__ import annotations

import os

TYPE_CHECKING = False  # typing is not imported at run time (start-up): it serves annotations only
if TYPE_CHECKING:
    from typing import Optional

MARKERS = ("pyproject.toml", "setup.py", ".git")
SINGLE = "single"
MAX_FILES = 50_000  # a larger tree gets no model (the per-file decisions stand)
MAX_ENTRIES = 500_000  # nor does one whose walk meets more files and folders than this (a home folder under git)
RECORDS = 10  # the layout of a record cache (bumped when a scan's record changes)
_SKIP = {".git", ".hg", ".svn", "__pycache__", ".venv", "venv", ".tox", ".nox", ".mypy_cache", ".pytest_cache",
         ".ruff_cache", "node_modules", ".ipynb_checkpoints", ".neuron-migrate-cache", "site-packages"}
_LAUNCHER_SUFFIXES = (".sh", ".bash", ".slurm", ".sbatch", ".yaml", ".yml", ".dockerfile", ".mk")
_PACKAGING = ("pyproject.toml", "setup.py", "setup.cfg")
_GROUP_LAUNCHES = {"xmp.spawn", "torch_xla.launch"}
_SPMD_IMPORTS = ("torch_xla.distributed.spmd", "torch_xla.experimental.xla_sharding")
# the modules of native sharding (parallelize_module, fully_shard, distribute_module): it replaces the parameters, so an
# optimizer a base class's __init__ built before it keeps the old ones (NM166 reads "spmd_bases" for these files too)
_NATIVE_SHARDING_IMPORTS = ("torch.distributed.tensor", "torch.distributed.fsdp", "torch.distributed._composable.fsdp",
                            "torch.distributed._tensor")
# what a model module may import and still be known to hold no BatchNorm (another library's models may)
# text that shows a module may build BatchNorm layers (NM150 keeps SPMD's global-batch statistics for those)
BATCH_NORM_WORDS = ("BatchNorm", "batch_norm", "torch.hub")
# libraries whose modules define no model layers of their own (what a model file may import and still be known)
PLAIN_LIBRARIES = {"torch", "math", "functools", "itertools", "collections", "dataclasses", "typing", "os", "sys", "abc",
                    "enum", "copy", "warnings", "numpy", "__future__", "json", "re", "time", "logging", "inspect",
                    "types", "operator"}


def repository_root(path: str, memo: Optional[dict] = None) -> Optional[str]:
    """The nearest folder at or above `path`'s folder that holds pyproject.toml, setup.py or .git (None: none).
    `memo` ({folder: its answer}, filled here): the folders of many files share the walk up (a run over a tree asks
    for every folder of it, and each step stats three names)."""
    d = os.path.dirname(os.path.abspath(path)) if not os.path.isdir(path) else os.path.abspath(path)
    below: list = []  # folders walked through without a marker: they share the answer found above them
    found = None
    while True:
        if memo is not None and d in memo:
            found = memo[d]
            break
        if any(os.path.exists(os.path.join(d, marker)) for marker in MARKERS):
            found = d
            break
        below.append(d)
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    if memo is not None:
        for folder in below:
            memo[folder] = found
        if found is not None:
            memo[found] = found
    return found


def _kind(name: str) -> str:
    if name.endswith(".py"):
        return "py"
    if name in _PACKAGING:
        return "pkg"
    low = name.lower()
    if low.endswith(_LAUNCHER_SUFFIXES) or name in ("Makefile", "Dockerfile", "Containerfile") or name.startswith(
            ("Dockerfile.", "Containerfile.")):
        return "run"
    return ""


def listing_key(listing: list) -> str:
    """A digest of a walk's listing: the same files with the same sizes and mtimes give the same key."""
    from neuron_migrate.files.digests import blake2b

    h = blake2b(digest_size=16)
    for rel, kind, sig in sorted(listing):
        h.update(f"{rel}\0{kind}\0{sig[0]}\0{sig[1]}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def walk(root: str) -> Optional[list]:
    """[(path relative to root, '/'-separated; kind; stat signature)] of the files the model reads: Python files,
    launchers and job files, packaging files. None when the tree has more than MAX_FILES Python files."""
    out: list = []
    todo = [("", root)]
    py = seen = 0
    while todo:
        rel, folder = todo.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        seen += len(entries)
        if seen > MAX_ENTRIES:
            return None
        if rel and any(e.name == "pyvenv.cfg" for e in entries):
            continue  # a virtual environment
        for e in entries:
            name = e.name
            try:
                if e.is_dir(follow_symlinks=False):
                    if name not in _SKIP and not name.startswith("."):
                        todo.append((f"{rel}/{name}" if rel else name, e.path))
                    continue
                kind = _kind(name)
                if not kind:
                    continue
                st = e.stat()
            except OSError:
                continue
            out.append((f"{rel}/{name}" if rel else name, kind, [st.st_size, st.st_mtime_ns]))
            if kind == "py":
                py += 1
                if py > MAX_FILES:
                    return None
    return out


def _read(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return None


MAX_FLOW_FILES = 300  # a loader module used by more files than this is not followed (NM130 keeps its wrapper)
MAP_MIN_FILES = 200  # fewer files to scan: one process (a fork and the records' way back cost more)


def _scan_all(job: tuple) -> list:
    """[(path relative to root, [kind, stat signature, record])] of the files of `job` = (root, listing)."""
    # the scans (and their patterns) load only when a file must be read: a run whose answers are cached needs none
    from neuron_migrate.repository.scan import scan_launcher, scan_packaging, scan_python

    root, listing = job
    out = []
    for rel, kind, sig in listing:
        data = _read(os.path.join(root, rel))
        if data is None:
            continue
        name = rel.rpartition("/")[2]
        if kind == "py":
            rec = scan_python(data)
            if name in _PACKAGING:
                rec["e"] = scan_packaging(name, data)
        elif kind == "pkg":
            rec = {"e": scan_packaging(name, data)}
        else:
            rec = {"r": scan_launcher(data)}
        out.append((rel, [kind, sig, rec]))
    return out


class RepositoryModel:
    """The model of one repository (see the module docstring). `records` maps each file's path relative to the
    root to [kind, stat signature, scan record]; `facts(path)` is what the rules of a file get."""

    _importers = None  # {file: names other files import from it ("*": all of them)}, made when first asked

    def __init__(self, root: str, records: dict):
        self.root = root
        self.records = records
        self.py = {rel: rec[2] for rel, rec in records.items() if rec[0] == "py"}
        self.dirs: set = set()
        self.names: set = set()  # every module stem and folder name: an import whose top name is not one is not ours
        for rel in self.py:
            self.names.add(rel.rpartition("/")[2][:-3])
            d = rel.rpartition("/")[0]
            while d and d not in self.dirs:
                self.dirs.add(d)
                self.names.add(d.rpartition("/")[2])
                d = d.rpartition("/")[0]
        self._bases: dict = {}  # file -> the folders its absolute imports are looked up in, in order
        self._folders = self._global_folders()
        self._training_of: dict = {}
        self._inits_of: dict = {}  # file -> scan.class_inits, read when first asked
        self._names_of: dict = {}  # (entry, record key) -> `_program_names`
        self._importers_of = None  # file -> the files that import it, made when first asked
        self._trackers = None  # the files that name RateTracker
        self._attrs_of: dict = {}  # file -> `_record(file, "a")`
        self._params_of: dict = {}  # file -> scan.sink_params, read with its "a" record
        self._configs = None  # `_exec_configs`, made when first asked
        self._subclasses = None  # class name -> [(file, class)] of the classes that name it as a base
        self._handed = None  # `_handed_index`, made when first asked
        self.edges: dict = {rel: self._imports_of(rel) for rel in self.py}
        self.launched: dict = {}  # entry -> modes its launchers give it ("torchrun" or nothing)
        self.entries: list = [rel for rel, rec in self.py.items() if rec.get("m")]
        self._launchers()
        self.modes: dict = {}  # module -> modes of the programs that reach it
        self.programs: dict = {}  # module -> entries of those programs
        self.program_modes: dict = {}  # entry -> its modes
        self.closures: dict = {}  # entry -> the files its program runs
        for entry in dict.fromkeys(self.entries):
            closure = self.closures[entry] = self.closure(entry)
            modes = set(self.launched.get(entry, ()))
            for rel in closure:
                rec = self.py[rel]
                modes.update(rec.get("s", ()))
                if rel == entry:
                    modes.update(rec.get("ms", ()))
            modes = sorted(modes) or [SINGLE]
            self.program_modes[entry] = modes
            for rel in closure:
                self.modes.setdefault(rel, set()).update(modes)
                self.programs.setdefault(rel, []).append(entry)

    # -- building -----------------------------------------------------------------------------------------
    @classmethod
    def build(cls, root: str, cached: Optional[dict] = None, listing: Optional[list] = None,
              map_chunks=None) -> Optional["RepositoryModel"]:
        """Scan the tree under `root` (its `walk`, unless given), reusing `cached` records (a previous model's
        `records`) whose stat signature is unchanged. None when the tree is too large. `map_chunks(fn, chunks)`: how
        the files to scan are spread over processes (pipeline.parallel.fork_map: two), when there are many."""
        if listing is None:
            listing = walk(root)
        if listing is None:
            return None
        import time

        cached = cached or {}
        records: dict = {}
        todo = []
        racy = time.time_ns() - 2_000_000_000  # a file changed in the last 2 s may change again unseen: read it
        for rel, kind, sig in listing:
            old = cached.get(rel)
            if old is not None and old[0] == kind and old[1] == sig and sig[1] < racy:
                records[rel] = old
            else:
                todo.append((rel, kind, sig))
        if map_chunks is not None and len(todo) >= MAP_MIN_FILES:
            done = [r for part in map_chunks(_scan_all, [(root, todo[0::2]), (root, todo[1::2])]) for r in part]
        else:
            done = _scan_all((root, todo))
        for rel, rec in done:
            records[rel] = rec
        return cls(root, records)

    # -- resolution ---------------------------------------------------------------------------------------
    def _module_file(self, base: str, dotted: str) -> Optional[str]:
        path = dotted.replace(".", "/")
        stem = f"{base}/{path}" if base else path
        if stem + ".py" in self.py:
            return stem + ".py"
        if stem + "/__init__.py" in self.py:
            return stem + "/__init__.py"
        return None

    def _exists(self, base: str, dotted: str) -> bool:
        """The module, or the package folder that holds it (a namespace package), is under `base`."""
        top = dotted.split(".")[0]
        stem = f"{base}/{top}" if base else top
        return stem + ".py" in self.py or stem in self.dirs

    def _package_root(self, rel: str) -> str:
        d = rel.rpartition("/")[0]
        while d and f"{d}/__init__.py" in self.py:
            d = d.rpartition("/")[0]
        return d

    def _own_folders(self, rel: str) -> list:
        """The folders a file's own `sys.path` additions name, relative to the root (outside it: left out)."""
        out = []
        here = rel.rpartition("/")[0]
        for up, sub in self.py[rel].get("p", ()):
            parts = here.split("/") if here else []
            if up > len(parts):
                continue
            folder = "/".join(parts[:len(parts) - up] + ([sub] if sub else []))
            out.append(os.path.normpath(folder).replace(os.sep, "/") if folder else "")
        return [("" if f == "." else f) for f in out]

    def _global_folders(self) -> list:
        folders = ["", "src"] if "src" in self.dirs else [""]
        for rel in self.py:
            if "p" in self.py[rel]:
                for f in self._own_folders(rel):
                    if f not in folders:
                        folders.append(f)
        return folders

    def resolve(self, rel: str, level: int, module: str, names: Optional[list] = None) -> list:
        """The repository files an import in `rel` runs: the module, the packages above it, and the submodules a
        `from` import names."""
        out: list = []
        if not level and module.partition(".")[0] not in self.names:
            return out
        if level:
            base = rel.rpartition("/")[0]
            for _ in range(level - 1):
                if not base:
                    return out
                base = base.rpartition("/")[0]
            bases = [base]
            if not module:
                init = f"{base}/__init__.py" if base else "__init__.py"
                if init in self.py:
                    out.append(init)
                for name, _local in names or ():
                    f = self._module_file(base, name)
                    if f:
                        out.append(f)
                return out
        else:
            bases = self._bases.get(rel)
            if bases is None:
                bases = self._bases[rel] = list(dict.fromkeys(
                    [rel.rpartition("/")[0], self._package_root(rel), *self._own_folders(rel), *self._folders]))
        for base in bases:
            if not self._exists(base, module):
                continue
            parts = module.split(".")
            for i in range(1, len(parts)):  # the packages above it run first
                f = self._module_file(base, ".".join(parts[:i]))
                if f:
                    out.append(f)
            f = self._module_file(base, module)
            if f:
                out.append(f)
            for name, _local in names or ():
                f = self._module_file(base, f"{module}.{name}")
                if f:
                    out.append(f)
            if out:
                return out
        return out

    def _imports_of(self, rel: str) -> list:
        rec = self.py[rel]
        out: list = []
        ours = self.names
        for imp in rec.get("i", ()):
            if imp[0] or imp[1].partition(".")[0] in ours:  # most imports are of other projects: not resolved
                out += self.resolve(rel, imp[0], imp[1], imp[2])
        for module in rec.get("d", ()):
            out += self.resolve(rel, 0, module)
        return list(dict.fromkeys(f for f in out if f != rel))

    def _launchers(self) -> None:
        by_name: dict = {}
        for rel in self.py:
            by_name.setdefault(rel.rpartition("/")[2], []).append(rel)
        for rel, (kind, _sig, rec) in self.records.items():
            here = rel.rpartition("/")[0]
            for module in rec.get("e", ()):
                f = self._module_file("src" if "src" in self.dirs and self._module_file("src", module) else "", module)
                if f:
                    self.entries.append(f)
            for target, how in rec.get("r", ()):
                found = []
                if target.startswith("-m "):
                    f = next((self._module_file(b, target[3:]) for b in self._folders if self._module_file(b, target[3:])), None)
                    if f is not None and f.endswith("/__init__.py"):
                        f = self._module_file("", target[3:].replace(".", "/") + "/__main__") or f
                    found = [f] if f else []
                else:
                    t = target.lstrip("./")
                    for cand in (f"{here}/{t}" if here else t, t):
                        cand = os.path.normpath(cand).replace(os.sep, "/")
                        if cand in self.py:
                            found = [cand]
                            break
                    if not found:  # a path relative to where the job runs: match it by its end
                        found = [r for r in by_name.get(t.rpartition("/")[2], ()) if r == t or r.endswith("/" + t)][:3]
                for f in found:
                    self.entries.append(f)
                    if how == "torchrun":
                        self.launched.setdefault(f, set()).add("torchrun")

    def closure(self, entry: str) -> list:
        """Every repository file the program `entry` runs (itself first)."""
        seen = {entry: None}
        todo = [entry]
        while todo:
            for f in self.edges.get(todo.pop(), ()):
                if f not in seen:
                    seen[f] = None
                    todo.append(f)
        return list(seen)

    # -- answers --------------------------------------------------------------------------------------------
    def rel(self, path: str) -> Optional[str]:
        p = os.path.abspath(path)
        root = self.root.rstrip(os.sep) + os.sep
        if not p.startswith(root):
            return None
        return p[len(root):].replace(os.sep, "/")

    def modes_of(self, path: str) -> list:
        """The launch modes of the programs that run the file (empty: no program of this repository runs it)."""
        rel = self.rel(path)
        return sorted(self.modes.get(rel, ())) if rel else []

    def facts(self, path: str) -> Optional[dict]:
        """What the rules of one file learn from the repository, as plain data (None: nothing):
        "modes": `modes_of`; "training": for names this file imports from other repository files, the training-step
        calls of those defs and of the methods of those classes (their bases' included), keyed "name" and
        "Class.method" by the local name (what NM406 and NM105 look up for `self.step_fn` or an imported step);
        "closed": the file's top-level classes that no other repository file imports (NM130, NM144);
        "imported": the names other repository files import from it ("*": the whole module) (NM126); "script": no
        file imports it and a loop starts at its module level (program/distributed.py: an entry point without a guard);
        "sinks"/"unseen": see `_sinks`; "rate_trackers": the other files that name RateTracker (NM144);
        "spmd_bases", "spmd_models": see `_spmd_bases`, `_spmd_models` (NM150); "pickers": `_picker_files` (NM201)."""
        rel = self.rel(path)
        if rel is None or rel not in self.py:
            return None
        out: dict = {}
        modes = self.modes.get(rel)
        if modes:
            out["modes"] = sorted(modes)
            entries = self.programs.get(rel, ())
            if rel not in entries and all(set(self.program_modes[e]) & _GROUP_LAUNCHES for e in entries) \
                    and self._only_program_importers(rel):
                # every program that runs this module starts through xmp.spawn or torch_xla.launch, whose rewrite starts
                # the process group before it calls the worker, and no other file (a test, a notebook helper) imports
                # it: the module's functions run inside a group
                out["group"] = 1
        if self.py[rel].get("k"):
            training = self._imported_training(rel)
            if training:
                out["training"] = training
            overrides = self._overrides(rel)
            if overrides:
                out["overrides"] = overrides
        bases = self._spmd_bases(rel)
        if bases:
            out["spmd_bases"] = bases
        models = self._spmd_models(rel)
        if models:
            out["spmd_models"] = models
        closed = self._closed_classes(rel)
        if closed:
            out["closed"] = closed
        imported = self._imported_names(rel)
        if imported:
            out["imported"] = sorted(imported)
        elif self.py[rel].get("tl"):
            out["script"] = 1  # no file imports it and it loops at module level: a script, guard or none (NM110)
        if self.py[rel].get("ml") or self.py[rel].get("rt"):
            out.update(self._loader_flows(rel))
        if self._handed is None:
            self._handed = self._handed_index()
        for key, index in zip(("handed_loaders", "loader_params"), self._handed):
            if rel in index:
                out[key] = index[rel]
        if self.py[rel].get("rt"):
            if self._trackers is None:
                self._trackers = [f for f, rec in self.py.items() if rec.get("rt")]
            others = [f for f in self._trackers if f != rel]
            if others:
                out["rate_trackers"] = others[:5]
        pickers = self._picker_files(rel)
        if pickers:
            out["pickers"] = pickers
        sinks, unseen = self._sinks(rel)
        if sinks:
            out["sinks"] = sinks
        if unseen:
            out["unseen"] = unseen
        if self._configs is None:
            self._configs = self._exec_configs()
        got = self._configs.get(rel)
        if got:
            out.update(got)
        return out or None

    def _importing_files(self) -> dict:
        """{file: the files that import it}, made when first asked."""
        if self._importers_of is None:
            self._importers_of = {}
            for f, to in self.edges.items():
                for t in to:
                    self._importers_of.setdefault(t, []).append(f)
        return self._importers_of

    def _picker_files(self, rel: str) -> list:
        """The other files (three at most) of the programs running `rel` that may pick the device among CUDA and
        another accelerator (scan record "dp"): such a program hands out CUDA devices on GPU hosts and, with NM203's
        branch, neuron devices on Trainium, so a function of `rel` that asks whether a device it is given is CUDA
        keeps asking that (NM201)."""
        entries = self.programs.get(rel, ())
        if entries:
            files = [f for entry in dict.fromkeys(entries) for f in self.closures.get(entry, ())]
        else:  # no program runs it (a script without a `__main__` guard imports it): its importers and imports
            files = [*self.edges.get(rel, ()), *self._importing_files().get(rel, ())]
        found: list = []
        for f in files:
            if f != rel and f not in found and self.py.get(f, {}).get("dp"):
                found.append(f)
                if len(found) == 3:
                    break
        return found

    def _is_spmd(self, rel: str) -> bool:
        return any(imp[1].startswith(_SPMD_IMPORTS) or (imp[1] == "torch_xla.distributed" and any(
            n == "spmd" for n, _l in imp[2] or ())) for imp in self.py[rel].get("i", ()))

    def _spmd_models(self, rel: str) -> dict:
        """{class name as the file writes it: `_batch_norm`'s answer} for the classes a file that imports torch_xla's
        SPMD defines or imports from other repository files (NM150: a data-parallel model that may hold BatchNorm is
        not wrapped in plain DDP, since SPMD normalised over the global batch and a process per device normalises its
        slice)."""
        if not self._is_spmd(rel):
            return {}
        names = set(self.py[rel].get("c", ()))
        for imp in self.py[rel].get("i", ()):
            for imported, local in imp[2] or ():
                if self._class_file(rel, local, 0) is not None:
                    names.add(local)
        return {name: self._batch_norm(rel, f"{name}(") for name in sorted(names)}

    def _spmd_bases(self, rel: str) -> dict:
        """{Class: what the `__init__` of its one base class, a class of another repository file, does (scan.class_inits:
        "o", "c"; with one optimizer, "a": [line, text] of the model attribute's assignment, "r": the lines that
        read it), with "in" (that file), "class" (its name there), "bases" (its own bases) and "bn" (0 when the model
        the optimizer trains is a class of this repository that holds no BatchNorm, else why it may)} for the classes of a file that imports torch_xla's SPMD (NM150: pytorch/xla's
        train_resnet_spmd_data_parallel.py subclasses a trainer whose base class builds the model and its optimizer)."""
        rec = self.py[rel]
        if not rec.get("c") or not (self._is_spmd(rel) or any(
                imp[1].startswith(_NATIVE_SHARDING_IMPORTS) for imp in rec.get("i", ()))):
            return {}
        out: dict = {}
        for cls, bases in rec["c"].items():
            if len(bases) != 1 or bases[0] in rec["c"]:
                continue
            found = self._class_file(rel, bases[0], 0)
            if found is None:
                continue
            where, name = found
            entry = {"in": where, "class": name, "bases": self.py[where]["c"][name]}
            init = self._inits(where).get(name)
            if init:
                entry.update(o=init["o"], c=init["c"])
                if len(init["o"]) == 1:
                    model = init["o"][0][1]
                    entry["r"] = [line for attr, line in init["r"] if attr == model]  # reads of self.<model>
                    if model in init["a"]:
                        entry["a"] = init["a"][model]
                        entry["bn"] = self._batch_norm(where, init["a"][model][1])
            out[cls] = entry
        return out

    def _class_file(self, rel: str, name: str, depth: int) -> "Optional[tuple]":
        """(file, class name) of the class `name` (or `module.Class`) means in `rel`, when it is a class of another
        repository file; else None."""
        if depth > 4:
            return None
        head, _, attr = name.partition(".")
        for imp in self.py.get(rel, {}).get("i", ()):
            if attr:  # `module.Class`: `import module [as alias]` or `from package import module`
                bound = imp[3] if len(imp) > 3 else imp[1] if imp[2] is None else None
                if imp[2] is None and bound == head and "." not in attr:
                    files = self.resolve(rel, imp[0], imp[1])
                elif imp[2] is not None and "." not in attr and any(local == head for _n, local in imp[2]):
                    n = next(n for n, local in imp[2] if local == head)
                    files = self.resolve(rel, imp[0], f"{imp[1]}.{n}" if imp[1] else n)
                else:
                    continue
                if files and attr in self.py[files[-1]].get("c", {}):
                    return files[-1], attr
                return None
            for imported, local in imp[2] or ():
                if local == name:
                    files = self.resolve(rel, imp[0], imp[1])
                    if not files:
                        return None
                    if imported in self.py[files[-1]].get("c", {}):
                        return files[-1], imported
                    return self._class_file(files[-1], imported, depth + 1)  # re-exported (a package's __init__.py)
        return None

    def _inits(self, rel: str) -> dict:
        got = self._inits_of.get(rel)
        if got is None:
            from neuron_migrate.repository.scan import class_inits

            data = _read(os.path.join(self.root, rel))
            got = self._inits_of[rel] = class_inits(data) if data is not None else {}
        return got

    def _batch_norm(self, rel: str, built: str):
        """0 when `built` (the text assigned to the model attribute: `Net(...).to(device)`) makes a class of this
        repository whose module, and every repository module that one imports, holds no BatchNorm and imports
        nothing beyond torch, torch_xla and the standard library; else why the model may hold BatchNorm layers."""
        import re

        m = re.match(r"([A-Za-z_][\w.]*)\(", built)
        found = self._class_file(rel, m.group(1), 0) if m else None
        if found is None and m and m.group(1) in self.py[rel].get("c", {}):
            found = (rel, m.group(1))
        if found is None:
            return f"{m.group(1) if m else built} is not a model class of this repository"
        for f in self.closure(found[0]):
            data = _read(os.path.join(self.root, f)) or b""
            if any(w.encode() in data for w in BATCH_NORM_WORDS):
                return f"{f} uses BatchNorm"
            for imp in self.py[f].get("i", ()):
                top = imp[1].partition(".")[0]
                if not imp[0] and top and top not in self.names and top not in PLAIN_LIBRARIES and top != "torch_xla":
                    return f"{f} imports {imp[1]}, whose modules may hold BatchNorm"
        return 0

    def _only_program_importers(self, rel: str) -> bool:
        """Every file that imports `rel` runs in some program (a test module or a script outside every program does
        not: it may call the module's functions without a process group)."""
        return all(f in self.programs for f in self._importing_files().get(rel, ()))

    def _exec_configs(self) -> dict:
        """nanoGPT's configuration (`exec(open('configurator.py').read())` in train.py, and in configurator.py
        `exec(open(config_file).read())` of each file named on the command line, then `globals()[key] = value` for
        each `--key=value`): {file: facts}. A program that runs such a configurator gets "exec_config":
        {"via": the configurator, "names": {global assigned above the exec: [config files that assign it]}}; each config file (a file of top-level
        assignments, imported by no file, every name of which is a global of the program) gets "config_of":
        {"program", "via", "sinks": {name: "program:line"} for its names the program passes where torch takes a
        backend or a device}: its strings are values of the program's globals and migrate with them."""
        out: dict = {}
        runs = [rel for rel, rec in self.py.items() if rec.get("x")]
        if not runs:
            return out
        imported = {t for to in self.edges.values() for t in to}
        candidates = [rel for rel, rec in self.py.items() if rec.get("cf") and rel not in imported and not rec.get("m")]
        from neuron_migrate.repository.scan import sink_names, top_names

        for prog in runs:
            via, wild = None, "*" in self.py[prog]["x"]
            folder = prog.rpartition("/")[0]
            for name in self.py[prog]["x"]:
                if name == "*":
                    continue
                for base in dict.fromkeys((folder, "")):
                    ran = os.path.normpath(f"{base}/{name}" if base else name).replace(os.sep, "/")
                    if ran != prog and ran in self.py:
                        via = via or ran
                        wild = wild or "*" in self.py[ran].get("x", ())
                        break
            if not wild:
                continue
            data = _read(os.path.join(self.root, prog)) or b""
            names = top_names(data)
            sinks = sink_names(data)
            files = [c for c in candidates if c not in (prog, via) and all(n in names for n in self.py[c]["cf"])]
            if not files:
                continue
            where = via or prog
            at = data.find(b"exec(")
            line = data.count(b"\n", 0, at) + 1
            setters: dict = {}
            for c in files:
                for n in self.py[c]["cf"]:
                    setters.setdefault(n, []).append(c)
            # what the configurator can override: the globals assigned above the exec (a later assignment wins)
            out.setdefault(prog, {})["exec_config"] = {
                "via": where, "names": {n: setters.get(n, [])[:3] for n, first in names.items() if first < line}}
            for c in files:
                own = {n: f"{prog}:{sinks[n]}" for n in self.py[c]["cf"] if n in sinks}
                out.setdefault(c, {}).setdefault("config_of", {"program": prog, "via": where, "sinks": own})
        return out

    def _related(self, rel: str, key: str) -> list:
        """[{name: [(file, line)]}]: record `key` ("a" or "v") of the files of the programs running `rel` (or, for a
        file no program runs, of the files it imports and that import it), one dict per program."""
        entries = self.programs.get(rel, ())
        if entries:
            return [self._program_names(entry, key) for entry in dict.fromkeys(entries)]
        return [{name: [(f, line)] for name, line in self._record(f, key).items()}
                for f in [*self.edges.get(rel, ()), *self._importing_files().get(rel, ())]]

    def _record(self, rel: str, key: str) -> dict:
        """Record `key` of a file: "v" from its scan; "a" (the attributes it passes where torch takes a backend or a
        device: scan._sink_attrs) read when first asked, since only the programs of the few files with config values
        ask (a scan of every file for it doubled the cold build)."""
        if key != "a":
            return self.py.get(rel, {}).get(key) or {}
        got = self._attrs_of.get(rel)
        if got is None:
            from neuron_migrate.repository.scan import _sink_attrs, sink_params

            data = _read(os.path.join(self.root, rel)) if rel in self.py else None
            got = self._attrs_of[rel] = _sink_attrs(data) if data else {}
            self._params_of[rel] = sink_params(data) if data else {}
        return got

    def _elsewhere(self, rel: str, key: str) -> dict:
        out: dict = {}
        for group in self._related(rel, key):
            for name, where in group.items():
                if name not in out:
                    found = next((f"{f}:{line}" for f, line in where if f != rel), None)
                    if found:
                        out[name] = found
        return out

    def _sinks(self, rel: str) -> tuple:
        """({attribute: "file:line"}, {attribute: "file:line"}): the attributes that other files of the programs running
        `rel` read where torch takes a backend or a device (a config field or command-line default of that name in
        `rel` is then a backend or device value: program/values.py), and the config values other files define whose
        name no file of them (this one included) is seen passing to torch: those files keep their strings, so a value
        set of this file that reaches torch through such a name cannot change alone."""
        defined = self._elsewhere(rel, "v")
        if not defined and not self.py[rel].get("v"):
            return {}, {}  # no config value in reach: nothing to follow (most files; no file is read)
        sinks = self._elsewhere(rel, "a")
        own = self._record(rel, "a")
        unseen = {name: where for name, where in defined.items() if name not in sinks and name not in own}
        return sinks, unseen

    def _program_names(self, entry: str, key: str) -> dict:
        """{name: [(file, line)], at most two files}: record `key` of the files program `entry` runs (for "a", also
        the attributes its files pass to functions of its files whose parameter reaches torch: `_passed`)."""
        got = self._names_of.get((entry, key))
        if got is None:
            got = self._names_of[(entry, key)] = {}
            files = self.closures.get(entry, ())
            for f in files:
                records = [self._record(f, key)]
                if key == "a":
                    records.append(self._passed(f, files))
                for record in records:
                    for name, line in record.items():
                        where = got.setdefault(name, [])
                        if len(where) < 2 and (f, line) not in where:
                            where.append((f, line))
        return got

    def _passed(self, rel: str, files) -> dict:
        """{attribute: line} that `rel` passes to a function of `files` whose parameter a backend or device position
        reads (`setup_distributed(cfg.dist_backend)`, `def setup_distributed(backend): init_process_group(backend=
        backend)` in another file): scan.sink_params and scan.call_attrs, read with the "a" records."""
        params: dict = {}
        for f in files:
            self._record(f, "a")  # reads its sink_params too
            for fn, spots in self._params_of.get(f, {}).items():
                params.setdefault(fn, []).extend(s for s in spots if s not in params.get(fn, []))
        if not params:
            return {}
        data = _read(os.path.join(self.root, rel))
        if not data:
            return {}
        from neuron_migrate.repository.scan import call_attrs

        return call_attrs(data, params)

    def all_facts(self) -> dict:
        """{path relative to the root: `facts`} for every Python file the model knows something about."""
        out = {}
        for rel in self.py:
            facts = self.facts(os.path.join(self.root, rel))
            if facts:
                out[rel] = facts
        return out

    def _closed_classes(self, rel: str) -> list:
        """The classes of `rel` that no other repository file imports (by name, with a star, or through its module):
        no subclass of them can override a method elsewhere, so a rewrite may follow a value from one method of
        such a class into another."""
        classes = self.py[rel].get("c", {})
        if not classes:
            return []
        imported = self._imported_names(rel)
        if "*" in imported:
            return []
        return sorted(c for c in classes if c not in imported)

    def _imported_names(self, rel: str) -> set:
        """The names other repository files import from `rel` ("*": the whole module, or all of it by a star)."""
        if self._importers is None:
            index: dict = {}
            for other, (kind, _sig, rec) in self.records.items():
                if kind != "py":
                    continue
                for imp in rec.get("i", ()):
                    level, module, names = imp[0], imp[1], imp[2]
                    if not level and module.partition(".")[0] not in self.names:
                        continue  # another project's module
                    if not module:  # `from . import a, b`: the package's names, or its submodules imported whole
                        for f in self.resolve(other, level, module, names):
                            index.setdefault(f, set()).add("*" if not f.endswith("__init__.py") else "")
                            if f.endswith("__init__.py"):
                                index[f].update(n for n, _l in names or ())
                        continue
                    files = self.resolve(other, level, module)
                    if not files:
                        continue
                    index.setdefault(files[-1], set()).update(["*"] if names is None else [n for n, _l in names])
                    for n, _l in names or ():
                        sub = self.resolve(other, level, f"{module}.{n}")
                        if sub and sub[-1] != files[-1]:
                            index.setdefault(sub[-1], set()).add("*")  # `from pkg import module`
            self._importers = index
        return self._importers.get(rel, set())

    def _imported_training(self, rel: str) -> dict:
        out: dict = {}
        for imp in self.py[rel].get("i", ()):
            if imp[2] is None:
                continue
            files = self.resolve(rel, imp[0], imp[1])
            if not files:
                continue
            target = files[-1]
            for name, local in imp[2]:
                self._defs_of(target, name, local, out, 0)
        return out

    def _defs_of(self, rel: str, name: str, local: str, out: dict, depth: int) -> None:
        """Add the training calls of def or class `name` of file `rel` to `out`, under `local`."""
        if depth > 4:
            return
        rec = self.py.get(rel, {})
        training = self._training(rel)
        if name in training:
            out.setdefault(local, training[name])
        classes = rec.get("c", {})
        if name in classes:
            prefix = name + "."
            for key, calls in training.items():
                if key.startswith(prefix):
                    out.setdefault(f"{local}.{key[len(prefix):]}", calls)
            for base in classes[name]:
                if base in classes:
                    self._defs_of(rel, base, local, out, depth + 1)
                else:
                    self._follow(rel, base, local, out, depth + 1)
        elif name not in training:
            self._follow(rel, name, local, out, depth + 1)  # re-exported (a package's __init__.py)

    def _overrides(self, rel: str) -> dict:
        """{"Class.method": {"c": training calls, "in": file}} for the classes of `rel` that classes of other files
        subclass (directly or below another subclass) and whose methods they override with a training step: a base
        class's `torch_xla.compile(self.step_fn, full_graph=True)` compiles the subclass's `step_fn` when the instance
        is one (NM406, NM105)."""
        classes = self.py[rel].get("c")
        if not classes:
            return {}
        self._subclass_index()
        out: dict = {}
        for name in classes:
            todo, seen = [(rel, name)], set()
            while todo and len(seen) < 50:
                at, cls = todo.pop()
                for other, sub in self._subclasses.get(cls, ()):
                    if (other, sub) in seen or other == at or not self._reaches(other, at):
                        continue
                    seen.add((other, sub))
                    todo.append((other, sub))
                    prefix = sub + "."
                    for key, calls in self._training(other).items():
                        if key.startswith(prefix):
                            out.setdefault(f"{name}.{key[len(prefix):]}", {"c": calls, "in": other})
        return out

    def _subclass_index(self) -> dict:
        """class name -> [(file, class)] of the classes that name it as a base (by its last dotted part)."""
        if self._subclasses is None:
            self._subclasses = {}
            for other, rec in self.py.items():
                for sub, bases in (rec.get("c") or {}).items():
                    for base in bases:
                        self._subclasses.setdefault(base.rpartition(".")[2], []).append((other, sub))
        return self._subclasses

    def _users(self, rel: str) -> list:
        """The files that may handle `rel`'s objects: those that import it (directly or through other files) and
        the files of the programs that run it (an object may be handed to a module that never imports `rel`)."""
        seen = {rel: None}
        todo = [rel]
        while todo:
            for f in self._importing_files().get(todo.pop(), ()):
                if f not in seen:
                    seen[f] = None
                    todo.append(f)
        for entry in self.programs.get(rel, ()):
            for f in self.closures.get(entry, ()):
                seen.setdefault(f, None)
        return [f for f in seen if f != rel]

    def _loader_flows(self, rel: str) -> dict:
        """What NM130 needs to give a device loader that leaves its method the plain DataLoader (flows.py), and NM144
        a tracker handed to another method:
        "loaders": {"Class.method": [[other method, argument index]]} for the methods of `rel` that return a device
        loader, where every call of them in the files that may hold the object hands the result only to those
        methods of the same object (None: somewhere it goes elsewhere); "foreign": {Class: {"defs": the methods
        its subclasses in any file define, "read"/"set": the attributes of `rel`'s own that other such files read or
        store (of those `rel` uses on `self`), "set_loader": those stored only with a device loader call}} for `rel`'s
        classes that other files import. Nothing when too many files would have to be read."""
        from neuron_migrate.repository import flows

        classes = self.py[rel].get("c")
        if not classes:
            return {}  # no class: no method returns a loader, no attribute holds one
        data = _read(os.path.join(self.root, rel))
        if not data:
            return {}
        users = self._users(rel)
        if len(users) > MAX_FLOW_FILES:
            return {}
        raws: dict = {rel: data}
        trees: dict = {}

        def raw(f):
            if f not in raws:
                raws[f] = _read(os.path.join(self.root, f)) or b""
            return raws[f]

        def tree(f):  # parsed only where a method name or a subclass is found
            if f not in trees:
                trees[f] = flows.parse(raw(f))
            return trees[f]

        out: dict = {}
        loaders: dict = {}
        if flows.returns_loader(data) and tree(rel) is not None:
            for key, (_cls, method) in flows.loader_methods(tree(rel)).items():
                uses: list = []
                for f in [rel, *users]:
                    if method.encode() not in raw(f):
                        continue
                    got = flows.result_uses(tree(f), method) if tree(f) is not None else None
                    if got is None:
                        uses = None
                        break
                    uses += [u for u in got if u not in uses]
                loaders[key] = uses
        if loaders:
            out["loaders"] = loaders
        closed = set(self._closed_classes(rel))
        own = None
        foreign: dict = {}
        for cls in classes:
            if cls in closed:
                continue
            subs, todo = set(), [cls]
            while todo and len(subs) < 50:
                for pair in self._subclass_index().get(todo.pop(), ()):
                    if pair not in subs:
                        subs.add(pair)
                        todo.append(pair[1])
            defs: set = {"*"} if todo else set()  # too many subclasses to look at
            for f in {f for f, _s in subs}:
                t = tree(f)
                if t is None:
                    defs.add("*")
                    continue
                defs |= flows.class_methods(t, {s for g, s in subs if g == f})
            others = {*users, *(f for f, _s in subs if f != rel)}
            if own is None and others:
                own = flows.own_attributes(data)
            seen_read, seen_set, seen_loaders = set(), set(), set()
            for f in others:
                r, s, loaders_set = flows.attribute_names(raw(f), own)
                seen_read |= r
                seen_set |= s
                seen_loaders |= loaders_set
            foreign[cls] = {"defs": sorted(defs), "read": sorted(seen_read), "set": sorted(seen_set),
                            "set_loader": sorted(seen_loaders - seen_set)}
        if foreign:
            out["foreign"] = foreign
        return out

    def _handed_index(self) -> tuple:
        """NM130's device loaders handed to a function of another file (flows.handed_loaders): ({builder: {local
        function name: [[argument index, the function's file]]}}, {that file: {function: [argument index]}}). A
        function counts when it only iterates that parameter (flows.only_iterated) and every mention of it in the
        repository is a call by its own name handing, at that index, a loader that goes only to such functions: the
        builder then passes the plain loader and the function's loops move each batch to the device, one answer read
        by both files' rules."""
        from neuron_migrate.repository import flows

        builders: dict = {}
        callees: dict = {}
        makers = [f for f, rec in self.py.items() if rec.get("ml")]
        if not makers or len(makers) > MAX_FLOW_FILES:
            return builders, callees
        raws: dict = {}
        trees: dict = {}
        groups: dict = {}

        def raw(f):
            if f not in raws:
                raws[f] = _read(os.path.join(self.root, f)) or b""
            return raws[f]

        def tree(f):
            if f not in trees:
                trees[f] = flows.parse(raw(f))
            return trees[f]

        def groups_in(f):  # the loaders of `f` that only go into calls of plain names (flows.handed_loaders)
            if f not in groups:
                # parsed only where a line calls a name imported from another file of the repository with a device
                # loader on it (the scan's answer is cheap; a parse of every loader-building file is not)
                t = tree(f) if self.py.get(f, {}).get("ml") and flows.may_hand_loader(raw(f), imported(f)) else None
                groups[f] = flows.handed_loaders(t) if t is not None else []
            return groups[f]

        def imported(f):  # the local names `from ... import` binds in `f` to names of other repository files
            out = set()
            for imp in self.py[f].get("i", ()):
                if imp[2] and (imp[0] or imp[1].partition(".")[0] in self.names) and self.resolve(f, imp[0], imp[1]):
                    out.update(loc for _n, loc in imp[2])
            return out

        def target(f, local):  # (file, def name) that a `from ... import` of `f` binds `local` to
            for imp in self.py[f].get("i", ()):
                if imp[2] is None:
                    continue
                for name, loc in imp[2]:
                    if loc == local:
                        files = self.resolve(f, imp[0], imp[1])
                        return (files[-1], name) if files and files[-1] != f else None
            return None

        keys: dict = {}  # (file, def, index) -> its mentions (ids of Name nodes) over the repository, or None
        for b in makers:
            for group in groups_in(b):
                for local, index, _call in group:
                    got = target(b, local)
                    if got is not None and (*got, index) not in keys:
                        keys[(*got, index)] = self._mentions(*got, index, raw, tree, target)
        valid = {k for k, v in keys.items() if v is not None}
        while True:  # a loader counts when all its calls do; a function when each of its calls hands such a loader
            handed: dict = {}  # id of a call's function name -> (key, builder, local) of a loader that counts
            for b in makers:
                for group in groups_in(b):
                    resolved = [(target(b, local), index, call, local) for local, index, call in group]
                    if all(t is not None and (*t, index) in valid for t, index, _c, _l in resolved):
                        for t, index, call, local in resolved:
                            handed[id(call.func)] = ((*t, index), b, local)
            still = {k for k in valid if all(handed.get(m, (None,))[0] == k for m in keys[k])}
            if still == valid:
                break
            valid = still
        for key, b, local in handed.values():
            if key not in valid:
                continue
            c, name, index = key
            entry = builders.setdefault(b, {}).setdefault(local, [])
            rel = os.path.relpath(c, os.path.dirname(b) or ".").replace(os.sep, "/")
            if [index, rel] not in entry:
                entry.append([index, rel])
            params = callees.setdefault(c, {}).setdefault(name, [])
            if index not in params:
                params.append(index)
        return builders, callees

    def _mentions(self, c: str, name: str, index: int, raw, tree, target) -> "Optional[list]":
        """The ids of the Name nodes that mention def `name` of file `c` anywhere in the repository, when the def only
        iterates parameter `index` and every file that mentions it imports it from `c` by that name; else None."""
        import ast

        from neuron_migrate.repository import flows

        t = tree(c)
        fn = flows.top_level_def(t, name) if t is not None else None
        if fn is None or not flows.only_iterated(fn, index):
            return None
        users = [c, *self._users(c)]
        if len(users) > MAX_FLOW_FILES:
            return None
        needle = name.encode()
        out: list = []
        for f in users:
            if needle not in raw(f):
                continue
            ft = tree(f)
            if ft is None or (f != c and target(f, name) != (c, name)):
                return None  # another function of that name, or this one reached otherwise
            for n in ast.walk(ft):
                if isinstance(n, ast.Attribute) and n.attr == name:
                    return None  # `engine.train_one_epoch(...)`, `obj.train_one_epoch`: not followed
                if isinstance(n, ast.Name) and n.id == name:
                    out.append(id(n))
        return out

    def _reaches(self, rel: str, target: str) -> bool:
        """`rel` imports `target`, itself or through a package's `__init__.py` that imports it."""
        to = self.edges.get(rel, ())
        return target in to or any(t.endswith("__init__.py") and target in self.edges.get(t, ()) for t in to)

    def _training(self, rel: str) -> dict:
        """{"func" / "Class.method": training calls} of a file (read when first asked: few files are)."""
        if not self.py.get(rel, {}).get("t"):
            return {}
        got = self._training_of.get(rel)
        if got is None:
            from neuron_migrate.repository.scan import training_defs

            data = _read(os.path.join(self.root, rel))
            got = self._training_of[rel] = training_defs(data) if data is not None else {}
        return got

    def _follow(self, rel: str, name: str, local: str, out: dict, depth: int) -> None:
        """`name` is imported into `rel` from another repository file: look there."""
        for imp in self.py.get(rel, {}).get("i", ()):
            if imp[2] is None:
                continue
            for imported, bound in imp[2]:
                if bound == name:
                    files = self.resolve(rel, imp[0], imp[1])
                    if files:
                        self._defs_of(files[-1], imported, local, out, depth)
                    return
