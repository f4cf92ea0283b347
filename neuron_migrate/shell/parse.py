"""Launchers and job files as `Doc`s: environment assignments and commands with exact character ranges.

Shell (`.sh`, `.bash`, `.slurm`, `.sbatch`, Dockerfile `RUN`/`CMD`/`ENTRYPOINT` shell forms, shell scripts in YAML)
is parsed with tree-sitter-bash: it reads what real launchers contain (`$((...))`, arrays, `[[ ]]`, `case`,
here-documents, functions), where bashlex raises on arithmetic, arrays, `[[` and `case`. A region tree-sitter
marks as an error is a parse problem: the file is reported and never rewritten. Dockerfile instructions, `.env`
lines and YAML structure have their own (small, non-shell) grammars, read here; `#` comments everywhere take the
same suppression comments as Python.

Sites:
- `env` (key: variable name): an assignment. data: value (literal text or None when it expands something),
  raw (source of the value), delete (start, end) range that removes it keeping the rest valid (None: cannot),
  form (export, assign, prefix, docker-env, dotenv, yaml-list, yaml-map).
- `env-read` (key: variable name): `$NAME` / `${NAME...}`.
- `command` (key: command name): data: words [(text, start, end)] (text unquoted when literal, else None;
  the first is the command name), style ("shell" or "json"), delete (range removing the whole statement or None),
  env_before {name: literal value or None} assignments seen earlier in the same script and on the command itself.
"""
from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Optional

from neuron_migrate.rules.text_runner import Doc, TextSite

_STATEMENT_PARENTS = {"program", "do_group", "compound_statement", "if_statement", "elif_clause", "else_clause",
                      "case_item", "subshell", "function_definition"}
_STATEMENTS = {"command", "declaration_command", "variable_assignment", "redirected_statement", "pipeline", "list",
               "if_statement", "for_statement", "while_statement", "case_statement", "function_definition",
               "compound_statement", "subshell", "unset_command", "c_style_for_statement", "test_command",
               "negated_command", "variable_assignments"}


@lru_cache(maxsize=1)
def _parser():
    import tree_sitter as ts
    import tree_sitter_bash as tsb

    return ts.Parser(ts.Language(tsb.language()))


def parse(kind: str, text: str, path: str) -> Doc:
    doc = Doc(path, kind, text)
    doc.extra["env_order"] = []  # every env site in order (rules look at earlier assignments)
    if kind == "shell":
        _shell(doc, text, [], 0, len(text))
    elif kind == "dockerfile":
        _dockerfile(doc)
    elif kind == "env":
        _dotenv(doc)
    elif kind == "yaml":
        _yaml(doc)
    return doc


# -- shell ---------------------------------------------------------------------------------------------
def _literal(node, src: bytes) -> Optional[str]:
    """The value of a word node when it expands nothing (quotes removed), else None."""
    t = node.type
    raw = src[node.start_byte:node.end_byte].decode("utf-8", "surrogateescape")
    if t in ("word", "number"):
        return None if any(c in raw for c in "$`*?[{\\") else raw
    if t == "raw_string":
        return raw[1:-1]
    if t == "string":
        if any(c.type not in ("string_content",) for c in node.named_children):
            return None
        inner = raw[1:-1]
        return None if "\\" in inner else inner
    if t == "concatenation":
        parts = [_literal(c, src) for c in node.children]
        return None if any(p is None for p in parts) else "".join(parts)
    return None


class _Mapper:
    """Maps byte offsets of the parsed buffer to character offsets of the document."""

    def __init__(self, buf: str, base: int, table: Optional[list[int]] = None):
        self.buf = buf
        self.base = base
        self.table = table  # char index in buf -> char offset in the document (for re-indented YAML blocks)
        enc = buf.encode("utf-8", "surrogateescape")
        self.ascii = len(enc) == len(buf)
        if not self.ascii:
            self.b2c = {}
            b = 0
            for i, ch in enumerate(buf):
                self.b2c[b] = i
                b += len(ch.encode("utf-8", "surrogateescape"))
            self.b2c[b] = len(buf)

    def __call__(self, byte: int) -> int:
        c = byte if self.ascii else self.b2c[byte]
        if self.table is not None:
            return self.table[c] if c < len(self.table) else self.table[-1] + 1
        return self.base + c


def _shell(doc: Doc, buf: str, _unused, base: int, _end: int, table: Optional[list[int]] = None, env_order=None) -> None:
    """Parse `buf` (the document text from `base`, or mapped through `table`) and add its sites."""
    src = buf.encode("utf-8", "surrogateescape")
    tree = _parser().parse(src)
    m = _Mapper(buf, base, table)
    env_seen: dict = {}
    stack = [tree.root_node]
    order = []
    while stack:  # pre-order, in source order
        n = stack.pop()
        order.append(n)
        stack.extend(reversed(n.children))
    for n in order:
        if n.type == "ERROR" or n.is_missing:
            doc.problems.append((m(n.start_byte), m(n.end_byte), "shell syntax the parser could not read"))
        elif n.type == "variable_assignment":
            _assignment(doc, n, src, m, env_seen)
        elif n.type == "command":
            _command(doc, n, src, m, env_seen)
        elif n.type in ("simple_expansion", "expansion"):
            name = next((c for c in n.named_children if c.type == "variable_name"), None)
            if name is not None:
                key = src[name.start_byte:name.end_byte].decode()
                doc.add(TextSite("env-read", key, m(n.start_byte), m(n.end_byte), m(n.start_byte), m(n.end_byte)))


def _statement_of(n):
    """The statement node holding `n` (its topmost ancestor below a statement list)."""
    cur = n
    while cur.parent is not None and cur.parent.type not in _STATEMENT_PARENTS:
        cur = cur.parent
    return cur


def _deletable(doc: Doc, stmt, m) -> Optional[tuple[int, int]]:
    """The line range deleting `stmt` when that leaves valid shell: alone on its lines, and not the only
    statement of its block (an empty `then ... fi` is a syntax error)."""
    parent = stmt.parent
    if parent is None:
        return None
    if parent.type != "program":
        cond = parent.child_by_field_name("condition")
        body = [c for c in parent.named_children if c.type in _STATEMENTS and c != cond]
        if len(body) < 2 or stmt == cond:
            return None
    a, b = m(stmt.start_byte), m(stmt.end_byte)
    if not doc.alone_on_lines(a, b):
        return None
    return doc.line_range(a, b)


def _assignment(doc: Doc, n, src: bytes, m, env_seen: dict) -> None:
    name = n.child_by_field_name("name")
    if name is None or name.type != "variable_name":
        return
    key = src[name.start_byte:name.end_byte].decode()
    value = n.child_by_field_name("value")
    lit = "" if value is None else _literal(value, src)
    raw = "" if value is None else src[value.start_byte:value.end_byte].decode("utf-8", "surrogateescape")
    parent = n.parent
    start, end = m(n.start_byte), m(n.end_byte)
    delete = None
    if parent is not None and parent.type == "declaration_command":
        form = src[parent.start_byte:parent.end_byte].split()[0].decode()  # export, declare, local, readonly
        assigns = [c for c in parent.named_children if c.type in ("variable_assignment", "variable_name", "word")]
        if len(assigns) == 1:
            delete = _deletable(doc, parent, m) if _statement_of(parent) == parent else None  # not inside `a && b`
        else:
            delete = _list_item_range(assigns, n, m)
        stmt = parent
    elif parent is not None and parent.type == "command":
        form = "prefix"
        nxt = n.next_sibling
        delete = (start, m(nxt.start_byte)) if nxt is not None else None
        stmt = parent
    else:
        form = "assign"
        stmt = n if parent is None or parent.type != "variable_assignments" else parent
        delete = (_deletable(doc, n, m) if _statement_of(n) == n else None) if stmt is n else _list_item_range(
            [c for c in parent.named_children if c.type == "variable_assignment"], n, m)
    if value is not None and value.type == "array":
        lit = None
    site = doc.add(TextSite("env", key, start, end, m(stmt.start_byte), m(stmt.end_byte),
                            {"value": lit, "raw": raw, "delete": delete, "form": form,
                             "value_range": (m(value.start_byte), m(value.end_byte)) if value is not None else (end, end)}))
    doc.extra["env_order"].append(site)
    if form != "prefix":
        env_seen[key] = lit


def _list_item_range(items, n, m) -> Optional[tuple[int, int]]:
    """Range removing item `n` from a space-separated list of `items` (with its separating blanks)."""
    i = next((j for j, c in enumerate(items) if c == n), None)
    if i is None:
        return None
    if i + 1 < len(items):
        return m(n.start_byte), m(items[i + 1].start_byte)
    return m(items[i - 1].end_byte), m(n.end_byte)


def _command(doc: Doc, n, src: bytes, m, env_seen: dict) -> None:
    name = n.child_by_field_name("name")
    if name is None:
        return
    words = []
    prefix = {}
    for c in n.named_children:
        if c.type == "variable_assignment":
            k = c.child_by_field_name("name")
            v = c.child_by_field_name("value")
            prefix[src[k.start_byte:k.end_byte].decode()] = "" if v is None else _literal(v, src)
            continue
        if c.type in ("file_redirect", "herestring_redirect", "heredoc_redirect", "comment"):
            continue
        node = c.named_children[0] if c.type == "command_name" and c.named_children else c
        words.append((_literal(node, src), m(c.start_byte), m(c.end_byte)))
    if not words or words[0][0] is None:
        return
    stmt = _statement_of(n)
    env_before = dict(env_seen)
    env_before.update(prefix)
    doc.add(TextSite("command", words[0][0], words[0][1], words[-1][2], m(stmt.start_byte), m(stmt.end_byte),
                     {"words": words, "style": "shell", "delete": _deletable(doc, stmt, m) if stmt == n or
                      (stmt.type == "redirected_statement" and stmt.named_children and stmt.named_children[0] == n) else None,
                      "env_before": env_before, "statement": (m(stmt.start_byte), m(stmt.end_byte))}))


# -- Dockerfile ----------------------------------------------------------------------------------------
_INSTR = re.compile(r"^([ \t]*)([A-Za-z]+)([ \t]+|$)", re.M)


def _instructions(text: str):
    """(keyword, start of arguments, end of instruction) for each instruction, continuation lines joined."""
    i = 0
    n = len(text)
    while i < n:
        j = text.find("\n", i)
        j = n if j < 0 else j
        line = text[i:j]
        if not line.strip() or line.lstrip().startswith("#"):
            i = j + 1
            continue
        mt = _INSTR.match(text, i)
        if not mt or mt.start() != i:
            i = j + 1
            continue
        end = j
        while end < n and text[:end].rstrip("\r").endswith("\\"):
            nxt = text.find("\n", end + 1)
            end = n if nxt < 0 else nxt
        yield mt.group(2).upper(), mt.end(), end, i
        i = end + 1


def _dockerfile(doc: Doc) -> None:
    text = doc.text
    env_seen: dict = {}
    for kw, a, b, line_start in _instructions(text):
        args = text[a:b]
        if kw in ("ENV", "ARG"):
            _docker_env(doc, kw, a, b, line_start, env_seen)
        elif kw in ("RUN", "CMD", "ENTRYPOINT"):
            stripped = args.lstrip()
            if stripped.startswith("["):
                _docker_exec_form(doc, kw, a + len(args) - len(stripped), b, line_start, env_seen)
            else:
                before = len(doc.sites)
                _shell(doc, args, [], a, b)
                for s in doc.sites[before:]:
                    if s.kind == "command":
                        s.data["env_before"] = {**env_seen, **s.data["env_before"]}
                        if s.data.get("statement") == (a, b) or (s.data.get("delete") and kw == "RUN"):
                            s.data["delete"] = None  # deleting the only command of a RUN leaves an empty instruction


def _docker_env(doc: Doc, kw: str, a: int, b: int, line_start: int, env_seen: dict) -> None:
    args = doc.text[a:b]
    if "=" not in args.split(None, 1)[0] if args.strip() else True:
        # legacy `ENV NAME value`: one variable per instruction
        parts = args.split(None, 1)
        if not parts:
            return
        key = parts[0]
        k0 = a + args.index(key)
        value = parts[1].strip() if len(parts) > 1 else ""
        v0 = doc.text.find(value, k0 + len(key), b) if value else b
        site = doc.add(TextSite("env", key, k0, k0 + len(key), line_start, b,
                                {"value": value if "$" not in value else None, "raw": value, "form": "docker-env",
                                 "delete": doc.line_range(line_start, b), "value_range": (v0, v0 + len(value))}))
        doc.extra["env_order"].append(site)
        env_seen[key] = site.data["value"]
        return
    # `ENV A=1 B="x y"` has shell word syntax: parse it as an `export` line, mapped back
    buf = "export " + args
    table = [max(0, a - 7 + i) for i in range(7)] + list(range(a, b))
    before = len(doc.sites)
    _shell(doc, buf, [], 0, len(buf), table=table)
    new = doc.sites[before:]
    doc.sites[before:] = [s for s in new if s.kind == "env"]
    envs = doc.sites[before:]
    for s in envs:
        s.data["form"] = "docker-env"
        s.stmt_start, s.stmt_end = line_start, b
        if len(envs) == 1:
            s.data["delete"] = doc.line_range(line_start, b)
        env_seen[s.key] = s.data["value"]
    del doc.extra["env_order"][len(doc.extra["env_order"]) - len(envs):]
    doc.extra["env_order"].extend(envs)


def _docker_exec_form(doc: Doc, kw: str, a: int, b: int, line_start: int, env_seen: dict) -> None:
    """`CMD ["python", "train.py"]`: a command whose words are JSON strings."""
    text = doc.text[a:b]
    try:
        values = json.loads(text.replace("\\\n", " "))
    except ValueError:
        return
    if not isinstance(values, list) or not values or not all(isinstance(v, str) for v in values):
        return
    words = []
    pos = a
    for v in values:
        enc = json.dumps(v)
        k = doc.text.find(enc, pos, b)
        if k < 0:
            return  # written with escapes json.dumps would not produce: leave it
        words.append((v, k, k + len(enc)))
        pos = k + len(enc)
    doc.add(TextSite("command", values[0], words[0][1], words[-1][2], line_start, b,
                     {"words": words, "style": "json", "delete": None, "env_before": dict(env_seen),
                      "statement": (line_start, b)}))


# -- .env ----------------------------------------------------------------------------------------------
_DOTENV = re.compile(r"^[ \t]*(export[ \t]+)?([A-Za-z_][A-Za-z0-9_]*)[ \t]*=[ \t]*(.*?)[ \t]*$")


def _dotenv(doc: Doc) -> None:
    """KEY=VALUE lines (docker compose / python-dotenv syntax, which is not shell: values need no quotes)."""
    pos = 0
    for line in doc.text.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        mt = _DOTENV.match(body)
        if mt:
            value = mt.group(3)
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                lit = value[1:-1]
            else:
                lit = value.split(" #", 1)[0].strip()
            k0 = pos + mt.start(2)
            site = doc.add(TextSite("env", mt.group(2), k0, k0 + len(mt.group(2)), pos, pos + len(body),
                                    {"value": lit if "$" not in lit else None, "raw": value, "form": "dotenv",
                                     "delete": (pos, pos + len(line)), "value_range": (pos + mt.start(3), pos + mt.end(3))}))
            doc.extra["env_order"].append(site)
        pos += len(line)


# -- YAML job specs ------------------------------------------------------------------------------------
_ENV_KEYS = {"env", "environment", "variables", "envs", "env_vars", "environment_variables"}
_SCRIPT_KEYS = {"command", "script", "run", "cmd", "entrypoint", "before_script", "after_script", "args", "pre_run",
                "setup", "commands"}
# keys whose list items are each a shell line (CI scripts); under command/args an item is one argv word unless
# it spans lines (the script of `bash -c`)
_SCRIPT_LIST_KEYS = {"script", "run", "before_script", "after_script", "commands", "setup", "pre_run"}


def _yaml(doc: Doc) -> None:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        roots = list(yaml.compose_all(doc.text, Loader=loader))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = mark.index if mark is not None else 0
        doc.problems.append((at, at, f"invalid YAML: {getattr(exc, 'problem', exc)}"))
        return
    for root in roots:
        if root is not None:
            _yaml_walk(doc, root, None)


def _yaml_walk(doc: Doc, node, key: Optional[str]) -> None:
    import yaml

    env_key = (key or "").lower() in _ENV_KEYS  # also SageMaker/CloudFormation `Environment:`
    if isinstance(node, yaml.MappingNode):
        if env_key:
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode) and isinstance(v, yaml.ScalarNode):
                    _yaml_env(doc, k.value, k, v, (k.start_mark.index, v.end_mark.index), "yaml-map", len(node.value))
        for k, v in node.value:
            _yaml_walk(doc, v, k.value if isinstance(k, yaml.ScalarNode) else None)
    elif isinstance(node, yaml.SequenceNode):
        if key in _ARGV_KEYS and _yaml_argv(doc, node):
            return
        for item in node.value:
            if env_key and isinstance(item, yaml.MappingNode):
                fields = {k.value: v for k, v in item.value if isinstance(k, yaml.ScalarNode)}
                name, value = fields.get("name"), fields.get("value")
                if isinstance(name, yaml.ScalarNode) and (value is None or isinstance(value, yaml.ScalarNode)):
                    _yaml_env(doc, name.value, name, value, (item.start_mark.index, item.end_mark.index), "yaml-list", len(node.value))
                    continue
            if key in _SCRIPT_KEYS and isinstance(item, yaml.ScalarNode):
                if key in _SCRIPT_LIST_KEYS or "\n" in item.value.rstrip("\n") or item.style == "|":
                    _yaml_script(doc, item)
            else:
                _yaml_walk(doc, item, key)
    elif isinstance(node, yaml.ScalarNode) and key in _SCRIPT_KEYS:
        _yaml_script(doc, node)


_ARGV_KEYS = {"command", "args", "entrypoint", "cmd"}


def _yaml_argv(doc: Doc, seq) -> bool:
    """`command: ["python", "train.py"]` (Kubernetes, compose): one argv word per item, as a command site."""
    import yaml

    items = seq.value
    if not items or not all(isinstance(i, yaml.ScalarNode) for i in items) or not re.match(r"^python(3(\.\d+)?)?$", items[0].value):
        return False
    words = []
    for i in items:
        a, b = i.start_mark.index, i.end_mark.index
        raw = doc.text[a:b]
        q = raw[:1] if raw[:1] in "\"'" else ""
        literal = raw == i.value or (q and raw[1:-1] == i.value)
        words.append((i.value if literal else None, a, b))
    style = "yaml-flow" if seq.flow_style else "yaml-block"
    site = doc.add(TextSite("command", items[0].value, words[0][1], words[-1][2], seq.start_mark.index, seq.end_mark.index,
                            {"words": words, "style": style, "delete": None, "statement": (seq.start_mark.index, seq.end_mark.index)}))
    site.data["env_before"] = {}  # filled from the file's env entries by the rules (they come later in the text)
    return True


def _yaml_env(doc: Doc, name: str, name_node, value_node, item: tuple[int, int], form: str, siblings: int) -> None:
    a, b = item
    if form == "yaml-list":  # the `- ` of the item is before the mapping's first key
        dash = doc.text.rfind("-", 0, a)
        if dash >= 0 and not doc.text[dash + 1:a].strip():
            a = dash
    while b > a and doc.text[b - 1] in " \t\r\n":
        b -= 1
    # deleted only as whole lines of a block collection that keeps another entry (an emptied `env:` is null)
    delete = doc.line_range(a, b) if siblings > 1 and doc.alone_on_lines(a, b) and doc.text[a:b][:1] not in "{[" else None
    value = None if value_node is None else value_node.value
    vr = (value_node.start_mark.index, value_node.end_mark.index) if value_node is not None else (b, b)
    site = doc.add(TextSite("env", name, name_node.start_mark.index, name_node.end_mark.index, a, b,
                            {"value": value, "raw": doc.text[vr[0]:vr[1]], "form": form, "delete": delete, "value_range": vr}))
    doc.extra["env_order"].append(site)


def _yaml_script(doc: Doc, node) -> None:
    """A scalar holding shell: parsed when its source maps character by character onto its value."""
    a, b = node.start_mark.index, node.end_mark.index
    raw = doc.text[a:b]
    value = node.value
    table = None
    if node.style in (None, "") and raw == value:
        table = list(range(a, b))
    elif node.style in ("'", '"') and raw[1:-1] == value and "\\" not in value and "\n" not in raw:
        table = list(range(a + 1, b - 1))
    elif node.style == "|":
        # literal block: each value line is a source line with the block's indentation removed
        lines = value.split("\n")
        body_start = doc.text.find("\n", a) + 1
        pos = body_start
        table = []
        for i, ln in enumerate(lines):
            if i == len(lines) - 1 and ln == "":
                break
            eol = doc.text.find("\n", pos)
            eol = len(doc.text) if eol < 0 else eol
            src_line = doc.text[pos:eol]
            if not ln:
                if src_line.strip():
                    return
                table.append(eol)
            else:
                k = src_line.find(ln)
                if k < 0 or src_line[:k].strip() or src_line[k + len(ln):].strip():
                    return
                table.extend(range(pos + k, pos + k + len(ln)))
                table.append(eol)
            pos = eol + 1
        if len(table) < len(value):
            table.extend([table[-1] if table else a] * (len(value) - len(table)))
    if table is None or len(table) != len(value):
        return
    _shell(doc, value, [], 0, len(value), table=table)
