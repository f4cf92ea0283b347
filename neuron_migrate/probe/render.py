"""Render a probe report: rich terminal summary, Markdown file, JSON."""
from __future__ import annotations

import json
from typing import Any

_STATUS_STYLE = {"native": "green", "cpu_fallback": "yellow", "unsupported": "red", "partial": "magenta",
                 "unknown": "cyan"}


def to_json(report: dict) -> str:
    return json.dumps(report, indent=2, default=str)


def _fmt_s(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 1000:.1f} ms" if x < 1 else f"{x:.2f} s"


def _target(report: dict) -> str:
    t = report.get("target") or {}
    s = t.get("path") or t.get("ref") or "?"
    if report.get("args"):
        s += " -- " + " ".join(report["args"])
    return s


def _sites(row: dict, n: int = 3) -> str:
    parts = []
    for s in row["sites"][:n]:
        extra = f" ({s['phase']}" + (f", {s['grad_fn']}" if s.get("grad_fn") else "") + ")"
        parts.append(f"{s['site']} x{s['count']}{extra}")
    if len(row["sites"]) > n:
        parts.append(f"+{len(row['sites']) - n} more")
    return "; ".join(parts)


def _device_line(report: dict) -> str:
    kind = report.get("device_kind")
    label = {"emulated": "neuron (EMULATED on the host)", "cpu": "cpu (CPU dispatch trace)"}.get(kind or "",
                                                                                               report.get("device") or "?")
    kinds = report.get("emulate_precision")
    if not kinds:
        return label
    names = {"float64": "float64 as float32", "int64": "int64 as int32", "bf16": "bf16 autocast"}
    return label + ", emulated precision: " + ", ".join(names.get(k, k) for k in (kinds if isinstance(kinds, list) else ["float64"]))


def _unknown_line(rows: list[dict], n: int = 25) -> str:
    parts = []
    for r in rows[:n]:
        where = r["sites"][0]["site"] if r.get("sites") else ""
        more = f" +{len(r['sites']) - 1}" if len(r.get("sites") or []) > 1 else ""
        parts.append(f"{r['op']} x{r['count']}" + (f" at {where}{more}" if where else ""))
    return "; ".join(parts) + (" ..." if len(rows) > n else "")


def _headline(report: dict) -> str:
    st = report["status"]
    if st == "timeout":
        return "TIMEOUT: " + (report.get("error") or {}).get("message", "")
    if st == "error":
        e = report.get("error") or {}
        where = f" at {e['file']}:{e['line']}" if e.get("file") else ""
        return f"ERROR ({e.get('type', 'error')}){where}: {e.get('message', '')}"
    return "ok" + (f" (stopped: {report['stopped']})" if report.get("stopped") else "")


def print_rich(report: dict, *, top: int = 10, file=None) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    # what the report shows is data (paths, op names, messages): no emoji codes (`train.py:100:` is not :100:),
    # and data is escaped or put in Text cells, so that `[v2]` in a path or `[low confidence, ...]` in a note is
    # printed, not read as a style tag
    con = Console(file=file, soft_wrap=False, emoji=False)
    if not con.is_terminal or con.width < 120:
        con.width = max(con.width, 140)
    con.rule(f"[bold]neuron-migrate probe[/]: {escape(_target(report))}")
    con.print(f"device [bold]{escape(_device_line(report))}[/]: ", end="")
    con.print(f"{report.get('device_reason') or ''}", markup=False, end="")
    con.print(f"; torch {report.get('torch_version')}; "
              f"table {report.get('table_version') or 'none: ' + str(report.get('table_error'))}; "
              f"ranks {report.get('world_size')}; mode {report.get('mode')}", markup=False)
    if report.get("table_warning"):
        con.print(f"[yellow]warning:[/] {escape(report['table_warning'])}")
    head = _headline(report)
    con.print(f"[bold {'green' if report['status'] == 'ok' else 'red'}]{escape(head)}[/]", markup=True)
    for line in report.get("problems") or []:
        con.print(f"[red]{escape(line)}[/]")
    if report.get("host_runs"):
        con.print("run on the host so the run could go on (the device has no kernel for these tensors): "
                  + "; ".join(f"{r['op']} at {r['site']} x{r['count']}" for r in report["host_runs"][:8]), markup=False)

    t = Table(title="aten ops by status (model construction excluded)", show_lines=False)
    t.add_column("status")
    t.add_column("distinct ops", justify="right")
    t.add_column("calls", justify="right")
    for s, v in report["summary"]["by_status"].items():
        t.add_row(f"[{_STATUS_STYLE.get(s, '')}]{s}[/]", str(v["ops"]), str(v["calls"]))
    con.print(t)

    def rows_table(title: str, rows: list[dict], style: str) -> None:
        if not rows:
            return
        tt = Table(title=title)
        tt.add_column("op", style=style, no_wrap=True)
        tt.add_column("calls", justify="right")
        tt.add_column("call sites", ratio=3)
        tt.add_column("note", ratio=2)
        for r in rows:
            note = r.get("note") or ""
            if r.get("confidence") in ("medium", "low"):  # the table is not sure: say so on the row
                note = f"[{r['confidence']} confidence, {r.get('source') or 'no source'}] {note}"
            tt.add_row(Text(r["op"]), str(r["count"]), Text(_sites(r)), Text(note if len(note) <= 110 else note[:107] + "..."))
        con.print(tt)

    fb = report["cpu_fallback"]
    rows_table(f"CPU fallbacks (top {min(top, len(fb))} of {len(fb)} by calls)", fb[:top], "yellow")
    rows_table("unsupported (would fail)", report["unsupported"], "red")
    rows_table("partial (verify overload/dtype on device)", report["partial"], "magenta")
    unk = report["unknown"]
    if unk:
        con.print("[cyan]unknown[/] (not in the table, verify on device): ", end="")
        con.print(_unknown_line(unk), markup=False)
    ns = report.get("namespaces") or []
    if ns:
        tt = Table(title="namespaces used at run time")
        tt.add_column("namespace", no_wrap=True)
        tt.add_column("status")
        tt.add_column("uses", justify="right")
        tt.add_column("where", ratio=3)
        tt.add_column("note", ratio=2)
        for u in ns:
            where = "; ".join(f"{x['site']} x{x['count']}" for x in u["sites"][:3])
            tt.add_row(Text(u["namespace"]), f"[{_STATUS_STYLE.get(u['status'], '')}]{u['status']}[/]", str(u["count"]),
                       Text(where), Text((u.get("note") or "")[:110]))
        con.print(tt)

    f64 = report["float64"]
    if f64["ops"] or f64["tensors"]:
        tt = Table(title="float64 (TorchNeuron computes it in float32)")
        tt.add_column("what")
        tt.add_column("where")
        tt.add_column("detail")
        for x in f64["tensors"]:
            where = f"{x['file']}:{x['line']}" if x.get("file") else "-"
            tt.add_row(Text(f"{x['kind']} {x['name']}"), Text(where), Text(f"{x['dtype']} {x['shape']}"))
        for x in f64["sources"]:
            tt.add_row(Text(f"created by {x['op']}"), Text(x["site"]), Text(x["phase"]))
        for x in f64["ops"][:top]:
            tt.add_row(Text(x["op"]), Text(x["site"]), Text(f"x{x['count']} {','.join(x['phases'])} {','.join(x['dtypes'])}"))
        con.print(tt)
    else:
        con.print("[green]no float64 ops, parameters or buffers[/]")
    if report.get("construction"):
        con.print("model construction used (usually run on CPU before .to('neuron')): " + ", ".join(report["construction"]),
                  markup=False)

    if "compile" in report:
        c = report["compile"]
        ex = c.get("explain") or {}
        con.rule(f"torch.compile ({escape(str(c.get('backend') or 'capturing backend, CPU'))})")
        if c.get("explain_error"):
            con.print(f"[red]dynamo explain failed:[/] {escape(str(c['explain_error']))}")
        else:
            con.print(f"graphs {ex.get('graph_count')}, graph breaks {ex.get('graph_break_count')}")
            if c.get("calls") == []:
                con.print("  the script never called torch.compile(..., backend=\"neuron\")")
            for b in ex.get("breaks") or []:
                con.print(f"  break at {b.get('site') or '(no frame outside torch)'}: {b['reason']}", markup=False)
        if c.get("graphs_error"):
            con.print(f"[red]capture failed:[/] {escape(str(c['graphs_error']))}")
        for b in c.get("cannot_lower") or []:
            con.print("  [red]cannot lower[/] " + escape(f"{b['op']} ({b['status']}) in {b['kind']} graph {b['graph']} "
                                                         f"from {b.get('file')}:{b.get('line')}"))
        for b in c.get("decomposed") or []:
            con.print(f"  decomposed under compile: {b['op']} ({b['status']} in eager) from {b.get('file')}:{b.get('line')}",
                      markup=False)
        rc = c.get("recompiles")
        if rc:
            con.print(f"dynamic=False over {len(rc['shapes'])} shapes: {rc['total_compiles']} compiles, "
                      f"{rc['recompilations']} recompilations")
            for sh in rc["shapes"]:
                if sh.get("error"):
                    con.print(f"  shape {'x'.join(map(str, sh['shape']))} failed: {sh['error']}", markup=False)

    if "numerics" in report:
        con.rule("numerics")
        for name, cmp in report["numerics"].items():
            con.print(f"[bold]{escape(name)}[/]: worst relative difference {cmp.get('worst_rel', 0):.3g}"
                      + (f" ({cmp.get('ops_downcast')} op calls downcast)" if "ops_downcast" in cmp else ""))
            if "loss" in cmp:
                con.print(f"  loss: abs {cmp['loss'].get('max_abs', 0):.3g} rel {cmp['loss'].get('max_rel', 0):.3g}")
            for o in cmp.get("outputs", []):
                con.print(f"  output {o['index']}: abs {o.get('max_abs', 0):.3g} rel {o.get('max_rel', 0):.3g}")
            worst = sorted(cmp.get("grads", {}).items(), key=lambda kv: -kv[1].get("max_rel", 0))[:5]
            for n, g in worst:
                con.print(f"  grad {n}: abs {g.get('max_abs', 0):.3g} rel {g.get('max_rel', 0):.3g}")

    if "measured" in report:
        m = report["measured"]
        con.rule(f"measured on device ({m.get('source', 'torch_neuronx op tracking')}) vs predicted (table)")
        con.print(f"tracked fallbacks: {', '.join(m['fallback_ops']) or 'none'}", markup=False)
        if m.get("unsupported_ops"):
            con.print(f"[red]unsupported ops called[/]: {escape(', '.join(m['unsupported_ops']))}")
        if m.get("upcast_ops"):
            con.print("native ops run upcast on the host (the host kernel lacks the dtype; the device has it): "
                      + ", ".join(m["upcast_ops"]), markup=False)
        if m["host_untracked"]:
            con.print(f"computed on host, not tracked: {', '.join(m['host_untracked'])}", markup=False)
        tt = Table()
        for col in ("op", "predicted", "measured", "agree"):
            tt.add_column(col)
        for r in m["comparison"]:
            if r["predicted"] == "native" and r["measured"] in ("native", "not_tracked"):
                continue  # as predicted, or a view/copy the device's core kernels do
            tt.add_row(Text(r["op"]), Text(r["predicted"]), Text(r["measured"]), {True: "yes", False: "[red]NO[/]", None: "-"}[r["agree"]])
        con.print(tt)

    tm = report.get("timing") or {}
    if tm.get("steps"):
        if tm.get("first_call_reported"):
            con.print(f"timing: first call (compile) {_fmt_s(tm.get('first_step_s'))}, steady-state step "
                      f"{_fmt_s(tm.get('steady_step_s'))} over {tm['steps']} steps ({tm['note']})")
        else:
            con.print(f"timing: steady-state step {_fmt_s(tm.get('steady_step_s', tm.get('first_step_s')))} on "
                      f"{tm.get('device')} over {tm['steps']} steps ({tm['note']})")
    out = report.get("outcome") or {}
    if report["status"] != "ok":
        e = report.get("error") or {}
        if e.get("traceback"):
            con.print(e["traceback"][-3000:], markup=False, style="dim")
        for stream in ("stdout", "stderr"):
            s = out.get(stream) or {}
            if s.get("bytes"):
                con.print(f"child {stream}: {s['bytes']} bytes; last lines:", markup=False)
                con.print("\n".join(s["tail"].splitlines()[-8:])[-1500:], markup=False)
    if report.get("failed_checks"):
        con.print(f"[red]--fail-on: {escape(', '.join(report['failed_checks']))}[/]")


def to_markdown(report: dict, *, top: int = 10) -> str:
    L: list[str] = []
    L.append(f"# neuron-migrate probe: `{_target(report)}`\n")
    L.append(f"- status: **{_headline(report)}**")
    L.append(f"- device: {_device_line(report)} ({report.get('device_reason')}); torch {report.get('torch_version')}")
    L.append(f"- compat table: {report.get('table_version') or report.get('table_error')}")
    L.append(f"- ranks: {report.get('world_size')}; mode: {report.get('mode')}\n")
    if report.get("problems"):
        L.append("## What TorchNeuron cannot run\n")
        L.extend(f"- {line}" for line in report["problems"])
        for r in report.get("host_runs") or []:
            L.append(f"- run on the host so the run could go on: `{r['op']}` at {r['site']} x{r['count']}")
        L.append("")
    L.append("## Ops by status\n\n| status | distinct ops | calls |\n|---|---:|---:|")
    for s, v in report["summary"]["by_status"].items():
        L.append(f"| {s} | {v['ops']} | {v['calls']} |")
    L.append("")

    def section(title: str, rows: list[dict]) -> None:
        if not rows:
            return
        L.append(f"## {title}\n\n| op | calls | call sites | note |\n|---|---:|---|---|")
        for r in rows:
            L.append(f"| `{r['op']}` | {r['count']} | {_sites(r, 5)} | {(r.get('note') or '').replace('|', '/')} |")
        L.append("")

    section(f"CPU fallbacks (top {top})", report["cpu_fallback"][:top])
    section("Unsupported", report["unsupported"])
    section("Partial", report["partial"])
    if report.get("table_warning"):
        L.append(f"> warning: {report['table_warning']}\n")
    if report["unknown"]:
        L.append("## Unknown (verify on device)\n")
        L.append(_unknown_line(report["unknown"], n=200) + "\n")
    if report.get("namespaces"):
        L.append("## Namespaces used at run time\n\n| namespace | status | uses | where | note |\n|---|---|---:|---|---|")
        for u in report["namespaces"]:
            where = "; ".join(f"{x['site']} x{x['count']}" for x in u["sites"][:5])
            L.append(f"| {u['namespace']} | {u['status']} | {u['count']} | {where} | {(u.get('note') or '').replace('|', '/')} |")
        L.append("")
    f64 = report["float64"]
    L.append("## float64\n")
    if not (f64["ops"] or f64["tensors"]):
        L.append("No float64 ops, parameters or buffers.\n")
    for x in f64["tensors"]:
        L.append(f"- {x['kind']} `{x['name']}` ({x['dtype']}, {x['shape']}) registered at {x.get('file')}:{x.get('line')}")
    for x in f64["sources"]:
        L.append(f"- created by `{x['op']}` at {x['site']} ({x['phase']})")
    for x in f64["ops"]:
        L.append(f"- `{x['op']}` at {x['site']} x{x['count']} ({', '.join(x['phases'])})")
    L.append("")
    if "compile" in report:
        c = report["compile"]
        ex = c.get("explain") or {}
        L.append("## torch.compile\n")
        if c.get("backend"):
            L.append(f"- backend: {c['backend']}")
        L.append(f"- graphs: {ex.get('graph_count')}, graph breaks: {ex.get('graph_break_count')}")
        for b in ex.get("breaks") or []:
            L.append(f"  - {b.get('site') or '(no frame outside torch)'}: {b['reason']}")
        for b in c.get("cannot_lower") or []:
            L.append(f"- cannot lower `{b['op']}` ({b['status']}) in {b['kind']} graph {b['graph']} from {b.get('file')}:{b.get('line')}")
        for b in c.get("decomposed") or []:
            L.append(f"- decomposed under compile: `{b['op']}` ({b['status']} in eager) from {b.get('file')}:{b.get('line')}")
        if c.get("recompiles"):
            r = c["recompiles"]
            L.append(f"- dynamic=False over {len(r['shapes'])} shapes: {r['total_compiles']} compiles, {r['recompilations']} recompilations")
        L.append("")
    if "numerics" in report:
        L.append("## Numerics\n")
        for name, cmp in report["numerics"].items():
            L.append(f"- {name}: worst relative difference {cmp.get('worst_rel', 0):.3g}")
            if "loss" in cmp:
                L.append(f"  - loss: abs {cmp['loss'].get('max_abs', 0):.3g}, rel {cmp['loss'].get('max_rel', 0):.3g}")
            for o in cmp.get("outputs", []):
                L.append(f"  - output {o['index']}: abs {o.get('max_abs', 0):.3g}, rel {o.get('max_rel', 0):.3g}")
            for n, g in cmp.get("grads", {}).items():
                L.append(f"  - grad `{n}`: abs {g.get('max_abs', 0):.3g}, rel {g.get('max_rel', 0):.3g}")
        L.append("")
    if "measured" in report:
        m = report["measured"]
        L.append("## Measured vs predicted\n\n| op | predicted | measured | agree |\n|---|---|---|---|")
        for r in m["comparison"]:
            L.append(f"| `{r['op']}` | {r['predicted']} | {r['measured']} | {r['agree']} |")
        if m.get("upcast_ops"):
            L.append("\nNative ops run upcast on the host (its kernel lacks the dtype; the device has it): "
                     + ", ".join(f"`{u}`" for u in m["upcast_ops"]))
        L.append("")
    tm = report.get("timing") or {}
    if tm.get("steps"):
        L.append("## Timing\n")
        if tm.get("first_call_reported"):
            L.append(f"- first call (compile): {_fmt_s(tm.get('first_step_s'))}")
        L.append(f"- steady-state step: {_fmt_s(tm.get('steady_step_s', tm.get('first_step_s')))} ({tm['note']})\n")
    e = report.get("error")
    if e:
        L.append("## Error\n")
        L.append(f"{e.get('type')}: {e.get('message')}" + (f" at {e['file']}:{e['line']}" if e.get("file") else ""))
        if e.get("traceback"):
            L.append("\n```\n" + e["traceback"][-3000:] + "\n```")
        L.append("")
    return "\n".join(L) + "\n"


def write_markdown(report: dict, path: str, top: int = 10) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(to_markdown(report, top=top))


def short(report: dict) -> dict[str, Any]:
    return {k: report[k] for k in ("status", "summary", "failed_checks")}
