"""A source text's lines as Python counts them, so that line numbers from `ast`, libcst and the tokenizer index
the same lines that reports, suppressions and fixes read."""
from __future__ import annotations

import re

# str.splitlines also ends a line at these, which Python keeps inside a line (a form feed between functions, a
# \u2028 in a string): past the first of them, every line number would point one line too far
_INLINE_BREAKS = "\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def source_lines(text: str, keepends: bool = False) -> list[str]:
    """`text` split where Python's tokenizer ends a line: at \\r\\n, \\r and \\n only."""
    if not any(c in text for c in _INLINE_BREAKS):  # one memchr-like scan each: 15x faster than a class regex
        return text.splitlines(keepends)  # the same lines, in C
    lines = _LINE.findall(text)
    if keepends:
        return lines
    return [ln[:-2] if ln.endswith("\r\n") else ln[:-1] if ln.endswith(("\n", "\r")) else ln for ln in lines]


def statements_naming(tree, lines: list, names) -> list:
    """The top-level statements of `tree` on whose lines (`lines`: its text's, source_lines) one of `names` is
    written: the only ones a Name node of those names can be in (a Name's identifier is written on its statement's
    lines, a decorator's on the lines above its def). The rest need no walk. (A substring test: a superset of the
    statements that hold such a Name, never fewer; a line with non-ASCII characters counts, as an identifier may be
    written in characters that normalise to the name.)"""
    hit = [i + 1 for i, line in enumerate(lines) if any(name in line for name in names) or not line.isascii()]
    if not hit:
        return []
    from bisect import bisect_left

    out = []
    for stmt in tree.body:
        first = min([stmt.lineno, *(d.lineno for d in getattr(stmt, "decorator_list", ()))])
        k = bisect_left(hit, first)
        if k < len(hit) and hit[k] <= stmt.end_lineno:
            out.append(stmt)
    return out
