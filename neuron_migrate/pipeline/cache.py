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
from neuron_migrate.rules.model import Edit, Finding, Fix, FixSafety, ImportReq, Span, _rule_by_code, span_to_list

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
    h = blake2b(b"neuron-migrate results v4", digest_size=16)
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
    # the repository model's facts ("outside") are per file: each entry records its own (pipeline/repository_facts.py)
    settings_kw = {k: v for k, v in settings_kw.items() if k != "outside"}
    material = json.dumps([_code_fingerprint(), [sorted(c) for c in codes] if codes and isinstance(codes[0], (tuple, list)) else sorted(codes),
                           settings_kw, fix, sys.version_info[:2]], sort_keys=True)
    return blake2b(material.encode(), digest_size=12).hexdigest()


def digest(data: bytes) -> str:
    return blake2b(data, digest_size=16).hexdigest()


class Strings:
    """The cache's string table: messages and notes repeat across findings and files (the same advice at every
    site of a rule), so a finding stores the index of each of its strings. Index 0 is the empty string."""

    __slots__ = ("items", "_index")

    def __init__(self, items: list | None = None):
        self.items: list = items if items else [""]
        self._index: dict | None = None  # built on the first store: a warm run only reads

    def ref(self, s: str) -> int:
        if not s:
            return 0
        index = self._index
        if index is None:
            index = self._index = {v: i for i, v in enumerate(self.items)}
        i = index.get(s)
        if i is None:
            i = index[s] = len(self.items)
            self.items.append(s)
        return i


# A finding is one row: [code, line, col, end_line, end_col, message, note, fix, confidence, source, cell], the
# strings as Strings indexes and the fix a row too (or 0): JSON arrays of numbers decode several times faster than
# objects with keys, and a warm run decodes every finding of the tree. The path is the entry's (display) path.
def _finding_row(f, ref) -> list:
    s = f.span
    return [f.rule.code, s.line, s.col, s.end_line, s.end_col, ref(f.message), ref(f.note),
            _fix_row(f.fix, ref) if f.fix is not None else 0, ref(f.confidence), ref(f.source), f.cell]


def _fix_row(fix, ref) -> list:
    return [fix.safety.value, [[e.kind, *span_to_list(e.span), e.text] for e in fix.edits],
            [[i.module, i.alias, True] if i.member else [i.module, i.alias] for i in fix.imports],
            [list(h) for h in fix.helpers], ref(fix.description)]


def _findings(rows: list, strings: list, path: str, rules: dict) -> list:
    out = []
    for code, line, col, end_line, end_col, msg, note, fix, conf, src, cell in rows:
        rule = rules.get(code)
        if rule is None:
            rule = rules[code] = _rule_by_code(code)
        out.append(Finding(rule, path, Span(line, col, end_line, end_col), strings[msg],
                           _fix(fix, strings) if fix else None, strings[note], strings[conf], strings[src], cell))
    return out


def _fix(row: list, strings: list):
    safety, edits, imports, helpers, description = row
    return Fix(FixSafety(safety), [Edit(k, Span(a, b, c, d), t) for k, a, b, c, d, t in edits],
               [ImportReq(*i) for i in imports], [tuple(h) for h in helpers], strings[description])


def result_to_dict(r: FileResult, strings: Strings | None = None) -> dict:
    """The result as plain data. With `strings` (the cache's table) its strings are refs into it; without, the dict
    carries its own table under "s"."""
    own = strings is None
    if own:
        strings = Strings()
    ref = strings.ref
    d: dict = {"f": [_finding_row(f, ref) for f in r.findings]}
    if r.applied:
        d["a"] = r.applied
    if r.applied_findings:
        d["af"] = [_finding_row(f, ref) for f in r.applied_findings]
    if r.new_text is not None:
        d["nt"], d["ot"] = r.new_text, r.old_text
    if r.new_bytes is not None:
        # the bytes of a rewritten file are its text in UTF-8 unless it has a BOM, CRLF line ends or another
        # encoding: then they are kept, else only marked (a third of a rewrite cache, and of a warm rewrite's reading)
        if r.new_text is not None and r.new_bytes == r.new_text.encode("utf-8"):
            d["bt"] = 1
        else:
            d["nb"] = r.new_bytes.decode("latin-1")
    if r.suppressed:
        d["sp"] = r.suppressed
    if r.skipped:
        d["sk"] = 1
    if r.error is not None:
        d["e"] = r.error
    if r.frames is not None:
        d["fr"] = list(r.frames.items())
    if r.notes:
        d["n"] = r.notes
    if r.xla_libs is not None:
        d["x"] = r.xla_libs
    if own:
        d["s"] = strings.items
    return d


def result_from_dict(path: str, d: dict, strings: list | None = None, rules: dict | None = None) -> FileResult:
    """The FileResult of `result_to_dict`'s data, for `path`; `rules` memoises the rules by code across results."""
    if strings is None:
        strings = d["s"]
    rules = {} if rules is None else rules
    r = FileResult(path)
    r.findings = _findings(d["f"], strings, path, rules)
    af = d.get("af")
    if af:
        r.applied_findings = _findings(af, strings, path, rules)
    a = d.get("a")
    if a:
        r.applied = a
    if "nt" in d:
        r.new_text, r.old_text = d["nt"], d["ot"]
    if d.get("bt"):
        r.new_bytes = r.new_text.encode("utf-8")
    elif "nb" in d:
        r.new_bytes = d["nb"].encode("latin-1")
    r.suppressed = d.get("sp", 0)
    r.skipped = bool(d.get("sk"))
    r.error = d.get("e")
    frames = d.get("fr")
    if frames is not None:
        r.frames = {n: t for n, t in frames}
    n = d.get("n")
    if n:
        r.notes = n
    r.xla_libs = d.get("x")
    return r


def _remap(d: dict, old: list, ref) -> None:
    """Rewrite a stored result's string refs from table `old` into the table `ref` adds to."""
    for key in ("f", "af"):
        for row in d.get(key, ()):
            for i in (5, 6, 8, 9):
                row[i] = ref(old[row[i]])
            if row[7]:
                row[7][4] = ref(old[row[7][4]])


class ResultCache:
    FORMAT = 4  # the layout of the file: {"format", "strings", "files": {path: {"digest", "stat", "result"}}}

    def __init__(self, folder: Path, key: str):
        self.folder = folder
        self.file = folder / f"results-{key}.json"
        self.entries: dict = {}
        self.strings = Strings()
        self.dirty = False
        self.warning: str | None = None
        self._rules: dict = {}  # code -> rule, for the results this run reads
        try:
            if self.file.exists():
                data = json.loads(self.file.read_text(encoding="utf-8"))
                if (not isinstance(data, dict) or data.get("format") != self.FORMAT
                        or not isinstance(data.get("files"), dict) or not isinstance(data.get("strings"), list)):
                    raise ValueError("unexpected layout")
                self.entries = data["files"]
                self.strings = Strings(data["strings"])
        except (OSError, ValueError) as exc:
            self.warning = f"ignoring unreadable cache {self.file}: {exc}"
            self.entries = {}
            self.strings = Strings()

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

    def _result(self, display: str, e: dict) -> FileResult | None:
        try:
            return result_from_dict(display, e["result"], self.strings.items, self._rules)
        except (KeyError, TypeError, ValueError, IndexError):
            return None  # an entry that does not decode (edited by hand, truncated): recompute

    def store(self, path: str, dig: str, res: FileResult, sig: list | None = None) -> None:
        """Errors about the content (syntax, nesting, a rule crash) are cached with it and re-reported."""
        self.entries[path] = {"digest": dig, "result": result_to_dict(res, self.strings), **({"stat": sig} if sig else {})}
        self.dirty = True

    def _compacted_strings(self) -> list:
        """A fresh table of the strings the entries still use (the entries' refs rewritten into it), so that the
        strings of changed and deleted files do not pile up."""
        old, fresh = self.strings.items, Strings([""])
        fresh._index = {"": 0}
        for path, e in list(self.entries.items()):
            try:
                _remap(e["result"], old, fresh.ref)
            except (KeyError, TypeError, IndexError, AttributeError):
                del self.entries[path]  # an entry that does not decode is recomputed next time
        self.strings = fresh
        return fresh.items

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
                json.dump({"format": self.FORMAT, "strings": self._compacted_strings(), "files": self.entries}, fh,
                          separators=(",", ":"))
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
