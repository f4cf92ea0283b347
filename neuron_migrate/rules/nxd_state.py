"""The one module `rewrite` writes for a program that used NeuronX Distributed (NM160): NxD's global state on native
torch.distributed.

NxD keeps its process groups in a global registry (`parallel_state`) that many files of a program query; pasted into
each file, a mesh would be one per file. So the rewritten files import this module where they imported
`neuronx_distributed.parallel_layers.parallel_state` (`import parallel_mesh as parallel_state`, `from parallel_mesh
import get_data_parallel_rank`) and their calls stay as written. It holds what depends on that state: the mesh and its
queries, the gradient average and clipping NxD's optimizer did in `step()`, and checkpoints with NxD's tag layout
(`<path>/<tag>`, `<path>/newest`), in torch.distributed.checkpoint format. cli/rewrite_run.py writes it beside the
files that import it. Never imported here (rewrite does not import torch): it is text.
"""
from __future__ import annotations

MODULE = "parallel_mesh"  # import name of the written module (parallel_mesh.py)
MARK = "[parallel_mesh]"  # in a Fix's description: the rewritten file imports the module

HEADER_LINE = '"""NeuronX Distributed\'s parallel_state, gradient reduction and checkpoints on native torch.distributed.'

# the names the module defines that NxD's parallel_state / grads modules also define (same call forms)
STATE_QUERIES = {
    "initialize_model_parallel", "model_parallel_is_initialized", "destroy_model_parallel",
    "get_tensor_model_parallel_rank", "get_tensor_model_parallel_size", "get_tensor_model_parallel_group",
    "get_tensor_model_parallel_src_rank", "get_data_parallel_rank", "get_data_parallel_size", "get_data_parallel_group",
}
GRADS = {"clip_grad_norm"}

TEXT = HEADER_LINE + '''

Written by neuron-migrate (`rewrite`, NM160) for the files that used neuronx_distributed: they import it where they
imported neuronx_distributed.parallel_layers.parallel_state. NxD's process groups are one DeviceMesh ("dp", "tp"):
tensor-parallel ranks adjacent (global rank = dp_rank * tp + tp_rank), as NxD laid them out. Pipeline parallelism is
not here (torch.distributed.pipelining, by hand).
"""
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.nn.utils import clip_grads_with_norm_, get_total_norm

mesh = None  # the DeviceMesh ("dp", "tp") once initialize_model_parallel has run


def initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1):
    global mesh
    if pipeline_model_parallel_size != 1:
        raise NotImplementedError("pipeline parallelism: use torch.distributed.pipelining (neuron-migrate NM160)")
    tp = tensor_model_parallel_size
    mesh = init_device_mesh("neuron", (dist.get_world_size() // tp, tp), mesh_dim_names=("dp", "tp"))


def model_parallel_is_initialized():
    return mesh is not None


def destroy_model_parallel():
    global mesh
    mesh = None


def get_tensor_model_parallel_rank():
    return mesh["tp"].get_local_rank()


def get_tensor_model_parallel_size():
    return mesh["tp"].size()


def get_tensor_model_parallel_group():
    return mesh["tp"].get_group()


def get_tensor_model_parallel_src_rank():
    return dist.get_rank() - mesh["tp"].get_local_rank()


def get_data_parallel_rank():
    return mesh["dp"].get_local_rank()


def get_data_parallel_size():
    return mesh["dp"].size()


def get_data_parallel_group():
    return mesh["dp"].get_group()


def clip_grad_norm(parameters, max_norm, norm_type=2):
    """NxD's clip_grad_norm: one norm over all gradients, tp-sharded (DTensor) and replicated (plain) together
    (torch.nn.utils.clip_grad_norm_ refuses the mix); returns the total norm."""
    params = [p for p in parameters if p.grad is not None]
    sharded = [p for p in params if isinstance(p.grad, DTensor)]
    plain = [p for p in params if not isinstance(p.grad, DTensor)]
    norms = []
    if sharded:
        norms.append(get_total_norm([p.grad for p in sharded], norm_type).full_tensor())
    if plain:
        norms.append(get_total_norm([p.grad for p in plain], norm_type))
    total = get_total_norm(norms, norm_type)
    for group in (sharded, plain):
        if group:
            clip_grads_with_norm_(group, max_norm, total)
    return total


def average_gradients(parameters):
    """What NxD's optimizer did first in step(): average the gradients over the data-parallel group."""
    size = mesh["dp"].size()
    if size == 1:
        return
    for p in parameters:
        if p.grad is not None:
            grad = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
            dist.all_reduce(grad, group=mesh["dp"].get_group())
            grad.div_(size)


def optimizer_step_pre_hook(max_grad_norm=None):
    """A hook for optimizer.register_step_pre_hook doing what nxd.initialize_parallel_optimizer's step did before the
    update: average the gradients over dp, then clip them to max_grad_norm (None: no clipping)."""

    def hook(optimizer, args, kwargs):
        params = [p for group in optimizer.param_groups for p in group["params"]]
        with torch.no_grad():
            average_gradients(params)
        if max_grad_norm is not None:
            clip_grad_norm(params, max_grad_norm)

    return hook


def _state(model, optimizer, scheduler):
    state = {}
    if model is not None:
        model_state, optim_state = get_state_dict(model, () if optimizer is None else optimizer)
        state["model"] = model_state
        if optimizer is not None:
            state["optimizer"] = optim_state
    if scheduler is not None:
        state["scheduler"] = scheduler.state_dict()
    return state


def save_checkpoint(path, tag, model=None, optimizer=None, scheduler=None, user_content=None, num_kept_ckpts=None):
    """nxd.save_checkpoint in torch.distributed.checkpoint format: <path>/<tag>/, and <path>/newest names the tag.
    With num_kept_ckpts, only that many checkpoints stay (the oldest saved here are removed, as NxD did)."""
    dcp.save(_state(model, optimizer, scheduler), checkpoint_id=os.path.join(path, tag))
    if dist.get_rank() == 0:
        torch.save(user_content, os.path.join(path, tag, "user_content.pt"))
        with open(os.path.join(path, "newest"), "w") as fh:
            fh.write(tag)
        if num_kept_ckpts:
            import shutil

            saved = sorted((os.path.getmtime(os.path.join(path, d, "user_content.pt")), d) for d in os.listdir(path)
                           if os.path.isfile(os.path.join(path, d, "user_content.pt")))
            for _mtime, old in saved[:-num_kept_ckpts]:
                if old != tag:
                    shutil.rmtree(os.path.join(path, old), ignore_errors=True)
    dist.barrier()


def has_checkpoint(path):
    return os.path.exists(os.path.join(path, "newest"))


def load_checkpoint(path, tag=None, model=None, optimizer=None, scheduler=None):
    """nxd.load_checkpoint of a checkpoint save_checkpoint wrote (tag None: the newest); returns its user_content."""
    if tag is None:
        with open(os.path.join(path, "newest")) as fh:
            tag = fh.read().strip()
    state = _state(model, optimizer, scheduler)
    dcp.load(state, checkpoint_id=os.path.join(path, tag))
    if model is not None:
        set_state_dict(model, () if optimizer is None else optimizer, model_state_dict=state["model"],
                       optim_state_dict=state.get("optimizer", {}))
    if scheduler is not None:
        scheduler.load_state_dict(state["scheduler"])
    return torch.load(os.path.join(path, tag, "user_content.pt"), weights_only=False)  # NxD pickled it too
'''
