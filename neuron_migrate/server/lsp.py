"""The Language Server Protocol side: pygls features mapped onto `core.Checker`.

- diagnostics on open/change/save, for Python files and for notebooks (cells joined as the CLI joins them); a
  burst of changes is checked once, at its last text (`lint_soon`);
- code actions: one quick fix per finding with a fix (unsafe ones say so and are never preferred),
  "disable for this line" (`# noqa: CODE`), and `source.fixAll` (every safe fix, the way `rewrite` does);
- hover: the rule's documentation;
- configuration reload: a changed pyproject.toml (watched files, save, or the `neuron-migrate.reload` command)
  re-reads configuration and re-checks every open document.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Optional

from lsprotocol import types as t
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path

from neuron_migrate import __version__
from neuron_migrate.files.lines import source_lines
from neuron_migrate.server.core import Checker, join_cells, rule_hover, split_cells

SOURCE = "neuron-migrate"
FIX_ALL_KIND = f"{t.CodeActionKind.SourceFixAll.value}.neuron-migrate"
RELOAD_COMMAND = "neuron-migrate.reload"
SEVERITY = {"error": t.DiagnosticSeverity.Error, "warning": t.DiagnosticSeverity.Warning,
            "info": t.DiagnosticSeverity.Information}
log = logging.getLogger("neuron_migrate.server")
# After a change, the check waits as long as the document's last check took (at most this long, in seconds) for
# more changes: typing in a large file then costs one check per pause instead of one per keystroke.
LINT_WAIT_MAX = 0.25


def _utf16_col(line: str, col: int) -> int:
    prefix = line[:col]
    return len(prefix.encode("utf-16-le")) // 2 if not prefix.isascii() else len(prefix)


def _char_col(line: str, utf16: int) -> int:
    if line.isascii():
        return utf16
    n = 0
    for i, ch in enumerate(line):
        if n >= utf16:
            return i
        n += 2 if ord(ch) > 0xFFFF else 1
    return len(line)


def _path_of(uri: str) -> str:
    p = to_fs_path(uri) if uri.startswith("file:") else None
    return p or str(Path.cwd() / "untitled.py")


def text_edit_between(old: str, new: str) -> t.TextEdit:
    """One TextEdit turning old into new: the changed block of whole lines."""
    a = source_lines(old, keepends=True)
    b = source_lines(new, keepends=True)
    pre = 0
    while pre < len(a) and pre < len(b) and a[pre] == b[pre]:
        pre += 1
    suf = 0
    while suf < len(a) - pre and suf < len(b) - pre and a[-1 - suf] == b[-1 - suf]:
        suf += 1
    start = t.Position(line=pre, character=0)
    end_index = len(a) - suf
    if end_index == len(a) and a and not a[-1].endswith(("\n", "\r")):
        end = t.Position(line=len(a) - 1, character=_utf16_col(a[-1], len(a[-1])))
    else:
        end = t.Position(line=end_index, character=0)
    return t.TextEdit(range=t.Range(start=start, end=end), new_text="".join(b[pre:len(b) - suf]))


class NeuronMigrateServer(LanguageServer):
    def __init__(self) -> None:
        super().__init__(
            "neuron-migrate", __version__,
            text_document_sync_kind=t.TextDocumentSyncKind.Incremental,
            notebook_document_sync=t.NotebookDocumentSyncOptions(
                notebook_selector=[t.NotebookDocumentFilterWithCells(cells=[t.NotebookCellLanguage(language="python")],
                                                                     notebook="*")]),
        )
        self.checker = Checker()
        self._pending: dict = {}  # uri -> the asyncio timer of its scheduled check
        self._check_seconds: dict = {}  # uri -> how long its last check took

    # -- documents -------------------------------------------------------------------------------------
    def document_text(self, uri: str) -> tuple[str, Optional[list]]:
        """(text, cells) for a Python document or a notebook cell's notebook (cells: [(uri, first line, n)])."""
        nb = self.workspace.get_notebook_document(cell_uri=uri)
        if nb is not None:
            return self._notebook_text(nb)
        return self.workspace.get_text_document(uri).source, None

    def _notebook_text(self, nb) -> tuple[str, list]:
        cells = []
        for cell in nb.cells:
            if cell.kind != t.NotebookCellKind.Code:
                continue
            doc = self.workspace.get_text_document(cell.document)
            if doc.language_id not in (None, "", "python"):
                continue
            cells.append((cell.document, doc.source))
        return join_cells(cells)

    def notebook_path(self, nb_uri: str) -> str:
        p = _path_of(nb_uri)
        return p if p.endswith(".ipynb") else p + ".ipynb"

    def lint_soon(self, uri: str) -> None:
        """Check `uri` once the changes that are arriving have arrived. Each change cancels the check the one before
        scheduled and schedules its own after a wait as long as the document's last check took (at most
        LINT_WAIT_MAX): the changes that arrive while a check runs, or soon after, are read before the next check
        starts, so a burst of keystrokes costs one check of its last text, and a small file's check comes at once."""
        self.cancel_lint(uri)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # called outside the server's event loop: check now
            self.lint(uri)
            return
        wait = min(self._check_seconds.get(uri, 0.0), LINT_WAIT_MAX)
        self._pending[uri] = loop.call_later(wait, self._lint_scheduled, uri)

    def cancel_lint(self, uri: str) -> None:
        pending = self._pending.pop(uri, None)
        if pending is not None:
            pending.cancel()

    def document_closed(self, uri: str) -> None:
        self.cancel_lint(uri)
        self._check_seconds.pop(uri, None)

    def _lint_scheduled(self, uri: str) -> None:
        self._pending.pop(uri, None)
        self.lint(uri)

    def lint(self, uri: str) -> None:
        self.cancel_lint(uri)  # this check reads the latest text: one scheduled before it has nothing left to do
        started = time.perf_counter()
        self._publish_findings(uri)
        self._check_seconds[uri] = time.perf_counter() - started  # how long lint_soon waits for this document

    def _publish_findings(self, uri: str) -> None:
        nb = self.workspace.get_notebook_document(cell_uri=uri) or self.workspace.get_notebook_document(notebook_uri=uri)
        if nb is not None:
            self.lint_notebook(nb)
            return
        doc = self.workspace.get_text_document(uri)
        if doc.uri.endswith("pyproject.toml"):
            return
        findings, error = self.checker.check(doc.source, _path_of(uri))
        lines = source_lines(doc.source)
        diags = [self.diagnostic(f, lines) for f in findings]
        if error:
            diags.append(self.error_diagnostic(error))
        self.text_document_publish_diagnostics(t.PublishDiagnosticsParams(uri=uri, diagnostics=diags, version=doc.version))

    def lint_notebook(self, nb) -> None:
        text, cells = self._notebook_text(nb)
        findings, error = self.checker.check(text, self.notebook_path(nb.uri))
        lines = source_lines(text)
        per_cell: dict = {uri: [] for uri, _, _ in cells}
        for f in findings:
            for uri, first, n in cells:
                if first <= f.span.line < first + max(n, 1):
                    per_cell[uri].append(self.diagnostic(f, lines, line_offset=first - 1))
                    break
        if error and cells:
            per_cell[cells[0][0]].append(self.error_diagnostic(error))
        for uri, diags in per_cell.items():
            self.text_document_publish_diagnostics(t.PublishDiagnosticsParams(uri=uri, diagnostics=diags))

    def diagnostic(self, f, lines: list, line_offset: int = 0) -> t.Diagnostic:
        def pos(line: int, col: int) -> t.Position:
            text = lines[line - 1] if 0 < line <= len(lines) else ""
            return t.Position(line=max(line - 1 - line_offset, 0), character=_utf16_col(text, col))

        fix = f.fix.safety.value if f.fix is not None else None
        message = f.message + (f"\n{f.note}" if f.note else "")
        return t.Diagnostic(
            range=t.Range(start=pos(f.span.line, f.span.col), end=pos(max(f.span.end_line, f.span.line), f.span.end_col)),
            severity=SEVERITY[f.severity.value], code=f.rule.code, source=SOURCE, message=message,
            code_description=t.CodeDescription(href=f.rule.url),
            data={"code": f.rule.code, "line": f.span.line, "col": f.span.col, "fix": fix},
        )

    @staticmethod
    def error_diagnostic(msg: str) -> t.Diagnostic:
        return t.Diagnostic(range=t.Range(start=t.Position(line=0, character=0), end=t.Position(line=0, character=1)),
                            severity=t.DiagnosticSeverity.Error, source=SOURCE, message=f"not checked: {msg}")

    def relint_all(self) -> None:
        self.checker.reload()
        done = set()
        for nb_uri, nb in list(self.workspace.notebook_documents.items()):
            self.lint_notebook(nb)
            done.update(c.document for c in nb.cells)
        for uri in list(self.workspace.text_documents):
            if uri not in done:
                self.lint(uri)

    # -- code actions ----------------------------------------------------------------------------------
    def edit_for(self, uri: str, old_text: str, new_text: str, cells: Optional[list]) -> Optional[t.WorkspaceEdit]:
        if cells is None:
            return t.WorkspaceEdit(changes={uri: [text_edit_between(old_text, new_text)]})
        old_cells = split_cells(old_text, len(cells))
        new_cells = split_cells(new_text, len(cells))
        if old_cells is None or new_cells is None:
            return None
        changes = {}
        for (cell_uri, _, _), a, b in zip(cells, old_cells, new_cells):
            if a != b:
                changes[cell_uri] = [text_edit_between(a, b)]
        return t.WorkspaceEdit(changes=changes) if changes else None

    def code_actions(self, params: t.CodeActionParams) -> list:
        uri = params.text_document.uri
        try:
            text, cells = self.document_text(uri)
        except Exception:  # noqa: BLE001 - unknown document
            return []
        path = self.notebook_path(self.workspace.get_notebook_document(cell_uri=uri).uri) if cells is not None else _path_of(uri)
        offset = 0
        if cells is not None:
            offset = next((first - 1 for u, first, _ in cells if u == uri), 0)
        findings, _error = self.checker.check(text, path)
        wanted_kinds = params.context.only
        actions = []
        want_quick = not wanted_kinds or any(k.value.startswith("quickfix") for k in wanted_kinds)
        want_all = not wanted_kinds or any(FIX_ALL_KIND.startswith(k.value) or k.value.startswith(FIX_ALL_KIND) for k in wanted_kinds)
        if want_quick:
            by_key = {(f.rule.code, f.span.line, f.span.col): f for f in findings}
            for d in params.context.diagnostics:
                if d.source != SOURCE or not isinstance(d.data, dict):
                    continue
                f = by_key.get((d.data.get("code"), d.data.get("line"), d.data.get("col")))
                if f is None:
                    continue
                if f.fix is not None:
                    new = self.checker.fix_one(text, path, f)
                    edit = self.edit_for(uri, text, new, cells) if new is not None else None
                    if edit is not None:
                        unsafe = f.fix.safety.value != "safe"
                        title = f"Fix {f.rule.code}: {f.fix.description or f.rule.summary}" + (" (unsafe: may change behaviour)" if unsafe else "")
                        actions.append(t.CodeAction(title=title, kind=t.CodeActionKind.QuickFix, diagnostics=[d],
                                                    edit=edit, is_preferred=not unsafe))
                if not f.rule.code.startswith("NM9"):
                    new = self.checker.noqa(text, f.span.line, f.rule.code)
                    edit = self.edit_for(uri, text, new, cells) if new is not None else None
                    if edit is not None:
                        actions.append(t.CodeAction(title=f"Disable {f.rule.code} for this line", kind=t.CodeActionKind.QuickFix,
                                                    diagnostics=[d], edit=edit))
        if want_all and any(f.fix is not None for f in findings):
            new = self.checker.fix_all(text, path)
            edit = self.edit_for(uri, text, new, cells) if new is not None else None
            if edit is not None:
                actions.append(t.CodeAction(title="neuron-migrate: fix all (safe fixes)", kind=FIX_ALL_KIND, edit=edit))
        del offset
        return actions

    def hover(self, params: t.HoverParams) -> Optional[t.Hover]:
        uri = params.text_document.uri
        try:
            text, cells = self.document_text(uri)
        except Exception:  # noqa: BLE001
            return None
        path = self.notebook_path(self.workspace.get_notebook_document(cell_uri=uri).uri) if cells is not None else _path_of(uri)
        offset = next((first - 1 for u, first, _ in cells if u == uri), 0) if cells is not None else 0
        line = params.position.line + 1 + offset
        lines = source_lines(text)
        col = _char_col(lines[line - 1], params.position.character) if 0 < line <= len(lines) else 0
        findings, _ = self.checker.check(text, path)
        hits = [f for f in findings
                if (f.span.line, f.span.col) <= (line, col) <= (max(f.span.end_line, f.span.line), f.span.end_col)]
        docs = [rule_hover(c) for c in dict.fromkeys(f.rule.code for f in hits)]
        docs = [d for d in docs if d]
        if not docs:
            return None
        return t.Hover(contents=t.MarkupContent(kind=t.MarkupKind.Markdown, value="\n\n---\n\n".join(docs)))


def build_server() -> NeuronMigrateServer:
    server = NeuronMigrateServer()

    @server.feature(t.INITIALIZED)
    def initialized(ls: NeuronMigrateServer, params: t.InitializedParams) -> None:
        caps = ls.client_capabilities
        ws = caps.workspace if caps else None
        dyn = ws.did_change_watched_files.dynamic_registration if ws and ws.did_change_watched_files else False
        if dyn:
            ls.client_register_capability(t.RegistrationParams(registrations=[t.Registration(
                id="neuron-migrate-config", method=t.WORKSPACE_DID_CHANGE_WATCHED_FILES,
                register_options=t.DidChangeWatchedFilesRegistrationOptions(
                    watchers=[t.FileSystemWatcher(glob_pattern="**/pyproject.toml")]))]))

    @server.feature(t.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: NeuronMigrateServer, params: t.DidOpenTextDocumentParams) -> None:
        ls.lint(params.text_document.uri)

    @server.feature(t.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: NeuronMigrateServer, params: t.DidChangeTextDocumentParams) -> None:
        ls.lint_soon(params.text_document.uri)

    @server.feature(t.TEXT_DOCUMENT_DID_SAVE)
    def did_save(ls: NeuronMigrateServer, params: t.DidSaveTextDocumentParams) -> None:
        if params.text_document.uri.endswith("pyproject.toml"):
            ls.relint_all()
        else:
            ls.lint(params.text_document.uri)

    @server.feature(t.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: NeuronMigrateServer, params: t.DidCloseTextDocumentParams) -> None:
        ls.document_closed(params.text_document.uri)
        ls.text_document_publish_diagnostics(t.PublishDiagnosticsParams(uri=params.text_document.uri, diagnostics=[]))

    @server.feature(t.NOTEBOOK_DOCUMENT_DID_OPEN)
    def nb_open(ls: NeuronMigrateServer, params: t.DidOpenNotebookDocumentParams) -> None:
        nb = ls.workspace.get_notebook_document(notebook_uri=params.notebook_document.uri)
        if nb is not None:
            ls.lint_notebook(nb)

    @server.feature(t.NOTEBOOK_DOCUMENT_DID_CHANGE)
    def nb_change(ls: NeuronMigrateServer, params: t.DidChangeNotebookDocumentParams) -> None:
        if ls.workspace.get_notebook_document(notebook_uri=params.notebook_document.uri) is not None:
            ls.lint_soon(params.notebook_document.uri)  # a burst of cell edits: one check (see lint_soon)

    @server.feature(t.NOTEBOOK_DOCUMENT_DID_SAVE)
    def nb_save(ls: NeuronMigrateServer, params: t.DidSaveNotebookDocumentParams) -> None:
        nb = ls.workspace.get_notebook_document(notebook_uri=params.notebook_document.uri)
        if nb is not None:
            ls.lint_notebook(nb)

    @server.feature(t.NOTEBOOK_DOCUMENT_DID_CLOSE)
    def nb_close(ls: NeuronMigrateServer, params: t.DidCloseNotebookDocumentParams) -> None:
        ls.document_closed(params.notebook_document.uri)
        for cell in params.cell_text_documents:
            ls.text_document_publish_diagnostics(t.PublishDiagnosticsParams(uri=cell.uri, diagnostics=[]))

    @server.feature(t.TEXT_DOCUMENT_CODE_ACTION, t.CodeActionOptions(
        code_action_kinds=[t.CodeActionKind.QuickFix, FIX_ALL_KIND], resolve_provider=False))
    def code_action(ls: NeuronMigrateServer, params: t.CodeActionParams):
        return ls.code_actions(params)

    @server.feature(t.TEXT_DOCUMENT_HOVER)
    def hover(ls: NeuronMigrateServer, params: t.HoverParams):
        return ls.hover(params)

    @server.feature(t.WORKSPACE_DID_CHANGE_WATCHED_FILES)
    def watched(ls: NeuronMigrateServer, params: t.DidChangeWatchedFilesParams) -> None:
        if any(c.uri.endswith("pyproject.toml") for c in params.changes):
            ls.relint_all()

    @server.feature(t.WORKSPACE_DID_CHANGE_CONFIGURATION)
    def config_changed(ls: NeuronMigrateServer, params: t.DidChangeConfigurationParams) -> None:
        ls.relint_all()

    @server.command(RELOAD_COMMAND)
    def reload(ls: NeuronMigrateServer, *args) -> None:
        ls.relint_all()

    return server


def serve_stdio() -> None:
    logging.basicConfig(level=os.environ.get("NEURON_MIGRATE_LOG", "WARNING"), format="%(levelname)s %(name)s: %(message)s")
    server = build_server()
    from neuron_migrate.pipeline.parallel import tune_gc

    tune_gc()  # every check of a buffer allocates a tree of it: as in the command line's workers
    server.start_io()
