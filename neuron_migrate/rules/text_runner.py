"""Rules over files that are not Python: launchers, job files and dependency lists.

A parser (`neuron_migrate/shell/parse.py`, `neuron_migrate/deps/parse.py`) turns a file into a `Doc`: its text
and the sites rules subscribe to (an environment assignment, a command, a requirement), each with character
offsets. Rules are the same `Rule` objects as for Python (registered with a `language`), see the same
suppression comments, and return findings whose fixes are `replace_text` edits of exact character ranges, so
everything outside an edit stays byte-identical. Fixes are applied round by round to a fixed point; a file
whose parse reported problems (a construct the parser did not understand) is never rewritten.
"""
from __future__ import annotations

import bisect
from typing import Callable, Optional

from neuron_migrate.files.records import Record
from neuron_migrate.rules.model import Edit, Finding, Fix, FixSafety, Rule, Span
from neuron_migrate.rules.lines import move_findings

MAX_ROUNDS = 6


class Lines:
    """Character offset <-> (1-based line, 0-based column) for one text."""

    def __init__(self, text: str):
        self.starts = [0]
        i = text.find("\n")
        while i >= 0:
            self.starts.append(i + 1)
            i = text.find("\n", i + 1)

    def pos(self, offset: int) -> tuple[int, int]:
        i = bisect.bisect_right(self.starts, offset) - 1
        return i + 1, offset - self.starts[i]

    def span(self, start: int, end: int) -> Span:
        return Span(*self.pos(start), *self.pos(end))

    def offset(self, line: int, col: int) -> int:
        return self.starts[line - 1] + col


# Plain classes, not dataclasses: importing dataclasses costs every start-up about 20 ms (files/records.py).
class TextSite(Record):
    """Something a rule can look at. `start`/`end` are character offsets of the site itself; `stmt_start`/
    `stmt_end` those of the statement (command line, requirement line) it belongs to."""

    _fields = ("kind", "key", "start", "end", "stmt_start", "stmt_end", "data", "doc")

    def __init__(self, kind: str, key: str, start: int, end: int, stmt_start: int, stmt_end: int,
                 data: Optional[dict] = None, doc: Optional["Doc"] = None):
        self.kind = kind  # "env" (an assignment of an environment variable), "command", "requirement", "env-read"...
        self.key = key  # variable name, command name, normalised package name
        self.start = start
        self.end = end
        self.stmt_start = stmt_start
        self.stmt_end = stmt_end
        self.data = {} if data is None else data
        self.doc = doc


class Doc(Record):
    """A non-Python file (launcher, job file, dependency list) parsed into sites for the text rules."""

    _fields = ("path", "kind", "text", "sites", "problems", "extra")

    def __init__(self, path: str, kind: str, text: str, sites: Optional[list[TextSite]] = None,
                 problems: Optional[list[tuple[int, int, str]]] = None, extra: Optional[dict] = None):
        self.path = path
        self.kind = kind  # shell, dockerfile, env, yaml, requirements, pyproject, setup.py, setup.cfg, conda
        self.text = text
        self.sites = [] if sites is None else sites
        self.problems = [] if problems is None else problems  # (start, end, what) the parser could not read
        self.extra = {} if extra is None else extra  # parser facts rules share (e.g. every env assignment of a file)
        self.lines = Lines(self.text)
        for s in self.sites:
            s.doc = self

    def add(self, site: TextSite) -> TextSite:
        site.doc = self
        self.sites.append(site)
        return site

    def span(self, start: int, end: int) -> Span:
        return self.lines.span(start, end)

    def line_of(self, offset: int) -> int:
        return self.lines.pos(offset)[0]

    def line_range(self, start: int, end: int) -> tuple[int, int]:
        """The whole lines holding [start, end), newline included: for deleting a statement."""
        a = self.text.rfind("\n", 0, start) + 1
        b = self.text.find("\n", end)
        return a, (len(self.text) if b < 0 else b + 1)

    def alone_on_lines(self, start: int, end: int) -> bool:
        """Nothing but blanks (and a trailing comment) share the lines of [start, end)."""
        a, b = self.line_range(start, end)
        before = self.text[a:start]
        after = self.text[end:b].strip()
        return not before.strip() and (not after or after.startswith("#"))


class TextCtx:
    def __init__(self, doc: Doc, settings, ruleset=None):
        self.doc = doc
        self.settings = settings
        self.rule: Optional[Rule] = None
        self.ruleset = ruleset

    def finding(self, at, message: str, fix: Optional[Fix] = None, note: str = "") -> Finding:
        if isinstance(at, TextSite):
            span = self.doc.span(at.start, at.end)
        elif isinstance(at, tuple):
            span = self.doc.span(*at)
        else:
            span = at
        return Finding(rule=self.rule, path=self.doc.path, span=span, message=message, fix=fix, note=note)

    @property
    def rewritten(self) -> bool:
        """Is this file rewritten at all? Not when its parse reported a region it could not read (NM500, NM600):
        then no fix is applied, and a message says what to do, not what was done."""
        return not self.doc.problems

    def did(self, done: str, todo: str) -> str:
        """`done` ("removed") where the fix is applied; else `todo` ("remove it") by hand, and why."""
        return done if self.rewritten else f"{todo} by hand (not done here: this file is not rewritten, its syntax could not be read)"

    def fixer(self, safety: Optional[str] = None) -> "TextFixBuilder":
        default = self.rule.fix_safety if self.rule else FixSafety.SAFE
        return TextFixBuilder(self.doc, FixSafety(safety) if safety else (default if default != FixSafety.NONE else FixSafety.UNSAFE))


class TextFixBuilder:
    def __init__(self, doc: Doc, safety: FixSafety):
        self.doc = doc
        self.safety = safety
        self.edits: list[Edit] = []

    def replace(self, start: int, end: int, text: str) -> "TextFixBuilder":
        self.edits.append(Edit("replace_text", self.doc.span(start, end), text))
        return self

    def delete(self, start: int, end: int) -> "TextFixBuilder":
        return self.replace(start, end, "")

    def delete_lines(self, start: int, end: int) -> "TextFixBuilder":
        return self.delete(*self.doc.line_range(start, end))

    def build(self, safety: Optional[str] = None, description: str = "") -> Fix:
        return Fix(safety=FixSafety(safety) if safety else self.safety, edits=list(self.edits), description=description)


# -- checking and fixing --------------------------------------------------------------------------------
LANGUAGE = {"shell": "shell", "dockerfile": "shell", "env": "shell", "yaml": "shell",
            "requirements": "deps", "pyproject": "deps", "setup.py": "deps", "setup.cfg": "deps", "conda": "deps"}


def could_match(kind: str, text: str, ruleset) -> bool:
    rules = ruleset.by_language.get(LANGUAGE[kind], ())
    return any(w in text for r in rules for w in r.trigger_words)


class TextResult(Record):
    """The findings of one check of a non-Python file."""

    _fields = ("findings", "suppressed")

    def __init__(self, findings: list, suppressed: int = 0):
        self.findings = findings
        self.suppressed = suppressed


def check_doc(doc: Doc, ruleset, settings) -> TextResult:
    from neuron_migrate.rules.runner import Suppressions

    rules = [r for r in ruleset.by_language.get(LANGUAGE[doc.kind], ())]
    ctx = TextCtx(doc, settings, ruleset)
    sup = Suppressions.parse(doc.text)
    out: list[Finding] = []
    suppressed = 0
    by_kind: dict[str, list[Rule]] = {}
    for r in rules:
        for kind, _key in r.triggers:
            by_kind.setdefault(kind, [])
            if r not in by_kind[kind]:
                by_kind[kind].append(r)

    def run(rule: Rule, site) -> None:
        nonlocal suppressed
        ctx.rule = rule
        try:
            res = rule.check(site, ctx)
        except Exception as exc:  # a bug in one rule must not take the run down
            from neuron_migrate.rules.runner import RuleCrash

            raise RuleCrash(f"internal error in rule {rule.code}: {type(exc).__name__}: {exc} "
                            f"(please report; --ignore {rule.code} skips the rule)") from exc
        for f in res if isinstance(res, list) else ([res] if res else []):
            lines = (f.span.line,) + ((doc.line_of(site.stmt_start),) if isinstance(site, TextSite) else ())
            if sup.suppressed(f.rule.code, lines):
                suppressed += 1
            else:
                out.append(f)

    for site in doc.sites:
        for rule in by_kind.get(site.kind, ()):
            if any(k == site.kind and (key == "*" or key == site.key or (key.endswith("*") and site.key.startswith(key[:-1])))
                   for k, key in rule.triggers):
                run(rule, site)
    for rule in by_kind.get("document", ()):
        run(rule, doc)
    if doc.problems:
        # what the parser could not read is reported, and the file is never rewritten
        for f in out:
            f.fix = None
    out.sort(key=Finding.sort_key)
    return TextResult(out, suppressed)


class TextFixError(Exception):
    pass


def apply_edits(text: str, edits: list[Edit]) -> str:
    lines = Lines(text)
    ranges = sorted(((lines.offset(e.span.line, e.span.col), lines.offset(e.span.end_line, e.span.end_col), e.text) for e in edits), reverse=True)
    for a, b, t in ranges:
        text = text[:a] + t + text[b:]
    return text


def fix_doc_text(text: str, path: str, parse: Callable[[str, str], Doc], ruleset, settings):
    """(new text, applied {code: n}, applied findings, remaining findings, suppressed); `parse(text, path)` makes
    the Doc (pipeline.text_files.parser_for(kind))."""
    applied: dict[str, int] = {}
    applied_findings: list[Finding] = []
    rounds: list[tuple[str, list[Finding]]] = []  # (text of a round, the findings applied in it)
    for _ in range(MAX_ROUNDS):
        doc = parse(text, path)
        rounds.append((text, []))
        res = check_doc(doc, ruleset, settings)
        taken: list[tuple[int, int]] = []
        edits: list[Edit] = []
        for f in res.findings:
            if f.fix is None or not f.fix.edits:
                continue
            if f.fix.safety == FixSafety.UNSAFE and not settings.unsafe_fixes:
                continue
            rng = [(doc.lines.offset(e.span.line, e.span.col), doc.lines.offset(e.span.end_line, e.span.end_col)) for e in f.fix.edits]
            if any(a < y and x < b or (a == b == x == y) for a, b in rng for x, y in taken):
                continue  # overlaps an edit of this round: next round
            taken += rng
            edits += f.fix.edits
            applied[f.rule.code] = applied.get(f.rule.code, 0) + 1
            rounds[-1][1].append(f)
        if not edits:
            # the lines reported are those of the rewritten text (deleted `export` lines move the rest up)
            for round_text, found in rounds:
                applied_findings.extend(move_findings(found, round_text, text))
            return text, applied, applied_findings, res.findings, res.suppressed
        new = apply_edits(text, edits)
        if not parse(new, path).problems:
            text = new
        else:
            raise TextFixError("a fix produced text the parser cannot read; file left unchanged (please report)")
    raise TextFixError(f"fixes did not settle after {MAX_ROUNDS} rounds; file left unchanged (please report)")

