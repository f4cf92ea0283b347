"""How the rewrite keys an edit: by its source range (line, column, end line, end column), which the text splice
and the libcst applier both match nodes by; and the error of an edit that cannot be applied."""
from __future__ import annotations

from neuron_migrate.rules.model import Span


class ApplyError(Exception):
    pass


def span_key(span: Span) -> tuple:
    return (span.line, span.col, span.end_line, span.end_col)
