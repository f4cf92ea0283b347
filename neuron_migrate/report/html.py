"""The migration report: one self-contained HTML page (inline CSS, SVG and a few lines of JS; nothing is fetched
when it is viewed) built from a dry-run rewrite of a repository and, optionally, probe JSON reports.

`report_data` makes the plain data (also written with `report --json`); `render_html` turns it into the page.
The numbers on the page are rendered from the same data, and the page embeds it (`<script id="nm-data">`), so a
test can compare what a browser shows with the JSON.
"""
from __future__ import annotations

import html
import json
from collections import Counter
from typing import Iterable, Optional

from neuron_migrate.report.verify_html import verify_section, verify_summary

STATUSES = ("migrated", "manual", "clean", "error")
STATUS_LABEL = {"migrated": "migrated", "manual": "needs manual work", "clean": "clean", "error": "error"}
STATUS_COLOR = {"migrated": "#2e7d32", "manual": "#e65100", "clean": "#607d8b", "error": "#c62828"}
PROBE_STATUSES = ("native", "cpu_fallback", "unsupported", "partial", "unknown")
PROBE_LABEL = {"native": "native", "cpu_fallback": "CPU fallback", "unsupported": "unsupported", "partial": "partial",
               "unknown": "unknown"}
PROBE_COLOR = {"native": "#2e7d32", "cpu_fallback": "#f9a825", "unsupported": "#c62828", "partial": "#8e24aa",
               "unknown": "#78909c"}
INSTALL = ('pip install torch==2.14.0 "torch-neuronx==2.14.*" "neuronx-cc==2.*" '
           "--extra-index-url https://pip.repos.neuron.amazonaws.com  (or torch==2.13.0 with torch-neuronx==2.13.*)")


def file_status(res) -> str:
    from neuron_migrate.rules.model import is_performance_note

    if res.error:
        return "error"
    if any(not is_performance_note(f) for f in res.findings):
        return "manual"  # performance notes alone need no change
    if res.changed or res.applied:
        return "migrated"
    return "clean"


def report_data(results: Iterable, messages: Iterable[str] = (), probes: Iterable[tuple[str, dict]] = (),
                parities: Iterable[tuple[str, dict]] = (), verifies: Iterable[tuple[str, dict]] = ()) -> dict:
    """Plain data for the page from rewrite dry-run FileResults (files.process.FileResult)."""
    from neuron_migrate import __version__
    from neuron_migrate.files.discover import file_kind
    from neuron_migrate.rules.registry import get_rule

    files = []
    fixed: Counter = Counter()
    manual_by_rule: Counter = Counter()
    manual = []
    launch: list[str] = []
    from neuron_migrate.rules.model import is_performance_note

    performance = []  # listed apart: the program runs as it is
    for res in results:
        st = file_status(res)
        todo = [f for f in res.findings if not is_performance_note(f)]
        rem = Counter(f.rule.code for f in todo)
        files.append({"path": res.path, "kind": file_kind(res.path.replace("\\", "/").rsplit("/", 1)[-1]) or "other",
                      "status": st, "fixed": dict(sorted(res.applied.items())), "manual": dict(sorted(rem.items())),
                      "error": res.error})
        fixed.update(res.applied)
        manual_by_rule.update(rem)
        for f in res.findings:
            item = {"path": f.path, "line": f.span.line, "col": f.span.col + 1, "cell": f.cell, "code": f.rule.code,
                    "name": f.rule.name, "severity": f.severity.value, "message": f.message, "note": f.note or "",
                    "fix": f.fix.safety.value if f.fix else None, "url": f.rule.url}
            (performance if is_performance_note(f) else manual).append(item)
        for f in [*res.applied_findings, *res.findings]:
            if f.rule.code in ("NM127", "NM505", "NM502") and f.note:
                where = f"{f.path}:{'cell ' + str(f.cell) + ':' if f.cell else ''}{f.span.line}"
                line = f"{where}: {f.message}" if f.rule.code != "NM127" else f"{where}: {f.note}"
                if line not in launch:
                    launch.append(line)
    for m in messages:
        files.append({"path": m.split(":", 1)[0], "kind": "other", "status": "error", "fixed": {}, "manual": {}, "error": m})
    totals = {s: sum(1 for f in files if f["status"] == s) for s in STATUSES}
    totals["files"] = len(files)
    totals["fixes"] = sum(fixed.values())
    totals["manual_items"] = len(manual)
    totals["performance_notes"] = len(performance)
    by_rule = []
    for code in sorted(set(fixed) | set(manual_by_rule)):
        r = get_rule(code)
        by_rule.append({"code": code, "name": r.name if r else "", "summary": r.summary if r else "",
                        "severity": r.severity.value if r else "", "fixed": fixed.get(code, 0), "manual": manual_by_rule.get(code, 0)})
    return {
        "tool": f"neuron-migrate {__version__}",
        "totals": totals,
        "files": files,
        "by_rule": by_rule,
        "manual": sorted(manual, key=lambda m: (m["path"], m["cell"] or 0, m["line"], m["col"], m["code"])),
        "performance": sorted(performance, key=lambda m: (m["path"], m["cell"] or 0, m["line"], m["col"], m["code"])),
        "launch": launch,
        "install": INSTALL,
        "probes": [probe_summary(name, p) for name, p in probes],
        "parities": [parity_summary(name, p) for name, p in parities],
        "verifies": [verify_summary(name, v) for name, v in verifies],
    }


def parity_summary(name: str, doc: dict) -> dict:
    """A `probe --compare/--parity --format json` document: gates, per-module divergence, culprits."""
    def num(v):
        try:
            return float(v)
        except (TypeError, ValueError):
            return None

    loc = doc.get("localisation") or {}
    return {
        "name": name, "status": doc.get("status", "?"), "ok": bool(doc.get("ok")), "device": doc.get("device"),
        "reference": doc.get("reference_device"), "precision": doc.get("precision") or [],
        "error": (doc.get("error") or {}).get("message"),
        "gates": [{"gate": c.get("gate"), "ok": bool(c.get("ok")), "value": num(c.get("value")), "limit": num(c.get("limit"))}
                  for c in doc.get("checks") or []],
        "modules": [{"module": m.get("module"), "rel_err": num(m.get("rel_err")), "ok": bool(m.get("ok")),
                     "where": f"{m.get('file')}:{m.get('line')}" if m.get("file") else "-", "class": m.get("class", "")}
                    for m in doc.get("modules") or []],
        "tolerance": num((doc.get("gates") or {}).get("act_rtol")),
        "origin": doc.get("origin_module"),
        "culprits": [{"op": c.get("op"), "where": f"{c.get('file')}:{c.get('line')}",
                      "with": [f"{w.get('op')} at {w.get('file')}:{w.get('line')}" for w in c.get("with") or []]}
                     for c in loc.get("culprits") or []],
        "confirmed": bool(loc.get("confirmed")),
    }


def probe_summary(name: str, report: dict) -> dict:
    by = (report.get("summary") or {}).get("by_status") or {}
    f64 = report.get("float64") or {}
    sites = []
    for t in f64.get("tensors") or []:
        sites.append({"what": f"{t.get('kind')} {t.get('name')}", "where": f"{t.get('file')}:{t.get('line')}" if t.get("file") else "-",
                      "detail": f"{t.get('dtype')} {t.get('shape')}"})
    for s in f64.get("sources") or []:
        sites.append({"what": f"created by {s.get('op')}", "where": s.get("site") or "-", "detail": s.get("phase") or ""})
    for o in f64.get("ops") or []:
        sites.append({"what": o.get("op"), "where": o.get("site") or "-",
                      "detail": f"x{o.get('count')} {','.join(o.get('dtypes') or [])}"})
    target = report.get("target") or {}
    return {"name": name, "target": target.get("path") or target.get("ref") or name, "status": report.get("status", "?"),
            "by_status": {s: {"ops": int((by.get(s) or {}).get("ops", 0)), "calls": int((by.get(s) or {}).get("calls", 0))}
                          for s in PROBE_STATUSES},
            "float64": sites}


# -- rendering -----------------------------------------------------------------------------------------
def _e(x) -> str:
    return html.escape(str(x), quote=True)


def _bar(parts: list[tuple[str, int, str, str]], width: int = 640, height: int = 26, test_id: str = "") -> str:
    """A horizontal stacked bar (inline SVG): parts are (key, value, colour, label)."""
    total = sum(v for _, v, _, _ in parts) or 1
    x = 0.0
    rects = []
    for key, v, color, label in parts:
        w = width * v / total
        if v:
            rects.append(f'<rect x="{x:.2f}" y="0" width="{w:.2f}" height="{height}" fill="{color}" data-key="{_e(key)}" '
                         f'data-value="{v}"><title>{_e(label)}: {v}</title></rect>')
        x += w
    return (f'<svg class="bar" role="img" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
            f'data-testid="{_e(test_id)}" xmlns="http://www.w3.org/2000/svg">{"".join(rects)}</svg>')


def _legend(parts: list[tuple[str, int, str, str]], prefix: str) -> str:
    return "".join(f'<span class="lg"><i style="background:{c}"></i>{_e(label)} '
                   f'<b data-testid="{prefix}-{_e(k)}">{v}</b></span>' for k, v, c, label in parts)


CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1c2630;background:#f6f8fa}
header{background:#232f3e;color:#fff;padding:18px 28px}header h1{margin:0;font-size:22px}header p{margin:4px 0 0;color:#c9d3de}
main{padding:18px 28px;max-width:1200px}section{background:#fff;border:1px solid #d8dee4;border-radius:8px;padding:14px 18px;margin:0 0 16px}
h2{font-size:17px;margin:0 0 10px}table{border-collapse:collapse;width:100%}th,td{text-align:left;padding:5px 8px;border-bottom:1px solid #eaeef2;vertical-align:top}
th{background:#f6f8fa;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums}code{font:12px ui-monospace,Menlo,Consolas,monospace}
.cards{display:flex;gap:12px;flex-wrap:wrap}.card{flex:1;min-width:140px;border-radius:8px;padding:10px 14px;color:#fff}
.card b{display:block;font-size:26px}.lg{margin-right:16px;white-space:nowrap}.lg i{display:inline-block;width:11px;height:11px;margin-right:5px;border-radius:2px}
.st{display:inline-block;padding:1px 8px;border-radius:10px;color:#fff;font-size:12px}.note{color:#57606a;font-size:13px}
.sev-error{color:#c62828;font-weight:600}.sev-warning{color:#e65100}.sev-info{color:#0277bd}svg.bar{display:block;margin:6px 0;max-width:100%}
#nm-filter{margin:0 0 8px}#nm-js-errors{color:#c62828}
"""

# Tiny and self-contained: a status filter for the file table, a check that the embedded data parses and adds up,
# and any script error written into the page (so a headless browser test sees it in the DOM as well).
JS = """
(function(){
  var errs=document.getElementById('nm-js-errors');
  window.addEventListener('error',function(e){errs.textContent+='JS error: '+e.message+'\\n';});
  var data=JSON.parse(document.getElementById('nm-data').textContent);
  var t=data.totals, sum=0;
  ['migrated','manual','clean','error'].forEach(function(s){sum+=t[s];});
  var ok=document.getElementById('nm-check');
  ok.textContent=(sum===t.files)?'data check: '+t.files+' files':'data check FAILED';
  ok.setAttribute('data-files',String(sum));
  var sel=document.getElementById('nm-filter');
  sel.addEventListener('change',function(){
    var v=sel.value;
    document.querySelectorAll('#nm-files tbody tr').forEach(function(r){r.style.display=(!v||r.getAttribute('data-status')===v)?'':'none';});
  });
})();
"""


def _divergence_chart(modules: list[dict], tol: float | None, test_id: str, width: int = 640) -> str:
    """One bar per module, in execution order: relative error on a log scale (1e-8 .. 10), the tolerance as a line."""
    import math

    row, label_w = 18, 200
    height = row * len(modules) + 6

    def x(v):
        v = min(max(v if v is not None and v > 0 else 1e-8, 1e-8), 10.0)
        return (math.log10(v) + 8) / 9 * (width - label_w)

    bars = []
    for k, m in enumerate(modules):
        err = m["rel_err"]
        w = x(err) if err is not None else width - label_w
        color = "#2e7d32" if m["ok"] else "#c62828"
        shown = "inf" if err is None else f"{err:.3g}"
        bars.append(f'<text x="0" y="{k * row + 13}" font-size="11">{_e(m["module"])}</text>'
                    f'<rect x="{label_w}" y="{k * row + 3}" width="{w:.1f}" height="{row - 6}" fill="{color}" '
                    f'data-module="{_e(m["module"])}" data-ok="{str(m["ok"]).lower()}"><title>{_e(m["module"])}: '
                    f'relative error {shown}</title></rect>')
    if tol:
        tx = label_w + x(tol)
        bars.append(f'<line x1="{tx:.1f}" y1="0" x2="{tx:.1f}" y2="{height}" stroke="#232f3e" stroke-dasharray="3,3">'
                    f'<title>tolerance {tol:g}</title></line>')
    return (f'<svg class="bar" role="img" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
            f'data-testid="{_e(test_id)}" xmlns="http://www.w3.org/2000/svg">{"".join(bars)}</svg>')


def _num(v) -> str:
    return "-" if v is None else f"{v:.4g}"


def _parity_section(i: int, p: dict) -> str:
    verdict = "all gates passed" if p["ok"] else ("failed: " + (p["error"] or "a gate failed"))
    gates = "".join(f'<tr data-testid="parity-{i}-gate" data-ok="{str(g["ok"]).lower()}"><td>{_e(g["gate"])}</td>'
                    f'<td>{"PASS" if g["ok"] else "FAIL"}</td><td class="n">{_num(g["value"])}</td>'
                    f'<td class="n">{_num(g["limit"])}</td></tr>' for g in p["gates"])
    culprits = "".join(f'<li data-testid="parity-{i}-culprit"><code>{_e(c["op"])}</code> at <code>{_e(c["where"])}</code>'
                       f'{"".join(", with <code>" + _e(w) + "</code>" for w in c["with"])}</li>' for c in p["culprits"])
    origin = (f'<p>Divergence starts in module <code data-testid="parity-{i}-origin">{_e(p["origin"])}</code>'
              f'{" (confirmed by a replay in reference precision)" if p["confirmed"] else ""}.</p><ul>{culprits}</ul>'
              if p["origin"] else "")
    return (f'<section data-testid="parity-{i}"><h2>Parity: {_e(p["name"])} <span class="note">({_e(p["device"])} vs '
            f'{_e(p["reference"])}; emulated precision: {_e(", ".join(p["precision"]) or "none")}; {_e(verdict)})</span></h2>'
            f'<table><thead><tr><th>gate</th><th></th><th>value</th><th>limit</th></tr></thead><tbody>{gates}</tbody></table>'
            f'{origin}<h3>Module outputs, relative error (log scale, dashed: tolerance)</h3>'
            f'{_divergence_chart(p["modules"], p["tolerance"], f"parity-{i}-modules")}</section>')


def render_html(data: dict, title: str = "TorchNeuron migration report") -> str:
    t = data["totals"]
    cards = "".join(f'<div class="card" style="background:{STATUS_COLOR[s]}"><b data-testid="total-{s}">{t[s]}</b>{_e(STATUS_LABEL[s])}</div>'
                    for s in STATUSES)
    parts = [(s, t[s], STATUS_COLOR[s], STATUS_LABEL[s]) for s in STATUSES]
    summary = (f'<section><h2>Summary</h2><div class="cards">{cards}</div>{_bar(parts, test_id="files-bar")}'
               f'<div>{_legend(parts, "legend")}</div><p class="note"><span data-testid="total-files">{t["files"]}</span> files, '
               f'<span data-testid="total-fixes">{t["fixes"]}</span> automatic fixes, '
               f'<span data-testid="total-manual-items">{t["manual_items"]}</span> items for manual work, '
               f'<span data-testid="total-performance-notes">{t.get("performance_notes", 0)}</span> performance notes '
               f'(listed apart: no change needed). '
               f'<span id="nm-check"></span></p></section>')
    rows = "".join(
        f'<tr data-status="{f["status"]}" data-testid="file-row"><td><code>{_e(f["path"])}</code></td><td>{_e(f["kind"])}</td>'
        f'<td><span class="st" style="background:{STATUS_COLOR[f["status"]]}">{_e(STATUS_LABEL[f["status"]])}</span></td>'
        f'<td>{_e(", ".join(f"{c}×{n}" for c, n in f["fixed"].items()))}</td>'
        f'<td>{_e(", ".join(f"{c}×{n}" for c, n in f["manual"].items()))}{_e(f["error"] or "")}</td></tr>'
        for f in data["files"])
    options = "".join(f'<option value="{s}">{_e(STATUS_LABEL[s])}</option>' for s in STATUSES)
    files = (f'<section><h2>Files</h2><select id="nm-filter"><option value="">all statuses</option>{options}</select>'
             f'<table id="nm-files"><thead><tr><th>file</th><th>kind</th><th>status</th><th>fixed (rule×count)</th>'
             f'<th>manual (rule×count)</th></tr></thead><tbody>{rows}</tbody></table></section>')
    rule_rows = "".join(
        f'<tr data-testid="rule-row" data-code="{_e(r["code"])}"><td><code>{_e(r["code"])}</code></td><td>{_e(r["name"])}</td>'
        f'<td class="sev-{_e(r["severity"])}">{_e(r["severity"])}</td><td class="n" data-testid="rule-fixed">{r["fixed"]}</td>'
        f'<td class="n" data-testid="rule-manual">{r["manual"]}</td><td class="note">{_e(r["summary"])}</td></tr>'
        for r in data["by_rule"])
    rules = (f'<section><h2>By rule</h2><table><thead><tr><th>code</th><th>rule</th><th>severity</th><th>fixed</th><th>manual</th>'
             f'<th>what</th></tr></thead><tbody>{rule_rows or "<tr><td colspan=6>nothing to migrate</td></tr>"}</tbody></table></section>')
    man_rows = "".join(
        f'<tr data-testid="manual-row"><td><code>{_e(m["path"])}:{("cell " + str(m["cell"]) + ":") if m["cell"] else ""}{m["line"]}:{m["col"]}</code></td>'
        f'<td><a href="{_e(m["url"])}"><code>{_e(m["code"])}</code></a></td><td class="sev-{_e(m["severity"])}">{_e(m["severity"])}</td>'
        f'<td>{_e(m["message"])}{("<div class=note>" + _e(m["note"]) + "</div>") if m["note"] else ""}'
        f'{"<div class=note>fixable with --unsafe-fixes</div>" if m["fix"] else ""}</td></tr>'
        for m in data["manual"])
    manual = (f'<section><h2>Manual work</h2><table><thead><tr><th>where</th><th>rule</th><th>severity</th><th>what to do</th></tr>'
              f'</thead><tbody>{man_rows or "<tr><td colspan=4>none</td></tr>"}</tbody></table></section>')
    perf_rows = "".join(
        f'<tr data-testid="performance-row"><td><code>{_e(m["path"])}:{("cell " + str(m["cell"]) + ":") if m["cell"] else ""}{m["line"]}:{m["col"]}</code></td>'
        f'<td><a href="{_e(m["url"])}"><code>{_e(m["code"])}</code></a></td><td>{_e(m["message"])}</td></tr>'
        for m in data.get("performance") or [])
    if perf_rows:
        manual += (f'<section><h2>Performance notes</h2><p class="note">The program runs as it is; no change needed.</p>'
                   f'<table><thead><tr><th>where</th><th>rule</th><th>note</th></tr></thead><tbody>{perf_rows}</tbody></table></section>')
    launch_items = "".join(f"<li><code>{_e(x)}</code></li>" for x in data["launch"])
    launch = (f'<section><h2>Launch</h2><p>Install TorchNeuron (Neuron 2.33): <code>{_e(data["install"])}</code></p>'
              f'<p>Start multi-process training with torchrun, one process per NeuronCore (64 on trn2.48xlarge); '
              f'the first run compiles and caches, there is no separate pre-compilation step.</p>'
              f'<ul>{launch_items or "<li>no launch changes were needed</li>"}</ul></section>')
    probe_html = ""
    for i, p in enumerate(data["probes"]):
        pparts = [(s, p["by_status"][s]["ops"], PROBE_COLOR[s], PROBE_LABEL[s]) for s in PROBE_STATUSES]
        cparts = [(s, p["by_status"][s]["calls"], PROBE_COLOR[s], PROBE_LABEL[s]) for s in PROBE_STATUSES]
        f64 = "".join(f'<tr data-testid="f64-row-{i}"><td>{_e(x["what"])}</td><td><code>{_e(x["where"])}</code></td><td>{_e(x["detail"])}</td></tr>'
                      for x in p["float64"])
        probe_html += (f'<section data-testid="probe-{i}"><h2>Probe: {_e(p["name"])} <span class="note">({_e(p["target"])}, {_e(p["status"])})</span></h2>'
                       f'<div>distinct ops</div>{_bar(pparts, test_id=f"probe-{i}-ops")}<div>{_legend(pparts, f"probe-{i}-ops")}</div>'
                       f'<div>calls</div>{_bar(cparts, test_id=f"probe-{i}-calls")}<div>{_legend(cparts, f"probe-{i}-calls")}</div>'
                       f'<h3>float64 sites (TorchNeuron computes float64 in float32): <span data-testid="probe-{i}-f64">{len(p["float64"])}</span></h3>'
                       f'<table><tbody>{f64 or "<tr><td>none</td></tr>"}</tbody></table></section>')
    parity_html = "".join(_parity_section(i, p) for i, p in enumerate(data.get("parities") or []))
    parity_html += "".join(verify_section(i, v, _e, _divergence_chart) for i, v in enumerate(data.get("verifies") or []))
    payload = json.dumps(data, ensure_ascii=True).replace("</", "<\\/")
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">'
            f'<title>{_e(title)}</title><style>{CSS}</style></head><body>'
            f'<header><h1>{_e(title)}</h1><p>{_e(data["tool"])}: a dry run of <code>neuron-migrate rewrite</code>; '
            f'nothing was changed.</p></header><main><pre id="nm-js-errors"></pre>{summary}{files}{rules}{manual}{launch}{probe_html}{parity_html}</main>'
            f'<script id="nm-data" type="application/json">{payload}</script><script>{JS}</script></body></html>')
