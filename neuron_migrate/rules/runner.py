"""Run the active rules over one source text: parse once, offer each site to the rules subscribed to it."""
from __future__ import annotations

import re

from neuron_migrate.files.lines import source_lines
from neuron_migrate.files.records import Record
from neuron_migrate.names.analysis import Analysis, AnalysisError, Site
from neuron_migrate.rules.api import Ctx, Settings
from neuron_migrate.rules.model import Finding, Span
from neuron_migrate.rules.registry import RuleSet

TYPE_CHECKING = False  # typing is not imported at run time (start-up): it serves annotations only
if TYPE_CHECKING:
    from typing import Optional

# any case: `# NOQA: nm101` and `# Neuron-Migrate: IGNORE[...]` count (they used to be silently ignored)
_SUPPRESS = re.compile(
    r"#\s*(?:neuron-migrate:\s*(?P<kind>ignore-file|ignore)\b(?:\[(?P<codes>[^\]]*)\])?"
    r"|(?P<noqa>noqa)\b(?::[ \t]*(?P<noqa_codes>[A-Za-z]+[0-9][A-Za-z0-9]*(?:[ \t]*,?[ \t]*[A-Za-z]+[0-9][A-Za-z0-9]*)*))?)",
    re.IGNORECASE,
)


def normalize_selector(token: str) -> str:
    """A code (any case) or a rule name, as a code prefix; an unknown word stays as written (NM901 reports it)."""
    t = token.strip()
    if re.fullmatch(r"[A-Za-z]+[0-9]*", t) and t.upper().startswith("NM"):
        return t.upper()
    from neuron_migrate.rules.registry import get_rule

    r = get_rule(t)
    return r.code if r is not None else t


# Plain classes, not dataclasses: importing dataclasses costs every start-up about 20 ms (files/records.py).
class Suppressions(Record):
    """A file's noqa comments and ignore settings, and which of them were used."""

    _fields = ("by_line", "file_codes", "file_all", "used", "spans")

    def __init__(self, by_line: Optional[dict[int, Optional[set]]] = None, file_codes: Optional[set] = None,
                 file_all: bool = False, used: Optional[set] = None, spans: Optional[dict[int, list]] = None):
        self.by_line = {} if by_line is None else by_line  # None: every code
        self.file_codes = file_codes  # from ignore-file; empty set means nothing suppressed file-wide
        self.file_all = file_all
        self.used = set() if used is None else used  # (line, code) pairs that suppressed a finding
        # line -> (start column, end column, kind) of the comment text that holds the suppression (NM901's fix)
        self.spans = {} if spans is None else spans

    @classmethod
    def parse(cls, text: str) -> "Suppressions":
        s = cls()
        low = text.lower()  # faster than a case-insensitive pattern search
        if "noqa" not in low and "neuron-migrate:" not in low:
            return s
        for lineno, line in enumerate(source_lines(text), 1):
            if "#" not in line:
                continue
            low_line = line.lower()
            if "noqa" not in low_line and "neuron-migrate:" not in low_line:
                continue  # every directive names one of them (comment-heavy files have many other `#` lines)
            for m in _SUPPRESS.finditer(line):
                if m.group("noqa"):
                    raw = m.group("noqa_codes")
                    if raw is None:
                        codes = None  # bare `# noqa`: everything on the line, as flake8 and Ruff do
                    else:
                        codes = {c.upper() for c in re.findall(r"[A-Za-z]+[0-9][A-Za-z0-9]*", raw) if c.upper().startswith("NM")}
                        if not codes:
                            continue  # `# noqa: E501`: another tool's codes
                    s._add(lineno, codes)
                    s.spans.setdefault(lineno, []).append((m.start(), m.end(), "noqa"))
                    continue
                codes = {normalize_selector(c) for c in (m.group("codes") or "").split(",") if c.strip()} or None
                if m.group("kind").lower() == "ignore-file":
                    if codes is None:
                        s.file_all = True
                    else:
                        s.file_codes = (s.file_codes or set()) | codes
                else:
                    s._add(lineno, codes)
                    s.spans.setdefault(lineno, []).append((m.start(), m.end(), "ignore"))
        return s

    def _add(self, line: int, codes: Optional[set]) -> None:
        if line in self.by_line and (self.by_line[line] is None or codes is None):
            self.by_line[line] = None
        else:
            self.by_line[line] = (self.by_line.get(line) or set()) | (codes or set()) if codes else None

    @staticmethod
    def _covers(codes: Optional[set], code: str) -> bool:
        return codes is None or any(code.startswith(c) for c in codes)

    def suppressed(self, code: str, lines: tuple[int, ...]) -> bool:
        if self.file_all or (self.file_codes and self._covers(self.file_codes, code)):
            return True
        for line in lines:
            if line in self.by_line and self._covers(self.by_line[line], code):
                self.used.add((line, code))
                return True
        return False


def _shadow_hit(rules, site, ctx) -> bool:
    """Would an inactive (ignored) rule have reported this site? Its findings are dropped, never shown."""
    saved = ctx.rule
    try:
        for rule in rules:
            ctx.rule = rule
            try:
                if rule.check(site, ctx):
                    return True
            except Exception:  # noqa: BLE001 - an ignored rule's bug must not surface
                continue
        return False
    finally:
        ctx.rule = saved


class RuleCrash(AnalysisError):
    """A text rule (launchers, job files) raised: the file gets an error naming the rule, the run goes on. A Python
    rule that raises costs only its own findings (see `crash_finding`)."""


def _failing_node(exc: BaseException):
    """The syntax node the rule was working on when it raised: of the innermost frame of the traceback that holds
    one in a local variable, the smallest such node (a lambda's body rather than the lambda)."""
    import ast

    best = None
    tb = exc.__traceback__
    while tb is not None:
        found = None
        for value in tb.tb_frame.f_locals.values():
            if isinstance(value, ast.AST) and getattr(value, "lineno", None) is not None:
                size = ((value.end_lineno or value.lineno) - value.lineno, (value.end_col_offset or 0) - value.col_offset)
                if found is None or size < found[0]:
                    found = (size, value)
        if found is not None:
            best = found[1]
        tb = tb.tb_next
    return best


def crash_finding(rule, path: str, analysis, site, exc: BaseException, report_lines=None) -> Optional[Finding]:
    """The one finding that stands for a rule that raised on this file, at the line of the node it was working on
    (else at its site): its other findings in the file are dropped, every other rule's stay (and are fixed).
    None when that line belongs to another piece of a large file (rules/pieces.py)."""
    node = _failing_node(exc)
    if node is None and site is not None and site.kind != "module":
        node = site.node
    if node is not None:
        span = analysis.span(node)
    else:
        span = Span(1, 0, 1, 0)
    if report_lines is not None and span.line not in report_lines:
        return None
    message = (f"internal error in rule {rule.code} at line {span.line} ({type(exc).__name__}: {exc}): the rule's "
               f"findings and fixes in this file are left out, the other rules' are kept (please report; "
               f"--ignore {rule.code} skips the rule)")
    return Finding(rule=rule, path=path, span=span, message=message)


class CheckResult(Record):
    """The findings of one check of a text, with its analysis."""

    _fields = ("findings", "analysis", "suppressions", "suppressed", "pieces", "crashed")

    def __init__(self, findings: list[Finding], analysis: Optional[Analysis],
                 suppressions: Optional[Suppressions] = None, suppressed: int = 0, pieces: int = 1,
                 crashed: Optional[dict] = None):
        self.findings = findings
        self.analysis = analysis
        self.suppressions = suppressions
        self.suppressed = suppressed
        self.pieces = pieces  # >1: a large file checked piece by piece (rules/pieces.py)
        # rule code -> the internal-error finding of a rule that raised (also in `findings`; None: another piece's)
        self.crashed = {} if crashed is None else crashed


def check_text(text: str, path: str, ruleset: RuleSet, settings: Optional[Settings] = None,
               report_lines: Optional[range] = None) -> CheckResult:
    """Findings for one text. Raises files.names.AnalysisError when the text cannot be parsed.
    `report_lines`: keep (and count as suppressed) only findings on these lines (a piece of a large file, see
    rules/pieces.py)."""
    if not ruleset.could_match(text) and not (settings is not None and settings.forces_check(path)):
        return CheckResult([], None)
    analysis = Analysis(text, path, ruleset.wanted)
    if settings is not None and settings.outside:
        analysis.outside = settings.outside_of(path)
    ctx = Ctx(analysis, settings)
    sup = Suppressions.parse(text)
    ctx.suppressions, ctx.ruleset = sup, ruleset
    findings: list[Finding] = []
    suppressed = 0

    crashed: dict = {}  # rule code -> its internal-error finding: the rule's other findings are dropped

    def run(rule, site) -> bool:
        nonlocal suppressed
        if rule.code in crashed:
            return True  # it raised on this file: its one finding stands for it (no fallback rule speaks)
        ctx.rule = rule
        try:
            out = rule.check(site, ctx)
        except RecursionError:
            raise
        except Exception as exc:  # noqa: BLE001 - a bug in one rule must not cost the rest of the file
            crashed[rule.code] = crash_finding(rule, path, analysis, site, exc, report_lines)
            return True
        if out is None:
            return False
        produced = False
        for f in out if isinstance(out, list) else [out]:
            produced = True
            if report_lines is not None and f.span.line not in report_lines:
                continue  # another piece reports it
            lines = (f.span.line,)
            if site is not None and site.kind != "module":
                lines = (f.span.line, site.stmt.lineno)
            # meta findings (NM9xx, about the suppression comments themselves) are not suppressed by them
            if not f.rule.code.startswith("NM9") and sup.suppressed(f.rule.code, lines):
                suppressed += 1
            else:
                findings.append(f)
        return produced

    for site in analysis.sites:
        hit = False
        for rule in ruleset.exact.get((site.kind, site.key), ()):
            hit = run(rule, site) or hit
        if not hit and ruleset.shadow.get((site.kind, site.key)):
            hit = _shadow_hit(ruleset.shadow[(site.kind, site.key)], site, ctx)
        if not hit:
            # prefix rules are fallbacks: they speak only when no exact rule did
            for prefix, rule in ruleset.prefix.get(site.kind, ()):
                if site.key.startswith(prefix) and run(rule, site):
                    break
    for rule in ruleset.module_rules:
        run(rule, Site("module", "*", analysis.tree, analysis, analysis.module_scope))
    if crashed:
        findings = [f for f in findings if f.rule.code not in crashed]
        findings.extend(f for f in crashed.values() if f is not None)
    findings.sort(key=Finding.sort_key)
    return CheckResult(findings, analysis, sup, suppressed, crashed=crashed)
