"""Meta rules about neuron-migrate's own comments (NM9xx)."""
from __future__ import annotations

import io
import tokenize

from neuron_migrate.rules.api import rule
from neuron_migrate.rules.model import Span


def _comment_lines(text: str) -> set:
    """Lines holding a real comment token (not a '#' inside a string)."""
    out = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                out.add(tok.start[0])
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return out


@rule(
    code="NM901",
    name="unused-suppression",
    summary="a `# neuron-migrate: ignore[...]` or `# noqa: NM...` comment that suppresses nothing",
    fix="none",
    severity="info",
    triggers=[("module", "*")],
    trigger_words=("neuron-migrate:", "noqa"),
    docs="""
        A suppression comment (`# neuron-migrate: ignore[NM301]`, `# neuron-migrate: ignore`, `# noqa: NM301`)
        that no longer matches a finding on its line or statement hides nothing today but will hide a future,
        different finding there. Once the code it excused is migrated, remove the comment (or the stale codes).
        Only codes of rules that ran are checked (a `--select` run does not flag codes it did not run); a bare
        `ignore` is checked only when every rule ran. File-level `ignore-file` comments are not checked.
        A code that names no rule at all (a typo such as `NM3O1`) is reported too.
        Suppress this finding itself with `NM901` in the same comment.
    """,
    examples=[("x = 1  # noqa: NM999",)],
)
def unused_suppression(site, ctx):
    sup = ctx.suppressions
    if sup is None or not sup.by_line:
        return None
    active = set(ctx.ruleset.codes) if ctx.ruleset is not None else set()
    from neuron_migrate.rules.registry import all_rules

    everything = ctx.ruleset is not None and len(active) == len(all_rules())
    real = _comment_lines(ctx.analysis.text)
    used_lines: dict = {}
    for line, code in sup.used:
        used_lines.setdefault(line, set()).add(code)
    out = []
    for line in sorted(sup.by_line):
        if line not in real:
            continue
        codes = sup.by_line[line]
        hit = used_lines.get(line, set())
        if codes is None:
            if not hit and everything:
                out.append((line, "`# neuron-migrate: ignore` suppresses nothing on this line: remove it"))
            continue
        if any("NM901".startswith(c) for c in codes):
            continue  # the comment suppresses this very check
        known = {r.code for r in all_rules()}
        unknown = sorted(c for c in codes if not any(k.startswith(c) for k in known))
        if unknown:
            out.append((line, f"{', '.join(unknown)} in this suppression {'is not a' if len(unknown) == 1 else 'are not'} "
                              "neuron-migrate rule code(s): fix or remove "
                              f"{'it' if len(unknown) == 1 else 'them'} (see `neuron-migrate rules`)"))
            continue
        stale = sorted(c for c in codes
                       if not any(h.startswith(c) for h in hit) and any(a.startswith(c) for a in active))
        if stale:
            out.append((line, f"suppression of {', '.join(stale)} matches no finding here: remove "
                              f"{'it' if len(stale) == 1 else 'them'} from the comment"))
    findings = []
    lines = ctx.analysis.lines
    for line, msg in out:
        text = lines[line - 1] if line <= len(lines) else ""
        col = text.find("#")
        col = max(col, 0)
        findings.append(ctx.finding(Span(line, col, line, len(text.rstrip())), msg))
    return findings or None
