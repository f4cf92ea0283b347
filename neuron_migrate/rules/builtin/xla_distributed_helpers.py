"""Helper functions the torch_xla distributed fixes (NM110-NM129) insert into user code.

Registered into `neuron_migrate.rules.helpers.HELPERS` on import. Sources are `str.format` templates:
`{dist}`, `{torch}`, `{os}` become the local spelling of those modules; literal braces are doubled.
Every helper keeps the torch_xla call's signature where it stands in for a function used as a value, and
behaves as the torch_xla call did when torch.distributed is not initialised (one process).
"""
from __future__ import annotations

from neuron_migrate.rules.helpers import HELPERS, Helper

_DIST = {"dist": "torch.distributed"}

NEW_HELPERS = {
    "_neuron_ordinal": Helper(
        '''def _neuron_ordinal(defval=0):
    """Global rank; `defval` when torch.distributed is not initialised (as xm.get_ordinal(defval) did)."""
    return {dist}.get_rank() if {dist}.is_available() and {dist}.is_initialized() else defval
''',
        _DIST,
    ),
    "_neuron_xrt_world_size": Helper(
        '''def _neuron_xrt_world_size(defval=1):
    """World size; `defval` when torch.distributed is not initialised (as xm.xrt_world_size(defval) did)."""
    return {dist}.get_world_size() if {dist}.is_available() and {dist}.is_initialized() else defval
''',
        _DIST,
    ),
    "_neuron_local_ordinal": Helper(
        '''def _neuron_local_ordinal(defval=0):
    """Rank within this host (torchrun sets LOCAL_RANK), as xm.get_local_ordinal(defval) was."""
    return int({os}.environ.get("LOCAL_RANK", defval))
''',
        {"os": "os"},
    ),
    "_neuron_local_world_size": Helper(
        '''def _neuron_local_world_size():
    """Processes on this host (torchrun sets LOCAL_WORLD_SIZE), as xr.local_process_count() was."""
    return int({os}.environ.get("LOCAL_WORLD_SIZE", 1))
''',
        {"os": "os"},
    ),
    "_neuron_is_master_ordinal": Helper(
        '''def _neuron_is_master_ordinal(local=True):
    """True on rank 0 of this host (local=True, the default) or on global rank 0, as xm.is_master_ordinal was."""
    return (_neuron_local_rank() if local else _neuron_rank()) == 0
''',
        {},
        ("_neuron_rank", "_neuron_local_rank"),
    ),
    "_neuron_master_print": Helper(
        '''def _neuron_master_print(*args, fd=None, local=False, flush=False):
    """print() on global rank 0 only (local=True: on rank 0 of each host), as xm.master_print did."""
    if (_neuron_local_rank() if local else _neuron_rank()) == 0:
        print(*args, file=fd, flush=flush)
''',
        {},
        ("_neuron_rank", "_neuron_local_rank"),
    ),
    # xm.master_print where every call of the file passes only what to print (no fd=, local=, flush=)
    "_neuron_rank0_print": Helper(
        '''def _neuron_rank0_print(*args):
    """print() on global rank 0 only, as xm.master_print did."""
    if _neuron_rank() == 0:
        print(*args)
''',
        {},
        ("_neuron_rank",),
    ),
    "_neuron_barrier": Helper(
        '''def _neuron_barrier(tag=None):
    """Wait until every process gets here, as xm.rendezvous(tag) did; nothing to wait for in one process."""
    if {dist}.is_available() and {dist}.is_initialized() and {dist}.get_world_size() > 1:
        {dist}.barrier()
''',
        _DIST,
    ),
    "_neuron_rendezvous": Helper(
        '''def _neuron_rendezvous(tag=None, payload=b"", replicas=()):
    """All processes meet and exchange `payload`; returns the list of every rank's payload (xm.rendezvous)."""
    if replicas:
        raise NotImplementedError("rendezvous among a subset of replicas: use a group made once with dist.new_group")
    if not ({dist}.is_available() and {dist}.is_initialized()):
        return [payload]
    out = [None] * {dist}.get_world_size()
    {dist}.all_gather_object(out, payload)
    return out
''',
        _DIST,
    ),
    "_neuron_reduce_gradients": Helper(
        '''def _neuron_reduce_gradients(optimizer):
    """Average the gradients of `optimizer` over all processes, as xm.reduce_gradients() did."""
    if {dist}.is_initialized() and {dist}.get_world_size() > 1:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    {dist}.all_reduce(p.grad)
                    p.grad /= {dist}.get_world_size()
''',
        _DIST,
    ),
    "_neuron_average_gradients": Helper(
        '''def _neuron_average_gradients(optimizer):
    """Average the gradients over all processes (xm.optimizer_step did this before stepping)."""
    world_size = {dist}.get_world_size()
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is not None:
                {dist}.all_reduce(p.grad)
                p.grad /= world_size
''',
        _DIST,
    ),
    "_neuron_optimizer_step": Helper(
        '''def _neuron_optimizer_step(optimizer, barrier=False, optimizer_args={{}}, groups=None, pin_layout=True):
    """Average gradients over all processes, then step; returns what optimizer.step() returns (xm.optimizer_step)."""
    if groups:
        raise NotImplementedError("gradients over replica groups: use DDP with a group made by dist.new_group")
    _neuron_reduce_gradients(optimizer)
    return optimizer.step(**optimizer_args)
''',
        {},
        ("_neuron_reduce_gradients",),
    ),
    "_neuron_all_reduce": Helper(
        '''def _neuron_all_reduce(reduce_type, inputs, scale=1.0, groups=None, pin_layout=True):
    """xm.all_reduce: a tensor is reduced out of place (a new tensor is returned, the input is unchanged),
    a list of tensors in place (the list is returned); the result is multiplied by `scale`."""
    if groups:
        raise NotImplementedError("all_reduce over replica groups: make the group once with dist.new_group and pass group=")
    single = isinstance(inputs, {torch}.Tensor)
    if not ({dist}.is_available() and {dist}.is_initialized()) or {dist}.get_world_size() == 1:
        return inputs.clone() if single else inputs
    ops = {{"sum": "SUM", "mul": "PRODUCT", "and": "BAND", "or": "BOR", "min": "MIN", "max": "MAX"}}
    op = getattr({dist}.ReduceOp, ops[reduce_type])
    tensors = [inputs.clone()] if single else list(inputs)
    for t in tensors:
        {dist}.all_reduce(t, op=op)
        if scale != 1.0:
            t.mul_(scale)
    return tensors[0] if single else inputs
''',
        {"dist": "torch.distributed", "torch": "torch"},
    ),
    "_neuron_all_gather": Helper(
        '''def _neuron_all_gather(value, dim=0, groups=None, output=None, pin_layout=True, channel_id=None, use_global_device_ids=None):
    """xm.all_gather: one tensor holding every rank's `value` concatenated along `dim` (a list: one per item)."""
    if groups:
        raise NotImplementedError("all_gather over replica groups: make the group once with dist.new_group and pass group=")
    if not isinstance(value, {torch}.Tensor):
        outs = output if output is not None else [None] * len(value)
        return [_neuron_all_gather(v, dim, output=o) for v, o in zip(value, outs)]
    if {dist}.is_available() and {dist}.is_initialized() and {dist}.get_world_size() > 1:
        parts = [{torch}.empty_like(value) for _ in range({dist}.get_world_size())]
        {dist}.all_gather(parts, value.contiguous())
    else:
        parts = [value]
    result = {torch}.cat(parts, dim=dim)
    if output is not None:
        output.copy_(result)
        return output
    return result
''',
        {"dist": "torch.distributed", "torch": "torch"},
    ),
    "_neuron_reduce_scatter": Helper(
        '''def _neuron_reduce_scatter(reduce_type, input, scale, scatter_dim, shard_count, groups=None, output=None,
                           pin_layout=True, channel_id=None, use_global_device_ids=None):
    """xm.reduce_scatter: reduce `input` over all ranks and return this rank's shard along `scatter_dim`, times `scale`."""
    if groups:
        raise NotImplementedError("reduce_scatter over replica groups: make the group once with dist.new_group and pass group=")
    ready = {dist}.is_available() and {dist}.is_initialized()
    world = {dist}.get_world_size() if ready else 1
    if shard_count != world:
        raise ValueError(f"shard_count={{shard_count}} must equal the world size {{world}}")
    chunks = [c.contiguous() for c in input.chunk(world, dim=scatter_dim)]
    if world > 1:
        ops = {{"sum": "SUM", "mul": "PRODUCT", "and": "BAND", "or": "BOR", "min": "MIN", "max": "MAX"}}
        result = {torch}.empty_like(chunks[0])
        {dist}.reduce_scatter(result, chunks, op=getattr({dist}.ReduceOp, ops[reduce_type]))
    else:
        result = chunks[0].clone()
    if scale != 1.0:
        result.mul_(scale)
    if output is not None:
        output.copy_(result)
        return output
    return result
''',
        {"dist": "torch.distributed", "torch": "torch"},
    ),
    "_neuron_to_cpu": Helper(
        '''def _neuron_to_cpu(data, memo=None):
    """`data` with every tensor moved to the CPU (dicts, lists and tuples are walked; a shared tensor stays shared)."""
    memo = {{}} if memo is None else memo
    if isinstance(data, {torch}.Tensor):
        if id(data) not in memo:
            memo[id(data)] = data.detach().cpu()
        return memo[id(data)]
    if isinstance(data, dict):
        return {{k: _neuron_to_cpu(v, memo) for k, v in data.items()}}
    if isinstance(data, (list, tuple)):
        return [_neuron_to_cpu(v, memo) for v in data]  # xm.save also wrote sequences as lists
    return data
''',
        {"torch": "torch"},
    ),
    "_neuron_mesh_reduce": Helper(
        '''def _neuron_mesh_reduce(tag, data, reduce_fn):
    """xm.mesh_reduce: gather `data` (moved to CPU) from every rank and return reduce_fn(list of them)."""
    cpu_data = _neuron_to_cpu(data)
    if not ({dist}.is_available() and {dist}.is_initialized()):
        return reduce_fn([cpu_data])
    gathered = [None] * {dist}.get_world_size()
    {dist}.all_gather_object(gathered, cpu_data)
    return reduce_fn(gathered)
''',
        _DIST,
        ("_neuron_to_cpu",),
    ),
    "_neuron_collective_broadcast": Helper(
        '''def _neuron_collective_broadcast(tensors, root_ordinal=0, groups=None, pin_layout=True):
    """xm.collective_broadcast: overwrite each tensor in place with global rank `root_ordinal`'s values."""
    if groups:
        raise NotImplementedError("broadcast over replica groups: make the group once with dist.new_group and pass group=")
    if {dist}.is_available() and {dist}.is_initialized() and {dist}.get_world_size() > 1:
        for t in tensors:
            {dist}.broadcast(t, src=root_ordinal)
''',
        _DIST,
    ),
    "_neuron_broadcast_master_param": Helper(
        '''def _neuron_broadcast_master_param(model):
    """Copy rank 0's parameters and buffers to every rank, as xm.broadcast_master_param did."""
    if {dist}.is_available() and {dist}.is_initialized() and {dist}.get_world_size() > 1:
        for t in [*model.parameters(), *model.buffers()]:
            {dist}.broadcast(t.data, src=0)
''',
        _DIST,
    ),
    "_neuron_save": Helper(
        '''def _neuron_save(data, file_or_path, master_only=True, global_master=False):
    """xm.save: torch.save of `data` moved to the CPU, written by rank 0 of each host (global_master=True:
    by global rank 0 only; master_only=False: by every rank); then all ranks wait for each other."""
    if not master_only or (_neuron_rank() if global_master else {dist}.get_node_local_rank(fallback_rank=0)) == 0:
        {torch}.save(_neuron_to_cpu(data), file_or_path)
    _neuron_barrier()
''',
        {"torch": "torch", "dist": "torch.distributed"},
        ("_neuron_rank", "_neuron_to_cpu", "_neuron_barrier"),
    ),
    "_neuron_run_serially": Helper(
        '''def _neuron_run_serially(fn):
    """fn() on one process of this host at a time, as xmp.MpSerialExecutor().run(fn) did; returns its result."""
    if not ({dist}.is_available() and {dist}.is_initialized()):
        return fn()
    result = None
    for turn in range(int({os}.environ.get("LOCAL_WORLD_SIZE", 1))):
        if {dist}.get_node_local_rank(fallback_rank=0) == turn:
            result = fn()
        {dist}.barrier()
    return result
''',
        {"dist": "torch.distributed", "os": "os"},
    ),
    "_neuron_serial_executor": Helper(
        '''def _neuron_serial_executor():
    """Stand-in for xmp.MpSerialExecutor(): .run(fn) runs fn on one process of this host at a time."""

    class _SerialExecutor:
        def run(self, fn):
            return _neuron_run_serially(fn)

    return _SerialExecutor()
''',
        {},
        ("_neuron_run_serially",),
    ),
}

for _name, _helper in NEW_HELPERS.items():
    HELPERS.setdefault(_name, _helper)
