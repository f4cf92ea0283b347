"""The HTML report's verify section, from a `neuron-migrate verify --format json` result: the verdict, what ran
against what, the gates, where the runs part (step, module or optimizer, the rewritten lines), and a per-step
chart of the loss difference against its gate."""
from __future__ import annotations


def verify_summary(name: str, doc: dict) -> dict:
    cmp = doc.get("comparison") or {}
    where = doc.get("where") or {}
    first = cmp.get("first") or {}
    site = where.get("optimizer_site") or (where if where.get("optimizer") else {})
    return {
        "name": name, "verdict": doc.get("verdict", "?"), "how": doc.get("how", ""), "script": doc.get("script", ""),
        "mode": cmp.get("mode"), "steps": cmp.get("steps", 0), "gates": cmp.get("gates") or {},
        "worst": cmp.get("worst") or {}, "versions": doc.get("versions") or {}, "supplied": doc.get("supplied") or [],
        "first": {"step": first.get("step"), "what": first.get("what"), "detail": first.get("detail")} if first else None,
        "module": where.get("module"), "source": where.get("source") or site.get("source"),
        "optimizer": site.get("optimizer"),
        "hunks": [{"where": f"{h['path']}:{h['new'][0] if h['new'][1] >= h['new'][0] else h['old'][0]}",
                   "codes": h.get("codes") or [], "added": h.get("added") or [],
                   "removed": (h.get("removed") or []) if h["new"][1] < h["new"][0] else []}
                  for h in (where.get("hunks") or site.get("hunks") or [])],
        "loss": [{"step": r["step"], "rel": r.get("loss_rel")} for r in cmp.get("rows") or [] if "loss_rel" in r],
        "seconds": doc.get("seconds") or {},
        "distributed": doc.get("distributed"),
        "collectives": cmp.get("collectives") or {}, "collective": where.get("collective"),
    }


def _counts(counts: dict, esc) -> str:
    return esc(", ".join(f"{k} ×{n}" for k, n in counts.items()) or "none")


VERDICT_TEXT = {"equivalent": "equivalent", "diverged": "diverged", "not-deterministic": "the original is not deterministic",
                "no-steps": "nothing compared"}


def verify_section(i: int, v: dict, esc, chart) -> str:
    """`esc`: html.escape; `chart(rows, tolerance, test_id)`: the report's log-scale bar chart."""
    gates = v["gates"]
    loss_gate = gates.get("loss")
    rows = [{"module": f"step {r['step']}", "rel_err": r["rel"],
             "ok": r["rel"] is not None and (loss_gate is None or r["rel"] <= loss_gate)} for r in v["loss"]]
    vers = v["versions"]
    head = (f'<p>{esc(v["how"])}: the original under torch {esc((vers.get("original") or {}).get("torch"))} + torch_xla '
            f'{esc((vers.get("original") or {}).get("torch_xla"))} on XLA:CPU, the migrated program under torch '
            f'{esc((vers.get("migrated") or {}).get("torch"))} natively; <span data-testid="verify-{i}-steps">{v["steps"]}</span> '
            f'optimizer steps in {esc(v["mode"])} mode, one process. Gates: loss {esc(gates.get("loss"))} relative, gradients and '
            f'parameters {esc(gates.get("grad"))} of their largest value, gradient cosine &ge; {esc(gates.get("cosine"))}.</p>')
    worst = v["worst"]
    head += (f'<p class="note">largest differences: loss {worst.get("loss", 0):.3g}, gradient {worst.get("grad", 0):.3g}, '
             f'parameter {worst.get("param", 0):.3g}</p>') if worst else ""
    d = v.get("distributed")
    if d:
        head += (f'<p data-testid="verify-{i}-distributed">{esc(d["nproc"])} processes under torchrun (the migrated program): '
                 f'world sizes {esc(d["world_sizes"])}, largest difference between the ranks\' parameters '
                 f'{d["worst_rank_difference"]:.3g} (gate {esc(d["gate"])}): {"consistent" if d["ok"] else "NOT consistent"}</p>')
        coll = d.get("collectives") or {}
        if coll.get("rows"):
            row = coll["rows"][0]
            head += (f'<p data-testid="verify-{i}-collectives">Collectives in the first step ({esc(coll["compared"])}): '
                     f'original <code>{_counts(row["original"], esc)}</code>; migrated, rank 0 of {esc(d["nproc"])}: '
                     f'<code>{_counts(row["migrated"], esc)}</code></p>')
        traj = d.get("trajectory") or {}
        if traj:
            text = (f'{esc(d["nproc"])} processes against 1: comparable (the ranks\' first losses average to the 1-process '
                    f'one), largest gradient difference {(traj.get("worst") or {}).get("grad", 0):.3g}'
                    if traj.get("comparable") else f'{esc(d["nproc"])} processes against 1: not compared, {esc(traj.get("why"))}')
            head += f'<p data-testid="verify-{i}-trajectory">{text}</p>'
    elif v.get("collectives") and any(v["collectives"].values()):
        c = v["collectives"]
        head += (f'<p class="note" data-testid="verify-{i}-collectives">Collectives in the first step (one process, not '
                 f'gated: XLA with one replica may skip them): original <code>{_counts(c.get("original") or {}, esc)}</code>; '
                 f'migrated <code>{_counts(c.get("migrated") or {}, esc)}</code></p>')
    if v["supplied"]:
        head += f'<p class="note">supplied for the original run (removed in torch_xla 2.9): {esc(", ".join(v["supplied"]))}</p>'
    body = ""
    if v["first"]:
        f = v["first"]
        at = (f' in <code data-testid="verify-{i}-module">{esc(v["module"])}</code>' if v["module"] else
              f' in the optimizer step (<code>{esc(v["optimizer"])}</code>)' if v["optimizer"] else
              f' in the gradient <code data-testid="verify-{i}-collective">{esc(v["collective"])}</code>'
              if v.get("collective") else "")
        src = f' (<code data-testid="verify-{i}-source">{esc(v["source"])}</code>)' if v["source"] else ""
        body += (f'<p>Diverges at step <b data-testid="verify-{i}-step">{esc(f["step"])}</b>{at}{src}: {esc(f["detail"])}</p>')
        items = "".join(f'<li data-testid="verify-{i}-hunk"><code>{esc(h["where"])}</code> '
                        f'({esc(", ".join(h["codes"]) or "not by a rewrite rule")}): '
                        + (f'removed from the original: <code>{esc("; ".join(x.strip() for x in h["removed"][:2]))}</code></li>'
                           if h.get("removed") else f'<code>{esc("; ".join(x.strip() for x in h["added"][:2]))}</code></li>')
                        for h in v["hunks"])
        body += f'<ul>{items}</ul>' if items else ""
    return (f'<section data-testid="verify-{i}" data-verdict="{esc(v["verdict"])}"><h2>Verify: {esc(v["name"])} '
            f'<span class="note">({esc(v["script"])}; <span data-testid="verify-{i}-verdict">'
            f'{esc(VERDICT_TEXT.get(v["verdict"], v["verdict"]))}</span>)</span></h2>{head}{body}'
            f'<h3>Loss per step, relative difference (log scale, dashed: gate)</h3>'
            f'{chart(rows, loss_gate, f"verify-{i}-loss") if rows else "<p>no step compared</p>"}</section>')
