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


COMPILED_SUFFIX = ".compiled.json"


def compiled_path(path: Path) -> Path:
    """`rules/torch_xla.yaml` -> `rules/torch_xla.compiled.json`: the same entries as JSON, with the YAML's sha256."""
    return path.with_name(path.stem + COMPILED_SUFFIX)


def _entries(path: Path) -> list:
    """The entries of one rule file: from its compiled JSON form when that was made from these exact bytes (no
    YAML import or parse on the command line's start), else from the YAML."""
    import json

    from neuron_migrate.files.digests import sha256_hex

    raw = path.read_bytes()
    cp = compiled_path(path)
    try:
        compiled = json.loads(cp.read_text(encoding="utf-8"))
        if compiled.get("sha256") == sha256_hex(raw):
            return compiled["entries"]
    except (OSError, ValueError, KeyError, AttributeError):
        pass  # missing or damaged: the YAML decides
    return parse_yaml_entries(path, raw)


def parse_yaml_entries(path: Path, raw: bytes | None = None) -> list:
    import yaml

    from neuron_migrate.rules.registry import RuleError

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        return yaml.load((raw if raw is not None else path.read_bytes()).decode("utf-8"), Loader=loader) or []
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise RuleError(f"{path}: invalid YAML: {exc}") from None


def write_compiled(path: Path) -> Path:
    """Write the compiled form of one rule file (`python -m neuron_migrate.rules.yaml_rules`)."""
    import hashlib
    import json

    raw = path.read_bytes()
    out = compiled_path(path)
    data = {"sha256": hashlib.sha256(raw).hexdigest(), "source": path.name, "entries": parse_yaml_entries(path, raw)}
    out.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return out


def load_yaml_rules(folder: Path | None = None) -> list[Rule]:
    from neuron_migrate._data import data_dir
    from neuron_migrate.rules.registry import RuleError

    folder = folder or data_dir("rules")
    rules = []
    for path in sorted(folder.glob("*.yaml")):
        entries = _entries(path)
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


if __name__ == "__main__":  # regenerate the compiled forms after editing rules/*.yaml
    from neuron_migrate._data import data_dir

    for p in sorted(data_dir("rules").glob("*.yaml")):
        print(write_compiled(p))
