"""Apply fixes to source text with libcst, touching only the nodes the fixes name.

Fixes address nodes by their source range (from the `ast` detection pass). Everything else round-trips
byte for byte: libcst keeps comments, whitespace and newline style. Deleted statements hand their comment
lines to the next statement; a block left empty gets `pass`; an `if FLAG:` left with nothing but that
`pass` (and no else) is removed when its test has no side effects.
"""
from __future__ import annotations

from typing import Optional, Union

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from neuron_migrate.rules.model import Edit, Fix, ImportReq, Span


class ApplyError(Exception):
    pass


def _key(pos) -> tuple:
    return (pos.start.line, pos.start.column, pos.end.line, pos.end.column)


def _skey(span: Span) -> tuple:
    return (span.line, span.col, span.end_line, span.end_col)


def _overlaps(a: tuple, b: tuple) -> bool:
    return (a[0], a[1]) < (b[2], b[3]) and (b[0], b[1]) < (a[2], a[3]) or a == b


def select_compatible(fixes: list[Fix]) -> tuple[list[Fix], list[Fix]]:
    """Fixes whose edits do not overlap an earlier fix's; the rest wait for the next round."""
    taken: list[tuple] = []
    chosen, deferred = [], []
    for fix in fixes:
        spans = [_skey(e.span) for e in fix.edits]
        if any(_overlaps(s, t) for s in spans for t in taken):
            deferred.append(fix)
            continue
        taken.extend(spans)
        chosen.append(fix)
    return chosen, deferred


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


class _Applier(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, edits: list[Edit]):
        super().__init__()
        self.expr: dict[tuple, Edit] = {}
        self.stmt: dict[tuple, Edit] = {}
        for e in edits:
            (self.expr if e.kind == "replace_expr" else self.stmt)[_skey(e.span)] = e
        self.applied: set[tuple] = set()
        self._carry: list[list[cst.EmptyLine]] = []
        self._emptied: set[int] = set()

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
        keep = [ln for ln in node.leading_lines if ln.comment is not None]
        if keep and self._carry:
            self._carry[-1].extend(node.leading_lines)
        return cst.RemovalSentinel.REMOVE

    def _with_carry(self, node):
        carry = self._take_carry()
        if carry and hasattr(node, "leading_lines"):
            return node.with_changes(leading_lines=[*carry, *node.leading_lines])
        return node

    # -- expressions -----------------------------------------------------------------------------
    def on_leave(self, original_node, updated_node):
        if self.expr and isinstance(original_node, cst.BaseExpression):
            k = self._pos_key(original_node)
            edit = self.expr.get(k) if k else None
            if edit is not None:
                new = cst.parse_expression(edit.text)
                if getattr(updated_node, "lpar", None) and hasattr(new, "lpar"):
                    new = new.with_changes(lpar=updated_node.lpar, rpar=updated_node.rpar)
                self.applied.add(k)
                return new
        return super().on_leave(original_node, updated_node)

    # -- blocks ----------------------------------------------------------------------------------
    def visit_Module(self, node):
        self._carry.append([])
        return True

    def leave_Module(self, original_node, updated_node):
        carry = self._carry.pop()
        if carry:
            updated_node = updated_node.with_changes(footer=[*carry, *updated_node.footer])
        return updated_node

    def visit_IndentedBlock(self, node):
        self._carry.append([])
        return True

    def leave_IndentedBlock(self, original_node, updated_node):
        carry = self._carry.pop()
        if not updated_node.body:
            new = updated_node.with_changes(
                body=[cst.SimpleStatementLine([cst.Pass()], leading_lines=carry)]
            )
            self._emptied.add(id(new))
            return new
        if carry:
            updated_node = updated_node.with_changes(footer=[*carry, *updated_node.footer])
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
            self._emptied.add(id(new))
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
        if isinstance(updated_node, cst.If) and id(updated_node.body) in self._emptied and updated_node.orelse is None and _pure(updated_node.test):
            return self._drop(original_node)
        return self._with_carry(updated_node)

    leave_If = leave_With = leave_For = leave_While = leave_Try = _compound
    leave_FunctionDef = leave_ClassDef = leave_Match = _compound

    def leave_TryStar(self, original_node, updated_node):
        return self._compound(original_node, updated_node)


def _top_import_index(body) -> int:
    """Index after the last top-level import line (or after the docstring / __future__ imports)."""
    idx = 0
    for i, stmt in enumerate(body):
        if isinstance(stmt, cst.SimpleStatementLine):
            small = stmt.body[0]
            if isinstance(small, (cst.Import, cst.ImportFrom)):
                idx = i + 1
            elif i == 0 and isinstance(small, cst.Expr) and isinstance(small.value, (cst.SimpleString, cst.ConcatenatedString)):
                idx = max(idx, 1)
    return idx


def _has_import(module: cst.Module, req: ImportReq) -> bool:
    want = req.statement()
    for stmt in module.body:
        if isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], (cst.Import, cst.ImportFrom)):
            if module.code_for_node(stmt.body[0]).strip() == want:
                return True
    return False


def _defined_at_top(module: cst.Module, name: str) -> bool:
    return any(isinstance(s, (cst.FunctionDef, cst.ClassDef)) and s.name.value == name for s in module.body)


def apply_fixes(text: str, fixes: list[Fix]) -> tuple[str, list[Fix]]:
    """Apply `fixes` to `text`. Returns the new text and the fixes actually applied."""
    if not fixes:
        return text, []
    try:
        module = cst.parse_module(text)
    except cst.ParserSyntaxError as exc:
        raise ApplyError(f"libcst cannot parse the file: {exc.message} (line {exc.raw_line})") from None
    edits = [e for f in fixes for e in f.edits]
    applier = _Applier(edits)
    new_module = MetadataWrapper(module, unsafe_skip_copy=True).visit(applier)
    applied = [f for f in fixes if all(_skey(e.span) in applier.applied for e in f.edits)]
    missed = [e for f in fixes for e in f.edits if _skey(e.span) not in applier.applied]
    if missed:
        e = missed[0]
        raise ApplyError(f"line {e.span.line}: could not locate the code to change ({e.kind})")

    imports = list(dict.fromkeys(req for f in applied for req in f.imports))
    helpers = list(dict.fromkeys(h for f in applied for h in f.helpers))
    body = list(new_module.body)
    at = _top_import_index(body)
    new_stmts: list[cst.BaseStatement] = []
    for req in imports:
        if not _has_import(new_module, req):
            new_stmts.append(cst.parse_statement(req.statement() + "\n"))
    for name, source in helpers:
        if _defined_at_top(new_module, name):
            continue
        stmts = list(cst.parse_module(source).body)
        blank = [cst.EmptyLine(), cst.EmptyLine()]
        stmts[0] = stmts[0].with_changes(leading_lines=blank)
        new_stmts.extend(stmts)
    if new_stmts:
        if at < len(body) and helpers:
            # two blank lines between the inserted functions and the code that follows, as PEP 8 has it
            nxt = body[at]
            lines = list(nxt.leading_lines)
            while lines and lines[0].comment is None:
                lines.pop(0)
            body[at] = nxt.with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine(), *lines])
        body[at:at] = new_stmts
        new_module = new_module.with_changes(body=body)
    return new_module.code, applied
