"""TorchNeuron compatibility: unsupported namespaces, 64-bit dtypes, host-fallback ops (NM301-NM311).

Ops are looked up in the compatibility table (`neuron_migrate.table`), chosen with `--table` through
`ctx.settings.table_path`. The table is loaded lazily: a file without a torch call or a method call never
loads it.
"""
from __future__ import annotations

import ast

from neuron_migrate.names.analysis import walk
from neuron_migrate.rules.api import kwarg, rule

TYPE_CHECKING = False  # typing is not imported at run time (start-up): it serves annotations only
if TYPE_CHECKING:
    from typing import Optional

RN = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/release-notes/components/torchneuron.html"
COMPILE_REF = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/torch/compile/reference-torch-compile.html"
PRERELEASE = "https://github.com/parmoham-aws/test-repo-parmoham/blob/98154b867aa24562a3213e520d9ad7fd41032291/torch_neuronx"

# -- the table, loaded once per process and only when a site needs it --------------------------------------
_STATUS_CACHE: dict = {}


def table_for(ctx):
    from neuron_migrate.table import TableError, load_table

    try:
        return load_table(getattr(ctx.settings, "table_path", None))
    except TableError:
        return None


def api_status(ctx, qualname: str):
    """(Status, entries) for a Python API, or None when the table cannot be read."""
    key = (getattr(ctx.settings, "table_path", None), qualname)
    if key not in _STATUS_CACHE:
        table = table_for(ctx)
        _STATUS_CACHE[key] = table.worst_status_for_api(qualname) if table is not None else None
    return _STATUS_CACHE[key]


def fact(ctx, qualname: str):
    """The table's Verdict for a Python API or namespace member (what the probe reports for it too), or None."""
    key = (getattr(ctx.settings, "table_path", None), "verdict", qualname)
    if key not in _STATUS_CACHE:
        table = table_for(ctx)
        _STATUS_CACHE[key] = table.classify_api(qualname) if table is not None else None
    return _STATUS_CACHE[key]


def sourced(v) -> dict:
    """ctx.finding keyword arguments carrying a verdict's confidence and source id."""
    if v is None or v.status.value == "unknown" and not v.source_id:
        return {}
    return {"confidence": v.confidence or "", "source": v.source_id or ""}


def in_compare(site) -> bool:
    """The name is only tested (`x.dtype == torch.float64`, `dtype in (...)`), not used to create data."""
    for anc in site.ancestors():
        if isinstance(anc, ast.Compare):
            return True
        if isinstance(anc, ast.stmt):
            return False
    return False


def enclosing_call(site) -> Optional[ast.Call]:
    parent = site.parent
    if isinstance(parent, ast.keyword):
        parent = site.analysis.parent_of.get(parent)
    return parent if isinstance(parent, ast.Call) else None


# ===================================================================================== namespaces
_NAMESPACES = {
    "torch.sparse": "sparse tensors (torch.sparse and the sparse layouts) are not supported: keep the tensor dense "
                    "(`.to_dense()`), or do the sparse step on CPU",
    "torch.func": "torch.func (vmap, grad, jacrev, functional_call) is not supported: write the batched/explicit "
                  "form (a loop or a batched op, torch.autograd.grad)",
    "torch.vmap": "torch.vmap is torch.func.vmap, which is not supported: write the batched op or a loop",
    "torch.nested": "nested/jagged tensors are not supported: pad to a dense tensor with a mask",
    "torch.distributions": "torch.distributions is not supported: sample on CPU and move the result with `.to(device)`, "
                           "or write the sampling/log-prob with plain tensor ops",
    "torchao.prototype.mx_formats": "MXFP8 (torchao mx_formats) is not supported: train in bfloat16",
    "torchao": "TorchAO is not supported: drop the quantization/float8 conversion and run in bfloat16",
}


def _namespace_of(key: str) -> Optional[str]:
    best = None
    for ns in _NAMESPACES:
        if key == ns or key.startswith(ns + ".") or (ns == "torch.sparse" and key.startswith("torch.sparse_")):
            if best is None or len(ns) > len(best):
                best = ns
    return best


@rule(
    code="NM301",
    name="unsupported-namespace",
    summary="torch.sparse, torch.func, torch.nested, torch.distributions, TorchAO and MXFP8 are not supported on TorchNeuron",
    fix="none",
    severity="error",
    triggers=[(k, p) for p in ("torch.sparse*", "torch.func*", "torch.nested*", "torch.distributions*", "torchao*")
              for k in ("call", "ref")]
             + [("call", "torch.vmap"), ("ref", "torch.vmap"), ("method", "to_sparse"), ("method", "to_sparse_csr"),
                ("method", "to_sparse_csc"), ("method", "to_sparse_coo"), ("method", "to_sparse_bsr")],
    trigger_words=("sparse", "torch.func", "vmap", "nested", "distributions", "torchao"),
    docs=f"""
        The Neuron 2.33 TorchNeuron release notes list these as not supported: `torch.sparse` (sparse tensors and
        layouts such as `torch.sparse_coo`/`torch.sparse_csr`, `Tensor.to_sparse()`), `torch.func` (`vmap`, `grad`,
        `jacrev`, `functional_call`; `torch.vmap` is the same thing), `torch.nested`, `torch.distributions`, TorchAO,
        and MXFP8. Every use is reported where it happens (calls, references such as a `layout=` argument, methods),
        with what to write instead: dense tensors with masks, explicit batching, sampling on CPU, bfloat16
        instead of low-precision formats. These statements are known from coverage of the release notes, not read
        on the page, so findings carry medium confidence (`audit --min-confidence high` hides them). Source: {RN}
    """,
    examples=[("y = torch.sparse.mm(a, b)",), ("d = torch.distributions.Normal(mu, sigma)",), ("x = x.to_sparse()",)],
)
def unsupported_namespace(site, ctx):
    if site.kind == "method":
        v = fact(ctx, f"Tensor.{site.key}")
        if v is None or v.status.value != "unsupported":
            v = fact(ctx, "torch.sparse")
        if v is not None and v.status.value == "native":
            return None
        return ctx.finding(site, f"`.{site.key}()` makes a sparse tensor, which TorchNeuron does not support: "
                                 "keep the tensor dense", **sourced(v))
    if site.key.startswith("torch.functional"):
        return None
    ns = _namespace_of(site.key)
    if ns is None:
        return None
    if site.kind == "ref" and in_compare(site):
        return None
    # the same verdict the probe gives for this namespace (a table that rates it native silences the rule)
    v = fact(ctx, site.key)
    if v is not None and v.status.value == "native":
        return None
    return ctx.finding(site, f"`{site.key}`: {_NAMESPACES[ns]} (not supported on TorchNeuron)", **sourced(v))


# ===================================================================================== torch.fft
@rule(
    code="NM302",
    name="fft-transform",
    summary="only some torch.fft transforms run on Neuron: check this one on a device or move it to CPU",
    fix="none",
    severity="warning",
    triggers=[("call", "torch.fft*"), ("ref", "torch.fft*")],
    trigger_words=("fft",),
    docs=f"""
        The 2.33 release notes say only some `torch.fft` transforms run on Neuron, without a list in the text
        available to this tool; the compatibility table marks each transform `partial` until a device run says
        otherwise (`neuron-migrate probe`, or `neuron-migrate table build` against the released wheel). FFTs are
        complex-valued: 2.33 decomposes complex ops before lowering by default (`TORCH_NEURONX_COMPLEX_DECOMPOSE`,
        on for torch >= 2.13), and on a beta without it an eager `irfft` raised "complex dtypes are not supported
        natively on Neuron" instead of falling back to the CPU. Check the transform on a device,
        or compute it on CPU deliberately (`torch.fft.rfft(x.cpu()).to(x.device)`). Source: {RN}
    """,
    examples=[("spec = torch.fft.rfft(signal)",)],
)
def fft_transform(site, ctx):
    if site.key == "torch.fft":
        return None
    v = fact(ctx, site.key)
    if v is not None and v.status.value == "native":
        return None
    return ctx.finding(site, f"`{site.key}`: only some torch.fft transforms run on Neuron; run it once on a device "
                             "(neuron-migrate probe) or compute it on CPU with `.cpu()` and move the result back",
                       note=(v.note if v is not None else ""), **sourced(v))


# ===================================================================================== float8 / _scaled_mm
_FLOAT8 = ("torch.float8_e4m3fn", "torch.float8_e5m2", "torch.float8_e4m3fnuz", "torch.float8_e5m2fnuz", "torch.float8_e8m0fnu")


@rule(
    code="NM303",
    name="float8-scaled-mm",
    summary="FP8 (`torch._scaled_mm`, float8 dtypes) has no Neuron kernel: it runs on the host or not at all",
    fix="none",
    severity="warning",
    triggers=[("call", "torch._scaled_mm"), ("ref", "torch._scaled_mm")] + [("ref", d) for d in _FLOAT8],
    trigger_words=("_scaled_mm", "float8"),
    docs=f"""
        TorchNeuron 2.33 has no MXFP8 and no TorchAO (release notes), and `aten::_scaled_mm` has no Neuron kernel in
        the compatibility table (beta reports saw it run on the host). FP8 training recipes written for H100-class
        GPUs (`torch._scaled_mm` with float8 dtypes) therefore lose their point on Neuron. Use bfloat16 matmuls
        (`torch.autocast("neuron", dtype=torch.bfloat16)`). `torch._scaled_grouped_mm` is different: it is a
        documented native MoE op and is not reported. Source: {RN}
    """,
    examples=[("out = torch._scaled_mm(a, b, scale_a=sa, scale_b=sb)",), ("w8 = w.to(torch.float8_e4m3fn)",)],
)
def float8_scaled_mm(site, ctx):
    if site.kind == "ref" and in_compare(site):
        return None
    if site.key.endswith("_scaled_mm"):
        return ctx.finding(site, "torch._scaled_mm (FP8 matmul) has no Neuron kernel and runs on the host: use a bfloat16 "
                                 "matmul under torch.autocast('neuron', dtype=torch.bfloat16)",
                           **sourced(fact(ctx, "torch._scaled_mm")))
    return ctx.finding(site, f"`{site.key}`: FP8 formats are not supported on TorchNeuron 2.33: use torch.bfloat16",
                       **sourced(fact(ctx, "torchao.prototype.mx_formats")))


# ===================================================================================== float64
_F64 = {"torch.float64": "torch.float32", "torch.double": "torch.float32", "torch.complex128": "torch.complex64",
        "torch.cdouble": "torch.complex64"}


@rule(
    code="NM304",
    name="float64",
    summary="float64 (`torch.float64`, `torch.double`, `.double()`) executes as float32 on Neuron",
    fix="unsafe",
    severity="warning",
    triggers=[("ref", k) for k in _F64] + [("method", "double")],
    trigger_words=("float64", "double", "complex128"),
    docs=f"""
        The Neuron 2.33 release notes: float64 executes as float32 with a warning. Code that asks for double
        precision (`dtype=torch.float64`, `torch.double`, `.double()`, `torch.set_default_dtype(torch.float64)`,
        complex128) gets float32 arithmetic, silently losing the precision it asked for while still storing 64-bit
        tensors (twice the memory, extra casts). Write float32 (or bfloat16 under autocast) explicitly; when an
        algorithm really needs float64, run that part on CPU (`x.cpu().double()`). The fix (unsafe: numerics change
        where the code also runs on CPU/GPU) replaces the dtype with `torch.float32` (`torch.complex64`) and
        `.double()` with `.float()`. Dtype tests (`x.dtype == torch.float64`) are not reported. The fix applies only
        where the tensor is on, or goes to, the device (`neuron_migrate.program.device_flow`: `.to(device)`,
        `device=device`, a name moved to the device); float64 on the host (after `.cpu()`, `device="cpu"`, a float64
        reference to check a device kernel) computes in float64 and is not reported; where the tool cannot tell, it
        is reported without a fix. A `from torch import float64` whose every use is fixed is removed. Source: {RN}
    """,
    examples=[("x = torch.zeros(3, dtype=torch.float64, device=device)", "x = torch.zeros(3, dtype=torch.float32, device=device)"),
              ("y = x.double().to(device)", "y = x.float().to(device)")],
)
def float64(site, ctx):
    from neuron_migrate.program import device_flow

    flow = device_flow.facts(ctx.analysis)
    if site.kind == "method":
        call = site.call
        if call.args or call.keywords:
            return None
        where = _float64_where(flow, call.func.value, call)
        if where == "cpu":
            return None  # a float64 reference on the host: runs in float64 there
        msg = "`.double()` gives float64, which executes as float32 on Neuron: use `.float()` (or do the float64 part on CPU)"
        if where != "device":
            return ctx.finding(site, msg + "; not rewritten: this value is not seen to reach the device",
                               **sourced(fact(ctx, "torch.float64")))
        fx = ctx.fixer()
        fx.replace(call, f"{ctx.src_relative(call.func.value)}.float()")
        return ctx.finding(site, msg, fix=fx.build(), **sourced(fact(ctx, "torch.float64")))
    if in_compare(site):
        return None
    call = enclosing_call(site)
    callee = ctx.analysis.resolve(call.func, site.scope, count_use=False) if call is not None else None
    if callee in ("torch.finfo", "torch.iinfo"):
        return None
    target = _F64[site.key]
    what = site.key
    if callee == "torch.set_default_dtype":
        where = "device" if flow.touches_device else "unknown"
        msg = (f"torch.set_default_dtype({what}) makes every new float tensor float64, which executes as float32 on "
               f"Neuron: keep the default (float32)")
    else:
        where = _dtype_call_where(flow, call, site) if call is not None else "unknown"
        msg = f"`{what}` executes as float32 on Neuron (with a warning): use `{target}`, or compute this part on CPU"
    if where == "cpu":
        return None
    if where != "device":
        return ctx.finding(site, msg + "; not rewritten: this value is not seen to reach the device",
                               **sourced(fact(ctx, "torch.float64")))
    fix = _float64_fix(site, ctx, flow, target)
    return ctx.finding(site, msg, fix=fix, **sourced(fact(ctx, "torch.float64")))


def _float64_where(flow, receiver, call) -> str:
    """'device' when the tensor is on, or goes to, the device; 'cpu' when it stays on the host; else 'unknown'."""
    fate = flow.fate(call)
    if fate == "device":
        return "device"
    place = flow.placement(receiver)
    if place == "device":
        return "device"
    return "cpu" if "cpu" in (place, fate) else "unknown"


def _dtype_call_where(flow, call, site) -> str:
    """Placement of the tensor made or converted by the call that takes the float64 dtype."""
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr in ("to", "type"):
        target = kwarg(call, "device")
        if target is None and call.args and call.args[0] is not site.node:
            target = call.args[0]
        if target is not None:
            v = flow.is_device_value(target, flow.function_of(call))
            if v:
                return "device"
            if v is False:
                return "cpu"
        return _float64_where(flow, func.value, call)
    dev = kwarg(call, "device")
    if dev is not None:
        v = flow.is_device_value(dev, flow.function_of(call))
        if v is False:
            return "cpu"
        if v:
            return "device"
    fate = flow.fate(call)
    return fate if fate == "device" else "unknown"


def _float64_fix(site, ctx, flow, target: str):
    """Replace the dtype; a `from torch import float64` name whose every use is fixed loses its import too."""
    node = site.node
    fx = ctx.fixer()
    name = f"{fx.ref('torch')}.{target.split('.')[1]}"
    if not isinstance(node, ast.Name):
        fx.replace(node, name)
        return fx.build()

    def build(_analysis):
        uses = [s for s in ctx.analysis.sites if s.kind == "ref" and s.key == site.key and isinstance(s.node, ast.Name)
                and s.node.id == node.id]
        fixable = all(_use_fixable(s, ctx, flow) for s in uses)
        group = ctx.fixer()
        spelled = f"{group.ref('torch')}.{target.split('.')[1]}"
        for s in (uses if fixable else [site]):
            group.replace(s.node, spelled)
        if fixable:
            drop_import_name(group, ctx.analysis, "torch", node.id)
        return group.build()

    return cached_fix(ctx, f"float64-name:{node.id}:{site.key}", build)


def _use_fixable(s, ctx, flow) -> bool:
    if in_compare(s):
        return False
    call = enclosing_call(s)
    if call is None:
        return False
    callee = ctx.analysis.resolve(call.func, s.scope, count_use=False)
    if callee in ("torch.finfo", "torch.iinfo"):
        return False
    if callee == "torch.set_default_dtype":
        return flow.touches_device
    return _dtype_call_where(flow, call, s) == "device"


def cached_fix(ctx, key: str, build):
    from neuron_migrate.program import cached

    return cached(ctx.analysis, f"fix:{ctx.rule.code}:{key}", build)


def drop_import_name(fx, analysis, module: str, name: str) -> None:
    """Remove `name` from the module-level `from <module> import ...` that binds it (the whole line when alone)."""
    for stmt in analysis.tree.body:
        if isinstance(stmt, ast.ImportFrom) and stmt.module == module and stmt.level == 0:
            names = [a for a in stmt.names if (a.asname or a.name) == name]
            if not names:
                continue
            rest = [a for a in stmt.names if a not in names]
            if rest:
                fx.replace(stmt, f"from {module} import " + ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in rest))
            else:
                fx.delete(stmt)
            return


# ===================================================================================== numpy float64
_NP_FLOAT_DEFAULT = {"numpy.zeros", "numpy.ones", "numpy.empty", "numpy.full", "numpy.eye", "numpy.identity",
                     "numpy.linspace", "numpy.logspace", "numpy.loadtxt", "numpy.genfromtxt", "numpy.random.rand",
                     "numpy.random.randn", "numpy.random.random", "numpy.random.random_sample", "numpy.random.uniform",
                     "numpy.random.normal", "numpy.random.standard_normal"}
_NP_F64_NAMES = {"numpy.float64", "numpy.double", "float"}


def _is_f64_dtype(node, ctx, scope) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in ("float64", "f8", "double", "d")
    if isinstance(node, ast.Name) and node.id == "float":
        return True
    return ctx.analysis.resolve(node, scope, count_use=False) in _NP_F64_NAMES


def _np_float64(node, ctx, scope, depth: int = 0) -> bool:
    """The expression is (visibly) a numpy float64 array."""
    if depth > 3 or node is None:
        return False
    if isinstance(node, ast.Call):
        if isinstance(node.func, ast.Attribute) and node.func.attr == "astype" and node.args:
            return _is_f64_dtype(node.args[0], ctx, scope)
        q = ctx.analysis.resolve(node.func, scope, count_use=False)
        if q is None or not q.startswith("numpy."):
            return False
        dtype = kwarg(node, "dtype")
        if dtype is not None:
            return _is_f64_dtype(dtype, ctx, scope)
        if q in _NP_FLOAT_DEFAULT:
            return True
        if q in ("numpy.array", "numpy.asarray") and node.args:
            return any(isinstance(c, ast.Constant) and isinstance(c.value, float) for c in walk(node.args[0]))
        return False
    if isinstance(node, ast.Name):
        # the last assignment to the name in the same scope, before this use
        body = scope.node.body if not isinstance(scope.node, ast.Lambda) else []
        value = None
        for stmt in walk(ast.Module(body=list(body), type_ignores=[])) if body else ():
            if isinstance(stmt, ast.Assign) and stmt.lineno < node.lineno and any(
                isinstance(t, ast.Name) and t.id == node.id for t in stmt.targets
            ):
                if value is None or stmt.lineno > value[0]:
                    value = (stmt.lineno, stmt.value)
        return value is not None and _np_float64(value[1], ctx, scope, depth + 1)
    return False


@rule(
    code="NM305",
    name="numpy-float64",
    summary="a numpy float64 array entering torch becomes a float64 tensor, which executes as float32 on Neuron",
    fix="none",
    severity="warning",
    triggers=[("call", "torch.from_numpy"), ("call", "torch.tensor"), ("call", "torch.as_tensor")],
    trigger_words=("numpy",),
    docs=f"""
        numpy creates float64 arrays by default (`np.zeros`, `np.random.rand`, `np.array([0.5])`, `np.loadtxt`).
        `torch.from_numpy(a)`, `torch.tensor(a)` and `torch.as_tensor(a)` keep that dtype, so data loaded this way
        becomes float64 tensors: on Neuron they execute as float32 with a warning (Neuron 2.33 release notes), after
        paying for 64-bit storage and casts. Convert on the numpy side (`a.astype(np.float32)`) or pass
        `dtype=torch.float32`. Reported when the array is visibly float64: a numpy creation call without a dtype, a
        float64 dtype, or a name assigned from one in the same scope. Source: {RN}
    """,
    examples=[("a = np.random.rand(4, 4)\nt = torch.from_numpy(a)",)],
)
def numpy_float64(site, ctx):
    call = site.call
    if not call.args or kwarg(call, "dtype") is not None:
        return None
    if not _np_float64(call.args[0], ctx, site.scope):
        return None
    from neuron_migrate.program import device_flow

    flow = device_flow.facts(ctx.analysis)
    if flow.fate(call, fallback=False) == "cpu" or (kwarg(call, "device") is not None and flow.is_device_value(kwarg(call, "device")) is False):
        return None  # float64 data that stays on the host computes in float64 there
    fn = site.key.split(".")[-1]
    return ctx.finding(site, f"torch.{fn}() of a numpy float64 array makes a float64 tensor (float32 on Neuron): convert "
                             f"with `.astype(np.float32)` first" + (" or pass dtype=torch.float32" if fn != "from_numpy" else ""),
                       **sourced(fact(ctx, "torch.float64")))


# ===================================================================================== int64 in compiled graphs
@rule(
    code="NM306",
    name="int64-compiled",
    summary="int64 tensors in a torch.compile graph are narrowed to int32 on Neuron",
    fix="none",
    severity="info",
    triggers=[("ref", "torch.int64"), ("ref", "torch.long")],
    trigger_words=("compile",),
    docs=f"""
        A note for files that use `torch.compile`: the pre-release TorchNeuron compile executor reinterprets int64
        (and uint64) graph inputs as 32-bit and restores the dtype on outputs, and eager kernels cast int64 to int32
        (pre-release source {PRERELEASE}/neuron_dynamo_backend/executor.py; not stated in the 2.33 release notes,
        which say only that float64 runs as float32). Values beyond the int32 range (large vocabulary offsets,
        hashed ids, step counters, cumulative sums of lengths) silently wrap. Keep such values in int32 range, or
        do that arithmetic outside the compiled function. Reported once per use of `torch.int64`/`torch.long` in a
        file that calls `torch.compile`.
    """,
    examples=[("model = torch.compile(model)\nids = ids.to(torch.long)",)],
)
def int64_compiled(site, ctx):
    if in_compare(site) or not ctx.uses_any("torch.compile"):
        return None
    return ctx.finding(site, f"`{site.key}` in a file using torch.compile: compiled graphs on Neuron compute int64 as "
                             "int32; keep these values within int32 range or do the 64-bit arithmetic outside the "
                             "compiled function", **sourced(fact(ctx, "torch.int64")))


# ===================================================================================== table ops
def _site_api(site) -> str:
    return f"Tensor.{site.key}" if site.kind == "method" else site.key


def _ops_text(entries) -> str:
    names = [e.name for e in entries if e.kind == "aten_op"]
    return ", ".join(dict.fromkeys(names))


# Random factories make a CPU tensor unless given a device: only then do they run (or fall back) on Neuron.
_CPU_BY_DEFAULT = frozenset({"torch.rand", "torch.randn", "torch.randint", "torch.randperm", "torch.normal"})


# functions that build or (re)initialise a module's weights: they run when the module is constructed, on the CPU before
# the model is moved to the device (DiT's initialize_weights, timm's _init_weights, nn.Linear.reset_parameters)
_WEIGHT_INIT_FUNCS = frozenset({"__init__", "_init_weights", "init_weights", "initialize_weights", "_initialize_weights",
                                "reset_parameters", "_reset_parameters", "_init_params", "init_params"})


def _in_weight_init(site, ctx) -> bool:
    from neuron_migrate.program.distributed import function_of

    fn = function_of(ctx.analysis, site.node)
    return isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.name in _WEIGHT_INIT_FUNCS


def _table_check(site, ctx, want: str):
    if site.kind == "method":
        # only calls on an object that is not a resolved module/class (x.atan2(y)); skip private/dunder names
        if site.key.startswith("_"):
            return None
        if site.key == "sort" and (site.is_statement or any(kw.arg in ("key", "reverse") for kw in site.call.keywords)):
            return None  # list.sort(key=..., reverse=...), or a sort whose result is dropped: Tensor.sort returns its values
    elif site.key in _CPU_BY_DEFAULT and kwarg(site.call, "device") is None:
        return None
    api = _site_api(site)
    st = api_status(ctx, api)
    if st is None:
        return None
    status, entries = st
    if status.value != want:
        return None
    if want == "cpu_fallback" and (site.key.startswith("torch.nn.init.") or site.kind == "method") and _in_weight_init(site, ctx):
        return None  # weight initialisation at construction: the tensors are still on the CPU
    v = fact(ctx, api)
    bad = [e for e in entries if e.status.value == want] or entries
    ops = _ops_text(bad)
    note = next((e.note for e in bad if e.note), "") or ""
    shown = f"x.{site.key}()" if site.kind == "method" else f"{site.key}()"
    if want == "cpu_fallback":
        msg = (f"`{shown}` runs on the host CPU on TorchNeuron" + (f" ({ops})" if ops else "") +
               ": tensors are copied to the CPU and back, and inside torch.compile the graph may fail to compile; "
               "keep it out of the training step or compute it on CPU once")
    else:
        msg = (f"`{shown}` is not supported on TorchNeuron" + (f" ({ops})" if ops else "") +
               ": replace it or run this part on CPU")
    return ctx.finding(site, msg, note=note, **sourced(v))


_TABLE_DOCS = """
    Looked up at the call site in the TorchNeuron compatibility table (`neuron-migrate table show`; another
    table with `audit --table FILE`): a function or method whose API entry, or the aten ops it dispatches to
    (`compat_table/api_to_aten.yaml`, recorded from torch 2.13), {what}. {why} Method calls on unknown objects
    (`x.atan2(y)`) are looked up as `Tensor.<name>`, except a `.sort()` that is a Python list's (`key=` or
    `reverse=`, or its result dropped: Tensor.sort returns the sorted values). Each finding names the ops and carries
    the table's note; host fallbacks are not reported inside the functions that initialise a module's weights
    (`__init__`, `_init_weights`, `initialize_weights`, `reset_parameters`), which run on the CPU before the model
    is moved. The table cites its sources (release notes {rn}; pre-release TorchNeuron source for per-op kernels).
"""


@rule(
    code="NM310",
    name="host-fallback-op",
    summary="an op that TorchNeuron runs on the host CPU (compatibility table: cpu_fallback)",
    fix="none",
    severity="warning",
    triggers=[("call", "torch.*"), ("method", "*")],
    trigger_words=("torch",),
    docs=_TABLE_DOCS.format(
        what="are marked `cpu_fallback`",
        why="Such ops run, but on the host: eager mode copies the tensors to the CPU and back (a warning, and slow "
            "inside a training step), and in a compiled graph an op that cannot be lowered fails the compile (2.33 "
            "release notes). The linalg family (`torch.linalg.qr`, `svd`, `eigh`, `inv`, `cholesky`, `det`) and "
            "`atan2` are examples. Move the call out of the hot loop, compute it once on CPU, or use another op.",
        rn=RN),
    examples=[("q, r = torch.linalg.qr(a)",), ("ang = y.atan2(x)",)],
)
def host_fallback_op(site, ctx):
    return _table_check(site, ctx, "cpu_fallback")


@rule(
    code="NM311",
    name="unsupported-op",
    summary="an API or op that TorchNeuron does not support (compatibility table: unsupported)",
    fix="none",
    severity="error",
    triggers=[("call", "torch.*"), ("method", "*")],
    trigger_words=("torch",),
    docs=_TABLE_DOCS.format(
        what="are marked `unsupported`",
        why="Such calls raise on the `neuron` device (for example CUDA graphs, `dist.monitored_barrier`). Replace "
            "them, or run that part on CPU.",
        rn=RN),
    examples=[("g = torch.cuda.CUDAGraph()",)],
)
def unsupported_op(site, ctx):
    return _table_check(site, ctx, "unsupported")
