"""report.text.PlainConsole: piped output without rich.console, byte-identical to what rich writes there."""
from __future__ import annotations

import io
import sys

from rich.console import Console
from rich.table import Table
from rich.text import Text

from neuron_migrate.report.text import PlainConsole, StyledText, console

CALLS = [
    ((), {}),
    (("[red]error[/red]: x[0] [i]y[/i] :smile: torch.device('xla:1')",), {}),
    (("[yellow]warning[/yellow]: keep [brackets] as typed",), {"markup": False, "highlight": False}),
    ((Text("Found 3 findings", style="bold"),), {}),
    (("a", Text("b", style="dim"), "c"), {"sep": ", ", "end": "!\n"}),
    ((Text("\n").join([Text("line 1", style="green"), Text("line 2")]),), {}),
    # no tag and no emoji code: printed as it is, without rich's markup parser
    (("[*] 3 fixable with `neuron-migrate rewrite --write`. a: b, x:y:z, \\[bold] C:\\dir",), {}),
    (("path/with [1] and :not-an-emoji:",), {"markup": False}),
    ((StyledText("Found 2 findings", style="bold"),), {}),
    ((StyledText("\n").join([StyledText("x.py:1:1: ", style="bold").append("NM101", style="yellow"), StyledText("  2 | y")]),), {}),
]


def _rich(calls) -> str:
    buf = io.StringIO()
    con = Console(file=buf, highlight=False, soft_wrap=True)
    for args, kw in calls:
        con.print(*args, **kw)
    return buf.getvalue()


def test_plain_console_writes_what_rich_writes_to_a_pipe(monkeypatch):
    buf = io.StringIO()
    monkeypatch.setattr(sys, "stdout", buf)
    con = PlainConsole()
    for args, kw in CALLS:
        con.print(*args, **kw)
    assert buf.getvalue() == _rich(CALLS)
    assert "\x1b" not in buf.getvalue()


def test_tables_go_through_rich(monkeypatch):
    buf = io.StringIO()
    monkeypatch.setattr(sys, "stdout", buf)
    t = Table("code", "name")
    t.add_row("NM100", "xla-device")
    PlainConsole().print(t)
    assert "NM100" in buf.getvalue() and "xla-device" in buf.getvalue()


def test_console_choice(monkeypatch):
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.setattr(sys, "stdout", io.StringIO())  # not a terminal
    assert isinstance(console(), PlainConsole)
    assert isinstance(console(color="never"), PlainConsole)
    assert not isinstance(console(color="always"), PlainConsole)
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert not isinstance(console(), PlainConsole)
