"""torch_xla precision, RNG, metrics/profiler, version gates and the catch-alls (NM131-NM199).

The data loaders (NM130) are in `xla_loaders.py`, the pure-Python utilities (NM144-NM146) in `xla_utils.py`,
the environment-variable rules in `xla_env.py`; the YAML renames and the report catalogue in
`rules/torch_xla.yaml`.
"""
from __future__ import annotations

import ast
import re

from neuron_migrate.names.analysis import child_nodes, walk
from neuron_migrate.program import cached
from neuron_migrate.rules.api import has_star_args, kwarg, rule
from neuron_migrate.rules.builtin.xla_distributed import atom, wrap_for_parent

XM = "torch_xla.core.xla_model"
MET = "torch_xla.debug.metrics"
XP = "torch_xla.debug.profiler"
RELEASE_NOTES = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/release-notes/components/torchneuron.html"
NATIVE_FAQ = "https://github.com/aws-neuron/aws-neuron-sdk/blob/master/frameworks/torch/pytorch-native-overview.rst"


def _isinstance_or_base(site, ctx) -> str | None:
    """'isinstance'/'subclass' when a class reference is tested or subclassed, else None."""
    node = site.node
    parent = site.parent
    if isinstance(parent, (ast.Tuple, ast.List)):
        node, parent = parent, ctx.analysis.parent_of.get(parent)
    if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and parent.func.id in ("isinstance", "issubclass") and node in parent.args[1:]:
        return "isinstance"
    if isinstance(parent, ast.ClassDef) and node in parent.bases:
        return "subclass"
    return None



# -- NM131 ------------------------------------------------------------------------------------------
@rule(
    code="NM131",
    name="xla-autocast",
    summary="torch_xla.amp.autocast(device, ...) becomes torch.autocast(\"neuron\", dtype=torch.bfloat16, ...)",
    fix="unsafe",
    severity="warning",
    triggers=[("call", "torch_xla.amp.autocast"), ("call", "torch_xla.amp.autocast_mode.autocast"),
              ("ref", "torch_xla.amp.autocast"), ("ref", "torch_xla.amp.autocast_mode.autocast")],
    docs=f"""
        `torch_xla.amp.autocast(device, enabled=True, dtype=None, cache_enabled=True)` takes a *device* as its
        first argument and defaults to bfloat16 on TPU/Neuron. TorchNeuron uses the standard
        `torch.autocast(device_type="neuron", dtype=torch.bfloat16)` ({NATIVE_FAQ}), whose op lists follow the
        CUDA conventions. The device argument is dropped, `dtype` defaults to `torch.bfloat16`, `enabled=` and
        `cache_enabled=` are kept. The fix is unsafe: with torch_xla <= 2.5 the XLA autocast printed a warning
        and did nothing on Neuron, so the rewritten code really runs in mixed precision and its numerics change;
        under XLA a dtype other than bfloat16 disabled autocast, natively it is honoured.
    """,
    examples=[("with torch_xla.amp.autocast(device):\n    loss = model(x)", "with torch.autocast(\"neuron\", dtype=torch.bfloat16):\n    loss = model(x)")],
)
def xla_autocast(site, ctx):
    if site.kind == "ref":
        return ctx.finding(site, "torch_xla.amp.autocast used as a value: use functools.partial(torch.autocast, \"neuron\", dtype=torch.bfloat16)")
    call = site.call
    if has_star_args(call):
        return ctx.finding(site, "torch_xla.amp.autocast with *args/**kwargs: use torch.autocast(\"neuron\", dtype=torch.bfloat16) by hand")
    fx = ctx.fixer()
    torch = fx.ref("torch")
    dtype = kwarg(call, "dtype", 2)
    defaulted = dtype is None or (isinstance(dtype, ast.Constant) and dtype.value is None)
    if defaulted:
        dtype_src = f"{torch}.bfloat16"
    elif isinstance(dtype, (ast.Attribute, ast.Constant)):
        dtype_src = ctx.src(dtype)
    else:
        dtype_src = f"{ctx.src(dtype)} or {torch}.bfloat16"
    device_type = '"neuron"' if ctx.settings.device_style != "accelerator" else f"{torch}.accelerator.current_accelerator().type"
    parts = [device_type, f"dtype={dtype_src}"]
    for name, pos in (("enabled", 1), ("cache_enabled", 3)):
        v = kwarg(call, name, pos)
        if v is not None:
            parts.append(f"{name}={ctx.src(v)}")
    note = "On torch_xla <= 2.5 this autocast did nothing on Neuron: check accuracy, the model now really runs in mixed precision."
    if defaulted:
        # pytorch/xla's test_train_mp_mnist_amp.py runs only on XLA:GPU, where the default was float16 with a GradScaler
        note += (" Without a dtype torch_xla chose by device: bfloat16 on TPU and Neuron, float16 on XLA:GPU (with a "
                 "GradScaler); a program that ran on GPUs now trains in bfloat16, which needs no scaler.")
    fx.replace(call, f"{torch}.autocast({', '.join(parts)})")
    return ctx.finding(site, "torch_xla.amp.autocast: becomes torch.autocast(\"neuron\", ...) (bfloat16 by default)", fix=fx.build(),
                       note=note)


# -- NM132 ------------------------------------------------------------------------------------------
@rule(
    code="NM132",
    name="xla-checkpoint",
    summary="torch_xla.utils.checkpoint.checkpoint becomes torch.utils.checkpoint.checkpoint(..., use_reentrant=True)",
    fix="safe",
    severity="warning",
    triggers=[("call", "torch_xla.utils.checkpoint.checkpoint"), ("ref", "torch_xla.utils.checkpoint.checkpoint")],
    docs=f"""
        torch_xla ships a copy of activation checkpointing (`torch_xla.utils.checkpoint.checkpoint`) that
        defaults to `use_reentrant=True`; TorchNeuron supports the standard `torch.utils.checkpoint` ({NATIVE_FAQ}).
        Current PyTorch warns when `use_reentrant` is not passed (and later releases raise), so the fix
        passes `use_reentrant=True` explicitly when the call does not, keeping the old behaviour
        (`use_reentrant=False` is recommended by PyTorch and usually works too). Used as a value
        (`ckpt = checkpoint`), the name becomes `functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=True)`.
    """,
    examples=[("from torch_xla.utils.checkpoint import checkpoint\ny = checkpoint(block, x)",
               "import torch.utils.checkpoint\nfrom torch_xla.utils.checkpoint import checkpoint\ny = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=True)")],
)
def xla_checkpoint(site, ctx):
    fx = ctx.fixer()
    target = fx.name("torch.utils.checkpoint.checkpoint", site.scope)
    if site.kind == "ref":
        fx.replace(site.node, f"{fx.ref('functools')}.partial({target}, use_reentrant=True)")
        return ctx.finding(site, "torch_xla checkpoint used as a value: becomes functools.partial(torch.utils.checkpoint.checkpoint, use_reentrant=True)", fix=fx.build())
    call = site.call
    if any(k.arg is None for k in call.keywords) or kwarg(call, "use_reentrant") is not None:
        fx.replace(call.func, target)
    else:
        args = [ctx.src(a) for a in call.args] + [f"{k.arg}={ctx.src(k.value)}" for k in call.keywords]
        fx.replace(call, f"{target}({', '.join([*args, 'use_reentrant=True'])})")
    return ctx.finding(site, "torch_xla checkpoint: becomes torch.utils.checkpoint.checkpoint with use_reentrant passed explicitly", fix=fx.build())


# -- NM133 ------------------------------------------------------------------------------------------
def _scope_body_nodes(scope_node):
    """Nodes of one scope, not descending into nested functions, lambdas or classes (yielded, not entered)."""
    stack = list(scope_node.body) if isinstance(scope_node.body, list) else [scope_node.body]
    while stack:
        n = stack.pop()
        yield n
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        stack.extend(child_nodes(n))


def _nested_mentions(scope_node, name: str) -> bool:
    for n in _scope_body_nodes(scope_node):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            if any(isinstance(m, ast.Name) and m.id == name for m in walk(n)):
                return True
    return False


def _scope_names(analysis, scope) -> tuple:
    """({name: stores}, names with a load that is not the first argument of xm.set_rng_state, names mentioned in
    nested code) of one scope's body, made once per scope (a scan per get_rng_state call was quadratic)."""
    def build(_a) -> tuple:
        stores: dict = {}
        bad_loads, nested = set(), set()
        for n in _scope_body_nodes(scope.node):
            if isinstance(n, ast.Name):
                if isinstance(n.ctx, ast.Store):
                    stores[n.id] = stores.get(n.id, 0) + 1
                    continue
                call = analysis.parent_of.get(n)
                if not (isinstance(call, ast.Call) and call.args and call.args[0] is n and
                        analysis.resolve(call.func, scope, count_use=False) == f"{XM}.set_rng_state"):
                    bad_loads.add(n.id)
            elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                nested.update(m.id for m in walk(n) if isinstance(m, ast.Name))
        return stores, bad_loads, nested

    return cached(analysis, f"rng scope names:{id(scope.node)}", build)


def _rng_facts(analysis):
    """Which xm.get_rng_state() / xm.set_rng_state() calls form save/restore pairs in this file.

    A pair is `state = xm.get_rng_state()` whose name (assigned once in its scope, not seen by nested
    code) is only ever passed as the first argument of `xm.set_rng_state(...)` in the same scope.
    """
    gets = [s for s in analysis.sites if s.kind == "call" and s.key == f"{XM}.get_rng_state"]
    paired_gets, paired_names, unpaired = set(), set(), 0
    for g in gets:
        parent = g.parent
        ok = False
        if isinstance(parent, ast.Assign) and len(parent.targets) == 1 and isinstance(parent.targets[0], ast.Name):
            name = parent.targets[0].id
            stores, bad_loads, nested = _scope_names(analysis, g.scope)
            ok = stores.get(name, 0) == 1 and name not in bad_loads and name not in nested
            if ok:
                paired_gets.add(g.node)
                paired_names.add((id(g.scope), name))
        unpaired += not ok
    return paired_gets, paired_names, unpaired


def _restores_state(seed, site, facts) -> bool:
    """The set_rng_state argument may be a state saved by an unpaired xm.get_rng_state()."""
    if not facts[2]:
        return False
    if isinstance(seed, ast.Constant):
        return False
    if isinstance(seed, ast.Name):
        for n in _scope_body_nodes(site.scope.node):
            if (isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == seed.id for t in n.targets)
                    and isinstance(n.value, ast.Call)
                    and site.analysis.resolve(n.value.func, site.scope, count_use=False) == f"{XM}.get_rng_state"):
                return True
        return False
    return not isinstance(seed, ast.BinOp)


def _device_rng(torch: str, op: str, arg: str = "") -> str:
    """The current device's generator, portably: the accelerator's device module where there is one (torch.neuron
    on Trainium), else the CPU generator (a machine without an accelerator: tests, CI, laptops)."""
    return (f"{torch}.get_device_module().{op}({arg}) if {torch}.accelerator.is_available() "
            f"else {torch}.{op}({arg})")


@rule(
    code="NM133",
    name="xla-rng-seed",
    summary="xm.set_rng_state(seed) / torch_xla.manual_seed(seed) seed the device; xm.get_rng_state() returns an int seed",
    fix="safe",
    severity="warning",
    triggers=[("call", f"{XM}.set_rng_state"), ("call", "torch_xla.manual_seed"), ("call", "torch_xla.torch_xla.manual_seed"),
              ("call", f"{XM}.get_rng_state"), ("ref", f"{XM}.set_rng_state"), ("ref", "torch_xla.manual_seed"), ("ref", f"{XM}.get_rng_state")],
    docs="""
        `xm.set_rng_state(seed, device=None)` and `torch_xla.manual_seed(seed)` set the XLA device generator's
        *seed* (an int, not a state tensor). Where `torch.manual_seed(seed)` with the same seed runs beside the
        call, among statements that only seed (`random.seed(s); np.random.seed(s); torch.manual_seed(s);
        xm.set_rng_state(s)`, the usual `set_seed`), that already seeds every device and the call is removed.
        Elsewhere it becomes `torch.manual_seed(seed)`, which seeds every device and runs on any machine (tests,
        CI, laptops without Trainium); unsafe, because it also reseeds the CPU generator at that point.
        `torch.neuron.manual_seed` is not written: it exists only where torch-neuronx is installed.
        `xm.get_rng_state()` returns that int seed, while a device generator's state is a ByteTensor: code that
        stores, compares or broadcasts the value (accelerate keeps `states["xm_seed"]`) is reported; save and
        restore the state as a pair or use `torch.random.fork_rng`.
        The two migrate together or not at all: `state = xm.get_rng_state()` whose name only ever reaches
        `xm.set_rng_state(state)` in the same function becomes the current device's `get_rng_state()` /
        `set_rng_state(state)` (`torch.get_device_module()`, the CPU generator where no accelerator is
        available): a save/restore of the device generator, as before; while an `xm.get_rng_state()` stays, a
        `set_rng_state` argument that may hold its value is reported, not seeded.
    """,
    examples=[("torch.manual_seed(args.seed)\nxm.set_rng_state(args.seed)", "torch.manual_seed(args.seed)"),
              ("xm.set_rng_state(args.seed)", "torch.manual_seed(args.seed)")],
)
def xla_rng_seed(site, ctx):
    from neuron_migrate.rules.builtin.xla_core import seed_every_device

    short = "xm.get_rng_state" if site.key.endswith("get_rng_state") else "xm.set_rng_state" if site.key.endswith("set_rng_state") else "torch_xla.manual_seed"
    facts = cached(ctx.analysis, "xla_rng_pairs", _rng_facts)
    pair = "the current device's get_rng_state()/set_rng_state() (torch.get_device_module())"
    if short == "xm.get_rng_state":
        if site.kind == "call" and site.node in facts[0]:
            fx = ctx.fixer()
            fx.replace(site.call, _device_rng(fx.ref("torch"), "get_rng_state"))
            return ctx.finding(site, f"xm.get_rng_state() saved the device generator for xm.set_rng_state(): the pair becomes "
                                     f"{pair}", fix=fx.build())
        return ctx.finding(site, "xm.get_rng_state() returns an int seed; a device generator's state is a ByteTensor: "
                                 f"save/restore with {pair} as a pair, or use torch.random.fork_rng")
    if site.kind == "ref":
        return ctx.finding(site, f"{short} used as a value: use torch.manual_seed (same (seed) call; it seeds every device)")
    call = site.call
    seed = kwarg(call, "seed", 0)
    if seed is None or has_star_args(call):
        return ctx.finding(site, f"{short} without a plain seed argument: call torch.manual_seed(seed) by hand")
    if short == "xm.set_rng_state" and isinstance(seed, ast.Name) and (id(site.scope), seed.id) in facts[1]:
        fx = ctx.fixer()
        torch = fx.ref("torch")
        if site.is_statement:
            fx.replace(site.stmt, f"if {torch}.accelerator.is_available():\n    {torch}.get_device_module().set_rng_state({seed.id})\n"
                                  f"else:\n    {torch}.set_rng_state({seed.id})")
        else:
            fx.replace(call, f"({_device_rng(torch, 'set_rng_state', seed.id)})")
        return ctx.finding(site, f"xm.set_rng_state() restores the state saved by xm.get_rng_state(): the pair becomes {pair}",
                           fix=fx.build())
    if short == "xm.set_rng_state" and _restores_state(seed, site, facts):
        return ctx.finding(site, "xm.set_rng_state() may restore a value saved by xm.get_rng_state(), which stays: migrate the two "
                                 f"together ({pair})")
    return seed_every_device(site, ctx, seed, short)


# NM141 (XLA FSDP auto-wrap policies) lives with NM151 in xla_fsdp.py: they migrate together.


# -- NM134 ------------------------------------------------------------------------------------------
@rule(
    code="NM134",
    name="xla-fork-rng",
    summary="xm.fork_rng() becomes torch.random.fork_rng(device_type=\"neuron\")",
    fix="unsafe",
    severity="warning",
    triggers=[("call", f"{XM}.fork_rng"), ("ref", f"{XM}.fork_rng")],
    docs="""
        `xm.fork_rng(device=None, enabled=True)` saves the XLA generator seed and restores it on exit. The native
        context manager is `torch.random.fork_rng(device_type="neuron", enabled=...)`; its first positional
        parameter is a list of devices, so the XLA `device` argument is dropped. Unsafe: the native version
        also forks the CPU generator, so CPU random numbers drawn inside the block no longer advance the outer
        CPU stream.
    """,
    examples=[("with xm.fork_rng():\n    noise = torch.randn(4)", "with torch.random.fork_rng(device_type=\"neuron\"):\n    noise = torch.randn(4)")],
)
def xla_fork_rng(site, ctx):
    if site.kind == "ref":
        return ctx.finding(site, "xm.fork_rng used as a value: use functools.partial(torch.random.fork_rng, device_type=\"neuron\")")
    call = site.call
    if has_star_args(call):
        return ctx.finding(site, "xm.fork_rng with *args/**kwargs: use torch.random.fork_rng(device_type=\"neuron\") by hand")
    fx = ctx.fixer()
    parts = ['device_type="neuron"']
    enabled = kwarg(call, "enabled", 1)
    if enabled is not None:
        parts.append(f"enabled={ctx.src(enabled)}")
    fx.replace(call, f"{fx.ref('torch')}.random.fork_rng({', '.join(parts)})")
    return ctx.finding(site, "xm.fork_rng: becomes torch.random.fork_rng(device_type=\"neuron\") (also forks the CPU generator)", fix=fx.build())


# -- NM135 ------------------------------------------------------------------------------------------
_XLAC_REPORT = "torch_xla._XLAC._xla_metrics_report"
_REPORTS = (f"{MET}.metrics_report", f"{MET}.short_metrics_report", _XLAC_REPORT)
_CLEARS = (f"{MET}.clear_all", f"{MET}.clear_counters", f"{MET}.clear_metrics")
_MET_OTHER = (f"{MET}.counter_names", f"{MET}.counter_value", f"{MET}.metric_names", f"{MET}.metric_data",
              f"{MET}.executed_fallback_ops")
_LOG_METHODS = {"debug", "info", "warning", "warn", "error", "critical", "exception", "log", "print"}
_MET_ADVICE = ("TorchNeuron has no XLA metrics: use torch_neuronx.get_fallback_ops() for ops that ran on CPU, "
               "torch.neuron.get_dynamo_metrics() and TORCH_LOGS=graph_breaks,recompiles for torch.compile")


def _only_printed(site, ctx) -> bool:
    """The call is an argument (maybe inside an f-string) of a print/log call that is a whole statement."""
    node = site.node
    parent = site.parent
    while isinstance(parent, (ast.FormattedValue, ast.JoinedStr)):
        node, parent = parent, ctx.analysis.parent_of.get(parent)
    if not isinstance(parent, ast.Call) or node not in parent.args:
        return False
    if not isinstance(ctx.analysis.parent_of.get(parent), ast.Expr):
        return False
    func = parent.func
    q = ctx.analysis.resolve(func, site.scope, count_use=False)
    printing = (isinstance(func, ast.Name) and func.id.endswith("print")) or q == f"{XM}.master_print" or (
        q is None and isinstance(func, ast.Attribute) and (func.attr in _LOG_METHODS or func.attr.endswith("print")))
    if not printing:
        return False
    # nothing else with side effects in the arguments
    for a in [*parent.args, *[k.value for k in parent.keywords]]:
        if a is node:
            continue
        if any(isinstance(n, (ast.Call, ast.Await, ast.NamedExpr, ast.Yield, ast.YieldFrom)) for n in walk(a)):
            return False
    return True


_RANK_TEST = re.compile(r"\b(?:get_rank|is_master_ordinal|get_ordinal|get_local_ordinal|local_rank|rank)\b")


@rule(
    code="NM135",
    name="xla-metrics",
    summary="torch_xla.debug.metrics reports and counters do not exist on TorchNeuron",
    fix="safe",
    severity="warning",
    triggers=[*[("call", q) for q in (*_REPORTS, *_CLEARS, *_MET_OTHER)], *[("ref", q) for q in (*_REPORTS, *_MET_OTHER)]],
    docs="""
        `met.metrics_report()` (and the C binding behind it, `torch_xla._XLAC._xla_metrics_report()`) describes
        lazy-tensor compilation and transfers; TorchNeuron has no such counters.
        A statement that only prints or logs the report (`print(met.metrics_report())`,
        `print(torch_xla._XLAC._xla_metrics_report())`,
        `xm.master_print(met.short_metrics_report())`, `logger.info(f"{met.metrics_report()}")`) is removed, as are
        `met.clear_*()` statements; an `if FLAGS.metrics_debug:` left empty goes with it, and the rewrite's notes
        name each removed report (and the flag that no longer does anything) at its line. Any other use (tests asserting `met.counter_value("aten::...")`, reports
        written to files) is reported. What to use instead: `torch_neuronx.get_fallback_ops()` lists the ops
        that fell back to CPU in eager mode, `torch.neuron.get_dynamo_metrics()` and
        `TORCH_LOGS=graph_breaks,recompiles` show torch.compile graph breaks and recompiles
        (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/torch/index.html).
    """,
    examples=[("xm.master_print(met.metrics_report())", "")],
)
def xla_metrics(site, ctx):
    name = "torch_xla._XLAC._xla_metrics_report" if site.key == _XLAC_REPORT else "met." + site.key.rsplit(".", 1)[1]
    if site.kind == "call" and site.key in _CLEARS and site.is_statement:
        fx = ctx.fixer()
        fx.delete(site.stmt)
        return ctx.finding(site, f"{name}() clears XLA metrics that do not exist on TorchNeuron: removed", fix=fx.build())
    if site.kind == "call" and site.key in _REPORTS and _only_printed(site, ctx):
        fx = ctx.fixer()
        fx.delete(site.stmt)
        stmt = site.stmt
        # the ifs that held only the report (`if flags.metrics_debug:` around the rank guard an earlier round wrote for
        # xm.master_print): the setting among them is the one that no longer does anything, not the rank test
        chain, inner = [], stmt
        holder = ctx.analysis.parent_of.get(stmt)
        while isinstance(holder, ast.If) and holder.body == [inner] and not holder.orelse:
            chain.append(holder)
            inner, holder = holder, ctx.analysis.parent_of.get(holder)
        flags = [c for c in chain if not _RANK_TEST.search(ctx.src(c.test))]
        if flags:
            test = ctx.src(flags[-1].test)
            note = (f"removed the metrics report printed under `if {test}:`: {test} no longer does anything here; "
                    f"{_MET_ADVICE}")
        elif chain:
            note = f"removed the metrics report printed under `if {ctx.src(chain[0].test)}:`: {_MET_ADVICE}"
        else:
            note = f"removed `{ctx.src(stmt).strip()}`: {_MET_ADVICE}"
        return ctx.finding(site, f"{name}() only printed: removed ({_MET_ADVICE})", fix=fx.build(), note=note)
    return ctx.finding(site, f"{name} has no TorchNeuron equivalent: {_MET_ADVICE}")


# -- NM136 ------------------------------------------------------------------------------------------
@rule(
    code="NM136",
    name="xla-profiler",
    summary="torch_xla.debug.profiler traces become torch.profiler.record_function; the profile server goes",
    fix="safe",
    severity="warning",
    triggers=[("call", f"{XP}.StepTrace"), ("call", f"{XP}.Trace"), ("call", f"{XP}.start_server"),
              ("call", f"{XP}.trace"), ("call", f"{XP}.trace_detached"), ("call", f"{XP}.trace_me"),
              ("call", f"{XP}.start_trace"), ("call", f"{XP}.stop_trace"),
              ("ref", f"{XP}.StepTrace"), ("ref", f"{XP}.Trace"), ("ref", f"{XP}.trace_me")],
    docs="""
        `with xp.StepTrace(name, step_num=i):` and `with xp.Trace(name):` annotate a region for the XLA
        profiler; `StepTrace` also cut the lazy graph on exit, which eager TorchNeuron does not need. Both
        become `torch.profiler.record_function(name)`, which labels the region in `torch.profiler` traces.
        `xp.start_server(port)` as a statement, or bound to a name nothing reads (`server = xp.start_server(9012)`;
        it starts the XLA profiler's gRPC server, which a native run has no use for) is removed, and so are
        the capture statements (`xp.trace(...)`, `trace_detached`, `start_trace`/`stop_trace`), each named with
        its line in the rewrite's notes, since no XLA profile is written any more: profile with
        `torch.profiler.profile(...)` and the Neuron profiler (Neuron Explorer) instead. The `@xp.trace_me(name)`
        decorator becomes `@torch.profiler.record_function(name)`. Their values used elsewhere are reported.
    """,
    examples=[("import torch_xla.debug.profiler as xp\nwith xp.StepTrace('train', step_num=step):\n    train_step()", "import torch.profiler\nwith torch.profiler.record_function('train'):\n    train_step()")],
)
def xla_profiler(site, ctx):
    short = site.key.rsplit(".", 1)[1]
    advice = "profile with torch.profiler.profile(...) (regions labelled by torch.profiler.record_function) or the Neuron profiler"
    if site.kind == "ref":
        return ctx.finding(site, f"xp.{short} used as a value: {advice}")
    call = site.call
    if short in ("StepTrace", "Trace"):
        name = kwarg(call, "name", 0)
        if name is None or has_star_args(call):
            return ctx.finding(site, f"xp.{short} without a plain name: use torch.profiler.record_function(name) by hand")
        fx = ctx.fixer()
        fx.replace(call, f"{fx.ref('torch.profiler')}.record_function({ctx.src(name)})")
        extra = [k.arg for k in call.keywords if k.arg != "name"] + (["positional arguments"] if len(call.args) > 1 else [])
        note = f"Dropped {', '.join(extra)}." if extra else ""
        return ctx.finding(site, f"xp.{short}: becomes torch.profiler.record_function (eager: no graph cut on exit)", fix=fx.build(), note=note)
    if short == "start_server" and (site.is_statement or _unread_binding(site, ctx)):
        fx = ctx.fixer()
        fx.delete(site.stmt)
        return ctx.finding(site, f"xp.start_server starts the XLA profiler server: removed; {advice}", fix=fx.build(),
                           note=f"removed `{ctx.src(site.stmt).strip()}` (the XLA profiler's server); {advice}")
    if short in ("trace", "trace_detached", "start_trace", "stop_trace") and site.is_statement:
        fx = ctx.fixer()
        fx.delete(site.stmt)
        return ctx.finding(site, f"xp.{short} captured an XLA profile: removed; {advice}", fix=fx.build(),
                           note=f"removed `{ctx.src(site.stmt).strip()}`: no XLA profile is captured any more; {advice}")
    if short == "trace_me" and isinstance(site.parent, (ast.FunctionDef, ast.AsyncFunctionDef)) and site.node in site.parent.decorator_list:
        name = kwarg(call, "scope", 0)
        if name is not None and not has_star_args(call) and len(call.args) + len(call.keywords) == 1:
            fx = ctx.fixer()
            fx.replace(call, f"{fx.ref('torch.profiler')}.record_function({ctx.src(name)})")
            return ctx.finding(site, "@xp.trace_me: becomes @torch.profiler.record_function (a decorator too)", fix=fx.build())
    return ctx.finding(site, f"xp.{short} is XLA-profiler specific: {advice}")


def _unread_binding(site, ctx) -> bool:
    """`name = call` as a statement of its own, where `name` is a plain name that is read nowhere in the file and
    bound nowhere else (so removing the statement loses nothing but the call's side effect)."""
    stmt = site.stmt
    if not (isinstance(stmt, ast.Assign) and stmt.value is site.node and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)):
        return False
    name = stmt.targets[0].id
    for n in walk(ctx.analysis.tree):
        if isinstance(n, ast.Name) and n.id == name and n is not stmt.targets[0]:
            return False
        if isinstance(n, (ast.Global, ast.Nonlocal)) and name in n.names:
            return False
    return True


# -- NM147 ------------------------------------------------------------------------------------------
_DEVICE_TYPE = ("torch_xla.runtime.device_type", "torch_xla.runtime.runtime.device_type")


@rule(
    code="NM147",
    name="xla-runtime-device-type",
    summary='torch_xla.runtime.device_type() becomes ("NEURON" if torch.accelerator.is_available() else "CPU")',
    fix="safe",
    severity="warning",
    triggers=[*[("call", q) for q in _DEVICE_TYPE], *[("ref", q) for q in _DEVICE_TYPE]],
    docs="""
        `xr.device_type()` returns the PJRT device kind as an upper-case string (`PJRT_DEVICE`): "NEURON" on a
        Trainium host, "CPU" where the program was run on the host, "TPU"/"CUDA" elsewhere. Programs compare it
        (`if xr.device_type() == "NEURON":`, `xr.device_type() in ("TPU", "NEURON")`) or log it. The migrated
        program runs on the `neuron` device when an accelerator is there and on the CPU otherwise, so the call
        becomes the same string computed natively, `"NEURON" if torch.accelerator.is_available() else "CPU"`:
        comparisons and log lines keep their meaning on a Neuron host and on a CPU-only one. A test for
        "TPU" or "CUDA" is now always false there; the finding's note says such a branch can go. Used as a
        value (`kind_fn = xr.device_type`) it is reported.
    """,
    examples=[("import torch_xla.runtime as xr\nif xr.device_type() == 'NEURON':\n    pass",
               "import torch\nif (\"NEURON\" if torch.accelerator.is_available() else \"CPU\") == 'NEURON':\n    pass")],
)
def xla_runtime_device_type(site, ctx):
    if site.kind == "ref":
        return ctx.finding(site, 'xr.device_type used as a value: use lambda: "NEURON" if torch.accelerator.is_available() else "CPU"')
    call = site.call
    if call.args or call.keywords:
        return ctx.finding(site, "xr.device_type() with arguments: migrate by hand")
    fx = ctx.fixer()
    text = f'"NEURON" if {fx.ref("torch")}.accelerator.is_available() else "CPU"'
    parent = site.parent
    bare = (isinstance(parent, (ast.Assign, ast.AnnAssign, ast.Return, ast.keyword, ast.FormattedValue))
            or (isinstance(parent, ast.Call) and call in parent.args))
    fx.replace(call, text if bare else f"({text})")
    note = ""
    compared = parent if isinstance(parent, ast.Compare) else None
    if compared is not None:
        others = [c for c in [compared.left, *compared.comparators] if c is not call]
        kinds = {v.upper() for o in others for v in _strings(o)}
        if kinds - {"NEURON", "CPU"}:
            note = (f"`{ctx.src(compared).strip()}`: the program no longer runs on "
                    f"{', '.join(sorted(kinds - {'NEURON', 'CPU'}))} through torch_xla, so this test is false; the branch it guards can go.")
    return ctx.finding(site, 'xr.device_type(): becomes "NEURON" if torch.accelerator.is_available() else "CPU" '
                             "(the device kind, as torch_xla spelt it)", fix=fx.build(), note=note)


def _strings(node) -> list:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


# -- NM149 ------------------------------------------------------------------------------------------
_IS_XLA_TENSOR = f"{XM}.is_xla_tensor"


@rule(
    code="NM149",
    name="xla-is-tensor",
    summary='xm.is_xla_tensor(t) becomes t.device.type == "neuron"',
    fix="safe",
    severity="warning",
    triggers=[("call", _IS_XLA_TENSOR), ("ref", _IS_XLA_TENSOR)],
    docs="""
        `xm.is_xla_tensor(tensor)` is `tensor.device.type == 'xla'` (torch_xla 2.9, `core/xla_model.py`): whether a
        tensor lives on the accelerator rather than on the host. On TorchNeuron the accelerator's tensors have the
        device type `neuron`, so the call becomes `tensor.device.type == "neuron"` (in parentheses where the
        comparison would otherwise bind differently). Used as a value (`filter(xm.is_xla_tensor, ...)`) it is
        reported: write `lambda t: t.device.type == "neuron"`.
    """,
    examples=[("if xm.is_xla_tensor(x):\n    x = x.cpu()", 'if x.device.type == "neuron":\n    x = x.cpu()')],
)
def xla_is_tensor(site, ctx):
    if site.kind == "ref":
        return ctx.finding(site, 'xm.is_xla_tensor used as a value: use lambda t: t.device.type == "neuron"')
    call = site.call
    tensor = kwarg(call, "tensor", 0)
    if has_star_args(call) or tensor is None or len(call.args) + len(call.keywords) != 1:
        return ctx.finding(site, 'xm.is_xla_tensor with other arguments: test t.device.type == "neuron" by hand')
    fx = ctx.fixer()
    fx.replace(call, wrap_for_parent(site, f'{atom(ctx, tensor)}.device.type == "neuron"'))
    return ctx.finding(site, 'xm.is_xla_tensor(t): becomes t.device.type == "neuron" (the accelerator\'s tensors)',
                       fix=fx.build())


# -- NM159 ------------------------------------------------------------------------------------------
_TO_CPU = f"{XM}._maybe_convert_to_cpu"


@rule(
    code="NM159",
    name="xla-convert-to-cpu",
    summary="xm._maybe_convert_to_cpu(data) becomes a copy of data with its tensors on the CPU",
    fix="safe",
    severity="warning",
    triggers=[("call", _TO_CPU), ("ref", _TO_CPU)],
    docs="""
        `xm._maybe_convert_to_cpu(data)`, a private torch_xla function that checkpointing code calls before
        `torch.save` (AWS's BERT pretraining sample: `cpu_data = xm._maybe_convert_to_cpu(data)`), waits for the
        device and returns `data` with every XLA tensor replaced by a CPU copy: dicts become plain dicts, lists and
        tuples become lists, a tensor reached twice is copied once (torch_xla 2.9, `ToXlaTensorArena` and
        `utils.for_each_instance_rewrite`). It becomes `_neuron_to_cpu(data)`, the helper `xm.save`'s migration
        uses, which walks the same containers the same way (a `.cpu()` copy waits for the device). With
        `convert=False` the call only synchronised: it is reported.
    """,
    examples=[("cpu_data = xm._maybe_convert_to_cpu({'model': model.state_dict()})",
               "cpu_data = _neuron_to_cpu({'model': model.state_dict()})")],
)
def xla_convert_to_cpu(site, ctx):
    if site.kind == "ref":
        return ctx.finding(site, "xm._maybe_convert_to_cpu used as a value: move the tensors to the CPU by hand")
    call = site.call
    data = kwarg(call, "data", 0)
    convert = kwarg(call, "convert", 1)
    if has_star_args(call) or data is None or (convert is not None and not (
            isinstance(convert, ast.Constant) and convert.value is True)):
        return ctx.finding(site, "xm._maybe_convert_to_cpu with other arguments: move the tensors to the CPU by hand "
                                 "(.cpu() of each)")
    fx = ctx.fixer()
    fx.scope = site.scope
    fx.replace(call, f"{fx.helper('_neuron_to_cpu')}({ctx.src_relative(data)})")
    return ctx.finding(site, "xm._maybe_convert_to_cpu: becomes _neuron_to_cpu, the same walk with .cpu() copies",
                       fix=fx.build())


# -- NM139 ------------------------------------------------------------------------------------------
_AVAILABLE = [f"{lib}.{mod}is_torch_xla_available" for lib in ("transformers", "accelerate", "diffusers", "optimum.neuron")
              for mod in ("", "utils.", "utils.import_utils.", "utils.imports.")]
_AVAILABLE += [a.replace("is_torch_xla_available", "is_torch_tpu_available") for a in _AVAILABLE if a.startswith("transformers")]
_GUARD_ADVICE = ("after migration uninstall torch-xla (or set USE_TORCH_XLA=0 for Hugging Face libraries), "
                 "otherwise the XLA branch stays active; collapse the check to the native branch")


@rule(
    code="NM139",
    name="xla-version-gate",
    summary="torch_xla version checks and availability flags keep XLA code paths alive",
    fix="none",
    severity="info",
    triggers=[("ref", "torch_xla.__version__"), ("ref", "torch_xla.version.__version__"), ("string", "torch_xla*"), ("string", "torch-xla*"),
              *[("call", a) for a in _AVAILABLE], *[("ref", a) for a in _AVAILABLE]],
    docs="""
        Code gates behaviour on torch_xla: `torch_xla.__version__` comparisons, Lightning's
        `RequirementCache("torch_xla>=2.1")`, `importlib.util.find_spec("torch_xla")`, Hugging Face's
        `is_torch_xla_available()`. Such a flag often gates non-XLA behaviour too (diffusers moves timesteps to
        the CPU when it is set). After migration the gate is either always false (torch-xla uninstalled: the
        branch is dead code) or, worse, still true when torch-xla stays installed, and Hugging Face
        accelerate/transformers then take their XLA paths. Each gate is reported: collapse it to the native
        branch, and uninstall torch-xla or set `USE_TORCH_XLA=0`.
    """,
    examples=[("if torch_xla.__version__ >= '2.5':\n    pass", None)],
)
def xla_version_gate(site, ctx):
    if site.kind == "string":
        parent = site.parent
        if not (isinstance(parent, ast.Call) and site.node in parent.args) and not (
                isinstance(parent, ast.keyword) and isinstance(ctx.analysis.parent_of.get(parent), ast.Call)):
            return None  # a message or a name, not a package check
        value = site.node.value
        if isinstance(parent, ast.Call) and any(isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith(("torch_xla", "torch-xla"))
                                                for a in parent.args[: parent.args.index(site.node)]):
            return None  # one finding per call
        if not (value in ("torch_xla", "torch-xla") or value[len("torch_xla"):][:1] in ("<", ">", "=", "!", "~", "[")):
            return None
        return ctx.finding(site, f"package check on {ctx.src(site.node)}: {_GUARD_ADVICE}")
    if site.key.endswith("__version__"):
        return ctx.finding(site, f"torch_xla version gate: {_GUARD_ADVICE}")
    return ctx.finding(site, f"{site.key.rsplit('.', 1)[1]}(): {_GUARD_ADVICE}")


# -- catch-alls -------------------------------------------------------------------------------------
@rule(
    code="NM190",
    name="torch-xla-star-import",
    summary="`from torch_xla... import *` hides which torch_xla names the code uses",
    fix="none",
    severity="warning",
    triggers=[("star_import", "torch_xla*")],
    docs="""
        A star import binds torch_xla names without naming them, so no rule can see (or rewrite) their uses.
        Replace it with explicit imports (`import torch_xla.core.xla_model as xm`) and run the migration
        again.
    """,
    examples=[("from torch_xla.core.xla_model import *", None)],
)
def xla_star_import(site, ctx):
    return ctx.finding(site, f"star import from {site.key}: import the names explicitly, then run neuron-migrate again")


@rule(
    code="NM191",
    name="torch-xla-monkey-patch",
    summary="assigning to a torch_xla attribute (monkey-patching) changes what later torch_xla calls do",
    fix="none",
    severity="warning",
    triggers=[("store", "torch_xla*")],
    docs="""
        Code such as `xm.optimizer_step = patched_step` (transformers did this under XLA FSDP) changes what later
        torch_xla calls do, so rewriting those calls by their documented meaning would be wrong. The patch is
        reported: move its logic into the native code that replaces the patched function, and delete it.
    """,
    examples=[("xm.optimizer_step = lambda opt, **kw: opt.step()", None)],
)
def xla_monkey_patch(site, ctx):
    if not isinstance(site.node, ast.Attribute):
        return None  # `xm = None` rebinds the local name (import guards), it patches nothing
    return ctx.finding(site, f"`{ctx.src(site.node)}` is monkey-patched: later calls do not behave as documented; "
                             "move the patch's logic into the native replacement and delete the assignment")


# -- NM163 ------------------------------------------------------------------------------------------
_WRAP_MODEL = ("transformers.Trainer._wrap_model", "transformers.trainer.Trainer._wrap_model")


@rule(
    code="NM163",
    name="hf-trainer-xla-fixup",
    summary="the XLA fixup that patches transformers' Trainer._wrap_model to set args.local_rank = -1 goes",
    fix="safe",
    severity="error",
    triggers=[("store", q) for q in _WRAP_MODEL],
    docs="""
        AWS's Hugging Face fine-tuning tutorials and samples for torch-neuronx on XLA patch the Trainer
        ("Fixup to enable distributed training with XLA"): `orig_wrap_model = Trainer._wrap_model`, a
        `_wrap_model(self, model, training=True)` that sets `self.args.local_rank = -1` and calls the original, and
        `Trainer._wrap_model = _wrap_model`. With the transformers 4.x releases those samples pin, the Trainer decided
        from `args.local_rank` whether to wrap the model in DistributedDataParallel; under XLA torch_xla's optimizer
        step all-reduced the gradients, so the wrap had to be kept off. On TorchNeuron DDP is what averages the
        gradients, so the patch must go (transformers 5 no longer reads `args.local_rank`: there the patch does
        nothing). The three statements (and a comment naming XLA directly above them) are removed when they are
        exactly that patch; any other patch of `_wrap_model` is reported.
    """,
    examples=[("from transformers import Trainer\n\norig_wrap_model = Trainer._wrap_model\n"
               "def _wrap_model(self, model, training=True):\n    self.args.local_rank = -1\n"
               "    return orig_wrap_model(self, model, training)\nTrainer._wrap_model = _wrap_model\n",
               "from transformers import Trainer\n")],
)
def hf_trainer_xla_fixup(site, ctx):
    stmt = site.stmt
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and stmt.targets[0] is site.node):
        return None
    patch = _local_rank_patch(stmt, site, ctx)
    if patch is None:
        return ctx.finding(site, "transformers' Trainer._wrap_model is patched: under XLA such patches kept the Trainer from "
                                 "wrapping the model in DDP (torch_xla averaged the gradients); on Neuron DDP averages "
                                 "them: check that the patch does not prevent the wrap")
    fx = ctx.fixer()
    fx.scope = site.scope
    for part in patch:
        fx.delete(part)
    return ctx.finding(site, "the XLA fixup that sets args.local_rank = -1 in Trainer._wrap_model kept transformers 4.x "
                             "from wrapping the model in DDP (torch_xla averaged the gradients); on Neuron DDP averages "
                             "them (transformers 5 ignores args.local_rank): the patch is removed", fix=fx.build())


def _local_rank_patch(store: ast.Assign, site, ctx):
    """[the saved original, the def, the store] when `Trainer._wrap_model = f` installs the XLA fixup: `f`, defined in
    the same block, sets `self.args.local_rank = -1` and returns the saved original called with its own arguments;
    the original was saved from Trainer._wrap_model in the same block, and neither name is used elsewhere."""
    a = ctx.analysis
    if not isinstance(store.value, ast.Name):
        return None
    parent = a.parent_of.get(store)
    body = getattr(parent, "body", None)
    if not isinstance(body, list) or not any(s is store for s in body):
        return None
    fn = next((s for s in body if isinstance(s, ast.FunctionDef) and s.name == store.value.id), None)
    if fn is None or fn.decorator_list or len(fn.body) != 2:
        return None
    first, ret = fn.body
    if not (isinstance(first, ast.Assign) and len(first.targets) == 1 and a.source(first.targets[0]) == "self.args.local_rank"
            and isinstance(first.value, ast.UnaryOp) and isinstance(first.value.op, ast.USub)
            and isinstance(first.value.operand, ast.Constant) and first.value.operand.value == 1):
        return None
    if not (isinstance(ret, ast.Return) and isinstance(ret.value, ast.Call) and isinstance(ret.value.func, ast.Name)):
        return None
    orig_name = ret.value.func.id
    saved = next((s for s in body if isinstance(s, ast.Assign) and len(s.targets) == 1
                  and isinstance(s.targets[0], ast.Name) and s.targets[0].id == orig_name
                  and isinstance(s.value, ast.Attribute)
                  and a.resolve(s.value, site.scope, count_use=False) in _WRAP_MODEL), None)
    if saved is None:
        return None
    params = [p.arg for p in fn.args.args]
    if [a.source(x) for x in ret.value.args] != params or ret.value.keywords:
        return None
    # neither name read anywhere but in the patch itself
    for name in (fn.name, orig_name):
        uses = [n for n in walk(a.tree) if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)]
        if len(uses) != 1:
            return None
    return [saved, fn, store]


@rule(
    code="NM199",
    name="torch-xla-reference",
    summary="a torch_xla API no other rule migrates",
    fix="none",
    severity="warning",
    triggers=[("call", "torch_xla*"), ("ref", "torch_xla*")],
    docs=f"""
        The fallback for every torch_xla call or reference that no specific rule handled, so that nothing
        torch_xla is left behind silently after `rewrite --write` (torch-xla is not installed with
        TorchNeuron). TorchNeuron is native PyTorch on the `neuron` device: find the native equivalent
        (`torch.*`, `torch.distributed` with the `neuron` backend, `torch.neuron` device module,
        `torch.compile(backend="neuron")`), or remove the call when it only served the lazy-tensor runtime.
        See {RELEASE_NOTES}.
    """,
    examples=[("torch_xla.core.xla_model.some_new_api()", None)],
)
def torch_xla_reference(site, ctx):
    what = "used as a value" if site.kind == "ref" else "called"
    return ctx.finding(site, f"`{site.key}` ({what}) has no automatic migration: replace it with native PyTorch on the neuron device "
                             "(torch.*, torch.distributed backend \"neuron\", torch.neuron), or remove it if it only served the XLA runtime")


