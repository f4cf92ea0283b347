"""Jupyter notebooks as one Python text: code cells joined with marker lines, IPython magics masked.

Joining the cells lets name resolution see an import in cell 1 used in cell 5; the markers split the
rewritten text back into cells. Only code-cell sources change; outputs, metadata and other cells stay.
"""
from __future__ import annotations

import codecs
import json
import re

from neuron_migrate.files.source import SourceError

CELL_MARK = "# %%neuron-migrate-cell {index}"
_CELL_RE = re.compile(r"^# %%neuron-migrate-cell (\d+)$")
MAGIC_MARK = "# %%neuron-migrate-magic "
_MAGIC = re.compile(r"^(\s*)([%!?]|.*\?$)")


# A plain class, not a dataclass: importing dataclasses (and the inspect module it imports) costs every start-up
# about 20 ms. Nothing compares it, so it keeps identity equality.
class Notebook:
    """A notebook read for analysis: its JSON, the code cells' joined text, and how to write it back."""

    def __init__(self, data: dict, code_cells: list[int], text: str, indent: int | None, trailing_newline: bool,
                 raw: bytes = b""):
        self.data = data
        self.code_cells = code_cells  # indexes into data["cells"]
        self.text = text  # joined, masked Python text
        self.indent = indent  # json indentation to write back with
        self.trailing_newline = trailing_newline
        self.raw = raw  # the file as read


def _mask(line: str) -> str:
    m = _MAGIC.match(line)
    if m and line.strip():
        return f"{m.group(1)}{MAGIC_MARK}{line[len(m.group(1)):]}"
    return line


def _unmask(line: str) -> str:
    i = line.find(MAGIC_MARK)
    if i >= 0 and not line[:i].strip():
        return line[:i] + line[i + len(MAGIC_MARK) :]
    return line


def load_notebook(raw: bytes) -> Notebook:
    try:
        data = json.loads(raw.decode("utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SourceError(f"not a valid notebook (invalid JSON: {exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        raise SourceError("not a valid notebook (no 'cells' list)")
    lang = (data.get("metadata", {}).get("language_info") or {}).get("name", "python")
    if lang not in ("python", "ipython", "ipython3"):
        raise SourceError(f"notebook language is {lang!r}, not Python")
    parts = []
    code_cells = []
    for i, cell in enumerate(data["cells"]):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        src = cell.get("source", "")
        src = "".join(src) if isinstance(src, list) else str(src)
        code_cells.append(i)
        lines = src.split("\n")
        if lines and lines[0].startswith("%%"):  # a cell magic: the whole cell is not Python
            lines = [MAGIC_MARK + ln for ln in lines]
        else:
            lines = [_mask(ln) for ln in lines]
        parts.append(CELL_MARK.format(index=i) + "\n" + "\n".join(lines) + "\n")
    text = "".join(parts)
    indent = _detect_indent(raw)
    return Notebook(data, code_cells, text, indent, raw.endswith(b"\n"), raw)


def _detect_indent(raw: bytes) -> int | None:
    m = re.search(rb"\n( +)\"", raw)
    return len(m.group(1)) if m else None


def dump_notebook(nb: Notebook, new_text: str) -> bytes:
    """Write the rewritten joined text back into the cells it came from."""
    cells: dict[int, list[str]] = {}
    current = None
    # every cell was joined as marker + "\n" + source + "\n": without the text's final newline, splitting gives
    # each cell's source lines exactly (a cell's own trailing newline is an empty last line)
    body = new_text[:-1] if new_text.endswith("\n") else new_text
    for line in body.split("\n"):
        m = _CELL_RE.match(line)
        if m:
            current = int(m.group(1))
            cells[current] = []
            continue
        if current is None:
            # text inserted above the first marker (imports, helpers) belongs to the first code cell
            cells.setdefault(-1, []).append(line)
            continue
        cells[current].append(line)
    if set(cells) - {-1} != set(nb.code_cells):
        raise SourceError("notebook cell markers were lost while rewriting")
    if -1 in cells and nb.code_cells:
        pre = [ln for ln in cells.pop(-1)]
        while pre and not pre[-1].strip():
            pre.pop()
        if pre:
            cells[nb.code_cells[0]] = pre + cells[nb.code_cells[0]]
    new_sources = {}
    for i in nb.code_cells:
        src = "\n".join(_unmask(ln) for ln in cells[i])
        orig = nb.data["cells"][i].get("source", "")
        orig_text = "".join(orig) if isinstance(orig, list) else str(orig)
        if src != orig_text:  # untouched cells keep their exact source (and list-of-lines form)
            new_sources[i] = src.splitlines(keepends=True) if isinstance(orig, list) else src
    if not new_sources:
        return nb.raw
    tail = "\n" if nb.trailing_newline else ""
    # write back in the file's own JSON style, so that untouched cells stay byte-identical
    style = {"indent": nb.indent, "ensure_ascii": False}
    raw_text = nb.raw.decode("utf-8-sig") if nb.raw else ""
    for candidate in ({"indent": nb.indent, "ensure_ascii": False}, {"indent": nb.indent, "ensure_ascii": True}):
        if json.dumps(nb.data, **candidate) + tail == raw_text:
            style = candidate
            break
    for i, src in new_sources.items():
        nb.data["cells"][i]["source"] = src
    out = json.dumps(nb.data, **style) + tail
    return (codecs.BOM_UTF8 if nb.raw.startswith(codecs.BOM_UTF8) else b"") + out.encode("utf-8")


def name_cells(findings, text: str) -> None:
    """Re-express findings on the joined text as cell number (1-based, counting every cell as Jupyter lists
    them) plus line within that cell, so that `train.ipynb:cell 4:10:3` points at what the user sees."""
    marks = [(i + 1, int(m.group(1))) for i, line in enumerate(text.split("\n")) if (m := _CELL_RE.match(line))]
    if not marks:
        return
    import bisect

    from neuron_migrate.files.span import Span

    lines = [m[0] for m in marks]
    for f in findings:
        if f.cell is not None:
            continue
        k = bisect.bisect_right(lines, f.span.line) - 1
        if k < 0:
            continue
        mark_line, index = marks[k]
        s = f.span
        end_line = s.end_line - mark_line if s.end_line > mark_line else 1
        f.span = Span(max(1, s.line - mark_line), s.col, max(1, end_line), s.end_col)
        f.cell = index + 1
