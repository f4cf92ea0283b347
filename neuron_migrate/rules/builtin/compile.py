"""torch.compile on TorchNeuron: dynamic shapes, modes, backends, graph breaks, shape variation, training steps (NM401-NM406)."""
from __future__ import annotations

import ast

from neuron_migrate.names.analysis import walk
from neuron_migrate.rules.api import kwarg, rule
from neuron_migrate.rules.builtin.compat import COMPILE_REF, RN

COMPILE_ABOUT = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/torch/compile/about-torch-compile.html"
TORCH_INDEX = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/torch/index.html"


_TRAIN_METHODS = ("zero_grad", "backward", "step")


class OutsideDef:
    """A def this file does not hold (a method of a base class in another file, an imported function), known from the
    repository model: its name and the training-step calls in its body (what `training_calls` gives for a def)."""

    def __init__(self, name: str, calls: list, where: str = ""):
        self.name = name
        self.calls = list(calls)
        self.where = where  # a subclass's override: the file that holds it


def compiled_function(site, ctx):
    """The function definition a torch.compile / torch_xla.compile site compiles, when the program shows it: the
    decorated def; the first positional argument naming a def of this module (defined once); `self.method` inside
    a class, resolved through the class and its bases (in this file, or in another file of the repository); or a
    function imported from another file of the repository (an `OutsideDef` for those two)."""
    node = site.node
    parent = site.parent
    if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)) and node in parent.decorator_list:
        return parent
    call = site.call
    if call is None or not call.args:
        return None
    arg = call.args[0]
    outside = (getattr(ctx.analysis, "outside", None) or {}).get("training") or {}
    if isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name):
        cls = _class_of_self(ctx.analysis, site.node, arg.value.id)
        if cls is None:
            return None
        found = _method(ctx.analysis, cls, arg.attr, outside, 0)
        if found is None or not training_calls(found, ctx):
            # `self` may be an instance of a subclass whose override is the training step (in this file or another)
            override = _override(ctx.analysis, cls, arg.attr, 0)
            if override is not None:
                return override
        return found
    if not isinstance(arg, ast.Name):
        return None
    name = arg.id
    defs = _module_defs(ctx.analysis).get(name, [])
    if defs:
        return defs[0] if len(defs) == 1 else None
    if name in outside:
        return OutsideDef(name, outside[name])
    return None


def _override(analysis, cls: ast.ClassDef, attr: str, depth: int):
    """A training step that overrides `cls.attr` in a subclass: a class of this file with `cls` among its bases (or
    below one), or one of another file of the repository (the model's "overrides")."""
    if depth > 8:
        return None
    for stmt in analysis.tree.body:
        if isinstance(stmt, ast.ClassDef) and stmt is not cls and any(
                isinstance(b, ast.Name) and b.id == cls.name for b in stmt.bases):
            own = next((s for s in stmt.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name == attr), None)
            if own is not None and training_calls(own, None):
                return own
            found = _override(analysis, stmt, attr, depth + 1)
            if found is not None:
                return found
    got = ((getattr(analysis, "outside", None) or {}).get("overrides") or {}).get(f"{cls.name}.{attr}")
    return OutsideDef(attr, got["c"], got["in"]) if got else None


def _module_defs(analysis) -> dict:
    """{name: [defs and classes of that name anywhere in the file]} (one walk per file)."""
    from neuron_migrate.program import cached

    def build(a) -> dict:
        out: dict = {}
        for n in walk(a.tree):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.setdefault(n.name, []).append(n)
        return out

    return cached(analysis, "compile.defs", build)


def _class_of_self(analysis, node: ast.AST, name: str):
    """The class whose method `node` is in, when `name` is that method's first parameter (`self`)."""
    n = analysis.parent_of.get(node)
    while n is not None and not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
        n = analysis.parent_of.get(n)
    if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    params = [*n.args.posonlyargs, *n.args.args]
    cls = analysis.parent_of.get(n)
    if not params or params[0].arg != name or not isinstance(cls, ast.ClassDef):
        return None
    return cls


def _method(analysis, cls: ast.ClassDef, attr: str, outside: dict, depth: int):
    """`attr` looked up on `cls` as Python would for an instance: the class body, then its bases in order (classes of
    this file, then what the repository model knows of classes imported from other files)."""
    for stmt in cls.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == attr:
            return stmt
    if depth > 8:
        return None
    local = {s.name: s for s in analysis.tree.body if isinstance(s, ast.ClassDef)}
    for base in cls.bases:
        if isinstance(base, ast.Name) and base.id in local and local[base.id] is not cls:
            found = _method(analysis, local[base.id], attr, outside, depth + 1)
        else:
            key = f"{analysis.source(base)}.{attr}" if isinstance(base, (ast.Name, ast.Attribute)) else None
            found = OutsideDef(attr, outside[key]) if key in outside else None
        if found is not None:
            return found
    return None


def training_calls(fn, ctx, scope=None) -> list[str]:
    """Names of the training-step calls (zero_grad, backward, optimizer step) in a function's body."""
    if isinstance(fn, OutsideDef):
        return list(fn.calls)
    found = []
    for n in walk(fn):
        if not isinstance(n, ast.Call):
            continue
        if isinstance(n.func, ast.Attribute) and n.func.attr in _TRAIN_METHODS and n.func.attr not in found:
            found.append(n.func.attr)
        elif isinstance(n.func, ast.Attribute) and n.func.attr == "optimizer_step" and "step" not in found:
            found.append("step")
    return found


def _is_decorator_ref(site) -> bool:
    parent = site.parent
    return isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and site.node in parent.decorator_list


@rule(
    code="NM401",
    name="compile-dynamic",
    summary="torch.compile(dynamic=True) and mark_dynamic are rejected by the neuron backend: use dynamic=False",
    fix="unsafe",
    severity="error",
    triggers=[("call", "torch.compile"), ("call", "torch._dynamo.mark_dynamic"), ("call", "torch._dynamo.maybe_mark_dynamic")],
    trigger_words=("compile", "mark_dynamic"),
    docs=f"""
        The neuron torch.compile backend compiles static shapes only: `dynamic=True` is rejected (backend reference
        {COMPILE_REF}; 2.33 release notes: torch.compile needs dynamic=False, a new input shape recompiles), and
        symbolic dimensions from `torch._dynamo.mark_dynamic` fail the compile. The fix (unsafe: on other
        backends shapes stop being dynamic, so each new shape recompiles) sets `dynamic=False`; pad or bucket
        inputs so that few shapes occur. `mark_dynamic` calls are reported: remove them. Source: {RN}
    """,
    examples=[("model = torch.compile(model, dynamic=True)", "model = torch.compile(model, dynamic=False)")],
)
def compile_dynamic(site, ctx):
    if "mark_dynamic" in site.key:
        return ctx.finding(site, f"{site.key.rsplit('.', 1)[1]}() asks for a symbolic dimension, which the neuron backend "
                                 "cannot compile: remove it and pad/bucket the input to a few fixed shapes")
    dyn = kwarg(site.call, "dynamic")
    if not (isinstance(dyn, ast.Constant) and dyn.value is True):
        return None
    fx = ctx.fixer()
    fx.replace(dyn, "False")
    return ctx.finding(site, "torch.compile(dynamic=True) is rejected by the neuron backend: use dynamic=False and pad or "
                             "bucket inputs to a few shapes", fix=fx.build())


@rule(
    code="NM402",
    name="compile-mode",
    summary="torch.compile modes other than the default have no effect on Neuron",
    fix="safe",
    severity="warning",
    triggers=[("call", "torch.compile")],
    trigger_words=("compile",),
    docs=f"""
        The neuron backend supports only the default mode: `mode="reduce-overhead"`, `"max-autotune"` and
        `"max-autotune-no-cudagraphs"` log a warning and fall back to the default (backend reference {COMPILE_REF});
        the TorchNeuron guide says to remove such CUDA-specific parameters ({TORCH_INDEX}). The fix sets
        `mode="default"`, which is what runs on Neuron anyway. A mode held in a variable is reported.
    """,
    examples=[('model = torch.compile(model, mode="max-autotune")', 'model = torch.compile(model, mode="default")')],
)
def compile_mode(site, ctx):
    mode = kwarg(site.call, "mode")
    if mode is None or (isinstance(mode, ast.Constant) and mode.value in (None, "default")):
        return None
    if not isinstance(mode, ast.Constant):
        return ctx.finding(site, f"torch.compile(mode={ctx.src(mode)}): only the default mode runs on Neuron; drop mode=")
    fx = ctx.fixer()
    fx.replace(mode, '"default"')
    return ctx.finding(site, f"torch.compile(mode={ctx.src(mode)}) has no effect on Neuron (falls back to the default "
                             "with a warning): use the default mode", fix=fx.build())


@rule(
    code="NM403",
    name="compile-backend",
    summary="a torch.compile backend other than 'neuron' (inductor, openxla, cudagraphs...) does not target Neuron",
    fix="unsafe",
    severity="warning",
    triggers=[("call", "torch.compile")],
    trigger_words=("compile",),
    docs=f"""
        On TorchNeuron, torch.compile lowers through the `neuron` backend (FX -> StableHLO -> neuronx-cc, no
        TorchInductor; {COMPILE_ABOUT}); it is selected automatically when no backend is given on a Neuron device,
        and the TorchNeuron guide writes it out: `torch.compile(model, backend="neuron")` ({TORCH_INDEX}).
        `backend="inductor"` generates Triton/C++ for CPU and GPU, `"openxla"` needs torch_xla, `"cudagraphs"`
        needs CUDA. The fix (unsafe: the code then compiles for Neuron only) sets `backend="neuron"`; a backend
        held in a variable or a callable backend is reported, and so is every other backend with
        `device-style = "accelerator"` (where leaving the backend out keeps the code portable). In CUDA code,
        `torch.compile(model)` with no backend gets `backend="neuron"` too, as the guide writes it (code that names no
        device is left alone: the backend is auto-selected on a Neuron device), except in code that picks among several
        backends (a finding: there the backend belongs where the neuron device is picked) and with
        `device-style = "accelerator"` (left out: portable).
    """,
    examples=[('model = torch.compile(model, backend="inductor")', 'model = torch.compile(model, backend="neuron")'),
              ('model = torch.compile(model.to("cuda"))', 'model = torch.compile(model.to("neuron"), backend="neuron")')],
)
def compile_backend(site, ctx):
    backend = kwarg(site.call, "backend")
    if backend is None:
        return _no_backend(site, ctx)
    if isinstance(backend, ast.Constant) and backend.value == "neuron":
        return None
    if not isinstance(backend, ast.Constant) or ctx.settings.device_style == "accelerator":
        return ctx.finding(site, f"torch.compile(backend={ctx.src(backend)}): on TorchNeuron the backend must be 'neuron' "
                                 "(or left out on a Neuron device, where it is auto-selected)")
    fx = ctx.fixer()
    fx.replace(backend, '"neuron"')
    return ctx.finding(site, f"torch.compile(backend={ctx.src(backend)}) does not target Neuron: use backend=\"neuron\"",
                       fix=fx.build())


def _no_backend(site, ctx):
    """`torch.compile(model)`: Inductor on CUDA and CPU. In code that targets one device (after migration, neuron) the
    backend is written out, as the TorchNeuron guide does; in code that picks among several backends, a finding."""
    call = site.call
    if ctx.settings.device_style == "accelerator" or any(kw.arg is None for kw in call.keywords):
        return None  # device-agnostic code leaves the backend to the device
    from neuron_migrate.program import cached, device_flow

    if not cached(ctx.analysis, "names-cuda", lambda a: any("cuda" in line for line in a.lines)):
        return None  # code that names no device (or only XLA's, NM1xx's business): the backend is auto-selected on Neuron
    if device_flow.may_dispatch(ctx.analysis) and device_flow.facts(ctx.analysis).is_dispatch(site.node):
        return ctx.finding(site, "torch.compile without a backend in code that runs on several backends: Inductor on CUDA "
                                 "and CPU; on Neuron pass backend=\"neuron\" where the neuron device is picked")
    fx = ctx.fixer()
    args = ctx.args_src(call)
    if "\n" in args or "#" in args:  # a call over several lines: its arguments one after the other
        args = ", ".join([ctx.src(a) for a in call.args] + [f"{k.arg}={ctx.src(k.value)}" for k in call.keywords])
    args = args.rstrip().rstrip(",")
    fx.replace(call, f"{ctx.src(call.func)}({args + ', ' if args else ''}backend=\"neuron\")")
    return ctx.finding(site, "torch.compile without a backend compiles with Inductor for CUDA/CPU: use backend=\"neuron\"",
                       fix=fx.build(), note="The TorchNeuron guide writes the backend out: torch.compile(model, backend=\"neuron\").")


@rule(
    code="NM404",
    name="compile-graph-breaks",
    summary="advice: compile with fullgraph=True while porting, so graph breaks show instead of silently splitting",
    fix="none",
    severity="info",
    triggers=[("call", "torch.compile"), ("ref", "torch.compile")],
    trigger_words=("compile",),
    opt_in=True,
    docs=f"""
        Graph breaks are allowed on Neuron: the pieces are compiled independently and the Python between them
        runs eagerly (about torch.compile on Neuron, {COMPILE_ABOUT}). Each break costs a device round trip and
        a separate NEFF, and data-dependent Python (`.item()`, `print(tensor)`, `if tensor:`) inside the model
        causes them. `fullgraph=True` "is recommended for the Neuron path" (backend reference {COMPILE_REF}): it
        raises at the first break, with its reason. Run once with `TORCH_LOGS=graph_breaks` or `fullgraph=True`
        and move the data-dependent code out of the compiled function.
    """,
    examples=[("model = torch.compile(model)",)],
)
def compile_graph_breaks(site, ctx):
    if site.kind == "ref" and not _is_decorator_ref(site):
        return None
    if site.kind == "call":
        fg = kwarg(site.call, "fullgraph")
        if fg is not None:
            return None
        if not site.call.args and not _is_decorator_ref_call(site):
            return None
    fn = compiled_function(site, ctx)
    if fn is not None and training_calls(fn, ctx):
        return None  # a training step breaks at backward(): fullgraph=True would refuse it (NM406)
    return ctx.finding(site, "torch.compile without fullgraph: graph breaks on Neuron split the model into separately "
                             "compiled pieces with eager Python between them; run once with fullgraph=True (or "
                             "TORCH_LOGS=graph_breaks) and move .item()/print/data-dependent branches out")


def _is_decorator_ref_call(site) -> bool:
    parent = site.parent
    return isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)) and site.node in parent.decorator_list


@rule(
    code="NM405",
    name="compile-static-shapes",
    summary="advice: every new input shape recompiles on Neuron; pass dynamic=False and pad or bucket inputs",
    fix="none",
    severity="info",
    triggers=[("call", "torch.compile"), ("ref", "torch.compile")],
    trigger_words=("compile",),
    opt_in=True,
    docs=f"""
        The neuron backend compiles one static graph per input signature: a new shape (the last, smaller batch;
        a new sequence length) triggers a full neuronx-cc compile, and after PyTorch's recompile limit (8 by
        default) the function falls back to eager (2.33 release notes {RN}; {COMPILE_REF}). Reported on
        `torch.compile` without an explicit `dynamic=False`: pass it, and make shapes few and fixed: pad
        sequences to a few bucket lengths, use `drop_last=True` in the DataLoader (or pad the last batch), and
        pass per-step scalars as tensors rather than Python numbers.
    """,
    examples=[("model = torch.compile(model)",)],
)
def compile_static_shapes(site, ctx):
    if site.kind == "ref" and not _is_decorator_ref(site):
        return None
    if site.kind == "call":
        dyn = kwarg(site.call, "dynamic")
        if dyn is not None:
            return None  # dynamic=True is NM401; dynamic=False is what we ask for
        if not site.call.args and not _is_decorator_ref_call(site):
            return None
    return ctx.finding(site, "torch.compile on Neuron recompiles for every new input shape: pass dynamic=False and pad or "
                             "bucket inputs (drop_last=True, fixed sequence lengths) so that few shapes occur")


@rule(
    code="NM406",
    name="compile-train-step",
    summary="torch.compile(fullgraph=True) of a function that runs backward() or optimizer.step() is refused by Dynamo",
    fix="safe",
    severity="error",
    triggers=[("call", "torch.compile")],
    trigger_words=("compile",),
    docs=f"""
        A training step (`optimizer.zero_grad()`, `loss.backward()`, `optimizer.step()`) cannot be one graph:
        Dynamo breaks the graph at `backward()`, so `torch.compile(step_fn, fullgraph=True)` raises on its first
        call, on every backend. This is what a rewrite of `torch_xla.compile(step_fn, full_graph=True)` would
        produce (the lazy-tensor tracer captured the whole step; Dynamo does not). The fix sets
        `fullgraph=False`: the forward and loss are compiled, backward runs through AOTAutograd's compiled
        backward, and the optimizer step is compiled as its own graph. For one forward graph, compile the model
        instead (`model = torch.compile(model, backend="neuron")`) and call the step eagerly ({COMPILE_ABOUT}).
        The compiled function is found where Python would find it: a def of the file, `self.step_fn` in the class or
        its bases, and a base class or function imported from another file of the repository (the repository model).
    """,
    examples=[("@torch.compile(backend=\"neuron\", fullgraph=True)\ndef step(x, y):\n    opt.zero_grad()\n    loss_fn(model(x), y).backward()\n    opt.step()",
               "@torch.compile(backend=\"neuron\", fullgraph=False)\ndef step(x, y):\n    opt.zero_grad()\n    loss_fn(model(x), y).backward()\n    opt.step()")],
)
def compile_train_step(site, ctx):
    fg = kwarg(site.call, "fullgraph")
    if not (isinstance(fg, ast.Constant) and fg.value is True):
        return None
    fn = compiled_function(site, ctx)
    calls = training_calls(fn, ctx) if fn is not None else []
    if not calls:
        return None
    fx = ctx.fixer()
    fx.replace(fg, "False")
    what = "/".join(f"{c}()" for c in calls)
    if getattr(fn, "where", ""):
        what += f" (the override in {fn.where})"
    return ctx.finding(site, f"torch.compile(fullgraph=True) of `{fn.name}`, which calls {what}: Dynamo breaks the graph at "
                             "backward() and fullgraph=True refuses that; compile without fullgraph, or compile the model",
                       fix=fx.build(), note=f"`{fn.name}` is compiled with graph breaks at backward(); for one forward graph "
                                             "compile the model instead: model = torch.compile(model, backend=\"neuron\")")
