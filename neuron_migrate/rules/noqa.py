"""Adding `# noqa: CODES` comments to source text (`audit --add-noqa`, the editor's "disable for this line").

The comment goes on the finding's line, or on the first line of its statement when the finding's line ends
inside a multi-line string; an existing `# noqa: ...` on the line is extended, a bare `# noqa` left alone.
"""
from __future__ import annotations

import ast
import io
import re

from neuron_migrate.files.lines import source_lines
from neuron_migrate.names.analysis import walk

_NOQA = re.compile(r"#\s*noqa(?::[ \t]*(?P<codes>[A-Za-z]+[0-9][A-Za-z0-9]*(?:[ \t]*,?[ \t]*[A-Za-z]+[0-9][A-Za-z0-9]*)*))?", re.IGNORECASE)


def _string_interior_lines(text: str) -> set:
    """Lines whose end lies inside a multi-line token (a comment cannot be added there)."""
    import tokenize  # only fixes that add a noqa comment need it: not imported at start-up

    out = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.start[0] != tok.end[0]:
                out.update(range(tok.start[0], tok.end[0]))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return out


def _statement_starts(text: str) -> dict:
    """line -> first line of the innermost statement covering it."""
    out: dict = {}
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return out
    for node in walk(tree):
        if isinstance(node, ast.stmt):
            end = getattr(node, "end_lineno", node.lineno) or node.lineno
            for ln in range(node.lineno, end + 1):
                if ln not in out or out[ln] < node.lineno:
                    out[ln] = node.lineno
    return out


def add_to_text(text: str, codes_by_line: dict) -> tuple[str, int, int]:
    """Return (new text, comments added or extended, findings that could not get one)."""
    lines = source_lines(text, keepends=True)
    interior = _string_interior_lines(text)
    starts = None
    wanted: dict = {}
    missed = 0
    for line, codes in codes_by_line.items():
        target = line
        if target in interior:
            starts = starts if starts is not None else _statement_starts(text)
            target = starts.get(line, line)
        if target in interior or not (0 < target <= len(lines)):
            missed += len(codes)
            continue
        wanted.setdefault(target, set()).update(codes)
    added = 0
    for line, codes in sorted(wanted.items()):
        raw = lines[line - 1]
        body = raw.rstrip("\r\n")
        eol = raw[len(body):]
        m = _NOQA.search(body)
        if m and m.group("codes") is None:
            continue  # a bare `# noqa` already covers everything
        if m:
            have = re.findall(r"[A-Za-z]+[0-9][A-Za-z0-9]*", m.group("codes"))
            new_codes = have + sorted(c for c in codes if c not in {h.upper() for h in have})
            body = body[: m.start()] + "# noqa: " + ", ".join(new_codes) + body[m.end():]
        else:
            body = body.rstrip() + "  # noqa: " + ", ".join(sorted(codes))
        lines[line - 1] = body + eol
        added += 1
    return "".join(lines), added, missed
