"""The language server, driven over stdio by pygls's LSP client: diagnostics, quick fixes, fix all, noqa,
hover, notebooks and configuration reload. The server runs as `python -m neuron_migrate server`."""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

pytest.importorskip("pygls")
from lsprotocol import types as t  # noqa: E402
from pygls.lsp.client import LanguageClient  # noqa: E402

TIMEOUT = 120  # generous: the machine may be busy; nothing here measures speed

TRAIN = "import torch\nimport torch_xla.core.xla_model as xm\n\n\ndef step(loss):\n    loss.backward()\n    xm.mark_step()\n"


def apply_edits(text: str, edits: list) -> str:
    """Apply LSP TextEdits (whole-document positions, ASCII) to text, last first."""
    lines = text.splitlines(keepends=True)

    def offset(p):
        return sum(len(x) for x in lines[: p.line]) + p.character

    for e in sorted(edits, key=lambda e: (e.range.start.line, e.range.start.character), reverse=True):
        a, b = offset(e.range.start), offset(e.range.end)
        text = text[:a] + e.new_text + text[b:]
        lines = text.splitlines(keepends=True)
    return text


class Session:
    def __init__(self, root: Path):
        self.root = root
        self.client = LanguageClient("neuron-migrate-test", "1")
        self.diagnostics: dict = {}
        self.versions: dict = {}  # uri -> the document version of each diagnostics notification, in order
        self.changed = asyncio.Event()

        @self.client.feature(t.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
        def _diags(params: t.PublishDiagnosticsParams):
            self.diagnostics[params.uri] = params.diagnostics
            self.versions.setdefault(params.uri, []).append(params.version)
            self.changed.set()

    async def start(self):
        await self.client.start_io(sys.executable, "-m", "neuron_migrate", "server", cwd=str(self.root))
        caps = t.ClientCapabilities(workspace=t.WorkspaceClientCapabilities(
            did_change_watched_files=t.DidChangeWatchedFilesClientCapabilities(dynamic_registration=False)))
        result = await asyncio.wait_for(self.client.initialize_async(t.InitializeParams(
            capabilities=caps, root_uri=self.root.as_uri(), process_id=None)), TIMEOUT)
        self.client.initialized(t.InitializedParams())
        return result

    async def wait_for(self, uri: str, pred=lambda d: True):
        """Wait until diagnostics for uri satisfy pred (synchronised on the server's notifications)."""
        async def loop():
            while True:
                if uri in self.diagnostics and pred(self.diagnostics[uri]):
                    return self.diagnostics[uri]
                self.changed.clear()
                await self.changed.wait()
        return await asyncio.wait_for(loop(), TIMEOUT)

    async def stop(self):
        try:
            await asyncio.wait_for(self.client.shutdown_async(None), TIMEOUT)
            self.client.exit(None)
        finally:
            await self.client.stop()


def run(coro):
    return asyncio.run(coro)


def open_doc(s: Session, uri: str, text: str, version: int = 1):
    s.client.text_document_did_open(t.DidOpenTextDocumentParams(
        text_document=t.TextDocumentItem(uri=uri, language_id="python", version=version, text=text)))


def test_mark_step_diagnostic_quick_fix_fix_all_noqa_and_hover(tmp_path):
    f = tmp_path / "train.py"
    f.write_text(TRAIN)
    uri = f.as_uri()

    async def go():
        s = Session(tmp_path)
        init = await s.start()
        assert init.server_info.name == "neuron-migrate"
        assert init.capabilities.code_action_provider and init.capabilities.hover_provider
        try:
            open_doc(s, uri, TRAIN)
            diags = await s.wait_for(uri, lambda d: any(x.code == "NM101" for x in d))
            mark = next(d for d in diags if d.code == "NM101")
            assert mark.range.start.line == 6 and mark.range.start.character == 4
            assert mark.severity == t.DiagnosticSeverity.Warning and mark.source == "neuron-migrate"
            assert mark.code_description.href.endswith("#nm101")

            actions = await asyncio.wait_for(s.client.text_document_code_action_async(t.CodeActionParams(
                text_document=t.TextDocumentIdentifier(uri=uri), range=mark.range,
                context=t.CodeActionContext(diagnostics=[mark]))), TIMEOUT)
            titles = [a.title for a in actions]
            fix = next(a for a in actions if a.title.startswith("Fix NM101"))
            assert fix.is_preferred and fix.kind == t.CodeActionKind.QuickFix
            fixed = apply_edits(TRAIN, fix.edit.changes[uri])
            # only this finding's fix: the step marker goes, the rest stays for its own actions
            assert "mark_step" not in fixed and "loss.backward()" in fixed and "import torch_xla" in fixed
            noqa = next(a for a in actions if a.title == "Disable NM101 for this line")
            assert apply_edits(TRAIN, noqa.edit.changes[uri]).splitlines()[6] == "    xm.mark_step()  # noqa: NM101"
            fix_all = next(a for a in actions if a.kind == "source.fixAll.neuron-migrate")
            all_fixed = apply_edits(TRAIN, fix_all.edit.changes[uri])
            assert all_fixed == "import torch\n\n\ndef step(loss):\n    loss.backward()\n", titles

            # the editor applies the quick fix: the buffer changes and the diagnostic goes away
            s.client.text_document_did_change(t.DidChangeTextDocumentParams(
                text_document=t.VersionedTextDocumentIdentifier(uri=uri, version=2),
                content_changes=[t.TextDocumentContentChangeWholeDocument(text=fixed)]))
            await s.wait_for(uri, lambda d: not any(x.code == "NM101" for x in d))

            hover = await asyncio.wait_for(s.client.text_document_hover_async(t.HoverParams(
                text_document=t.TextDocumentIdentifier(uri=uri), position=t.Position(line=1, character=10))), TIMEOUT)
            assert hover is not None and "NM100" in hover.contents.value and "torch-xla-import" in hover.contents.value
        finally:
            await s.stop()

    run(go())


def test_typing_burst_ends_with_the_diagnostics_of_the_last_text(tmp_path):
    """Changes sent one after another, as keystrokes are, end with the diagnostics of the last version (the server
    checks a burst once, at its last text; every notification names a version the editor sent)."""
    f = tmp_path / "train.py"
    f.write_text("import torch\n")
    uri = f.as_uri()
    step = "    xm.mark_step()\n"

    async def go():
        s = Session(tmp_path)
        await s.start()
        try:
            open_doc(s, uri, "import torch\n")
            await s.wait_for(uri)
            text = TRAIN
            for version in range(2, 32):  # a second function with a step marker typed in and out again
                text = TRAIN + (f"\n\ndef again(loss):\n{step}" if version % 2 == 0 else "")
                s.client.text_document_did_change(t.DidChangeTextDocumentParams(
                    text_document=t.VersionedTextDocumentIdentifier(uri=uri, version=version),
                    content_changes=[t.TextDocumentContentChangeWholeDocument(text=text)]))
            assert text.count("mark_step") == 1  # version 31: the first marker only
            diags = await s.wait_for(uri, lambda d: s.versions[uri][-1] == 31)
            assert [d.code for d in diags].count("NM101") == 1
            assert set(s.versions[uri]) <= set(range(1, 32))
        finally:
            await s.stop()

    run(go())


def test_a_burst_of_changes_is_checked_once_at_its_end():
    """didChange schedules the check (lint_soon) instead of running it: each change cancels the check the one before
    scheduled, so twenty changes in a row cost one check, run after the last; closing a document drops its check."""
    from neuron_migrate.server.lsp import NeuronMigrateServer

    server = NeuronMigrateServer()
    checked: list = []
    server.lint = checked.append  # what a check does is the other tests' business: here, which ones run

    async def go():
        for _ in range(20):
            server.lint_soon("file:///a.py")
        server.lint_soon("file:///b.py")
        server.lint_soon("file:///c.py")
        server.document_closed("file:///c.py")
        assert checked == []  # nothing runs inside the change notifications themselves
        await asyncio.sleep(0.05)  # a file never checked before waits 0 s: its check is due on the next turn
        assert sorted(checked) == ["file:///a.py", "file:///b.py"]

    run(go())


def test_unsafe_fix_is_marked_and_config_reload(tmp_path):
    src = "import torch\n\nmodel = torch.compile(model, dynamic=True)\n"
    f = tmp_path / "m.py"
    f.write_text(src)
    uri = f.as_uri()

    async def go():
        s = Session(tmp_path)
        await s.start()
        try:
            open_doc(s, uri, src)
            diags = await s.wait_for(uri, lambda d: len(d) > 0)
            unsafe = [d for d in diags if (d.data or {}).get("fix") == "unsafe"]
            assert unsafe, [(d.code, d.data) for d in diags]
            actions = await asyncio.wait_for(s.client.text_document_code_action_async(t.CodeActionParams(
                text_document=t.TextDocumentIdentifier(uri=uri), range=unsafe[0].range,
                context=t.CodeActionContext(diagnostics=[unsafe[0]]))), TIMEOUT)
            fix = next(a for a in actions if a.title.startswith(f"Fix {unsafe[0].code}"))
            assert "unsafe" in fix.title and not fix.is_preferred
            code = unsafe[0].code
            # the project ignores that rule: after the pyproject.toml change, the diagnostic is gone
            (tmp_path / "pyproject.toml").write_text(f'[tool.neuron-migrate]\nignore = ["{code}"]\n')
            s.client.workspace_did_change_watched_files(t.DidChangeWatchedFilesParams(changes=[
                t.FileEvent(uri=(tmp_path / "pyproject.toml").as_uri(), type=t.FileChangeType.Created)]))
            await s.wait_for(uri, lambda d: not any(x.code == code for x in d))
        finally:
            await s.stop()

    run(go())


def test_notebook_cells_get_diagnostics_and_fixes(tmp_path):
    nb_uri = (tmp_path / "nb.ipynb").as_uri()
    cell1, cell2 = nb_uri + "#cell1", nb_uri + "#cell2"
    src1 = "import torch_xla.core.xla_model as xm\n%matplotlib inline"
    src2 = "loss.backward()\nxm.mark_step()"

    async def go():
        s = Session(tmp_path)
        await s.start()
        try:
            s.client.notebook_document_did_open(t.DidOpenNotebookDocumentParams(
                notebook_document=t.NotebookDocument(uri=nb_uri, notebook_type="jupyter-notebook", version=1, cells=[
                    t.NotebookCell(kind=t.NotebookCellKind.Code, document=cell1),
                    t.NotebookCell(kind=t.NotebookCellKind.Code, document=cell2)]),
                cell_text_documents=[
                    t.TextDocumentItem(uri=cell1, language_id="python", version=1, text=src1),
                    t.TextDocumentItem(uri=cell2, language_id="python", version=1, text=src2)]))
            diags = await s.wait_for(cell2, lambda d: any(x.code == "NM101" for x in d))
            mark = next(d for d in diags if d.code == "NM101")
            assert mark.range.start.line == 1  # line within the cell, not within the joined notebook
            actions = await asyncio.wait_for(s.client.text_document_code_action_async(t.CodeActionParams(
                text_document=t.TextDocumentIdentifier(uri=cell2), range=mark.range,
                context=t.CodeActionContext(diagnostics=[mark]))), TIMEOUT)
            fix = next(a for a in actions if a.title.startswith("Fix NM101"))
            assert apply_edits(src2, fix.edit.changes[cell2]) == "loss.backward()"
            assert cell1 not in fix.edit.changes

            # the user edits the cell (notebookDocument/didChange, checked once the edits stop): the finding goes
            s.client.notebook_document_did_change(t.DidChangeNotebookDocumentParams(
                notebook_document=t.VersionedNotebookDocumentIdentifier(uri=nb_uri, version=2),
                change=t.NotebookDocumentChangeEvent(cells=t.NotebookDocumentCellChanges(text_content=[
                    t.NotebookDocumentCellContentChanges(
                        document=t.VersionedTextDocumentIdentifier(uri=cell2, version=2),
                        changes=[t.TextDocumentContentChangeWholeDocument(text="loss.backward()")])]))))
            await s.wait_for(cell2, lambda d: not any(x.code == "NM101" for x in d))
        finally:
            await s.stop()

    run(go())
