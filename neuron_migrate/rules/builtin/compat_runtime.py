"""TorchNeuron distributed and runtime pitfalls (NM320-NM326)."""
from __future__ import annotations

import ast
import re

from neuron_migrate.names.analysis import child_nodes, walk
from neuron_migrate.rules.api import const_value, kwarg, rule
from neuron_migrate.rules.builtin.compat import PRERELEASE, fact, in_compare, sourced

DIST = "torch.distributed"
DIST_GUIDE = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/torch/guides/torch-distributed.html"
DIST_SRC = f"{PRERELEASE}/distributed/backend.py"
XLA_BACKEND = "https://github.com/pytorch/xla/blob/master/torch_xla/distributed/xla_backend.py"
COMMUNITY = "unofficial beta community reports (torch-neuronx 2.11-2.12); low confidence"

_P2P = [f"{DIST}.{n}" for n in ("send", "recv", "isend", "irecv", "batch_isend_irecv", "P2POp", "recv_object_list", "send_object_list")]


@rule(
    code="NM320",
    name="point-to-point",
    summary="point-to-point send/recv and collective_permute are not implemented by the neuron process group",
    fix="none",
    severity="error",
    triggers=[(k, n) for n in _P2P for k in ("call", "ref")],
    docs=f"""
        The `neuron` process group (ProcessGroupNeuron) implements the collectives (all_reduce, all_gather,
        reduce_scatter, broadcast, all_to_all with equal splits, gather, scatter, barrier) but not point-to-point
        `send`/`recv`/`isend`/`irecv`/`batch_isend_irecv` (pre-release source {DIST_SRC}); torch_xla's
        `xm.collective_permute`/`xm.send` have no native equivalent either (reported by the torch_xla rules). The 2.33 docs claim pipeline-parallel support, so
        check on a device; until then express the exchange as a collective (an all_gather and a slice, or
        all_to_all_single with equal splits). Sources: {DIST_SRC}, {DIST_GUIDE}
    """,
    examples=[("dist.send(t, dst=1)",), ("ops = [dist.P2POp(dist.isend, t, 1)]",)],
)
def point_to_point(site, ctx):
    name = site.key.rsplit(".", 1)[1]
    return ctx.finding(site, f"`{name}` (point-to-point) is not implemented by the neuron process group: rewrite the "
                             "exchange as a collective (all_gather + slice, or all_to_all_single with equal splits)",
                       **sourced(fact(ctx, f"torch.distributed.{name}")))


@rule(
    code="NM321",
    name="uneven-all-to-all",
    summary="all_to_all on TorchNeuron supports equal splits only",
    fix="none",
    severity="warning",
    triggers=[("call", f"{DIST}.all_to_all_single"), ("call", f"{DIST}.all_to_all")],
    trigger_words=("all_to_all",),
    docs=f"""
        ProcessGroupNeuron implements all_to_all only with equal splits (pre-release source {DIST_SRC}):
        `all_to_all_single` with `output_split_sizes`/`input_split_sizes` and `all_to_all` with lists of
        differently sized tensors fail. Pad every chunk to the largest size (and send the true lengths separately,
        or a mask), then call `all_to_all_single(out, inp)` without split sizes.
    """,
    examples=[("dist.all_to_all_single(out, inp, output_split_sizes=o, input_split_sizes=i)",)],
)
def uneven_all_to_all(site, ctx):
    call = site.call
    if site.key.endswith("all_to_all_single"):
        splits = [kwarg(call, "output_split_sizes", 2), kwarg(call, "input_split_sizes", 3)]
        if all(s is None or const_value(s, 0) is None and isinstance(s, ast.Constant) for s in splits):
            return None
        return ctx.finding(site, "all_to_all_single with split sizes: TorchNeuron supports equal splits only; pad each "
                                 "chunk to the same size and drop output_split_sizes/input_split_sizes",
                           **sourced(fact(ctx, "torch.distributed.all_to_all_single")))
    return ctx.finding(site, "all_to_all with a list of tensors: TorchNeuron supports equal-sized chunks only; make every "
                             "tensor in the lists the same shape (pad), or use all_to_all_single",
                       **sourced(fact(ctx, "torch.distributed.all_to_all")))


_RANKISH = re.compile(r"rank|ordinal|is_main|is_master|main_process|master_process|global_zero", re.I)


def rank_conditional(site):
    """The innermost `if` (in the same function) whose test mentions a rank, or None."""
    for anc in site.ancestors():
        if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.Module)):
            return None
        if isinstance(anc, ast.If) and _RANKISH.search(site.analysis.source(anc.test)):
            return anc
    return None


def _condition_key(test: ast.expr, src) -> tuple[str, bool]:
    """(what the test asks, polarity): `r == 0` and `not r != 0` ask the same; `r != 0` asks its opposite."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        key, pol = _condition_key(test.operand, src)
        return key, not pol
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], (ast.Eq, ast.NotEq)):
        return f"{src(test.left)} == {src(test.comparators[0])}", isinstance(test.ops[0], ast.Eq)
    return src(test), True


def _complementary_barrier(site, cond: ast.If, ctx) -> bool:
    """True when every rank reaches one barrier: the classic "rank 0 first" pattern
    (`if not master: barrier()` ... `if master: barrier()`, or a barrier in each branch of one `if`)."""
    def has_barrier(stmts) -> bool:
        for stmt in stmts:
            for node in walk(stmt):
                if isinstance(node, ast.Call) and node is not site.node and \
                        ctx.analysis.resolve(node.func, site.scope, count_use=False) == f"{DIST}.barrier":
                    return True
        return False

    in_body = any(anc is cond for anc in site.ancestors()) and any(
        site.node in walk(stmt) for stmt in cond.body)
    if has_barrier(cond.orelse if in_body else cond.body):
        return True
    src = ctx.analysis.source
    key, pol = _condition_key(cond.test, src)
    scope_node = next((a for a in site.ancestors()
                       if isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module))), None)
    if scope_node is None:
        return False
    for node in walk(scope_node):
        if isinstance(node, ast.If) and node is not cond:
            k, p = _condition_key(node.test, src)
            if k == key and p != pol and has_barrier(node.body):
                return True
    return False


@rule(
    code="NM322",
    name="barrier-subgroup",
    summary="dist.barrier() on a subgroup, or reached by only some ranks: fails or hangs on TorchNeuron",
    fix="none",
    severity="error",
    triggers=[("call", f"{DIST}.barrier")],
    trigger_words=("barrier",),
    docs=f"""
        Under the torch_xla `xla` backend `dist.barrier()` was a no-op (`ProcessGroupXla.barrier` returns an empty
        work: {XLA_BACKEND}), so XLA scripts could call it on a subgroup or inside `if rank == 0:` without effect.
        On TorchNeuron it is a real barrier, implemented only on the default (world) group (pre-release source
        {DIST_SRC}): a barrier on a subgroup fails, and one that only some ranks reach waits forever. Call
        `dist.barrier()` unconditionally on the world group (move it after the rank-conditional block).
    """,
    examples=[("if dist.get_rank() == 0:\n    save(model)\n    dist.barrier()",), ("dist.barrier(group=tp_group)",)],
)
def barrier_subgroup(site, ctx):
    group = kwarg(site.call, "group", 0)
    if group is not None and not (isinstance(group, ast.Constant) and group.value is None):
        if not ctx.src(group).endswith("group.WORLD"):
            return ctx.finding(site, "dist.barrier() on a subgroup: TorchNeuron implements barrier on the default group "
                                     "only; call dist.barrier() on the world group",
                               **sourced(fact(ctx, "torch.distributed.barrier")))
    cond = rank_conditional(site)
    if cond is not None and not _complementary_barrier(site, cond, ctx):
        return ctx.finding(site, f"dist.barrier() inside `if {ctx.src(cond.test)}:` is reached by only some ranks: it was a "
                                 "no-op under torch_xla but hangs on TorchNeuron; move it out of the rank-conditional block",
                           **sourced(fact(ctx, "torch.distributed.barrier")))
    return None


_INIT_OK = {"torch.accelerator.is_available", "torch.accelerator.device_count", "torch.neuron.is_available",
            "torch.neuron.device_count", "torch.device", "torch.accelerator.current_accelerator"}


def _device_use(node, ctx, scope):
    """A call that touches the device (initialises the runtime), or None."""
    if not isinstance(node, ast.Call):
        return None
    q = ctx.analysis.resolve(node.func, scope, count_use=False)
    if q in _INIT_OK:
        return None
    if q and (q.startswith("torch.neuron.") or q.startswith("torch.accelerator.") or q.startswith("torch_neuronx.")):
        return node
    if q is None and isinstance(node.func, ast.Attribute) and node.func.attr in ("cuda", "neuron"):
        return node
    if q is None and isinstance(node.func, ast.Attribute) and node.func.attr == "to" and node.args:
        a0 = node.args[0]
        if ctx.analysis.resolve(a0, scope, count_use=False) and str(ctx.analysis.resolve(a0, scope, count_use=False)).startswith("torch.") \
                and not ctx.analysis.resolve(a0, scope, count_use=False).startswith("torch.device"):
            return None  # .to(torch.float16): a dtype
        if isinstance(a0, ast.Constant) and a0.value == "cpu":
            return None
        return node
    dev = kwarg(node, "device")
    if dev is not None and not (isinstance(dev, ast.Constant) and dev.value in ("cpu", None)):
        return node
    return None


def _walk_executed(node):
    """Nodes that run when `node` runs: function and class bodies and lambdas are only defined, not run."""
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        yield n
        stack.extend(reversed(list(child_nodes(n))))


@rule(
    code="NM323",
    name="device-before-init",
    summary="the device is used before dist.init_process_group: the Neuron runtime must start after it",
    fix="none",
    severity="error",
    triggers=[("call", f"{DIST}.init_process_group")],
    trigger_words=("init_process_group",),
    docs=f"""
        The neuron process-group backend sets up the runtime's collective environment (visible cores, root
        communicator) when the group is created, and asserts that the Neuron runtime was not initialised before
        `init_process_group` (pre-release source {DIST_SRC}). Moving a model or tensor to the device (`.to(device)`,
        `.cuda()`, `device=` arguments, `torch.neuron.*` calls) before that call fails. XLA scripts often did this,
        because `xm.xla_device()` needed no process group. Call `dist.init_process_group(backend="neuron")` first,
        then touch the device. Reported at the first device use that runs earlier in the same function.
    """,
    examples=[("model = model.to(device)\ndist.init_process_group('neuron')",)],
)
def device_before_init(site, ctx):
    stmt = site.stmt
    # statements that run before this one: preceding siblings of the statement and of each enclosing statement
    earlier = []
    node = stmt
    parent_of = ctx.analysis.parent_of
    while node is not None and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        parent = parent_of.get(node)
        if parent is None:
            break
        for field in ("body", "orelse", "finalbody"):
            block = getattr(parent, field, None)
            if isinstance(block, list) and node in block:
                earlier = block[: block.index(node)] + earlier
        node = parent
    for s in earlier:
        for n in _walk_executed(s):
            use = _device_use(n, ctx, site.scope)
            if use is not None and _unentered_context(use, ctx):
                # pytorch/examples' FSDP2 example: `torch.accelerator.device_index(rank)` as a statement builds a
                # context manager and drops it: nothing runs on the device
                return ctx.finding(use, f"`{ctx.src(use)}` outside a `with` does nothing (torch.accelerator.device_index is a "
                                        "context manager): delete it, or select the device after init_process_group "
                                        "(on Neuron the process group gives each process its NeuronCore)",
                                   confidence="medium", source="prerelease_dist")
            if use is not None:
                return ctx.finding(use, f"`{ctx.src(use)}` touches the device before dist.init_process_group (line "
                                        f"{stmt.lineno}): the Neuron runtime must not start before the process group; "
                                        "call init_process_group first", confidence="medium", source="prerelease_dist")
    return None


def _unentered_context(use, ctx) -> bool:
    """`use` is a `torch.accelerator.device_index(...)` call standing as a statement of its own."""
    a = ctx.analysis
    return (isinstance(use, ast.Call) and isinstance(use.func, (ast.Name, ast.Attribute))
            and a.resolve(use.func, a.module_scope, count_use=False) == "torch.accelerator.device_index"
            and isinstance(a.parent_of.get(use), ast.Expr))


_MP = ("multiprocessing", "torch.multiprocessing")


@rule(
    code="NM324",
    name="fork-start-method",
    summary="forked processes cannot use the Neuron runtime: use the 'spawn' start method",
    fix="unsafe",
    severity="warning",
    triggers=[("call", f"{m}.{f}") for m in _MP for f in ("set_start_method", "get_context", "start_processes")]
             + [("call", "os.fork")],
    trigger_words=("fork",),
    docs=f"""
        TorchNeuron refuses to initialise in a forked child of a process that already started the runtime
        ("Cannot re-initialize Neuron runtime in forked subprocess. To use Neuron with multiprocessing, use the
        'spawn' start method", pre-release source {PRERELEASE}/__init__.py). Code that selects `fork`
        (`mp.set_start_method("fork")`, `mp.get_context("fork")`, `start_processes(..., start_method="fork")`,
        `os.fork()`) breaks as soon as a child touches the device. The fix (unsafe: spawned children re-import the
        main module, so its top level must be guarded by `if __name__ == "__main__":` and arguments must be
        picklable) changes the start method to `"spawn"`. Launching with `torchrun` avoids the question.
    """,
    examples=[("import multiprocessing as mp\nmp.set_start_method('fork')", "import multiprocessing as mp\nmp.set_start_method('spawn')")],
)
def fork_start_method(site, ctx):
    if site.key == "os.fork":
        return ctx.finding(site, "os.fork(): a forked child cannot use the Neuron runtime; start workers with "
                                 "multiprocessing's 'spawn' context (or torchrun)")
    method = kwarg(site.call, "start_method", 2 if site.key.endswith("start_processes") else None)
    if method is None:
        method = kwarg(site.call, "method", 0)
    if not (isinstance(method, ast.Constant) and method.value == "fork"):
        return None
    fx = ctx.fixer()
    q = ctx.src(method)[0]
    fx.replace(method, f"{q}spawn{q}")
    return ctx.finding(site, "the 'fork' start method: a forked child cannot use the Neuron runtime; use 'spawn' (and "
                             "guard the script with if __name__ == '__main__')", fix=fx.build())


@rule(
    code="NM325",
    name="generator-device",
    summary="torch.Generator(device=...): beta reports say a neuron device generator is not available; a CPU one is",
    fix="none",
    severity="warning",
    triggers=[("call", "torch.Generator")],
    trigger_words=("Generator",),
    docs=f"""
        The sources disagree, so this is reported at low confidence. Beta users of TorchNeuron report that
        `torch.Generator(device="neuron")` is not available and that random ops fall back to the CPU ({COMMUNITY});
        the pre-release TorchNeuron source registers a device generator for each device (`torch.Generator("neuron")`
        constructs; `torch.manual_seed` seeds each device's default one), but no Neuron kernel for random ops, so they
        run through the CPU fallback; the 2.33 docs do not say. The probe's emulated device follows the pre-release
        source and torch's rules for accelerators (a device generator works, a CPU generator given to a device op
        raises), so a probe run does not settle it. Code that makes a device generator
        (`torch.Generator(device=device)`, `device="cuda"`) may fail on the device; a CPU generator works on every
        release: create
        `torch.Generator().manual_seed(seed)`, draw on CPU and move the result with `.to(device)`, or seed with
        `torch.manual_seed(seed)`. A generator with `device="cpu"` is not reported.
    """,
    examples=[("g = torch.Generator(device=device)",)],
)
def generator_device(site, ctx):
    dev = kwarg(site.call, "device", 0)
    if dev is None or (isinstance(dev, ast.Constant) and dev.value in ("cpu", None)):
        return None
    return ctx.finding(site, f"torch.Generator(device={ctx.src(dev)}): beta reports say a device generator is not "
                             "available on TorchNeuron (the pre-release source has one); use torch.Generator() (CPU), "
                             "draw on CPU and move the result with .to(device)",
                       confidence="low", source="community_beta")


@rule(
    code="NM326",
    name="channels-last",
    summary="channels_last memory format is rejected on Neuron: keep tensors contiguous",
    fix="unsafe",
    severity="warning",
    triggers=[("ref", "torch.channels_last"), ("ref", "torch.channels_last_3d")],
    trigger_words=("channels_last",),
    docs=f"""
        Beta reports show TorchNeuron convolutions rejecting `channels_last` inputs ("Neuron only supports
        contiguous/preserve memory format"; {COMMUNITY}). `memory_format=torch.channels_last` is a GPU tensor-core
        optimisation with no benefit here. The fix (unsafe: layout, and so GPU performance, changes) uses
        `torch.contiguous_format`, where the tensor or module is on or goes to the device (host tensors may keep
        any layout; unknown placement is reported without a fix). Queries (`x.is_contiguous(memory_format=torch.channels_last)`, comparisons)
        are not reported.
    """,
    examples=[("model = model.to(device, memory_format=torch.channels_last)", "model = model.to(device, memory_format=torch.contiguous_format)")],
)
def channels_last(site, ctx):
    if in_compare(site):
        return None
    parent = site.parent
    call = None
    if isinstance(parent, ast.keyword):
        call = ctx.analysis.parent_of.get(parent)
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "is_contiguous":
            return None
    from neuron_migrate.program import device_flow
    from neuron_migrate.rules.builtin.compat import cached_fix, drop_import_name

    flow = device_flow.facts(ctx.analysis)

    def where(s) -> str:
        p = s.parent
        c = ctx.analysis.parent_of.get(p) if isinstance(p, ast.keyword) else None
        if not (isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)):
            return "unknown"
        fate, place = flow.fate(c), flow.placement(c.func.value)
        return "device" if "device" in (fate, place) else "cpu" if "cpu" in (fate, place) else "unknown"

    here = where(site)
    msg = f"`{site.key}`: Neuron supports only contiguous/preserve memory format; use torch.contiguous_format"
    if here == "cpu":
        return None  # host tensors may use any layout
    if here != "device":
        return ctx.finding(site, msg + "; not rewritten: this tensor is not seen to reach the device",
                           confidence="low", source="community_beta")
    node = site.node
    if not isinstance(node, ast.Name):
        fx = ctx.fixer()
        fx.replace(node, f"{fx.ref('torch')}.contiguous_format")
        return ctx.finding(site, msg, fix=fx.build(), confidence="low", source="community_beta")

    def build(_analysis):
        uses = [s for s in ctx.analysis.sites if s.kind == "ref" and s.key == site.key and isinstance(s.node, ast.Name)
                and s.node.id == node.id]
        every = all(where(s) == "device" for s in uses)
        fx = ctx.fixer()
        for s in (uses if every else [site]):
            fx.replace(s.node, f"{fx.ref('torch')}.contiguous_format")
        if every:
            drop_import_name(fx, ctx.analysis, "torch", node.id)
        return fx.build()

    return ctx.finding(site, msg, fix=cached_fix(ctx, f"channels-last:{node.id}", build), confidence="low",
                       source="community_beta")
