"""`neuron-migrate server`: start the language server on stdio (for an editor's LSP client)."""
from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    app.command("server", help="Run the language server (LSP over stdio) for editors: live findings, quick fixes, hover docs.")(server)


def server() -> None:
    try:
        from neuron_migrate.server.lsp import serve_stdio
    except ImportError as exc:  # pygls is a regular dependency; a broken environment gets one line
        typer.echo(f"neuron-migrate: error: the language server needs pygls ({exc}); pip install 'neuron-migrate[server]'", err=True)
        raise typer.Exit(2)
    serve_stdio()
