"""Per-file results cached by content, so that a second run over an unchanged tree does almost nothing.

The key of a cache file covers the tool version, the rule and table sources, the active rules, the mode
(audit or rewrite) and the settings; inside it, each path maps to the content digest its result is for.
The cache is JSON (never pickle: the folder sits in the user's tree) and a corrupt or unreadable cache is a
warning, never a failure. `.neuron-migrate-cache/` holds a `.gitignore` so it is never committed.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from neuron_migrate.files.digests import blake2b
from neuron_migrate.pipeline.process import FileResult

FOLDER = ".neuron-migrate-cache"
KEEP = 32  # cache files (one per key) kept; older ones are pruned


_FINGERPRINT: list = []


def _code_fingerprint() -> str:
    """Changes whenever rule code, rule data or table data changes (stat-based: cheap; once per run)."""
    if not _FINGERPRINT:
        _FINGERPRINT.append(_compute_fingerprint())
    return _FINGERPRINT[0]


def _compute_fingerprint() -> str:
    import neuron_migrate
    from neuron_migrate._data import data_dir

    # the sources' sizes and times below change with every release; the version (importlib.metadata,
    # slow to import) adds nothing
    h = blake2b(b"neuron-migrate results v3", digest_size=16)
    pkg = os.path.dirname(neuron_migrate.__file__)
    roots = [os.path.join(pkg, d) for d in ("rules", "rewrite", "files", "names", "program", "shell", "deps", "table")]
    found: list = []
    for root in [*roots, str(data_dir("rules")), str(data_dir("compat_table"))]:
        _sources_under(root, found)
    for path, st in sorted(found):
        h.update(f"{path}:{st.st_size}:{st.st_mtime_ns}".encode())
    try:  # the default table follows the installed torch family (importlib.metadata, no torch import)
        from neuron_migrate.table.choice import default_table_path

        h.update(default_table_path()[0].name.encode())
    except Exception:  # noqa: BLE001 - no table: the NM3xx rules say so themselves
        pass
    return h.hexdigest()


def _sources_under(folder: str, out: list) -> None:
    """(path, stat) of the .py, .yaml, .yml and .json files under a folder (bytecode folders skipped)."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for e in entries:
        if e.is_dir():
            if e.name != "__pycache__":
                _sources_under(e.path, out)
        elif e.name.endswith((".py", ".yaml", ".yml", ".json")):
            out.append((e.path, e.stat()))


def cache_key(codes, settings_kw: dict, fix: bool) -> str:
    material = json.dumps([_code_fingerprint(), [sorted(c) for c in codes] if codes and isinstance(codes[0], (tuple, list)) else sorted(codes),
                           settings_kw, fix, sys.version_info[:2]], sort_keys=True)
    return blake2b(material.encode(), digest_size=12).hexdigest()


def digest(data: bytes) -> str:
    return blake2b(data, digest_size=16).hexdigest()


def result_to_dict(r: FileResult) -> dict:
    from neuron_migrate.rules.model import finding_to_dict

    # the bytes of a rewritten file are its text in UTF-8 unless it has a BOM, CRLF line ends or another encoding:
    # then they are kept, else only marked (a third of a rewrite cache, and of a warm rewrite's reading, on the bench)
    as_text = r.new_bytes is not None and r.new_text is not None and r.new_bytes == r.new_text.encode("utf-8")
    return {
        "findings": [finding_to_dict(f) for f in r.findings],
        "applied": r.applied,
        "applied_findings": [finding_to_dict(f) for f in r.applied_findings],
        "new_text": r.new_text,
        "old_text": r.old_text if r.new_text is not None else None,
        "new_bytes": r.new_bytes.decode("latin-1") if r.new_bytes is not None and not as_text else None,
        **({"bytes_are_text": True} if as_text else {}),
        "suppressed": r.suppressed,
        "skipped": r.skipped,
        "error": r.error,
        **({"frames": list(r.frames.items())} if r.frames is not None else {}),
        **({"notes": r.notes} if r.notes else {}),
    }


def result_from_dict(path: str, d: dict) -> FileResult:
    from neuron_migrate.rules.model import finding_from_dict

    r = FileResult(path)
    r.findings = [finding_from_dict(f) for f in d["findings"]]
    for f in r.findings:
        f.path = path
    r.applied = d["applied"]
    r.applied_findings = [finding_from_dict(f) for f in d["applied_findings"]]
    r.new_text, r.old_text = d["new_text"], d["old_text"]
    if d.get("bytes_are_text"):
        r.new_bytes = r.new_text.encode("utf-8")
    else:
        r.new_bytes = d["new_bytes"].encode("latin-1") if d["new_bytes"] is not None else None
    r.suppressed, r.skipped = d["suppressed"], d["skipped"]
    r.error = d.get("error")
    frames = d.get("frames")
    r.frames = {n: t for n, t in frames} if frames is not None else None
    r.notes = d.get("notes", [])
    return r


class ResultCache:
    def __init__(self, folder: Path, key: str):
        self.folder = folder
        self.file = folder / f"results-{key}.json"
        self.entries: dict = {}
        self.dirty = False
        self.warning: str | None = None
        try:
            if self.file.exists():
                data = json.loads(self.file.read_text(encoding="utf-8"))
                if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
                    raise ValueError("unexpected layout")
                self.entries = data["files"]
        except (OSError, ValueError) as exc:
            self.warning = f"ignoring unreadable cache {self.file}: {exc}"
            self.entries = {}

    def lookup(self, path: str, display: str, dig: str) -> FileResult | None:
        e = self.entries.get(path)
        if not e or e.get("digest") != dig:
            return None
        return self._result(display, e)

    def lookup_stat(self, path: str, display: str, sig: list) -> FileResult | None:
        """The cached result when the file's size, mtime and inode are those recorded with it (Ruff keys its
        cache by mtime too): a warm run then reads no file at all. Any difference falls back to the digest."""
        e = self.entries.get(path)
        if not e or e.get("stat") != sig:
            return None
        return self._result(display, e)

    def touch(self, path: str, sig: list) -> None:
        """Record the stat signature of a file whose content digest matched."""
        e = self.entries.get(path)
        if e is not None and e.get("stat") != sig:
            e["stat"] = sig
            self.dirty = True

    @staticmethod
    def _result(display: str, e: dict) -> FileResult | None:
        try:
            return result_from_dict(display, e["result"])
        except (KeyError, TypeError, ValueError):
            return None  # an entry from an incompatible layout: recompute

    def store(self, path: str, dig: str, res: FileResult, sig: list | None = None) -> None:
        """Errors about the content (syntax, nesting, a rule crash) are cached with it and re-reported."""
        self.entries[path] = {"digest": dig, "result": result_to_dict(res), **({"stat": sig} if sig else {})}
        self.dirty = True

    def save(self) -> str | None:
        if not self.dirty:
            return None
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            ignore = self.folder / ".gitignore"
            if not ignore.exists():
                ignore.write_text("# created by neuron-migrate\n*\n")
            import tempfile

            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".results-", suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump({"files": self.entries}, fh, separators=(",", ":"))
            os.replace(tmp, self.file)
            others = sorted(self.folder.glob("results-*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
            for old in others[KEEP:]:
                old.unlink(missing_ok=True)
        except OSError as exc:
            return f"could not write cache {self.folder}: {exc}"
        return None


def _catalogue_file(folder: Path) -> Path:
    return folder / f"rules-{_code_fingerprint()[:24]}.json"


def load_catalogue(folder: Path) -> bool:
    """Use the rule catalogue this folder keeps for the installed rule sources, if any (see rules/registry.py):
    True when one is in use. A missing or unreadable catalogue only means the rules get imported."""
    from neuron_migrate.rules.registry import use_catalogue

    try:
        data = json.loads(_catalogue_file(folder).read_text(encoding="utf-8"))
        use_catalogue(data["rules"])
    except (OSError, ValueError, KeyError, TypeError):
        use_catalogue(None)
        return False
    return True


def save_catalogue(folder: Path) -> None:
    """Write the catalogue once the rules are imported (a cold run) and none exists for their fingerprint."""
    from neuron_migrate.rules.registry import catalogue, rules_loaded

    target = _catalogue_file(folder)
    if not rules_loaded() or target.exists() or not folder.is_dir():
        return
    import tempfile

    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".rules-", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({"rules": catalogue()}, fh, separators=(",", ":"))
        os.replace(tmp, target)
        for old in sorted(folder.glob("rules-*.json"), key=lambda p: p.stat().st_mtime, reverse=True)[KEEP:]:
            old.unlink(missing_ok=True)
    except OSError:
        pass  # a catalogue that cannot be written only costs the next run the rules' import


def cache_folder(config_source: Path | None) -> Path:
    root = config_source.parent if config_source else Path.cwd()
    return Path(os.environ.get("NEURON_MIGRATE_CACHE_DIR", root / FOLDER))
