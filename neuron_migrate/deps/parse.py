"""Dependency lists as `Doc`s: one `requirement` site per requirement string, with exact character ranges.

Formats: requirements*.txt (pip's line format), pyproject.toml `[project] dependencies` and
`[project.optional-dependencies]`, setup.py `install_requires=` / `extras_require=` literal lists (read with `ast`;
anything else is reported), setup.cfg `[options] install_requires` / `[options.extras_require]`, conda
environment.yml `dependencies` (conda specs) and its `pip:` list. Specifiers are parsed with `packaging`; TOML and
configparser read the semantics and a small scanner finds where each string is, the two cross-checked (a
mismatch is a parse problem: reported, never rewritten).

Site data: req (packaging Requirement, None for a conda spec), text (the requirement as written), spec_range
(where the version specifier is, or an empty range after the name: what a repin replaces), delete (range
removing the entry keeping the list valid, or None), style.
"""
from __future__ import annotations

import ast
import re
from typing import Optional

from neuron_migrate.rules.text_runner import Doc, TextSite

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse(kind: str, text: str, path: str) -> Doc:
    doc = Doc(path, kind, text)
    {"requirements": _requirements, "pyproject": _pyproject, "setup.py": _setup_py, "setup.cfg": _setup_cfg,
     "conda": _conda}[kind](doc)
    return doc


def _add(doc: Doc, raw: str, start: int, delete: Optional[tuple[int, int]], style: str, stmt=None, conda: bool = False) -> None:
    """A requirement written as `raw` at `start`."""
    from packaging.requirements import InvalidRequirement, Requirement

    body = raw
    req = None
    if conda:
        m = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)", body)
        if not m:
            return
        name = m.group(1)
        spec_a = start + m.end()
    else:
        try:
            req = Requirement(body.strip())
        except InvalidRequirement:
            return
        m = _NAME.match(body)
        if not m:
            return
        name = req.name
        spec_a = start + m.end()
    stop = len(body)
    for sep in (";", "@", "#"):
        k = body.find(sep, spec_a - start)
        if k >= 0:
            stop = min(stop, k)
    spec_b = start + len(body[:stop].rstrip())
    spec_b = max(spec_a, spec_b)
    st = stmt or (start, start + len(raw))
    doc.add(TextSite("requirement", canonical(name), start, start + len(raw.rstrip()), st[0], st[1],
                     {"req": req, "text": raw.strip(), "spec": doc.text[spec_a:spec_b].strip(), "spec_range": (spec_a, spec_b),
                      "delete": delete, "style": style, "conda": conda}))


# -- requirements.txt ----------------------------------------------------------------------------------
def _requirements(doc: Doc) -> None:
    text = doc.text
    pos = 0
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        a = pos
        chunk = lines[i]
        pos += len(lines[i])
        i += 1
        while chunk.rstrip("\r\n").endswith("\\") and i < len(lines):  # continuation lines
            chunk += lines[i]
            pos += len(lines[i])
            i += 1
        logical = chunk.rstrip("\r\n")
        stripped = logical.lstrip()
        if not stripped or stripped.startswith(("#", "-")):
            continue  # comments and options (-r, -e, --index-url, ...)
        body = re.split(r"\s+#", logical, maxsplit=1)[0]
        body = re.split(r"\s+--?[a-z]", body, maxsplit=1)[0]  # per-requirement options (--hash=...)
        body = body.rstrip(" \\\t")
        lead = len(logical) - len(stripped)
        _add(doc, body[lead:], a + lead, (a, pos), "line", stmt=(a, a + len(logical)))


# -- lists of quoted strings (pyproject arrays, setup.py lists) ---------------------------------------
def _element_delete(doc: Doc, a: int, b: int, items: list[tuple[int, int]], k: int) -> Optional[tuple[int, int]]:
    """Range removing element k (source range a..b of a quoted string) from a bracketed list of `items`."""
    text = doc.text
    if len(items) < 2:
        return None  # an emptied list is valid, but the package list then says nothing: reported instead
    after = b
    m = re.compile(r"\s*,").match(text, after)
    if m:
        after = m.end()
    if doc.alone_on_lines(a, after):
        return doc.line_range(a, after)
    if k + 1 < len(items):
        return a, items[k + 1][0]
    return items[k - 1][1], b


def _scan_array(text: str, i: int) -> Optional[tuple[list[tuple[int, int, str]], int]]:
    """From `[` at i: the string elements (start, end, value) of a TOML array and the index after `]`."""
    assert text[i] == "["
    j = i + 1
    out = []
    while j < len(text):
        c = text[j]
        if c in " \t\r\n,":
            j += 1
        elif c == "#":
            j = text.find("\n", j)
            if j < 0:
                return None
        elif c == "]":
            return out, j + 1
        elif c in "\"'":
            q = c * 3 if text.startswith(c * 3, j) else c
            k = j + len(q)
            while True:
                e = text.find(q, k)
                if e < 0:
                    return None
                if c == '"' and text[e - 1] == "\\":
                    k = e + 1
                    continue
                break
            out.append((j, e + len(q), text[j + len(q):e]))
            j = e + len(q)
        else:
            return None  # inline tables, nested arrays: not a list of requirement strings
    return None


def _pyproject(doc: Doc) -> None:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    try:
        data = tomllib.loads(doc.text)
    except tomllib.TOMLDecodeError as exc:
        doc.problems.append((0, 0, f"invalid TOML: {exc}"))
        return
    project = data.get("project") or {}
    wanted: list[tuple[str, Optional[str], list]] = []
    if isinstance(project.get("dependencies"), list):
        wanted.append(("project", "dependencies", project["dependencies"]))
    for extra, deps in (project.get("optional-dependencies") or {}).items():
        if isinstance(deps, list):
            wanted.append(("project.optional-dependencies", extra, deps))
    if not wanted:
        return
    tables = _toml_tables(doc.text)
    for table, key, values in wanted:
        found = None
        for a, b in tables.get(table, []):
            m = re.compile(rf"(?m)^[ \t]*(\"?{re.escape(key)}\"?)[ \t]*=[ \t]*\[").search(doc.text, a, b)
            if m:
                found = m.end() - 1
                break
        scanned = _scan_array(doc.text, found) if found is not None else None
        if scanned is None or [v for _, _, v in scanned[0]] != values:
            at = found or 0
            doc.problems.append((at, at, f"could not locate the {table} {key} list in the text"))
            continue
        items = [(a, b) for a, b, _ in scanned[0]]
        for k, (a, b, v) in enumerate(scanned[0]):
            q = 3 if doc.text.startswith(("'''", '"""'), a) else 1
            _add(doc, v, a + q, _element_delete(doc, a, b, items, k), "toml", stmt=(a, b))


def _toml_tables(text: str) -> dict[str, list[tuple[int, int]]]:
    """Table name -> [(start, end)] of its body (headers `[name]`; array tables are skipped)."""
    heads = [(m.start(), m.end(), m.group(1).strip().replace('"', "").replace(" ", ""))
             for m in re.finditer(r"(?m)^[ \t]*\[([^\[\]\n]+)\][ \t]*(?:#.*)?$", text)]
    out: dict = {}
    for i, (_s, e, name) in enumerate(heads):
        end = heads[i + 1][0] if i + 1 < len(heads) else len(text)
        out.setdefault(name, []).append((e, end))
    return out


# -- setup.py -----------------------------------------------------------------------------------------
def _setup_py(doc: Doc) -> None:
    try:
        tree = ast.parse(doc.text)
    except SyntaxError as exc:
        doc.problems.append((0, 0, f"invalid Python: {exc.msg} (line {exc.lineno})"))
        return
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        fname = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if fname != "setup":
            continue
        for kw in node.keywords:
            if kw.arg == "install_requires":
                _py_list(doc, kw.value, "install_requires")
            elif kw.arg == "extras_require":
                if isinstance(kw.value, ast.Dict):
                    for v in kw.value.values:
                        _py_list(doc, v, "extras_require")
                else:
                    _not_literal(doc, kw.value, "extras_require")


def _offset(doc: Doc, line: int, col_bytes: int) -> int:
    start = doc.lines.offset(line, 0)
    eol = doc.text.find("\n", start)
    ln = doc.text[start:eol if eol >= 0 else len(doc.text)]
    return start + len(ln.encode("utf-8")[:col_bytes].decode("utf-8", "replace"))


def _not_literal(doc: Doc, node, what: str) -> None:
    a = _offset(doc, node.lineno, node.col_offset)
    b = _offset(doc, node.end_lineno, node.end_col_offset)
    doc.add(TextSite("dynamic-deps", what, a, b, a, b, {}))


def _py_list(doc: Doc, node, what: str) -> None:
    if not isinstance(node, (ast.List, ast.Tuple)) or not all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
        _not_literal(doc, node, what)
        return
    spans = [(_offset(doc, e.lineno, e.col_offset), _offset(doc, e.end_lineno, e.end_col_offset)) for e in node.elts]
    for k, (e, (a, b)) in enumerate(zip(node.elts, spans)):
        raw = doc.text[a:b]
        q = 3 if raw[:3] in ("'''", '"""') else 1
        inner = raw[q:-q] if len(raw) >= 2 * q else raw
        prefix = raw[0].lower() in "rbuf" and raw[1:2] in "\"'"
        if inner != e.value or prefix:
            continue  # escapes or string prefixes: the value is not written literally; left alone
        _add(doc, inner, a + q, _element_delete(doc, a, b, spans, k), "py", stmt=(a, b))


# -- setup.cfg ----------------------------------------------------------------------------------------
def _setup_cfg(doc: Doc) -> None:
    text = doc.text
    section = None
    key = None
    pos = 0
    for line in text.splitlines(keepends=True):
        a = pos
        pos += len(line)
        body = line.rstrip("\r\n")
        s = body.strip()
        if s.startswith("[") and s.endswith("]"):
            section, key = s[1:-1].strip(), None
            continue
        if not s or s.startswith(("#", ";")):
            continue
        if body[:1] in " \t" and key is not None:  # continuation value line: one requirement
            lead = len(body) - len(body.lstrip())
            _add(doc, body.strip(), a + lead, (a, pos), "cfg", stmt=(a, a + len(body)))
            continue
        m = re.match(r"^([A-Za-z0-9_.-]+)\s*[=:]\s*(.*)$", body)
        if not m:
            key = None
            continue
        k = m.group(1)
        in_req = (section == "options" and k == "install_requires") or section == "options.extras_require"
        key = k if in_req else None
        if in_req and m.group(2).strip():
            v0 = a + m.start(2)
            _add(doc, m.group(2).strip(), v0, None, "cfg", stmt=(a, a + len(body)))


# -- conda environment.yml ----------------------------------------------------------------------------
def _conda(doc: Doc) -> None:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        root = yaml.compose(doc.text, Loader=loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        doc.problems.append((mark.index if mark else 0, mark.index if mark else 0, f"invalid YAML: {getattr(exc, 'problem', exc)}"))
        return
    if not isinstance(root, yaml.MappingNode):
        return
    for k, v in root.value:
        if isinstance(k, yaml.ScalarNode) and k.value == "dependencies" and isinstance(v, yaml.SequenceNode):
            _conda_list(doc, v, conda=True)


def _conda_list(doc: Doc, seq, conda: bool) -> None:
    import yaml

    for item in seq.value:
        if isinstance(item, yaml.MappingNode):
            for k, v in item.value:
                if isinstance(k, yaml.ScalarNode) and k.value == "pip" and isinstance(v, yaml.SequenceNode):
                    _conda_list(doc, v, conda=False)
            continue
        if not isinstance(item, yaml.ScalarNode):
            continue
        a, b = item.start_mark.index, item.end_mark.index
        raw = doc.text[a:b]
        q = 1 if raw[:1] in "\"'" else 0
        if raw[q:len(raw) - q] != item.value:
            continue
        dash = doc.text.rfind("-", 0, a)
        delete = None
        if dash >= 0 and not doc.text[dash + 1:a].strip() and doc.alone_on_lines(dash, b) and len(seq.value) > 1:
            delete = doc.line_range(dash, b)
        _add(doc, item.value, a + q, delete, "conda" if conda else "conda-pip", stmt=(a, b), conda=conda)
