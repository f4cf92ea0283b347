"""`neuron-migrate rules` and `neuron-migrate explain CODE`: the registry, as users read it."""
from __future__ import annotations

from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    app.command("rules", help="List every rule: code, name, fix safety, summary.")(rules_cmd)
    app.command("explain", help="Explain one rule (code or name): what it finds, why, how it fixes, examples.")(explain)


def rules_cmd(
    output_format: str = typer.Option("text", "--output-format", "--format", help="text | json"),
    select: Optional[str] = typer.Option(None, "--select", help="Only codes with these prefixes (comma separated)."),
) -> None:
    from neuron_migrate.rules.registry import all_rules

    sel = [s.strip().upper() for s in (select or "").split(",") if s.strip()]
    rules = [r for r in all_rules() if not sel or any(r.code.startswith(s) for s in sel)]
    if output_format == "json":
        import json

        typer.echo(json.dumps([rule_dict(r) for r in rules], indent=2))
        return
    from rich.table import Table

    from neuron_migrate.report.text import console

    t = Table(show_lines=False, box=None, pad_edge=False)
    for col in ("code", "name", "fix", "severity", "summary"):
        t.add_column(col, overflow="fold")
    for r in rules:
        t.add_row(r.code, r.name, r.fix_safety.value, r.severity.value, r.summary)
    console().print(t)


def rule_dict(r) -> dict:
    return {
        "code": r.code,
        "name": r.name,
        "summary": r.summary,
        "fix": r.fix_safety.value,
        "severity": r.severity.value,
        "category": r.category,
        "docs": r.docs,
        "examples": [{"before": e.before, "after": e.after} for e in r.examples],
        "url": r.url,
    }


def explain(code: str = typer.Argument(..., help="Rule code (NM101) or name (mark-step).")) -> None:
    from neuron_migrate.rules.registry import all_rules, get_rule

    r = get_rule(code)
    if r is None:
        close = [x.code for x in all_rules() if x.code.startswith(code.upper()[:4])]
        typer.echo(f"neuron-migrate: unknown rule {code!r}" + (f" (did you mean {', '.join(close[:5])}?)" if close else ""), err=True)
        raise typer.Exit(2)
    from rich.markdown import Markdown

    from neuron_migrate.report.text import console

    fix = {"safe": "Fix: safe (applied by `rewrite`).", "unsafe": "Fix: unsafe (applied by `rewrite --unsafe-fixes`).",
           "none": "Fix: none (reported for manual migration)."}[r.fix_safety.value]
    md = [f"# {r.code} {r.name}", "", f"**{r.summary}**", "", f"Severity: {r.severity.value}. {fix}", "", r.docs, ""]
    for i, e in enumerate(r.examples, 1):
        md += [f"## Example {i}" if len(r.examples) > 1 else "## Example", "", "```python", e.before.rstrip(), "```", ""]
        if e.after is not None:
            md += ["becomes" if e.after.strip() else "is removed.", ""]
            if e.after.strip():
                md += ["```python", e.after.rstrip(), "```", ""]
    console().print(Markdown("\n".join(md)))
