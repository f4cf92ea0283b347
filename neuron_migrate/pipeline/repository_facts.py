"""Build the repository model (repository/model.py) once per run, and hand each Python file of the run what it says
about that file (`Settings.outside`, by absolute path; a file's rules read it as `analysis.outside`).

Each file belongs to the repository root above it: the nearest folder with pyproject.toml, setup.py or .git (else
the folder named on the command line that holds it, else its own folder), so that `rewrite FILE`, a pre-commit run
and the editor server see the same programs as a run over the whole tree. The model's answers and its scan records are kept
in the results cache folder (`repository-<root digest>.facts.json` and `.records.json`): a run whose walk finds every
file as it was reads the answers back; else only the files whose size or mtime changed are read again. Without a
cache folder (`--no-cache`, `cache = false`) the model is built from scratch.
"""
from __future__ import annotations

import json
import os

TYPE_CHECKING = False  # typing is not imported at run time (start-up): it serves annotations only
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Optional

_PYTHON = (".py", ".pyi")
# the layout of a facts cache file (2: "closed" classes, 3: "sinks", 4: "rate_trackers", 5: "loaders", "foreign",
# 6: "spmd_bases", 7: "tags", each file's `tag`, 8: "spmd_models", 9: "imported", 11: "handed_loaders",
# "loader_params")
FACTS = 11
UNKNOWN = {"modes": ["unknown"]}  # a file of a repository too large to model: its programs are not known
# root -> [listing key, {rel: facts}, model or None, monotonic time]: what this process knows (the server asks again)
_KNOWN: dict = {}
_TAGS: dict = {}  # root -> {rel: `tag` of its facts}, as the facts cache file keeps them (a warm run computes none)
TIMINGS: dict = {}  # root -> seconds its last model build took (NEURON_MIGRATE_MODEL_TIME reports them)


def roots_of(paths: list, run_paths: list = ()) -> dict:
    """{repository root: [absolute paths of the Python files under it]} for the Python files among `paths`."""
    from neuron_migrate.repository.model import repository_root

    tops = [os.path.abspath(p) for p in run_paths if os.path.isdir(p)]
    by_folder: dict = {}
    memo: dict = {}  # folder -> repository_root's answer, shared by the folders on the way up
    out: dict = {}
    for path in paths:
        if not path.endswith(_PYTHON):
            continue
        p = os.path.abspath(path)
        folder = os.path.dirname(p)
        root = by_folder.get(folder)
        if root is None:
            root = repository_root(p, memo)
            if root is None:
                root = next((t for t in sorted(tops, key=len) if folder == t or folder.startswith(t + os.sep)), folder)
            by_folder[folder] = root
        out.setdefault(root, []).append(p)
    return out


def _cache_files(folder: "Path", root: str) -> tuple:
    from neuron_migrate.files.digests import blake2b

    stem = f"repository-{blake2b(root.encode(), digest_size=8).hexdigest()}"
    return folder / f"{stem}.facts.json", folder / f"{stem}.records.json"


def _load(path: "Path") -> "Optional[dict]":
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class ModelFacts:
    """A model's answers, each file's computed when first asked (`get(rel)`, as `RepositoryModel.all_facts()[rel]`):
    a run without a cache folder saves none, so the workers of a run compute those of their own files (forked after
    the model is built, they share it) instead of this process computing every file's before any check starts."""

    def __init__(self, model):
        self.model = model
        self._got: dict = {}

    def get(self, rel: str, default=None):
        got = self._got.get(rel, self)
        if got is self:
            got = self._got[rel] = self.model.facts(os.path.join(self.model.root, rel)) or None
        return default if got is None else got


class LazyOutside:
    """{absolute path: facts} of a run's files, as `repository_facts` gives it, each file's facts computed when first
    asked (ModelFacts). Pickled (the spawned workers of a platform without fork), it is that dict."""

    def __init__(self, entries: dict):
        # absolute path -> (ModelFacts, path relative to its root, None) or (None, facts, their `tag` or None)
        self._entries = entries

    def get(self, path: str, default=None):
        e = self._entries.get(path)
        if e is None:
            return default
        source, rel, _tag = e
        got = rel if source is None else source.get(rel)
        return got if got else default

    def tag_of(self, path: str) -> str:
        """`tag` of the file at absolute `path`: the facts cache file's, else computed."""
        e = self._entries.get(path)
        if e is not None and e[2] is not None:
            return e[2]
        facts = self.get(path)
        return _tag_of(facts) if facts else ""

    def __bool__(self) -> bool:
        return bool(self._entries)

    def __contains__(self, path: str) -> bool:
        """A file of the run (NM130 hands a plain loader only to a function whose file is rewritten too)."""
        return path in self._entries

    def materialize(self) -> dict:
        return {p: f for p in self._entries for f in (self.get(p),) if f}

    def __reduce__(self):
        return dict, (self.materialize(),)


def root_facts(root: str, cache_folder: "Optional[Path]" = None, max_age: float = 0.0, jobs: int = 1,
               lazy: bool = False) -> "Optional[dict]":
    """{path relative to `root`: facts} for the repository at `root` (None when the tree is too large to model).

    A run walks the tree (one stat per file): when no file was added, removed or changed since the facts were last
    computed (here, or by a run that left them in `cache_folder`), they are read back as they are; else the model is
    built again, reading only the files whose size or mtime changed. With `max_age`, facts this process computed
    less than that many seconds ago are reused without a walk (the editor server, at every keystroke). With `jobs` > 1
the files to scan are shared with a second process when there are many. With `lazy` and no `cache_folder`, the
answers are a ModelFacts (each file's computed when first asked)."""
    import time

    from neuron_migrate.repository.model import RECORDS, RepositoryModel, listing_key, walk

    now = time.monotonic()
    known = _KNOWN.get(root)
    if known is not None and max_age and now - known[3] < max_age:
        return known[1]
    listing = walk(root)
    if listing is None:
        return None
    key = listing_key(listing)
    # a file changed in the last 2 s may change again within the clock's granularity ("racy"): then the answers are
    # computed again rather than trusted by its size and mtime
    if max((sig[1] for _rel, _kind, sig in listing), default=0) > time.time_ns() - 2_000_000_000:
        key = None
    if known is not None and key is not None and known[0] == key:
        known[3] = now
        return known[1]
    facts_file = records_file = None
    if cache_folder is not None:
        facts_file, records_file = _cache_files(cache_folder, root)
        data = _load(facts_file) if key is not None else None
        if data and data.get("format") == FACTS and data.get("root") == root and data.get("key") == key:
            _KNOWN[root] = [key, data.get("facts") or {}, None, now]
            tags = data.get("tags")
            _TAGS[root] = tags if isinstance(tags, dict) else {}
            return _KNOWN[root][1]
    cached = known[2].records if known is not None and known[2] is not None else None
    if cached is None and records_file is not None:
        data = _load(records_file)
        if data and data.get("format") == RECORDS and data.get("root") == root:
            cached = data.get("files")
    map_chunks = None
    if jobs > 1:
        from neuron_migrate.pipeline.parallel import fork_map

        map_chunks = fork_map
    model = RepositoryModel.build(root, cached if isinstance(cached, dict) else None, listing, map_chunks)
    if model is None:
        facts = {}
    elif lazy and facts_file is None:
        facts = ModelFacts(model)
    else:
        facts = model.all_facts()
    TIMINGS[root] = time.monotonic() - now
    _KNOWN[root] = [key, facts, model, now]
    _TAGS.pop(root, None)  # those of earlier facts: set again below when these are saved
    if model is not None and facts_file is not None:
        if model.records != cached:
            _save(records_file, {"format": RECORDS, "root": root, "files": model.records})
        if key is not None:
            tags = _TAGS[root] = {rel: _tag_of(f) for rel, f in facts.items()}
            _save(facts_file, {"format": FACTS, "root": root, "key": key, "facts": facts, "tags": tags})
    return facts


def _save(target: "Path", data: dict) -> None:
    import tempfile

    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        ignore = target.parent / ".gitignore"
        if not ignore.exists():
            ignore.write_text("# created by neuron-migrate\n*\n")
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".repository-", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, separators=(",", ":"))
        os.replace(tmp, target)
    except OSError:
        pass  # a cache that cannot be written only costs the next run a scan


def repository_facts(paths: list, run_paths: list = (), cache_folder: "Optional[Path]" = None,
                     max_age: float = 0.0, jobs: int = 1, lazy: bool = False) -> dict:
    """{absolute path: facts} for the Python files among `paths` that the repository model knows something about.
    With `lazy`, a LazyOutside that computes each file's facts when first asked, where no cache keeps them."""
    import time

    started = time.monotonic()
    out: dict = {}
    entries: dict = {}
    for root, files in roots_of(paths, run_paths).items():
        facts = root_facts(root, cache_folder, max_age, jobs, lazy)
        if facts is None:  # too large to model: no file of it is known to be single-process
            for p in files:
                out[p] = UNKNOWN
                entries[p] = (None, UNKNOWN, None)
            continue
        prefix = root.rstrip(os.sep) + os.sep
        if isinstance(facts, ModelFacts):
            for p in files:
                if p.startswith(prefix):
                    entries[p] = (facts, p[len(prefix):].replace(os.sep, "/"), None)
            continue
        tags = _TAGS.get(root) or {}
        for p in files:
            rel = p[len(prefix):].replace(os.sep, "/") if p.startswith(prefix) else None
            f = facts.get(rel) if rel is not None else None
            if f:
                out[p] = f
                entries[p] = (None, f, tags.get(rel))
    if lazy:
        out = LazyOutside(entries)
    if os.environ.get("NEURON_MIGRATE_MODEL_TIME"):  # the model's own cost, for measurements
        import sys

        sys.stderr.write(f"repository model: {time.monotonic() - started:.4f} s\n")
    return out


def tag(outside: "Optional[dict]", path: str) -> str:
    """What the facts of one file add to its cache identity ("" when none): a digest of them."""
    if not outside:
        return ""
    p = os.path.abspath(path)
    tag_of = getattr(outside, "tag_of", None)
    if tag_of is not None:
        got = tag_of(p)
    else:
        facts = outside.get(p)
        got = _tag_of(facts) if facts else ""
    if got.endswith(_HANDS):
        # NM130 hands a plain loader only to functions whose files this run rewrites too: which of them it does is
        # part of the answer
        here = os.path.dirname(p)
        got += "".join("1" if os.path.normpath(os.path.join(here, rel)) in outside else "0"
                       for _name, pairs in sorted(outside.get(p, {}).get("handed_loaders", {}).items())
                       for _index, rel in pairs)
    return got


_HANDS = "~h"  # the end of the `tag` of a file whose facts name "handed_loaders"


def _tag_of(facts: dict) -> str:
    from neuron_migrate.files.digests import blake2b

    text = json.dumps(facts, sort_keys=True, separators=(",", ":"))
    return "+" + blake2b(text.encode(), digest_size=8).hexdigest() + (_HANDS if "handed_loaders" in facts else "")
