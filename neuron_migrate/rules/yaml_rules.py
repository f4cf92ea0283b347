"""Rules written as data in `rules/*.yaml`: renames, deletions and reports that need no code.

Each YAML file is a list of entries:

    - code: NM130
      name: syncfree-optimizer
      summary: ...
      kind: rename | delete | report
      fix: safe | unsafe | none          (rename/delete only)
      severity: error | warning | info
      match:                             rename: {old.qualified.name: new.qualified.name}
        torch_xla.amp.syncfree.SGD: torch.optim.SGD     delete/report: [qualified.name, prefix.*]
      message: "..."                     shown for each finding ({name} is the matched name)
      docs: "..."
      examples: [{before: "...", after: "..."}]
"""
from __future__ import annotations

from pathlib import Path

from neuron_migrate.rules.model import Example, FixSafety, Rule, Severity

_KINDS = ("rename", "delete", "report")


def load_yaml_rules(folder: Path | None = None) -> list[Rule]:
    import yaml

    from neuron_migrate._data import data_dir
    from neuron_migrate.rules.registry import RuleError

    folder = folder or data_dir("rules")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    rules = []
    for path in sorted(folder.glob("*.yaml")):
        try:
            entries = yaml.load(path.read_text(encoding="utf-8"), Loader=loader) or []
        except yaml.YAMLError as exc:
            raise RuleError(f"{path}: invalid YAML: {exc}") from None
        for i, entry in enumerate(entries):
            try:
                rules.append(_rule_from_entry(entry, path))
            except (KeyError, ValueError, TypeError) as exc:
                raise RuleError(f"{path}: entry {i + 1}: {exc!r}") from None
    return rules


def _rule_from_entry(e: dict, path: Path) -> Rule:
    kind = e["kind"]
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {_KINDS}, not {kind!r}")
    match = e["match"]
    names = list(match) if isinstance(match, dict) else list(match)
    triggers = []
    for n in names:
        triggers += [("call", n), ("ref", n), ("store", n)] if kind != "report" else [("call", n), ("ref", n), ("store", n), ("import", n)]
    fix = FixSafety(e.get("fix", "none" if kind == "report" else "safe"))
    check = _make_check(kind, match, e.get("message", ""), e.get("note", ""))
    return Rule(
        code=e["code"],
        name=e["name"],
        summary=e["summary"],
        fix_safety=fix,
        severity=Severity(e.get("severity", "warning")),
        docs=str(e.get("docs", e["summary"])).strip(),
        examples=[Example(x["before"], x.get("after")) for x in e.get("examples", [])],
        triggers=triggers,
        check=check,
        trigger_words=tuple(sorted({n.split(".")[0] for n in names})),
        origin=str(path.name),
    )


def _matched(site_key: str, pattern: str) -> bool:
    return site_key.startswith(pattern[:-1]) if pattern.endswith("*") else site_key == pattern


def _make_check(kind: str, match, message: str, note: str):
    def check(site, ctx):
        pattern = next((p for p in match if _matched(site.key, p)), None)
        if pattern is None:
            return None
        msg = (message or ctx.rule.summary).format(name=site.key)
        if site.kind == "store":
            return ctx.finding(site, f"`{ctx.src(site.node)}` is assigned (monkey-patched): migrate by hand", note=note)
        if kind == "report" or site.kind == "import":
            return ctx.finding(site, msg, note=note)
        if kind == "rename":
            target = match[pattern]
            if pattern.endswith("*"):
                target = target.rstrip("*") + site.key[len(pattern) - 1 :]
            fx = ctx.fixer()
            callee = site.node.func if site.kind == "call" else site.node
            fx.replace(callee, fx.name(target, site.scope))
            return ctx.finding(site, msg, fix=fx.build(), note=note)
        # delete: a standalone call statement goes; anything else is reported
        if site.kind == "call" and site.is_statement:
            fx = ctx.fixer()
            fx.delete(site.stmt)
            return ctx.finding(site, msg, fix=fx.build(), note=note)
        return ctx.finding(site, f"{msg} (its value is used here: migrate by hand)", note=note)

    return check
