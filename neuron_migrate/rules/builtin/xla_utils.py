"""torch_xla's pure-Python utilities: xm.RateTracker, test_utils, the sample generators (NM144-NM146), the environment
names and getenv_as (NM164), xr.using_pjrt (NM165)."""
from __future__ import annotations

import ast

from neuron_migrate.names.analysis import walk
from neuron_migrate.program.distributed import torchrun_side
from neuron_migrate.rules.api import const_value, has_star_args, kwarg, rule
from neuron_migrate.rules.builtin.xla_loaders import _class_of_method, _sealed
from neuron_migrate.rules.builtin.xla_misc import XM, _isinstance_or_base, _nested_mentions, _scope_body_nodes
from neuron_migrate.rules.helpers import HELPERS, Helper

# -- NM144-NM146: torch_xla's pure-Python utilities -------------------------------------------------
XU = "torch_xla.utils.utils"
TU = "torch_xla.test.test_utils"

HELPERS["_RateTracker"] = Helper(
    '''class _RateTracker:
    """Examples per second, smoothed over the calls to rate() (what xm.RateTracker computed)."""

    def __init__(self, smooth_factor=None):
        if smooth_factor is None:
            smooth_factor = float({os}.environ.get("RATE_TRACKER_SMOOTHING", 0.4))
        self._smooth_factor = smooth_factor
        self._start_time = self._partial_time = {time}.time()
        self._partial_count = self._count = 0.0
        self._partial_rate = None

    def add(self, count):
        self._count += count

    def rate(self):
        now = {time}.time()
        delta = now - self._partial_time
        if delta <= 0:
            return 0.0
        rate = self._count / delta
        if self._partial_rate is not None:
            rate = (1 - self._smooth_factor) * rate + self._smooth_factor * self._partial_rate
        self._partial_count += self._count
        self._count = 0.0
        self._partial_time, self._partial_rate = now, rate
        return rate

    def global_rate(self):
        delta = {time}.time() - self._start_time
        return (self._partial_count + self._count) / delta if delta > 0 else 0.0
''',
    {"os": "os", "time": "time"},
)
HELPERS["_print_training_update"] = Helper(
    '''def _print_training_update(device, step, loss, rate, global_rate, epoch=None, summary_writer=None):
    """One training log line, and the rates to TensorBoard with a writer (as test_utils.print_training_update did)."""
    epoch_field = f" Epoch={{epoch}}" if epoch is not None else ""
    print(f"| Training Device={{device}}{{epoch_field}} Step={{step}} Loss={{loss:.5f}} Rate={{rate:.2f}} "
          f"GlobalRate={{global_rate:.2f}} Time={{{datetime}.datetime.now():%H:%M:%S}}", flush=True)
    if summary_writer:
        summary_writer.add_scalar("examples/sec", rate)
        summary_writer.add_scalar("average_examples/sec", global_rate)
''',
    {"datetime": "datetime"},
)
HELPERS["_summary_writer"] = Helper(
    '''def _summary_writer(logdir):
    """A TensorBoard writer for `logdir`, or None without one (as test_utils.get_summary_writer did)."""
    if not logdir:
        return None
    from tensorboardX import SummaryWriter

    writer = SummaryWriter(log_dir=logdir)
    writer.add_scalar("TensorboardStartTimestamp", {time}.time(), 0)
    return writer
''',
    {"time": "time"},
)


def _datetime_class(fx, scope) -> str:
    """Local spelling of datetime.datetime: `datetime` after `from datetime import datetime`, else datetime.datetime."""
    bound = fx.ctx.analysis.binding_for("datetime.datetime", scope)
    return bound or f"{fx.ref('datetime')}.datetime"


# -- NM144 under --unsafe-fixes: the usual tracker as a plain namespace --------------------------
_TRACKER_METHODS = ("add", "rate", "global_rate")
_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _rate_text(node, name: str, time_ref: str, parent) -> str:
    """`name.seen / (time.time() - name.start)`, in parentheses where the operator precedence at `node` needs them."""
    text = f"{name}.seen / ({time_ref}.time() - {name}.start)"
    free = (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Return, ast.Expr, ast.keyword, ast.Call, ast.FormattedValue,
            ast.Tuple, ast.List, ast.Set, ast.Dict, ast.Compare, ast.BoolOp, ast.IfExp)
    if isinstance(parent, ast.Call) and node is parent.func:
        return f"({text})"
    if isinstance(parent, free):
        return text
    if isinstance(parent, ast.BinOp) and (isinstance(parent.op, (ast.Add, ast.Sub))
                                          or (node is parent.left and isinstance(parent.op, (ast.Mult, ast.Div, ast.FloorDiv, ast.Mod)))):
        return text
    return f"({text})"


def _tracker_use_edits(use: ast.Name, time_ref: str, ctx):
    """(node, text) replacing one use of a tracker name that is `.rate()`, `.global_rate()` or `.add(n)` as a
    statement; None for any other use."""
    a = ctx.analysis
    attr = a.parent_of.get(use)
    call = a.parent_of.get(attr)
    if not (isinstance(attr, ast.Attribute) and attr.value is use and attr.attr in _TRACKER_METHODS
            and isinstance(call, ast.Call) and call.func is attr):
        return None
    name = use.id
    if attr.attr == "add":
        stmt = a.parent_of.get(call)
        if not (isinstance(stmt, ast.Expr) and len(call.args) == 1 and not call.keywords):
            return None
        count = call.args[0]
        if isinstance(count, (ast.Starred, ast.GeneratorExp, ast.Yield, ast.YieldFrom)):
            return None
        src = ctx.args_src(call)
        if _ends_with_comma(src):
            if "\n" in src:
                return None
            src = ctx.src_relative(count)
        if "\n" in src or isinstance(count, ast.NamedExpr):
            src = f"({src})"  # the comments and line breaks inside the call's parentheses stay
        return stmt, f"{name}.seen += {src}"
    if call.args or call.keywords:
        return None
    return call, _rate_text(call, name, time_ref, a.parent_of.get(call))


def _ends_with_comma(text: str) -> bool:
    """The last token of `text` (comments and line breaks aside) is a comma: `n,` would make a tuple."""
    import io
    import tokenize

    last = None
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.ENDMARKER, tokenize.INDENT, tokenize.DEDENT):
                last = tok.string
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return True  # cannot tell: treat as the unsafe case
    return last == ","


def _only_binding(tree, fname: str):
    """The module-level or nested def named `fname` when it is the file's only binding of that name, else None."""
    found = []
    for n in walk(tree):
        if isinstance(n, (*_FUNCS, ast.ClassDef)) and n.name == fname:
            found.append(n)
        elif isinstance(n, ast.Name) and n.id == fname and not isinstance(n.ctx, ast.Load):
            return None
        elif isinstance(n, ast.alias) and (n.asname or n.name.split(".")[0]) == fname:
            return None
        elif isinstance(n, ast.arg) and n.arg == fname:
            return None
        elif isinstance(n, (ast.Global, ast.Nonlocal)) and fname in n.names:
            return None
    if len(found) != 1 or not isinstance(found[0], _FUNCS) or found[0].decorator_list:
        return None
    return found[0]


def _closure_call(use, ctx, scope):
    """(closure function node, argument index) when `use` is an element of `xm.add_step_closure(fn, args=(...))`."""
    a = ctx.analysis
    seq = a.parent_of.get(use)
    call = _call_of_argument(seq, a)
    if not (isinstance(seq, (ast.Tuple, ast.List)) and isinstance(call, ast.Call)
            and a.resolve(call.func, scope, count_use=False) == f"{XM}.add_step_closure"):
        return None
    if has_star_args(call) or any(isinstance(e, ast.Starred) for e in seq.elts) or kwarg(call, "args", 1) is not seq:
        return None
    fn = kwarg(call, "closure", 0)
    return (fn, seq.elts.index(use)) if isinstance(fn, ast.Name) else None


def _call_of_argument(node, a):
    """The call that `node` is an argument of, positionally or by keyword (else the node's parent)."""
    parent = a.parent_of.get(node)
    return a.parent_of.get(parent) if isinstance(parent, ast.keyword) else parent


def _passed_to(use, ctx, scope):
    """(function name node, argument index) when `use` is a positional argument of a call of a plain name, directly
    or through xm.add_step_closure."""
    a = ctx.analysis
    call = a.parent_of.get(use)
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and use in call.args:
        if any(isinstance(x, ast.Starred) for x in call.args) or any(k.arg is None for k in call.keywords):
            return None
        return call.func, call.args.index(use)
    return _closure_call(use, ctx, scope)


def _tracker_param_edits(fn, index: int, name: str, time_refs: dict, fx, ctx):
    """The edits inside `fn` when its parameter `index` (always given our tracker, positionally) is only used as a
    tracker; None otherwise."""
    params = [*fn.args.posonlyargs, *fn.args.args]
    if index >= len(params):
        return None
    p = params[index].arg
    if _nested_mentions(fn, p):
        return None
    fn_scope = ctx.analysis.scope_of.get(fn)
    time_ref = fx.ref("time", fn_scope)
    if fn_scope is None or time_ref != time_refs.setdefault("ref", time_ref):
        return None
    edits = []
    for n in _scope_body_nodes(fn):
        if isinstance(n, (ast.Global, ast.Nonlocal)) and p in n.names:
            return None
        if not (isinstance(n, ast.Name) and n.id == p):
            continue
        if not isinstance(n.ctx, ast.Load):
            return None
        edit = _tracker_use_edits(n, time_ref, ctx)
        if edit is None:
            return None
        edits.append(edit)
    return edits


def _plain_tracker_fix(site, ctx):
    """Under --unsafe-fixes: the Fix that makes `name = xm.RateTracker()` a SimpleNamespace(start, seen) and each
    use plain arithmetic, when every use of the tracker in this file is visible and one of the known forms; else None."""
    a = ctx.analysis
    call, assign, scope = site.node, site.parent, site.scope
    scope_node = scope.node
    if call.args or call.keywords or not isinstance(scope_node, _FUNCS):
        return None  # smooth_factor= (or anything) given: the smoothing is asked for, keep it
    if not (isinstance(assign, ast.Assign) and assign.value is call and len(assign.targets) == 1
            and isinstance(assign.targets[0], ast.Name)):
        return None
    name = assign.targets[0].id
    if _binds_param(scope_node, name) or _nested_mentions(scope_node, name):
        return None
    fx = ctx.fixer("unsafe")
    time_refs = {"ref": fx.ref("time", scope)}
    edits, done_params, uses = [], set(), []
    for n in _scope_body_nodes(scope_node):
        if isinstance(n, (ast.Global, ast.Nonlocal)) and name in n.names:
            return None
        if isinstance(n, ast.Name) and n.id == name:
            if n is assign.targets[0]:
                continue
            if not isinstance(n.ctx, ast.Load):
                return None  # the name is bound again (another tracker or anything else)
            uses.append(n)
    for n in uses:
        edit = _tracker_use_edits(n, time_refs["ref"], ctx)
        if edit is not None:
            edits.append(edit)
            continue
        passed = _passed_to(n, ctx, scope)
        if passed is None:
            method = _passed_to_method(n, ctx, scope)
            if method is None:
                return None
            fn, index = method
        else:
            fname, index = passed
            fn = _only_binding(a.tree, fname.id)
            if fn is None or a.parent_of.get(fn) not in (a.tree, scope_node) or not _only_called_with(fn.name, index, name, scope, ctx):
                return None
        if (fn, index) in done_params:
            continue
        done_params.add((fn, index))
        inner = _tracker_param_edits(fn, index, name, time_refs, fx, ctx)
        if inner is None:
            return None
        edits.extend(inner)
    bound = a.binding_for("types.SimpleNamespace", scope)
    if bound:
        namespace = bound
    elif "SimpleNamespace" not in a.defined_names:
        namespace = fx.member("types.SimpleNamespace")
    else:
        namespace = fx.name("types.SimpleNamespace", scope)
    fx.replace(call, f"{namespace}(start={time_refs['ref']}.time(), seen=0)")
    for node, text in edits:
        fx.replace(node, text)
    return fx


def _passed_to_method(use, ctx, scope):
    """(method def, parameter index) when `use` is passed, positionally, to `self.method(...)` (directly or through
    `xm.add_step_closure(self.method, args=(...))`) from a method of a class sealed for both methods (no subclass
    overrides them, no other file names `.method`: `_sealed`), and that is the only mention of `.method` in the
    file. Else None."""
    a = ctx.analysis
    cls = _class_of_method(scope.node, ctx)
    if cls is None:
        return None
    me = scope.node.args.args[0].arg
    call = a.parent_of.get(use)
    if isinstance(call, ast.Call) and use in call.args and not has_star_args(call):
        func, index = call.func, call.args.index(use)
    else:
        seq = a.parent_of.get(use)
        closure = _call_of_argument(seq, a)
        if not (isinstance(seq, (ast.Tuple, ast.List)) and isinstance(closure, ast.Call)
                and a.resolve(closure.func, scope, count_use=False) == f"{XM}.add_step_closure"):
            return None
        if has_star_args(closure) or any(isinstance(e, ast.Starred) for e in seq.elts) or kwarg(closure, "args", 1) is not seq:
            return None
        func, index = kwarg(closure, "closure", 0), seq.elts.index(use)
    if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == me):
        return None
    defs = [n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == func.attr]
    if len(defs) != 1 or defs[0].decorator_list or not defs[0].args.args or defs[0].args.args[0].arg != me:
        return None
    if not _sealed(cls, ctx, {scope.node.name, func.attr}, {func.attr}):
        return None
    if sum(1 for n in walk(a.tree) if isinstance(n, ast.Attribute) and n.attr == func.attr) != 1:
        return None  # the method is named elsewhere too: every caller would have to pass this tracker
    return defs[0], index + 1


def _binds_param(fn, name: str) -> bool:
    args = fn.args
    return name in [p.arg for p in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg] if p is not None]


def _only_called_with(fname: str, index: int, name: str, scope, ctx) -> bool:
    """Every reference to function `fname` in the file is a call (direct or as a step closure) in `scope` that
    passes the tracker `name` at position `index`."""
    a = ctx.analysis
    in_scope = {id(n) for n in _scope_body_nodes(scope.node)}
    for n in walk(a.tree):
        if not (isinstance(n, ast.Name) and n.id == fname and isinstance(n.ctx, ast.Load)):
            continue
        if id(n) not in in_scope:
            return False
        parent = _call_of_argument(n, a)
        if isinstance(parent, ast.Call) and parent.func is n:
            args = parent.args
            if any(isinstance(x, ast.Starred) for x in args) or any(k.arg is None for k in parent.keywords):
                return False
        elif isinstance(parent, ast.Call) and kwarg(parent, "closure", 0) is n and \
                a.resolve(parent.func, scope, count_use=False) == f"{XM}.add_step_closure":
            seq = kwarg(parent, "args", 1)
            if not isinstance(seq, (ast.Tuple, ast.List)) or any(isinstance(x, ast.Starred) for x in seq.elts):
                return False
            args = seq.elts
        else:
            return False
        if not (len(args) > index and isinstance(args[index], ast.Name) and args[index].id == name):
            return False
    return True


@rule(
    code="NM144",
    name="xla-rate-tracker",
    summary="xm.RateTracker (examples/sec) becomes a small inserted _RateTracker class with the same methods; "
            "with --unsafe-fixes, the usual tracker becomes a start time and a count",
    fix="safe",
    severity="warning",
    triggers=[("call", f"{XM}.RateTracker"), ("ref", f"{XM}.RateTracker")],
    docs="""
        `xm.RateTracker(smooth_factor=None)` is a pure-Python throughput meter: `add(n)` counts examples,
        `rate()` returns examples per second since the previous `rate()` call, smoothed with the previous
        rate (`smooth_factor`, default `RATE_TRACKER_SMOOTHING` or 0.4), and `global_rate()` the average since
        construction. Native PyTorch has no such class, and a whole script should not keep importing torch_xla
        for it, so the safe fix makes the constructor `_RateTracker(...)`: a copy of that logic (about twenty
        lines, time and os only) inserted once into the module. Arguments and calls stay as they are.

        With `--unsafe-fixes`, the tracker of PyTorch/XLA's `test_train_mp_*` scripts needs no class: when
        `tracker = xm.RateTracker()` (no arguments) is assigned once in a function and every use of it in the
        file is `tracker.add(n)` as a statement, `tracker.rate()` or `tracker.global_rate()`, in that function
        or in a function of this file that it is passed to (directly or through `xm.add_step_closure(fn,
        args=(..., tracker, ...))`), or in a method of its class called as `self.method(...)` when no subclass can
        override it (the repository model says no other file imports the class, or that no subclass in any file
        overrides that method or the one holding the tracker and no other file names the method), and that uses the
        parameter only that way, the tracker becomes
        `SimpleNamespace(start=time.time(), seen=0)`, `add(n)` becomes `tracker.seen += n`, and both rates become
        `tracker.seen / (time.time() - tracker.start)`. That is torch_xla's `global_rate()` (except that an
        elapsed time of exactly zero divides by zero where torch_xla returned 0.0); `rate()` loses its smoothing
        and reports the average since the tracker was created, not the recent rate: the finding's note says so.
        All edits of one tracker are one fix. Any other use, or a `smooth_factor=` argument, keeps the safe
        `_RateTracker` fix.
    """,
    examples=[("tracker = xm.RateTracker()", "tracker = _RateTracker()"),
              ("def train(loader):\n    tracker = xm.RateTracker()\n    for x in loader:\n        tracker.add(x.shape[0])\n"
               "    print(tracker.rate())",
               "def train(loader):\n    tracker = SimpleNamespace(start=time.time(), seen=0)  # --unsafe-fixes\n"
               "    for x in loader:\n        tracker.seen += x.shape[0]\n    print(tracker.seen / (time.time() - tracker.start))")],
)
def xla_rate_tracker(site, ctx):
    if site.kind == "ref" and _isinstance_or_base(site, ctx):
        return ctx.finding(site, "xm.RateTracker subclassed or tested with isinstance: use the inserted _RateTracker by hand")
    # one form per repository: where other files use xm.RateTracker too, each gets the same _RateTracker (the plain
    # form below depends on what one file shows, so two files of one program could get two different meters)
    others = (getattr(ctx.analysis, "outside", None) or {}).get("rate_trackers")
    if site.kind == "call" and ctx.settings.unsafe_fixes and not others:
        fx = _plain_tracker_fix(site, ctx)
        if fx is not None:
            return ctx.finding(site, "xm.RateTracker: becomes a start time and a count (SimpleNamespace); its rates are "
                                     "count / elapsed time", fix=fx.build("unsafe"),
                               note="rate() is no longer smoothed: the logged rate is now the average since the tracker "
                                    "was created (global_rate() is unchanged).")
    fx = ctx.fixer()
    name = fx.helper("_RateTracker")
    fx.replace(site.node.func if site.kind == "call" else site.node, name)
    note = ""
    if others and ctx.settings.unsafe_fixes:
        note = (f"Other files of the repository use xm.RateTracker too ({', '.join(others)}): each gets this same "
                "_RateTracker (one form; `rewrite --helpers-module PATH` puts it in one shared module).")
    return ctx.finding(site, "xm.RateTracker: becomes _RateTracker, the same examples/sec meter without torch_xla",
                       fix=fx.build(), note=note)


@rule(
    code="NM145",
    name="xla-sample-generator",
    summary="xu.SampleGenerator(data, sample_count) becomes [data] * sample_count",
    fix="safe",
    severity="warning",
    triggers=[("call", f"{XU}.SampleGenerator"), ("ref", f"{XU}.SampleGenerator")],
    docs="""
        `torch_xla.utils.utils.SampleGenerator(data, sample_count)` stands in for a DataLoader in synthetic-data
        runs: every iteration yields the same `data` object `sample_count` times, it can be iterated again each
        epoch, and `len()` is `sample_count`. A list holding `sample_count` references to `data`,
        `[data] * sample_count`, does exactly that (one reference per batch, no copies). Used as a value it is
        reported.
    """,
    examples=[("import torch_xla.utils.utils as xu\nloader = xu.SampleGenerator(data=(x, y), sample_count=100)", "loader = [(x, y)] * 100")],
)
def xla_sample_generator(site, ctx):
    if site.kind == "ref":
        return ctx.finding(site, "xu.SampleGenerator used as a value: use a list, [data] * sample_count, by hand")
    call = site.call
    data, count = kwarg(call, "data", 0), kwarg(call, "sample_count", 1)
    if data is None or count is None or has_star_args(call) or len(call.args) + len(call.keywords) != 2:
        return ctx.finding(site, "xu.SampleGenerator without plain (data, sample_count) arguments: use [data] * sample_count by hand")
    count_src = ctx.src(count)
    if not isinstance(count, (ast.Name, ast.Attribute, ast.Constant, ast.Call, ast.Subscript)):
        count_src = f"({count_src})"
    parent = site.parent
    wrap = not isinstance(parent, (ast.Assign, ast.AnnAssign, ast.keyword, ast.Call, ast.Return))
    # the data's lines keep their alignment where the list puts it: `[(a,\n  b)]` one column right of the call
    opening = ctx.analysis.span(call).col + (2 if wrap else 1)
    text = f"[{ctx.src_moved(data, opening)}] * {count_src}"
    if wrap:
        text = f"({text})"
    fx = ctx.fixer()
    fx.replace(call, text)
    return ctx.finding(site, "xu.SampleGenerator: becomes [data] * sample_count (the same object, sample_count times, re-iterable, with len())",
                       fix=fx.build())


_TU_FUNCS = ("print_training_update", "print_test_update", "now", "get_summary_writer", "write_to_summary", "close_summary_writer")
_FSTRING_UNSAFE = ('"', "\\", "\n", "#", "{", "}", "lambda")


def _field(ctx, node) -> str | None:
    """Source of an argument for use inside an f-string field on every supported Python, or None."""
    src = ctx.src(node)
    return None if any(c in src for c in _FSTRING_UNSAFE) else src


def _given(node) -> bool:
    return node is not None and not (isinstance(node, ast.Constant) and node.value is None)


def _simple(node) -> bool:
    """Cheap to evaluate twice and free of side effects: a name or an attribute chain on one."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name)


@rule(
    code="NM146",
    name="xla-test-utils",
    summary="torch_xla.test.test_utils logging helpers become print()/TensorBoard calls",
    fix="safe",
    severity="warning",
    triggers=[*[("call", f"{TU}.{f}") for f in _TU_FUNCS], *[("ref", f"{TU}.{f}") for f in _TU_FUNCS]],
    docs="""
        `torch_xla.test.test_utils` holds the logging helpers of PyTorch/XLA's example scripts. Each becomes
        what it did, in plain Python:
        `print_training_update(device, step, loss, rate, global_rate, epoch)` prints
        `| Training Device=... Epoch=... Step=... Loss=... Rate=... GlobalRate=... Time=...` and becomes that
        `print(f"...", flush=True)`; with a `summary_writer=` it also wrote both rates to TensorBoard, which
        needs the rates once, so it becomes a call of an inserted `_print_training_update` with the same
        arguments. `print_test_update(device, accuracy, epoch, step)` becomes its `print(f"| Test ...")`.
        `now(fmt)` is `datetime.now().strftime(fmt)` (default `"%H:%M:%S"`). `get_summary_writer(logdir)`
        becomes `_summary_writer(logdir)`, an inserted function that, like the original, imports
        `tensorboardX` only when a log directory is given (the dependency stays the one the script already
        had), and logs `TensorboardStartTimestamp`. `write_to_summary(writer, step, dict_to_write={...})` with a
        literal dict becomes `if writer is not None:` plus one `writer.add_scalar(tag, value, step)` per entry;
        `write_xla_metrics=True` is dropped with a note (there are no XLA metrics). `close_summary_writer(w)`
        becomes `if w is not None: w.close()` (close flushes). The printed device is the native one
        (`neuron`), without torch_xla's `/ordinal` suffix.
    """,
    examples=[("import torch_xla.test.test_utils as test_utils\ntest_utils.print_test_update(device, accuracy, epoch=epoch)",
               'print(f"| Test Device={device} Epoch={epoch} Accuracy={accuracy:.2f} Time={datetime.datetime.now():%H:%M:%S}", flush=True)')],
)
def xla_test_utils(site, ctx):
    short = site.key.rsplit(".", 1)[1]
    if site.kind == "ref":
        return ctx.finding(site, f"test_utils.{short} used as a value: replace it with print()/SummaryWriter calls by hand")
    call = site.call
    by_hand = ctx.finding(site, f"test_utils.{short} with arguments this rule cannot map: replace it with print()/SummaryWriter calls by hand")
    if has_star_args(call):
        return by_hand
    fx = ctx.fixer()
    if short == "now":
        fmt = kwarg(call, "format", 0)
        fx.replace(call, f"{_datetime_class(fx, site.scope)}.now().strftime({ctx.src(fmt) if fmt is not None else repr('%H:%M:%S')})")
        return ctx.finding(site, "test_utils.now(): becomes datetime.now().strftime(...)", fix=fx.build())
    if short == "get_summary_writer":
        logdir = kwarg(call, "logdir", 0)
        if logdir is None or len(call.args) + len(call.keywords) != 1:
            return by_hand
        fx.replace(call.func, fx.helper("_summary_writer"))
        return ctx.finding(site, "test_utils.get_summary_writer: becomes _summary_writer (tensorboardX, imported only with a log directory, as before)",
                           fix=fx.build())
    if not site.is_statement:
        return by_hand
    if short == "close_summary_writer":
        writer = kwarg(call, "summary_writer", 0)
        if writer is None or not _simple(writer):
            return by_hand
        w = ctx.src(writer)
        fx.replace(site.stmt, f"if {w} is not None:\n    {w}.close()")
        return ctx.finding(site, "test_utils.close_summary_writer: becomes writer.close() (which flushes) when there is a writer", fix=fx.build())
    if short == "write_to_summary":
        writer, step = kwarg(call, "summary_writer", 0), kwarg(call, "global_step", 1)
        scalars, xla_metrics = kwarg(call, "dict_to_write", 2), kwarg(call, "write_xla_metrics", 3)
        if writer is None or not _simple(writer) or not isinstance(scalars, ast.Dict) or None in scalars.keys:
            return by_hand
        w = ctx.src(writer)
        step_src = f", {ctx.src(step)}" if _given(step) else ""
        body = [f"    {w}.add_scalar({ctx.src(k)}, {ctx.src(v)}{step_src})" for k, v in zip(scalars.keys, scalars.values)]
        note = "write_xla_metrics dropped: TorchNeuron has no XLA metrics to log" if _given(xla_metrics) and const_value(xla_metrics, True) else ""
        if body:
            fx.replace(site.stmt, "\n".join([f"if {w} is not None:", *body]))
        else:
            fx.delete(site.stmt)
        return ctx.finding(site, "test_utils.write_to_summary: becomes writer.add_scalar(...) per entry when there is a writer",
                           fix=fx.build(), note=note)
    clock = f"{_datetime_class(fx, site.scope)}.now():%H:%M:%S"
    if short == "print_test_update":
        device, accuracy = kwarg(call, "device", 0), kwarg(call, "accuracy", 1)
        epoch, step = kwarg(call, "epoch", 2), kwarg(call, "step", 3)
        if device is None or len(call.args) + len(call.keywords) > 4:
            return by_hand
        fields = [("Device", device, ""), ("Step", step, ""), ("Epoch", epoch, ""), ("Accuracy", accuracy, ":.2f")]
        kind = "Test"
    else:
        names = ("device", "step", "loss", "rate", "global_rate", "epoch", "summary_writer")
        args = {n: kwarg(call, n, i) for i, n in enumerate(names)}
        if any(args[n] is None for n in names[:5]) or len(call.args) + len(call.keywords) > 7:
            return by_hand
        if _given(args["summary_writer"]) or any(_field(ctx, args[n]) is None for n in names[:6] if args[n] is not None):
            fx.replace(call.func, fx.helper("_print_training_update"))
            return ctx.finding(site, "test_utils.print_training_update with a summary writer: becomes _print_training_update "
                                     "(the same line and TensorBoard scalars)", fix=fx.build())
        fields = [("Device", args["device"], ""), ("Epoch", args["epoch"], ""), ("Step", args["step"], ""),
                  ("Loss", args["loss"], ":.5f"), ("Rate", args["rate"], ":.2f"), ("GlobalRate", args["global_rate"], ":.2f")]
        kind = "Training"
    parts = []
    for label, node, spec in fields:
        if not _given(node):
            continue
        src = _field(ctx, node)
        if src is None:
            return by_hand
        parts.append(f"{label}={{{src}{spec}}}")
    parts.append(f"Time={{{clock}}}")
    fx.replace(call, f'print(f"| {kind} {" ".join(parts)}", flush=True)')
    return ctx.finding(site, f"test_utils.{short}: becomes the print() it made", fix=fx.build())


# -- NM164-NM165: torch_xla's environment names and runtime queries ----------------------------------
XENV = "torch_xla.core.xla_env_vars"
# the xenv constants that name torchrun's own variables (torch_xla 2.x: LOCAL_RANK = 'LOCAL_RANK', ...); the other
# constants name XLA runtime settings (PJRT_DEVICE, TPU_*) and stay with NM199
_TORCHRUN_NAMES = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
_ENV_TYPES = {"int": int, "float": float, "str": str, "bool": bool}


def _env_name(node, ctx):
    """The environment variable an argument names, as source: a string, or an xenv constant for a torchrun variable
    written as its string; None otherwise."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return ctx.src(node)
    if isinstance(node, (ast.Name, ast.Attribute)):
        q = ctx.analysis.resolve(node, ctx.analysis.module_scope, count_use=False) or ""
        if q.startswith(XENV + ".") and q[len(XENV) + 1:] in _TORCHRUN_NAMES:
            return f'"{q[len(XENV) + 1:]}"'
    return None


@rule(
    code="NM164",
    name="xla-env-names",
    summary='xenv.LOCAL_RANK (and RANK, WORLD_SIZE, LOCAL_WORLD_SIZE) become their strings; xu.getenv_as(name, type) reads os.environ',
    fix="safe",
    severity="warning",
    triggers=[("ref", f"{XENV}.{n}") for n in _TORCHRUN_NAMES] + [("call", f"{XU}.getenv_as"), ("ref", f"{XU}.getenv_as")],
    docs="""
        torch_xla 2.x's `torch_xla.core.xla_env_vars` (`xenv`) names torchrun's variables `LOCAL_RANK`, `RANK`,
        `WORLD_SIZE` and `LOCAL_WORLD_SIZE` with constants of the same text: they become the strings. (Its other
        constants name XLA runtime settings, PJRT_DEVICE or TPU_*, and stay reported by NM199.)
        `torch_xla.utils.utils.getenv_as(name, type, defval=None)` returns `defval` when the variable is unset, else
        `type(value)` (`bool(int(value))` for bool). Under torchrun (in the branch of the script's own test such as
        `if dist.is_torchelastic_launched():`, pytorch/xla's test_train_mp_imagenet.py) a torchrun variable is always
        set: `int(os.environ["LOCAL_RANK"])`. Elsewhere `os.environ.get(name, defval)` for str, `int(os.environ.get(
        name, 0))` where the default has the type, and `(int(os.environ[name]) if name in os.environ else defval)`
        otherwise. Used as a value, or with another type, it is reported.
    """,
    examples=[("import torch_xla.core.xla_env_vars as xenv\nimport torch_xla.utils.utils as xu\n"
               "steps = xu.getenv_as('STEPS', int, 10)", "import os\nsteps = int(os.environ.get('STEPS', 10))")],
)
def xla_env_names(site, ctx):
    if site.key.startswith(XENV + "."):
        name = site.key[len(XENV) + 1:]
        fx = ctx.fixer()
        fx.replace(site.node, f'"{name}"')
        return ctx.finding(site, f'`xenv.{name}` is the string "{name}" (torchrun sets it): written as the string', fix=fx.build())
    if site.kind == "ref":
        return ctx.finding(site, "xu.getenv_as used as a value: read os.environ by hand")
    call = site.call
    name_node, type_node, default = kwarg(call, "name", 0), kwarg(call, "type", 1), kwarg(call, "defval", 2)
    name = _env_name(name_node, ctx) if name_node is not None else None
    kind = type_node.id if isinstance(type_node, ast.Name) and type_node.id in _ENV_TYPES \
        and type_node.id not in ctx.analysis.defined_names else None
    if name is None or kind is None or has_star_args(call):
        return ctx.finding(site, "xu.getenv_as with a computed name or another type: read os.environ by hand "
                                 "(`type(os.environ[name]) if name in os.environ else defval`)")
    fx = ctx.fixer()
    env = f"{fx.ref('os')}.environ"
    read = f"{env}[{name}]" if kind != "bool" else f"int({env}[{name}])"
    value = read if kind == "str" else f"{kind}({read})"
    given = default is not None and not (isinstance(default, ast.Constant) and default.value is None)
    wrap = not isinstance(site.parent, (ast.Assign, ast.AnnAssign, ast.keyword, ast.Call, ast.Return))
    if name.strip('"\'') in _TORCHRUN_NAMES and not given and torchrun_side(ctx.analysis, call) is True:
        text = value  # torchrun set it
    elif kind == "str":
        text = f"{env}.get({name}{', ' + ctx.src(default) if given else ''})"
    elif given and isinstance(default, ast.Constant) and type(default.value) is _ENV_TYPES[kind] and kind != "bool":
        text = f"{kind}({env}.get({name}, {ctx.src(default)}))"
    else:
        text = f"{value} if {name} in {env} else {ctx.src(default) if given else 'None'}"
        if wrap:
            text = f"({text})"
    fx.replace(call, text)
    return ctx.finding(site, "xu.getenv_as(name, type) reads the environment: written with os.environ", fix=fx.build())


_USING_PJRT = ("torch_xla.runtime.using_pjrt", "torch_xla.experimental.pjrt.using_pjrt")


@rule(
    code="NM165",
    name="xla-using-pjrt",
    summary="xr.using_pjrt() was always True in torch_xla 2.x (removed in 2.5): the test goes",
    fix="safe",
    severity="warning",
    triggers=[("call", q) for q in _USING_PJRT] + [("ref", q) for q in _USING_PJRT],
    docs="""
        `torch_xla.runtime.using_pjrt()` told the PJRT runtime from the old XRT one; torch_xla 2.x always runs PJRT
        (the function was removed in 2.5), and what its branch did (pytorch/xla's test_train_mp_imagenet.py:
        `if xr.using_pjrt(): xm.broadcast_master_param(model)`) is what the migrated program must do. The `if`
        whose whole test it is, with no `else`, is replaced by its one-statement body, a conditional expression by
        its first value; elsewhere the call becomes `True`. Used as a value it is reported.
    """,
    examples=[("import torch_xla.runtime as xr\nif xr.using_pjrt():\n    print('pjrt')", "print('pjrt')")],
)
def xla_using_pjrt(site, ctx):
    if site.kind == "ref":
        return ctx.finding(site, "xr.using_pjrt used as a value: it answered True in every torch_xla 2.x; replace it by hand")
    fx = ctx.fixer()
    stmt = site.parent
    if isinstance(stmt, ast.If) and stmt.test is site.node and not stmt.orelse and len(stmt.body) == 1 \
            and not _comments_between(ctx, stmt):
        fx.replace(stmt, ctx.src_relative(stmt.body[0]))
        return ctx.finding(site, "xr.using_pjrt() was always True (PJRT is torch_xla 2.x's only runtime): its branch "
                                 "runs unconditionally", fix=fx.build())
    if isinstance(stmt, ast.IfExp) and stmt.test is site.node:  # `"pjrt" if xr.using_pjrt() else "xrt"`
        fx.replace(stmt, ctx.src_relative(stmt.body))
        return ctx.finding(site, "xr.using_pjrt() was always True (PJRT is torch_xla 2.x's only runtime): the "
                                 "conditional is its first value", fix=fx.build())
    fx.replace(site.node, "True")
    return ctx.finding(site, "xr.using_pjrt() was always True (PJRT is torch_xla 2.x's only runtime)", fix=fx.build())


def _comments_between(ctx, stmt) -> bool:
    """A comment line between an `if` and the end of its body (it would be lost when the `if` is unwrapped)."""
    lines = ctx.analysis.lines
    return any(lines[i].lstrip().startswith("#") for i in range(stmt.lineno, stmt.end_lineno or stmt.lineno))
