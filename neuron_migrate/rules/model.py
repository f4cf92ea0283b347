"""The data every stage shares: a rule's definition, a finding, and a fix.

One `Rule` object feeds the rewrite, audit, `explain`, `rules` and every output format; none of them
re-derives rule metadata.
"""
from __future__ import annotations

from collections.abc import Callable
from enum import Enum

from neuron_migrate.files.records import FrozenRecord, Record
from neuron_migrate.files.span import Span  # noqa: F401 - re-exported: part of the rule data model


class FixSafety(str, Enum):
    SAFE = "safe"  # behaviour preserved: applied by default
    UNSAFE = "unsafe"  # usually right, may change behaviour: applied with --unsafe-fixes
    NONE = "none"  # report only


class Severity(str, Enum):
    ERROR = "error"  # will fail on TorchNeuron
    WARNING = "warning"  # will run, but wrongly or slowly, or needs migration
    INFO = "info"  # advice


DOCS_URL = "https://github.com/neuron-migrate/neuron-migrate/blob/main/docs/rules.md#{code}"
_CATEGORIES = {"1": "torch_xla", "2": "cuda", "3": "compatibility", "4": "torch.compile", "5": "launchers",
               "6": "dependencies"}


# Plain classes (files/records.py), not dataclasses: importing dataclasses costs every start-up about 20 ms.
class Example(FrozenRecord):
    """A rule's example: code before and, for a fixable rule, after."""

    _fields = ("before", "after")

    def __init__(self, before: str, after: str | None = None):
        self._set(before=before, after=after)  # after None: report only


class _RuleLinks:
    """What a rule's code says about it: its category and its documentation address (a Rule and a CataloguedRule)."""

    __slots__ = ()

    @property
    def category(self) -> str:
        return _CATEGORIES.get(self.code[2:3], "other")

    @property
    def url(self) -> str:
        return DOCS_URL.format(code=self.code.lower())


# Findings that say how fast the migrated program runs, not whether it runs: the program needs no change for them
# (ops TorchNeuron runs on the host, settings and options that do nothing on Neuron, compile advice). The rewrite's
# summary lists them apart from what needs manual migration.
PERFORMANCE_NOTES = frozenset({"NM213", "NM217", "NM218", "NM310", "NM404", "NM405"})


def is_performance_note(finding) -> bool:
    """A finding left without a fix that only says how fast the program runs: never counted as manual migration (the
    rewrite's summary, the report's totals and file status, its JSON)."""
    return finding.fix is None and finding.rule.code in PERFORMANCE_NOTES


class Rule(Record, _RuleLinks):
    """One rule: what rewrite, audit, explain, the editor server and every report say about it."""

    _fields = ("code", "name", "summary", "fix_safety", "severity", "docs", "examples", "triggers", "check",
               "trigger_words", "origin", "opt_in", "language")

    def __init__(self, code: str, name: str, summary: str, fix_safety: FixSafety, severity: Severity, docs: str,
                 examples: list[Example] | None = None, triggers: list[tuple[str, str]] | None = None,
                 check: Callable | None = None, trigger_words: tuple[str, ...] = (), origin: str = "",
                 opt_in: bool = False, language: str = "python"):
        self.code = code  # NM101
        self.name = name  # kebab-case
        self.summary = summary  # one line
        self.fix_safety = fix_safety
        self.severity = severity
        self.docs = docs  # (a decorated rule's docs are dedented on first read: see `docs_to_dedent`)
        self.examples = [] if examples is None else examples
        # (site kind, key) pairs the rule subscribes to; key is a qualified name, a method name or "*"
        self.triggers = [] if triggers is None else triggers
        self.check = check  # check(site, ctx) -> Finding | list[Finding] | None
        # words whose absence from a file's text proves the rule cannot match (cheap prefilter)
        self.trigger_words = trigger_words
        self.origin = origin  # module or YAML file that defines it
        # opinionated advice: runs only when selected by its exact code or name (never by ALL or a prefix)
        self.opt_in = opt_in
        # what the rule reads: "python" (and notebooks), "shell" (launchers, job files), "deps" (dependency lists)
        self.language = language

    def __reduce__(self):
        # pickled by code: results cross process boundaries without docs or check functions
        return (_rule_by_code, (self.code,))

    @property
    def docs(self) -> str:
        d = self._docs
        if self._dedent:  # only explain, SARIF and the editor read docs: most runs never pay for textwrap
            import textwrap

            d = self._docs = textwrap.dedent(d).strip()
            self._dedent = False
        return d

    @docs.setter
    def docs(self, value: str) -> None:
        self._docs, self._dedent = value, False

    def docs_to_dedent(self, raw: str) -> "Rule":
        """Docs written indented in a module (the `rule` decorator's): dedented and stripped when first read."""
        self._docs, self._dedent = raw, True
        return self


class CataloguedRule(_RuleLinks):
    """A rule as the rule catalogue knows it (pipeline/cache.py keeps one per rule-source fingerprint): the fields a
    report of cached findings reads, without importing the rule modules. Anything else (docs, examples, triggers,
    check) loads the rule itself."""

    FIELDS = ("code", "name", "summary", "fix_safety", "severity", "opt_in", "language", "origin")
    __slots__ = FIELDS

    def __init__(self, entry: dict):
        for k in self.FIELDS:
            setattr(self, k, entry[k])
        self.fix_safety = FixSafety(self.fix_safety)
        self.severity = Severity(self.severity)

    @staticmethod
    def entry(rule: "Rule") -> dict:
        """The catalogue's plain-data form of a rule."""
        return {k: getattr(rule, k).value if k in ("fix_safety", "severity") else getattr(rule, k)
                for k in CataloguedRule.FIELDS}

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        from neuron_migrate.rules.registry import get_rule

        return getattr(get_rule(self.code), attr)

    def __reduce__(self):
        return (_rule_by_code, (self.code,))

    def __repr__(self) -> str:
        return f"CataloguedRule({self.code})"


class Edit(FrozenRecord):
    """One change to the tree, applied by the libcst applier at the node whose range is `span`.

    kind: "replace_expr" (text is an expression), "replace_stmt" (text is one or more statements),
    "delete_stmt", "unwrap_with" (keep the body of a `with`), "insert_before_stmt" (text is statements).
    """

    _fields = ("kind", "span", "text")

    def __init__(self, kind: str, span: Span, text: str = ""):
        self._set(kind=kind, span=span, text=text)


class ImportReq(FrozenRecord):
    """An import a fix needs: `import module` (name None) or `import module as alias`; with `member`, `module` is
    `package.name` and the import is `from package import name [as alias]` (a class or function under a new alias)."""

    _fields = ("module", "alias", "member")

    def __init__(self, module: str, alias: str | None = None, member: bool = False):
        self._set(module=module, alias=alias, member=member)

    def statement(self) -> str:
        if self.member:
            package, _, name = self.module.rpartition(".")
            return f"from {package} import {name}" + (f" as {self.alias}" if self.alias and self.alias != name else "")
        if self.alias and self.alias != self.module:
            if "." in self.module and self.module.rsplit(".", 1)[1] == self.alias:
                return f"from {self.module.rsplit('.', 1)[0]} import {self.alias}"
            return f"import {self.module} as {self.alias}"
        return f"import {self.module}"


class Fix(Record):
    """The edits that fix a finding, with the imports and helpers they need."""

    _fields = ("safety", "edits", "imports", "helpers", "description", "unused_import_only")

    def __init__(self, safety: FixSafety, edits: list[Edit], imports: list[ImportReq] | None = None,
                 helpers: list[tuple[str, str]] | None = None, description: str = "", unused_import_only: bool = False):
        self.safety = safety
        self.edits = edits
        self.imports = [] if imports is None else imports
        self.helpers = [] if helpers is None else helpers  # (name, source) of inserted helpers
        self.description = description
        # the edits only remove imports nothing in the file uses: no other finding can change with them, so a
        # round of only such fixes is not analysed again (rewrite.engine)
        self.unused_import_only = unused_import_only


class Finding(Record):
    """One finding of a rule at a span of a file."""

    _fields = ("rule", "path", "span", "message", "fix", "note", "confidence", "source", "cell")

    def __init__(self, rule: Rule, path: str, span: Span, message: str, fix: Fix | None = None, note: str = "",
                 confidence: str = "", source: str = "", cell: int | None = None):
        self.rule = rule
        self.path = path
        self.span = span
        self.message = message
        self.fix = fix
        self.note = note  # extra guidance shown under the message (launch commands, behaviour changes)
        # how sure the compatibility fact behind the finding is ("high" | "medium" | "low"; "" when not a table
        # fact) and the table source id it comes from; rendered by every output format, filtered by --min-confidence
        self.confidence = confidence
        self.source = source
        self.cell = cell  # notebooks: 1-based cell number; span lines then count within that cell

    @property
    def severity(self) -> Severity:
        return self.rule.severity

    @property
    def fixable(self) -> bool:
        return self.fix is not None

    def sort_key(self) -> tuple:
        return (self.path, self.span.line, self.span.col, self.rule.code)


# -- plain-data forms (cache, process boundaries, JSON output) -------------------------------------
def _rule_by_code(code: str) -> Rule:
    from neuron_migrate.rules.registry import rule_for_findings

    r = rule_for_findings(code)
    if r is None:
        raise KeyError(f"unknown rule {code}")
    return r


def span_to_list(s: Span) -> list:
    return [s.line, s.col, s.end_line, s.end_col]


def fix_to_dict(fix: Fix) -> dict:
    return {
        "safety": fix.safety.value,
        "edits": [{"kind": e.kind, "span": span_to_list(e.span), "text": e.text} for e in fix.edits],
        "imports": [[i.module, i.alias, True] if i.member else [i.module, i.alias] for i in fix.imports],
        "helpers": [list(h) for h in fix.helpers],
        "description": fix.description,
    }


def fix_from_dict(d: dict) -> Fix:
    return Fix(
        safety=FixSafety(d["safety"]),
        edits=[Edit(e["kind"], Span(*e["span"]), e["text"]) for e in d["edits"]],
        imports=[ImportReq(*i) for i in d["imports"]],
        helpers=[tuple(h) for h in d["helpers"]],
        description=d.get("description", ""),
    )


def finding_to_dict(f: Finding) -> dict:
    return {
        "code": f.rule.code,
        "path": f.path,
        "span": span_to_list(f.span),
        "message": f.message,
        "note": f.note,
        "fix": fix_to_dict(f.fix) if f.fix else None,
        **({"confidence": f.confidence, "source": f.source} if f.confidence or f.source else {}),
        "cell": f.cell,
    }


def finding_from_dict(d: dict) -> Finding:
    return Finding(
        rule=_rule_by_code(d["code"]),
        path=d["path"],
        span=Span(*d["span"]),
        message=d["message"],
        fix=fix_from_dict(d["fix"]) if d.get("fix") else None,
        note=d.get("note", ""),
        confidence=d.get("confidence", ""),
        source=d.get("source", ""),
        cell=d.get("cell"),
    )
