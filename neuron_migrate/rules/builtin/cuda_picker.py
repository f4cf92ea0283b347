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

from neuron_migrate.names.analysis import walk
from neuron_migrate.program import cached, device_flow

TORCH = "\x00torch\x00"  # where the fix writes the module's name for torch
NEURON_TEST = '{torch}.accelerator.is_available() and {torch}.accelerator.current_accelerator().type == "neuron"'
_NEURON_TYPE = 'current_accelerator().type == "neuron"'  # in the text: a neuron branch may be there (picks_neuron)


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
        # the test of an earlier branch that is true on a Neuron host (`not torch.cuda.is_available() and not
        # torch.backends.mps.is_available()`, the "no accelerator" branch), in this chain or another picker of the
        # same function: a neuron branch would never run, so none is added (NM203 says why at the line)
        self.blocked = None
        self.flag = False  # the CUDA branch is chosen by a flag (`if args.cuda:`), not an availability test
        self.shared = False  # blocked: the scope shares a module between processes (`.share_memory()`, Hogwild)
        self.returns = False  # a chain of early returns (`if cuda: return ...` / `if mps: return ...` / `return cpu`)
        # no else: the assignment right before the chain is its fallback (`device = "cpu"` / `if cuda: device = "cuda"`
        # / `elif mps: device = "mps"`, build-nanogpt's and llm.c's picker); the neuron branch ends the chain
        self.default = False
        # the fallback's device is a setting (`torch.device(opt.device)`): no branch is added (blocked is that node)
        self.user_device = None


def if_chain(top: ast.If):
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
    for node in walk(test):
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
        for node in walk(stmt):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                kinds = set()
                for sub in walk(node.value):
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
        # one walk of the whole tree (the costly part) for both kinds of picker: the if chains and the functions
        # whose ifs return a device, each list in the walk's order
        chains, fns = [], []
        If, IfExp, FunctionDef, AsyncFunctionDef = ast.If, ast.IfExp, ast.FunctionDef, ast.AsyncFunctionDef
        for node in walk(a.tree):
            t = type(node)
            if t is If or t is IfExp:
                chains.append(node)
            elif t is FunctionDef or t is AsyncFunctionDef:
                fns.append(node)
        for node in chains:
            if id(node) in inner:
                continue
            branches, orelse = if_chain(node) if isinstance(node, ast.If) else _expr_chain(node)
            for b in branches[1:]:
                inner.add(id(b))
            default = False
            if not orelse and len(branches) >= 2 and isinstance(node, ast.If):
                orelse = _default_before(node, branches, a)
                default = bool(orelse)
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
            if not others:
                # `elif opt.mps: device = torch.device("mps")` (pytorch/examples' dcgan): a flag named for the backend
                # whose device the branch sets stands for that backend's branch
                for i, b in enumerate(branches):
                    kind = _flag_backend(b) if not kinds[i] and isinstance(b, ast.If) else None
                    if kind:
                        kinds[i] = {kind}
                        others.append(i)
            flag = not cuda
            if not cuda and others:
                # `if args.cuda: device = torch.device("cuda")` (word_language_model's --cuda flag): the user's request
                # for CUDA is the CUDA branch; on a Trainium host the new branch comes before the CPU fallback
                cuda = [i for i, b in enumerate(branches) if not kinds[i] and isinstance(b, ast.If)
                        and _names_cuda(b.test) and _sets_cuda_device(b.body)]
            if not cuda or not others:
                continue
            other = others[0]
            p = Picker(node, branches, orelse, cuda[0], other, next(iter(kinds[other])))
            p.flag = flag
            p.default = default
            # the lines the picker decides from: its own and those of the availability names its tests read
            p.lines = set(range(node.lineno, node.end_lineno + 1))
            for b in branches:
                for n in walk(b.test):
                    if isinstance(n, ast.Name):
                        p.lines |= assigns.get(("lines", n.id), set())
            p.fn = fn
            p.reach = None
            # `if opt.cuda: ...` / `else: device = torch.device(opt.device)` (pytorch/examples' super_resolution,
            # default "cpu"): without the CUDA flag the user's own device setting decides; a neuron branch before it
            # would override `--device cpu`. (Where availability picks CUDA, the setting is only the fallback for a
            # host without an accelerator, and the neuron branch does what the CUDA branch does.)
            p.user_device = _user_device(orelse) if flag else None
            if p.user_device is not None:
                p.blocked = p.user_device
            at = next((i for i, b in enumerate(branches) if _true_without_accelerator(b.test, fn, ctx, assigns)), None)
            if at is not None:
                # pytorch/examples' imagenet: `if not cuda and not mps: print("using CPU")` / `elif args.distributed:
                # if torch.cuda.is_available(): ...DDP...` / `elif mps:` / `else:`. A Neuron host must not take the CPU
                # branch, and in the branches it then reaches (tests that ask no backend) each CUDA-only block
                # gets its neuron twin: without that, the neuron branch is dead code (or DDP is skipped)
                p.reach = _reach(branches, at, kinds, fn, ctx, assigns)
                if p.reach is None:
                    p.blocked = branches[at].test
            out.append(p)
        out.extend(_return_pickers(fns, ctx, names_of))
        for p in out:
            shared = _shared_memory_call(p.fn, a) if p.blocked is None else None
            if shared is not None:
                # pytorch/examples' mnist_hogwild: `model.share_memory()`, then mp.Process workers train the one model;
                # only CPU tensors (and CUDA's, through IPC) can be shared: on a Neuron host it keeps the CPU
                p.blocked, p.shared = shared, True
        blocked = {id(p.fn): p.blocked for p in out if p.blocked is not None}
        for p in out:
            if p.blocked is None and id(p.fn) in blocked:
                p.blocked = blocked[id(p.fn)]  # one half of the function's device choice alone: neither
        return out

    return cached(ctx.analysis, "device-pickers", build)


def _user_device(orelse):
    """The setting a picker's fallback takes its device from (`opt.device` in `else: device = torch.device(opt.device)`,
    `args.device`, `cfg["device"]`, as an if chain's one assignment or a conditional expression's last value), or
    None when the fallback names its device itself."""
    value = orelse
    if isinstance(orelse, list):
        if len(orelse) != 1 or not isinstance(orelse[0], ast.Assign):
            return None
        value = orelse[0].value
    if (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "device"
            and len(value.args) == 1 and not value.keywords):
        value = value.args[0]
    return value if isinstance(value, (ast.Attribute, ast.Subscript)) else None


def flag_site(p: Picker, ctx):
    """The first 'cuda' string of a flag picker's CUDA branch: where NM201 reports the picker and its fix."""
    for stmt in p.branches[p.cuda_index].body:
        for n in walk(stmt):
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.split(":")[0] == "cuda":
                return n
    return None


def _own_nodes(fn, a):
    """The nodes of `fn`, or of the module's own code when fn is None (its functions and classes left out)."""
    if fn is not None:
        return walk(fn)
    return (n for st in a.tree.body if not isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            for n in walk(st))


def module_choice(ctx):
    """The line of the module's own device choice when it picks, or gets, neuron (build-nanogpt's module-level
    picker), else None (cached)."""
    a = ctx.analysis

    def build(_a):
        for p in pickers(ctx):
            if p.fn is None and p.blocked is None:
                return p.top.lineno
        if _NEURON_TYPE in a.text:
            for n in _own_nodes(None, a):
                if isinstance(n, ast.If) and _NEURON_TYPE in a.source(n.test):
                    return n.lineno
        return None

    return cached(a, "module-device-choice", build)


def _shared_memory_call(fn, a):
    """The first `<x>.share_memory()` call in `fn` (the module's own code when fn is None, functions left out), or None."""
    for n in _own_nodes(fn, a):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "share_memory" and not n.args:
            return n
    return None


def _default_before(top: ast.If, branches: list, a) -> list:
    """[the statement right before the chain] when it assigns the one name every branch of the chain assigns
    (`device = "cpu"` before `if torch.cuda.is_available(): device = "cuda"` / `elif ...: device = "mps"`): the
    chain's fallback; else []."""
    parent = a.parent_of.get(top)
    if parent is None:
        return []
    for field in ("body", "orelse", "finalbody"):
        stmts = getattr(parent, field, None)
        if isinstance(stmts, list) and any(s is top for s in stmts):
            break
    else:
        return []
    at = next(i for i, s in enumerate(stmts) if s is top)
    prev = stmts[at - 1] if at else None
    if not (isinstance(prev, ast.Assign) and len(prev.targets) == 1 and isinstance(prev.targets[0], ast.Name)):
        return []
    name = prev.targets[0].id
    for b in branches:
        if not any(isinstance(s, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in s.targets)
                   for s in b.body):
            return []
    return [prev]


def _names_cuda(test) -> bool:
    """The test reads a flag named for CUDA (`args.cuda`, `use_cuda`, `not args.no_cuda and ...` excluded)."""
    for n in walk(test):
        word = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else ""
        if word.lower() in ("cuda", "use_cuda", "use_gpu", "gpu"):
            return True
    return False


_FLAG_BACKENDS = ("mps", "xpu")


def _flag_backend(branch: ast.If):
    """The backend a branch picks when a flag named for it asks (`if args.mps: device = torch.device("mps")`)."""
    for kind in _FLAG_BACKENDS:
        named = any((n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else "").lower()
                    in (kind, f"use_{kind}") for n in walk(branch.test))
        if named and any(isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.split(":")[0] == kind
                         for stmt in branch.body for n in walk(stmt)):
            return kind
    return None


def _sets_cuda_device(body) -> bool:
    return any(isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.split(":")[0] == "cuda"
               for stmt in body for n in walk(stmt))


def _return_pickers(fns, ctx, names_of) -> list:
    """Pickers written as early returns (`if torch.cuda.is_available(): return torch.device("cuda")` / `if
    torch.backends.mps.is_available(): return torch.device("mps")` / `return torch.device("cpu")`): the ifs, each with
    one `return` and no else, right before the function's last return, the CPU fallback. `fns`: the file's
    functions, in the order of a walk of its tree."""
    out = []
    for fn in fns:
        body = fn.body
        last = body[-1]
        if not isinstance(last, ast.Return) or len(body) < 3:
            continue
        ifs = []
        for stmt in reversed(body[:-1]):
            if not (isinstance(stmt, ast.If) and not stmt.orelse and len(stmt.body) == 1
                    and isinstance(stmt.body[0], ast.Return)):
                break
            ifs.insert(0, stmt)
        if len(ifs) < 2:
            continue
        if id(fn) not in names_of:
            names_of[id(fn)] = _availability_names(fn.body, ctx)
        assigns = names_of[id(fn)]
        kinds = [_backend_of_test(b.test, fn, ctx, assigns) for b in ifs]
        if any("neuron" in k or "accelerator" in k for k in kinds):
            continue
        cuda = [i for i, k in enumerate(kinds) if k == {"cuda"}]
        others = [i for i, k in enumerate(kinds) if len(k) == 1 and k != {"cuda"}]
        if not cuda or not others:
            continue
        p = Picker(ifs[0], ifs, [last], cuda[0], others[0], next(iter(kinds[others[0]])))
        p.returns = True
        p.lines = set(range(ifs[0].lineno, last.end_lineno + 1))
        p.fn = fn
        p.reach = None
        at = next((b.test for b in ifs if _true_without_accelerator(b.test, fn, ctx, assigns)), None)
        p.blocked = at  # `if not cuda and not mps: return cpu` first: the neuron case would never be reached
        out.append(p)
    return out


def twins(ctx, fn) -> list:
    """[(if node, text)] for the `if <another backend is available>:` blocks of `fn` (no else, not an elif) whose body
    only moves things to that backend (`if torch.backends.mps.is_available(): images = images.to('mps')`, imagenet's
    validate): the text is the block followed by its neuron twin, relative to the block's column. A picker elsewhere
    would give the model the neuron device while these batches stayed on the CPU."""
    a = ctx.analysis
    out = []
    if fn is None:
        return out
    assigns = _availability_names(fn.body, ctx)
    for node in walk(fn):
        if not isinstance(node, ast.If) or node.orelse:
            continue
        parent = a.parent_of.get(node)
        if isinstance(parent, ast.If) and parent.orelse == [node]:
            continue  # an elif: part of a chain
        kinds = _backend_of_test(node.test, fn, ctx, assigns)
        if len(kinds) != 1 or kinds & {"cuda", "neuron", "accelerator"}:
            continue
        p = Picker(node, [node], [], -1, 0, next(iter(kinds)))
        made = neuron_body(p, ctx)
        if made is None or made[0].startswith(TORCH) or TORCH + ".device(\"neuron\")" == made[0].split(" = ")[-1]:
            continue  # no body of its own to copy (neuron_body's fallback): nothing to twin
        body, indent = made
        col = node.col_offset
        lines = []
        for i, line in enumerate(a.lines[node.lineno - 1:node.end_lineno]):
            line = line.rstrip("\r\n")
            if i and line.strip() and not line.startswith(" " * col):
                break
            lines.append(line[col:])
        else:
            pad = " " * (indent - col)
            out.append((node, "\n".join([*lines, f"if {NEURON_TEST.format(torch=TORCH)}:"] +
                                         [(pad + ln if ln else ln) for ln in body.split("\n")])))
    return out


def _reach(branches, at, kinds, fn, ctx, assigns):
    """(the test to amend, [(inner `if torch.cuda.is_available():` with no else, its neuron body)]) for a chain whose
    branch `at` is true on a Neuron host; None when a branch a Neuron host would reach holds CUDA code that is not
    such a block, or a block whose body cannot be translated."""
    a = ctx.analysis
    test = branches[at].test
    if test.lineno != test.end_lineno:
        return None
    inner = []
    for i, b in enumerate(branches):
        if i <= at or kinds[i]:
            continue  # before the test, or a branch that asks a backend (False on a Neuron host)
        for stmt in b.body:
            cuda_in = any(_is_cuda_node(n, a) for n in walk(stmt))
            if not cuda_in:
                continue
            if not (isinstance(stmt, ast.If) and not stmt.orelse and isinstance(stmt.test, ast.Call) and not stmt.test.args
                    and isinstance(stmt.test.func, (ast.Name, ast.Attribute))
                    and a.resolve(stmt.test.func, a.module_scope, count_use=False) == "torch.cuda.is_available"):
                return None
            body = _translate(stmt.body, ctx)
            if body is None:
                return None
            inner.append((stmt, body))
    return test, inner


def _is_cuda_node(n, a) -> bool:
    if isinstance(n, ast.Constant) and isinstance(n.value, str):
        return n.value.split(":")[0] == "cuda"
    if isinstance(n, ast.Attribute):
        return n.attr == "cuda" or "cuda" in (a.resolve(n, a.module_scope, count_use=False) or "").split(".")
    return False


def _translate(body: list, ctx, strings: bool = False):
    """The text of a CUDA block for the neuron device, relative to its indentation: `torch.cuda.set_device(i)` ->
    `torch.accelerator.set_device_index(i)`, `x.cuda(i)` -> `x.to(torch.device("neuron", i))`, `x.cuda()` ->
    `x.to("neuron")`, with `strings` a device string `'cuda:{}'` -> `'neuron:{}'` (not inside an f-string), comments
    cut (they speak of GPUs); None when anything else in it names CUDA."""
    a = ctx.analysis
    edits = []  # (line, col, end line, end col, text)
    handled: set = set()
    for stmt in body:
        for n in walk(stmt):
            if (strings and type(n) is ast.Constant and isinstance(n.value, str) and n.value.split(":")[0] == "cuda"
                    and id(n) not in handled and type(a.parent_of.get(n)) is not ast.JoinedStr):
                handled.add(id(n))
                edits.append((n.lineno, n.col_offset, n.end_lineno, n.end_col_offset,
                              a.source(n).replace("cuda", "neuron", 1)))
                continue
            if not isinstance(n, ast.Call) or not isinstance(n.func, ast.Attribute):
                continue
            q = a.resolve(n.func, a.module_scope, count_use=False)
            if q == "torch.cuda.set_device" and len(n.args) == 1 and not n.keywords:
                text = f"{TORCH}.accelerator.set_device_index({a.source(n.args[0])})"
            elif n.func.attr == "cuda" and not q and len(n.args) <= 1 and not n.keywords:
                target = f'{TORCH}.device("neuron", {a.source(n.args[0])})' if n.args else '"neuron"'
                text = f"{a.source(n.func.value)}.to({target})"
                if any(_is_cuda_node(m, a) for m in walk(n.func.value)):
                    return None
            else:
                continue
            handled.update(id(m) for m in walk(n))
            edits.append((n.lineno, n.col_offset, n.end_lineno, n.end_col_offset, text))
    for stmt in body:
        if any(_is_cuda_node(n, a) and id(n) not in handled for n in walk(stmt)):
            return None
    first, last = body[0].lineno, body[-1].end_lineno
    lines = [a.lines[i - 1].rstrip("\r\n") for i in range(first, last + 1)]
    for line, col, end_line, end_col, text in sorted(edits, reverse=True):
        if line != end_line:
            return None
        raw = lines[line - first]
        # ast columns are UTF-8 byte offsets
        b = raw.encode("utf-8")
        lines[line - first] = (b[:col].decode("utf-8") + text + b[end_col:].decode("utf-8"))
    text = _without_comments("\n".join(lines))
    if text is None:
        return None
    indent = len(a.lines[first - 1]) - len(a.lines[first - 1].lstrip(" "))
    return "\n".join(ln[indent:] if ln.startswith(" " * indent) else ln for ln in text.split("\n"))


def picks_neuron(fn, ctx) -> bool:
    """The function (or module, fn None) tests `torch.accelerator.current_accelerator().type == "neuron"`: the branch
    NM203 inserts into a device picker, in an earlier round or run (cached per function)."""
    a = ctx.analysis

    def build(_a):
        for n in walk(fn if fn is not None else a.tree):
            if isinstance(n, ast.Compare) and len(n.comparators) == 1 and isinstance(n.comparators[0], ast.Constant) \
                    and n.comparators[0].value == "neuron" and isinstance(n.left, ast.Attribute) and n.left.attr == "type" \
                    and isinstance(n.left.value, ast.Call) and isinstance(n.left.value.func, (ast.Name, ast.Attribute)) \
                    and a.resolve(n.left.value.func, a.module_scope, count_use=False) == "torch.accelerator.current_accelerator":
                return True
        return False

    return cached(a, f"dispatch-neuron:{id(fn)}", build)


def in_neuron_chain(node, ctx) -> bool:
    """`node` is in the test of a branch of an if/elif chain that also has NM203's neuron branch (a picker that got
    it in an earlier round or run): its CUDA branch stays for GPU hosts, as intended."""
    a = ctx.analysis
    parents = a.parent_of
    child, up = node, parents.get(node)
    while up is not None and isinstance(up, (ast.BoolOp, ast.UnaryOp, ast.Compare, ast.Call, ast.Attribute)):
        child, up = up, parents.get(up)
    if not isinstance(up, ast.If) or up.test is not child or _NEURON_TYPE not in a.text:
        return False
    top = up
    while isinstance(parents.get(top), ast.If) and parents[top].orelse == [top]:
        top = parents[top]
    branches, _orelse = if_chain(top)
    return any(_NEURON_TYPE in a.source(b.test) for b in branches)


def gets_neuron(fn, ctx) -> bool:
    """The function (or module, fn None) picks neuron: its picker has its neuron branch (picks_neuron) or gets one
    in this round (a picker of it that is not blocked and has a neuron body)."""
    if picks_neuron(fn, ctx):
        return True
    return cached(ctx.analysis, f"gets-neuron:{id(fn)}",
                  lambda _a: any(p.fn is fn and p.blocked is None and fixable(p, ctx) for p in pickers(ctx)))


def fixable(p: Picker, ctx) -> bool:
    """The picker has a neuron branch to add (its neuron value or body can be made)."""
    return (_neuron_value(p, ctx) if isinstance(p.top, ast.IfExp) else neuron_body(p, ctx)) is not None


def tails(ctx) -> list:
    """[(chain, CUDA branch, its neuron body)] for the if/elif chains without an else whose last branch asks only
    whether CUDA is available, while the earlier ones ask no backend, in a function whose device picker gets its
    neuron branch. pytorch/examples' imagenet resumes with `if args.gpu is None: checkpoint = torch.load(path)` /
    `elif torch.cuda.is_available(): loc = 'cuda:{}'.format(args.gpu); checkpoint = torch.load(path,
    map_location=loc)`: a Neuron host (its model on the neuron device through the picker) takes neither branch under
    torch.multiprocessing, and the checkpoint is never loaded. The body (TORCH where torch is named) is the CUDA
    branch's for the neuron device (_translate, device strings too); a chain whose CUDA branch holds anything else
    of CUDA is not one."""

    def build(a):
        out = []
        fns = {id(p.fn): p.fn for p in pickers(ctx) if p.blocked is None and p.fn is not None}
        function_of = device_flow.facts(a).function_of
        if _NEURON_TYPE in a.text and "torch.cuda.is_available" in a.qualnames:
            # a picker that got its neuron branch in an earlier round (or run) is no longer a picker
            for node in walk(a.tree):
                if type(node) in (ast.FunctionDef, ast.AsyncFunctionDef) and id(node) not in fns and picks_neuron(node, ctx):
                    fns[id(node)] = node
        for fn in fns.values():
            assigns = _availability_names(fn.body, ctx)
            inner: set = set()
            for node in walk(fn):
                if type(node) is not ast.If or id(node) in inner:
                    continue
                branches, orelse = if_chain(node)
                inner.update(id(b) for b in branches[1:])
                if len(branches) < 2 or orelse or function_of(node) is not fn:
                    continue
                kinds = [_backend_of_test(b.test, fn, ctx, assigns) for b in branches]
                if kinds[-1] != {"cuda"} or any(kinds[:-1]):
                    continue
                body = _translate(branches[-1].body, ctx, strings=True)
                if body is not None:
                    out.append((node, branches[-1], body))
        return out

    return cached(ctx.analysis, "device-tails", build)


def tail_of(site, ctx):
    """The tail (see `tails`) whose CUDA branch's test holds this site, or None."""
    for tail in tails(ctx):
        if any(sub is site.node for sub in walk(tail[1].test)):
            return tail
    return None


def insert_tail(tail, ctx, fx) -> bool:
    """Add to `fx` the edit that appends the neuron branch to a tail's chain; False when the chain's text cannot
    take it (a line left of the chain, inside a multi-line string; tabs in its indentation)."""
    top, last, body = tail
    return _append_branch(top, last, body, ctx, fx)


def _append_branch(top: ast.If, last: ast.If, body: str, ctx, fx) -> bool:
    """Add to `fx` the edit that appends `elif <neuron test>:` with `body` (relative to its indentation, TORCH where
    torch is named) to the chain `top` whose last branch is `last`; False when the chain's text cannot take it."""
    a = ctx.analysis
    col = top.col_offset
    first_body = a.lines[last.body[0].lineno - 1]
    indent = len(first_body) - len(first_body.lstrip(" "))
    if first_body[indent:indent + 1] == "\t" or last.body[0].col_offset != indent:
        return False
    rel = []
    for i, line in enumerate(a.lines[top.lineno - 1:top.end_lineno]):
        line = line.rstrip("\r\n")
        if i and line.strip() and not line.startswith(" " * col):
            return False
        rel.append(line[col:])
    torch = fx.ref("torch")
    pad = " " * (indent - col)
    rel += [f"elif {NEURON_TEST.format(torch=torch)}:"] + [(pad + ln if ln else ln) for ln in body.replace(TORCH, torch).split("\n")]
    fx.replace(top, "\n".join(rel))
    return True


def _true_without_accelerator(test, fn, ctx, assigns) -> bool:
    """`not torch.cuda.is_available() and not torch.backends.mps.is_available()` (and `not use_cuda` for a name
    assigned from one): every operand negates another backend's availability, so the test holds on a Neuron host."""
    operands = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
    for op in operands:
        if not (isinstance(op, ast.UnaryOp) and isinstance(op.op, ast.Not)):
            return False
        kinds = _backend_of_test(op.operand, fn, ctx, assigns)
        if not kinds or "neuron" in kinds or "accelerator" in kinds:
            return False
    return True


def picker_of(site, ctx):
    """The picker whose CUDA branch this `torch.cuda.is_available()` site decides: the site is in that branch's test,
    or in the assignment of a name the test reads (`use_cuda = ... torch.cuda.is_available()`)."""
    node = site.node
    a = ctx.analysis
    for p in pickers(ctx):
        test = p.branches[p.cuda_index].test
        if any(sub is node for sub in walk(test)):
            return p
        names = {n.id for n in walk(test) if isinstance(n, ast.Name)}
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
        for node in walk(stmt):
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
        for n in walk(branch):
            # the backend's name as a label (`s += "MPS"`, yolov5's select_device log line) names neuron too
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value != kind and n.value.lower() == kind:
                raw = a.source(n)
                label = "NEURON" if n.value.isupper() else "Neuron" if n.value[:1].isupper() else "neuron"
                text = text.replace(raw, raw.replace(n.value, label, 1))
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
        first = p.branches[p.other_index].body[0] if p.default else p.orelse[0]
        indent = len(a.lines[first.lineno - 1]) - len(a.lines[first.lineno - 1].lstrip(" "))
        return f'{name} = {TORCH}.device("neuron")', indent
    return None


def insert_branch(p: Picker, ctx, fx) -> bool:
    """Add to `fx` the edit that inserts the neuron branch before the picker's final else; False when the chain's
    text cannot take it (no `else:` line found)."""
    a = ctx.analysis
    if p.blocked is not None:
        return False
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
    if getattr(p, "returns", False):  # early returns: the neuron `if` goes right before the CPU fallback's return
        torch = fx.ref("torch")
        fallback = p.orelse[0]
        pad = " " * (indent - col)
        lines = [f"if {NEURON_TEST.format(torch=torch)}:"] + [(pad + ln if ln else ln) for ln in body.replace(TORCH, torch).split("\n")]
        fx.replace(fallback, "\n".join([*lines, a.source(fallback)]))
        return True
    if p.default:  # no else: the neuron branch ends the chain
        return p.reach is None and _append_branch(p.top, p.branches[-1], body, ctx, fx)
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
    test = NEURON_TEST.format(torch=torch)
    new = [f"elif {test}:"] + [(pad + ln if ln else ln) for ln in body.replace(TORCH, torch).split("\n")]
    inserts = [(at, new)]
    if p.reach is not None:
        amend, inner = p.reach
        for stmt, text in inner:
            own = " " * (stmt.col_offset - col)
            deeper = " " * (stmt.body[0].col_offset - col)
            inserts.append((stmt.end_lineno - p.top.lineno + 1, [f"{own}elif {test}:"] + [
                (deeper + ln if ln else ln) for ln in text.replace(TORCH, torch).split("\n")]))
        k = amend.lineno - p.top.lineno
        raw = rel[k].encode("utf-8")
        start, end = amend.col_offset - col, amend.end_col_offset - col
        rel[k] = (raw[:start] + f"{a.source(amend)} and not ({test})".encode("utf-8") + raw[end:]).decode("utf-8")
    for where, lines in sorted(inserts, key=lambda x: x[0], reverse=True):
        rel[where:where] = lines
    fx.replace(p.top, "\n".join(rel))
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
            if (p.blocked is None or p.user_device is not None) and fixable(p, ctx):
                out |= p.lines  # (a picker left to the user's setting: its finding speaks for it)
        for _top, last, _body in tails(ctx):
            out |= set(range(last.lineno, last.end_lineno + 1))
        return out

    return cached(ctx.analysis, "device-picker-lines", build)
