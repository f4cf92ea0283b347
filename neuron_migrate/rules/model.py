"""The data every stage shares: a rule's definition, a finding, and a fix.

One `Rule` object feeds the rewrite, audit, `explain`, `rules` and every output format; none of them
re-derives rule metadata.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Optional


class FixSafety(str, Enum):
    SAFE = "safe"  # behaviour preserved: applied by default
    UNSAFE = "unsafe"  # usually right, may change behaviour: applied with --unsafe-fixes
    NONE = "none"  # report only


class Severity(str, Enum):
    ERROR = "error"  # will fail on TorchNeuron
    WARNING = "warning"  # will run, but wrongly or slowly, or needs migration
    INFO = "info"  # advice


DOCS_URL = "https://github.com/neuron-migrate/neuron-migrate/blob/main/docs/rules.md#{code}"


@dataclass(frozen=True)
class Example:
    before: str
    after: Optional[str] = None  # None: report only


@dataclass
class Rule:
    code: str  # NM101
    name: str  # kebab-case
    summary: str  # one line
    fix_safety: FixSafety
    severity: Severity
    docs: str
    examples: list[Example] = field(default_factory=list)
    # (site kind, key) pairs the rule subscribes to; key is a qualified name, a method name or "*"
    triggers: list[tuple[str, str]] = field(default_factory=list)
    check: Optional[Callable] = None  # check(site, ctx) -> Finding | list[Finding] | None
    # words whose absence from a file's text proves the rule cannot match (cheap prefilter)
    trigger_words: tuple[str, ...] = ()
    origin: str = ""  # module or YAML file that defines it

    @property
    def category(self) -> str:
        return {"1": "torch_xla", "2": "cuda", "3": "compatibility", "4": "torch.compile"}.get(self.code[2:3], "other")

    @property
    def url(self) -> str:
        return DOCS_URL.format(code=self.code.lower())


@dataclass(frozen=True)
class Span:
    """A source range: 1-based lines, 0-based columns counted in characters (not bytes)."""

    line: int
    col: int
    end_line: int
    end_col: int


@dataclass(frozen=True)
class Edit:
    """One change to the tree, applied by the libcst applier at the node whose range is `span`.

    kind: "replace_expr" (text is an expression), "replace_stmt" (text is one or more statements),
    "delete_stmt", "unwrap_with" (keep the body of a `with`), "insert_before_stmt" (text is statements).
    """

    kind: str
    span: Span
    text: str = ""


@dataclass(frozen=True)
class ImportReq:
    """An import a fix needs: `import module` (name None) or `import module as alias`."""

    module: str
    alias: Optional[str] = None

    def statement(self) -> str:
        if self.alias and self.alias != self.module:
            if "." in self.module and self.module.rsplit(".", 1)[1] == self.alias:
                return f"from {self.module.rsplit('.', 1)[0]} import {self.alias}"
            return f"import {self.module} as {self.alias}"
        return f"import {self.module}"


@dataclass
class Fix:
    safety: FixSafety
    edits: list[Edit]
    imports: list[ImportReq] = field(default_factory=list)
    helpers: list[tuple[str, str]] = field(default_factory=list)  # (name, source) of inserted helpers
    description: str = ""


@dataclass
class Finding:
    rule: Rule
    path: str
    span: Span
    message: str
    fix: Optional[Fix] = None
    note: str = ""  # extra guidance shown under the message (launch commands, behaviour changes)

    @property
    def severity(self) -> Severity:
        return self.rule.severity

    @property
    def fixable(self) -> bool:
        return self.fix is not None

    def sort_key(self) -> tuple:
        return (self.path, self.span.line, self.span.col, self.rule.code)
