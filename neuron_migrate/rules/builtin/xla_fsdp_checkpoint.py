"""NM151's FSDP2 rewrite of torch_xla's FSDP checkpoint consolidation (the shape of torch_xla's
test_train_mp_mnist_fsdp_with_ckpt.py): each rank saves `{"model": model.state_dict(), "shard_metadata":
model.get_shard_metadata(), ...}`, then the master stitches the files with consolidate_sharded_model_checkpoints.

With FSDP2 the per-rank state dict is this rank's DTensor shards (kept), the shard metadata has no counterpart and
no reader once the consolidation is native (its dict entry goes), and the consolidated model is
get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)): a collective, so it
is called on every rank before the master's `if`, and the master saves `{"model": ...}` where XLA did.
"""
from __future__ import annotations

import ast
import fnmatch

from neuron_migrate.program.distributed import function_of, scope_at
from neuron_migrate.rules.api import kwarg

XM = "torch_xla.core.xla_model"
STATE_DICT = "torch.distributed.checkpoint.state_dict"
_MASTER_TESTS = {f"{XM}.is_master_ordinal"}
# statements that may sit between the per-rank save and the consolidation: they leave the model as it was saved
_BETWEEN = {f"{XM}.rendezvous", f"{XM}.master_print", "print", "torch.distributed.barrier", f"{XM}.mark_step"}


def consolidation_edits(ctx, plan, fx, model_src: str, allowed: set) -> bool:
    """Edits for every get_shard_metadata() entry and consolidate call of the file; False where one is outside the
    shape (the finding stays). Each shard_metadata entry must be in a dict that a consolidation reads back (saved
    right before it): a file that saves shards for a consolidation elsewhere keeps XLA FSDP."""
    a = ctx.analysis
    if not plan.consolidate_uses:
        return False
    saved: list = []  # the dict literals the consolidations read back
    for node in plan.consolidate_uses:
        if not _consolidate(ctx, plan, fx, node, model_src, saved):
            return False
        allowed.add(id(node))
    for node in plan.metadata_uses:
        call = a.parent_of.get(node)
        holder = a.parent_of.get(call)
        if not (isinstance(call, ast.Call) and call.func is node and not call.args and not call.keywords
                and any(holder is d for d in saved) and call in holder.values):
            return False
        if not _drop_entry(ctx, fx, holder, holder.values.index(call)):
            return False
    return True


def _drop_entry(ctx, fx, d: ast.Dict, index: int) -> bool:
    """The dict literal without its entry `index`, its other entries written as they were, one per line where the
    literal had one per line."""
    if any(k is None for k in d.keys):
        return False
    rest = [(k, v) for i, (k, v) in enumerate(zip(d.keys, d.values)) if i != index]
    items = [f"{ctx.src_relative(k)}: {ctx.src_relative(v)}" for k, v in rest]
    if d.lineno == d.end_lineno:
        fx.replace(d, "{" + ", ".join(items) + "}")
        return True
    lines = ctx.analysis.lines
    if len({k.lineno for k in d.keys}) != len(d.keys) or d.keys[0].lineno == d.lineno:
        return False  # several entries on a line, or the first beside the brace: not rebuilt
    pad = " " * (len(lines[d.keys[0].lineno - 1]) - len(lines[d.keys[0].lineno - 1].lstrip(" ")))
    close = " " * (len(lines[d.end_lineno - 1]) - len(lines[d.end_lineno - 1].lstrip(" ")))
    base = " " * (len(lines[d.lineno - 1]) - len(lines[d.lineno - 1].lstrip(" ")))
    fx.replace(d, "{\n" + "".join(f"{pad[len(base):]}{item},\n" for item in items) + close[len(base):] + "}")
    return True


def _consolidate(ctx, plan, fx, node, model_src: str, saved: list) -> bool:
    a = ctx.analysis
    call = a.parent_of.get(node)
    stmt = a.parent_of.get(call)
    if not (isinstance(call, ast.Call) and call.func is node and isinstance(stmt, ast.Expr)):
        return False
    block = a.parent_of.get(stmt)
    if not (isinstance(block, ast.If) and block.body == [stmt] and not block.orelse and _is_master_test(ctx, block.test)):
        return False
    prefix = kwarg(call, "ckpt_prefix", 0)
    suffix = kwarg(call, "ckpt_suffix", 1)
    save_path = kwarg(call, "save_path", 2)
    save_model = kwarg(call, "save_model", 3)
    if prefix is None or any(isinstance(x, ast.Starred) for x in call.args) or any(k.arg is None for k in call.keywords):
        return False
    if save_model is not None and not (isinstance(save_model, ast.Constant) and save_model.value is True):
        return False
    if suffix is None:
        pattern = "*.pth"
    elif isinstance(suffix, ast.Constant) and isinstance(suffix.value, str):
        pattern = suffix.value
    else:
        return False
    save = _save_before(ctx, block)
    if save is None:
        return False
    held = _saved_shards(ctx, save, model_src, ctx.src(prefix), pattern)
    if held is None:
        return False
    saved.append(held)
    if save_path is not None and not (isinstance(save_path, ast.Constant) and save_path.value == ""):
        path = ctx.src(save_path)
    else:
        p = ctx.src(prefix)
        path = f'{p} + "_consolidated.pth"' if isinstance(prefix, (ast.Name, ast.Attribute, ast.Constant, ast.Call,
                                                                        ast.JoinedStr, ast.Subscript)) else f'({p}) + "_consolidated.pth"'
    taken = a.defined_names
    name = next(n for n in ("full_state_dict", "consolidated", "_full_state_dict") if n not in taken)
    get = fx.member(f"{STATE_DICT}.get_model_state_dict")
    opts = fx.member(f"{STATE_DICT}.StateDictOptions")
    torch = fx.ref("torch")
    fx.replace(block, f"{name} = {get}({model_src}, options={opts}(full_state_dict=True, cpu_offload=True))\n"
                      f"if {ctx.src(block.test)}:\n    {torch}.save({{\"model\": {name}}}, {path})\n")
    return True


def _is_master_test(ctx, test) -> bool:
    """xm.is_master_ordinal(local=False): global rank 0, the one rank get_model_state_dict(cpu_offload=True) fills
    (with the default local=True, each host's first rank consolidated: the finding stays)."""
    a = ctx.analysis
    if not (isinstance(test, ast.Call) and isinstance(test.func, (ast.Name, ast.Attribute))
            and a.resolve(test.func, scope_at(a, test), count_use=False) in _MASTER_TESTS):
        return False
    local = kwarg(test, "local", 0)
    return isinstance(local, ast.Constant) and local.value is False and len(test.args) + len(test.keywords) == 1


def _block_of(a, stmt):
    parent = a.parent_of.get(stmt)
    return next((b for b in (getattr(parent, f, None) for f in ("body", "orelse", "finalbody")) if isinstance(b, list)
                 and stmt in b), None)


def _save_before(ctx, block: ast.If):
    """The xm.save call earlier in the same statement list, with only barriers and prints between (the model is
    as saved), or None."""
    a = ctx.analysis
    body = _block_of(a, block)
    if body is None:
        return None
    for s in reversed(body[:body.index(block)]):
        if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)):
            return None
        f = s.value.func
        q = a.resolve(f, scope_at(a, s), count_use=False) if isinstance(f, (ast.Name, ast.Attribute)) else None
        if q is None and isinstance(f, ast.Name) and f.id == "print" and "print" not in a.defined_names:
            q = "print"
        if q == f"{XM}.save":
            return s.value
        if q not in _BETWEEN:
            return None
    return None


def _saved_shards(ctx, save: ast.Call, model_src: str, prefix_src: str, pattern: str):
    """The dict literal that `xm.save(D, path, master_only=False)` writes on every rank, when it holds "model":
    <model>.state_dict() and "shard_metadata": <model>.get_shard_metadata() (what the consolidation reads) and the
    path is the consolidation's prefix followed by a name its suffix pattern matches; else None."""
    a = ctx.analysis
    data = kwarg(save, "data", 0)
    path = kwarg(save, "file_or_path", 1)
    master_only = kwarg(save, "master_only", 2)
    if (data is None or path is None or not isinstance(master_only, ast.Constant) or master_only.value is not False
            or kwarg(save, "global_master", 3) is not None):
        return None
    if isinstance(data, ast.Name):
        data = _only_dict_assigned(ctx, save, data.id)
    if not isinstance(data, ast.Dict) or any(k is None for k in data.keys):
        return None
    entries = {k.value: v for k, v in zip(data.keys, data.values) if isinstance(k, ast.Constant)}
    for key, method in (("model", "state_dict"), ("shard_metadata", "get_shard_metadata")):
        v = entries.get(key)
        if not (isinstance(v, ast.Call) and not v.args and not v.keywords and isinstance(v.func, ast.Attribute)
                and v.func.attr == method and ctx.src(v.func.value) == model_src):
            return None
    rest = _after_prefix(ctx, path, prefix_src)
    if rest is None or not fnmatch.fnmatchcase(rest, pattern):
        return None
    return data


def _only_dict_assigned(ctx, save: ast.Call, name: str):
    """The dict literal `name = {...}` assigned earlier in the statement list of the save, when the function
    assigns `name` nowhere else."""
    a = ctx.analysis
    stmt = a.parent_of.get(save)
    body = _block_of(a, stmt)
    func = function_of(a, save)
    if body is None or func is None:
        return None
    stores = [n for n in ast.walk(func) if isinstance(n, ast.Name) and n.id == name and not isinstance(n.ctx, ast.Load)]
    for s in body[:body.index(stmt)]:
        if (isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name)
                and s.targets[0].id == name and isinstance(s.value, ast.Dict)):
            return s.value if stores == [s.targets[0]] else None
    return None


def _after_prefix(ctx, path, prefix_src: str):
    """The file name after the prefix, each formatted value read as '0' (ranks, sizes), when `path` is an
    f-string or a `+` chain of strings and f-strings that starts with the prefix; else None."""
    if isinstance(path, ast.JoinedStr) and path.values:
        head = path.values[0]
        if not (isinstance(head, ast.FormattedValue) and head.conversion == -1 and head.format_spec is None
                and ctx.src(head.value) == prefix_src):
            return None
        return "".join(v.value if isinstance(v, ast.Constant) else "0" for v in path.values[1:])
    parts = []
    while isinstance(path, ast.BinOp) and isinstance(path.op, ast.Add):
        parts.append(path.right)
        path = path.left
    if not parts or ctx.src(path) != prefix_src:
        return None
    text = ""
    for p in reversed(parts):
        if isinstance(p, ast.Constant) and isinstance(p.value, str):
            text += p.value
        elif isinstance(p, ast.JoinedStr):
            text += "".join(v.value if isinstance(v, ast.Constant) else "0" for v in p.values)
        else:
            return None  # a name or call: what it holds is not known here
    return text
