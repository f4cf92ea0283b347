"""Meta rules about neuron-migrate's own comments (NM9xx)."""
from __future__ import annotations

import ast
import io
import re
from bisect import bisect_right

from neuron_migrate.files.lines import source_lines
from neuron_migrate.rules.api import rule
from neuron_migrate.rules.model import Span


def _comment_lines(text: str) -> set:
    """Lines holding a real comment token (not a '#' inside a string)."""
    import tokenize  # only files with suppression comments get here: not imported at start-up

    out = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                out.add(tok.start[0])
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return out


# string literals with fields: f-strings, and t-strings from Python 3.14 on
_FORMATTED = frozenset(t for t in (ast.JoinedStr, getattr(ast, "TemplateStr", None)) if t is not None)


def _string_across(tree: ast.AST, wanted: set) -> bool:
    """Does a string literal (or strings joined across lines) run over the start of a wanted line? Only nodes whose
    lines hold a wanted line below their first are entered."""
    ordered = sorted(wanted)
    stack = [tree]
    while stack:
        for child in ast.iter_child_nodes(stack.pop()):
            lo = getattr(child, "lineno", None)
            if lo is None:  # arguments, comprehensions, with items, match cases: no position of their own
                stack.append(child)
                continue
            hi = child.end_lineno or lo
            k = bisect_right(ordered, lo)  # the first wanted line below `lo`
            if k == len(ordered) or ordered[k] > hi:
                continue
            if type(child) in _FORMATTED or (type(child) is ast.Constant and isinstance(child.value, (str, bytes))):
                return True
            stack.append(child)
    return False


def comment_lines_among(analysis, wanted) -> set:
    """The lines of `wanted` that hold a real comment token, as `_comment_lines` of the whole text says: each line is
    tokenized alone when no string runs over its start (then it starts outside any string), else the whole text is
    (tokenize is pure Python here, and most files with a suppression have few)."""
    wanted = set(wanted)
    if not wanted or _string_across(analysis.tree, wanted):
        return _comment_lines(analysis.text) & wanted
    lines = analysis.lines
    out = set()
    for line in wanted:
        if 0 < line <= len(lines) and "#" in lines[line - 1] and _comment_lines(lines[line - 1]):
            out.add(line)
    return out


COMMENT_EDIT = "replace_comment"  # a text edit inside one comment: applied by `apply_comment_fixes`, not libcst


@rule(
    code="NM901",
    name="unused-suppression",
    summary="a `# neuron-migrate: ignore[...]` or `# noqa: NM...` comment that suppresses nothing",
    fix="safe",
    severity="info",
    triggers=[("module", "*")],
    trigger_words=("neuron-migrate:", "noqa", "NOQA", "Neuron-Migrate:"),
    docs="""
        A suppression comment (`# neuron-migrate: ignore[NM301]`, `# neuron-migrate: ignore`, `# noqa: NM301`)
        that no longer matches a finding on its line or statement hides nothing today but will hide a future,
        different finding there. The fix removes the comment, or only its stale codes (`rewrite --write`, or the
        editor's quick fix).
        Only codes of rules that ran are checked (a `--select` run does not flag codes it did not run); a bare
        `ignore` is checked only when every rule ran. A bare `# noqa` is never reported: it also silences
        flake8 and Ruff (an unused import kept on purpose), which neuron-migrate cannot see. File-level `ignore-file` comments are not checked.
        A code or rule name that names no rule at all (a typo such as `NM3O1`) is reported too (no fix: the
        intent is unclear). Codes of other tools in a `# noqa: E501, NM101` are left alone.
        Suppress this finding itself with `NM901` in the same comment.
    """,
    examples=[("x = 1  # noqa: NM3O1",)],  # a typo; with every rule active, a stale code is removed by the fix
)
def unused_suppression(site, ctx):
    sup = ctx.suppressions
    if sup is None or not sup.by_line:
        return None
    active = set(ctx.ruleset.codes) if ctx.ruleset is not None else set()
    from neuron_migrate.rules.registry import all_rules

    everything = ctx.ruleset is not None and active >= {r.code for r in all_rules() if not r.opt_in}
    real = comment_lines_among(ctx.analysis, sup.by_line)
    used_lines: dict = {}
    for line, code in sup.used:
        used_lines.setdefault(line, set()).add(code)
    known = {r.code for r in all_rules()}
    lines = ctx.analysis.lines
    findings = []
    for line in sorted(sup.by_line):
        if line not in real or line > len(lines):
            continue
        text = lines[line - 1]
        spans = sup.spans.get(line) or []
        kind = spans[0][2] if spans else "ignore"
        codes = sup.by_line[line]
        hit = used_lines.get(line, set())
        keep = None  # codes that stay in the comment (None: remove the comment)
        if codes is None:
            if hit or not everything or kind == "noqa":
                continue  # a bare `# noqa` belongs to flake8/Ruff too: what it hides for them is not ours to judge
            what = "`# noqa`" if kind == "noqa" else "`# neuron-migrate: ignore`"
            msg = f"{what} suppresses nothing on this line: remove it"
        else:
            if any("NM901".startswith(c) for c in codes):
                continue  # the comment suppresses this very check
            unknown = sorted(c for c in codes if not any(k.startswith(c) for k in known))
            if unknown:
                msg = (f"{', '.join(unknown)} in this suppression {'is not a' if len(unknown) == 1 else 'are not'} "
                       f"neuron-migrate rule code(s) or name(s): fix or remove {'it' if len(unknown) == 1 else 'them'} "
                       "(see `neuron-migrate rules`)")
                findings.append(_finding(ctx, line, text, msg, None))
                continue
            stale = sorted(c for c in codes
                           if not any(h.startswith(c) for h in hit) and any(a.startswith(c) for a in active))
            if not stale:
                continue
            msg = f"suppression of {', '.join(stale)} matches no finding here: remove {'it' if len(stale) == 1 else 'them'} from the comment"
            keep = sorted(set(codes) - set(stale))
        fix = _removal_fix(text, line, spans, keep) if len(spans) == 1 else None
        findings.append(_finding(ctx, line, text, msg, fix))
    return findings or None


def _finding(ctx, line, text, msg, fix):
    col = max(text.find("#"), 0)
    return ctx.finding(Span(line, col, line, len(text.rstrip())), msg, fix=fix)


def _removal_fix(text: str, line: int, spans, keep):
    from neuron_migrate.rules.model import Edit, Fix, FixSafety

    start, end, kind = spans[0]
    if keep:
        body = text[start:end]
        if kind == "noqa":
            other = [c for c in re.findall(r"[A-Za-z]+[0-9][A-Za-z0-9]*", body.split(":", 1)[1]) if not c.upper().startswith("NM")]
            new = "# noqa: " + ", ".join(other + keep)
        else:
            new = body[: body.index("[") + 1] + ", ".join(keep) + "]"
        return Fix(FixSafety.SAFE, [Edit(COMMENT_EDIT, Span(line, start, line, end), new)],
                   description="remove the stale codes from the suppression comment")
    if kind == "noqa" and text[start:end].count(":") and re.search(r"[A-Za-z]+[0-9][A-Za-z0-9]*", text[start:end].split(":", 1)[1]):
        other = [c for c in re.findall(r"[A-Za-z]+[0-9][A-Za-z0-9]*", text[start:end].split(":", 1)[1]) if not c.upper().startswith("NM")]
        if other:  # `# noqa: E501, NM101`: keep the other tool's codes
            return Fix(FixSafety.SAFE, [Edit(COMMENT_EDIT, Span(line, start, line, end), "# noqa: " + ", ".join(other))],
                       description="remove the stale codes from the suppression comment")
    rest = text[end:]
    # `# noqa: NM101 -- reason` or `# neuron-migrate: ignore  # other comment`: remove only the suppression
    if rest.strip() and not rest.lstrip().startswith("#"):
        return None  # free text follows inside the same comment: leave it to the user
    cut_start = start
    while cut_start > 0 and text[cut_start - 1] in " \t":
        cut_start -= 1
    new_rest = rest.lstrip()
    new = ("  " + new_rest) if (new_rest and cut_start > 0 and text[:cut_start].strip()) else new_rest
    return Fix(FixSafety.SAFE, [Edit(COMMENT_EDIT, Span(line, cut_start, line, len(text)), new)],
               description="remove the unused suppression comment")


def apply_comment_fixes(text: str, findings) -> tuple[str, list]:
    """Apply the comment edits (NM901) of `findings` to text; return (new text, findings applied).

    One edit per line at most; a line left blank by the removal (a comment on its own line) goes entirely.
    """
    lines = source_lines(text, keepends=True)
    applied = []
    done: set = set()
    for f in findings:
        if f.fix is None or not f.fix.edits or any(e.kind != COMMENT_EDIT for e in f.fix.edits):
            continue
        e = f.fix.edits[0]
        i = e.span.line - 1
        if i in done or not (0 <= i < len(lines)):
            continue
        raw = lines[i]
        body = raw.rstrip("\r\n")
        eol = raw[len(body):]
        new = body[: e.span.col] + e.text + body[e.span.end_col:]
        lines[i] = "" if not new.strip() and body.strip() else new.rstrip() + eol if not e.text else new + eol
        done.add(i)
        applied.append(f)
    return "".join(lines), applied
