"""Build the repository model (repository/model.py) once per run, and hand each Python file of the run what it says
about that file (`Settings.outside`, by absolute path; a file's rules read it as `analysis.outside`).

Each file belongs to the repository root above it: the nearest folder with pyproject.toml, setup.py or .git (else
the folder named on the command line that holds it, else its own folder), so that `rewrite FILE`, a pre-commit run
and the editor server see the same programs as a run over the whole tree. The model's scan records are kept in the
results cache folder (`repository-<root digest>.json`), keyed by each file's size and mtime: a second run reads only
the files that changed. Without a cache folder (`--no-cache`, `cache = false`) the model is built from scratch.
"""
from __future__ import annotations

import json
import os

TYPE_CHECKING = False  # typing is not imported at run time (start-up): it serves annotations only
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Optional

_PYTHON = (".py", ".pyi")
_MODELS: dict = {}  # root -> (model, built at): the models this process built (the editor server asks again)
TIMINGS: dict = {}  # root -> seconds the last build took (benchmarks read it through NEURON_MIGRATE_MODEL_TIME)


def roots_of(paths: list, run_paths: list = ()) -> dict:
    """{repository root: [absolute paths of the Python files under it]} for the Python files among `paths`."""
    from neuron_migrate.repository.model import repository_root

    tops = [os.path.abspath(p) for p in run_paths if os.path.isdir(p)]
    by_folder: dict = {}
    out: dict = {}
    for path in paths:
        if not path.endswith(_PYTHON):
            continue
        p = os.path.abspath(path)
        folder = os.path.dirname(p)
        root = by_folder.get(folder)
        if root is None:
            root = repository_root(p)
            if root is None:
                root = next((t for t in sorted(tops, key=len) if folder == t or folder.startswith(t + os.sep)), folder)
            by_folder[folder] = root
        out.setdefault(root, []).append(p)
    return out


def _records_file(folder: "Path", root: str) -> "Path":
    from neuron_migrate.files.digests import blake2b

    return folder / f"repository-{blake2b(root.encode(), digest_size=8).hexdigest()}.json"


def model_for(root: str, cache_folder: "Optional[Path]" = None, max_age: float = 0.0):
    """The repository model of `root` (None when the tree is too large). With `max_age`, a model this process built
    less than that many seconds ago is reused (the editor server)."""
    import time

    from neuron_migrate.repository.model import RECORDS, RepositoryModel

    now = time.monotonic()
    known = _MODELS.get(root)
    if known is not None and max_age and now - known[1] < max_age:
        return known[0]
    cached = known[0].records if known is not None and known[0] is not None else None
    target = _records_file(cache_folder, root) if cache_folder is not None else None
    if cached is None and target is not None:
        try:
            data = json.loads(target.read_text(encoding="utf-8"))
            if data.get("format") == RECORDS and data.get("root") == root:
                cached = data["files"]
        except (OSError, ValueError, KeyError, AttributeError, TypeError):
            cached = None
    model = RepositoryModel.build(root, cached)
    TIMINGS[root] = time.monotonic() - now
    _MODELS[root] = (model, now)
    if model is not None and target is not None and model.records != (cached or {}):
        _save(target, {"format": RECORDS, "root": root, "files": model.records})
    return model


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
        pass  # a record cache that cannot be written only costs the next run a scan


def repository_facts(paths: list, run_paths: list = (), cache_folder: "Optional[Path]" = None,
                     max_age: float = 0.0) -> dict:
    """{absolute path: facts} for the Python files among `paths` that the repository model knows something about."""
    out: dict = {}
    for root, files in roots_of(paths, run_paths).items():
        model = model_for(root, cache_folder, max_age)
        if model is None:
            continue
        for p in files:
            facts = model.facts(p)
            if facts:
                out[p] = facts
    if os.environ.get("NEURON_MIGRATE_MODEL_TIME"):  # benchmarks/run.py: the model's own cost
        import sys

        sys.stderr.write(f"repository model: {sum(TIMINGS.values()):.4f} s\n")
    return out


def tag(outside: "Optional[dict]", path: str) -> str:
    """What the facts of one file add to its cache identity ("" when none)."""
    if not outside:
        return ""
    facts = outside.get(os.path.abspath(path))
    return "" if not facts else "+" + json.dumps(facts, sort_keys=True, separators=(",", ":"))
