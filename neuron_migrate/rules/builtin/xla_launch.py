"""torch_xla saving and launching: xm.save, init_process_group('xla'), xmp.spawn / torch_xla.launch, MpModelWrapper,
MpSerialExecutor (NM125-NM129); the shared context facts are in xla_distributed.py."""
from __future__ import annotations

import ast
import os
import re

from neuron_migrate.names.analysis import walk
from neuron_migrate.program import cached
from neuron_migrate.program.distributed import Group, torchrun_branch_of
from neuron_migrate.rules.api import const_value, has_star_args, indent_statement, kwarg, rule
from neuron_migrate.rules.builtin.compat_runtime import rank_conditional
from neuron_migrate.rules.builtin.xla_collectives import _free_name
from neuron_migrate.rules.builtin.xla_distributed import (
    DIST, DIST_GUIDE, XM, XMP, alone_on_lines, atom, call_and_ref, dropped, dropped_words, group_at,
    is_none, program, replace_callee, simple_ref, starts_line, wrapped_in_ddp, _stmt_of)


# -- NM125 xm.save ---------------------------------------------------------------------------------
@rule(
    code="NM125",
    name="xla-save",
    summary="xm.save writes CPU copies from each host's rank 0: becomes _neuron_save with the same defaults",
    fix="safe",
    severity="warning",
    triggers=call_and_ref(f"{XM}.save"),
    docs="""
        `xm.save(data, file_or_path, master_only=True, global_master=False)` is called by every rank: it moves the
        tensors in `data` to the CPU, writes on rank 0 of **each host** (`global_master=True`: global rank 0 only;
        `master_only=False`: every rank), and then waits for all ranks. A plain `torch.save` on every rank races on
        the file; on `rank == 0` only it changes multi-node behaviour and saves device tensors. The call becomes
        `_neuron_save(...)`, an inserted helper with the same signature and defaults (tensors are moved with
        public API only: dicts, lists and tuples are walked). Used as a value (`save_function=xm.save`) it becomes
        the helper name. Where the program model knows more, the plain form is written: in a single-device program
        `torch.save(<CPU copy>, path)`; after an `init_process_group` that always runs, `if
        dist.get_node_local_rank(fallback_rank=0) == 0: torch.save(<CPU copy>, path)` then `dist.barrier()`. Under
        a rank guard (`if xm.is_master_ordinal(): xm.save(...)`, common in real scripts) no barrier is written:
        only the guarded ranks get there, so a barrier would hang, and torch_xla 2.9's xm.save does not wait
        (its docstring leaves the rendezvous to the caller); under the master guard itself the writer test is the
        guard's. The CPU copy of a model's `state_dict()` is `{k: v.cpu() for k, v in model.state_dict().items()}`.
    """,
    examples=[("xm.save(model.state_dict(), 'model.pt')", "_neuron_save(model.state_dict(), 'model.pt')")],
)
def xla_save(site, ctx):
    if site.kind == "call" and not has_star_args(site.call):
        plain = _plain_save(site, ctx)
        if plain is not None:
            return plain
    return replace_callee(site, ctx, "_neuron_save", "xm.save: becomes _neuron_save (CPU copy, written by each host's rank 0, then a barrier)")


# a guard that selects each host's master (xm.is_master_ordinal() and what NM1xx make of it): xm.save's own writer
_MASTER_GUARD = re.compile(r"^(?:\w+\.)*is_master_ordinal\(\)$|^(?:\w+\.)*is_master_ordinal\(local=True\)$|"
                           r"get_node_local_rank\(fallback_rank=0\) == 0$")


def _plain_save(site, ctx):
    """torch.save of a CPU copy: directly in a single-device program, on the saving rank then a barrier after a sure init."""
    call = site.call
    data, path = kwarg(call, "data", 0), kwarg(call, "file_or_path", 1)
    master_only = const_value(kwarg(call, "master_only", 2), True) if kwarg(call, "master_only", 2) is not None else True
    global_master = const_value(kwarg(call, "global_master", 3), False) if kwarg(call, "global_master", 3) is not None else False
    if data is None or path is None or not isinstance(master_only, bool) or not isinstance(global_master, bool):
        return None
    state = group_at(ctx, site)
    guard = rank_conditional(site)
    if state not in (Group.NONE, Group.ALWAYS) and not (guard is not None and not global_master):
        return None
    fx = ctx.fixer()
    cpu = _cpu_copy(ctx, fx, data)
    save = f"{fx.ref('torch', site.scope)}.save({cpu}, {ctx.src(path)})"
    if state is Group.NONE:
        fx.replace(call, save)
        return ctx.finding(site, "xm.save in a single-device program: becomes torch.save of a CPU copy", fix=fx.build())
    stmt = site.stmt
    if not (site.is_statement and alone_on_lines(ctx, stmt)):
        return None
    dist = fx.ref(DIST, site.scope)
    if guard is not None:
        # `if xm.is_master_ordinal(): xm.save(...)`: torch_xla 2.9's xm.save does not wait for the other ranks, and
        # a barrier here would hang (only the guarded ranks reach it); under the usual master guard the writer
        # test is the guard's own
        master = _MASTER_GUARD.search(ctx.src(guard.test)) is not None
        if not master_only or master:
            fx.replace(stmt, save + "\n")
        else:
            fx.replace(stmt, f"if {dist}.get_node_local_rank(fallback_rank=0) == 0:\n{indent_statement(save)}\n")
        return ctx.finding(site, f"xm.save under `if {ctx.src(guard.test)}:`: becomes torch.save of a CPU copy (no "
                                 "barrier: only the guarded ranks get here, and xm.save did not wait)", fix=fx.build())
    lines = []
    if not master_only:
        lines.append(save)
    else:
        test = f"{dist}.get_rank() == 0" if global_master else f"{dist}.get_node_local_rank(fallback_rank=0) == 0"
        lines += [f"if {test}:", f"    {save}"]
    lines.append(f"{dist}.barrier()")
    fx.replace(stmt, "\n".join(lines) + "\n")
    who = "every rank" if not master_only else ("global rank 0" if global_master else "rank 0 of each host")
    return ctx.finding(site, f"xm.save: becomes torch.save of a CPU copy on {who}, then dist.barrier() (xm.save waited for all ranks)",
                       fix=fx.build())


def _cpu_copy(ctx, fx, data) -> str:
    """A CPU copy of `data` as one expression: a comprehension for a module's state_dict (also as a value of a dict
    literal whose other values are constants), else the small helper."""
    plain = _plain_cpu_copy(ctx, data)
    if plain is not None:
        return plain
    return f"{fx.helper('_neuron_to_cpu')}({ctx.src(data)})"


def _plain_cpu_copy(ctx, data):
    if (isinstance(data, ast.Call) and isinstance(data.func, ast.Attribute) and data.func.attr == "state_dict"
            and not data.args and not data.keywords and _is_module(ctx, data.func.value)):
        return f"{{k: v.cpu() for k, v in {ctx.src(data)}.items()}}"
    if isinstance(data, ast.Constant):
        return ctx.src(data)
    if isinstance(data, ast.Dict) and all(k is not None for k in data.keys) and ctx.analysis.span(data).line == ctx.analysis.span(data).end_line:
        values = [_plain_cpu_copy(ctx, v) for v in data.values]
        if all(v is not None for v in values):
            return "{" + ", ".join(f"{ctx.src(k)}: {v}" for k, v in zip(data.keys, values)) + "}"
    return None


def _is_module(ctx, node) -> bool:
    """`node` is a model: the file takes its .parameters() (an optimizer's, so its state_dict holds tensors only)."""
    if not simple_ref(node):
        return False

    def owners(a) -> set:  # the text of every `X` in `X.parameters()` / `X.named_parameters()` (once per file)
        return {ctx.src(n.func.value) for n in walk(a.tree)
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("parameters", "named_parameters")}

    return ctx.src(node) in cached(ctx.analysis, "parameters owners", owners)


# -- NM126 init_process_group('xla') ---------------------------------------------------------------
_XLA_INIT_METHODS = ("xla://", "pjrt://")


@rule(
    code="NM126",
    name="xla-process-group",
    summary="dist.init_process_group('xla', init_method='xla://') becomes dist.init_process_group(\"neuron\")",
    fix="safe",
    severity="warning",
    triggers=[("call", f"{DIST}.init_process_group"), ("call", f"{DIST}.distributed_c10d.init_process_group")],
    docs=f"""
        The XLA process group backend `'xla'` and its rendezvous `init_method='xla://'` (`'pjrt://'` before
        torch_xla 2.2) become the TorchNeuron backend `"neuron"` with the default `env://` rendezvous, whose
        `MASTER_ADDR`/`MASTER_PORT`/`RANK`/`WORLD_SIZE` torchrun provides ({DIST_GUIDE}). `rank=` and
        `world_size=` keep their meaning. The `neuron` backend must be initialised before the first tensor is put
        on the device; the finding notes it. `import torch_xla.distributed.xla_backend` is removed by NM100 once
        nothing uses it. An `if not dist.is_initialized(): dist.init_process_group(...)` that can never run, because
        the program model knows a group is always started before it (a `setup()` that the launched worker calls
        after the launch rewrite's own init), is removed. So is such an init written without the guard, alone in a
        function that only the launched worker reaches (AWS's DDP sample with `xmp.spawn`): a guard around it would
        be dead code. That one goes only when this file's own launch decides it, the repository model says no other
        file imports this one (a program elsewhere could call the function without a group; without a model, as
        for a lone file outside any project, the guard is written), and its arguments call nothing but
        `datetime.timedelta`, `os.getenv` or `os.environ.get`; otherwise it is guarded.
    """,
    examples=[("dist.init_process_group('xla', init_method='xla://')", 'dist.init_process_group("neuron")')],
)
def xla_process_group(site, ctx):
    call = site.call
    if has_star_args(call):
        return None
    backend = kwarg(call, "backend", 0)
    init = kwarg(call, "init_method", 1)
    xla_backend = isinstance(backend, ast.Constant) and backend.value == "xla"
    xla_init = isinstance(init, ast.Constant) and isinstance(init.value, str) and init.value.startswith(_XLA_INIT_METHODS)
    guard = program(ctx).launch_inits() and not _guarded_init(ctx, site)
    if not xla_backend and not xla_init and not guard:
        return None
    if xla_init and not xla_backend and backend is not None:
        return ctx.finding(site, f"init_method {init.value!r} needs the XLA backend: use init_method='env://' (torchrun) with backend \"neuron\"")
    dead = _dead_guarded_init(ctx, site)
    if dead is not None:
        fx = ctx.fixer()
        fx.delete(dead)
        return ctx.finding(site, f"`if {ctx.src(dead.test)}: init_process_group(...)` can never run: the process group is "
                                 "always started before this point (by the launch rewrite's init, or the program's own): removed",
                           fix=fx.build())
    fx = ctx.fixer()
    new_call = ctx.src_relative(call)
    drops = []
    if xla_backend or xla_init:
        parts = []
        for i, a in enumerate(call.args):
            if a is backend:
                parts.append('"neuron"')
            elif a is init:
                drops.append((a, f"init_method={ctx.src(a)} (torchrun's env:// rendezvous replaces it)"))
                if i == len(call.args) - 1:
                    continue
                parts.append("None")
            else:
                parts.append(ctx.src_relative(a))
        for kw in call.keywords:
            if kw.value is init:
                drops.append((kw, f"init_method={ctx.src(kw.value)} (torchrun's env:// rendezvous replaces it)"))
                continue
            parts.append(f'{kw.arg}="neuron"' if kw.value is backend else f"{kw.arg}={ctx.src_relative(kw.value)}")
        if backend is None:
            parts.insert(0, '"neuron"')
        new_call = f"{ctx.src(call.func)}({', '.join(parts)})"
    extra = dropped(ctx, site, drops)
    message = "XLA process group: becomes init_process_group(\"neuron\") with the env:// rendezvous (torchrun)" if (xla_backend or xla_init) else ""
    note = ("Call it before any tensor is moved to the neuron device: the backend cannot start once the Neuron runtime "
            "is initialised.")
    if guard and _init_never_runs(ctx, site):
        fx.delete(site.stmt)
        return ctx.finding(site, "init_process_group can never run: the launch rewrite starts the process group before "
                                 "every call of this function (it is only reached from the launched worker): removed",
                           fix=fx.build())
    if guard:
        stmt = site.stmt
        dist = fx.ref(DIST, site.scope)
        parent = ctx.analysis.parent_of.get(stmt)
        if not (isinstance(stmt, ast.Expr) and stmt.value is call):
            return [ctx.finding(site, "init_process_group in a program whose launch now starts the group: guard it with "
                                      "`if not dist.is_initialized():` by hand (its value is used)"), *extra]
        if isinstance(parent, ast.If) and parent.body == [stmt] and not parent.orelse and starts_line(ctx, stmt):
            test = parent.test
            test_src = ctx.src(test) if not isinstance(test, (ast.BoolOp, ast.IfExp, ast.Lambda, ast.NamedExpr)) or (
                isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And)) else f"({ctx.src(test)})"
            fx.replace(test, f"{test_src} and not {dist}.is_initialized()")
            fx.replace(call, new_call)
        elif alone_on_lines(ctx, stmt):
            fx.replace(stmt, f"if not {dist}.is_initialized():\n{indent_statement(new_call)}\n")
        else:
            return [ctx.finding(site, "init_process_group on a shared line in a program whose launch now starts the group: "
                                      "guard it with `if not dist.is_initialized():` by hand"), *extra]
        message = (message + "; " if message else "") + ("guarded with `not dist.is_initialized()`: the launch rewrite already "
                                                         "starts the group whenever torchrun runs the script")
        return [ctx.finding(site, message[0].upper() + message[1:], fix=fx.build(), note=note), *extra]
    fx.replace(call, new_call)
    return [ctx.finding(site, message, fix=fx.build(), note=note), *extra]


# calls an init's arguments may make that do nothing but compute a value (a timeout, a port from the environment)
_PURE_ARG_CALLS = {"datetime.timedelta", "os.getenv", "os.environ.get"}


def _launches_rewritten(ctx) -> bool:
    """NM127 really rewrites every xmp.spawn / torch_xla.launch of this file (so the group the model counts on, the
    launch rewrite's, is there)."""
    for launch in program(ctx).uses(sorted(_SPAWN | _LAUNCH)):
        if not (isinstance(launch, ast.Call) and _launch_rewritable(ctx, launch)):
            return False
    return True


def _init_never_runs(ctx, site) -> bool:
    """An unguarded init statement of a function that only the launched worker reaches, after the launch rewrite's
    own init (`setup()` of AWS's ddp_xmp_spawn.py, called first thing by the worker that xmp.spawn starts): once the
    launch starts the group, a second init raises, and a guarded one could never run. Only where this file's own
    launch decides it (not a fact from other files), the repository model says no other file imports this one (so no
    other program calls the function outside the launch), the statement stands alone in the function's body, and its
    arguments call nothing but _PURE_ARG_CALLS (dropping them loses no side effect)."""
    stmt = site.stmt
    facts = program(ctx)
    if facts.group_elsewhere or facts.imported_elsewhere is not False:
        return False  # another file may call this function outside the launched worker (or no model says none does)
    if not (isinstance(stmt, ast.Expr) and stmt.value is site.call):
        return False
    if not isinstance(ctx.analysis.parent_of.get(stmt), (ast.FunctionDef, ast.AsyncFunctionDef)) or not alone_on_lines(ctx, stmt):
        return False
    for arg in [*site.call.args, *(k.value for k in site.call.keywords)]:
        for n in walk(arg):
            if isinstance(n, (ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom)) or (
                    isinstance(n, ast.Call) and facts.qualname(n.func) not in _PURE_ARG_CALLS):
                return False
    if facts.group_at(stmt) is not Group.ALWAYS or not facts.uses(sorted(_SPAWN | _LAUNCH)):
        return False
    return _launches_rewritten(ctx)


def _dead_guarded_init(ctx, site):
    """The `if not dist.is_initialized():` statement around this init (its only statement, no else) when the program
    model knows a group is always started before it runs (e.g. a `setup()` the launched worker calls after the
    launch rewrite's init): that init can never run. Else None."""
    stmt = site.stmt
    parent = ctx.analysis.parent_of.get(stmt)
    if not (isinstance(stmt, ast.Expr) and stmt.value is site.call and isinstance(parent, ast.If)
            and parent.body == [stmt] and not parent.orelse and alone_on_lines(ctx, parent)):
        return None
    test = parent.test
    if not (isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and isinstance(test.operand, ast.Call)
            and isinstance(test.operand.func, ast.Attribute) and test.operand.func.attr == "is_initialized"
            and not test.operand.args and program(ctx).qualname(test.operand.func) in (f"{DIST}.is_initialized", None)):
        return None
    if program(ctx).group_at(parent) is not Group.ALWAYS:
        return None
    # the group the model counts on may be the launch rewrite's: only when NM127 really rewrites every launch
    return parent if _launches_rewritten(ctx) else None


def _launch_rewritable(ctx, call) -> bool:
    """NM127 rewrites this xmp.spawn / torch_xla.launch call (else it only reports it)."""
    what = "xmp.spawn" if program(ctx).qualname(call.func) in _SPAWN else "torch_xla.launch"
    fn = kwarg(call, "fn", 0)
    if has_star_args(call) or fn is None:
        return False
    method = kwarg(call, "start_method", 5 if what == "xmp.spawn" else 2)
    if const_value(method) == "fork" and _fork_shared(ctx, call, fn):
        return False
    stmt = _stmt_of(ctx.analysis, call)
    return isinstance(stmt, ast.Expr) and stmt.value is call and alone_on_lines(ctx, stmt)


def _guarded_init(ctx, site) -> bool:
    """An `if` around the init already asks `dist.is_initialized()` (or the WORLD_SIZE check of the launch rewrite)."""
    for anc in site.ancestors():
        if isinstance(anc, ast.If):
            for n in walk(anc.test):
                if isinstance(n, ast.Attribute) and n.attr == "is_initialized" or isinstance(n, ast.Constant) and n.value == "WORLD_SIZE":
                    return True
        if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return False
    return False


# -- NM127 xmp.spawn / torch_xla.launch ------------------------------------------------------------
_SPAWN = {f"{XMP}.spawn"}
_LAUNCH = {"torch_xla.launch", "torch_xla.torch_xla.launch"}


@rule(
    code="NM127",
    name="xmp-spawn",
    summary="xmp.spawn(fn, args) / torch_xla.launch(fn, args) become a direct fn(rank, *args) call started by torchrun",
    fix="safe",
    severity="warning",
    triggers=call_and_ref(*sorted(_SPAWN | _LAUNCH)),
    docs=f"""
        `xmp.spawn(fn, args=(...))` started one process per device and called `fn(global_ordinal, *args)` in each;
        `torch_xla.launch(fn, args)` did the same, or under torchrun called `fn(LOCAL_RANK, *args)`. TorchNeuron
        runs one process per NeuronCore started by torchrun ({DIST_GUIDE}), so the call becomes a direct call
        `fn(dist.get_rank(), *args)`: both pass the global ordinal, as torch_xla documents for both (on one host
        it is also the LOCAL_RANK torch_xla.launch passed under torchrun). Unless the worker always starts the
        group itself first, the rewrite starts it before the call: torchrun's group (`dist.init_process_group(
        "neuron")` when torchrun set `WORLD_SIZE`), else a group of one process (`store=dist.HashStore(), rank=0,
        world_size=1`), so the script still runs as one process without torchrun and every rewritten collective,
        rank and barrier is a plain `torch.distributed` call that works in both. In the `else:` of the script's
        own torchrun test (`if os.environ.get("WORLD_SIZE"): ... else: xmp.spawn(...)`, AWS's samples) only the
        group of one process is started. The script's own init (behind a
        flag, say) is then guarded with `not dist.is_initialized()` (NM126). When the worker always starts the
        group itself, the index is `int(os.environ.get("RANK", 0))`. The group is destroyed after the worker
        returns. `nprocs`, `join`,
        `daemon`, `start_method` are dropped (each is a finding on its own line). The finding's note
        gives the launch command: `torchrun --nproc_per_node=<NeuronCores per instance, e.g. 64 on
        trn2.48xlarge> script.py`. `start_method='fork'` is dropped like the others when nothing is shared through
        the fork: the worker is a module-level function that reads no module-level name the program binds to a
        computed object (a constant, the command line or the environment is computed alike in every torchrun
        process) and the file has no `xmp.MpModelWrapper`/`MpSerialExecutor`. Otherwise it is reported, naming
        what is shared: the Neuron runtime cannot be initialised in a forked process (torch_neuronx raises
        "Cannot re-initialize Neuron runtime in forked subprocess"), and fork-based sharing (a model built once
        in the parent, `xmp.MpModelWrapper`) has to be replaced by each process building its own.
    """,
    examples=[
        ("if __name__ == '__main__':\n    xmp.spawn(_mp_fn, args=(flags,))",
         "if __name__ == '__main__':\n    if \"WORLD_SIZE\" in os.environ:  # started by torchrun\n        dist.init_process_group(\"neuron\")\n"
         "    else:  # run without torchrun: a group of one process\n"
         "        dist.init_process_group(\"neuron\", store=dist.HashStore(), rank=0, world_size=1)\n"
         "    _mp_fn(dist.get_rank(), flags)\n"
         "    dist.destroy_process_group()"),
    ],
)
def xmp_spawn(site, ctx):
    what = "xmp.spawn" if site.key in _SPAWN else "torch_xla.launch"
    script = os.path.basename(ctx.analysis.path) if ctx.analysis.path and not ctx.analysis.path.startswith("<") else "script.py"
    note = f"Launch with: torchrun --nproc_per_node=<NeuronCores per instance, e.g. 64 on trn2.48xlarge> {script}"
    if script.endswith(".ipynb"):  # torchrun runs Python files only: in its notebook the code runs as one process
        stem = script[: -len(".ipynb")]
        note = (f"Launch with: torchrun --nproc_per_node=<NeuronCores per instance, e.g. 64 on trn2.48xlarge> {stem}.py, "
                f"after `jupyter nbconvert --to script {script}` (torchrun cannot run a notebook; delete the `!` shell "
                "lines, which the script keeps as get_ipython() calls; run in the notebook, the code is one process)")
    if site.kind == "ref":
        return ctx.finding(site, f"{what} used as a value: start the script with torchrun and call the function with its rank directly", note=note)
    call = site.call
    if has_star_args(call):
        return ctx.finding(site, f"{what} with *args/**kwargs: start the script with torchrun and call fn(rank, *args) directly", note=note)
    fn = kwarg(call, "fn", 0)
    args = kwarg(call, "args", 1)
    method = kwarg(call, "start_method", 5 if what == "xmp.spawn" else 2)
    if fn is None:
        return ctx.finding(site, f"{what} without a function: start the script with torchrun and call fn(rank, *args) directly", note=note)
    forked = const_value(method) == "fork"
    if forked:
        shared = _fork_shared(ctx, call, fn)
        if shared:
            return ctx.finding(site, f"{what} with start_method='fork' shares {shared} with the workers through the fork: "
                                     "the Neuron runtime cannot start in a forked process; launch with torchrun, build it in "
                                     "each process (no MpModelWrapper sharing) and call fn(rank, *args) directly", note=note)
    if not site.is_statement or not alone_on_lines(ctx, site.stmt):
        return ctx.finding(site, f"{what} inside an expression or on a shared line: replace it with a direct fn(rank, *args) call "
                                 "and launch with torchrun", note=note)
    fx = ctx.fixer()
    os_ = fx.ref("os")
    dist = fx.ref(DIST)
    fn_src = atom(ctx, fn) if not isinstance(fn, ast.Lambda) else f"({ctx.src(fn)})"
    owns_group = program(ctx).launch_needs_init(fn.id if isinstance(fn, ast.Name) else None)
    # torch_xla documents the index as the global ordinal for both (launch wraps xmp.spawn's docs); on one host
    # it equals LOCAL_RANK, which torch_xla.launch passed under torchrun
    call_args = [f"{dist}.get_rank()" if owns_group else f'int({os_}.environ.get("RANK", 0))']
    if isinstance(args, (ast.Tuple, ast.List)):
        call_args += [ctx.src(e) for e in args.elts]
    elif args is not None and not is_none(args):
        call_args.append(f"*{atom(ctx, args)}")
    lines = []
    torchrun_branch = torchrun_branch_of(ctx.analysis, site.stmt) if owns_group else None
    if torchrun_branch is not None:
        # the `else:` of the script's own torchrun test (`if os.environ.get("WORLD_SIZE"): ... else: xmp.spawn(...)`):
        # torchrun did not start this process
        lines.append(f'{dist}.init_process_group("neuron", store={dist}.HashStore(), rank=0, world_size=1)')
        if torchrun_branch and not _starts_group(ctx, torchrun_branch):
            # under torchrun the script calls the worker itself, and torch_xla's runtime, not a process group, joined
            # the processes: the rewritten collectives need the group torchrun's variables describe
            first = torchrun_branch[0]
            fx.insert_before(first, f'{dist}.init_process_group("neuron")  # started by torchrun\n')
    elif owns_group:  # the worker's own init (if any) is conditional: every rewritten collective needs a group
        lines += [f'if "WORLD_SIZE" in {os_}.environ:  # started by torchrun',
                  f'    {dist}.init_process_group("neuron")',
                  "else:  # run without torchrun: a group of one process",
                  f'    {dist}.init_process_group("neuron", store={dist}.HashStore(), rank=0, world_size=1)']
    lines.append(f"{fn_src}({', '.join(call_args)})")
    destroys = any(q.endswith("destroy_process_group") for q in ctx.analysis.qualnames)
    if owns_group and not destroys:
        lines.append(f"{dist}.destroy_process_group()")
    else:
        lines += [f"if {dist}.is_initialized():", f"    {dist}.destroy_process_group()"]
    fx.replace(site.stmt, "\n".join(lines) + "\n")
    if what == "xmp.spawn":
        named = [("nprocs", 2), ("join", 3), ("daemon", 4), ("start_method", 5)]
    else:
        named = [("start_method", 2), ("debug_single_process", 3)]
    drops = []
    for name, pos in named:
        node = kwarg(call, name, pos)
        if node is None:
            continue
        for kw in call.keywords:
            if kw.value is node:
                node = kw
        value = node.value if isinstance(node, ast.keyword) else node
        if name == "nprocs" and isinstance(value, ast.Constant) and const_value(value, 0) not in (None, 1):
            note += f" (nprocs={ctx.src(value)} becomes --nproc_per_node={ctx.src(value)})"
        elif name == "nprocs" and not isinstance(value, ast.Constant):
            note += f" (the process count came from `{ctx.src(value)}`: give that number as --nproc_per_node)"
        why = ("nothing is shared through the fork: each torchrun process builds what the worker reads"
               if name == "start_method" and forked else "torchrun decides how processes start")
        drops.append((node, f"{name}={ctx.src(value)} ({why})"))
    return [ctx.finding(site, f"{what}: becomes a direct call of the worker with its global rank; torchrun starts one process "
                              "per NeuronCore" + ("; a process group is started first (torchrun's, else one of a single process)"
                                                  if owns_group else "")
                              + dropped_words(ctx, drops), fix=fx.build(), note=note), *dropped(ctx, site, drops)]


def _starts_group(ctx, stmts) -> bool:
    """Some statement of `stmts` starts the process group itself (`dist.init_process_group(...)`, any backend)."""
    a = ctx.analysis
    return any(isinstance(n, ast.Call) and isinstance(n.func, (ast.Name, ast.Attribute))
               and (a.resolve(n.func, a.module_scope, count_use=False) or "").endswith(".init_process_group")
               for st in stmts for n in walk(st))


_FORK_SHARERS = {f"{XMP}.MpModelWrapper", f"{XMP}.MpSerialExecutor"}


def _fork_shared(ctx, call, fn) -> str:
    """What an `xmp.spawn(fn, ..., start_method="fork")` hands its workers through the fork's memory, in words ("" when
    nothing): an object the file wraps for sharing (MpModelWrapper, MpSerialExecutor), a closure over the spawning
    function's variables, or a module-level name that the worker reads and that the program binds to something it
    computes (not an import, def, class or constant), at module level or in the block that spawns."""
    a = ctx.analysis
    q = a.qualnames
    for sharer in sorted(_FORK_SHARERS):
        if sharer in q:
            return f"an xmp.{sharer.rsplit('.', 1)[1]}"
    if not isinstance(fn, ast.Name):
        return f"`{ctx.src(fn)}`"
    defs = [s for s in a.tree.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name == fn.id]
    if len(defs) > 1 and _at_module_level(a, call):
        # a spawn at module level runs the def above it (a notebook whose cells define the worker again)
        defs = [d for d in defs if d.end_lineno < call.lineno][-1:]
    if not defs:
        return f"`{fn.id}` (not a function defined at module level, maybe a closure)"
    if len(defs) != 1:
        return f"`{fn.id}` (defined more than once at module level: which one runs is not known here)"
    worker = defs[0]
    computed = set()
    for stmt in walk(a.tree):
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)) and stmt is not a.tree:
            continue
        for n in _bound_at_module(stmt, a):
            computed.add(n)
    local = {n.id for n in walk(worker) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    local |= {arg.arg for arg in walk(worker) if isinstance(arg, ast.arg)}
    glob = {name for n in walk(worker) if isinstance(n, ast.Global) for name in n.names}
    read = sorted({n.id for n in walk(worker) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
                   and n.id in computed and (n.id not in local or n.id in glob)})
    return ", ".join(f"`{n}`" for n in read)


def _at_module_level(a, node) -> bool:
    """`node` runs when the module does (under `if`/`with`/`try` blocks, not in a def, class or lambda)."""
    up = a.parent_of.get(node)
    while up is not None and not isinstance(up, ast.Module):
        if isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            return False
        up = a.parent_of.get(up)
    return True


def _bound_at_module(stmt, a):
    """Names a module-level (or `if __name__ == "__main__":`) statement binds to a computed value."""
    if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        value = stmt.value
        if value is None or all(_same_in_every_process(c) for c in walk(value) if isinstance(c, ast.Call)):
            return []  # a constant, or what every process computes alike (its command line, its environment)
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        return [n.id for t in targets for n in walk(t) if isinstance(n, ast.Name)]
    if isinstance(stmt, (ast.For, ast.AsyncFor, ast.With, ast.AsyncWith, ast.NamedExpr)):
        targets = [stmt.target] if isinstance(stmt, (ast.For, ast.AsyncFor, ast.NamedExpr)) else [i.optional_vars for i in stmt.items if i.optional_vars]
        return [n.id for t in targets for n in walk(t) if isinstance(n, ast.Name)]
    return []


_SAME_CALLS = {"parse_args", "parse_known_args", "parse_common_options", "get", "getenv", "int", "float", "str", "bool",
               "dict", "list", "tuple", "set", "len", "range", "getLogger"}


def _same_in_every_process(call) -> bool:
    func = call.func
    return (isinstance(func, ast.Name) and func.id in _SAME_CALLS) or (isinstance(func, ast.Attribute) and func.attr in _SAME_CALLS)


# -- NM128 xmp.MpModelWrapper ----------------------------------------------------------------------
@rule(
    code="NM128",
    name="mp-model-wrapper",
    summary="xmp.MpModelWrapper(model) becomes model",
    fix="safe",
    severity="warning",
    triggers=call_and_ref(f"{XMP}.MpModelWrapper"),
    docs="""
        `xmp.MpModelWrapper(model)` shared one CPU copy of the model between forked device processes;
        `.to(device)` on it returned the model on the device. Under torchrun each process has its own model, and
        `model.to(device)` does the same, so the wrapper is dropped: `xmp.MpModelWrapper(model)` becomes `model`.
        The fork also gave every process the same initial weights, which separately built models do not have
        unless every rank seeds alike before building them (pytorch/xla's mnist-training notebook builds the model
        at module level, before its `torch.manual_seed(1)`): where a worker moves the wrapped model to its device
        (`model = WRAPPED_MODEL.to(device)`), rank 0's parameters and buffers are broadcast right after
        (`for tensor in [*model.parameters(), *model.buffers()]: dist.broadcast(tensor.data, src=0)`, under `if
        dist.is_initialized():` where the process group may not exist); where the wrapped model is used otherwise,
        the finding's note says to do so. In a file that wraps the model in DDP (which broadcasts rank 0's weights)
        nothing is added. Used as a value, it becomes `(lambda model: model)`.
    """,
    examples=[("WRAPPED_MODEL = xmp.MpModelWrapper(net)", "WRAPPED_MODEL = net")],
)
def mp_model_wrapper(site, ctx):
    fx = ctx.fixer()
    if site.kind == "ref":
        fx.replace(site.node, "(lambda model: model)")
        return ctx.finding(site, "xmp.MpModelWrapper used as a value: becomes an identity function", fix=fx.build())
    call = site.call
    model = kwarg(call, "model", 0)
    if model is None or has_star_args(call):
        return ctx.finding(site, "xmp.MpModelWrapper: use the model itself")
    fx.replace(call, atom(ctx, model))
    if wrapped_in_ddp(ctx):
        return ctx.finding(site, "xmp.MpModelWrapper is not needed: each torchrun process owns its model (DDP broadcasts "
                                 "rank 0's weights when it wraps it)", fix=fx.build())
    # the forked workers shared one set of initial weights: each process now builds its own, so rank 0's are
    # broadcast where a worker moves the model to its device (`model = WRAPPED_MODEL.to(device)`)
    moves, missed = _wrapped_moves(ctx, site)
    for stmt, nxt, name, state in moves:
        if state is Group.NONE:
            continue
        t = _free_name(ctx, "tensor")
        loop = (f"for {t} in [*{name}.parameters(), *{name}.buffers()]:  # the weights the fork shared: rank 0's\n"
                f"    {fx.ref(DIST)}.broadcast({t}.data, src=0)")
        if state is not Group.ALWAYS:
            loop = f"if {fx.ref(DIST)}.is_initialized():\n" + "".join(f"    {ln}\n" for ln in loop.split("\n"))
        fx.insert_before(nxt, loop + ("" if loop.endswith("\n") else "\n"))
    note = ("" if not missed else
            "The forked processes shared one set of initial weights; each torchrun process now builds its own: broadcast "
            "rank 0's after moving the model (for t in [*model.parameters(), *model.buffers()]: dist.broadcast(t.data, "
            "src=0)) or wrap it in DDP, unless every rank seeds alike before building it.")
    how = "; rank 0's weights are broadcast where the worker moves the model to its device" if moves and not missed else ""
    return ctx.finding(site, "xmp.MpModelWrapper is not needed: each torchrun process owns its model" + how,
                       fix=fx.build(), note=note)


def _wrapped_moves(ctx, site) -> tuple:
    """([(statement, the statement after it, name, group state)] for each `name = WRAPPED.to(device)` of the name the
    wrapper is assigned to at module level, True when the wrapped model is used otherwise too (or a move is the last
    statement of its block))."""
    a = ctx.analysis
    assign = site.stmt
    if not (isinstance(assign, ast.Assign) and assign.value is site.call and len(assign.targets) == 1
            and isinstance(assign.targets[0], ast.Name) and a.parent_of.get(assign) is a.tree):
        return [], True
    wrapped = assign.targets[0].id
    facts = program(ctx)
    moves, missed = [], False
    for n in walk(a.tree):
        if not (isinstance(n, ast.Name) and n.id == wrapped) or n is assign.targets[0]:
            continue
        attr = a.parent_of.get(n)
        call = a.parent_of.get(attr)
        stmt = a.parent_of.get(call)
        if not (isinstance(attr, ast.Attribute) and attr.attr == "to" and isinstance(call, ast.Call) and call.func is attr
                and isinstance(stmt, ast.Assign) and stmt.value is call and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Name)):
            missed = True
            continue
        block = next((b for b in _blocks_of(a.parent_of.get(stmt)) if stmt in b), None)
        i = block.index(stmt) if block is not None else -1
        if block is None or i + 1 >= len(block):
            missed = True
            continue
        moves.append((stmt, block[i + 1], stmt.targets[0].id, facts.group_at(stmt)))
    return moves, missed or not moves


def _blocks_of(node):
    if node is None:
        return []
    return [b for b in (getattr(node, f, None) for f in ("body", "orelse", "finalbody")) if isinstance(b, list)]


# -- NM129 xmp.MpSerialExecutor --------------------------------------------------------------------
@rule(
    code="NM129",
    name="mp-serial-executor",
    summary="xmp.MpSerialExecutor() becomes _neuron_serial_executor(): .run(fn) runs fn on one local process at a time",
    fix="safe",
    severity="warning",
    triggers=call_and_ref(f"{XMP}.MpSerialExecutor"),
    docs="""
        `xmp.MpSerialExecutor().run(fn)` ran `fn` in the processes of a host one after the other (typically a
        dataset download that must not run concurrently) and returned its result in each. It becomes
        `_neuron_serial_executor()`, an inserted helper whose `.run(fn)` lets each local rank (LOCAL_RANK) run `fn`
        in turn, separated by barriers. Every process must call `.run` the same number of times, as before.

        When `X = xmp.MpSerialExecutor()` is only used as `X.run(fn)` (the usual module-level `SERIAL_EXEC`), the
        assignment goes and each `X.run(fn)` becomes `fn()` in a single-device program; after an init that always
        runs, `result = X.run(fn)` becomes a loop over LOCAL_WORLD_SIZE turns in which the process whose local rank
        has the turn calls `result = fn()`, with `dist.barrier()` after each turn; elsewhere
        `_neuron_run_serially(fn)`. This keeps module-level code from calling a helper that is defined further
        down the file.
    """,
    examples=[("SERIAL_EXEC = xmp.MpSerialExecutor()", "SERIAL_EXEC = _neuron_serial_executor()")],
)
def mp_serial_executor(site, ctx):
    if site.kind == "call" and (site.call.args or site.call.keywords):
        return ctx.finding(site, "xmp.MpSerialExecutor with arguments: run fn on each local rank in turn with dist.barrier() between")
    runs = _serial_runs(ctx, site) if site.kind == "call" else None
    if runs is None:
        return replace_callee(site, ctx, "_neuron_serial_executor", "xmp.MpSerialExecutor: becomes _neuron_serial_executor (turns by local rank)")
    fx = ctx.fixer()
    facts = program(ctx)
    fx.delete(site.stmt)
    direct = 0
    for run in runs:
        fn = run.args[0]
        state = facts.group_at(run)
        stmt = _stmt_of(ctx.analysis, run)
        if state is Group.NONE:
            fx.replace(run, f"{atom(ctx, fn)}()")
            direct += 1
        elif state is Group.ALWAYS and alone_on_lines(ctx, stmt) and (
                isinstance(stmt, ast.Expr) and stmt.value is run
                or isinstance(stmt, ast.Assign) and stmt.value is run and all(simple_ref(t) for t in stmt.targets)):
            # each process of this host in turn, a barrier between turns: what the executor did, written out
            dist, os_ = fx.ref(DIST, site.scope), fx.ref("os", site.scope)
            call = ctx.src(stmt)[: run.col_offset - stmt.col_offset] + f"{atom(ctx, fn)}()"
            fx.replace(stmt, f'for turn in range(int({os_}.environ.get("LOCAL_WORLD_SIZE", 1))):  # one process of this host at a time\n'
                             f"    if {dist}.get_node_local_rank(fallback_rank=0) == turn:\n"
                             f"        {call}\n"
                             f"    {dist}.barrier()\n")
        else:
            fx.replace(run, f"{fx.helper('_neuron_run_serially')}({ctx.src(fn)})")
    how = "a direct call fn() (single-device program)" if direct == len(runs) else "fn() run by each local rank in turn"
    name = site.stmt.targets[0].id
    return ctx.finding(site, f"xmp.MpSerialExecutor: the executor `{name}` goes and each {name}.run(fn) becomes {how}", fix=fx.build())


def _serial_runs(ctx, site):
    """The `X.run(fn)` calls of `X = xmp.MpSerialExecutor()` when they are all the file does with X, else None.

    Rewriting the uses instead of the construction keeps module-level code free of inserted helpers, which are only
    defined further down the file (issue: inserted code used before it is defined)."""
    stmt = site.stmt
    if not (isinstance(stmt, ast.Assign) and stmt.value is site.call and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name) and alone_on_lines(ctx, stmt)):
        return None
    name = stmt.targets[0].id
    runs = []
    for node in walk(ctx.analysis.tree):
        if isinstance(node, ast.Global) and name in node.names:
            return None
        if not (isinstance(node, ast.Name) and node.id == name) or node is stmt.targets[0]:
            continue
        attr = ctx.analysis.parent_of.get(node)
        call = ctx.analysis.parent_of.get(attr)
        if not (isinstance(node.ctx, ast.Load) and isinstance(attr, ast.Attribute) and attr.attr == "run"
                and isinstance(call, ast.Call) and call.func is attr and len(call.args) == 1 and not call.keywords
                and not isinstance(call.args[0], ast.Starred)):
            return None
        runs.append(call)
    return runs or None
