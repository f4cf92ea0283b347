"""Device pickers over several backends: the neuron branch NM203 inserts.

The most common device choice in CUDA programs tests several backends in order and falls back to the CPU:

    use_cuda = not args.no_cuda and torch.cuda.is_available()
    use_mps = not args.no_mps and torch.backends.mps.is_available()
    if use_cuda:
        device = torch.device("cuda")
    elif use_mps:
        device = torch.device("mps")
    else:
        device = torch.device("cpu")

On a Trainium host every test is False and the program trains on the host CPU. A rewrite of the CUDA branch
would break the GPU and Mac runs the program still has; the picker instead gets a neuron branch before its CPU
fallback, `elif torch.accelerator.is_available() and torch.accelerator.current_accelerator().type == "neuron":`
(TorchNeuron registers the `neuron` device with torch.accelerator), whose body is the other accelerator's branch
with its device name changed (or `device = torch.device("neuron")`). On a GPU or a Mac the earlier branches still
come first; `--no-cuda` on a GPU host still ends on the CPU (the new test asks for `neuron` by name).

This module only reads the tree; NM203 (cuda_device.py) builds the fix.
"""
from __future__ import annotations

import ast

from neuron_migrate.program import cached, device_flow

TORCH = "\x00torch\x00"  # where the fix writes the module's name for torch
NEURON_TEST = '{torch}.accelerator.is_available() and {torch}.accelerator.current_accelerator().type == "neuron"'


class Picker:
    """One if/elif/else chain that picks a device: its branches (test, body), the CUDA branch and the other
    accelerator's branch, the final else, and the neuron body to insert (None: no fix)."""

    def __init__(self, top, branches: list, orelse, cuda_index: int, other_index: int, other_kind: str):
        self.top = top  # an ast.If, or an ast.IfExp (`"cuda" if ... else "mps" if ... else "cpu"`)
        self.branches = branches  # [(If node, test, body)]
        self.orelse = orelse
        self.cuda_index = cuda_index
        self.other_index = other_index
        self.other_kind = other_kind


def _chain(top: ast.If):
    """The branches of an if/elif chain (`elif` is a nested If at the chain's own column; `else:` holding an `if`
    is indented deeper) and its final else body."""
    branches = []
    node = top
    while True:
        branches.append(node)
        if len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If) and node.orelse[0].col_offset == top.col_offset:
            node = node.orelse[0]
            continue
        return branches, node.orelse


def _expr_chain(top: ast.IfExp):
    """The branches of `a if t1 else b if t2 else c` and its final value."""
    branches = []
    node = top
    while isinstance(node, ast.IfExp):
        branches.append(node)
        node = node.orelse
    return branches, node


def _backend_of_test(test, fn, ctx, assigns) -> set:
    """Backends whose availability the test asks about: availability calls in it, or names assigned from them."""
    out: set = set()
    a = ctx.analysis
    for node in ast.walk(test):
        if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)):
            q = a.resolve(node.func, a.module_scope, count_use=False)
            kind = device_flow._AVAILABILITY.get(q or "")
            if kind:
                out.add(kind)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in assigns and not isinstance(node.id, tuple):
            out |= assigns[node.id]
        elif isinstance(node, ast.Attribute) and node.attr == "is_available" and isinstance(node.value, ast.Attribute) \
                and node.value.attr == "accelerator":
            out.add("accelerator")
    return out


def _availability_names(fn_body, ctx) -> dict:
    """name -> backends of `use_cuda = ... torch.cuda.is_available()` style assignments in the statements."""
    out: dict = {}
    a = ctx.analysis
    for stmt in fn_body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                kinds = set()
                for sub in ast.walk(node.value):
                    if isinstance(sub, ast.Call) and isinstance(sub.func, (ast.Name, ast.Attribute)):
                        kind = device_flow._AVAILABILITY.get(a.resolve(sub.func, a.module_scope, count_use=False) or "")
                        if kind:
                            kinds.add(kind)
                if kinds:
                    out.setdefault(node.targets[0].id, set()).update(kinds)
                    out.setdefault(("lines", node.targets[0].id), set()).update(range(node.lineno, node.end_lineno + 1))
    return out


def pickers(ctx) -> list:
    """Every device picker of the file (cached per analysis)."""

    def build(a):
        out = []
        # a picker tests CUDA's availability and another backend's: without both calls in the file, none (the walk of
        # the whole tree below is the costly part)
        kinds = {device_flow._AVAILABILITY[q] for q in device_flow._AVAILABILITY if q in a.qualnames}
        if "cuda" not in kinds or len(kinds) < 2:
            return out
        flow = device_flow.facts(a)
        names_of: dict = {}
        inner: set = set()
        for node in ast.walk(a.tree):
            if not isinstance(node, (ast.If, ast.IfExp)) or id(node) in inner:
                continue
            branches, orelse = _chain(node) if isinstance(node, ast.If) else _expr_chain(node)
            for b in branches[1:]:
                inner.add(id(b))
            if len(branches) < 2 or not orelse:
                continue
            fn = flow.function_of(node)
            key = id(fn) if fn is not None else 0
            if key not in names_of:
                names_of[key] = _availability_names(fn.body if fn is not None else a.tree.body, ctx)
            assigns = names_of[key]
            kinds = [_backend_of_test(b.test, fn, ctx, assigns) for b in branches]
            if any("neuron" in k or "accelerator" in k for k in kinds):
                continue  # it already has a neuron (or device-agnostic) branch
            cuda = [i for i, k in enumerate(kinds) if k == {"cuda"}]
            others = [i for i, k in enumerate(kinds) if len(k) == 1 and k != {"cuda"}]
            if not cuda or not others:
                continue
            other = others[0]
            p = Picker(node, branches, orelse, cuda[0], other, next(iter(kinds[other])))
            # the lines the picker decides from: its own and those of the availability names its tests read
            p.lines = set(range(node.lineno, node.end_lineno + 1))
            for b in branches:
                for n in ast.walk(b.test):
                    if isinstance(n, ast.Name):
                        p.lines |= assigns.get(("lines", n.id), set())
            out.append(p)
        return out

    return cached(ctx.analysis, "device-pickers", build)


def picker_of(site, ctx):
    """The picker whose CUDA branch this `torch.cuda.is_available()` site decides: the site is in that branch's test,
    or in the assignment of a name the test reads (`use_cuda = ... torch.cuda.is_available()`)."""
    node = site.node
    a = ctx.analysis
    for p in pickers(ctx):
        test = p.branches[p.cuda_index].test
        if any(sub is node for sub in ast.walk(test)):
            return p
        names = {n.id for n in ast.walk(test) if isinstance(n, ast.Name)}
        up = a.parent_of.get(node)
        while up is not None and not isinstance(up, ast.stmt):
            up = a.parent_of.get(up)
        if isinstance(up, ast.Assign) and len(up.targets) == 1 and isinstance(up.targets[0], ast.Name) \
                and up.targets[0].id in names and up.lineno < p.top.lineno:
            fn = device_flow.facts(a).function_of
            if fn(up) is fn(p.top):
                return p
    return None


def _neuron_value(p: Picker, ctx):
    """The neuron value of an expression picker: the other accelerator's value (`"mps"`, `torch.device("mps")`) with
    its device name changed; None for anything else."""
    body = p.branches[p.other_index].body
    a = ctx.analysis
    target = body
    if isinstance(body, ast.Call) and a.resolve(body.func, a.module_scope, count_use=False) == "torch.device" \
            and len(body.args) == 1 and not body.keywords:
        target = body.args[0]
    if not (isinstance(target, ast.Constant) and isinstance(target.value, str) and target.value == p.other_kind):
        return None
    raw = a.source(target)
    return a.source(body).replace(raw, raw.replace(p.other_kind, "neuron", 1))


def neuron_body(p: Picker, ctx):
    """(body, indent) of the neuron branch, the body relative to `indent` (TORCH where torch is named): the other accelerator's branch with its
    device name changed, when that name appears there only as device strings; else `name = torch.device("neuron")`
    where every branch assigns `name`; else None."""
    a = ctx.analysis
    branch = p.branches[p.other_index]
    kind = p.other_kind
    strings = []
    plain = True
    for stmt in branch.body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.split(":")[0] == kind:
                strings.append(node)
            elif isinstance(node, (ast.Name, ast.Attribute)):
                q = a.resolve(node, a.module_scope, count_use=False) if isinstance(node, (ast.Name, ast.Attribute)) else None
                word = node.id if isinstance(node, ast.Name) else node.attr
                if kind in word.lower() or (q and ("." + kind) in q):
                    plain = False
    if strings and plain:
        first = branch.body[0]
        last = branch.body[-1]
        text = "\n".join(ln.rstrip("\r\n") for ln in a.lines[first.lineno - 1:last.end_lineno])
        indent = len(a.lines[first.lineno - 1]) - len(a.lines[first.lineno - 1].lstrip(" "))
        for s in strings:
            raw = a.source(s)
            text = text.replace(raw, raw.replace(kind, "neuron", 1))
        text = _without_comments(text)
        if text is None:
            return None
        return "\n".join(ln[indent:] if ln.startswith(" " * indent) else ln for ln in text.split("\n")), indent
    targets = []
    for b in [*[br.body for br in p.branches], p.orelse]:
        names = {t.id for s in b if isinstance(s, ast.Assign) for t in s.targets if isinstance(t, ast.Name)}
        targets.append(names)
    common = set.intersection(*targets) if targets else set()
    if len(common) == 1:
        name = next(iter(common))
        first = p.orelse[0]
        indent = len(a.lines[first.lineno - 1]) - len(a.lines[first.lineno - 1].lstrip(" "))
        return f'{name} = {TORCH}.device("neuron")', indent
    return None


def insert_branch(p: Picker, ctx, fx) -> bool:
    """Add to `fx` the edit that inserts the neuron branch before the picker's final else; False when the chain's
    text cannot take it (no `else:` line found)."""
    a = ctx.analysis
    if isinstance(p.top, ast.IfExp):
        value = _neuron_value(p, ctx)
        if value is None:
            return False
        torch = fx.ref("torch")
        fx.replace(p.orelse, f"{value} if {NEURON_TEST.format(torch=torch)} else {a.source(p.orelse)}")
        return True
    made = neuron_body(p, ctx)
    if made is None:
        return False
    body, indent = made
    col = p.top.col_offset
    first = p.orelse[0]
    else_line = None
    for ln in range(first.lineno - 1, p.branches[-1].body[-1].end_lineno, -1):
        text = a.lines[ln - 1]
        if text.strip().startswith("else") and len(text) - len(text.lstrip(" ")) == col:
            else_line = ln
            break
    if else_line is None or first.lineno == else_line:  # `else: x = 1` on one line: leave it
        return False
    torch = fx.ref("torch")
    pad_col = " " * col
    rel = []
    for i, line in enumerate(a.lines[p.top.lineno - 1:p.top.end_lineno]):
        line = line.rstrip("\r\n")
        if i == 0:
            rel.append(line[col:])
        elif line.startswith(pad_col) or not line.strip():
            rel.append(line[col:])
        else:
            return False  # a line left of the chain (inside a multi-line string): leave it
    at = else_line - p.top.lineno
    pad = " " * (indent - col)
    new = [f"elif {NEURON_TEST.format(torch=torch)}:"] + [(pad + ln if ln else ln) for ln in body.replace(TORCH, torch).split("\n")]
    fx.replace(p.top, "\n".join(rel[:at] + new + rel[at:]))
    return True


def _without_comments(text: str):
    """The text with its comments cut (they speak of the other backend); None when it does not tokenize."""
    import io
    import tokenize

    lines = text.split("\n")
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(text + "\n").readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return None
    for tok in reversed(toks):
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            lines[row - 1] = lines[row - 1][:col].rstrip()
    return "\n".join(ln for ln in lines if ln.strip())


def picker_lines(ctx) -> set:
    """Lines of the file's device pickers (and of the availability names they read): NM203 speaks for them."""

    def build(_a):
        out: set = set()
        for p in pickers(ctx):
            fixable = _neuron_value(p, ctx) if isinstance(p.top, ast.IfExp) else neuron_body(p, ctx)
            if fixable is not None:
                out |= p.lines
        return out

    return cached(ctx.analysis, "device-picker-lines", build)
