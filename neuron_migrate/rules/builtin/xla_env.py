"""torch_xla / PJRT / XLA-era Neuron environment variables set or read in code (NM137, NM138).

The table below says what each variable becomes on TorchNeuron:
- remove: only the XLA runtime read it; setting it is dead code (deleted), reading it is reported;
- numerics: changes dtypes under XLA; never deleted silently (training would switch from bf16 to fp32);
- dead: set by XLA-only tools (neuron_parallel_compile); reads are always false now;
- launch: process topology, now given by torchrun;
- other: has a different native counterpart, reported with it.
"""
from __future__ import annotations

import ast

from neuron_migrate.names.analysis import walk
from neuron_migrate.rules.api import rule

ENV_DOC = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/frameworks/torch/torch-neuronx/api-reference-guide/training/torch-neuron-envvars.html"
BF16_DOC = "https://github.com/aws-neuron/aws-neuron-sdk/blob/master/archive/appnotes/torch-neuronx/migration-from-xla-downcast-bf16.rst"

_BF16 = ("under XLA it made float tensors bfloat16 on the device; deleting it switches training to float32: "
         "cast the model with model.to(torch.bfloat16) (set NEURON_RT_STOCHASTIC_ROUNDING_EN=1 for the old stochastic rounding) "
         "or wrap the forward pass in torch.autocast(\"neuron\", dtype=torch.bfloat16), then delete the variable")

# variable -> (kind, extra advice)
ENV_VARS: dict[str, tuple[str, str]] = {
    **{v: ("remove", "") for v in (
        "PJRT_SELECT_DEFAULT_DEVICE", "PJRT_LOCAL_PROCESS_RANK", "PJRT_LOCAL_PROCESS_COUNT", "PJRT_DIST_SERVICE_ADDR",
        "PJRT_DYNAMIC_PLUGINS", "PJRT_CPU_ASYNC_CLIENT", "XLA_FLAGS", "LIBTPU_INIT_ARGS", "CPU_NUM_DEVICES",
        "XLA_SAVE_TENSORS_FILE", "XLA_SAVE_TENSORS_FMT", "XLA_METRICS_FILE", "XLA_SAVE_HLO_FILE", "XLA_DUMP_HLO_GRAPH",
        "XLA_DUMP_POST_OPTIMIZATIONS", "XLA_FNTRACKER_FILE", "XLA_EMIT_STEPLOG", "XLA_DISABLE_FUNCTIONALIZATION",
        "XLA_ENABLE_PARAM_ALIASING", "XLA_TRANSFER_SEED_ASYNC", "XLA_NO_SPECIAL_SCALARS", "XLA_USE_EAGER_DEBUG_MODE",
        "XLA_USE_DUMMY_STORE", "XLA_REGISTER_INSTALLED_PLUGINS", "NEURON_LIBRARY_PATH",
        "NEURON_FRAMEWORK_DEBUG", "NEURON_DUMP_HLO_SNAPSHOT", "NEURON_TRANSFER_WITH_STATIC_RING_OPS",
        "NEURON_TRANSFER_ALL_PARAMETERS_WITH_STATIC_RING", "NEURON_FUSE_SOFTMAX", "NEURON_CUSTOM_SILU",
        "NEURON_NUM_RECENT_MODELS_TO_KEEP", "NEURON_PARALLEL_COMPILE_MAX_RETRIES",
        "NEURON_IGNORE_TRAINING_SCRIPT_ERROR_AND_COMPILE", "XRT_TPU_CONFIG",
    )},
    "PJRT_DEVICE": ("remove", "the device is chosen in code now (torch.device(\"neuron\")); test torch.neuron.is_available() instead of reading it"),
    "XLA_IR_DEBUG": ("remove", "for Python stack traces in TorchNeuron errors set TORCH_NEURONX_ENABLE_STACK_TRACE=1"),
    "XLA_HLO_DEBUG": ("remove", "for Python stack traces in TorchNeuron errors set TORCH_NEURONX_ENABLE_STACK_TRACE=1"),
    "PT_XLA_DEBUG": ("remove", "TorchNeuron debug output: TORCH_NEURONX_LOG_LEVEL, TORCH_NEURONX_DEBUG_DIR"),
    "PT_XLA_DEBUG_LEVEL": ("remove", "TorchNeuron debug output: TORCH_NEURONX_LOG_LEVEL, TORCH_NEURONX_DEBUG_DIR"),
    "PT_XLA_DEBUG_FILE": ("remove", "TorchNeuron debug output: TORCH_NEURONX_LOG_LEVEL, TORCH_NEURONX_DEBUG_DIR"),
    "XLA_SYNC_WAIT": ("remove", "to make every device op synchronous set NEURON_LAUNCH_BLOCKING=1"),
    "XLA_USE_BF16": ("numerics", _BF16),
    "XLA_DOWNCAST_BF16": ("numerics", _BF16.replace("float tensors bfloat16", "float tensors bfloat16 (and double float32)")),
    "XLA_USE_FP16": ("numerics", _BF16.replace("bfloat16", "float16")),
    "XLA_DOWNCAST_FP16": ("numerics", _BF16.replace("bfloat16", "float16")),
    # torch_xla 2.9's xm.all_reduce returns a copy in one replica unless it is set; the rewritten all_reduce (NM117)
    # keeps that default, so with it a one-process run that relied on the reduction's scale computes otherwise
    "XLA_ALWAYS_ALLREDUCE": ("numerics", "under XLA it made xm.all_reduce reduce and apply its scale in a single replica "
                             "too; the rewritten all_reduce returns the input unchanged in one process, as torch_xla did "
                             "without it: where a one-process run relied on the scale, apply it by hand, then delete the "
                             "variable"),
    "XLA_USE_32BIT_LONG": ("numerics", "under XLA it made int64 tensors int32 on the device; use int32 tensors explicitly where it matters, then delete the variable"),
    "XLA_USE_SPMD": ("other", "XLA SPMD has no switch on TorchNeuron: shard with DTensor on init_device_mesh(\"neuron\", ...)"),
    "NEURON_EXTRACT_GRAPHS_ONLY": ("dead", "neuron_parallel_compile does not exist for TorchNeuron, so the variable is never set: simplify the condition as if it were unset (warm the compile cache by running once)"),
    "NEURONCORE_NUM_DEVICES": ("launch", "launch one process per NeuronCore with torchrun --nproc_per_node=N; read the count from LOCAL_WORLD_SIZE or torch.distributed.get_world_size()"),
    "ALLREDUCE_GRADIENTS_BUCKET_SIZE_MB": ("other", "gradient bucketing is DDP's bucket_cap_mb= argument now"),
    "TPU_NUM_DEVICES": ("remove", ""),
    # pytorch/xla's colab notebooks open with `assert os.environ['COLAB_TPU_ADDR'], 'Make sure to select TPU ...'`
    "COLAB_TPU_ADDR": ("remove", "Colab's TPU address is never set on a Trainium host: delete the check that a TPU is "
                                 "attached (torch.neuron.is_available() tests for the device)"),
}
_PREFIXES = {"XRT_": ("remove", ""), "TPU_": ("remove", ""), "NEURON_PJRT_": ("remove", "")}


def env_kind(name: str) -> tuple[str, str] | None:
    if name in ENV_VARS:
        return ENV_VARS[name]
    for p, v in _PREFIXES.items():
        if name.startswith(p) and name[len(p):].replace("_", "").isalnum() and name.isupper():
            return v
    return None


_TRIGGERS = [("string", v) for v in ENV_VARS] + [("string", p + "*") for p in _PREFIXES]


def _env_use(site, ctx) -> tuple[str, ast.AST] | None:
    """How the string is used as an environment variable name: (form, statement-or-node) or None.

    forms: set (os.environ[k] = v), setdefault, putenv, pop, del (statements); dict (a key of a dict literal,
    e.g. an env= mapping or os.environ.update); read (os.environ[k], .get, os.getenv, `k in os.environ`).
    """
    a = ctx.analysis
    node, parent = site.node, site.parent

    def is_environ(expr) -> bool:
        return a.resolve(expr, site.scope, count_use=False) == "os.environ"

    if isinstance(parent, ast.Subscript) and parent.slice is node and is_environ(parent.value):
        holder = a.parent_of.get(parent)
        if isinstance(parent.ctx, ast.Store):
            if isinstance(holder, ast.Assign) and holder.targets == [parent]:
                return "set", holder
            return "set-other", holder
        if isinstance(parent.ctx, ast.Del):
            return ("del", holder) if isinstance(holder, ast.Delete) and holder.targets == [parent] else ("set-other", holder)
        return "read", parent
    if isinstance(parent, ast.Call) and parent.args and parent.args[0] is node:
        q = a.resolve(parent.func, site.scope, count_use=False)
        stmt = a.parent_of.get(parent)
        statement = isinstance(stmt, ast.Expr)
        if q in ("os.environ.get", "os.getenv", "os.environ.__getitem__"):
            return "read", parent
        if q in ("os.environ.setdefault", "os.putenv", "os.environ.pop", "os.unsetenv"):
            form = {"os.environ.setdefault": "setdefault", "os.putenv": "putenv", "os.environ.pop": "pop", "os.unsetenv": "pop"}[q]
            if q == "os.environ.setdefault" and not statement:
                return "read", parent  # its value (the current setting) is used
            return (form, stmt) if statement else ("set-other", parent)
        return None
    if isinstance(parent, ast.Compare) and parent.left is node and len(parent.ops) == 1 and isinstance(parent.ops[0], (ast.In, ast.NotIn)) \
            and is_environ(parent.comparators[0]):
        return "read", parent
    if isinstance(parent, ast.Dict) and node in parent.keys:
        return "dict", parent
    return None


def _reads_in_file(ctx) -> set:
    """Variable names this file reads (cached on the analysis)."""
    cached = getattr(ctx.analysis, "_nm_env_reads", None)
    if cached is not None:
        return cached
    reads = set()
    for site in ctx.analysis.sites:
        if site.kind == "string" and env_kind(site.key):
            use = _env_use(site, ctx)
            if use and use[0] == "read":
                reads.add(site.key)
    ctx.analysis._nm_env_reads = reads
    return reads


def _has_effects(node) -> bool:
    return node is not None and any(isinstance(n, (ast.Call, ast.Await, ast.NamedExpr, ast.Yield, ast.YieldFrom)) for n in walk(node))


@rule(
    code="NM137",
    name="xla-env-set",
    summary="XLA/PJRT environment variables set in code: dead ones are removed, numeric ones need a replacement",
    fix="safe",
    severity="warning",
    triggers=_TRIGGERS,
    docs=f"""
        Scripts configure torch_xla through environment variables set in code (`os.environ["PJRT_DEVICE"] = "NEURON"`,
        `os.environ.setdefault("XLA_IR_DEBUG", "1")`, `os.putenv(...)`, env dicts passed to subprocesses).
        TorchNeuron reads none of them (legacy list: {ENV_DOC}). The statement setting a variable that only the
        XLA runtime read (PJRT_*, XLA_IR_DEBUG/XLA_HLO_DEBUG, XLA_FLAGS, TPU_*, XRT_*, NEURON_PJRT_*, debug dumps...)
        is removed, unless the file also reads the variable or the value has side effects; `PJRT_DEVICE` set to
        something other than `NEURON` (e.g. `CPU` in tests) is reported, since it chose the backend. Each removed
        statement is named, with its line, in the rewrite's notes. Variables of the `NEURON_` namespace
        (`NEURON_FUSE_SOFTMAX`, `NEURON_FRAMEWORK_DEBUG`, ...) are kept and reported instead of deleted: that
        namespace is shared with the native runtime and compiler, so the tool does not guess that they are dead.
        `XLA_USE_BF16`, `XLA_DOWNCAST_BF16`, `XLA_USE_FP16` change numerics: deleting them silently would move
        training from bf16 to fp32, so they are reported with the replacement (`model.to(torch.bfloat16)` or
        `torch.autocast("neuron", dtype=torch.bfloat16)`; {BF16_DOC}). `XLA_ALWAYS_ALLREDUCE` made xm.all_reduce
        reduce (and scale) in a single replica too; the rewritten all_reduce keeps torch_xla's default (a copy in
        one process), so the variable is reported, not removed. `NEURONCORE_NUM_DEVICES` becomes
        `torchrun --nproc_per_node`. Keys in dict literals are reported.
    """,
    examples=[('os.environ["PJRT_DEVICE"] = "NEURON"\nos.environ["XLA_USE_BF16"] = "1"', 'os.environ["XLA_USE_BF16"] = "1"')],
)
def xla_env_set(site, ctx):
    kind = env_kind(site.key)
    use = _env_use(site, ctx)
    if kind is None or use is None or use[0] == "read":
        return None
    form, where = use
    var = site.key
    kind, advice = kind
    advice = f"; {advice}" if advice else ""
    if kind != "remove":
        return ctx.finding(site, f"{var} is set here: {'it is not used by TorchNeuron' if kind == 'dead' else 'TorchNeuron ignores it'}{advice}")
    if form == "dict":
        return ctx.finding(site, f"{var} in an environment mapping: TorchNeuron ignores it; remove the entry{advice}")
    if form == "set-other":
        return ctx.finding(site, f"{var} is set here: TorchNeuron ignores it; remove the assignment{advice}")
    value = None
    if form == "set":
        value = where.value
    elif form in ("setdefault", "putenv") and len(where.value.args) > 1:
        value = where.value.args[1]
    if var == "PJRT_DEVICE" and form in ("set", "setdefault", "putenv") and not (isinstance(value, ast.Constant) and value.value == "NEURON"):
        return ctx.finding(site, f"PJRT_DEVICE={ctx.src(value) if value is not None else '?'} chose the XLA backend: pick the device in code "
                                 "(torch.device(\"neuron\") or \"cpu\") and remove the assignment")
    if _has_effects(value) or (form != "set" and _has_effects(where.value.args[2] if form == "pop" and len(where.value.args) > 2 else None)):
        return ctx.finding(site, f"{var} is set here: TorchNeuron ignores it; remove the assignment (keep any side effect of its value){advice}")
    if var in _reads_in_file(ctx):
        return ctx.finding(site, f"{var} is set here and read elsewhere in this file: TorchNeuron ignores it; remove both together{advice}")
    if var.startswith("NEURON_") and not var.startswith("NEURON_PJRT_"):
        # the Neuron namespace is shared with the native stack (NEURON_RT_*, NEURON_CC_FLAGS): keep, do not guess
        return ctx.finding(site, f"{var} was a setting of the XLA-based Neuron stack; TorchNeuron documents no use of it: "
                                 f"kept, delete it once you have checked{advice}")
    fx = ctx.fixer()
    fx.delete(where)
    return ctx.finding(site, f"{var} only configured torch_xla: the assignment is removed{advice}", fix=fx.build(),
                       note=f"removed `{ctx.src(where).strip()}` (only torch_xla read {var})")


@rule(
    code="NM138",
    name="xla-env-read",
    summary="XLA/PJRT environment variables read in code are never set on TorchNeuron",
    fix="none",
    severity="warning",
    triggers=_TRIGGERS,
    docs=f"""
        Code that reads an XLA-era variable (`os.environ.get("PJRT_DEVICE") == "NEURON"` as a device check,
        `if os.environ.get("XLA_USE_BF16"):` to pick a dtype, `if not os.environ.get("NEURON_EXTRACT_GRAPHS_ONLY"):`
        around evaluation) now always sees it unset unless a launch script still exports it. Each read is
        reported with what replaces it: `torch.neuron.is_available()` for the device, the dtype chosen in
        code for the bf16 switches, and a condition simplified as if unset for `NEURON_EXTRACT_GRAPHS_ONLY`
        (neuron_parallel_compile is XLA-only; {ENV_DOC}).
    """,
    examples=[('if os.environ.get("NEURON_EXTRACT_GRAPHS_ONLY"):\n    pass', None)],
)
def xla_env_read(site, ctx):
    kind = env_kind(site.key)
    use = _env_use(site, ctx)
    if kind is None or use is None or use[0] != "read":
        return None
    kind, advice = kind
    if kind == "numerics":
        advice = "decide the dtype in code (model.to(torch.bfloat16) or torch.autocast(\"neuron\", dtype=torch.bfloat16)) instead of reading the XLA switch"
    elif kind == "remove" and not advice:
        advice = "it is never set on TorchNeuron: simplify the code as if it were unset"
    return ctx.finding(site, f"{site.key} is read here: {advice}")
