"""Text and JSON forms of a verify result. No torch here."""
from __future__ import annotations

import json

from neuron_migrate.verify.changes import hunk_line

VERDICT_LINE = {
    "equivalent": "EQUIVALENT: the migrated program computes what the original computed",
    "diverged": "DIVERGED: the migrated program computes something else",
    "no-steps": "NOTHING COMPARED: neither program reached an optimizer step",
    "not-deterministic": "NOT DETERMINISTIC: the original program differs from itself run twice (not a migration defect)",
}


def to_json(result: dict) -> str:
    return json.dumps(result, indent=2, default=str, sort_keys=False)


def _fmt_hunks(hunks: list) -> list[str]:
    out = []
    for h in hunks[:6]:
        first, removed = hunk_line(h)
        by = ", ".join(h["codes"]) if h["codes"] else "not by a rewrite rule"
        if removed:
            out.append(f"    removed at {h['path']}:{first} of the original ({by}): "
                       + "; ".join(line.strip() for line in h["removed"][:2]))
        else:
            out.append(f"    changed at {h['path']}:{first} ({by}): " + "; ".join(line.strip() for line in h["added"][:2]))
    return out


def _fmt_counts(counts: dict) -> str:
    return ", ".join(f"{k} x{n}" for k, n in counts.items()) or "none"


def _collective_lines(title: str, original: dict, migrated: dict, migrated_label: str = "migrated") -> list[str]:
    if not original and not migrated:
        return []
    return [f"  {title}:", f"    original: {_fmt_counts(original)}", f"    {migrated_label}: {_fmt_counts(migrated)}"]


def summary_line(result: dict) -> str:
    """One line: the verdict and, when diverged, where."""
    verdict = result.get("verdict", "")
    cmp = result.get("comparison") or {}
    if verdict == "diverged":
        first = cmp.get("first") or {}
        where = result.get("where") or {}
        at = (f" in {where['module']}" if where.get("module") else f" in the optimizer step ({where['optimizer']})"
              if where.get("optimizer") else f" in the gradient {where['collective']}" if where.get("collective") else "")
        src = f" ({where['source']})" if where.get("source") else ""
        hunk = (where.get("hunks") or [None])[0]
        changed = ""
        if hunk:
            first_line, removed = hunk_line(hunk)
            changed = f", changed by {', '.join(hunk['codes']) or 'hand'} at {hunk['path']}:{first_line}"
            if removed:
                changed += (" of the original" + (f" (removed: {hunk['removed'][0].strip()})" if hunk.get("removed")
                                                  else " (lines removed)"))
        return f"diverges at step {first.get('step')}{at}{src}{changed}: {first.get('detail')}"
    return VERDICT_LINE.get(verdict, verdict)


def render_text(result: dict) -> str:
    lines = []
    verdict = result.get("verdict", "")
    cmp = result.get("comparison") or {}
    lines.append(VERDICT_LINE.get(verdict, verdict))
    lines.append(f"  compared: {result.get('how', '')}")
    v = result.get("versions", {})
    lines.append(f"  original: torch {v.get('original', {}).get('torch')} + torch_xla {v.get('original', {}).get('torch_xla')} "
                 f"(XLA:CPU); migrated: torch {v.get('migrated', {}).get('torch')} (CPU)")
    if result.get("supplied"):
        lines.append("  supplied for the original run (removed in torch_xla 2.9): " + ", ".join(result["supplied"]))
    if cmp:
        g = cmp.get("gates", {})
        w = cmp.get("worst", {})
        lines.append(f"  {cmp.get('steps')} optimizer steps compared in {cmp.get('mode')} mode, 1 process (world size 1); "
                     f"gates: loss {g.get('loss'):.0e} relative, gradients/parameters {g.get('grad'):.0e} of the largest "
                     f"value and cosine >= {g.get('cosine')}")
        lines.append(f"  largest differences: loss {w.get('loss', 0):.2e}, gradient {w.get('grad', 0):.2e} "
                     f"(cosine {w.get('cosine', 1):.9f}), parameter {w.get('param', 0):.2e}")
    if cmp:
        lines.extend(_collective_lines("collectives in the first step (1 process, not gated: XLA with one replica and "
                                       "a program with world size 1 may skip collectives)",
                                       *[(cmp.get("collectives") or {}).get(k, {}) for k in ("original", "migrated")]))
    dist = result.get("distributed")
    if dist:
        lines.append(f"  {dist['nproc']} processes under torchrun (the migrated program): world sizes "
                     f"{dist['world_sizes']}, {dist['steps']} steps, largest difference between the ranks' parameters "
                     f"{dist['worst_rank_difference']:.2e} (gate {dist['gate']:.0e})")
        coll = dist.get("collectives") or {}
        if coll.get("rows"):
            row = coll["rows"][0]
            lines.extend(_collective_lines(f"collectives in the first step, {coll['compared']}"
                                           + ("" if coll.get("same_every_step") else " (they vary from step to step)"),
                                           row["original"], row["migrated"], f"migrated (rank 0 of {dist['nproc']})"))
        traj = dist.get("trajectory") or {}
        if traj.get("comparable"):
            w = traj.get("worst") or {}
            lines.append(f"  {dist['nproc']} processes against 1 (the data split makes them comparable: the ranks' first "
                         f"losses average to the 1-process one): {traj.get('steps')} steps, largest differences: loss "
                         f"{w.get('loss', 0):.2e}, gradient {w.get('grad', 0):.2e}, parameter {w.get('param', 0):.2e}")
        elif traj:
            lines.append(f"  {dist['nproc']} processes against 1: not compared, {traj.get('why')}")
    if verdict == "diverged":
        lines.append("  " + summary_line(result))
        first = cmp.get("first") or {}
        numeric = cmp.get("first_numeric")
        if first.get("what") == "hparams" and numeric:
            lines.append(f"  the numbers part at step {numeric['step']}: {numeric['detail']}")
        elif first.get("what") == "hparams":
            lines.append("  the numbers stayed within the gates over the steps compared; the settings differ nonetheless")
        where = result.get("where") or {}
        if where.get("phase") == "mode":
            if where.get("call"):
                lines.append(f"  the mode was set by {where['call']}")
        elif where.get("detail"):
            lines.append(f"  replay of step {first.get('step')}: {where['detail']}")
        site = where.get("optimizer_site") or (where if where.get("optimizer") else {})
        if site.get("optimizer") and site is not where:
            lines.append(f"  optimizer: {site['optimizer']} at {site.get('source')}")
        lines.extend(_fmt_hunks(where.get("hunks") or site.get("hunks") or []))
    if verdict == "equivalent" and result.get("hunks"):
        codes = sorted({c for h in result["hunks"] for c in h["codes"]})
        files = len({h["path"] for h in result["hunks"]})
        lines.append(f"  {len(result['hunks'])} changed hunks in {files} files" + (f" (rules {', '.join(codes)})" if codes else ""))
    for name in ("original", "migrated"):
        if result.get(f"{name}_error"):
            lines.append(f"  the {name} program failed after its first steps:\n" + result[f"{name}_error"].rstrip())
    s = result.get("seconds", {})
    if s:
        lines.append("  time: " + ", ".join(f"{k} {val:.1f} s" for k, val in s.items()))
    lines.append("  not shown by this check: the Neuron compiler's numerics on Trainium, performance, more than one "
                 "replica of the original (XLA's CPU backend cannot run two)")
    return "\n".join(lines)
