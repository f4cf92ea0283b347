"""torch_xla core: imports, step markers, the device, synchronisation (NM100-NM107)."""
from __future__ import annotations

import ast
from collections.abc import Iterator

from neuron_migrate.names.analysis import CUDA_FORMAT, child_blocks, walk
from neuron_migrate.rules.api import const_value, kwarg, rule

XM = "torch_xla.core.xla_model"
# TorchNeuron's process group (torch_neuronx/distributed/backend.py) gives each process one NeuronCore whose PyTorch
# index is its local rank; device_count() is then the local world size and any other index is refused
LOCAL_DEVICE_NOTE = ("In a distributed run each process owns one NeuronCore, `neuron:<local rank>` (its current device), "
                     "and any other index fails: check that this index is the local rank, or drop it.")


def device_expr(fx, index: str | None = None) -> str:
    """The expression for 'the device', in the configured style."""
    if fx.ctx.settings.device_style == "accelerator" and index is None:
        # the accelerator (neuron, cuda, ...) or the CPU: runs unchanged where there is none
        return f"{fx.helper('_accelerator_device')}()"
    torch = fx.ref("torch")
    if index is not None:
        return f'{torch}.device("neuron", {index})'
    return f'{torch}.device("neuron")'


def value_use_callable(site, ctx, body: str, message: str):
    """Replace a function used as a value with a lambda that keeps its behaviour."""
    fx = ctx.fixer()
    fx.replace(site.node, f"(lambda *args, **kwargs: {body})" if body else "(lambda *args, **kwargs: None)")
    return ctx.finding(site, message, fix=fx.build())


def _annotations(tree: ast.Module) -> Iterator[ast.expr]:
    """Every annotation in the module: of functions (return and parameters) and of annotated assignments.

    Only statements hold them (lambda parameters have none), so the walk goes from statement to nested
    statement and never into expressions, a small part of the tree.
    """
    stack = list(reversed(tree.body))
    while stack:
        s = stack.pop()
        t = type(s)
        if t is ast.FunctionDef or t is ast.AsyncFunctionDef:
            a = s.args
            for arg in [*a.posonlyargs, *a.args, a.vararg, *a.kwonlyargs, a.kwarg]:
                if arg is not None and arg.annotation is not None:
                    yield arg.annotation
            if s.returns is not None:
                yield s.returns
        elif t is ast.AnnAssign:
            yield s.annotation
        stack.extend(reversed([st for block in child_blocks(s) for st in block]))


def string_annotation_uses(ctx, name: str) -> list[int]:
    """Lines of string annotations (`-> "MpDeviceLoader"`, `x: "Optional[xb.Op]"`) that name `name`.

    Forward references are uses the name resolver does not see (they are strings): an import they need must
    stay, or the annotation names an undefined type (Ruff F821, and `typing.get_type_hints` fails).
    """
    cache = getattr(ctx.analysis, "_nm_string_annotations", None)
    if cache is None:
        cache = {}
        for ann in _annotations(ctx.analysis.tree):
            for c in walk(ann):
                if not (type(c) is ast.Constant and type(c.value) is str):
                    continue
                try:
                    inner = ast.parse(c.value.strip(), mode="eval")
                except (SyntaxError, ValueError, RecursionError):
                    continue
                for n in walk(inner):
                    if isinstance(n, ast.Name):
                        cache.setdefault(n.id, []).append(c.lineno)
        ctx.analysis._nm_string_annotations = cache
    return cache.get(name, [])


def remove_unused_import(site, ctx, prefix: str, what: str):
    """Delete an import of a `prefix` module that nothing uses any more (keeping its still-used siblings)."""
    alias = site.alias
    if isinstance(site.node, ast.Import):
        bound = alias.asname or alias.name.split(".")[0]
    else:
        bound = alias.asname or alias.name
    if ctx.analysis.uses_of(site.scope, bound):
        return None
    if import_probe(site, ctx) is not None:
        return None  # `try: import torch.cuda.amp; return True / except ImportError: ...`: the import is the question
    in_strings = string_annotation_uses(ctx, bound)
    if in_strings:
        where = ", ".join(str(n) for n in sorted(set(in_strings))[:3])
        return ctx.finding(site, f"{what} import `{site.key}` is kept: the string annotation on line {where} names "
                                 f"`{bound}`; replace that annotation's type by hand, then remove the import")
    # another alias of the same statement may still be used: drop only this one
    stmt = site.node
    keep = [a for a in stmt.names if a is not alias]
    fx = ctx.fixer()
    if not keep or all(_unused_alias(a, stmt, site, ctx, prefix) for a in keep):
        if keep and keep[0] is not alias and stmt.names.index(alias) != 0:
            return None  # the statement is removed by the finding for its first alias
        fx.delete(stmt)
    else:
        rest = [a for a in keep if not _unused_alias(a, stmt, site, ctx, prefix)]
        names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in rest)
        text = f"import {names}" if isinstance(stmt, ast.Import) else f"from {stmt.module} import {names}"
        fx.replace(stmt, text)
    return ctx.finding(site, f"unused {what} import `{site.key}`: remove it", fix=fx.build(unused_import_only=True))


@rule(
    code="NM100",
    name="torch-xla-import",
    summary="torch_xla import that no code uses any more",
    fix="safe",
    severity="warning",
    triggers=[("import", "torch_xla*")],
    docs="""
        Once every use of a torch_xla module is migrated, its import is dead and would fail on a TorchNeuron
        install (torch-xla is not part of it). The import is removed; an import that only registered a
        side effect (`import torch_xla.distributed.xla_backend`, `torch_xla.experimental.pjrt_backend`) is
        removed too, since the `neuron` process-group backend needs no import. A try block left empty keeps
        a `pass`. Imports still in use stay, and each remaining use has its own finding.
    """,
    examples=[("import torch_xla.core.xla_model as xm\nimport torch", "import torch")],
)
def torch_xla_import(site, ctx):
    if import_probe(site, ctx) is not None:
        return None  # NM107: the import answers "is torch_xla installed?" and stays
    guard = _dead_import_guard(site, ctx)
    if guard is not None:
        if guard is False:
            return None  # the guard is removed by the finding for its first import
        fx = ctx.fixer()
        fx.delete(guard)
        return ctx.finding(site, f"unused torch_xla import `{site.key}`: remove it (with the try/except ImportError around it)",
                           fix=fx.build(unused_import_only=True))
    probe = _probe_for_guarded_code(site, ctx)
    if probe is not None:
        if probe is False:
            return None  # the try's first torch_xla import becomes the probe; this one goes with the others
        fx = ctx.fixer()
        fx.replace(site.node, f"import {NATIVE_PROBE}  # noqa: F401 - {NATIVE_PROBE_WHY}")
        return ctx.finding(site, f"torch_xla import `{site.key}` guarded code that can fail on a machine without the "
                                 f"device runtime (line {probe}): it becomes `import {NATIVE_PROBE}`, so that the "
                                 "`except ImportError` still skips that code where TorchNeuron is not installed",
                           fix=fx.build())
    return remove_unused_import(site, ctx, "torch_xla", "torch_xla")


NATIVE_PROBE = "torch_neuronx"
NATIVE_PROBE_WHY = "probe: is TorchNeuron installed?"
# calls that run the same on every machine, with or without an accelerator (what a try body may keep unguarded)
_PORTABLE_CALLS = frozenset({
    "torch.manual_seed", "torch.seed", "torch.initial_seed", "torch.get_rng_state", "torch.set_rng_state",
    "torch.random.manual_seed", "torch.random.seed", "torch.device", "torch.accelerator.is_available",
    "torch.accelerator.device_count", "torch.accelerator.current_accelerator", "torch.get_device_module",
    "print", "len", "int", "str", "float", "bool", "isinstance", "getattr", "hasattr", "os.environ.get",
    "os.getenv", "logging.getLogger",
})


def _inserted_helper(func: ast.expr) -> bool:
    """A call of a helper the rewrite inserts (rules/helpers.py): each runs on any machine (the rank is 0 and a
    barrier does nothing without a process group)."""
    from neuron_migrate.rules.helpers import HELPERS

    return isinstance(func, ast.Name) and func.id in HELPERS


def _probe_for_guarded_code(site, ctx):
    """`try: import torch_xla.core.xla_model as xm; <code that used xm, now native> / except ImportError: ...`:
    the import, now unused, still decides whether that code runs. When the code can fail where TorchNeuron is
    not installed (anything beyond portable torch calls), the try's first torch_xla import becomes a probe of
    TorchNeuron (`import torch_neuronx`) and the line of the first such call is returned; False for the try's
    other torch_xla imports (they go); None when the import guards nothing that can fail (it just goes)."""
    try_stmt = site.parent
    if not isinstance(try_stmt, ast.Try) or site.node not in try_stmt.body:
        return None
    if not try_stmt.handlers or not all(catches_import_error(h) for h in try_stmt.handlers):
        return None
    if any(ctx.analysis.uses_of(site.scope, _bound_name(site.node, al)) or string_annotation_uses(ctx, _bound_name(site.node, al))
           for al in site.node.names):
        return None  # still used: it stays (each use has its own finding)
    imports = [s for s in try_stmt.body if isinstance(s, (ast.Import, ast.ImportFrom))]
    if any(isinstance(s, ast.Import) and any(a.name == NATIVE_PROBE for a in s.names) for s in imports):
        return None  # already probing TorchNeuron
    a = ctx.analysis
    failing = None
    for stmt in [*try_stmt.body, *try_stmt.orelse]:
        if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.Pass)):
            continue
        for node in walk(stmt):
            if isinstance(node, ast.Call):
                q = a.resolve(node.func, site.scope, count_use=False)
                if q not in _PORTABLE_CALLS and not _inserted_helper(node.func):
                    failing = node.lineno
                    break
            elif isinstance(node, (ast.Raise, ast.Yield, ast.YieldFrom, ast.Await)):
                failing = node.lineno
                break
        if failing is not None:
            break
    if failing is None:
        return None
    xla = [s for s in imports if ((s.names[0].name if isinstance(s, ast.Import) else s.module or "").startswith("torch_xla"))]
    if not xla or xla[0] is not site.node or len(site.node.names) != 1:
        return False if xla and xla[0] is not site.node else None
    return failing


def _bound_name(stmt, alias) -> str:
    return alias.asname or (alias.name.split(".")[0] if isinstance(stmt, ast.Import) else alias.name)


def _dead_import_guard(site, ctx):
    """The `try: import torch_xla... / except ImportError: xm = None` statement when every import in it is
    unused torch_xla and the handlers only pass or reset those names: it goes as a whole rather than
    leaving `try: pass`. False when this import is not the guard's first (its first import's finding
    removes it); None when the import is not such a guard's."""
    try_stmt = site.parent
    if not isinstance(try_stmt, ast.Try) or site.node not in try_stmt.body or try_stmt.orelse or try_stmt.finalbody:
        return None
    names = set()
    for stmt in try_stmt.body:
        if not isinstance(stmt, (ast.Import, ast.ImportFrom)):
            return None
        for a in stmt.names:
            module = a.name if isinstance(stmt, ast.Import) else stmt.module or ""
            if (not module.startswith("torch_xla") or a.name == "*" or ctx.analysis.uses_of(site.scope, _bound_name(stmt, a))
                    or string_annotation_uses(ctx, _bound_name(stmt, a))):
                return None
            names.add(_bound_name(stmt, a))
    if not all(catches_import_error(h) for h in try_stmt.handlers):
        return None
    for h in try_stmt.handlers:
        for stmt in h.body:
            if isinstance(stmt, ast.Pass):
                continue
            if (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant) and stmt.value.value is None
                    and all(isinstance(t, ast.Name) and t.id in names for t in stmt.targets)):
                continue
            return None
    return try_stmt if (try_stmt.body[0], try_stmt.body[0].names[0]) == (site.node, site.alias) else False


_IMPORT_ERRORS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}


def catches_import_error(handler: ast.excepthandler) -> bool:
    """The handler catches ImportError (bare, or ImportError, ModuleNotFoundError or a base of them)."""
    if handler.type is None:
        return True
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any((t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) else "") in _IMPORT_ERRORS for t in types)


def _constant_answer(stmt: ast.stmt) -> bool:
    """`FLAG = True`, `self.flag = 1`, `return True`: a statement that records that the import worked."""
    if isinstance(stmt, ast.Return):
        return isinstance(stmt.value, ast.Constant)
    if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
        return isinstance(stmt.value, ast.Constant) and stmt.value.value is not None
    return False


def import_probe(site, ctx) -> ast.Try | None:
    """The try statement when this unused torch_xla import is a feature probe, else None.

    A probe is `try: import torch_xla...` followed, in the try body or its else block, by a constant answer
    (`return True`, `HAVE_XLA = True`) and caught by an ImportError handler: removing the import would turn
    the answer into a constant "yes". Guards whose body only imports (the handler binds the names to None)
    are not probes: their import goes once nothing uses it.
    """
    alias = site.alias
    bound = alias.asname or (alias.name.split(".")[0] if isinstance(site.node, ast.Import) else alias.name)
    if ctx.analysis.uses_of(site.scope, bound) or string_annotation_uses(ctx, bound):
        return None
    try_stmt = site.parent
    if not isinstance(try_stmt, (ast.Try, getattr(ast, "TryStar", ast.Try))) or site.node not in try_stmt.body:
        return None
    if not any(catches_import_error(h) for h in try_stmt.handlers):
        return None
    answers = [s for s in [*try_stmt.body, *try_stmt.orelse] if _constant_answer(s)]
    if not answers:
        return None
    # `try: import xm; return True / except ImportError: return True` (a use rewritten to its constant) answers
    # nothing: both ways give the same, so it is no probe and its dead import may go
    same = {ast.dump(a) for a in answers}
    if all(h.body and all(_constant_answer(b) and ast.dump(b) in same for b in h.body) for h in try_stmt.handlers):
        return None
    return try_stmt


@rule(
    code="NM107",
    name="torch-xla-import-probe",
    summary="`try: import torch_xla ... except ImportError:` that tests whether torch_xla is installed is kept",
    fix="safe",
    severity="info",
    triggers=[("import", "torch_xla*")],
    docs="""
        A feature probe such as `try: import torch_xla; return True / except ImportError: return False` or
        `try: import torch_xla.core.xla_model as xm; HAVE_XLA = True / except ImportError: HAVE_XLA = False`
        answers "is torch_xla installed?". Removing its import (NM100) would make the answer a constant yes, and
        code behind the flag would then import torch_xla on machines without it. The probe is left as it is:
        on a TorchNeuron install without torch-xla it answers no, as it should. Reported so that the code
        behind the flag can be collapsed to the native branch by hand. A later torch_xla import of the same probe
        that nothing uses once the rewrite has migrated its uses is removed (the first import still tests for
        torch_xla), so that no linter finds it unused.
    """,
    examples=[("def has_xla():\n    try:\n        import torch_xla\n        return True\n    except ImportError:\n        return False", None)],
)
def torch_xla_import_probe(site, ctx):
    try_stmt = import_probe(site, ctx)
    if try_stmt is None:
        return None
    xla_aliases = [(s, a) for s in try_stmt.body if isinstance(s, (ast.Import, ast.ImportFrom)) for a in s.names
                   if (a.name if isinstance(s, ast.Import) else s.module or "").startswith("torch_xla")]
    if xla_aliases[0] != (site.node, site.alias):
        # one finding per probe, but for an import nothing reads any more (its uses were rewritten): it is kept
        # only so that the probe still fails where torch_xla is missing, and a linter will call it unused
        if not _unused_alias(site.alias, site.node, site, ctx, "torch_xla"):
            return None
        if len(site.node.names) == 1:
            # the probe's first import still answers "is torch_xla installed?": this one only feeds code the
            # rewrite has migrated (accelerate's `import torch_xla.runtime` after `import torch_xla.core.xla_model`)
            fx = ctx.fixer("safe")
            fx.delete(site.node)
            return ctx.finding(site, f"torch_xla import in the import probe at line {xla_aliases[0][0].lineno} that nothing "
                                     "uses any more: removed (the probe's first import still tests for torch_xla)",
                               fix=fx.build(unused_import_only=True))
        return ctx.finding(site, f"torch_xla import kept as part of the import probe at line {xla_aliases[0][0].lineno}: "
                                 "nothing uses it any more; it can go with the probe once the code behind it is collapsed")
    return ctx.finding(site, "torch_xla import probe kept: it tests whether torch_xla is installed (no on a TorchNeuron install); "
                             "collapse the code behind the answer to the native branch")


def _unused_alias(a, stmt, site, ctx, prefix: str) -> bool:
    module = a.name if isinstance(stmt, ast.Import) else f"{stmt.module}.{a.name}"
    if not module.startswith(prefix):
        return False
    bound = a.asname or (a.name.split(".")[0] if isinstance(stmt, ast.Import) else a.name)
    return ctx.analysis.uses_of(site.scope, bound) == 0 and not string_annotation_uses(ctx, bound)


@rule(
    code="NM101",
    name="mark-step",
    summary="xm.mark_step() / torch_xla.sync() cut a lazy graph; TorchNeuron runs eagerly and needs no step marker",
    fix="safe",
    severity="warning",
    triggers=[("call", f"{XM}.mark_step"), ("call", "torch_xla.sync"), ("ref", f"{XM}.mark_step"), ("ref", "torch_xla.sync")],
    docs="""
        Under PyTorch/XLA, `xm.mark_step()` (and its 2.8 name `torch_xla.sync()`) ends the lazy graph so that it
        compiles and runs. TorchNeuron executes ops eagerly (queued asynchronously and synchronised on host
        access), so the call is removed. `wait=True` waited for the device: that becomes
        `torch.accelerator.synchronize()`. An `if XLA_AVAILABLE:` block left empty is removed with it.
        Used as a value (`step_fn = xm.mark_step`), the name becomes a lambda that does nothing.
    """,
    examples=[
        ("loss.backward()\noptimizer.step()\nxm.mark_step()", "loss.backward()\noptimizer.step()"),
        ("xm.mark_step(wait=True)", "torch.accelerator.synchronize()"),
    ],
)
def mark_step(site, ctx):
    what = "torch_xla.sync()" if site.key == "torch_xla.sync" else "xm.mark_step()"
    if site.kind == "ref":
        return value_use_callable(site, ctx, "", f"{what} used as a value: replaced by a no-op callable (TorchNeuron is eager)")
    wait = const_value(kwarg(site.call, "wait", 0), False)
    fx = ctx.fixer()
    if wait:
        text = f"{fx.ref('torch')}.accelerator.synchronize()"
        if site.is_statement:
            fx.replace(site.stmt, text)
        else:
            fx.replace(site.node, text)
        return ctx.finding(site, f"{what} with wait=True: becomes torch.accelerator.synchronize()", fix=fx.build())
    if site.is_statement:
        fx.delete(site.stmt)
        return ctx.finding(site, f"{what} is not needed on TorchNeuron (eager execution): removed", fix=fx.build())
    fx.replace(site.node, "None")
    return ctx.finding(site, f"{what} result used: it returns None, replaced by None", fix=fx.build())


@rule(
    code="NM102",
    name="xla-device",
    summary="xm.xla_device() / torch_xla.device() become torch.device(\"neuron\")",
    fix="safe",
    severity="warning",
    triggers=[("call", f"{XM}.xla_device"), ("call", "torch_xla.device"), ("ref", f"{XM}.xla_device"), ("ref", "torch_xla.device"),
              ("call", "torch_xla.runtime.xla_device")],
    docs="""
        The XLA device becomes the native `neuron` device: `torch.device("neuron")`. Once the neuron process group
        has started, each process owns one NeuronCore, whose index is its local rank, and it is the current
        device, so the index-less form is right for multi-process code too. With an index
        (`xm.xla_device(n)`) the result is `torch.device("neuron", n)`, reported because XLA also made that the
        default device. `devkind=` is dropped. With `device-style = "accelerator"` the device is
        `_accelerator_device()`, an inserted helper returning `torch.accelerator.current_accelerator()` or the
        CPU when there is no accelerator, so the code runs unchanged on neuron, cuda or cpu.
    """,
    examples=[("device = xm.xla_device()", 'device = torch.device("neuron")')],
)
def xla_device(site, ctx):
    fx = ctx.fixer()
    if site.kind == "ref":
        return value_use_callable(site, ctx, device_expr(fx), "xla_device used as a value: replaced by a callable returning the neuron device")
    call = site.call
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return ctx.finding(site, "xla_device() called with *args/**kwargs: migrate to torch.device(\"neuron\") by hand")
    index = kwarg(call, "n", 0) or kwarg(call, "index", 0)
    if index is not None and const_value(index, 0) is None and isinstance(index, ast.Constant):
        index = None
    if index is None:
        fx.replace(call, device_expr(fx))
        return ctx.finding(site, "XLA device: becomes torch.device(\"neuron\")", fix=fx.build())
    fx.replace(call, device_expr(fx, ctx.src(index)))
    return ctx.finding(
        site,
        "XLA device with an index: becomes torch.device(\"neuron\", index)",
        fix=fx.build(),
        note=LOCAL_DEVICE_NOTE,
    )


_DEVICE_KWARGS = {"device", "device_type", "map_location", "accelerator_device"}
_DEVICE_FUNCS = {"torch.device", "torch.autocast", "torch.amp.autocast", "torch.Generator", "torch.get_autocast_dtype", "torch.is_autocast_enabled"}


def _loaded_only_as_device(name: str, assign, scope, a) -> bool:
    """Every read of local `name` in the function (or module) holding `assign` is a device position (`map_location=`,
    `device=`, `.to(name)`, `torch.device(name)`), and there is at least one."""
    holder = a.parent_of.get(assign)
    while holder is not None and not isinstance(holder, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.Module)):
        holder = a.parent_of.get(holder)
    if holder is None:
        return False
    reads = 0
    for n in walk(holder):
        if type(n) is not ast.Name or n.id != name or type(n.ctx) is not ast.Load:
            continue
        up = a.parent_of.get(n)
        if isinstance(up, ast.keyword) and up.arg in _DEVICE_KWARGS:
            reads += 1
        elif isinstance(up, ast.Call) and up.args and up.args[0] is n and (
                (isinstance(up.func, ast.Attribute) and up.func.attr == "to")
                or a.resolve(up.func, scope, count_use=False) in _DEVICE_FUNCS):
            reads += 1
        else:
            return False
    return reads > 0


def device_string_context(site, ctx) -> str | None:
    """Why a string literal names a device here, or None when it may be a config value."""
    node = site.node
    parent = site.parent
    a = ctx.analysis
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and CUDA_FORMAT.match(node.value):
        # 'cuda:%d' % rank, 'cuda:{}'.format(gpu): the formatted expression is the device value
        if isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Mod) and parent.left is node:
            node, parent = parent, a.parent_of.get(parent)
        elif isinstance(parent, ast.Attribute) and parent.attr == "format" and isinstance(a.parent_of.get(parent), ast.Call):
            node = a.parent_of[parent]
            parent = a.parent_of.get(node)
    formatted = node is not site.node or isinstance(node, ast.JoinedStr)  # 'cuda:%d' % i, '...'.format(i), f'cuda:{i}'
    if isinstance(parent, ast.Dict):
        # a map_location table ({'cuda:0': f'cuda:{rank}'}, the DDP tutorial's checkpoint): its keys and values are
        # the devices torch.load maps from and to
        holder = a.parent_of.get(parent)
        if isinstance(holder, ast.keyword) and holder.arg == "map_location":
            return "map_location table"
        if isinstance(holder, ast.Assign) and any(isinstance(t, ast.Name) and "location" in t.id.lower() for t in holder.targets):
            return "map_location table"
        return None
    if isinstance(parent, ast.keyword):
        call = a.parent_of.get(parent)
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument":
            return None  # CLI choice/default: user-facing configuration
        if parent.arg in _DEVICE_KWARGS:
            return f"{parent.arg}= argument"
        return None
    if isinstance(parent, ast.Call) and node in parent.args:
        func = parent.func
        if isinstance(func, ast.Attribute) and func.attr in ("to", "startswith") and parent.args[0] is node:
            return f".{func.attr}() argument"
        q = a.resolve(func, site.scope, count_use=False)
        if q in _DEVICE_FUNCS and parent.args[0] is node:
            return f"{q}() argument"
        return None
    if isinstance(parent, ast.Compare):
        others = [parent.left, *parent.comparators]
        for o in others:
            if o is node:
                continue
            if isinstance(o, ast.Attribute) and o.attr in ("type", "device", "device_type"):
                return "device type comparison"
            if isinstance(o, ast.Call) and isinstance(o.func, ast.Name) and o.func.id == "str":
                return "device string test"
            if isinstance(o, ast.Name) and "device" in o.id.lower():
                return "device comparison"
        return None
    if isinstance(parent, (ast.Assign, ast.AnnAssign)) and parent.value is node:
        targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
        for t in targets:
            name = t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) else ""
            if "device" in name.lower():
                return "device assignment"
        if formatted and len(targets) == 1 and isinstance(targets[0], ast.Name) \
                and _loaded_only_as_device(targets[0].id, parent, site.scope, a):
            # imagenet's `loc = 'cuda:{}'.format(args.gpu)` / `torch.load(path, map_location=loc)`
            return "formatted device assignment"
        return None
    if isinstance(parent, ast.arguments):  # default value of a parameter
        return None
    if isinstance(parent, ast.Return) and formatted:
        return "returned formatted device"  # `return 'cuda:{}'.format(gpu)`: a device with its index, not a label
    return None


@rule(
    code="NM103",
    name="xla-device-string",
    summary="the string 'xla' naming a device becomes 'neuron', together with every string of the same value",
    fix="safe",
    severity="warning",
    triggers=[("string", "xla"), ("string", "xla:")],
    docs="""
        Scripts name the XLA device with strings as often as with `xm.xla_device()`: `.to('xla')`,
        `device='xla'`, `torch.device('xla', i)`, `x.device.type == 'xla'`, `torch.autocast('xla')`,
        `str(d).startswith('xla')`, `f"xla:{i}"`. Strings that flow into one comparison are one value
        (`neuron_migrate.program.values`): a dataclass field `device: str = "xla"`, an argparse `default=`/`choices=`,
        a parameter default and the `if requested == "xla":` that reads them. A value that reaches a torch device
        position (`torch.device(cfg.device)`) must say `'neuron'`, so all its 'xla' strings change together,
        argparse choices included (the note says which inputs must now pass 'neuron'). A value only compared as a
        label, which configuration or callers may pass in, keeps 'xla' everywhere (reported at its configuration
        sites), since the branch it selects is migrated anyway. Labels used only inside the file change together
        where one of them names a device variable. An index such as `'xla:1'` is kept.
    """,
    examples=[("x = x.to('xla')", "x = x.to('neuron')"), ("if t.device.type == 'xla':\n    pass", "if t.device.type == 'neuron':\n    pass")],
)
def xla_device_string(site, ctx):
    from neuron_migrate.program import values
    from neuron_migrate.rules.builtin.cuda_device import string_member, value_set_finding

    node = string_member(site)
    if node is None:
        return None
    vs = values.facts(ctx.analysis).set_of(node)
    if vs is not None:
        return value_set_finding(site, ctx, node, vs, "xla", "neuron")
    raw = ctx.src(node)
    if isinstance(site.parent, (ast.keyword, ast.List, ast.Tuple)):
        return ctx.finding(site, f"string {raw} may be a device choice in configuration: add 'neuron' where users pick the device")
    return None


@rule(
    code="NM104",
    name="wait-device-ops",
    summary="xm.wait_device_ops() / xm.unlazy() become torch.accelerator.synchronize()",
    fix="safe",
    severity="warning",
    triggers=[("call", f"{XM}.wait_device_ops"), ("call", f"{XM}.unlazy"), ("ref", f"{XM}.wait_device_ops")],
    docs="""
        `xm.wait_device_ops()` blocks until queued device work finishes (used for timing and before saving).
        TorchNeuron also queues work asynchronously; the equivalent wait is `torch.accelerator.synchronize()`
        (`torch.neuron.synchronize()` is the device-specific spelling).
    """,
    examples=[("xm.wait_device_ops()", "torch.accelerator.synchronize()")],
)
def wait_device_ops(site, ctx):
    fx = ctx.fixer()
    text = f"{fx.ref('torch')}.accelerator.synchronize()"
    if site.kind == "ref":
        return value_use_callable(site, ctx, text, "wait_device_ops used as a value: replaced by a callable that synchronises")
    fx.replace(site.node, text)
    return ctx.finding(site, "device wait: becomes torch.accelerator.synchronize()", fix=fx.build())


@rule(
    code="NM105",
    name="step-context",
    summary="`with torch_xla.step():` / `with torch_xla.compile():` regions are unwrapped",
    fix="safe",
    severity="warning",
    triggers=[("call", "torch_xla.step"), ("call", "torch_xla.compile"), ("call", "torch_xla.torch_xla.step"), ("ref", "torch_xla.compile"),
              ("call", "torch_xla.experimental.compile"), ("ref", "torch_xla.experimental.compile")],
    docs="""
        `torch_xla.step()` (and `torch_xla.compile()` used as a context manager) marks a region whose lazy graph is
        cut at its edges. In eager TorchNeuron the body simply runs: the `with` is removed and its body kept.
        `torch_xla.compile(fn)` (`torch_xla.experimental.compile(fn)` in torch_xla 2.4) applied to a function (also
        as a decorator) becomes
        `torch.compile(fn, backend="neuron")` (unsafe: Dynamo tracing differs from lazy tracing; `full_graph=` maps
        to `fullgraph=`). When the function is a training step this file shows (it calls `zero_grad()`,
        `backward()` or `optimizer.step()`), `full_graph=True` is not carried over: the lazy tracer captured the
        whole step, but Dynamo breaks the graph at `backward()` and `fullgraph=True` would refuse it; the note
        suggests compiling the model instead.
    """,
    examples=[("with torch_xla.step():\n    train_step(batch)", "train_step(batch)")],
)
def step_context(site, ctx):
    from neuron_migrate.rules.builtin.compile import compiled_function, training_calls

    parent = site.parent
    if site.kind == "ref":
        if not (isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)) and site.node in parent.decorator_list):
            return ctx.finding(site, "torch_xla.compile used as a value: use torch.compile(fn, backend=\"neuron\") by hand")
    elif isinstance(parent, ast.withitem):
        with_stmt = ctx.analysis.parent_of.get(parent)
        if isinstance(with_stmt, ast.With) and len(with_stmt.items) == 1 and parent.optional_vars is None:
            fx = ctx.fixer()
            fx.unwrap(with_stmt)
            return ctx.finding(site, "XLA step region: unwrapped, the body runs eagerly", fix=fx.build())
        return ctx.finding(site, "XLA step region combined with other context managers: remove it by hand")
    if not site.key.endswith("compile"):
        return ctx.finding(site, f"`{ctx.src(site.node)}` outside a with statement: migrate by hand")
    call = site.call
    decorated = isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)) and site.node in parent.decorator_list
    if not decorated and not (call is not None and call.args):
        return ctx.finding(site, f"`{ctx.src(site.node)}` outside a with statement: migrate by hand")
    if call is not None and (any(k.arg is None for k in call.keywords) or len(call.args) > (0 if decorated else 1)):
        return ctx.finding(site, "torch_xla.compile with more arguments than the function: use torch.compile(fn, backend=\"neuron\") by hand")
    fx = ctx.fixer("unsafe")
    torch = fx.ref("torch")
    full = kwarg(call, "full_graph") if call is not None else None
    fn = compiled_function(site, ctx)
    train = training_calls(fn, ctx) if fn is not None else []
    parts = [] if decorated else [ctx.src(call.args[0])]
    parts.append('backend="neuron"')
    note = "Dynamo traces differently from lazy tensors: graph breaks and recompiles show with TORCH_LOGS=graph_breaks,recompiles."
    if full is not None and train and not (isinstance(full, ast.Constant) and not full.value):
        where = f" (the override in {fn.where})" if getattr(fn, "where", "") else ""
        note = (f"`{fn.name}`{where} calls {'/'.join(c + '()' for c in train)}: Dynamo breaks the graph at backward(), so fullgraph "
                "is left out (torch_xla traced the whole step lazily); for one forward graph compile the model instead: "
                "model = torch.compile(model, backend=\"neuron\").")
    elif full is not None:
        parts.append(f"fullgraph={ctx.src(full)}")
    dropped = [k.arg for k in (call.keywords if call is not None else []) if k.arg not in ("f", "full_graph")]
    if dropped:
        note += f" Dropped {', '.join(f'{k}=' for k in dropped)} (no torch.compile counterpart)."
    if decorated:
        fx.replace(site.node, f"{torch}.compile({', '.join(parts)})")
    else:
        fx.replace(site.node, f"{torch}.compile({', '.join(parts)})")
    return ctx.finding(site, "torch_xla.compile(fn): becomes torch.compile(fn, backend=\"neuron\")", fix=fx.build(), note=note)


def _indent_of(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _arguments_text(call: ast.Call, args: ast.expr, fn_src: str, ctx) -> str:
    """The text between the brackets of `args=(...)`, comments and line breaks kept, for `fn(<text>)`.

    Continuation lines move with the arguments: aligned under the first argument, they stay aligned under
    it at its new column; in the hanging style they keep their indentation relative to the statement. The
    fix's text is written relative to the statement's own indentation, which the fix applier adds back.
    """
    inner = ctx.src(args)[1:-1]
    lines = inner.split("\n")
    if len(lines) == 1 or "\t" in inner:
        return inner
    a = ctx.analysis
    stmt_indent = _indent_of(a.lines[call.lineno - 1])
    open_line = a.lines[args.lineno - 1]
    if lines[0].strip():
        delta = (a.span(call).col + len(fn_src) + 1) - (a.span(args).col + 1)
    else:
        delta = stmt_indent - _indent_of(open_line)
    out = [lines[0]]
    for i, ln in enumerate(lines[1:], 1):
        if not ln.strip() and i < len(lines) - 1:
            out.append("")
            continue
        width = max(_indent_of(ln) + delta - stmt_indent, 0)
        out.append(" " * width + ln.lstrip(" "))
    return "\n".join(out)


@rule(
    code="NM106",
    name="add-step-closure",
    summary="xm.add_step_closure(fn, args) becomes a direct call fn(*args)",
    fix="unsafe",
    severity="warning",
    triggers=[("call", f"{XM}.add_step_closure")],
    docs="""
        Step closures ran after the step's graph executed, so that tensors were materialised. In eager
        TorchNeuron values exist already, so the closure is called where it was queued. This is unsafe:
        the call now runs earlier (before later code of the same step) and `.item()`/`.cpu()` inside it syncs
        every step. It is right for the usual logging closure; check closures that read parameters updated
        later in the step. `run_async=True` has no equivalent and is dropped. The arguments keep their own
        text: comments inside `args=(...)` and its line breaks stay as written.
    """,
    examples=[("xm.add_step_closure(log_fn, args=(loss, step))", "log_fn(loss, step)")],
)
def add_step_closure(site, ctx):
    call = site.call
    fn = kwarg(call, "closure", 0)
    args = kwarg(call, "args", 1)
    if fn is None or not site.is_statement or any(k.arg is None for k in call.keywords):
        return ctx.finding(site, "xm.add_step_closure: call the closure directly (eager values exist already)")
    fx = ctx.fixer()
    fn_src = ctx.src(fn)
    if isinstance(fn, ast.Lambda):
        fn_src = f"({fn_src})"
    if args is None:
        text = f"{fn_src}()"
    elif isinstance(args, (ast.Tuple, ast.List)) and ctx.src(args)[:1] in "([":
        text = f"{fn_src}({_arguments_text(call, args, fn_src, ctx)})"
    elif isinstance(args, (ast.Tuple, ast.List)):
        text = f"{fn_src}({', '.join(ctx.src(e) for e in args.elts)})"
    else:
        text = f"{fn_src}(*{ctx.src(args)})"
    fx.replace(call, text)
    run_async = kwarg(call, "run_async", 2)
    dropped = f" run_async={ctx.src(run_async)} dropped: the call runs synchronously." if run_async is not None else ""
    return ctx.finding(site, "step closure: called directly (it now runs at this point of the step)", fix=fx.build(),
                       note="The closure runs before the rest of the step; .item()/.cpu() inside it synchronises every step." + dropped)


# -- seeding, portably (NM133, NM204) ------------------------------------------------------------------
_CPU_SEEDS = ("torch.manual_seed", "torch.random.manual_seed")


def _seed_only(stmt: ast.stmt) -> bool:
    """A statement that only seeds generators or imports (`random.seed(s)`, `np.random.seed(s)`,
    `torch.cuda.manual_seed_all(s)`, `xm.set_rng_state(s)`, `set_seed(s)`), or a try/if made of them."""
    if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.Pass)):
        return True
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        f = stmt.value.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        return "seed" in name.lower() or name == "set_rng_state"
    if isinstance(stmt, ast.Try):
        return all(_seed_only(s) for s in [*stmt.body, *stmt.orelse, *stmt.finalbody]) and all(
            all(_seed_only(s) for s in h.body) for h in stmt.handlers)
    if isinstance(stmt, ast.If):
        return all(_seed_only(s) for s in [*stmt.body, *stmt.orelse])
    return False


def _block_of(parent, stmt):
    for field in ("body", "orelse", "finalbody"):
        block = getattr(parent, field, None)
        if isinstance(block, list) and stmt in block:
            return block
    for h in getattr(parent, "handlers", ()):
        if stmt in h.body:
            return h.body
    return None


def seeded_beside(site, ctx, seed: ast.expr) -> bool:
    """Does `torch.manual_seed(<the same seed>)` run beside this seeding statement, among statements that only
    seed (`random.seed(s); np.random.seed(s); torch.manual_seed(s); xm.set_rng_state(s)`, a try or if of
    them included)? Then it already seeds every device, CPU included, and this call can go."""
    a = ctx.analysis
    want = ctx.src(seed)

    def seeds_cpu(stmt) -> bool:
        for n in walk(stmt):
            if (isinstance(n, ast.Call) and n.args and not n.keywords and ctx.src(n.args[0]) == want
                    and a.resolve(n.func, site.scope, count_use=False) in _CPU_SEEDS):
                return True
        return False

    stmt = site.stmt
    for _ in range(8):
        parent = a.parent_of.get(stmt)
        block = _block_of(parent, stmt) if parent is not None else None
        if block is None:
            return False
        i = block.index(stmt)
        for step in (-1, 1):
            j = i + step
            while 0 <= j < len(block) and _seed_only(block[j]):
                if seeds_cpu(block[j]):
                    return True
                j += step
        if not isinstance(parent, (ast.Try, ast.If)) or not all(_seed_only(x) for x in block):
            return False
        stmt = parent
    return False


def seed_every_device(site, ctx, seed: ast.expr, what: str):
    """The fix for a call that seeded one device's generator (`xm.set_rng_state(seed)`, `torch.cuda.manual_seed_all
    (seed)`): removed where `torch.manual_seed(seed)` beside it already seeds every device; else
    `torch.manual_seed(seed)`, which seeds every device and also the CPU generator (unsafe: that reseeds the CPU
    generator at this point). Portable: it runs on a machine without Trainium too (tests, CI, laptops)."""
    fx = ctx.fixer()
    if site.is_statement and seeded_beside(site, ctx, seed):
        fx.delete(site.stmt)
        return ctx.finding(site, f"{what}: torch.manual_seed({ctx.src(seed)}) beside it already seeds every device "
                                 "(CPU included): removed", fix=fx.build("safe"))
    fx.replace(site.call, f"{fx.ref('torch')}.manual_seed({ctx.src(seed)})")
    return ctx.finding(site, f"{what}: becomes torch.manual_seed(seed), which seeds every device, the CPU included",
                       fix=fx.build("unsafe"), note="torch.manual_seed also reseeds the CPU generator at this point.")
