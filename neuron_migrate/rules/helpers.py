"""Small functions a fix may insert into a user's module when no single expression keeps behaviour.

Each is inserted once, after the module's imports, under a `_neuron_` name, and only when used.
"""
from __future__ import annotations

from neuron_migrate.files.records import FrozenRecord


# A plain class (files/records.py), not a dataclass: importing dataclasses costs every start-up about 20 ms.
class Helper(FrozenRecord):
    """A helper function a fix may insert, with the imports its source needs."""

    _fields = ("source", "imports", "requires")

    def __init__(self, source: str, imports: dict = None, requires: tuple[str, ...] = ()):
        # source: {placeholders} are filled with the local spelling of the modules in `imports`
        # imports: placeholder -> module, e.g. {"dist": "torch.distributed"}
        self._set(source=source, imports=imports, requires=requires)


HELPERS: dict[str, Helper] = {
    "_neuron_rank": Helper(
        '''def _neuron_rank():
    """Global rank (xm.get_ordinal()); before init_process_group, torchrun's RANK."""
    if {dist}.is_available() and {dist}.is_initialized():
        return {dist}.get_rank()
    return int({os}.environ.get("RANK", 0))
''',
        {"dist": "torch.distributed", "os": "os"},
    ),
    "_neuron_world_size": Helper(
        '''def _neuron_world_size():
    """World size (xm.xrt_world_size()); before init_process_group, torchrun's WORLD_SIZE."""
    if {dist}.is_available() and {dist}.is_initialized():
        return {dist}.get_world_size()
    return int({os}.environ.get("WORLD_SIZE", 1))
''',
        {"dist": "torch.distributed", "os": "os"},
    ),
    "_neuron_local_rank": Helper(
        '''def _neuron_local_rank():
    """Rank within this host (torchrun sets LOCAL_RANK), as xm.get_local_ordinal() was."""
    return int({os}.environ.get("LOCAL_RANK", 0))
''',
        {"os": "os"},
    ),
    "_neuron_policy_modules": Helper(
        '''def _neuron_policy_modules(model, policy):
    """The submodules XLA FSDP's auto_wrap_policy wrapped, innermost first (the order FSDP2 shards in), chosen as
    its recursive wrap chose them: the policy is asked about a module with the parameters of its subtree, and if
    yes about its children, then about the module with the parameters its wrapped children left (the model itself
    is not among them: it is sharded last, by the caller)."""
    chosen = []

    def visit(module, root):
        numel = sum(p.numel() for p in module.parameters())
        if not policy(module=module, recurse=True, nonwrapped_numel=numel):
            return 0
        wrapped = sum(visit(child, False) for child in module.children())
        if not root and policy(module=module, recurse=False, nonwrapped_numel=numel - wrapped):
            chosen.append(module)
            return numel
        return wrapped

    visit(model, True)
    return chosen
''',
    ),
    "_accelerator_device": Helper(
        '''def _accelerator_device():
    """This process's accelerator (neuron, cuda, ...), or the CPU when there is none."""
    return {torch}.accelerator.current_accelerator() if {torch}.accelerator.is_available() else {torch}.device("cpu")
''',
        {"torch": "torch"},
    ),
}
