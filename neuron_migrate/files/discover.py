"""Find the files to process: `.py` and `.ipynb` under the given paths, minus .gitignore'd and excluded ones."""
from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path

SUFFIXES = (".py", ".pyi", ".ipynb")


def file_kind(name: str) -> str:
    """What a file is, from its name: python, notebook, shell, dockerfile, env, yaml, requirements, pyproject,
    setup.py, setup.cfg or conda ("" for anything else)."""
    low = name.lower()
    if name == "setup.py":
        return "setup.py"
    if low.endswith((".py", ".pyi")):
        return "python"
    if low.endswith(".ipynb"):
        return "notebook"
    if low.endswith((".sh", ".bash", ".slurm", ".sbatch")):
        return "shell"
    if name in ("Dockerfile", "Containerfile") or name.startswith(("Dockerfile.", "Containerfile.")) or low.endswith(".dockerfile"):
        return "dockerfile"
    if name == ".env" or low.endswith(".env") or name.startswith(".env."):
        return "env"
    if name in ("pyproject.toml", "setup.cfg"):
        return "pyproject" if name == "pyproject.toml" else "setup.cfg"
    if low.startswith("requirements") and low.endswith((".txt", ".in")) or low.endswith("requirements.txt"):
        return "requirements"
    if low.endswith((".yml", ".yaml")):
        return "conda" if low.startswith("environment") else "yaml"
    return ""


def _wanted(name: str) -> bool:
    # also launchers, job files and dependency lists: their rules are not Python rules (see file_kind)
    return name.endswith(SUFFIXES) or bool(file_kind(name))
ALWAYS_SKIP = {".git", ".hg", ".svn", "__pycache__", ".venv", "venv", ".tox", ".nox", ".mypy_cache",
               ".pytest_cache", ".ruff_cache", "node_modules", ".ipynb_checkpoints", ".neuron-migrate-cache", "site-packages"}


# Plain classes, not dataclasses: importing dataclasses (and the inspect module it imports) costs every start-up
# about 20 ms. Nothing compares these records, so they keep identity equality.
class IgnoreRule:
    """One pattern line of an ignore file, compiled."""

    def __init__(self, regex: re.Pattern, negate: bool, dir_only: bool):
        self.regex = regex
        self.negate = negate
        self.dir_only = dir_only


def _compile_gitignore_pattern(pat: str) -> tuple[re.Pattern, bool]:
    """A .gitignore pattern as a regex over the path relative to the .gitignore's folder."""
    anchored = "/" in pat.rstrip("/")
    pat = pat.strip("/")
    out = []
    i = 0
    while i < len(pat):
        c = pat[i]
        if c == "*":
            if pat[i : i + 2] == "**":
                out.append(".*")
                i += 2
                if i < len(pat) and pat[i] == "/":
                    i += 1
                    out[-1] = "(?:.*/)?"
                continue
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = pat.find("]", i)
            if j < 0:
                out.append(re.escape(c))
            else:
                out.append(pat[i : j + 1].replace("[!", "[^"))
                i = j
        else:
            out.append(re.escape(c))
        i += 1
    body = "".join(out)
    prefix = "" if anchored else "(?:.*/)?"
    return re.compile(f"^{prefix}{body}(?:/.*)?$"), anchored


class IgnoreFile:
    """The rules of one ignore file, relative to the folder it is in."""

    def __init__(self, base: Path, rules: list[IgnoreRule] | None = None):
        self.base = base
        self.rules = [] if rules is None else rules

    @property
    def base_abs(self) -> str:
        v = self.__dict__.get("_base_abs")
        if v is None:
            v = self.__dict__["_base_abs"] = os.path.abspath(self.base)
        return v

    @classmethod
    def load(cls, folder: Path) -> "IgnoreFile | None":
        f = folder / ".gitignore"
        try:
            lines = f.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return None
        rules = []
        for line in lines:
            line = line.rstrip()
            if not line or line.startswith("#"):
                continue
            negate = line.startswith("!")
            if negate:
                line = line[1:]
            dir_only = line.endswith("/")
            regex, _ = _compile_gitignore_pattern(line)
            rules.append(IgnoreRule(regex, negate, dir_only))
        return cls(folder, rules) if rules else None

    def decision(self, rel: str, is_dir: bool) -> bool | None:
        result = None
        for r in self.rules:
            if r.dir_only and not is_dir:
                # a dir-only pattern still matches files below that dir
                if not r.regex.pattern.endswith("(?:/.*)?$") or "/" not in rel:
                    continue
                parent = rel.rsplit("/", 1)[0]
                if not r.regex.match(parent):
                    continue
                result = not r.negate
                continue
            if r.regex.match(rel):
                result = not r.negate
        return result


def _excluded(rel: str, name: str, patterns: list[str], base_rel: str | None = None) -> bool:
    """Does a glob of `exclude` match? Tried on the path below the walked root, below the project (the
    folder of the pyproject.toml) and on the bare name; a pattern naming a folder excludes what is inside."""
    for pat in patterns:
        pat = pat.rstrip("/")
        if pat.startswith("./"):
            pat = pat[2:]
        for r in (rel, base_rel):
            if r is None:
                continue
            if fnmatch.fnmatch(r, pat) or fnmatch.fnmatch(r, pat + "/*") or r.startswith(pat + "/"):
                return True
        if fnmatch.fnmatch(name, pat):
            return True
    return False


def _rel_to(path: Path, base: Path | None) -> str | None:
    if base is None:
        return None
    try:
        return Path(os.path.abspath(path)).relative_to(base).as_posix()
    except ValueError:
        return None


def discover(paths: list[str], exclude: list[str] = (), respect_gitignore: bool = True, force: bool = False,
             base: Path | None = None, stats: dict | None = None) -> tuple[list[Path], list[str]]:
    """Return (files, messages). Explicitly named files are always included unless `force` (--force-exclude):
    then `exclude`, the always-skipped folders (.venv, site-packages, ...) and .gitignore apply to them too, as
    they do to files found in folders. `base` is the project folder that exclude patterns are relative to.
    `stats`, when given, counts what was left out: {"gitignore": n, "exclude": n, "force-exclude": n} files
    (folders left out whole count once each under "gitignore-dirs"/"exclude-dirs")."""
    files: list[Path] = []
    messages: list[str] = []
    seen: set = set()
    stats = stats if stats is not None else {}
    base = Path(os.path.abspath(base)) if base is not None else None

    def add(p: Path) -> None:
        try:
            st = os.stat(p)  # one system call (resolve() costs one per path component)
            key = (st.st_dev, st.st_ino)
        except (OSError, RuntimeError):
            messages.append(f"{p}: cannot resolve path (symlink loop?)")
            return
        if key not in seen:
            seen.add(key)
            files.append(p)

    for raw in paths:
        root = Path(raw)
        try:
            _discover_one(root, raw, list(exclude), respect_gitignore, force, add, messages, base, stats)
        except OSError as exc:
            messages.append(f"{raw}: cannot access: {exc.strerror or exc}")
    return files, messages


def _count(stats: dict, key: str) -> None:
    stats[key] = stats.get(key, 0) + 1


def _gitignores_above(root: Path) -> list:
    """.gitignore files above `root` (up to the repository top) apply as well."""
    ignores = []
    up = root.resolve()
    chain = []
    while True:
        chain.append(up)
        if (up / ".git").exists() or up.parent == up:
            break
        up = up.parent
    for folder in reversed(chain[1:]):
        ig = IgnoreFile.load(folder)
        if ig:
            ignores.append(ig)
    return ignores


def _discover_one(root: Path, raw: str, exclude, respect_gitignore: bool, force: bool, add, messages, base, stats) -> None:
    if not os.path.lexists(root):
        messages.append(f"{raw}: no such file or directory")
        return
    if root.is_file() or (root.is_symlink() and not root.is_dir()):
        if not root.exists():
            messages.append(f"{raw}: broken symlink or symlink loop")
            return
        if force:
            base_rel = _rel_to(root, base)
            parts = (base_rel or root.as_posix()).split("/")[:-1]
            if any(p in ALWAYS_SKIP for p in parts) or _excluded(root.as_posix(), root.name, exclude, base_rel):
                _count(stats, "force-exclude")
                return
            if respect_gitignore:
                ignores = _gitignores_above(root.parent) + [ig for ig in [IgnoreFile.load(root.parent)] if ig]
                if _ignored(root, False, ignores) or any(_ignored(d, True, ignores) for d in root.resolve().parents):
                    _count(stats, "force-exclude")
                    return
        add(root)
        return
    ignores: list[IgnoreFile] = _gitignores_above(root) if respect_gitignore else []
    visited_dirs: set = set()
    _walk(root, root, ignores, exclude, respect_gitignore, add, messages, visited_dirs, base, stats)


def _ignored(path: Path, is_dir: bool, ignores: list[IgnoreFile]) -> bool:
    result = None
    absolute = None
    for ig in ignores:
        rel = None
        if ig.base.is_absolute():
            if absolute is None:
                absolute = os.path.abspath(path)
            base = ig.base_abs
            if absolute.startswith(base) and absolute[len(base):len(base) + 1] == os.sep:
                rel = absolute[len(base) + 1:].replace(os.sep, "/")  # the common case, without resolving links
        try:
            if rel is None:
                rel = path.resolve().relative_to(ig.base.resolve()).as_posix() if ig.base.is_absolute() else path.relative_to(ig.base).as_posix()
        except ValueError:
            continue
        d = ig.decision(rel, is_dir)
        if d is not None:
            result = d
    return bool(result)


def _walk(folder: Path, root: Path, ignores, exclude, respect_gitignore, add, messages, visited, base=None, stats=None) -> None:
    stats = stats if stats is not None else {}
    try:
        st = os.stat(folder)  # the folder's identity: one system call (resolve() costs one per path component)
    except (OSError, RuntimeError):
        messages.append(f"{folder}: cannot resolve (symlink loop?)")
        return
    real = (st.st_dev, st.st_ino)
    if real in visited:
        return  # symlink cycle
    visited.add(real)
    if respect_gitignore:
        ig = IgnoreFile.load(folder)
        if ig:
            ignores = [*ignores, ig]
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as exc:
        messages.append(f"{folder}: cannot list: {exc.strerror}")
        return
    check_ignores = respect_gitignore and bool(ignores)
    for entry in entries:
        name = entry.name
        try:
            is_dir = entry.is_dir()
        except OSError as exc:  # e.g. ELOOP on a symlink cycle
            if _wanted(name):
                messages.append(f"{Path(entry.path)}: cannot access ({exc.strerror or exc}; symlink loop?)")
            continue
        if is_dir:
            if name in ALWAYS_SKIP:
                continue
        elif not _wanted(name):
            continue  # most entries of a source tree: no Path is made for them
        path = Path(entry.path)
        if exclude:
            rel = path.relative_to(root).as_posix()
            if _excluded(rel, name, exclude, _rel_to(path, base)):
                _count(stats, "exclude-dirs" if is_dir else "exclude")
                continue
        if check_ignores and _ignored(path, is_dir, ignores):
            _count(stats, "gitignore-dirs" if is_dir else "gitignore")
            continue
        if is_dir:
            _walk(path, root, ignores, exclude, respect_gitignore, add, messages, visited, base, stats)
        elif entry.is_symlink() and not path.exists():
            messages.append(f"{path}: broken symlink or symlink loop")
        else:
            add(path)
