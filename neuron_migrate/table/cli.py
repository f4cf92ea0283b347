"""`neuron-migrate table ...`: show, import and build TorchNeuron compatibility tables.

Import-light: rich, yaml and torch are imported inside the commands only.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, Optional

import typer

table_app = typer.Typer(
    name="table",
    help="Show, import or build the TorchNeuron compatibility table (aten ops, APIs, compile params, collectives).",
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    app.add_typer(table_app, name="table")


# --------------------------------------------------------------------------------------------- show


def _entry_dict(e) -> dict[str, Any]:
    return {
        "name": e.name,
        "kind": e.kind,
        "status": e.status.value,
        "dtypes": e.dtypes,
        "note": e.note,
        "source": e.source_id,
        "source_url": e.source_url,
        "source_kind": e.source_kind,
        "confidence": e.confidence,
    }


_STATUS_STYLE = {
    "native": "green",
    "cpu_fallback": "yellow",
    "partial": "cyan",
    "unsupported": "red",
    "unknown": "dim",
}


@table_app.command("show")
def show(
    name: Optional[str] = typer.Argument(None, help="An aten op (atan2, aten::add.Tensor) or API (torch.linalg.qr)."),
    table: Optional[Path] = typer.Option(None, "--table", help="Table file (default: newest shipped table)."),
    status: Optional[str] = typer.Option(None, "--status", help="Only entries with this status."),
    kind: Optional[str] = typer.Option(None, "--kind", help="Only entries of this kind (aten_op, api, namespace, ...)."),
    fmt: str = typer.Option("text", "--format", help="text or json."),
) -> None:
    """List the table, or show one entry (op or API) in detail with its source."""
    from neuron_migrate.table import Status, TableError, load_table

    if fmt not in ("text", "json"):
        typer.echo(f"error: --format must be text or json, not {fmt!r}", err=True)
        raise typer.Exit(2)
    try:
        t = load_table(table)
    except TableError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    st = None
    if status is not None:
        try:
            st = Status(status.lower())
        except ValueError:
            typer.echo(f"error: --status must be one of {', '.join(s.value for s in Status)}", err=True)
            raise typer.Exit(2) from None

    if name is not None:
        _show_one(t, name, fmt)
        return
    entries = t.filter(status=st, kind=kind)
    if fmt == "json":
        typer.echo(json.dumps({"table": str(t.path), "version": t.version,
                               "entries": [_entry_dict(e) for e in entries]}, indent=2))
        return
    from rich.console import Console
    from rich.table import Table as RichTable
    from rich.text import Text

    rt = RichTable(title=f"TorchNeuron {t.version} (torch-neuronx {t.torch_neuronx}, Neuron {t.neuron_sdk}, torch {t.torch})")
    for col in ("name", "kind", "status", "confidence", "source", "note"):
        rt.add_column(col, overflow="fold")
    for e in entries:
        # only a high-confidence row gets its status colour; medium and low rows are dimmed, so a green "native"
        # from a pre-release snapshot does not read like a documented fact
        style = _STATUS_STYLE.get(e.status.value, "") if e.confidence == "high" else "dim"
        # the cells are data (Text: a note's `[verify]` or `:100:` is shown as written, not read as markup)
        rt.add_row(Text(e.name), Text(e.kind), f"[{style}]{e.status.value}[/{style}]" if style else e.status.value,
                   Text(e.confidence or ""), Text(e.source_id or ""), Text(e.note or ""))
    console = Console(width=160, emoji=False)
    console.print(rt)
    console.print(f"{len(entries)} of {len(t.entries)} entries")


def _looks_like_op(name: str) -> bool:
    return name.startswith(("aten", "torch.ops.")) or "::" in name or "." not in name


def _source_lines(t, sid: str | None, url: str | None, confidence: str | None) -> list[str]:
    src = t.sources.get(sid or "", {})
    out = [f"  confidence: {confidence or 'none (no source says)'}"]
    if sid:
        out.append(f"  source:     {sid} ({src.get('kind', '?')})" + (f": {src['title']}" if src.get("title") else ""))
    out.append(f"  url:        {url or '(no public address recorded)'}")
    return out


def _env_lines(entry) -> list[str]:
    out = []
    for var, forms in (getattr(entry, "when_env", None) or {}).items():
        for val, form in forms.items():
            out.append(f"  with {var}={val}: {form.get('status')} ({form.get('confidence') or 'source confidence'}, "
                       f"{form.get('source')})" + (f": {form['note']}" if form.get("note") else ""))
    if getattr(entry, "env_applied", None):
        out.append(f"  applied:    {entry.env_applied} (from the environment)")
    return out


def _show_one(t, name: str, fmt: str) -> None:
    entry = t.get(name)
    verdict = None
    if entry is None and _looks_like_op(name):
        verdict = t.classify_op(name)
        if verdict.via == "none":
            verdict = None
    if entry is None and verdict is None:
        entry = t.api(name)
    ops = t.ops_for_api(name)
    if entry is None and verdict is None and ops:
        v = t.classify_api(name)
        worst, op_entries = t.worst_status_for_api(name)
        if fmt == "json":
            typer.echo(json.dumps({"api": name, **v.as_dict(), "ops": [_entry_dict(e) for e in op_entries]}, indent=2))
            return
        lines = [f"{name}: {worst.value} (worst over its aten ops)"]
        lines += _source_lines(t, v.source_id, v.source_url, v.confidence)
        for e in op_entries:
            lines.append(f"    {e.name:<50} {e.status.value:<13} {e.confidence or '-':<7} {e.source_id or ''}")
        typer.echo("\n".join(lines))
        return
    if entry is None and verdict is None:
        v = t.classify_op(name) if _looks_like_op(name) else None
        if fmt == "json":
            typer.echo(json.dumps({"name": name, "status": "unknown", "found": False,
                                   "note": v.note if v is not None else None}))
        else:
            typer.echo(f"{name}: not in table {t.path.name} (status unknown)" + (f"\n  {v.note}" if v is not None else ""))
        raise typer.Exit(1)
    if verdict is not None and verdict.via == "entry":
        entry, verdict = verdict.entries[0], None
    if verdict is not None:  # derived from torch's dispatcher, a namespace, or sibling overloads
        if fmt == "json":
            d = {"query": name, **verdict.as_dict(), "source_kind": t.sources.get(verdict.source_id or "", {}).get("kind")}
            typer.echo(json.dumps(d, indent=2))
            return
        how = {"derived": "derived from torch's dispatcher", "namespace": "from a namespace entry",
               "aggregate": "aggregated over listed overloads"}.get(verdict.via, verdict.via)
        lines = [f"{verdict.name}  (aten_op)", f"  status:     {verdict.status.value}  ({how})"]
        lines += _source_lines(t, verdict.source_id, verdict.source_url, verdict.confidence)
        if verdict.cause:
            lines.append(f"  decided by: {verdict.cause}")
        lines.append(f"  how:        {verdict.note}")
        lines.append(f"  table:      {t.path.name} (torch-neuronx {t.torch_neuronx})")
        typer.echo("\n".join(lines))
        return
    if fmt == "json":
        d = _entry_dict(entry)
        d["query"] = name
        if ops:
            d["aten_ops"] = ops
        if entry.when_env:
            d["when_env"] = entry.when_env
            d["env_applied"] = entry.env_applied
        typer.echo(json.dumps(d, indent=2))
        return
    lines = [f"{entry.name}  ({entry.kind})", f"  status:     {entry.status.value}"]
    if entry.dtypes:
        lines.append(f"  dtypes:     {entry.dtypes}")
    if entry.note:
        lines.append(f"  note:       {entry.note}")
    if entry.name != name:
        lines.append(f"  matched:    {name} -> {entry.name}")
    if ops:
        lines.append(f"  aten ops:   {', '.join(ops)}")
    lines += _source_lines(t, entry.source_id, entry.source_url, entry.confidence)
    lines += _env_lines(entry)
    lines.append(f"  table:      {t.path.name} (torch-neuronx {t.torch_neuronx})")
    typer.echo("\n".join(lines))


# --------------------------------------------------------------------------------------------- import

_STATUS_WORDS: list[tuple[str, str]] = [
    # order matters: more specific first
    (r"not\s*supported|unsupported|\bno\b|❌|✗|✘|⛔|🚫|\bnone\b|\bfail", "unsupported"),
    (r"cpu[\s_-]*fallback|fall[\s_-]*back|fallback|\bcpu\b|\bhost\b|🔄|↩", "cpu_fallback"),
    (r"partial|limited|some|⚠|🟡|🚧|experimental|beta", "partial"),
    (r"supported|\byes\b|native|✅|✔|☑|🟢|\bok\b|\bfull\b", "native"),
]

_NAME_HEADERS = ("operator", "op", "api", "name", "function", "aten op", "aten operator", "torch api", "feature")
_STATUS_HEADERS = ("status", "support", "supported", "support status", "neuron", "neuron support", "state")
_DTYPE_HEADERS = ("dtype", "dtypes", "data types", "datatypes", "supported dtypes", "dtype coverage", "types")
_NOTE_HEADERS = ("note", "notes", "comment", "comments", "limitations", "limits", "remarks", "details", "description")
_FALLBACK_HEADERS = ("cpu fallback", "fallback", "falls back to cpu")


def map_status(word: str | None) -> str:
    """Map a status cell (text or emoji) to a Status value."""
    if not word:
        return "unknown"
    w = word.strip().lower()
    for pattern, status in _STATUS_WORDS:
        if re.search(pattern, w):
            return status
    return "unknown"


def _split_row(line: str) -> list[str]:
    s = line.strip()
    if s.startswith("|"):
        s = s[1:]
    if s.endswith("|") and not s.endswith("\\|"):
        s = s[:-1]
    cells = re.split(r"(?<!\\)\|", s)
    return [c.strip().replace("\\|", "|") for c in cells]


def _is_sep(cells: list[str]) -> bool:
    return bool(cells) and all(re.fullmatch(r":?-{2,}:?", c.replace(" ", "")) for c in cells if c) and any(cells)


def _clean(cell: str) -> str:
    c = re.sub(r"<[^>]+>", " ", cell)
    c = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", c)  # links
    c = c.replace("`", "").replace("**", "").replace("__", "")
    return re.sub(r"\s+", " ", c).strip()


def _find_col(headers: list[str], names: tuple[str, ...]) -> int | None:
    norm = [re.sub(r"[^a-z ]", "", h.lower()).strip() for h in headers]
    for n in names:  # exact first
        if n in norm:
            return norm.index(n)
    for i, h in enumerate(norm):
        for n in names:
            if h.startswith(n) or n in h.split():
                return i
    return None


def _kind_for(name: str, section: str) -> str:
    if name.startswith("aten::") or name.startswith("aten."):
        return "aten_op"
    if name.startswith("torch.compile:") or (":" in name and name.split(":")[0] == "torch.compile"):
        return "compile_param"
    if name.startswith("torch.distributed"):
        return "distributed"
    if "." not in name and re.fullmatch(r"[a-z_][a-z0-9_]*", name) and "api" not in section.lower():
        return "aten_op"
    return "api"


def parse_markdown_tables(text: str) -> list[dict[str, Any]]:
    """Parse every pipe table in the markdown into raw entry dicts (header-driven, order/case tolerant)."""
    lines = text.splitlines()
    out: list[dict[str, Any]] = []
    section = ""
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("#"):
            section = line.strip("# ").strip()
        if "|" in line and i + 1 < len(lines) and _is_sep(_split_row(lines[i + 1])):
            headers = [_clean(h) for h in _split_row(line)]
            c_name = _find_col(headers, _NAME_HEADERS)
            c_status = _find_col(headers, _STATUS_HEADERS)
            c_dtype = _find_col(headers, _DTYPE_HEADERS)
            c_note = _find_col(headers, _NOTE_HEADERS)
            c_fb = _find_col(headers, _FALLBACK_HEADERS)
            if c_fb is not None and c_fb == c_status:
                c_fb = None
            if c_name is None:
                c_name = 0
            i += 2
            while i < len(lines) and "|" in lines[i] and lines[i].strip():
                cells = _split_row(lines[i])
                i += 1
                get = lambda c: _clean(cells[c]) if c is not None and c < len(cells) else ""  # noqa: E731
                name = get(c_name)
                if not name:
                    continue
                status = map_status(get(c_status)) if c_status is not None else "unknown"
                fb = get(c_fb)
                if c_fb is not None and status in ("unknown", "native") and map_status(fb) in ("native",) and fb:
                    # a separate "CPU fallback: yes" column
                    status = "cpu_fallback"
                notes = [get(c_note)] if get(c_note) else []
                extra = [f"{headers[k]}: {_clean(cells[k])}" for k in range(min(len(headers), len(cells)))
                         if k not in (c_name, c_status, c_dtype, c_note, c_fb) and _clean(cells[k])]
                raw_status = get(c_status)
                if status == "unknown" and raw_status:
                    notes.append(f"upstream status: {raw_status}")
                notes.extend(extra)
                e: dict[str, Any] = {"name": name, "kind": _kind_for(name, section), "status": status}
                if get(c_dtype):
                    e["dtypes"] = get(c_dtype)
                if notes:
                    e["note"] = "; ".join(notes)
                if e["kind"] == "aten_op" and not name.startswith("aten"):
                    e["name"] = "aten::" + name
                elif e["kind"] == "aten_op" and name.startswith("aten."):
                    e["name"] = "aten::" + name[5:]
                out.append(e)
            continue
        i += 1
    return out


@table_app.command("import")
def import_md(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, help="Markdown file (e.g. torch_api_compatibility.md)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Output YAML (default: stdout)."),
    version: str = typer.Option("unknown", "--version", help="torch-neuronx version the document describes."),
    url: str = typer.Option(
        "https://github.com/aws-neuron/torch-neuronx/blob/main/docs/torch_api_compatibility.md",
        "--url", help="Where the document came from (recorded as the source url).",
    ),
) -> None:
    """Convert an upstream markdown compatibility table into our YAML schema (source kind aws_docs)."""
    import yaml

    text = file.read_text(encoding="utf-8")
    raw = parse_markdown_tables(text)
    if not raw:
        typer.echo(f"error: {file}: no markdown table with a header row found", err=True)
        raise typer.Exit(2)
    seen: dict[str, dict[str, Any]] = {}
    for e in raw:
        e["source"] = "upstream_md"
        seen[e["name"]] = e  # last row wins on duplicates
    doc = {
        "version": version,
        "torch_neuronx": version,
        "neuron_sdk": "unknown",
        "torch": "unknown",
        "sources": {"upstream_md": {"url": url, "kind": "aws_docs", "confidence": "high", "title": f"imported from {file.name}"}},
        "entries": list(seen.values()),
    }
    text_out = f"# Imported by `neuron-migrate table import {file.name}`\n" + yaml.safe_dump(
        doc, sort_keys=False, allow_unicode=True, width=120
    )
    if out is None:
        sys.stdout.write(text_out)
    else:
        out.write_text(text_out, encoding="utf-8")
        counts: dict[str, int] = {}
        for e in seen.values():
            counts[e["status"]] = counts.get(e["status"], 0) + 1
        typer.echo(f"wrote {len(seen)} entries to {out} ({', '.join(f'{k}: {v}' for k, v in sorted(counts.items()))})")


# --------------------------------------------------------------------------------------------- build


@table_app.command("build")
def build(
    out: Optional[Path] = typer.Option(None, "--out", help="Output YAML (default: compat_table/torchneuron-<version>.yaml in cwd)."),
    backend_module: str = typer.Option("torch_neuronx", "--backend-module",
                                       help="Module whose import registers the PrivateUse1 backend (default torch_neuronx)."),
    version: Optional[str] = typer.Option(None, "--version", help="Table version (default: from the backend's version)."),
) -> None:
    """With the backend installed: list the aten ops that have a PrivateUse1 kernel and write them as native.

    Reads torch._C._dispatch_has_kernel_for_dispatch_key(op, "PrivateUse1") for every aten op of the installed
    torch, after importing the backend; ops torch itself registers for PrivateUse1 (none in torch 2.13) are left
    out. Other ops get their status derived from the dispatcher data at load time, or stay unknown."""
    try:
        import torch  # noqa: F401
    except ImportError:
        typer.echo("error: `table build` needs torch and torch-neuronx installed (pip install torch-neuronx); "
                   "torch is not importable here.", err=True)
        raise typer.Exit(2) from None
    import importlib

    try:
        backend = importlib.import_module(backend_module)
    except Exception as exc:  # ImportError, or a failed runtime init
        typer.echo(f"error: `table build` needs the backend module {backend_module!r} (torch-neuronx, the native "
                   f"TorchNeuron backend, on a Trainium host); importing it failed: {exc}", err=True)
        raise typer.Exit(2) from None
    import yaml

    from neuron_migrate.table import _installed

    stock: set[str] = set()
    family = ".".join(str(torch.__version__).split("+")[0].split(".")[:2])
    target = out
    names = []
    for full in sorted(torch._C._dispatch_get_all_op_names()):
        if full.startswith("aten::") and torch._C._dispatch_has_kernel_for_dispatch_key(full, "PrivateUse1"):
            names.append(full[: -len(".default")] if full.endswith(".default") else full)
    dispatch_name = f"aten_dispatch-{family}.json"
    from neuron_migrate._data import data_dir

    shipped = data_dir("compat_table") / dispatch_name
    if shipped.is_file():  # ops stock torch registers for PrivateUse1 are not the backend's kernels
        flags = json.loads(shipped.read_text(encoding="utf-8"))["ops"]
        stock = {n for n, f in flags.items() if "P" in f}
    names = [n for n in names if n not in stock]
    tnx = _installed(backend_module.replace("_", "-")) or _installed(backend_module) or getattr(backend, "__version__", None)
    tnx = str(tnx or "unknown")
    ver = version or (".".join(tnx.split(".")[:3]) if tnx != "unknown" else "unknown")
    entries = [{"name": n, "kind": "aten_op", "status": "native",
                "note": f"PrivateUse1 kernel registered by {backend_module} in the installed build", "source": "installed_wheel"}
               for n in names]
    doc: dict[str, Any] = {
        "version": ver,
        "torch_neuronx": tnx,
        "neuron_sdk": "unknown",
        "torch": str(torch.__version__).split("+")[0],
        "sources": {"installed_wheel": {
            "url": (f"https://pypi.org/project/torch-neuronx/{tnx}/"
                    if backend_module == "torch_neuronx" and tnx != "unknown" else None),
            "kind": "aws_docs" if backend_module == "torch_neuronx" else "community", "confidence": "high",
            "title": f"torch._C._dispatch_has_kernel_for_dispatch_key(op, 'PrivateUse1') after import {backend_module}"
                     + ("" if backend_module == "torch_neuronx" else "; no single public address (a local backend)"),
        }},
        "entries": entries,
    }
    target = target or Path("compat_table") / f"torchneuron-{ver}.yaml"
    if (target.parent / dispatch_name).is_file():
        doc["dispatch"] = dispatch_name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(f"# Built by `neuron-migrate table build` (torch {torch.__version__}, {backend_module} {tnx})\n"
                      + yaml.safe_dump(doc, sort_keys=False, width=120), encoding="utf-8")
    typer.echo(f"wrote {len(entries)} native aten entries to {target}")
