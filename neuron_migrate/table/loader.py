"""The compatibility table's loader and model (see neuron_migrate/table/__init__.py for what the table is)."""
from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Mapping
from enum import Enum
from pathlib import Path

from neuron_migrate.files.records import FrozenRecord
from neuron_migrate.table.choice import TableError, _data_dir, available_tables, confidence_rank, default_table_path

TYPE_CHECKING = False  # typing is not imported at run time (start-up): it serves annotations only
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "Entry",
    "Status",
    "Table",
    "TableError",
    "Verdict",
    "available_tables",
    "default_table_path",
    "load_table",
    "load_api_map",
    "normalize_op_name",
    "confidence_rank",
    "selection_warning",
    "STATUS_SEVERITY",
    "KINDS",
    "CONFIDENCES",
]

KINDS = ("aten_op", "api", "namespace", "compile_param", "distributed")
SOURCE_KINDS = ("aws_docs", "prerelease_source", "community", "torch")
CONFIDENCES = ("high", "medium", "low")
API_MAP_FILE = "api_to_aten.yaml"
COMPILED_SUFFIX = ".compiled.json"
COMPILED_FORMAT = 1
# Environment variables whose value changes an entry (`when_env:` in the YAML); values are normalised to "0"/"1".
ENV_SWITCHES = ("TORCH_NEURONX_COMPLEX_DECOMPOSE",)


class Status(str, Enum):
    NATIVE = "native"
    CPU_FALLBACK = "cpu_fallback"
    UNSUPPORTED = "unsupported"
    PARTIAL = "partial"
    UNKNOWN = "unknown"

    def __str__(self) -> str:  # "native", not "Status.NATIVE", in messages
        return self.value


# Higher is worse: unsupported > cpu_fallback > partial > unknown > native.
STATUS_SEVERITY: dict[Status, int] = {
    Status.NATIVE: 0,
    Status.UNKNOWN: 1,
    Status.PARTIAL: 2,
    Status.CPU_FALLBACK: 3,
    Status.UNSUPPORTED: 4,
}


# Plain classes (files/records.py), not dataclasses: importing dataclasses costs every start-up about 20 ms.
class Entry(FrozenRecord):
    """One table entry: an API, op or module, its status on the neuron device, and where that comes from."""

    _fields = ("name", "kind", "status", "dtypes", "note", "source_id", "source_url", "source_kind", "confidence",
               "when_env", "env_applied")
    _compared = ("name", "kind", "status", "dtypes", "note", "source_id", "source_url", "source_kind", "confidence",
                 "env_applied")

    def __init__(self, name: str, kind: str, status: Status, dtypes: str | None = None, note: str | None = None,
                 source_id: str | None = None, source_url: str | None = None, source_kind: str | None = None,
                 confidence: str | None = None, when_env: Any = None, env_applied: str | None = None):
        # when_env: {env var: {"0"|"1": {status, note, source, confidence}}}, the entry's other forms (see
        # SCHEMA.md), not compared; env_applied: "VAR=value" when a when_env form was chosen
        self._set(name=name, kind=kind, status=status, dtypes=dtypes, note=note, source_id=source_id,
                  source_url=source_url, source_kind=source_kind, confidence=confidence, when_env=when_env,
                  env_applied=env_applied)


class Verdict(FrozenRecord):
    """The answer for one op or API: what audit findings and probe rows both report."""

    _fields = ("name", "status", "confidence", "source_id", "source_url", "note", "via", "entries", "cause")

    def __init__(self, name: str, status: Status, confidence: str | None, source_id: str | None,
                 source_url: str | None, note: str, via: str, entries: tuple = (), cause: str = ""):
        # via: "entry" | "derived" | "namespace" | "aggregate" | "none"; cause: for a derived verdict, the op
        # (below the composite kernels) that decided it
        self._set(name=name, status=status, confidence=confidence, source_id=source_id, source_url=source_url,
                  note=note, via=via, entries=entries, cause=cause)

    def as_dict(self) -> dict[str, Any]:
        d = {"name": self.name, "status": self.status.value, "confidence": self.confidence,
             "source": self.source_id, "source_url": self.source_url, "note": self.note, "via": self.via}
        if self.cause:
            d["cause"] = self.cause
        return d


# --------------------------------------------------------------------------------------------- helpers


def _yaml_load(text: str, path: Path) -> Any:
    import yaml

    loader = getattr(yaml, "CSafeLoader", None) or yaml.SafeLoader
    try:
        return yaml.load(text, Loader=loader)  # noqa: S506 - safe loader
    except yaml.YAMLError as exc:
        raise TableError(f"{path}: not valid YAML: {exc}") from exc


_OP_RE = re.compile(r"^(?:(?P<ns>[A-Za-z_][\w]*)(?:::|\.))?(?P<base>[A-Za-z_]\w*)(?:\.(?P<ovl>\w+))?$")


def normalize_op_name(name: str) -> tuple[str, str | None]:
    """Return (`ns::base`, overload or None) for "aten::atan2", "aten::atan2.default", "atan2", "aten.atan2.out",
    "torch.ops.aten.atan2.out". `.default` counts as no overload."""
    s = name.strip()
    if s.startswith("torch.ops."):
        s = s[len("torch.ops.") :]
    if "::" in s:
        ns, rest = s.split("::", 1)
        base, _, ovl = rest.partition(".")
    else:
        pieces = s.split(".")
        if len(pieces) == 1:
            ns, base, ovl = "aten", pieces[0], ""
        elif len(pieces) == 2:
            # "aten.atan2" (namespace + op) or "atan2.out" (op + overload)
            if pieces[0] in ("aten", "prims", "_c10d_functional", "c10d", "quantized"):
                ns, base, ovl = pieces[0], pieces[1], ""
            else:
                ns, base, ovl = "aten", pieces[0], pieces[1]
        else:
            ns, base, ovl = pieces[0], pieces[1], ".".join(pieces[2:])
    ovl = ovl or None
    if ovl == "default":
        ovl = None
    return f"{ns}::{base}", ovl


def _full_op(base: str, ovl: str | None) -> str:
    return f"{base}.{ovl}" if ovl else base


# --------------------------------------------------------------------------------------------- API map


def _parse_api_map(data: Any, p: Path) -> dict[str, tuple[str, ...]]:
    if not isinstance(data, dict) or not isinstance(data.get("apis"), dict):
        raise TableError(f"{p}: expected a mapping with an 'apis' mapping")
    out: dict[str, tuple[str, ...]] = {}
    for api, ops in data["apis"].items():
        if isinstance(ops, dict):  # tolerate {ops: [...], note: ...}
            ops = ops.get("ops", [])
        if not isinstance(ops, list) or not all(isinstance(o, str) for o in ops):
            raise TableError(f"{p}: 'apis.{api}' must be a list of aten op names")
        out[str(api)] = tuple(ops)
    return out


_API_MAPS: dict[Path, dict[str, tuple[str, ...]]] = {}


def load_api_map(path: str | Path | None = None) -> dict[str, tuple[str, ...]]:
    """`api_to_aten.yaml` as {qualname: (aten op, ...)}; empty when the file does not exist."""
    p = (Path(path) if path is not None else _data_dir() / API_MAP_FILE).resolve()
    got = _API_MAPS.get(p)
    if got is not None:
        return got
    if not p.is_file():
        return {}
    _API_MAPS[p] = got = _parse_api_map(_yaml_load(p.read_text(encoding="utf-8"), p), p)
    return got


load_api_map.cache_clear = _API_MAPS.clear  # type: ignore[attr-defined]


# --------------------------------------------------------------------------------------------- dispatch facts

_DISPATCH: dict[Path, dict[str, Any]] = {}


def load_dispatch(path: Path) -> dict[str, Any]:
    """`aten_dispatch-<family>.json`: {"torch", "ops": {op: flags}, "decomp": {op: [ops its composite calls]}}."""
    p = path.resolve()
    got = _DISPATCH.get(p)
    if got is None:
        try:
            got = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise TableError(f"{p}: cannot read the dispatcher data: {exc}") from exc
        if not isinstance(got, dict) or not isinstance(got.get("ops"), dict):
            raise TableError(f"{p}: expected a mapping with an 'ops' mapping")
        got.setdefault("decomp", {})
        _DISPATCH[p] = got
    return got


_COMPOSITE_NAMES = {"I": "CompositeImplicitAutograd", "E": "CompositeExplicitAutograd",
                    "N": "CompositeExplicitAutogradNonFunctional"}
_UNKNOWN_NOTE = ("needs a backend kernel (torch has no composite for it) and no source says whether Neuron has one: "
                 "verify on device")


# --------------------------------------------------------------------------------------------- table


def _layout_of(base: str, flags: str | None) -> str | None:
    """"sparse" / "nested" for ops that exist for those tensor kinds (by name, or by the dispatcher: a kernel only
    for the sparse / nested dispatch keys), else None."""
    short = base.split("::", 1)[-1]
    if "sparse" in short or (flags is not None and "S" in flags):
        return "sparse"
    if "nested" in short or (flags is not None and "T" in flags):
        return "nested"
    return None


# Library modules whose frames stand for a namespace (torch.func is implemented in torch._functorch).
_MODULE_ALIASES = {"torch._functorch": "torch.func", "functorch": "torch.func", "torch._vmap_internals": "torch.func"}


def _env_value(v: str | None) -> str | None:
    if v is None:
        return None
    return "0" if v.strip().lower() in ("0", "false", "no", "off", "") else "1"


class Table:
    """One compatibility table (after resolving `extends:` and the `when_env` forms for the given environment)."""

    def __init__(
        self,
        version: str,
        path: Path,
        entries: list[Entry],
        meta: dict[str, Any] | None = None,
        sources: dict[str, dict[str, Any]] | None = None,
        api_map_path: Path | None = None,
        api_map: dict[str, tuple[str, ...]] | None = None,
        dispatch_path: Path | None = None,
    ) -> None:
        self.version = version
        self.path = path
        self.entries = entries
        self.meta = dict(meta or {})
        self.sources = dict(sources or {})
        self.torch_neuronx = self.meta.get("torch_neuronx")
        self.neuron_sdk = self.meta.get("neuron_sdk")
        self.torch = self.meta.get("torch")
        self.loaded_from = "yaml"  # or "compiled"
        self._api_map_path = api_map_path
        self._api_map = api_map
        self._dispatch_path = dispatch_path
        self._by_name: dict[str, Entry] = {}
        self._ops_by_base: dict[str, list[Entry]] = {}
        self._agg_cache: dict[str, Entry] = {}
        self._verdicts: dict[str, Verdict] = {}
        self._api_rev: dict[str, list[str]] | None = None
        for e in entries:
            self._by_name[e.name] = e
            if e.kind == "aten_op":
                base, _ = normalize_op_name(e.name)
                self._ops_by_base.setdefault(base, []).append(e)

    def __repr__(self) -> str:
        return f"Table(version={self.version!r}, path={str(self.path)!r}, entries={len(self.entries)})"

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self):
        return iter(self.entries)

    def get(self, name: str) -> Entry | None:
        """Exact lookup by entry name."""
        return self._by_name.get(name)

    def source_url(self, source_id: str | None) -> str | None:
        return (self.sources.get(source_id or "") or {}).get("url")

    # -- dispatcher data

    @property
    def dispatch(self) -> dict[str, Any] | None:
        """The dispatcher facts this table derives from (None when the table names none)."""
        if self._dispatch_path is None:
            return None
        return load_dispatch(self._dispatch_path)

    def composite_of(self, op: str) -> tuple[str, list[str] | None] | None:
        """(kind of composite kernel, ops it calls or None when not recorded) for a composite aten op, else None."""
        d = self.dispatch
        if d is None:
            return None
        base, ovl = normalize_op_name(op)
        full = _full_op(base, ovl)
        flags = d["ops"].get(full)
        if flags is None:
            return None
        kind = next((_COMPOSITE_NAMES[k] for k in "EIN" if k in flags), None)
        if kind is None:
            return None
        kids = d["decomp"].get(full)
        return kind, (list(kids) if kids is not None else None)

    # -- aten ops

    def _explicit_op(self, base: str, ovl: str | None) -> Entry | None:
        e = self._by_name.get(_full_op(base, ovl))
        if e is not None and e.kind == "aten_op":
            return e
        e = self._by_name.get(base)
        if e is not None and e.kind == "aten_op":
            return e
        return None

    def _aggregate_for(self, base: str) -> Entry | None:
        siblings = self._ops_by_base.get(base)
        if not siblings:
            return None
        agg = self._agg_cache.get(base)
        if agg is None:
            agg = self._agg_cache[base] = self._aggregate(base, siblings)
        return agg

    def op(self, name: str) -> Entry | None:
        """The table's own entry for an aten op. Accepts "aten::atan2", "aten::atan2.default", "atan2", "aten.atan2.out".

        Lookup order: the exact overload; the base name (default overload); else, when other overloads of the
        same op are listed, an entry aggregated over them (status: theirs if they agree, else partial). None when
        the table lists nothing for it: `classify_op` then also derives a status from torch's dispatcher."""
        try:
            base, ovl = normalize_op_name(name)
        except Exception:  # pragma: no cover - defensive
            return None
        e = self._explicit_op(base, ovl)
        if e is not None:
            return e
        return self._aggregate_for(base)

    def derived_entry(self, name: str) -> Entry | None:
        """`op(name)`, else the status `classify_op` derives (composite kernel, namespace) as an Entry."""
        e = self.op(name)
        if e is not None:
            return e
        v = self.classify_op(name)
        if v.via not in ("derived", "namespace"):
            return None
        return Entry(name=v.name, kind="aten_op", status=v.status, note=v.note, source_id=v.source_id,
                     source_url=v.source_url, source_kind=(self.sources.get(v.source_id or "") or {}).get("kind"),
                     confidence=v.confidence)

    @staticmethod
    def _aggregate(base: str, siblings: list[Entry]) -> Entry:
        statuses = {s.status for s in siblings}
        status = statuses.pop() if len(statuses) == 1 else Status.PARTIAL
        listed = ", ".join(sorted(s.name.split(".", 1)[1] if "." in s.name else "default" for s in siblings))
        first = siblings[0]
        return Entry(
            name=base,
            kind="aten_op",
            status=status,
            dtypes=None,
            note=f"aggregated over the listed overloads of {base} ({listed}); this exact overload is not listed",
            source_id=first.source_id,
            source_url=first.source_url,
            source_kind=first.source_kind,
            confidence=first.confidence,
        )

    def classify_op(self, name: str) -> Verdict:
        """The status of an aten op, always answered (unknown at worst), the same for audit and probe.

        Order: an entry for the exact overload or the base name; ops that only exist for sparse or nested tensors
        take the torch.sparse / torch.nested namespace entry; a composite op (torch's CompositeImplicitAutograd /
        CompositeExplicitAutograd / ...NonFunctional kernel, which every backend without its own kernel runs)
        gets the worst status of the ops its kernel calls, with the weakest confidence among them; an op only
        reached from APIs under a namespace with an entry (torch.fft) takes that entry; listed sibling
        overloads; else unknown: a backend kernel is needed and no source says whether Neuron has one."""
        v = self._verdicts.get(name)
        if v is None:
            v = self._verdicts[name] = self._classify_op(name, ())
            self._verdicts.setdefault(v.name, v)
        return v

    def _classify_op(self, name: str, stack: tuple[str, ...]) -> Verdict:
        try:
            base, ovl = normalize_op_name(name)
        except Exception:  # pragma: no cover - defensive
            return Verdict(name, Status.UNKNOWN, None, None, None, "not an op name", "none")
        full = _full_op(base, ovl)
        cached = self._verdicts.get(full)
        if cached is not None:
            return cached
        e = self._explicit_op(base, ovl)
        if e is not None:
            return Verdict(full, e.status, e.confidence, e.source_id, e.source_url, e.note or "", "entry", (e,))
        d = self.dispatch
        flags = d["ops"].get(full) if d is not None else None
        layout = _layout_of(base, flags)
        if layout is not None:
            ns = self.classify_module(f"torch.{layout}")
            if ns is not None:
                return Verdict(full, ns.status, ns.confidence, ns.source_id, ns.source_url,
                               f"{layout}-tensor op: {ns.note}", "namespace", ns.entries)
        comp = self.composite_of(full) if flags is not None else None
        if comp is not None and comp[1] is not None and full not in stack:
            kind, kids = comp
            if not kids:
                return Verdict(full, Status.NATIVE, "high", "torch_dispatch", self.source_url("torch_dispatch"),
                               f"{kind} kernel that dispatches no other op (metadata only)", "derived")
            sub = [self._classify_op(k, (*stack, full)) for k in kids]
            worst = max(sub, key=lambda x: STATUS_SEVERITY[x.status])
            deciding = [x for x in sub if x.status is worst.status] if worst.status is not Status.NATIVE else sub
            weakest = min(deciding, key=lambda x: confidence_rank(x.confidence))
            calls = ", ".join(x.name for x in sub)
            if worst.status is Status.NATIVE:
                note = f"{kind} kernel calls only native ops ({calls})"
                cause = ""
            else:
                cause = worst.cause or worst.name
                leaf = worst.note if worst.via != "derived" else worst.note.split("; ", 1)[-1]
                note = f"{kind} kernel calls {calls}; {leaf}" if worst.via == "derived" else (
                    f"{kind} kernel calls {calls}; {cause} is {worst.status.value}" + (f": {leaf}" if leaf else ""))
            v = Verdict(full, worst.status, weakest.confidence, weakest.source_id, weakest.source_url, note,
                        "derived", tuple(x for e2 in deciding for x in e2.entries)[:4], cause)
            self._verdicts[full] = v
            return v
        ns = self._namespace_via_api(base)
        if ns is not None:
            api, ne = ns
            return Verdict(full, ne.status, ne.confidence, ne.source_id, ne.source_url,
                           f"via {api} ({ne.name}): {ne.note or ''}".rstrip(": "), "namespace", (ne,))
        agg = self._aggregate_for(base)
        if agg is not None:
            return Verdict(full, agg.status, agg.confidence, agg.source_id, agg.source_url, agg.note or "",
                           "aggregate", (agg,))
        if comp is not None:
            note = f"{comp[0]} kernel whose calls were not recorded (scripts/gen_aten_dispatch.py): verify on device"
        elif flags is None and d is not None:
            note = f"not an aten op of torch {d.get('torch', '?')}: verify on device"
        else:
            note = _UNKNOWN_NOTE
        return Verdict(full, Status.UNKNOWN, None, None, None, note, "none")

    def _namespace_via_api(self, base: str) -> tuple[str, Entry] | None:
        """An op reached only from Python APIs under a namespace the table rates (torch.fft -> partial)."""
        if self._api_rev is None:
            rev: dict[str, list[str]] = {}
            for api, ops in self._amap().items():
                for o in ops:
                    rev.setdefault(normalize_op_name(o)[0], []).append(api)
            self._api_rev = rev
        apis = self._api_rev.get(base)
        if not apis:
            return None
        found = []
        for api in apis:
            e = self.api(api)
            if e is None or e.kind != "namespace":
                return None  # also reached from an API outside any rated namespace
            found.append((api, e))
        found.sort(key=lambda ae: ae[0])
        return found[0]

    # -- Python APIs

    def api(self, qualname: str) -> Entry | None:
        """Entry for a Python API: exact name, else the longest dotted-prefix namespace entry
        ("torch.sparse.mm" -> "torch.sparse"). Compile params / collectives are found by their names
        ("torch.compile:dynamic", "torch.distributed:send"); "torch.distributed.send" also finds the latter."""
        q = qualname.strip()
        e = self._by_name.get(q)
        if e is not None and e.kind != "aten_op":
            return e
        for prefix in ("torch.distributed.", "dist."):
            if q.startswith(prefix) and "." not in q[len(prefix) :]:
                e = self._by_name.get("torch.distributed:" + q[len(prefix) :])
                if e is not None:
                    return e
        if q.startswith("torch.Tensor."):
            e = self._by_name.get("Tensor." + q[len("torch.Tensor.") :])
            if e is not None and e.kind != "aten_op":
                return e
        parts = q.split(".")
        for i in range(len(parts) - 1, 0, -1):
            e = self._by_name.get(".".join(parts[:i]))
            if e is not None and e.kind == "namespace":
                return e
        if q.startswith("torch.sparse_"):  # torch.sparse_coo_tensor, torch.sparse_csr_tensor, ... (sparse layouts)
            e = self._by_name.get("torch.sparse")
            if e is not None and e.kind == "namespace":
                return e
        return None

    def classify_module(self, module: str) -> Verdict | None:
        """The namespace entry covering a module or qualified name ("torch.distributions.normal" ->
        torch.distributions), for a probe that sees which library frame called an op. None when no namespace
        entry covers it."""
        query = module = module.strip()
        for alias, ns in _MODULE_ALIASES.items():
            if module == alias or module.startswith(alias + "."):
                module = ns
                break
        parts = module.split(".")
        for i in range(len(parts), 0, -1):
            e = self._by_name.get(".".join(parts[:i]))
            if e is not None and e.kind == "namespace":
                return Verdict(query, e.status, e.confidence, e.source_id, e.source_url, e.note or "", "namespace", (e,))
        return None

    def _amap(self) -> dict[str, tuple[str, ...]]:
        if self._api_map is None:
            self._api_map = load_api_map(self._api_map_path)  # None: the shipped map
        return self._api_map

    def ops_for_api(self, qualname: str) -> list[str]:
        """Aten ops the API dispatches to on the device (from `api_to_aten.yaml`); methods use "Tensor.<name>"."""
        amap = self._amap()
        q = qualname.strip()
        ops = amap.get(q)
        if ops is None and q.startswith("torch.Tensor."):
            ops = amap.get("Tensor." + q[len("torch.Tensor.") :])
        if ops is None and q.startswith("torch.nn.functional."):
            ops = amap.get("F." + q[len("torch.nn.functional.") :])
        return list(ops or ())

    def worst_status_for_api(self, qualname: str) -> tuple[Status, list[Entry]]:
        """The API's own entry if any; else the worst status over its aten ops (ops with no entry and no derived
        status count as unknown, with a placeholder entry). An API with neither yields (UNKNOWN, [])."""
        e = self.api(qualname)
        if e is not None:
            return e.status, [e]
        ops = self.ops_for_api(qualname)
        if not ops:
            return Status.UNKNOWN, []
        entries: list[Entry] = []
        worst = Status.NATIVE
        for op in ops:
            oe = self.derived_entry(op)
            if oe is None:
                v = self.classify_op(op)
                oe = Entry(name=op, kind="aten_op", status=Status.UNKNOWN, note=v.note or "not in the compatibility table")
            entries.append(oe)
            if STATUS_SEVERITY[oe.status] > STATUS_SEVERITY[worst]:
                worst = oe.status
        return worst, entries

    def classify_api(self, qualname: str) -> Verdict:
        """The status of a Python API (function, method as "Tensor.<name>", namespace member, compile parameter,
        collective): its own or namespace entry, else the worst over the aten ops it dispatches to. Confidence is
        the weakest among the entries that decided it."""
        status, entries = self.worst_status_for_api(qualname)
        if not entries:
            return Verdict(qualname, Status.UNKNOWN, None, None, None, "no entry and no recorded aten ops", "none")
        if len(entries) == 1 and entries[0].kind != "aten_op":
            e = entries[0]
            if e.kind == "namespace" and e.name != qualname.strip():
                # a namespace entry (torch.fft: partial) and the API's own ops with entries of their own
                # (aten::_fft_c2r) both speak: the worst status, the weakest confidence (what the probe sees per op)
                entries = [e] + [oe for op in self.ops_for_api(qualname)
                                 if (oe := self._explicit_op(*normalize_op_name(op))) is not None]
                status = max((x.status for x in entries), key=STATUS_SEVERITY.__getitem__)
                deciding = [x for x in entries if x.status is status]
                weakest = min(deciding, key=lambda x: confidence_rank(x.confidence))
                return Verdict(qualname, status, weakest.confidence, weakest.source_id, weakest.source_url,
                               e.note or "", "namespace", tuple(entries))
            return Verdict(qualname, e.status, e.confidence, e.source_id, e.source_url, e.note or "",
                           "entry" if e.name == qualname.strip() else "namespace", (e,))
        deciding = [e for e in entries if e.status is status] if status is not Status.NATIVE else entries
        weakest = min(deciding, key=lambda e: confidence_rank(e.confidence))
        note = "; ".join(dict.fromkeys(e.note for e in deciding if e.note))
        return Verdict(qualname, status, weakest.confidence, weakest.source_id, weakest.source_url, note, "derived",
                       tuple(entries))

    def filter(self, status: Status | str | None = None, kind: str | None = None) -> list[Entry]:
        st = Status(status) if status is not None else None
        return [e for e in self.entries if (st is None or e.status == st) and (kind is None or e.kind == kind)]


# --------------------------------------------------------------------------------------------- loading

_REQUIRED_TOP = ("version", "torch_neuronx", "neuron_sdk", "torch", "sources", "entries")


def _read_raw(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise TableError(f"{path}: table file not found")
    data = _yaml_load(path.read_text(encoding="utf-8"), path)
    if not isinstance(data, dict):
        raise TableError(f"{path}: expected a YAML mapping at the top level, got {type(data).__name__}")
    return data


def _resolve(path: Path, seen: tuple[Path, ...] = (), files: list[Path] | None = None) -> dict[str, Any]:
    path = path.resolve()
    if path in seen:
        raise TableError(f"{path.name}: 'extends' cycle: " + " -> ".join(p.name for p in (*seen, path)))
    data = _read_raw(path)
    if files is not None:
        files.append(path)
    parent_ref = data.get("extends")
    if parent_ref is None:
        return data
    if not isinstance(parent_ref, str):
        raise TableError(f"{path}: 'extends' must be a file name")
    parent_path = (path.parent / parent_ref).resolve()
    try:
        parent = _resolve(parent_path, (*seen, path), files)
    except TableError as exc:
        raise TableError(f"{path}: in extended table: {exc}") from exc
    merged = dict(parent)
    if isinstance(parent.get("dispatch"), str) and "dispatch" not in data:
        # an inherited dispatch file stays the parent's file, named relative to this table's folder
        merged["dispatch"] = os.path.relpath(parent_path.parent / parent["dispatch"], path.parent).replace(os.sep, "/")
    for k, v in data.items():
        if k in ("sources", "entries", "extends"):
            continue
        merged[k] = v
    psrc = parent.get("sources") or {}
    csrc = data.get("sources") or {}
    if not isinstance(psrc, dict) or not isinstance(csrc, dict):
        raise TableError(f"{path}: 'sources' must be a mapping")
    merged["sources"] = {**psrc, **csrc}
    pent = parent.get("entries") or []
    cent = data.get("entries") or []
    if not isinstance(pent, list) or not isinstance(cent, list):
        raise TableError(f"{path}: 'entries' must be a list")
    by_name: dict[str, Any] = {}
    for raw in [*pent, *cent]:
        key = raw.get("name") if isinstance(raw, dict) else id(raw)
        by_name.pop(key, None)  # an override moves to the end, keeping child order predictable
        by_name[key] = raw
    merged["entries"] = [v for v in by_name.values() if not (isinstance(v, dict) and v.get("remove"))]
    return merged


def _check_source(fname: str, sid: str, s: Any) -> None:
    if not isinstance(s, dict):
        raise TableError(f"{fname}: source {sid!r} must be a mapping")
    if s.get("kind") not in SOURCE_KINDS:
        raise TableError(f"{fname}: source {sid!r}: kind must be one of {', '.join(SOURCE_KINDS)}, got {s.get('kind')!r}")
    if s.get("confidence") not in CONFIDENCES:
        raise TableError(
            f"{fname}: source {sid!r}: confidence must be one of {', '.join(CONFIDENCES)}, got {s.get('confidence')!r}"
        )
    if "url" not in s:
        raise TableError(f"{fname}: source {sid!r}: missing 'url'")


def _check_form(where: str, raw: dict[str, Any], sources: dict[str, Any]) -> None:
    """An entry, or one of its when_env forms: a known status and source, a confidence, string notes."""
    try:
        Status(raw.get("status"))
    except ValueError:
        raise TableError(
            f"{where}: status must be one of {', '.join(s.value for s in Status)}, got {raw.get('status')!r}"
        ) from None
    sid = raw.get("source")
    if sid is None:
        raise TableError(f"{where}: missing 'source'")
    if sid not in sources:
        raise TableError(f"{where}: source {sid!r} is not defined in 'sources'")
    conf = raw.get("confidence")
    if conf is not None and conf not in CONFIDENCES:
        raise TableError(f"{where}: confidence must be one of {', '.join(CONFIDENCES)}, got {conf!r}")
    for opt in ("dtypes", "note"):
        if raw.get(opt) is not None and not isinstance(raw.get(opt), str):
            raise TableError(f"{where}: {opt!r} must be a string")


def _build(path: Path, data: dict[str, Any], env: Mapping[str, str] | None = None,
           api_map: dict[str, tuple[str, ...]] | None = None) -> Table:
    """The table of resolved data, which is checked first (a TableError names what is wrong)."""
    _validate(path, data)
    return _table(path, data, env, api_map)


def _validate(path: Path, data: dict[str, Any]) -> None:
    fname = path.name
    missing = [k for k in _REQUIRED_TOP if k not in data]
    if missing:
        raise TableError(f"{fname}: missing top-level key(s): {', '.join(missing)}")
    sources = data["sources"]
    if not isinstance(sources, dict):
        raise TableError(f"{fname}: 'sources' must be a mapping of id -> {{url, kind, confidence}}")
    for sid, s in sources.items():
        _check_source(fname, sid, s)
    raw_entries = data["entries"]
    if not isinstance(raw_entries, list):
        raise TableError(f"{fname}: 'entries' must be a list")
    seen: set[str] = set()
    for i, raw in enumerate(raw_entries):
        where = f"{fname}: entries[{i}]"
        if not isinstance(raw, dict):
            raise TableError(f"{where}: must be a mapping")
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            raise TableError(f"{where}: missing 'name'")
        where = f"{fname}: entry {name!r}"
        if name in seen:
            raise TableError(f"{where}: duplicate name")
        seen.add(name)
        kind = raw.get("kind")
        if kind not in KINDS:
            raise TableError(f"{where}: kind must be one of {', '.join(KINDS)}, got {kind!r}")
        _check_form(where, raw, sources)
        when_env = raw.get("when_env")
        if when_env is not None:
            if not isinstance(when_env, dict):
                raise TableError(f"{where}: 'when_env' must map an environment variable to {{value: form}}")
            for var, forms in when_env.items():
                if not isinstance(forms, dict):
                    raise TableError(f"{where}: when_env.{var} must map values ('0'/'1') to entry forms")
                for val, form in forms.items():
                    if not isinstance(form, dict):
                        raise TableError(f"{where}: when_env.{var}.{val} must be a mapping")
                    _check_form(f"{where} when_env.{var}={val}", form, sources)
    dispatch = data.get("dispatch")
    if dispatch is not None and not isinstance(dispatch, str):
        raise TableError(f"{fname}: 'dispatch' must be a file name")
    if dispatch and not (path.parent / dispatch).is_file():
        raise TableError(f"{fname}: dispatch file {dispatch!r} not found next to the table")


def _table(path: Path, data: dict[str, Any], env: Mapping[str, str] | None,
           api_map: dict[str, tuple[str, ...]] | None) -> Table:
    """The Table of data of the checked shape: each entry in the form `env` chooses (its when_env forms)."""
    env = os.environ if env is None else env
    sources = data["sources"]
    status_of = {s.value: s for s in Status}
    entries: list[Entry] = []
    for raw in data["entries"]:
        status, sid, conf, note = status_of[raw["status"]], raw["source"], raw.get("confidence"), raw.get("note")
        applied = None
        when_env = raw.get("when_env")
        if when_env is not None:
            for var, forms in when_env.items():
                for val, form in forms.items():
                    if _env_value(env.get(var)) == _env_value(str(val)):
                        status, sid, conf = status_of[form["status"]], form["source"], form.get("confidence")
                        note = form.get("note", note)
                        applied = f"{var}={val}"
        src = sources[sid]
        entries.append(Entry(raw["name"], raw["kind"], status, raw.get("dtypes"), note, str(sid), src.get("url"),
                             src.get("kind"), conf or src.get("confidence"), when_env, applied))
    dispatch = data.get("dispatch")
    api_map_path = path.parent / API_MAP_FILE
    return Table(
        version=str(data["version"]),
        path=path,
        entries=entries,
        meta={k: data[k] for k in ("version", "torch_neuronx", "neuron_sdk", "torch") if k in data},
        sources=sources,
        api_map_path=api_map_path if api_map_path.is_file() else None,
        api_map=api_map,
        dispatch_path=(path.parent / dispatch) if dispatch else None,
    )


def _build_compiled(path: Path, data: dict[str, Any], env: Mapping[str, str] | None,
                    api_map: dict[str, tuple[str, ...]] | None) -> Table:
    """`_build` for a compiled table, whose data `compile_table` checked and whose inputs' digests matched: the
    table without checking each entry again (every run that touches the table loads it). Data of another shape (a
    compiled file edited by hand) goes through `_build`, which says what is wrong."""
    try:
        return _table(path, data, env, api_map)
    except (KeyError, TypeError, ValueError, AttributeError):
        return _build(path, data, env, api_map)


# -- the compiled (JSON) form: same data, no YAML parse

def _sha256(p: Path) -> str:
    from neuron_migrate.files.digests import sha256_hex

    return sha256_hex(p.read_bytes())


def compiled_path(path: Path) -> Path:
    return path.with_name(path.name[: -len(path.suffix)] + COMPILED_SUFFIX)


def compile_table(path: str | Path) -> dict[str, Any]:
    """The compiled form of a table: the resolved table (after `extends`), its API map, and the sha256 of every
    input file (so a stale compiled file is never used)."""
    path = Path(path).resolve()
    files: list[Path] = []
    data = _resolve(path, (), files)
    _validate(path, data)
    amap = path.parent / API_MAP_FILE
    inputs = {p.name: _sha256(p) for p in files}
    api = None
    if amap.is_file():
        inputs[API_MAP_FILE] = _sha256(amap)
        api = {k: list(v) for k, v in load_api_map(amap).items()}
    return {"format": COMPILED_FORMAT, "inputs": inputs, "table": data, "api_map": api}


def _load_compiled(path: Path) -> tuple[dict[str, Any], dict[str, tuple[str, ...]] | None] | None:
    cp = compiled_path(path)
    try:
        doc = json.loads(cp.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("format") != COMPILED_FORMAT or not isinstance(doc.get("inputs"), dict):
        return None
    try:
        for name, digest in doc["inputs"].items():
            if _sha256(path.parent / name) != digest:
                return None
    except OSError:
        return None
    if API_MAP_FILE not in doc["inputs"] and (path.parent / API_MAP_FILE).is_file():
        return None
    api = doc.get("api_map")
    return doc["table"], ({k: tuple(v) for k, v in api.items()} if isinstance(api, dict) else None)


def _env_key(env: Mapping[str, str] | None) -> tuple:
    env = os.environ if env is None else env
    return tuple(_env_value(env.get(v)) for v in ENV_SWITCHES)


_TABLES: dict[tuple, Table] = {}


def _load(path: Path, env: Mapping[str, str] | None) -> Table:
    key = (path, _env_key(env))
    t = _TABLES.get(key)
    if t is not None:
        return t
    got = _load_compiled(path)
    if got is not None:
        data, api = got
        t = _build_compiled(path, data, env, api)
        t.loaded_from = "compiled"
    else:
        t = _build(path, _resolve(path), env)
    _TABLES[key] = t
    return t


# -- which table: the installed torch family by default

_SELECTION_WARNING: list[str] = []


def selection_warning() -> str | None:
    """The warning from the last default-table choice (a torch / torch-neuronx version without its own table)."""
    return _SELECTION_WARNING[-1] if _SELECTION_WARNING else None


_DEFAULT: list[Path] = []


def load_table(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> Table:
    """Load a table; None loads the one for the installed torch family (see `default_table_path`). `env` (default:
    os.environ) chooses the `when_env` forms. Cached per resolved path and environment. Raises TableError."""
    if path is None:
        if not _DEFAULT:
            p, warn = default_table_path()
            _DEFAULT.append(p)
            if warn:
                _SELECTION_WARNING.append(warn)
        p = _DEFAULT[0]
    else:
        p = Path(path)
    key = p if p.is_absolute() else (os.getcwd(), p)
    resolved = _RESOLVED.get(key)
    if resolved is None:  # rules ask for the table thousands of times per run: resolve each path once
        resolved = _RESOLVED[key] = p.resolve()
    return _load(resolved, env)


_RESOLVED: dict = {}  # path, or (working folder, relative path) -> resolved path


def _cache_clear() -> None:
    _TABLES.clear()
    _RESOLVED.clear()
    _DEFAULT.clear()
    _SELECTION_WARNING.clear()
    _DISPATCH.clear()


load_table.cache_clear = _cache_clear  # type: ignore[attr-defined]
