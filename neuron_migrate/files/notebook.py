"""Jupyter notebooks as one Python text: code cells joined with marker lines, IPython syntax masked.

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
# An IPython escape where a comment cannot stand (the only body of an `if`, the value of `VERSION = !curl ...`):
# a placeholder name with the escape's text in a comment after it, `<head>__neuron_migrate_ipython__  # %%...`.
PLACEHOLDER = "__neuron_migrate_ipython__"
ESCAPE_MARK = "# %%neuron-migrate-escape "
# IPython's input transformers: `x = !cmd`, `a, b = %magic ...` (assign_from_system / assign_from_magic), a line
# that starts with an escape (`!cmd`, `!!cmd`, `%magic`, `?obj`), and `obj?` / `obj??` (help_end)
_ASSIGN_ESCAPE = re.compile(r"^(\s*[A-Za-z_][\w.]*(?:\s*,\s*[A-Za-z_][\w.]*)*\s*=\s*)([!%].*)$")
_LINE_ESCAPE = re.compile(r"^(\s*)([!%?].*)$")
# `%time CODE` / `%timeit [-n N -r R ...] CODE` run CODE as Python: it is analysed (and rewritten) as the line
# `CODE  # %%neuron-migrate-code %time ` (a name it uses keeps its import)
CODE_MARK = "# %%neuron-migrate-code "
_CODE_MAGIC = re.compile(r"^(\s*)(%time\s+|%timeit(?:\s+-[nrp]\s*\d+|\s+-[tcqo])*\s+)(?=[^\s#-])")
_HELP_END = re.compile(r"^(\s*)(%{0,2}[A-Za-z_*][\w*.]*(?:\[-?\d+\])*\?\??)\s*$")


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


def _mask_all(line: str) -> str:
    """A continuation line of an escape (`%pip install a \\` then `    b`): a comment, whatever it holds."""
    rest = line.lstrip(" \t")
    return f"{line[: len(line) - len(rest)]}{MAGIC_MARK}{rest}"


def _continues(line: str) -> bool:
    return line.rstrip("\r").endswith("\\")  # IPython joins an escape line ending in a backslash with the next


def _code_magic(line: str) -> str | None:
    """`%time CODE` as `CODE  # %%neuron-migrate-code %time `; None for any other line."""
    m = _CODE_MAGIC.match(line)
    if m is None or _continues(line) or "\r" in line:
        return None
    return f"{m.group(1)}{line[m.end():]}  {CODE_MARK}{m.group(2)}"


def _as_comments(lines: list[str], code: bool = True) -> list[str]:
    """Each escape line (and the lines it continues onto) as a comment: valid wherever a comment may stand."""
    out: list[str] = []
    cont = False
    for line in lines:
        if cont:
            out.append(_mask_all(line))
            cont = _continues(line)
            continue
        timed = _code_magic(line) if code else None
        if timed is not None:
            out.append(timed)
            continue
        masked = _mask(line)
        out.append(masked)
        cont = masked is not line and _continues(line)
    return out


def _as_placeholders(lines: list[str]) -> list[str]:
    """Each escape as IPython's transformers see it, a statement (or the value of an assignment): a placeholder
    name, with the escape's text in a comment after it; the lines it continues onto are comments."""
    out: list[str] = []
    cont = False
    for line in lines:
        if cont:
            out.append(_mask_all(line))
            cont = _continues(line)
            continue
        timed = _code_magic(line)
        if timed is not None:
            out.append(timed)
            continue
        stripped = line.strip()
        m = None
        if stripped and not stripped.startswith("#"):
            m = _ASSIGN_ESCAPE.match(line) or _LINE_ESCAPE.match(line) or _HELP_END.match(line)
        if m is None:
            out.append(line)
            continue
        out.append(f"{m.group(1)}{PLACEHOLDER}  {ESCAPE_MARK}{line[len(m.group(1)):]}")
        cont = _continues(line)
    return out


def mask_cell(src: str) -> list[str]:
    """The lines of a code cell's source as Python lines, one for one: IPython syntax (magics, shell escapes, help)
    masked, so that `unmask_line` gives each line back byte for byte. An escape becomes a comment where the cell
    then parses (what the analysis of most notebooks has always seen), else the IPython way: a placeholder per
    escape (`if ok:` whose only body is `!cmd`, `VERSION = !curl ...`, `%pip install ... \\` with a continuation)."""
    lines = src.split("\n")
    if lines and lines[0].startswith("%%"):  # a cell magic: the whole cell is not Python
        return [MAGIC_MARK + ln for ln in lines]
    masked = _as_comments(lines)
    placed = _as_placeholders(lines)
    if masked == lines and placed == lines:
        return lines  # no IPython syntax
    import ast

    def parses(candidate: list[str]) -> bool:
        try:
            ast.parse("\n".join(candidate))
        except (SyntaxError, ValueError, RecursionError):
            return False
        return True

    if parses(masked):
        return masked
    if placed != lines and parses(placed):
        return placed
    return _as_comments(lines, code=False)


def unmask_line(line: str) -> str:
    """A masked line's original text (any other line as it is)."""
    i = line.find(PLACEHOLDER)
    if i >= 0:
        j = line.find(ESCAPE_MARK, i)
        if j >= 0:
            return line[:i] + line[j + len(ESCAPE_MARK) :]
    i = line.rfind(CODE_MARK)
    if i >= 2 and line[i - 2 : i] == "  ":
        rest = line[: i - 2]
        code = rest.lstrip(" \t")
        return rest[: len(rest) - len(code)] + line[i + len(CODE_MARK) :] + code
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
        lines = mask_cell(src)
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
        src = "\n".join(unmask_line(ln) for ln in cells[i])
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
