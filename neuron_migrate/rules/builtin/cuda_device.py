"""CUDA device code to TorchNeuron: devices, device strings, the torch.cuda device module (NM200-NM205).

Two device styles (`device-style` setting): `neuron` (default) writes `torch.device("neuron")` and
`torch.accelerator`/`torch.neuron` calls; `accelerator` writes device-agnostic code through
`torch.accelerator` that runs unchanged on neuron, cuda or cpu (it falls back to the CPU when
`torch.accelerator.is_available()` is False, where `torch.accelerator.synchronize()` and friends raise).
Source for the edits: the TorchNeuron landing page lists `.to('cuda')` -> `.to('neuron')` and says code
written against `torch.accelerator` needs no change
(https://awsdocs-neuron.readthedocs-hosted.com/en/latest/torch/index.html).
"""
from __future__ import annotations

import ast

from neuron_migrate.names.analysis import walk
from neuron_migrate.program import cached, device_flow, values
from neuron_migrate.rules.helpers import HELPERS, Helper
from neuron_migrate.rules.api import const_value, has_star_args, indent_statement, kwarg, rule
from neuron_migrate.rules.builtin import cuda_picker
from neuron_migrate.rules.builtin.xla_core import LOCAL_DEVICE_NOTE, device_string_context

HELPERS.setdefault(
    "_neuron_set_device",
    Helper(
        '''def _neuron_set_device(device):
    """Select `device` when this process sees several; under torchrun TorchNeuron shows each process only its own core."""
    if {torch}.accelerator.is_available() and {torch}.accelerator.device_count() > 1:
        {torch}.accelerator.set_device_index(device)
''',
        {"torch": "torch"},
    ),
)

TORCH_DOCS = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/torch/index.html"


def accelerator(ctx) -> bool:
    return ctx.settings.device_style == "accelerator"


def agnostic_device(fx, nullable: bool = False, bare: bool = False, quote: str = '"') -> str:
    """Device-agnostic device expression, plain public API: the accelerator, or the CPU when there is none.

    `nullable`: the position accepts None for "stay where you are / default device" (`.to(None)` is a no-op,
    `torch.ones(device=None)` is the CPU), so `torch.accelerator.current_accelerator()` alone keeps meaning.
    `bare`: the position is a whole argument, so the `or` needs no parentheses.
    """
    torch = fx.ref("torch")
    current = f"{torch}.accelerator.current_accelerator()"
    if nullable:
        return current
    text = f"{current} or {torch}.device({quote}cpu{quote})"
    return text if bare else f"({text})"


def agnostic_type(fx, quote: str = '"') -> str:
    """The accelerator's device type string ('neuron', 'cuda'), or 'cpu' when there is none."""
    return f"{agnostic_device(fx, quote=quote)}.type"


def device_type_expr(site, ctx, fx) -> str:
    """Accelerator style, where a device type string is expected: the program's device variable's `.type` when it
    has one at this point, else the accelerator's type (or 'cpu')."""
    name = device_flow.facts(ctx.analysis).device_name_at(site.node, objects_only=True)
    return f"{name}.type" if name else agnostic_type(fx, string_quote(site, ctx))


# -- device-dispatching code: CUDA rules leave it alone --------------------------------------------------
def _cuda_site(s) -> bool:
    return ((s.kind == "string" and s.key in ("cuda", "cuda:"))
            or (s.kind in ("call", "ref") and s.key.startswith("torch.cuda.") and s.key not in _HOST_AGNOSTIC)
            or (s.kind == "method" and s.key == "cuda") or (s.kind == "attr" and s.key == "is_cuda"))


# torch.cuda calls whose torch.accelerator form does the same on a CUDA host and works on every other accelerator: NM204
# rewrites them in device-dispatching code too where no backend test guards them (an unguarded torch.cuda.synchronize()
# beside a device picker that now picks neuron raised on a Neuron host, where torch is not built with CUDA). Not
# empty_cache: torch.cuda's does nothing without CUDA, torch.accelerator's raises on a host without an accelerator
_HOST_AGNOSTIC = {"torch.cuda.synchronize"}


def _user_device_finding(site, ctx, p):
    setting = ctx.src(p.user_device)
    return ctx.finding(site, f"the device is picked among several backends (cuda, {p.other_kind}), else from `{setting}` "
                             f"(line {p.user_device.lineno}), the user's own choice: no neuron branch is added, which "
                             f"would override it (a run asking for the CPU would get the Neuron device); the choice is "
                             f"left unchanged: on a Trainium host set `{setting}` to 'neuron'")


def dispatch_guard(site, ctx):
    """None when the site is in code that targets only CUDA. In device-dispatching code (a function testing several
    backends, or a value set of several accelerators) a finding at the function's first CUDA site, else False."""
    if not device_flow.may_dispatch(ctx.analysis):
        return None
    flow = device_flow.facts(ctx.analysis)
    node = site.node
    member = string_member(site) if site.kind == "string" else None
    vs = values.facts(ctx.analysis).set_of(member) if member is not None else None
    if not (flow.is_dispatch(node) or (vs is not None and vs.multi_backend)):
        return _beside_dispatcher(site, ctx, flow, member, vs)
    fn = flow.function_of(node)

    covered = cuda_picker.picker_lines(ctx) if not accelerator(ctx) else set()
    if node.lineno in covered:
        for p in cuda_picker.pickers(ctx):
            if p.flag and p.user_device is not None and cuda_picker.flag_site(p, ctx) is node:
                return _user_device_finding(site, ctx, p)
            if p.flag and p.blocked is None and cuda_picker.flag_site(p, ctx) is node:
                fx = ctx.fixer()
                fx.scope = site.scope
                if cuda_picker.insert_branch(p, ctx, fx):
                    return ctx.finding(site, f"the device is picked among several backends (cuda when asked for, "
                                             f"{p.other_kind}, else cpu): a neuron branch is added before the CPU fallback; "
                                             "the CUDA branch stays for GPU hosts", fix=fx.build(),
                                       note="On a Trainium host the new branch picks `neuron` (TorchNeuron registers it "
                                            "with torch.accelerator); on a GPU or Mac the earlier branches still come first.")
    if node.lineno in covered and not (site.kind == "call" and site.key == "torch.cuda.is_available"):
        return False  # a device picker: NM203 adds its neuron branch and says so
    if not accelerator(ctx) and site.kind == "string":
        choice = _cuda_choice(node, ctx)
        if choice is not None and cuda_picker.gets_neuron(fn, ctx) and _runs_on_every_host(choice, fn, ctx):
            if min(_cuda_strings(choice), key=lambda n: (n.lineno, n.col_offset)) is not node:
                return False  # the choice's first 'cuda' string speaks for it
            return _cuda_choice_fix(site, ctx, fn, choice)
    if not accelerator(ctx) and cuda_picker.gets_neuron(fn, ctx) and _runs_on_every_host(node, fn, ctx):
        # the picker got its neuron branch (an earlier round or run): what still asks CUDA outside any backend test
        # runs on a Neuron host too
        every_host = _every_host_fix(site, ctx, fn)
        if every_host is not None:
            return every_host
    if (((site.kind in ("call", "ref") and site.key.startswith("torch.cuda.") and site.key != "torch.cuda.is_available")
         or (site.kind == "method" and site.key == "cuda")) and cuda_picker.gets_neuron(fn, ctx)
            and _runs_on_every_host(node, fn, ctx)):
        what = f"{ctx.src(site.node)}()" if site.kind == "method" else site.key
        last = site.key.rsplit(".", 1)[-1]
        if "autocast" in site.key:
            there, instead = "this autocast is disabled (the model runs in float32)", "torch.autocast(device.type, ...)"
        elif last.startswith("manual_seed"):
            there, instead = "it seeds nothing", "torch.manual_seed(...), which seeds every device"
        elif "memory" in last:
            there, instead = "it reports CUDA's memory (none)", "torch.accelerator's memory functions"
        else:
            there, instead = "it fails (torch is not built with CUDA there) or does nothing", "the device the picker chose"
        where = f"`{fn.name}()`" if fn is not None else "module-level code"
        return ctx.finding(site, f"`{what}` runs on every host in {where}, whose device picker now picks neuron, but still "
                                 f"asks CUDA: on a Neuron host {there} (by hand: use {instead})")

    if member is not None and vs is not None and fn is not None and not any(p.fn is fn for p in cuda_picker.pickers(ctx)):
        m = next((m for m in vs.members if m.node is member), None)
        if m is not None and m.role == "compare" and m.kind == "cuda" and not cuda_picker.picks_neuron(fn, ctx):
            beside = _beside_module_choice(site, ctx, flow, member)
            if beside is not None:
                return beside

    def first_cuda(_a):
        hits = [s.node for s in ctx.analysis.sites if _cuda_site(s) and flow.function_of(s.node) is fn
                and s.node.lineno not in covered]
        return min(hits, key=lambda n: (n.lineno, n.col_offset)) if hits else None

    if cached(ctx.analysis, f"dispatch-first:{id(fn)}", first_cuda) is not node:
        return False
    if cuda_picker.gets_neuron(fn, ctx):
        return False  # the choice already has its neuron branch (NM203's, on an earlier run or round): nothing to add
    if not accelerator(ctx) and any(p.blocked is not None and p.fn is fn for p in cuda_picker.pickers(ctx)):
        return False  # NM203 says at each picker why no neuron branch is added
    parent, test = ctx.analysis.parent_of.get(node), node
    while isinstance(parent, (ast.BoolOp, ast.UnaryOp)) and not isinstance(getattr(parent, "op", None), ast.Or):
        parent, test = ctx.analysis.parent_of.get(parent), parent  # `torch.cuda.is_available() and not opt.cuda`
    if (not accelerator(ctx) and isinstance(parent, ast.If) and parent.test is test and not parent.orelse
            and not any(_torch_cuda_node(n, ctx) for stmt in parent.body for n in walk(stmt))
            and any(p.blocked is None and p.fn is fn for p in cuda_picker.pickers(ctx))):
        return False  # `if torch.cuda.is_available() [and not args.cuda]: print("...run with --cuda")` beside a
        # picker that gets its branch
    backends = sorted((flow.dispatch_backends(node) | (vs.kinds if vs is not None else set())) - {"cpu", "meta"})
    where = f"`{fn.name}()`" if fn is not None else "module-level code"
    found = cuda_picker.twins(ctx, fn) if not accelerator(ctx) else []
    if found:
        fx = ctx.fixer()
        fx.scope = site.scope
        torch = fx.ref("torch")
        for block, text in found:
            fx.replace(block, text.replace(cuda_picker.TORCH, torch))
        kind = ", ".join(sorted({b for b in backends if b != "cuda"}))
        return ctx.finding(site, f"{where} dispatches over several backends ({', '.join(backends)}): each block that moves "
                                 f"data to {kind} when it is available gets a neuron twin after it; the CUDA code stays "
                                 "for GPU hosts", fix=fx.build(),
                           note="On a Trainium host the neuron block moves the data as the other backend's block does "
                                "on its host (TorchNeuron registers the neuron device with torch.accelerator).")
    return ctx.finding(
        site, f"{where} dispatches over several backends ({', '.join(backends)}): the CUDA rules leave it unchanged; "
              "add a neuron branch beside the CUDA one",
        note="TorchNeuron registers the neuron device with torch.accelerator: a branch such as "
             "`elif torch.accelerator.is_available(): return torch.accelerator.current_accelerator()` before the CPU "
             "fallback picks it up on a Trainium host (on a GPU host the CUDA branch still comes first).")


def _every_host_fix(site, ctx, fn):
    """The fix of a CUDA-only statement that runs on every host, in code whose device picker now picks neuron
    (build-nanogpt's `if ddp:` block beside its cuda/mps/cpu picker), or None. Each keeps its CUDA form where
    CUDA is available (where the picker picks cuda) and takes its neuron form elsewhere:
    `assert torch.cuda.is_available()` -> `assert torch.accelerator.is_available()`;
    `init_process_group(backend='nccl')` -> `backend='nccl' if torch.cuda.is_available() else 'neuron'`;
    `device = f'cuda:{rank}'` -> `f'cuda:{rank}' if torch.cuda.is_available() else f'neuron:{rank}'`;
    `torch.cuda.set_device(d)` -> under `if torch.cuda.is_available():` (TorchNeuron's process group makes each
    process's NeuronCore its current device)."""
    a = ctx.analysis
    node = site.node
    parent = a.parent_of.get(node)
    where = f"`{fn.name}()`" if fn is not None else "module-level code"
    why = f"runs on every host in {where}, whose device picker now picks neuron"
    fx = ctx.fixer()
    fx.scope = site.scope
    if site.kind == "call" and site.key == "torch.cuda.is_available":
        if not (isinstance(parent, ast.Assert) and parent.test is node):
            return None
        fx.replace(node, f"{fx.ref('torch')}.accelerator.is_available()")
        return ctx.finding(site, f"`assert torch.cuda.is_available()` {why}: it asks for an accelerator, CUDA or neuron",
                           fix=fx.build())
    if site.kind == "call" and site.key == "torch.cuda.set_device" and site.is_statement:
        test = f"{fx.ref('torch')}.cuda.is_available()"
        fx.replace(site.stmt, f"if {test}:\n" + indent_statement(a.source(site.stmt)))
        return ctx.finding(site, f"`torch.cuda.set_device()` {why}: it runs only where CUDA is (on Neuron the process group "
                                 "makes each process's NeuronCore its current device)", fix=fx.build())
    if site.kind == "call" and site.key in ("torch.distributed.init_process_group", "torch.distributed.new_group"):
        pos = 0 if site.key.endswith("init_process_group") else 1
        backend = kwarg(site.call, "backend", pos)
        if const_value(backend) != "nccl":
            return None
        q = ctx.src(backend)[0]
        fx.replace(backend, f"{q}nccl{q} if {fx.ref('torch')}.cuda.is_available() else {q}neuron{q}")
        return ctx.finding(site, f"backend 'nccl' {why}: 'nccl' where CUDA is, else 'neuron'", fix=fx.build())
    if site.kind == "string":
        member = string_member(site)
        parent = a.parent_of.get(member)
        if member is None or not (isinstance(parent, ast.Assign) and parent.value is member
                                  and len(parent.targets) == 1 and isinstance(parent.targets[0], ast.Name)):
            return None
        text = ctx.src(member)
        if text.count("cuda") != 1 or len(_cuda_strings(member)) != 1:
            return None
        fx.replace(member, f"{text} if {fx.ref('torch')}.cuda.is_available() else {text.replace('cuda', 'neuron', 1)}")
        return ctx.finding(site, f"device {text} {why}: it stays where CUDA is, else names the neuron device (its index "
                                 "kept: a rank's NeuronCore has its local rank as index)", fix=fx.build())
    return None


def _cuda_choice(node, ctx):
    """The conditional expression that asks whether a device names CUDA and answers with CUDA-only values
    (`device_type = "cuda" if device.startswith("cuda") else "cpu"`, `torch.amp.autocast(device_type="cuda", ...)
    if device == "cuda" else nullcontext()`) whose test or answer holds `node`, or None. Its test compares one
    'cuda' string with a name (`x.startswith("cuda")`, `"cuda" in x`, `x == "cuda"`, through `str(x)`); its answer's
    only CUDA is 'cuda' strings; its else holds none."""
    parents = ctx.analysis.parent_of
    child, up = node, parents.get(node)
    while up is not None and not isinstance(up, (ast.IfExp, ast.stmt)):
        child, up = up, parents.get(up)
    if not isinstance(up, ast.IfExp) or child is up.orelse:
        return None
    test = up.test
    probe = None
    if isinstance(test, ast.Call) and isinstance(test.func, ast.Attribute) and test.func.attr == "startswith" \
            and len(test.args) == 1 and not test.keywords:
        probe = test.func.value
    elif isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], (ast.In, ast.Eq)):
        probe = test.comparators[0] if isinstance(test.ops[0], ast.In) else test.left
    if isinstance(probe, ast.Call) and isinstance(probe.func, ast.Name) and probe.func.id == "str" and len(probe.args) == 1:
        probe = probe.args[0]
    if not isinstance(probe, (ast.Name, ast.Attribute)) or len(_cuda_strings(test)) != 1:
        return None
    if any(isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.split(":")[0] == "neuron"
           for n in walk(up.orelse)):
        return None  # it has its neuron answer (an earlier round or run)
    if _cuda_strings(up.orelse) or any(_torch_cuda_node(n, ctx) for n in walk(up.body)
                                       if not isinstance(n, ast.Constant)):
        return None
    if any(n.value.split(":")[0] != "cuda" or ":" in n.value for n in _cuda_strings(up.body)):
        return None
    # an answer with no 'cuda' of its own (llm.c's `torch.amp.autocast(device_type=device_type, dtype=ptdtype) if
    # device_type == "cuda" else nullcontext()`) is the device's own: the test then asks for neuron too
    return up


def _cuda_choice_fix(site, ctx, fn, choice):
    """`A if <device names cuda> else B` -> `A if <device names cuda> else A' if <device names neuron> else B`, A' the
    answer with its 'cuda' strings naming neuron: the same on every other host, the neuron answer on a Neuron host."""
    a = ctx.analysis

    def neuron_text(expr) -> str | None:
        strings = _cuda_strings(expr)
        if any(n.lineno != expr.lineno or n.end_lineno != expr.lineno for n in strings):
            return None  # a literal on another line than the expression's first: left alone
        text = a.source(expr)
        for n in strings:
            raw = a.source(n)
            text = text.replace(raw, raw.replace("cuda", "neuron", 1))
        return text

    where = f"`{fn.name}()`" if fn is not None else "module-level code"
    fx = ctx.fixer()
    fx.scope = site.scope
    if not _cuda_strings(choice.body):
        test = _with_neuron(choice.test, a)
        if test is None:
            return None
        fx.replace(choice.test, test)
        return ctx.finding(site, f"`{a.source(choice)}` runs on every host in {where}, whose device picker now picks "
                                 "neuron: the neuron device takes the CUDA answer, which names no device of its own "
                                 "(before, it took the CPU's: a bfloat16 autocast was off)", fix=fx.build())
    body, test = neuron_text(choice.body), neuron_text(choice.test)
    if body is None or test is None:
        return None
    orelse = a.source(choice.orelse)
    if isinstance(choice.orelse, (ast.Lambda, ast.NamedExpr)):
        orelse = f"({orelse})"
    fx.replace(choice.orelse, f"{body} if {test} else {orelse}")
    return ctx.finding(site, f"`{a.source(choice)}` runs on every host in {where}, whose device picker now picks "
                             "neuron: the neuron device gets its own answer (before, it took the CPU's)", fix=fx.build())


def _with_neuron(test, a) -> str | None:
    """`_cuda_choice`'s test asking for neuron too: `<test> or <test with 'neuron' for 'cuda'>` (`device_type == "cuda"
    or device_type == "neuron"`), the form its other fix writes as `... if <neuron test> else ...`."""
    strings = _cuda_strings(test)
    if len(strings) != 1 or strings[0].lineno != test.lineno or test.end_lineno != test.lineno:
        return None
    text = a.source(test)
    raw = a.source(strings[0])
    return f"{text} or {text.replace(raw, raw.replace('cuda', 'neuron', 1), 1)}"


def _cuda_strings(node) -> list:
    """The 'cuda'/'cuda:' string constants in `node`."""
    return [n for n in walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and n.value.split(":")[0] == "cuda"]


_BACKEND_WORDS = ("cuda", "gpu", "mps", "xpu", "device", "is_available", "amp", "fp16", "half", "accelerator")


def _runs_on_every_host(node, fn, ctx) -> bool:
    """No `if`/`while`/conditional expression between `node` and `fn` has a test that may ask which backend runs
    (its text names cuda, gpu, mps, a device, an availability, mixed precision...)."""
    parents = ctx.analysis.parent_of
    child, up = node, parents.get(node)
    while up is not None and up is not fn:
        if isinstance(up, (ast.If, ast.IfExp, ast.While)) and up.test is not child:
            text = ctx.analysis.source(up.test).lower()
            if any(w in text for w in _BACKEND_WORDS):
                return False
        child, up = up, parents.get(up)
    return up is fn


def _torch_cuda_node(n, ctx) -> bool:
    """A 'cuda' device string or a name of torch.cuda (not a flag such as `args.cuda`)."""
    if isinstance(n, ast.Constant) and isinstance(n.value, str):
        return n.value.split(":")[0] == "cuda"
    if isinstance(n, (ast.Attribute, ast.Name)):
        q = ctx.analysis.resolve(n, ctx.analysis.module_scope, count_use=False) or ""
        return q.startswith(("torch.cuda", "torch.backends.cudnn", "torch.backends.cuda"))
    return False


def _beside_dispatcher(site, ctx, flow, member, vs):
    """A test for the CUDA device type (`device.type == "cuda"`, `"cuda" in str(device)`) in a file whose own device
    dispatcher still hands out CUDA devices (`default_device()` over cuda/xpu/cpu, left unchanged above): rewritten
    alone, `is_cuda(device)` would ask about neuron while the dispatcher keeps returning CUDA devices, so both stay
    and the finding says so. None (not dispatch code) otherwise."""
    if member is None or vs is None:
        return None
    m = next((m for m in vs.members if m.node is member), None)
    if m is None or m.role != "compare" or m.kind != "cuda":
        return None
    dispatchers = [d for d in flow.dispatchers() if "cuda" in {"cuda" if k == "gpu" else k for k in flow.dispatch_backends(d.body[0])}]
    if not dispatchers:
        return _beside_module_choice(site, ctx, flow, member)
    d = dispatchers[0]
    kinds = sorted(flow.dispatch_backends(d.body[0]) - {"cpu", "meta"})
    picks = any(p.fn is d and p.blocked is None for p in cuda_picker.pickers(ctx)) or cuda_picker.picks_neuron(d, ctx)
    if picks:  # NM203 adds (or added) the neuron branch to the picker: this test still asks about CUDA, and should
        return ctx.finding(site, f"{ctx.src(member)} tests for CUDA beside `{d.name}()` (line {d.lineno}), which picks among "
                                 f"{', '.join(kinds)} and, with NM203's branch, neuron: left unchanged, since a CUDA device "
                                 "is what it asks about; add `neuron` here if the neuron device should take this path too")
    return ctx.finding(site, f"{ctx.src(member)} tests for CUDA beside `{d.name}()` (line {d.lineno}), which still picks among "
                             f"{', '.join(kinds)}: left unchanged so that the two agree; add a neuron branch to both")


def _compared_parameter(node, ctx):
    """The parameter that the comparison holding the 'cuda' string `node` tests (`device_type == "cuda"`, `"cuda" in
    device`, `device.type == "cuda"`, through `str(...)`), when it is a parameter of the enclosing function that holds
    no other CUDA code, or None."""
    a = ctx.analysis
    cmp = a.parent_of.get(node)
    if not (isinstance(cmp, ast.Compare) and len(cmp.ops) == 1):
        return None
    other = cmp.left if cmp.comparators[0] is node else cmp.comparators[0] if cmp.left is node else None
    if isinstance(other, ast.Call) and isinstance(other.func, ast.Name) and other.func.id == "str" and len(other.args) == 1:
        other = other.args[0]
    if isinstance(other, ast.Attribute) and other.attr == "type":
        other = other.value
    if not isinstance(other, ast.Name):
        return None
    fn = device_flow.facts(a).function_of(cmp)
    if fn is None or isinstance(fn, ast.Lambda):
        return None
    args = fn.args
    names = {x.arg for x in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
    if other.id not in names:
        return None
    # not reassigned in the function: the value is the caller's; and the function holds no other CUDA code (a
    # function migrated as a whole, `torch.cuda.amp.GradScaler(enabled=device.type == "cuda")`, keeps one meaning)
    for n in walk(fn):
        if isinstance(n, ast.Name) and n.id == other.id and isinstance(n.ctx, ast.Store):
            return None
        if n is not node and _torch_cuda_node(n, ctx):
            return None
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.split(":")[0] == "neuron":
            return None  # migrated in an earlier round (GradScaler("neuron", ...)): the test goes with the rest
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "cuda":
            return None
    return other.id


def _beside_module_choice(site, ctx, flow, member):
    """A test for the CUDA device type in a function (`configure_optimizers(..., device_type)`: `use_fused = ... and
    device_type == "cuda"`) of a file whose module-level code picks the device and gets (or got) NM203's neuron
    branch (build-nanogpt): left unchanged, with a finding, since a CUDA device is what it asks about; else None."""
    line = None if accelerator(ctx) or flow.function_of(member) is None else cuda_picker.module_choice(ctx)
    if line is None:
        return None
    return ctx.finding(site, f"{ctx.src(member)} tests for CUDA beside the module's device choice (line {line}), which "
                             "with NM203's branch also picks neuron: left unchanged, since a CUDA device is what it asks "
                             "about; add `neuron` here if the neuron device should take this path too")


def skip_dispatch(site, ctx):
    """(True, result) when the site is in device-dispatching code, (False, None) otherwise."""
    g = dispatch_guard(site, ctx)
    if g is None:
        return False, None
    return True, (g or None)


def paren_if_needed(site, text: str) -> str:
    """Parenthesise a replacement comparison unless the parent position makes it unnecessary."""
    parent = site.parent
    if isinstance(parent, (ast.If, ast.While, ast.Assert, ast.BoolOp, ast.Assign, ast.Return, ast.keyword, ast.Expr, ast.IfExp)):
        return text
    if isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.Not):
        return text
    if isinstance(parent, ast.Call) and site.node in parent.args:
        return text
    return f"({text})"


def call_args_src(call, ctx, drop=(), names=()) -> str:
    """The argument list of a call as source, keyword arguments named in `drop` left out; the first positional
    arguments passed by the `names` given (`names[i]=<argument i>`)."""
    parts = [f"{names[i]}={ctx.src(a)}" if i < len(names) else ctx.src(a) for i, a in enumerate(call.args)]
    for k in call.keywords:
        if k.arg in drop:
            continue
        parts.append(f"**{ctx.src(k.value)}" if k.arg is None else f"{k.arg}={ctx.src(k.value)}")
    return ", ".join(parts)


def string_quote(site, ctx) -> str:
    """A quote character usable at the site: inside an f-string (before Python 3.12), the one it does not use."""
    for anc in site.ancestors():
        if isinstance(anc, ast.JoinedStr):
            text = ctx.src(anc).lstrip("rRfFbBuU")
            return "'" if text.startswith('"') else '"'
    return '"'


# -- guards of CUDA-only code: a test is rewritten only together with its body ---------------------------
# torch.cuda names some rule migrates; every other torch.cuda name (get_device_name, get_device_properties,
# mem_get_info, nvtx, streams, ...), torch.version.cuda and the cuDNN version are CUDA-only and stay so
_MIGRATED_CUDA = {"is_available", "amp", "amp.autocast", "amp.autocast_mode.autocast", "amp.GradScaler", "is_bf16_supported",
                  "synchronize", "device_count", "current_device", "empty_cache", "memory_allocated", "max_memory_allocated",
                  "memory_reserved", "max_memory_reserved", "memory_stats", "reset_peak_memory_stats",
                  "reset_accumulated_memory_stats", "manual_seed", "manual_seed_all", "set_device", "get_device_name"}
_CUDA_ONLY = {"torch.version.cuda", "torch.backends.cudnn.version"}
_SHARED_PROPERTIES = {"name", "total_memory"}  # what get_device_properties() gives on CUDA and on TorchNeuron alike


def cuda_only_names(stmts, ctx, scope) -> list:
    """The CUDA-only names (no rule migrates them) used in `stmts`, in source order, each once."""
    found: list = []
    for stmt in stmts:
        for node in walk(stmt):
            if not isinstance(node, ast.Attribute):
                continue
            q = ctx.analysis.resolve(node, scope, count_use=False)
            if q is None or (q == "torch.cuda.get_device_properties" and shared_property_read(node, ctx)):
                continue
            if q in _CUDA_ONLY or (q.startswith("torch.cuda.") and q[len("torch.cuda."):] not in _MIGRATED_CUDA
                                   and not q.startswith("torch.cuda.amp.")):
                if q not in found:
                    found.append(q)
    return found


def shared_property_read(func, ctx) -> bool:
    """`func` (torch.cuda.get_device_properties) is called and the result's `name` or `total_memory` read: what
    TorchNeuron's device properties have too (NM204 migrates it)."""
    parent_of = ctx.analysis.parent_of
    call = parent_of.get(func)
    up = parent_of.get(call)
    return isinstance(call, ast.Call) and call.func is func and isinstance(up, ast.Attribute) and up.attr in _SHARED_PROPERTIES


def in_cuda_only_branch(site, ctx) -> bool:
    """An `if` branch around the site uses CUDA-only names (besides the site): the block stays CUDA as a whole
    (NM203 keeps a CUDA test guarding it), so its device queries stay too."""
    parent_of = ctx.analysis.parent_of
    child, up = site.node, parent_of.get(site.node)
    while up is not None and not isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        if isinstance(up, ast.If) and child is not up.test:
            branch = up.body if child in up.body else up.orelse
            if cuda_only_names(branch, ctx, site.scope):
                return True
        child, up = up, parent_of.get(up)
    return False


def guarded_cuda_only(node, ctx, scope) -> list:
    """`node` is (part of) the test of an `if` whose body uses CUDA-only names: those names, else []. Such a guard
    keeps its CUDA test: rewritten alone it would run the CUDA-only body on Neuron, where it fails."""
    parent_of = ctx.analysis.parent_of
    child, up = node, parent_of.get(node)
    while up is not None and isinstance(up, (ast.BoolOp, ast.UnaryOp, ast.Compare, ast.Call, ast.Attribute)):
        child, up = up, parent_of.get(up)
    if not isinstance(up, ast.If) or up.test is not child:
        return []
    key = f"cuda-only-body:{id(up)}"
    return cached(ctx.analysis, key, lambda _a: cuda_only_names(up.body, ctx, scope))


def guard_finding(site, ctx, names: list, what: str):
    shown = ", ".join(f"`{n}`" for n in names[:3]) + (", ..." if len(names) > 3 else "")
    return ctx.finding(site, f"{what} guards CUDA-only code ({shown}): kept, so that the block stays off on Neuron "
                             "as it was on any machine without CUDA; migrate the block by hand if it should run there")


# -- value sets: strings that flow into one comparison migrate together ---------------------------------
CONFIG_ROLES = {"cli-default", "choice", "field", "default", "dict-value", "env-default"}
_ROLE_TEXT = {"device": "device argument", "backend": "backend argument", "compare": "comparison", "choice": "argparse choice", "cli-default": "argparse default",
              "field": "config field", "default": "parameter default", "assign": "assignment", "dict-key": "dict key",
              "dict-value": "dict value", "element": "table entry", "env-default": "environment default",
              "return": "return value", "argument": "call argument", "other": "value"}


def string_member(site):
    """The literal a device-name string site stands for (an f-string head names its f-string), or None."""
    node = site.node
    if site.key.endswith(":"):
        joined = site.parent
        if isinstance(joined, ast.BinOp) and isinstance(joined.op, ast.Add) and joined.left is node:
            return joined  # `"cuda:" + str(rank)`
        if not isinstance(joined, ast.JoinedStr) or joined.values[0] is not node:
            return None
        return joined
    return node


def lines_text(lines: list[int]) -> str:
    return ("line " if len(lines) == 1 else "lines ") + ", ".join(str(n) for n in lines)


def set_fix(ctx, vs, kind: str, text_for):
    """One fix that rewrites every `kind` string of the value set: shared by the findings of all its members,
    so the set is applied whole or not at all."""

    def build(_analysis):
        fx = ctx.fixer()
        for m in vs.of_kind(kind):
            if kind == "cuda" and _choice_of_cuda_is_available(m.node, ctx, None):
                continue  # NM203 rewrites `"cuda" if torch.cuda.is_available() else ...` whole, in the same round
            if m.role == "compare" and guarded_cuda_only(m.node, ctx, ctx.analysis.module_scope):
                continue  # the test of a CUDA-only block: kept (its own finding says so)
            fx.replace(m.node, text_for(m, fx))
        return fx.build()

    return cached(ctx.analysis, f"set-fix:{ctx.rule.code}:{id(vs)}", build)


def value_set_finding(site, ctx, node, vs, kind: str, new: str):
    """Finding (and shared fix) for a string that belongs to a value set, following the set's plan."""
    members = vs.of_kind(kind)
    member = next(m for m in members if m.node is node)
    # a literal written straight into a device position (`.to("xla")`, `torch.device("xla")`), read nowhere else, is a
    # device move, not a backend name callers pass in: it fails once torch_xla is gone, even inside dispatch code
    lone_move = not vs.multi_backend and len(vs.members) == 1 and member.role == "device" and not vs.external
    if kind != "cuda" and not lone_move and (vs.multi_backend or device_flow.facts(ctx.analysis).is_dispatch(node)):
        # a device table or dispatch over several backends: the user-facing names keep meaning only unchanged
        if member is not members[0]:
            return None
        backends = sorted((vs.kinds | device_flow.facts(ctx.analysis).dispatch_backends(node)) - {"cpu", "meta"})
        return ctx.finding(site, f"{ctx.src(node)} is one of several backends here ({', '.join(backends)}): left unchanged "
                                 f"(lines {', '.join(map(str, vs.lines()))}), so that callers passing {kind!r} keep working; "
                                 f"add {new!r} beside it where the code picks the backend")
    raw = ctx.src(node)
    lines = vs.lines()
    plan = vs.plan()
    if plan == "all" and member.role == "compare":
        names = guarded_cuda_only(node, ctx, site.scope)
        if names:
            return guard_finding(site, ctx, names, f"the test with {raw}")
    if plan == "keep" or (plan == "free" and not any(m.devicey or m.direct_sink for m in members)):
        if plan == "free":
            if isinstance(ctx.analysis.parent_of.get(node), (ast.keyword, ast.List, ast.Tuple)):
                return ctx.finding(site, f"string {raw} may be a device choice in configuration: add 'neuron' where users pick the device")
            return None
        if vs.split:
            if member is not members[0]:
                return None
            return ctx.finding(site, f"{raw} reaches torch here, and the default in {', '.join(vs.split)} is the same value, "
                                     f"which that file keeps: left unchanged so that the two stay one; change them to "
                                     f"{new!r} together by hand")
        if member.role not in CONFIG_ROLES and member is not members[0]:
            return None
        return ctx.finding(site, f"{raw} is a configuration value ({_ROLE_TEXT[member.role]}) read together with the strings at "
                                 f"{lines_text(lines)}: all are kept, so that configs and callers passing {kind!r} keep "
                                 f"working; rename them together by hand if you want {new!r}")
    fix = set_fix(ctx, vs, kind, lambda m, fx: ctx.src(m.node).replace(kind, new, 1))
    note = ""
    if len(members) > 1 or vs.external:
        note = f"One value with the strings at {lines_text(lines)}: every {kind!r} becomes {new!r} together."
        if vs.external:
            note += f" Values from {', '.join(vs.external)} must now say {new!r}."
        if vs.elsewhere:
            note += f" Another file of the program passes it to torch ({', '.join(vs.elsewhere)})."
    if _float16_autocast_device(node, ctx):
        note = " ".join(x for x in (note, unscaled_float16_note(ctx)) if x)
    return ctx.finding(site, f"{raw} names the device ({_ROLE_TEXT[member.role]}): becomes {new!r}", fix=fix, note=note)


def _float16_autocast_device(node, ctx) -> bool:
    """`node` is the device type of a float16 autocast (`torch.amp.autocast(device_type="cuda", dtype=torch.float16)`)."""
    a = ctx.analysis
    parent = a.parent_of.get(node)
    call = a.parent_of.get(parent) if isinstance(parent, ast.keyword) and parent.arg == "device_type" else parent
    if not (isinstance(call, ast.Call) and (parent is not call or (call.args and call.args[0] is node))):
        return False
    if a.resolve(call.func, a.module_scope, count_use=False) not in ("torch.autocast", "torch.amp.autocast"):
        return False
    dtype = kwarg(call, "dtype", 1)
    return isinstance(dtype, (ast.Name, ast.Attribute)) and a.resolve(dtype, a.module_scope, count_use=False) in (
        "torch.float16", "torch.half")


# -- NM200 ------------------------------------------------------------------------------------------
@rule(
    code="NM200",
    name="cuda-method",
    summary="`.cuda()` on tensors and modules becomes `.to(\"neuron\")`",
    fix="safe",
    severity="error",
    triggers=[("method", "cuda")],
    docs=f"""
        `x.cuda()` moves a tensor or module to the current CUDA device and fails without CUDA. On TorchNeuron
        the move is `x.to("neuron")` (the landing page's first migration step: {TORCH_DOCS}). `non_blocking=`
        and `memory_format=` are kept. With a device index, `x.cuda(i)` becomes `x.to(torch.device("neuron", i))`
        and is flagged: in a distributed run each process owns one NeuronCore, `neuron:<local rank>`, and any
        other index fails. With
        `device-style = "accelerator"` the target is `_accelerator_device()`, a small inserted helper that returns
        `torch.accelerator.current_accelerator()` or the CPU when there is no accelerator.
    """,
    examples=[("model = model.cuda()", 'model = model.to("neuron")')],
)
def cuda_method(site, ctx):
    skip, out = skip_dispatch(site, ctx)
    if skip:
        return out
    call = site.call
    if has_star_args(call) or not isinstance(call.func, ast.Attribute):
        return ctx.finding(site, "`.cuda(*args)`: move it with `.to(\"neuron\")` by hand")
    fx = ctx.fixer()
    fx.scope = site.scope
    index = kwarg(call, "device", 0)
    extra = [f"{k.arg}={ctx.src(k.value)}" for k in call.keywords if k.arg != "device"]
    note = ""
    device_name = device_flow.facts(ctx.analysis).device_name_at(call)
    if device_name and (index is None or const_value(index, 0) == 0):
        target = device_name  # the program's own device variable, as a hand migration would write
    elif accelerator(ctx):
        target = agnostic_device(fx, nullable=True)  # .to(None) leaves a CPU tensor where it is
        if index is not None and const_value(index, 0) != 0:
            note = "The device index was dropped: the accelerator's current device is used (select it with torch.accelerator.set_device_index)."
    elif index is None:
        target = device_flow.facts(ctx.analysis).device_name_at(call) or '"neuron"'
    elif _bound_to_a_device(index, site, ctx):
        # `gpu = torch.device(args.device)` then `.cuda(gpu)` (VICReg): the argument is the device itself, whose
        # string the program's value flow rewrites; an index would go into torch.device("neuron", i)
        target = ctx.src(index)
    else:
        target = f'{fx.ref("torch")}.device("neuron", {ctx.src(index)})'
        note = LOCAL_DEVICE_NOTE
    recv = ctx.src_relative(call.func.value)  # SwAV's `torch.zeros(\n    ...,\n).cuda()` keeps its layout
    if not isinstance(call.func.value, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)):
        recv = f"({recv})"
    fx.replace(call, f"{recv}.to({', '.join([target, *extra])})")
    return ctx.finding(site, "`.cuda()` needs CUDA: use `.to(\"neuron\")`", fix=fx.build(), note=note)


# loss scalers that are CUDA's (and turn themselves off on a host without CUDA): timm's NativeScaler() wraps one
_CUDA_SCALERS = {"torch.cuda.amp.GradScaler", "timm.utils.NativeScaler", "timm.utils.cuda.NativeScaler",
                 "torch.amp.GradScaler", "torch.GradScaler", "torch.amp.grad_scaler.GradScaler"}


def unscaled_float16_note(ctx) -> str:
    """For a float16 autocast moved to Neuron: the note that the file's loss scaler is still CUDA's (it disables
    itself there, so float16 trains without loss scaling until it is migrated: NM207, NM234); "" when none."""
    line = cuda_scaler_line(ctx)
    if not line:
        return ""
    return (f"The loss scaler at line {line} is CUDA's, which disables itself on Neuron: with float16 the loss is no longer "
            "scaled until it is migrated (bfloat16 needs no scaler).")


def cuda_scaler_line(ctx) -> int:
    """The line of the file's first CUDA loss scaler (a GradScaler for CUDA, timm's NativeScaler), or 0."""
    def build(a):
        for c, q in a.resolved_calls:
            if q not in _CUDA_SCALERS or has_star_args(c):
                continue
            device = kwarg(c, "device", 0) if q != "torch.cuda.amp.GradScaler" else None
            if device is None or const_value(device) == "cuda":
                return c.lineno
        return 0

    return cached(ctx.analysis, "CUDA loss scaler", build)


def _bound_to_a_device(index, site, ctx) -> bool:
    """`index` is a name its scope binds once, to `torch.device(...)`: a device, not an index."""
    if not isinstance(index, ast.Name):
        return False
    scope = site.scope
    while scope is not None and index.id not in scope.bindings:
        scope = scope.parent
    if scope is None or scope.node is None:
        return False
    body = scope.node.body if isinstance(getattr(scope.node, "body", None), list) else []
    stores = [n for st in body for n in walk(st) if isinstance(n, ast.Name) and n.id == index.id
              and not isinstance(n.ctx, ast.Load)]
    if len(stores) != 1:
        return False
    assign = ctx.analysis.parent_of.get(stores[0])
    return (isinstance(assign, ast.Assign) and len(assign.targets) == 1 and assign.targets[0] is stores[0]
            and isinstance(assign.value, ast.Call)
            and ctx.analysis.resolve(assign.value.func, scope, count_use=False) == "torch.device")


def _choice_of_cuda_is_available(node, ctx, site) -> bool:
    """The string is the CUDA branch of `... if [not] torch.cuda.is_available() else ...` (directly or as the argument
    of `torch.device(...)` there): NM203 rewrites that choice whole."""
    parent = ctx.analysis.parent_of.get(node)
    if isinstance(parent, ast.Call) and isinstance(ctx.analysis.parent_of.get(parent), ast.IfExp):
        node, parent = parent, ctx.analysis.parent_of.get(parent)
    if not isinstance(parent, ast.IfExp) or node is parent.test:
        return False
    test = parent.test
    negated = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
    if negated:
        test = test.operand
    if (parent.orelse if negated else parent.body) is not node:
        return False
    return isinstance(test, ast.Call) and ctx.analysis.resolve(test.func, ctx.analysis.module_scope, count_use=False) == "torch.cuda.is_available"


def _agnostic_string(site, ctx, node, why, fx):
    """Accelerator-style replacement of one 'cuda' string at a device position."""
    parent = ctx.analysis.parent_of.get(node)
    first_of_device = isinstance(parent, ast.Call) and parent.args and parent.args[0] is node and len(parent.args) > 1
    quote = string_quote(site, ctx)
    if why in _TYPE_POSITIONS or first_of_device:
        return device_type_expr(site, ctx, fx)
    if isinstance(parent, ast.IfExp) and parent.body is node:
        # `"cuda" if use_cuda else "cpu"`: the test already says there is an accelerator
        return f"{fx.ref('torch')}.accelerator.current_accelerator()"
    nullable = (isinstance(parent, ast.Call) and isinstance(parent.func, ast.Attribute) and parent.func.attr == "to") or (
        isinstance(parent, ast.keyword) and parent.arg == "device")
    return agnostic_device(fx, nullable=nullable, bare=isinstance(parent, (ast.keyword, ast.Call, ast.Assign)), quote=quote)


# -- NM201 ------------------------------------------------------------------------------------------
_TYPE_POSITIONS = ("device type comparison", "device string test", ".startswith() argument", "device_type= argument",
                   "torch.autocast() argument", "torch.amp.autocast() argument", "torch.get_autocast_dtype() argument",
                   "torch.is_autocast_enabled() argument")


class _AsSite:
    """A site-like view of another node (an f-string) for device_string_context."""

    def __init__(self, site, node):
        self.node = node
        self.scope = site.scope
        self.parent = site.analysis.parent_of.get(node)


@rule(
    code="NM201",
    name="cuda-device-string",
    summary="the string 'cuda' naming a device becomes 'neuron'",
    fix="safe",
    severity="error",
    triggers=[("string", "cuda"), ("string", "cuda:")],
    docs=f"""
        Device strings: `.to('cuda')`, `device='cuda'`, `torch.device('cuda', i)`, `'cuda:0'`,
        `f'cuda:{{rank}}'`, `x.device.type == 'cuda'`, `torch.autocast('cuda')`, `device = 'cuda'`. Where the string
        flows into a device position it becomes `'neuron'` (an index is kept: in a distributed run each process
        owns one NeuronCore whose index is its local rank, so `f'cuda:{{local_rank}}'` keeps its meaning). Strings
        completed by formatting (`'cuda:%d' % rank`, `'cuda:{{}}'.format(gpu)`, also kept in a local that is only read
        as a device, `loc = 'cuda:{{}}'.format(gpu)` / `map_location=loc`, or returned) and the location tags of a
        `map_location` table (`{{'cuda:%d' % 0: 'cuda:%d' % rank}}`, the DDP tutorial's checkpoint) change too. Strings that may be configuration (argparse
        choices/defaults, dict values) follow their value set (`neuron_migrate.program.values`, as NM103): a value
        that reaches a torch device position changes in every place together (argparse default and choices
        included); a label that configuration may pass in is kept everywhere. Device-dispatching code (a function
        that tests several backends, `device.type == "cuda"` next to `"mps"`, a `{{"cuda": ..., "xpu": ...}}`
        table) is left unchanged with a finding: add a neuron branch beside the CUDA one; where its device picker
        gets its neuron branch (NM203), a conditional there that asks whether the device names CUDA
        (`device_type = "cuda" if device.startswith("cuda") else "cpu"`, `torch.amp.autocast(device_type="cuda", ...)
        if device == "cuda" else nullcontext()`) gets the neuron device's own answer after the CUDA one (before, the
        neuron device took the CPU's: a CPU autocast does nothing to neuron tensors), or, where that answer names no
        device of its own (llm.c's `torch.amp.autocast(device_type=device_type, ...) if device_type == "cuda" else
        nullcontext()`), the test asks for neuron too (`... or device_type == "neuron"`); a test for CUDA in a function
        of that file (`use_fused = ... and device_type == "cuda"` in build-nanogpt's `configure_optimizers`) stays,
        with a finding, since the file still hands out CUDA devices on GPU hosts; so does such a test of a parameter in
        a function of another file of the program (the repository model: `model.py`'s `device_type == "cuda"` when
        `train_gpt2.py` picks the device), where the function holds no other CUDA code. A picker whose CUDA branch
        a flag chooses and whose fallback is a setting (`if opt.cuda: ...` / `else: device = torch.device(opt.device)`,
        pytorch/examples' super_resolution) gets no neuron branch: without the flag the user's setting decides, and
        the finding says to set it to 'neuron'. With
        `device-style = "accelerator"` the string becomes `torch.accelerator.current_accelerator()` where None is
        acceptable (`.to()`, `device=`), else `(torch.accelerator.current_accelerator() or torch.device("cpu"))`
        (its `.type` where a type string is expected): plain public API, the accelerator or the CPU.
        Source: {TORCH_DOCS} (device placement `cuda` -> `neuron`).
    """,
    examples=[("x = x.to('cuda')", "x = x.to('neuron')"), ("if t.device.type == 'cuda':\n    pass", "if t.device.type == 'neuron':\n    pass")],
)
def cuda_device_string(site, ctx):
    node = string_member(site)
    if node is None:
        return None
    skip, out = skip_dispatch(site, ctx)
    if skip:
        return out
    if _choice_of_cuda_is_available(node, ctx, site):
        return None  # NM203 rewrites the whole choice
    target = _AsSite(site, node) if node is not site.node else site
    if device_string_context(target, ctx) == "map_location table":
        # torch.load's location tags ({'cuda:0': f'cuda:{rank}'}): strings in either style, keys and values alike
        fx = ctx.fixer()
        fx.scope = site.scope
        fx.replace(node, ctx.src(node).replace("cuda", "neuron", 1))
        return ctx.finding(site, f"{ctx.src(node)} is a device in a map_location table: becomes 'neuron' (a rank's "
                                 "NeuronCore has its local rank as index)", fix=fx.build())
    vs = values.facts(ctx.analysis).set_of(node)
    parent = ctx.analysis.parent_of.get(node)
    moves = ((isinstance(parent, ast.Call) and isinstance(parent.func, ast.Attribute) and parent.func.attr == "to"
              and parent.args and parent.args[0] is node) or (isinstance(parent, ast.keyword) and parent.arg == "device"))
    if moves and isinstance(node, ast.Constant) and node.value == "cuda" and (vs is None or len(vs.members) == 1):
        device_name = device_flow.facts(ctx.analysis).device_name_at(node)
        if device_name:
            fx = ctx.fixer()
            fx.scope = site.scope
            fx.replace(node, device_name)
            return ctx.finding(site, f"{ctx.src(node)} names the device: use the program's `{device_name}`", fix=fx.build())
    if not accelerator(ctx):
        pickers = (getattr(ctx.analysis, "outside", None) or {}).get("pickers")
        param = _compared_parameter(node, ctx) if pickers and vs is not None else None
        if param is not None and all(m.role == "compare" for m in vs.members):
            # gpt2-style model.py: `configure_optimizers(self, ..., device_type)` asks `device_type == "cuda"` of what
            # another file's device picker hands out: cuda on GPU hosts, neuron (NM203's branch) on Trainium
            return ctx.finding(site, f"{ctx.src(node)} tests whether `{param}`, a parameter, is CUDA, and another file of "
                                     f"the program picks the device among CUDA and other accelerators "
                                     f"({', '.join(pickers)}; with NM203's branch, neuron too): left unchanged, since a "
                                     "CUDA device is what it asks about; add `neuron` here if the neuron device should "
                                     "take this path too")
        if vs is not None:
            return value_set_finding(site, ctx, node, vs, "cuda", "neuron")
        target = _AsSite(site, node) if node is not site.node else site
        if device_string_context(target, ctx) is None:
            if isinstance(ctx.analysis.parent_of.get(node), (ast.keyword, ast.List, ast.Tuple)):
                return ctx.finding(site, f"string {ctx.src(node)} may be a device choice in configuration: add 'neuron' where users pick the device")
            return None
        fx = ctx.fixer()
        fx.scope = site.scope
        fx.replace(node, ctx.src(node).replace("cuda", "neuron", 1))
        return ctx.finding(site, f"{ctx.src(node)} names the device: becomes 'neuron'", fix=fx.build())
    # accelerator style: device positions become the accelerator; a value that is also a label stays
    target = _AsSite(site, node) if node is not site.node else site
    why = device_string_context(target, ctx)
    plain = vs is None or all(m.role in ("device", "assign") or m.real_device_compare for m in vs.members
                              if m.kind == "cuda") and not vs.external
    if why is None and not (vs is not None and vs.sink and plain):
        if vs is not None and vs.sink:
            return ctx.finding(site, f"{ctx.src(node)} is a device value that is also compared or configured (lines "
                                     f"{', '.join(map(str, vs.lines()))}): device-style accelerator cannot keep both; "
                                     "migrate by hand or use device-style neuron")
        if isinstance(ctx.analysis.parent_of.get(node), (ast.keyword, ast.List, ast.Tuple)):
            return ctx.finding(site, f"string {ctx.src(node)} may be a device choice in configuration: add 'neuron' where users pick the device")
        return None
    if not plain:
        return ctx.finding(site, f"{ctx.src(node)} is a device value that is also compared or configured (lines "
                                 f"{', '.join(map(str, vs.lines()))}): device-style accelerator cannot keep both; "
                                 "migrate by hand or use device-style neuron")
    fx = ctx.fixer()
    fx.scope = site.scope
    has_index = ":" in (node.value if isinstance(node, ast.Constant) else "cuda:")
    fx.replace(node, _agnostic_string(site, ctx, node, why, fx))
    parent = ctx.analysis.parent_of.get(node)
    first_of_device = isinstance(parent, ast.Call) and parent.args and parent.args[0] is node and len(parent.args) > 1
    note = "The device index was dropped: the accelerator's current device is used." if has_index and not first_of_device else ""
    return ctx.finding(site, f"'cuda' as a device ({why or 'device value'}): becomes the device-agnostic accelerator", fix=fx.build(), note=note)


# -- NM202 ------------------------------------------------------------------------------------------
@rule(
    code="NM202",
    name="is-cuda",
    summary="`x.is_cuda` becomes `x.device.type == \"neuron\"`",
    fix="safe",
    severity="warning",
    triggers=[("attr", "is_cuda")],
    docs="""
        `x.is_cuda` is False for every tensor on TorchNeuron, so code that branches on it silently takes the
        CPU path. It becomes `x.device.type == "neuron"`; with `device-style = "accelerator"`,
        `x.device.type == _accelerator_device().type`. An assignment to `is_cuda` (a mock) is left alone.
    """,
    examples=[("if x.is_cuda:\n    pass", 'if x.device.type == "neuron":\n    pass')],
)
def is_cuda(site, ctx):
    if not isinstance(site.node.ctx, ast.Load):
        return None
    skip, out = skip_dispatch(site, ctx)
    if skip:
        return out
    fx = ctx.fixer()
    fx.scope = site.scope
    recv = ctx.src(site.node.value)
    if not isinstance(site.node.value, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)):
        recv = f"({recv})"
    rhs = device_type_expr(site, ctx, fx) if accelerator(ctx) else f"{string_quote(site, ctx)}neuron{string_quote(site, ctx)}"
    fx.replace(site.node, paren_if_needed(site, f"{recv}.device.type == {rhs}"))
    return ctx.finding(site, "`.is_cuda` is always False on Neuron: test the device type", fix=fx.build())


# -- NM203 ------------------------------------------------------------------------------------------
def _cuda_device_value(node, ctx, site):
    """'cuda...' string or torch.device('cuda'...) call used as a device value: its neuron form, else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.split(":")[0] == "cuda":
        return ctx.src(node).replace("cuda", "neuron", 1), True
    if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant) \
            and str(node.values[0].value).startswith("cuda:"):
        return ctx.src(node).replace("cuda", "neuron", 1), True
    if isinstance(node, ast.Call) and ctx.analysis.resolve(node.func, site.scope, count_use=False) == "torch.device" and node.args:
        first = node.args[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str) and first.value.split(":")[0] == "cuda":
            return ctx.src(node).replace("cuda", "neuron", 1), False
    return None


@rule(
    code="NM203",
    name="cuda-is-available",
    summary="`torch.cuda.is_available()` becomes `torch.accelerator.is_available()`; device choice picks neuron",
    fix="safe",
    severity="error",
    triggers=[("call", "torch.cuda.is_available")],
    docs="""
        `torch.cuda.is_available()` is False on a Trainium host, so `"cuda" if torch.cuda.is_available() else "cpu"`
        quietly trains on the CPU. The choice becomes `"neuron" if torch.accelerator.is_available() else "cpu"`
        (same for a `torch.device(...)` body); with `device-style = "accelerator"` the whole choice becomes
        `_accelerator_device()` (`.type` where it chose a string), which is the accelerator or the CPU. In a function
        whose device picker gets its neuron branch, a chain with no else whose last branch asks only for CUDA
        (imagenet's resume: `if args.gpu is None: ... elif torch.cuda.is_available(): loc = 'cuda:{}'.format(args.gpu)`)
        gets a neuron branch doing the same on the neuron device: a Neuron host would take no branch. A picker
        with no else whose fallback is the assignment right before it (`device = "cpu"` / `if
        torch.cuda.is_available(): device = "cuda"` / `elif ...mps...: device = "mps"`, build-nanogpt's) gets its
        neuron branch at its end. A picker's CUDA branch may hold CUDA-only code (yolov5's select_device reads
        `torch.cuda.get_device_properties`): it stays for GPU hosts, and the neuron branch, a copy of the other
        backend's, names neuron where that one named its backend (a label such as `"MPS"` too). No branch is added
        where the same code shares the model between processes (`model.share_memory()`, pytorch/examples'
        mnist_hogwild): only CPU tensors (and CUDA's, through IPC) can be shared, so a Neuron host keeps the CPU
        device, and the finding says so. Beside a picker, CUDA-only statements that run on every host (its `if ddp:`
        block) keep their CUDA form where CUDA is available and take their neuron form elsewhere: `assert
        torch.cuda.is_available()` asks `torch.accelerator.is_available()`, `backend='nccl'` becomes `'nccl' if
        torch.cuda.is_available() else 'neuron'`, `device = f'cuda:{rank}'` likewise, and `torch.cuda.set_device()`
        runs under `if torch.cuda.is_available():`. Other
        uses become `torch.accelerator.is_available()`, True on a Neuron host (TorchNeuron registers with
        `torch.accelerator`: https://awsdocs-neuron.readthedocs-hosted.com/en/latest/torch/index.html).
    """,
    examples=[('device = "cuda" if torch.cuda.is_available() else "cpu"', 'device = "neuron" if torch.accelerator.is_available() else "cpu"')],
)
def cuda_is_available(site, ctx):
    picker = cuda_picker.picker_of(site, ctx) if device_flow.may_dispatch(ctx.analysis) else None
    # a picker's CUDA branch may hold CUDA-only code (yolov5's select_device reads get_device_properties): it stays
    # for GPU hosts beside the neuron branch
    names = guarded_cuda_only(site.node, ctx, site.scope) if picker is None or accelerator(ctx) else []
    if names and not (not accelerator(ctx) and cuda_picker.in_neuron_chain(site.node, ctx)):
        return guard_finding(site, ctx, names, "torch.cuda.is_available()")
    if picker is not None and picker.shared and not accelerator(ctx):
        return ctx.finding(site, f"the device is picked among several backends, and `{ctx.src(picker.blocked)}` (line "
                                 f"{picker.blocked.lineno}) shares the model between processes (Hogwild): only CPU "
                                 "tensors (and CUDA's, through IPC) can be shared, so on a Neuron host the program keeps "
                                 "its CPU device; the choice is left unchanged")
    if picker is not None and picker.user_device is not None and not accelerator(ctx):
        if any(sub is site.node for sub in walk(picker.branches[picker.cuda_index].test)):
            return _user_device_finding(site, ctx, picker)
    if picker is not None and picker.blocked is not None and not accelerator(ctx):
        test = picker.blocked
        if any(sub is site.node for sub in walk(picker.branches[picker.cuda_index].test)):
            if not any(b.test is test for b in picker.branches):
                return ctx.finding(site, f"the device is picked among several backends, and the choice at line {test.lineno} in "
                                         "the same function cannot get its neuron branch (see there): this one is left "
                                         "unchanged too, so that the model and the data never end on different devices")
            return ctx.finding(site, f"the device is picked among several backends, and the test at line {test.lineno} "
                                     f"(`{ctx.src(test)}`) is true on a Neuron host: a neuron branch added here would never "
                                     "run (the program would train on the host CPU), and the branches a Neuron host would "
                                     "reach instead hold CUDA code outside a `torch.cuda.is_available()` block; the choice is "
                                     "left unchanged: add the neuron case to that test and those branches by hand")
    if picker is None and device_flow.may_dispatch(ctx.analysis) and not accelerator(ctx) and any(
            p.reach is not None and p.blocked is None and site.node.lineno in p.lines for p in cuda_picker.pickers(ctx)):
        return None  # the "no accelerator" test of a picker: its fix amends it, and says so at the CUDA branch
    if picker is not None and picker.blocked is None:
        kinds = ", ".join(["cuda", picker.other_kind])
        fx = ctx.fixer()
        fx.scope = site.scope
        if not accelerator(ctx) and cuda_picker.insert_branch(picker, ctx, fx):
            return ctx.finding(site, f"the device is picked among several backends ({kinds}, else cpu): a neuron branch is added "
                                     "before the CPU fallback; the CUDA branch stays for GPU hosts", fix=fx.build(),
                               note="On a Trainium host the new branch picks `neuron` (TorchNeuron registers it with "
                                    "torch.accelerator); on a GPU or Mac the earlier branches still come first.")
    tail = cuda_picker.tail_of(site, ctx) if not accelerator(ctx) and device_flow.may_dispatch(ctx.analysis) else None
    if tail is not None:
        fx = ctx.fixer()
        fx.scope = site.scope
        if cuda_picker.insert_tail(tail, ctx, fx):
            return ctx.finding(site, "a branch that runs only when CUDA is available ends a chain with no else, in a function "
                                     "whose device picker gets a neuron branch: a Neuron host would take no branch; a "
                                     "neuron branch doing the same on the neuron device is added after it", fix=fx.build(),
                               note="On a Trainium host the new branch does what the CUDA branch does on a GPU host, with "
                                    "the neuron device (TorchNeuron registers it with torch.accelerator).")
    skip, out = skip_dispatch(site, ctx)
    if skip:
        return out
    fx = ctx.fixer()
    fx.scope = site.scope
    torch = fx.ref("torch")
    avail = f"{torch}.accelerator.is_available()"
    node = site.node
    parent = site.parent
    negated = isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.Not)
    if negated:  # "cpu" if not torch.cuda.is_available() else "cuda"
        node, parent = parent, ctx.analysis.parent_of.get(parent)
    if isinstance(parent, ast.IfExp) and parent.test is node:
        cuda_branch, other = (parent.orelse, parent.body) if negated else (parent.body, parent.orelse)
        chosen = _cuda_device_value(cuda_branch, ctx, site)
        if chosen is not None:
            text, is_string = chosen
            where = parent
            outer = ctx.analysis.parent_of.get(parent)
            if accelerator(ctx):
                current = f"{torch}.accelerator.current_accelerator()"
                if (is_string and isinstance(outer, ast.Call) and len(outer.args) == 1 and not outer.keywords
                        and ctx.analysis.resolve(outer.func, site.scope, count_use=False) == "torch.device"):
                    # torch.device("cuda" if ... else "cpu"): the whole call is the choice
                    where, is_string = outer, False
                    other_text = f'{torch}.device({ctx.src(other)})'
                else:
                    other_text = ctx.src(other)
                text = current + (".type" if is_string else "")
                note = "The CUDA device index was dropped: the accelerator's current device is used." if ":" in ctx.src(cuda_branch) else ""
            else:
                other_text = ctx.src(other)
                note = ""
            body, orelse = (other_text, text) if negated else (text, other_text)
            fx.replace(where, f"{body} if {'not ' if negated else ''}{avail} else {orelse}")
            return ctx.finding(site, "device chosen by torch.cuda.is_available() (False on Neuron): the choice picks the "
                                     "accelerator", fix=fx.build(), note=note)
    fx.replace(site.node, avail)
    return ctx.finding(site, "torch.cuda.is_available() is False on Neuron: use torch.accelerator.is_available()", fix=fx.build())


# -- NM204 ------------------------------------------------------------------------------------------
# torch.cuda call -> (neuron-style replacement, accelerator-style replacement, value without accelerator)
# "acc:" = torch.accelerator.<name>, "neuron:" = torch.neuron.<name>, "torch:" = torch.<name>,
# "devmod:" = torch.get_device_module().<name> (the current accelerator's device module)
_DEVICE_CALLS = {
    "synchronize": ("acc:synchronize", "acc:synchronize", "None"),
    "device_count": ("acc:device_count", "acc:device_count", None),
    "current_device": ("acc:current_device_index", "acc:current_device_index", "0"),
    "empty_cache": ("acc:empty_cache", "acc:empty_cache", "None"),
    "memory_allocated": ("acc:memory_allocated", "acc:memory_allocated", "0"),
    "max_memory_allocated": ("acc:max_memory_allocated", "acc:max_memory_allocated", "0"),
    "memory_reserved": ("acc:memory_reserved", "acc:memory_reserved", "0"),
    "max_memory_reserved": ("acc:max_memory_reserved", "acc:max_memory_reserved", "0"),
    "memory_stats": ("acc:memory_stats", "acc:memory_stats", "{}"),
    "reset_peak_memory_stats": ("acc:reset_peak_memory_stats", "acc:reset_peak_memory_stats", "None"),
    "reset_accumulated_memory_stats": ("acc:reset_accumulated_memory_stats", "acc:reset_accumulated_memory_stats", "None"),
    "manual_seed": ("torch:manual_seed", "torch:manual_seed", None),
    "manual_seed_all": ("torch:manual_seed", "torch:manual_seed", None),
    "set_device": ("helper:_neuron_set_device", "helper:_neuron_set_device", None),
    # torch.accelerator has no such query; the accelerator's device module has (torch.neuron: torch-neuronx neuron.py)
    "is_bf16_supported": ("devmod:is_bf16_supported", "devmod:is_bf16_supported", None),
    # the device's name (torch.neuron.get_device_name(i): "neuron:i"), and of its properties only those TorchNeuron's
    # have too (name, total_memory; CUDA's major/minor/multi_processor_count stay with NM205)
    "get_device_name": ("devmod:get_device_name", "devmod:get_device_name", None),
    "get_device_properties": ("devmod:get_device_properties", "devmod:get_device_properties", None),
    # torch 2.13's device-generic forms (keyword arguments only for the classes: torch.Event / torch.Stream take the
    # device first, torch.cuda.Event takes enable_timing first)
    "mem_get_info": ("acc:get_memory_info", "acc:get_memory_info", None),
    "device": ("acc:device_index", "acc:device_index", None),
    "Event": ("torch:Event", "torch:Event", None),
    "Stream": ("torch:Stream", "torch:Stream", None),
}
_CLASSES = {"device", "Event", "Stream"}  # used as values (isinstance, annotations) they stay: NM205 reports them


def _spell(fx, target: str) -> str:
    kind, name = target.split(":")
    torch = fx.ref("torch")
    return {"acc": f"{torch}.accelerator.{name}", "neuron": f"{torch}.neuron.{name}", "torch": f"{torch}.{name}",
            "devmod": f"{torch}.get_device_module().{name}"}.get(kind) or fx.helper(name)


@rule(
    code="NM204",
    name="cuda-device-module",
    summary="torch.cuda device calls (synchronize, device_count, set_device, manual_seed, memory_*) move to torch.accelerator / torch.manual_seed",
    fix="safe",
    severity="error",
    triggers=[("call", f"torch.cuda.{n}") for n in _DEVICE_CALLS] + [("ref", f"torch.cuda.{n}") for n in _DEVICE_CALLS],
    docs="""
        `torch.cuda.synchronize/device_count/current_device/empty_cache/memory_allocated/max_memory_allocated/
        memory_reserved/max_memory_reserved/memory_stats/reset_peak_memory_stats` become the `torch.accelerator`
        call of the same meaning (`current_device` -> `current_device_index`). `manual_seed(_all)` has no
        `torch.accelerator` form: where `torch.manual_seed(seed)` with the same seed runs beside it, among
        statements that only seed (the usual `set_seed`), that already seeds every device and the call is
        removed; elsewhere it becomes `torch.manual_seed(seed)`, which seeds every device and runs on any machine
        (unsafe: it also reseeds the CPU generator). `torch.neuron.manual_seed` is not written: it exists only
        where torch-neuronx is installed. `is_bf16_supported()` (a precision choice such as `'bfloat16' if ...
        torch.cuda.is_bf16_supported() else 'float16'`) becomes `torch.get_device_module().is_bf16_supported()`, the
        current accelerator's own answer (torch.neuron has it on TorchNeuron, torch.cuda on a GPU). A `set_device(i)` statement is removed (device-style neuron); elsewhere it becomes `_neuron_set_device(i)`, an inserted helper
        that selects the device only when the process sees several: in a distributed run TorchNeuron gives each
        process one NeuronCore (index: its local rank), already its current device.
        In device-dispatching code (a function that picks among several backends) these calls stay CUDA, except an
        unguarded `torch.cuda.synchronize()`, which runs on every host the picker chooses: it becomes
        `torch.accelerator.synchronize()` (the same on a GPU host). Once the function's picker picks neuron, a CUDA
        call or `.cuda()` that no backend test guards is reported there (on a Neuron host it fails, seeds nothing,
        reports no memory, or an autocast is disabled).
        `torch.cuda.device(i)` (the context manager) becomes `torch.accelerator.device_index(i)`,
        `mem_get_info()` `torch.accelerator.get_memory_info()`, and `torch.cuda.Event(enable_timing=...)` /
        `torch.cuda.Stream(priority=...)` the device-generic `torch.Event` / `torch.Stream` (the current
        accelerator's; with keyword arguments only, since those take the device first); the classes used as values
        (`isinstance`) are left to NM205. `get_device_name(i)` (a log line's GPU name) becomes
        `torch.get_device_module().get_device_name(i)` (TorchNeuron's torch.neuron gives "neuron:i"), and
        `get_device_properties(i).name` / `.total_memory` the same through the device module (TorchNeuron's properties
        have those two; CUDA-only fields such as `major` stay with NM205). `get_device_capability` is not mapped:
        torch.accelerator's returns a dict of supported dtypes, not CUDA's (major, minor).
        With `device-style = "accelerator"` calls that raise without an accelerator are guarded
        (`... if torch.accelerator.is_available() else 0`). Used as a value (`sync = torch.cuda.synchronize`), the
        name becomes a lambda calling the replacement.
    """,
    examples=[("torch.cuda.synchronize()", "torch.accelerator.synchronize()"),
              ("torch.manual_seed(0)\ntorch.cuda.manual_seed_all(0)", "torch.manual_seed(0)")],
)
def cuda_device_module(site, ctx):
    if not (site.kind == "call" and site.key in _HOST_AGNOSTIC
            and _runs_on_every_host(site.node, device_flow.facts(ctx.analysis).function_of(site.node), ctx)):
        skip, out = skip_dispatch(site, ctx)
        if skip:
            return out
    name = site.key.rsplit(".", 1)[1]
    neuron_t, acc_t, default = _DEVICE_CALLS[name]
    if name in _CLASSES and (site.kind != "call" or (name != "device" and (site.call.args or has_star_args(site.call)))):
        return None  # a class used as a value, or an Event/Stream built with positional arguments: NM205
    if name == "device_count" and site.kind == "call":
        if data_parallel_guard(site.call, ctx) is not None:
            return None  # `if torch.cuda.device_count() > 1: DataParallel(...)` stays CUDA: NM230 says why at the wrap
    if name in ("get_device_name", "get_device_properties"):
        if name == "get_device_properties" and not (site.kind == "call" and shared_property_read(site.call.func, ctx)):
            return None  # the properties object itself, or a CUDA-only field (major, minor, ...): NM205
        if in_cuda_only_branch(site, ctx):
            return None  # a log line of a block that stays CUDA (torch.version.cuda beside it): NM205
    fx = ctx.fixer()
    fx.scope = site.scope
    style_acc = accelerator(ctx)
    if name == "set_device" and not style_acc and site.kind == "call" and site.is_statement:
        # TorchNeuron's process group makes the process's one NeuronCore (index: its local rank) its current device
        fx.delete(site.stmt)
        return ctx.finding(site, "torch.cuda.set_device(): not needed on Neuron, where the process group makes each process's one "
                                 "NeuronCore (its local rank) the current device: removed", fix=fx.build(),
                           note="If one process really drives several NeuronCores, select one with torch.accelerator.set_device_index(i).")
    if name in ("manual_seed", "manual_seed_all") and site.kind == "call":
        from neuron_migrate.rules.builtin.xla_core import seed_every_device

        seed = kwarg(site.call, "seed", 0)
        if seed is not None and not has_star_args(site.call):
            return seed_every_device(site, ctx, seed, f"torch.cuda.{name}(seed)")
    target = _spell(fx, acc_t if style_acc else neuron_t)
    safety = "unsafe" if name in ("manual_seed", "manual_seed_all") else None  # torch.manual_seed also seeds the CPU
    note = "torch.manual_seed also reseeds the CPU generator." if safety else ""
    guard = style_acc and default is not None

    def wrap(call_text: str) -> str:
        return f"({call_text} if {fx.ref('torch')}.accelerator.is_available() else {default})" if guard else call_text

    if site.kind == "ref":
        fx.replace(site.node, f"(lambda *args, **kwargs: {wrap(target + '(*args, **kwargs)')})")
        return ctx.finding(site, f"torch.cuda.{name} used as a value: replaced by a callable using {target}", fix=fx.build(safety))
    call = site.call
    args = call_args_src(call, ctx)
    if guard and site.is_statement and default == "None":
        # a statement: guard it with `if`, not a conditional expression
        fx.replace(site.stmt, f"if {fx.ref('torch')}.accelerator.is_available():\n" + indent_statement(f"{target}({args})"))
        return ctx.finding(site, f"torch.cuda.{name}() needs CUDA: use {target}()", fix=fx.build(safety), note=note)
    text = wrap(f"{target}({args})")
    if guard and (site.is_statement or isinstance(site.parent, (ast.Assign, ast.keyword, ast.Return))):
        text = text[1:-1]
    fx.replace(call, text)
    return ctx.finding(site, f"torch.cuda.{name}() needs CUDA: use {target}()", fix=fx.build(safety), note=note)


# nn.DataParallel (NM230): its guard on the CUDA device count stays CUDA
DATA_PARALLEL = ("torch.nn.DataParallel", "torch.nn.parallel.DataParallel", "torch.nn.parallel.data_parallel.DataParallel",
                 "torch.nn.parallel.data_parallel")


def wraps_data_parallel(stmts, ctx) -> bool:
    """Some statement of `stmts` calls nn.DataParallel (or nn.parallel.data_parallel)."""
    a = ctx.analysis
    return any(isinstance(n, ast.Call) and isinstance(n.func, (ast.Name, ast.Attribute))
               and (a.resolve(n.func, a.module_scope, count_use=False) or "") in DATA_PARALLEL
               for stmt in stmts for n in walk(stmt))


def data_parallel_guard(node, ctx):
    """The `if` whose test holds `node` (through comparisons and boolean operators) and whose body wraps the model
    in DataParallel (`if torch.cuda.device_count() > 1: model = nn.DataParallel(model)`), else None."""
    parents = ctx.analysis.parent_of
    child, p = node, parents.get(node)
    while isinstance(p, (ast.Compare, ast.BoolOp, ast.UnaryOp)):
        child, p = p, parents.get(p)
    if isinstance(p, ast.If) and p.test is child and wraps_data_parallel(p.body, ctx):
        return p
    return None


# -- NM205 ------------------------------------------------------------------------------------------
@rule(
    code="NM205",
    name="cuda-api",
    summary="other torch.cuda APIs have no automatic rewrite",
    fix="none",
    severity="warning",
    triggers=[("call", "torch.cuda.*"), ("ref", "torch.cuda.*"), ("store", "torch.cuda.*"), ("ref", "torch.version.cuda")],
    docs="""
        Catch-all for `torch.cuda` names without a rewrite: streams and events (`torch.cuda.Stream`,
        `torch.cuda.stream`, `Event`), `get_device_properties` read for CUDA-only fields, `nvtx`, `torch.cuda.amp.custom_fwd`
        and the like. Use the `torch.accelerator` API where it has the call (`torch.accelerator.current_stream`,
        `torch.Stream`, `torch.Event`), `torch.neuron.*` (get_device_properties, Stream, Event) otherwise, or
        `torch.amp.custom_fwd(device_type="neuron")`.
        Also `torch.version.cuda` as an operand of an `and` whose other operands other rules migrate to the neuron
        device (the `bfloat_support()` of pytorch/examples' FSDP T5 example and the recipes copied from it:
        `torch.version.cuda and torch.cuda.is_bf16_supported() and dist.is_nccl_available() ...`): it is None on
        TorchNeuron, so the whole test is false there and the migrated checks never run (bf16 mixed precision
        silently off on Trainium). Reported, not rewritten: what the test should ask on Neuron is the user's choice.
    """,
    examples=[("s = torch.cuda.Stream()", None)],
)
def cuda_api(site, ctx):
    if site.key == "torch.version.cuda":
        return _cuda_version_gate(site, ctx)
    if site.key in ("torch.cuda", "torch.cuda.amp"):
        return None
    skip, out = skip_dispatch(site, ctx)
    if skip:
        return out
    name = site.key[len("torch.cuda."):]
    if name == "device_count" and site.kind == "call" and data_parallel_guard(site.call, ctx) is not None:
        return None  # kept on purpose (NM230 says why at the DataParallel wrap)
    if site.kind == "store":
        # `torch.cuda.is_bf16_supported = lambda: True` (AWS's BERT sample, so that CUDA-style autocast ran on XLA):
        # nothing needs CUDA here, but the patch only matters to code that still asks torch.cuda
        return ctx.finding(site, f"`torch.cuda.{name}` is replaced here: TorchNeuron's code paths (autocast on 'neuron', "
                                 "torch.accelerator) do not read it; remove the assignment unless other code still asks "
                                 f"torch.cuda.{name}")
    return ctx.finding(site, f"`torch.cuda.{name}` needs CUDA: replace it with its torch.accelerator / torch.neuron equivalent by hand")


# checks that other rules migrate to (or that already ask) the neuron device: after the rewrite they stand where the
# CUDA ones stood, and the `and` must still be reported
_NEURON_CHECKS = {"torch.distributed.is_nccl_available", "torch.distributed.is_backend_available", "torch.get_device_module"}


def _device_check(q) -> bool:
    """`q` (a resolved name, or None) is a device check some rule migrates to the neuron device, or its migrated form."""
    if q is None:
        return False
    if q.startswith("torch.cuda."):
        return q[len("torch.cuda."):] in _MIGRATED_CUDA
    return q in _NEURON_CHECKS or q.startswith("torch.accelerator.")


def _cuda_version_gate(site, ctx):
    """`torch.version.cuda` as an operand (or `... is not None`) of an `and` with operands that other rules migrate to
    the neuron device: the finding that the `and` is always false on TorchNeuron. Else None."""
    parent_of = ctx.analysis.parent_of
    operand, up = site.node, parent_of.get(site.node)
    if isinstance(up, ast.Compare) and len(up.ops) == 1 and isinstance(up.ops[0], (ast.IsNot, ast.NotEq)) \
            and isinstance(up.comparators[0], ast.Constant) and up.comparators[0].value is None:
        operand, up = up, parent_of.get(up)
    if not (isinstance(up, ast.BoolOp) and isinstance(up.op, ast.And)) or operand not in up.values:
        return None
    migrated = []
    for value in up.values[up.values.index(operand) + 1:]:
        for n in walk(value):
            if isinstance(n, ast.Attribute):
                if _device_check(ctx.analysis.resolve(n, site.scope, count_use=False)):
                    name = ctx.src(n)
                    if name not in migrated:
                        migrated.append(name)
    if not migrated:
        return None
    shown = ", ".join(f"`{m}`" for m in migrated[:3])
    return ctx.finding(site, f"`torch.version.cuda` is None on TorchNeuron, so this `and` is always false there and the checks "
                             f"migrated to the neuron device after it ({shown}) never run: drop the CUDA version test "
                             "for Neuron (or move it to a CUDA-only branch) by hand")


@rule(
    code="NM220",
    name="cuda-import",
    summary="torch.cuda import that no code uses any more after migration",
    fix="safe",
    severity="info",
    triggers=[("import", "torch.cuda*")],
    docs="""
        After `torch.cuda.amp.autocast`, `torch.cuda.synchronize` and friends are migrated, imports such as
        `from torch.cuda.amp import autocast` are dead code pointing at a CUDA-only module. An import of a
        `torch.cuda` name that nothing uses is removed (its still-used siblings, such as a `GradScaler` left for
        manual migration, stay).
    """,
    examples=[("from torch.cuda.amp import autocast\nimport torch", "import torch")],
)
def cuda_import(site, ctx):
    from neuron_migrate.rules.builtin.xla_core import remove_unused_import

    return remove_unused_import(site, ctx, "torch.cuda", "torch.cuda")
