"""Turn the child's raw records (one per rank) into the probe report (parent side; no torch import).

Classification of each recorded aten op, against the compat table (`neuron_migrate.table`):

- native, cpu_fallback (runs on the host: costs a device->host->device copy per call), unsupported (would
  fail), partial (some overloads/dtypes only: verify), unknown (not in the table: "verify on device");
- float64: any op with a float64/complex128 input or output (TorchNeuron computes it in float32);
- ops recorded while a module's `__init__` ran (phase "init") are model construction: usually done on the
  CPU before `.to("neuron")`, so they are listed apart and not counted as fallbacks.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

# Ops whose TorchNeuron kernel is a Python wrapper that computes on the host and copies back, so
# `torch_neuronx.get_fallback_ops()` does not list them (pre-release source, python_ops/cpu_fallback_registrations.py;
# see shared/research/torchneuron.md section 3.1).
HOST_UNTRACKED_OPS = frozenset({
    "aten::linalg_qr", "aten::_linalg_svd", "aten::_linalg_eigh", "aten::linalg_cholesky_ex",
    "aten::linalg_inv_ex", "aten::linalg_lu_factor_ex", "aten::linalg_ldl_factor_ex", "aten::_linalg_slogdet",
    "aten::_linalg_det", "aten::cholesky_inverse", "aten::triangular_solve",
})

STATUSES = ("native", "cpu_fallback", "unsupported", "partial", "unknown")
FAIL_ON_CHOICES = ("fallback", "float64", "unsupported", "unknown", "partial", "graph-break", "compile")
_COST_NOTE = "runs on the host: each call copies its inputs device->host and its outputs back"


def base_name(op: str) -> str:
    """'aten::atan2.default' -> 'aten::atan2' (works without the table module)."""
    try:
        from neuron_migrate.table import normalize_op_name

        return normalize_op_name(op)[0]
    except Exception:  # noqa: BLE001
        ns, _, rest = op.partition("::")
        return f"{ns}::{rest.split('.')[0]}" if rest else op


# ---------------------------------------------------------------------------------------------- loading


def load_rank_docs(results_dir: str | os.PathLike) -> list[dict]:
    """Per-rank result documents, completed from the rank's op journal: a record first seen after the
    last rewrite of the results file (a hard crash right after it) is kept with count 1 (a lower bound)."""
    docs = []
    for p in sorted(Path(results_dir).glob("rank*.json"), key=lambda p: int(p.stem[4:] or 0)):
        try:
            doc = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            doc = {"rank": int(p.stem[4:] or 0), "status": "error",
                   "error": {"type": "ResultsUnreadable", "message": f"{p.name}: {exc}"}}
        journal = p.with_name(f"{p.stem}.ops.jsonl")
        if journal.is_file():
            ops = doc.setdefault("ops", [])
            have = {_key(o) for o in ops}
            for line in journal.read_text(encoding="utf-8", errors="replace").splitlines():
                try:
                    o = json.loads(line)
                except ValueError:
                    continue  # a line cut by the crash
                key = _key(o)
                if key not in have and o.get("op"):
                    have.add(key)
                    ops.append(dict(o, count=max(1, o.get("count") or 0), count_lower_bound=True))
        docs.append(doc)
    return docs


def _key(o: dict) -> tuple:
    return (o.get("op"), o.get("phase"), o.get("file"), o.get("line"), o.get("lib_file"), o.get("lib_line"),
            o.get("namespace"))


def merge_ops(docs: list[dict]) -> list[dict]:
    merged: dict[tuple, dict] = {}
    for d in docs:
        rank = d.get("rank", 0)
        for o in d.get("ops") or []:
            key = _key(o)
            m = merged.get(key)
            if m is None:
                m = merged[key] = dict(o, ranks=[], count=0, raised=0, in_dtypes=list(o.get("in_dtypes") or []),
                                       out_dtypes=list(o.get("out_dtypes") or []))
            m["count"] += o.get("count", 0)
            m["raised"] += o.get("raised") or 0
            if rank not in m["ranks"]:
                m["ranks"].append(rank)
            for k in ("in_dtypes", "out_dtypes"):
                for dt in o.get(k) or []:
                    if dt not in m[k]:
                        m[k].append(dt)
            m["float64"] = m.get("float64") or o.get("float64", False)
            m["float64_source"] = m.get("float64_source") or o.get("float64_source", False)
    return list(merged.values())


# ---------------------------------------------------------------------------------------------- table


class Classifier:
    def __init__(self, table_path: str | None = None):
        self.table = None
        self.error = None
        self._cache: dict[str, dict] = {}
        try:
            from neuron_migrate.table import load_table

            self.table = load_table(table_path) if table_path else load_table()
        except Exception as exc:  # noqa: BLE001 - no table: everything is "unknown", said in the report
            self.error = f"{type(exc).__name__}: {exc}"

    @property
    def version(self) -> str | None:
        return getattr(self.table, "version", None)

    def namespace_status(self, namespace: str) -> dict:
        """The table's rating of a namespace (torch.sparse, torch.nested, torch.distributions, torch.func), with
        confidence and source: Table.classify_module, the verdict audit's NM301 reports too."""
        v = None
        if self.table is not None:
            try:
                v = self.table.classify_module(namespace)
            except Exception:  # noqa: BLE001
                v = None
        if v is None:
            return {"status": "unknown", "note": "namespace not in the compat table: verify on device",
                    "source_url": None, "confidence": None, "source": None}
        return {"status": v.status.value, "note": v.note or "", "source_url": v.source_url,
                "confidence": v.confidence, "source": v.source_id}

    def classify(self, op: str) -> dict:
        """The table's verdict for a recorded op (Table.classify_op: the same answer audit gives)."""
        c = self._cache.get(op)
        if c is not None:
            return c
        v = None
        if self.table is not None:
            try:
                v = self.table.classify_op(op)
            except Exception:  # noqa: BLE001
                v = None
        if v is None or (v.status.value == "unknown" and v.via == "none"):
            note = v.note if v is not None else "not in the compat table: verify on device"
            c = {"status": "unknown", "note": note, "source_url": None, "confidence": None, "source": None}
        else:
            status = v.status.value
            note = v.note or ""
            if status == "cpu_fallback" and "host" not in note:
                note = f"{note} ({_COST_NOTE})" if note else _COST_NOTE
            c = {"status": status, "note": note, "source_url": v.source_url, "confidence": v.confidence,
                 "source": v.source_id}
        self._cache[op] = c
        return c


# ---------------------------------------------------------------------------------------------- report


_SEVERITY = {"native": 0, "unknown": 1, "partial": 2, "cpu_fallback": 3, "unsupported": 4}
# namespaces seen through the tensors themselves: every op on such a tensor takes the namespace's status
_LAYOUT_NAMESPACES = ("torch.sparse", "torch.nested")
_PHASE_ORDER = {"forward": 0, "backward": 1, "init": 2, "optimizer": 3}
DECOMPOSED_NOTE = "decomposed by the Neuron Dynamo backend"


def lib_path(path: str | None, cwd: str) -> str | None:
    """An installed library's file relative to its site-packages (`transformers/models/vit/modeling_vit.py`)."""
    if not path:
        return path
    for marker in ("site-packages" + os.sep, "dist-packages" + os.sep):
        if marker in path:
            return path.rsplit(marker, 1)[1]
    return _rel(path, cwd)


def _loc(file: str | None, line) -> str | None:
    return f"{file}:{line}" if file else None


def _site(o: dict) -> str:
    """Where an op ran: the library line and the user's line that led there, or the one there is."""
    user, lib = _loc(o.get("file"), o.get("line")), _loc(o.get("lib_file"), o.get("lib_line"))
    if user and lib:
        return f"{lib} (from {user})"
    if user or lib:
        return user or lib
    return {"optimizer": "(optimizer step, no user frame)", "backward": "(autograd engine / probe loss)"}.get(
        o.get("phase"), "(no user frame)")


def _rel(path: str | None, cwd: str) -> str | None:
    if not path:
        return path
    try:
        r = os.path.relpath(path, cwd)
        return path if r.startswith("..") else r
    except ValueError:
        return path


def build_report(docs: list[dict], *, classifier: Classifier, outcome: dict, spec: dict,
                 fail_on: list[str], top: int = 10) -> dict[str, Any]:
    cwd = spec.get("cwd") or os.getcwd()
    ops = merge_ops(docs)
    for o in ops:
        o.update(classifier.classify(o["op"]))
        ns = o.get("namespace")
        if ns in _LAYOUT_NAMESPACES:
            n = classifier.namespace_status(ns)
            if _SEVERITY.get(n["status"], 1) > _SEVERITY.get(o["status"], 1):
                what = "sparse layout" if ns == "torch.sparse" else "nested tensor"
                o.update(status=n["status"], note=f"{what} ({ns}): {n['note']}", source_url=n["source_url"])
        o["file"] = _rel(o.get("file"), cwd)
        o["lib_file"] = lib_path(o.get("lib_file"), cwd)
        o["site"] = _site(o)

    run_ops = [o for o in ops if o["phase"] != "init"]
    init_ops = [o for o in ops if o["phase"] == "init"]

    # ops by status: distinct overloads and calls
    by_status: dict[str, dict] = {s: {"ops": 0, "calls": 0} for s in STATUSES}
    seen: dict[str, set] = {s: set() for s in STATUSES}
    for o in run_ops:
        s = o["status"] if o["status"] in by_status else "unknown"
        seen[s].add(o["op"])
        by_status[s]["calls"] += o["count"]
    for s in STATUSES:
        by_status[s]["ops"] = len(seen[s])

    def group(status: str) -> list[dict]:
        """One row per op overload, with its call sites by count."""
        rows: dict[str, dict] = {}
        for o in run_ops:
            if o["status"] != status:
                continue
            r = rows.setdefault(o["op"], {"op": o["op"], "count": 0, "sites": [], "note": o["note"],
                                          "source_url": o.get("source_url"), "confidence": o.get("confidence"),
                                          "source": o.get("source"), "phases": []})
            r["count"] += o["count"]
            r["sites"].append({"site": o["site"], "file": o.get("file"), "line": o.get("line"),
                               "lib_file": o.get("lib_file"), "lib_line": o.get("lib_line"), "phase": o["phase"],
                               "count": o["count"], "grad_fn": o.get("grad_fn"), "attributed": o.get("attributed"),
                               "namespace": o.get("namespace")})
            if o["phase"] not in r["phases"]:
                r["phases"].append(o["phase"])
        out = sorted(rows.values(), key=lambda r: (-r["count"], r["op"]))
        for r in out:
            r["sites"].sort(key=lambda s: (-s["count"], s["site"]))
        return out

    float64_ops = [o for o in run_ops if o.get("float64")]
    f64_rows: dict[tuple, dict] = {}
    for o in float64_ops:
        r = f64_rows.setdefault((o["op"], o["site"]), {"op": o["op"], "site": o["site"], "file": o.get("file"),
                                                       "line": o.get("line"), "lib_file": o.get("lib_file"),
                                                       "lib_line": o.get("lib_line"), "count": 0, "phases": [],
                                                       "dtypes": []})
        r["count"] += o["count"]
        if o["phase"] not in r["phases"]:
            r["phases"].append(o["phase"])
        for dt in o["in_dtypes"] + o["out_dtypes"]:
            if dt not in r["dtypes"]:
                r["dtypes"].append(dt)
    float64_sources = [
        {"op": o["op"], "site": o["site"], "file": o.get("file"), "line": o.get("line"), "phase": o["phase"]}
        for o in ops if o.get("float64_source")
    ]
    f64_tensors: dict[tuple, dict] = {}
    for d in docs:
        for t in d.get("float64_tensors") or []:
            t = dict(t, file=_rel(t.get("file"), cwd))
            f64_tensors.setdefault((t["kind"], t["name"], t.get("file"), t.get("line")), t)

    first_error = None
    for d in docs:
        if d.get("error"):
            e = dict(d["error"], rank=d.get("rank", 0))
            e["file"] = _rel(e.get("file"), cwd)
            e["lib_file"] = lib_path(e.get("lib_file"), cwd)
            first_error = first_error or e
    status = "ok"
    if outcome.get("timed_out"):
        status = "timeout"
    elif first_error or outcome.get("error") or any(d.get("status") not in ("ok",) for d in docs) or not docs:
        status = "error"

    report: dict[str, Any] = {
        "tool": "neuron-migrate probe",
        "target": spec.get("target"),
        "args": spec.get("args") or [],
        "mode": spec.get("mode"),
        "device": next((d.get("device") for d in docs if d.get("device")), None),
        "device_kind": next((d.get("device_kind") for d in docs if d.get("device_kind")), None),
        "emulate_precision": next((d.get("emulate_precision") for d in docs if d.get("emulate_precision")), None),
        "device_reason": next((d.get("device_reason") for d in docs if d.get("device_reason")), None),
        "torch_version": next((d.get("torch_version") for d in docs if d.get("torch_version")), None),
        "table_version": classifier.version,
        "table_error": classifier.error,
        "world_size": max([d.get("world_size", 1) for d in docs] or [1]),
        "ranks": [{"rank": d.get("rank", 0), "pid": d.get("pid"), "status": d.get("status"), "ops": len(d.get("ops") or []),
                   "steps": d.get("optimizer_steps") or d.get("steps_run"), "error": d.get("error", {}).get("message")
                   if d.get("error") else None} for d in docs],
        "status": status,
        "error": outcome.get("error") if outcome.get("timed_out") else (first_error or outcome.get("error")),
        "outcome": outcome,
        "stopped": next((d.get("stopped") for d in docs if d.get("stopped")), None),
        "summary": {"by_status": by_status, "float64_ops": len({o["op"] for o in float64_ops}),
                    "float64_tensors": len(f64_tensors), "distinct_ops": len({o["op"] for o in run_ops})},
        "cpu_fallback": group("cpu_fallback"),
        "unsupported": group("unsupported"),
        "partial": group("partial"),
        "unknown": group("unknown"),
        "namespaces": _namespace_section(ops, docs, classifier, cwd),
        # the user's own forward/backward lines first: optimizer rows (one per parameter) would hide them
        "float64": {"ops": sorted(f64_rows.values(), key=lambda r: (min(_PHASE_ORDER.get(p, 9) for p in r["phases"]),
                                                                     -r["count"], r["site"])),
                    "sources": float64_sources, "tensors": list(f64_tensors.values())},
        "construction": sorted({o["op"] for o in init_ops if o["status"] in ("cpu_fallback", "unsupported")}),
        "timing": _timing(docs),
        "ops": sorted(ops, key=lambda o: (o["phase"], o.get("file") or "", o.get("line") or 0, o["op"])),
    }
    comp = next((d.get("compile") for d in docs if d.get("compile")), None)
    if comp is not None:
        report["compile"] = _compile_section(comp, classifier, cwd)
    num = next((d.get("numerics") for d in docs if d.get("numerics")), None)
    if num is not None:
        report["numerics"] = num
    measured = [d.get("measured") for d in docs if d.get("measured")]
    if measured:
        report["measured"] = _measured_section(measured, run_ops)
    report["compile_refusals"] = [
        dict(r, file=_rel(r.get("file"), cwd)) for d in docs
        for r in ((d.get("compile") or {}).get("refusals") or d.get("compile_refusals") or [])]
    report["host_runs"] = _host_runs(docs, cwd)
    report["layout_tensors"] = _layout_tensors(docs, cwd)
    report["problems"] = _problems(report)
    report["fail_on"] = fail_on
    report["failed_checks"] = _failed_checks(report, fail_on)
    return report


def _host_runs(docs: list[dict], cwd: str) -> list[dict]:
    """Ops the device had no kernel for (sparse, nested tensors), run on the host so the run could go on."""
    out: dict[tuple, dict] = {}
    for d in docs:
        for r in d.get("host_runs") or []:
            r = dict(r, file=_rel(r.get("file"), cwd), lib_file=lib_path(r.get("lib_file"), cwd))
            r["site"] = _site(r)
            key = (r["op"], r["site"])
            if key in out:
                out[key]["count"] += r.get("count", 1)
            else:
                out[key] = r
    return sorted(out.values(), key=lambda r: (r.get("file") or "", r.get("line") or 0, r["op"]))


def _layout_tensors(docs: list[dict], cwd: str) -> list[dict]:
    """Sparse/nested parameters and buffers of the model, with where they were registered."""
    out: dict[tuple, dict] = {}
    for d in docs:
        for t in d.get("layout_tensors") or []:
            t = dict(t, file=_rel(t.get("file"), cwd))
            out.setdefault((t["kind"], t["name"]), t)
    return list(out.values())


def _site_order(site: str) -> tuple:
    """`file.py:12` sorts by file, then line as a number."""
    head = site.split(" (from ", 1)[0]
    f, _, ln = head.rpartition(":")
    return (f, int(ln)) if ln.isdigit() else (head, 0)


def _problems(report: dict) -> list[str]:
    """One line per thing TorchNeuron cannot run, with the lines: the namespaces the table rates unsupported
    (with the sparse/nested parameters and buffers and where they were created), then unsupported ops."""
    lines: list[str] = []
    ns_done = set()
    for u in report.get("namespaces") or []:
        if u.get("status") != "unsupported":
            continue
        ns = u["namespace"]
        ns_done.add(ns)
        parts = [f"{t['kind']} `{t['name']}`" + (f" created at {_loc(t['file'], t['line'])}" if t.get("file") else "")
                 for t in report.get("layout_tensors") or [] if t.get("namespace") == ns]
        uses = sorted({s["site"] for s in u.get("sites") or [] if not s["site"].startswith("(")},
                      key=_site_order)
        if uses:
            more = f" and {len(uses) - 6} more" if len(uses) > 6 else ""
            parts.append("used at " + ", ".join(uses[:6]) + more)
        lines.append(f"{ns}: unsupported on TorchNeuron: " + ", ".join(parts))
    for r in report.get("unsupported") or []:
        if any(s.get("namespace") in ns_done for s in r["sites"]):
            continue  # said with its namespace
        sites = sorted({s["site"] for s in r["sites"]}, key=_site_order)
        more = f" and {len(sites) - 6} more" if len(sites) > 6 else ""
        lines.append(f"{r['op']}: unsupported on TorchNeuron, at " + ", ".join(sites[:6]) + more)
    for r in report.get("compile_refusals") or []:
        where = f" at {_loc(r.get('file'), r.get('line'))}" if r.get("file") else ""
        lines.append(f'torch.compile(backend="neuron"): graph {r.get("graph")} refused{where} ({r.get("error")}); '
                     "it ran eagerly")
    return lines


def _namespace_section(ops: list[dict], docs: list[dict], classifier: Classifier, cwd: str) -> list[dict]:
    """Namespace use seen at run time (sparse layouts, nested tensors, torch.distributions code, torch.func
    transforms), each with the table's status for the namespace and where it happened."""
    uses: dict[str, dict] = {}

    def add(ns: str, how: str, site: str, count: int, phase: str) -> None:
        u = uses.get(ns)
        if u is None:
            u = uses[ns] = {"namespace": ns, **classifier.namespace_status(ns), "count": 0, "how": [], "sites": {}}
        u["count"] += count
        if how not in u["how"]:
            u["how"].append(how)
        s = u["sites"].setdefault(site, {"site": site, "count": 0, "phases": []})
        s["count"] += count
        if phase not in s["phases"]:
            s["phases"].append(phase)

    for o in ops:
        ns = o.get("namespace")
        if ns:
            add(ns, f"op {o['op']}", o["site"], o["count"], o["phase"])
    for d in docs:
        for c in d.get("namespace_calls") or []:
            c = dict(c, file=_rel(c.get("file"), cwd), lib_file=lib_path(c.get("lib_file"), cwd))
            add(c["namespace"], f"call {c['api']}", _site(c), c.get("count", 1), c.get("phase") or "forward")
    out = []
    for u in uses.values():
        sites = sorted(u["sites"].values(), key=lambda x: -x["count"])
        u["sites"] = sites
        u["how"] = u["how"][:12]
        out.append(u)
    return sorted(out, key=lambda u: (-_SEVERITY.get(u["status"], 1), u["namespace"]))


def _timing(docs: list[dict]) -> dict:
    t = next((d.get("timing") for d in docs if d.get("timing")), None) or {}
    device = next((d.get("device") for d in docs if d.get("device")), "cpu")
    kind = next((d.get("device_kind") for d in docs if d.get("device_kind")), device)
    out = dict(t)
    out["device"] = "neuron (emulated)" if kind == "emulated" else device
    # First-call (compile) time only means something on a Neuron device (eager kernels and NEFFs compile on
    # first use); elsewhere (the emulated device included) only the steady-state time of the probed run.
    out["first_call_reported"] = kind == "neuron"
    out["note"] = "times include the recorder's overhead"
    return out


def _compile_section(comp: dict, classifier: Classifier, cwd: str) -> dict:
    out = dict(comp)
    blockers, decomposed = [], []
    for g in comp.get("graphs") or []:
        for o in g.get("ops") or []:
            if "::" not in o["op"]:
                continue  # operator.getitem and friends
            c = classifier.classify(o["op"])
            o.update(status=c["status"], file=_rel(o.get("file"), cwd))
            if c["status"] in ("cpu_fallback", "unsupported"):
                row = {"graph": g["index"], "kind": g["kind"], "op": o["op"], "status": c["status"],
                       "file": o.get("file"), "line": o.get("line"), "note": c["note"]}
                # the table's own note: in eager a host fallback, under torch.compile decomposed into native ops
                (decomposed if DECOMPOSED_NOTE in (c["note"] or "") else blockers).append(row)
    out["cannot_lower"] = blockers
    out["decomposed"] = decomposed
    ex = comp.get("explain") or {}
    for b in ex.get("breaks") or []:
        b["file"] = _rel(b.get("file"), cwd)
        b["lib_file"] = lib_path(b.get("lib_file"), cwd)
        b["site"] = _site(b) if (b.get("file") or b.get("lib_file")) else "(no frame outside torch)"
    if ex:
        # dynamo's count and its list of reasons can disagree (a break counted once, listed per frame)
        ex["graph_break_count"] = max(int(ex.get("graph_break_count") or 0), len(ex.get("breaks") or []))
    return out


def _measured_section(measured: list[dict], run_ops: list[dict]) -> dict:
    emulated = any(m.get("emulated") for m in measured)
    fallback, executed, unsupported, upcast, errors = set(), set(), set(), set(), []
    counts: dict[str, int] = {}
    for m in measured:
        if m.get("error"):
            errors.append(m["error"])
        fallback |= {base_name(x) for x in m.get("fallback_ops") or []}
        executed |= {base_name(x) for x in m.get("executed_ops") or []}
        unsupported |= {base_name(x) for x in m.get("unsupported_ops") or []}
        upcast |= set(m.get("upcast_ops") or [])
        for k, v in (m.get("fallback_counts") or {}).items():
            counts[k] = counts.get(k, 0) + int(v)
    rows: dict[str, dict] = {}
    for o in run_ops:
        b = base_name(o["op"])
        r = rows.setdefault(b, {"op": b, "predicted": o["status"], "count": 0})
        r["count"] += o["count"]
    for b, r in rows.items():
        if b in unsupported:
            m = "unsupported"
        elif b in fallback:
            m = "cpu_fallback"
        elif b in HOST_UNTRACKED_OPS and not emulated:
            m = "host_untracked"
        elif b in executed:
            m = "native"
        else:
            m = "not_tracked"
        r["measured"] = m
        p = r["predicted"]
        if m == "not_tracked" or p in ("unknown", "partial"):
            r["agree"] = None
        else:
            r["agree"] = (p == "native") == (m == "native") and (p == "unsupported") == (m == "unsupported")
    recorded = set(rows)
    return {
        "source": "emulated neuron device (kernel set from the compat table)" if emulated else "torch_neuronx op tracking",
        "emulated": emulated,
        "unsupported_ops": sorted(unsupported),
        # native ops whose host kernel lacked the input dtype (`aten::histc.default:Int->Double`): the emulated
        # device ran them upcast and cast the results back; the device has the dtype
        "upcast_ops": sorted(upcast),
        "fallback_counts": dict(sorted(counts.items(), key=lambda kv: -kv[1])),
        "device": next((m.get("device") for m in measured if m.get("device")), None),
        "fallback_ops": sorted(fallback),
        "executed_ops": sorted(executed),
        "host_untracked": [] if emulated else sorted(recorded & HOST_UNTRACKED_OPS),
        "fallback_not_recorded": sorted(fallback - recorded),
        "comparison": sorted(rows.values(), key=lambda r: (r["agree"] is not False, r["op"])),
        "disagreements": sum(1 for r in rows.values() if r["agree"] is False),
        "errors": errors,
        "module_file": next((m.get("module_file") for m in measured if m.get("module_file")), None),
    }


def _failed_checks(report: dict, fail_on: list[str]) -> list[str]:
    failed = []
    s = report["summary"]["by_status"]
    checks = {
        "fallback": s["cpu_fallback"]["ops"] > 0 or bool((report.get("measured") or {}).get("fallback_ops")),
        "unsupported": s["unsupported"]["ops"] > 0 or any(u["status"] == "unsupported" for u in report["namespaces"])
        or bool((report.get("measured") or {}).get("unsupported_ops")),
        "unknown": s["unknown"]["ops"] > 0,
        "partial": s["partial"]["ops"] > 0,
        "float64": bool(report["float64"]["ops"] or report["float64"]["tensors"]),
        "graph-break": bool(((report.get("compile") or {}).get("explain") or {}).get("graph_break_count")),
        "compile": bool((report.get("compile") or {}).get("cannot_lower")) or bool(report.get("compile_refusals")),
    }
    for f in fail_on:
        if checks.get(f):
            failed.append(f)
    return failed
