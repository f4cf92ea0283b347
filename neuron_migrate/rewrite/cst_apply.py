"""The libcst half of applying fixes: parse a piece of source, let the applier change the nodes the edits name, print
it back. Everything else round-trips byte for byte: libcst keeps comments, whitespace and newline style. Deleted
statements hand their comment lines to the next statement; a block left empty gets `pass`; an `if FLAG:` left
with nothing but that `pass` (and no else) is removed when its test has no side effects.

Imported only when a file has an edit the text splice of rewrite/apply.py cannot make exactly (libcst takes
0.1-0.3 s to import).
"""
from __future__ import annotations

from typing import Optional, Union

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from neuron_migrate.rewrite.spans import ApplyError
from neuron_migrate.rewrite.spans import span_key as _skey
from neuron_migrate.rules.model import Edit


def _key(pos) -> tuple:
    return (pos.start.line, pos.start.column, pos.end.line, pos.end.column)


def _pure(expr: cst.BaseExpression) -> bool:
    """No side effects worth keeping: names, attributes, constants, comparisons, availability checks."""
    if isinstance(expr, (cst.Name, cst.Attribute, cst.SimpleString, cst.Integer)):
        return True
    if isinstance(expr, cst.UnaryOperation):
        return _pure(expr.expression)
    if isinstance(expr, cst.BooleanOperation):
        return _pure(expr.left) and _pure(expr.right)
    if isinstance(expr, cst.Comparison):
        return _pure(expr.left) and all(_pure(c.comparator) for c in expr.comparisons)
    if isinstance(expr, cst.Call) and not expr.args:
        func = cst.Module([]).code_for_node(expr.func)
        return "available" in func or "xla" in func.lower()
    return False


def _quote_of(start: str) -> str:
    q = start.lstrip("rRbBuUfFtT")
    return q


class _Requote(cst.CSTTransformer):
    """Strings inside a replacement placed in an f-string: quotes the f-string does not use (Python < 3.12
    ends the f-string at its own quote, even inside a replacement field)."""

    def __init__(self, outer: list[str]):
        super().__init__()
        self.bad = {_quote_of(q)[0] for q in outer}
        self.failed = False

    def leave_SimpleString(self, original_node, updated_node):
        value = updated_node.value
        prefix = value[: len(value) - len(value.lstrip("rRbBuUfF"))]
        body = value[len(prefix):]
        q = body[:3] if body[:3] in ('"""', "'''") else body[0]
        if q[0] not in self.bad:
            return updated_node
        alt = [c for c in "'\"" if c not in self.bad]
        inner = body[len(q): len(body) - len(q)]
        if not alt or len(q) == 3 or alt[0] in inner or "\\" in inner:
            self.failed = True
            return updated_node
        return updated_node.with_changes(value=f"{prefix}{alt[0]}{inner}{alt[0]}")

    def leave_FormattedString(self, original_node, updated_node):
        if _quote_of(updated_node.start)[0] in self.bad:
            self.failed = True
        return updated_node


def _fit_in_fstring(new: cst.BaseExpression, outer: list[str], edit: Edit) -> cst.BaseExpression:
    """`new` rewritten to be valid inside the replacement field of the f-strings `outer` on every Python from
    3.10: other quotes, no backslash, one line."""
    fixer = _Requote(outer)
    new = new.visit(fixer)
    code = cst.Module([]).code_for_node(new)
    if fixer.failed or "\\" in code or ("\n" in code and not any(_quote_of(q).startswith(("'''", '"""')) for q in outer)):
        raise ApplyError(f"line {edit.span.line}: the fix cannot be written inside this f-string for Python < 3.12")
    return new


def _has_comments(node: cst.CSTNode) -> bool:
    """Does the clause hold a comment (its header, the pass a removal left, lines carried into it)?"""
    return "#" in cst.Module([]).code_for_node(node)


class _Applier(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, edits: list[Edit]):
        super().__init__()
        self.expr: dict[tuple, Edit] = {}
        self.stmt: dict[tuple, Edit] = {}
        for e in edits:
            (self.expr if e.kind == "replace_expr" else self.stmt)[_skey(e.span)] = e
        self.applied: set[tuple] = set()
        self.unfit: set[tuple] = set()  # edits whose text cannot be written where they go
        self._carry: list[list[cst.EmptyLine]] = []
        # per block: the blank lines above a removed statement, which the next statement takes when it has none of its
        # own (a deleted alias between a def and the loop below keeps them apart); dropped at the block's end
        self._blank: list[list[cst.EmptyLine]] = []
        # blocks a fix left empty, by identity; the nodes are kept alive so that no later node can reuse an id
        self._emptied: dict[int, object] = {}
        self._dropped: set[int] = set()  # ids of original statements removed
        self._new: set[int] = set()  # ids of expression nodes a fix wrote
        self._fstrings: list[str] = []  # openings (f", rf''', ...) of the f-strings around the current node

    # -- helpers ---------------------------------------------------------------------------------
    def _pos_key(self, node: cst.CSTNode) -> Optional[tuple]:
        try:
            return _key(self.get_metadata(PositionProvider, node))
        except KeyError:
            return None

    def _stmt_edit(self, node) -> Optional[Edit]:
        if not self.stmt:
            return None
        k = self._pos_key(node)
        return self.stmt.get(k) if k else None

    @staticmethod
    def _parse_statements(text: str) -> list[cst.BaseStatement]:
        return list(cst.parse_module(text if text.endswith("\n") else text + "\n").body)

    def _take_carry(self) -> list[cst.EmptyLine]:
        lines = self._carry[-1] if self._carry else []
        if self._carry:
            self._carry[-1] = []
        return lines

    def _drop(self, node: Union[cst.SimpleStatementLine, cst.BaseCompoundStatement]):
        self._dropped.add(id(node))
        keep = [ln for ln in node.leading_lines if ln.comment is not None]
        if keep and self._carry:
            self._carry[-1].extend(node.leading_lines)
        elif node.leading_lines and self._blank:
            self._blank[-1] = list(node.leading_lines)
        return cst.RemovalSentinel.REMOVE

    def _with_carry(self, node):
        carry = self._take_carry()
        blank = self._blank[-1] if self._blank else []
        if blank:
            self._blank[-1] = []
            if not carry and hasattr(node, "leading_lines") and not node.leading_lines:
                carry = blank
        if carry and hasattr(node, "leading_lines"):
            return node.with_changes(leading_lines=[*carry, *node.leading_lines])
        return node

    # -- expressions -----------------------------------------------------------------------------
    def visit_FormattedString(self, node):
        self._fstrings.append(node.start)
        return True

    def on_leave(self, original_node, updated_node):
        if isinstance(original_node, cst.FormattedString):
            self._fstrings.pop()
        if self.expr and isinstance(original_node, cst.BaseExpression):
            k = self._pos_key(original_node)
            edit = self.expr.get(k) if k else None
            if edit is not None:
                new = cst.parse_expression(edit.text)
                if self._fstrings:
                    try:
                        new = _fit_in_fstring(new, self._fstrings, edit)
                    except ApplyError:
                        self.unfit.add(k)  # the fix's text cannot go here: the fix is left out
                        return super().on_leave(original_node, updated_node)
                if getattr(updated_node, "lpar", None) and hasattr(new, "lpar"):
                    new = new.with_changes(lpar=updated_node.lpar, rpar=updated_node.rpar)
                self.applied.add(k)
                self._new.add(id(new))
                return new
        if isinstance(updated_node, cst.UnaryOperation):
            return self._negate(updated_node)
        return super().on_leave(original_node, updated_node)

    _NEGATED = {cst.Equal: cst.NotEqual, cst.NotEqual: cst.Equal, cst.In: cst.NotIn, cst.NotIn: cst.In,
                cst.Is: cst.IsNot, cst.IsNot: cst.Is}

    def _negate(self, node: cst.UnaryOperation):
        """`not <a == b>` where a fix wrote the comparison: `a != b` (no double negative in the output)."""
        inner = node.expression
        if not isinstance(node.operator, cst.Not) or id(inner) not in self._new or not isinstance(inner, cst.Comparison):
            return node
        if len(inner.comparisons) != 1:
            return node
        target = inner.comparisons[0]
        flip = self._NEGATED.get(type(target.operator))
        if flip is None:
            return node
        op = target.operator
        kwargs = {"whitespace_before": op.whitespace_before, "whitespace_after": op.whitespace_after}
        if flip in (cst.NotIn, cst.IsNot):
            kwargs["whitespace_between"] = cst.SimpleWhitespace(" ")
        new = inner.with_changes(comparisons=[target.with_changes(operator=flip(**kwargs))], lpar=node.lpar, rpar=node.rpar)
        self._new.add(id(new))
        return new

    # -- blocks ----------------------------------------------------------------------------------
    def visit_Module(self, node):
        self._carry.append([])
        self._blank.append([])
        return True

    def leave_Module(self, original_node, updated_node):
        self._blank.pop()
        carry = self._carry.pop()
        if carry:
            updated_node = updated_node.with_changes(footer=[*carry, *updated_node.footer])
        return updated_node

    def visit_IndentedBlock(self, node):
        self._carry.append([])
        self._blank.append([])
        return True

    def leave_IndentedBlock(self, original_node, updated_node):
        self._blank.pop()
        carry = self._carry.pop()
        if not updated_node.body:
            new = updated_node.with_changes(
                body=[cst.SimpleStatementLine([cst.Pass()], leading_lines=carry)]
            )
            self._emptied[id(new)] = new
            return new
        if carry:
            updated_node = updated_node.with_changes(footer=[*carry, *updated_node.footer])
        if original_node.body and id(original_node.body[0]) in self._dropped:
            # the block's first statement went: its successor does not start the block with a blank line
            first = updated_node.body[0]
            lines = list(first.leading_lines)
            while lines and lines[0].comment is None:
                lines.pop(0)
            if len(lines) != len(first.leading_lines):
                updated_node = updated_node.with_changes(body=[first.with_changes(leading_lines=lines), *updated_node.body[1:]])
        return updated_node

    def _edit_small(self, original_node, updated_node):
        """Apply statement edits to the small statements of a line or one-line suite.

        Returns (kept small statements, statements to insert before, replacement statements or None).
        """
        new_body = []
        replaced: Optional[list] = None
        before: list[cst.BaseStatement] = []
        for orig, upd in zip(original_node.body, updated_node.body):
            edit = self._stmt_edit(orig)
            if edit is None:
                new_body.append(upd)
                continue
            self.applied.add(_skey(edit.span))
            if edit.kind == "delete_stmt":
                continue
            stmts = self._parse_statements(edit.text)
            if edit.kind == "insert_before_stmt":
                before.extend(stmts)
                new_body.append(upd)
                continue
            if len(original_node.body) == 1:
                replaced = stmts
                continue
            if len(stmts) == 1 and isinstance(stmts[0], cst.SimpleStatementLine) and len(stmts[0].body) == 1:
                new_body.append(stmts[0].body[0])
                continue
            raise ApplyError(f"line {edit.span.line}: cannot replace one of several statements on a line")
        if new_body and len(new_body) != len(updated_node.body):
            last = new_body[-1]
            if isinstance(last.semicolon, cst.Semicolon):
                new_body[-1] = last.with_changes(semicolon=cst.MaybeSentinel.DEFAULT)
        return new_body, before, replaced

    def leave_SimpleStatementSuite(self, original_node, updated_node):
        """`if c: a(); b()` style bodies: edits may turn them into an indented block."""
        new_body, before, replaced = self._edit_small(original_node, updated_node)
        if (not before and replaced and len(replaced) == 1 and isinstance(replaced[0], cst.SimpleStatementLine)
                and not replaced[0].leading_lines):
            return updated_node.with_changes(body=[*replaced[0].body, *new_body])
        if replaced is not None or before:
            stmts = [*before, *(replaced or [])]
            if new_body:
                stmts.append(cst.SimpleStatementLine(new_body))
            return cst.IndentedBlock(body=stmts, header=updated_node.trailing_whitespace)
        if not new_body:
            new = updated_node.with_changes(body=[cst.Pass()])
            self._emptied[id(new)] = new
            return new
        return updated_node.with_changes(body=new_body)

    # -- statements ------------------------------------------------------------------------------
    def leave_SimpleStatementLine(self, original_node, updated_node):
        new_body, before, replaced = self._edit_small(original_node, updated_node)
        if replaced:
            first = replaced[0]
            replaced[0] = first.with_changes(leading_lines=[*original_node.leading_lines, *first.leading_lines])
            out = [*before, *replaced]
            out[0] = self._with_carry(out[0])
            return cst.FlattenSentinel(out)
        if not new_body:
            if before:
                before[0] = self._with_carry(before[0].with_changes(leading_lines=original_node.leading_lines))
                return cst.FlattenSentinel(before)
            return self._drop(original_node)
        updated_node = updated_node.with_changes(body=new_body)
        if before:
            before[0] = before[0].with_changes(leading_lines=original_node.leading_lines)
            return cst.FlattenSentinel([*before, updated_node.with_changes(leading_lines=[])])
        return self._with_carry(updated_node)

    def _compound(self, original_node, updated_node):
        edit = self._stmt_edit(original_node)
        if edit is not None:
            self.applied.add(_skey(edit.span))
            if edit.kind == "delete_stmt":
                return self._drop(original_node)
            if edit.kind == "unwrap_with":
                body = updated_node.body
                if isinstance(body, cst.SimpleStatementSuite):
                    stmts = [cst.SimpleStatementLine([s]) for s in body.body]
                else:
                    stmts = list(body.body)
                stmts[0] = stmts[0].with_changes(leading_lines=[*updated_node.leading_lines, *stmts[0].leading_lines])
                stmts[0] = self._with_carry(stmts[0])
                return cst.FlattenSentinel(stmts)
            stmts = self._parse_statements(edit.text)
            if edit.kind == "insert_before_stmt":
                stmts[0] = stmts[0].with_changes(leading_lines=updated_node.leading_lines)
                return cst.FlattenSentinel([*stmts, updated_node.with_changes(leading_lines=[])])
            stmts[0] = stmts[0].with_changes(leading_lines=updated_node.leading_lines)
            return cst.FlattenSentinel(stmts)
        orelse = getattr(updated_node, "orelse", None)
        if isinstance(orelse, cst.Else) and self._was_emptied(orelse.body) and not _has_comments(orelse):
            # an `else:` whose body a fix removed is noise: drop it rather than leave `else: pass`
            updated_node = updated_node.with_changes(orelse=None)
        elif isinstance(orelse, cst.If) and self._was_emptied(orelse.body) and orelse.orelse is None \
                and _pure(orelse.test) and not _has_comments(orelse):
            updated_node = updated_node.with_changes(orelse=None)  # an `elif FLAG:` left empty
        if isinstance(updated_node, cst.If) and self._was_emptied(updated_node.body) and updated_node.orelse is None and _pure(updated_node.test):
            return self._drop(original_node)
        return self._with_carry(updated_node)

    def _was_emptied(self, block) -> bool:
        return self._emptied.get(id(block)) is block

    leave_If = leave_With = leave_For = leave_While = leave_Try = _compound
    leave_FunctionDef = leave_ClassDef = leave_Match = _compound

    def leave_TryStar(self, original_node, updated_node):
        return self._compound(original_node, updated_node)


def apply_edits(text: str, edits: list[Edit]) -> tuple[str, set]:
    """Run the applier on `text`; returns the new code and the (unshifted) keys of the edits applied."""
    try:
        module = cst.parse_module(text)
    except cst.ParserSyntaxError as exc:
        raise ApplyError(f"libcst cannot parse the file: {exc.message} (line {exc.raw_line})") from None
    applier = _Applier(edits)
    new_module = MetadataWrapper(module, unsafe_skip_copy=True).visit(applier)
    if not new_module.body and not new_module.header and not new_module.footer:
        return "", applier.applied | {("unfit", *k) for k in applier.unfit}  # libcst writes "\n" for an empty module
    return new_module.code, applier.applied | {("unfit", *k) for k in applier.unfit}
