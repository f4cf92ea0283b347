"""The Trainium training stack built on torch_xla (NM160-NM169): NeuronX Distributed (NxD), optimum-neuron's XLA
trainers, and NKI kernels called from model code.

NxD is torch_xla underneath (its layers call xm collectives, its checkpoints are xser files) and its training library
is at end of support; TorchNeuron's documented path is DTensor tensor parallelism, FSDP2 and
torch.distributed.checkpoint. Every import, call and reference is reported at its line with the native API that
replaces it and what changes in behaviour; NM160 rewrites NxD's common core where it keeps meaning (nxd_fixes.py),
and cli/rewrite_run.py counts a file that still imports one of these libraries as not migrated (files/xla_deps.py).
"""
from __future__ import annotations

import ast

from neuron_migrate.rules.api import const_value, kwarg, rule
from neuron_migrate.rules.builtin.nxd_fixes import nxd_fix
from neuron_migrate.rules.builtin.xla_core import remove_unused_import

NATIVE_TUTORIAL = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/torch/tutorials/tutorial-torch-distributed.html"
NATIVE_FAQ = "https://github.com/aws-neuron/aws-neuron-sdk/blob/master/frameworks/torch/pytorch-native-overview.rst"

_MESH = 'mesh = init_device_mesh("neuron", (dp, tp), mesh_dim_names=("dp", "tp")) (torch.distributed.device_mesh)'
_DCP = ("torch.distributed.checkpoint.save/load of get_state_dict(model, optimizer) / set_state_dict "
        "(torch.distributed.checkpoint.state_dict); NxD's per-rank xser checkpoints do not load: convert them once "
        "with NxD installed")
_ZERO = ("DDP over the dp group (DistributedDataParallel(model, device_mesh=mesh['dp']) or process_group=) + "
         "torch.distributed.optim.ZeroRedundancyOptimizer(params, optimizer_class, process_group=mesh['dp'].get_group()); "
         "or FSDP2 fully_shard(block, mesh=mesh['dp']) on each block then the model. torch's ZeroRedundancyOptimizer does "
         "not average gradients (NxD's reduce-scattered them itself): without DDP/FSDP2 the ranks train on their own "
         "gradients. Gradient clipping: torch.nn.utils.clip_grad_norm_ (DTensor-aware) before step(); fp32 master "
         "weights: keep the parameters fp32 and use autocast or MixedPrecisionPolicy(param_dtype=torch.bfloat16)")
_PP = ("torch.distributed.pipelining (pipeline()/SplitPoint or PipelineStage + ScheduleGPipe/Schedule1F1B) on a "
       "'pp' mesh dimension; NxD's traced partitioning and its schedule options do not carry over")

# NxD name -> (what it is, its native plan). Looked up by the last component of the qualified name that has an
# entry (`...parallel_layers.layers.ColumnParallelLinear` -> ColumnParallelLinear; an import of
# `...parallel_layers.parallel_state` -> parallel_state).
NXD_PLANS = {
    # -- process groups ---------------------------------------------------------------------------------------
    "parallel_state": ("NxD's process-group registry",
                       f"a DeviceMesh: {_MESH}; its queries become mesh['tp'/'dp'].get_local_rank() / .size() / .get_group()"),
    "initialize_model_parallel": ("builds NxD's tp/pp/dp groups",
                                  f"{_MESH}, with dp = world_size // tp (pipeline_model_parallel_size > 1: add a 'pp' "
                                  "dimension and torch.distributed.pipelining)"),
    "model_parallel_is_initialized": ("tests whether NxD's groups exist", "keep the DeviceMesh and test it (mesh is not None), or dist.is_initialized()"),
    "destroy_model_parallel": ("drops NxD's groups", "dist.destroy_process_group() at the end (the mesh goes with it)"),
    "get_tensor_model_parallel_rank": ("rank within the tp group", "mesh['tp'].get_local_rank()"),
    "get_tensor_model_parallel_size": ("size of the tp group", "mesh['tp'].size()"),
    "get_tensor_model_parallel_group": ("the tp process group", "mesh['tp'].get_group()"),
    "get_tensor_model_parallel_src_rank": ("global rank of tp rank 0", "mesh['tp'].mesh[0].item() (the global rank at tp coordinate 0 of this row)"),
    "get_tensor_model_parallel_replica_groups": ("XLA replica groups of tp", "mesh['tp'].get_group() (collectives take a group, not replica lists)"),
    "get_data_parallel_rank": ("rank within the dp group", "mesh['dp'].get_local_rank()"),
    "get_data_parallel_size": ("size of the dp group", "mesh['dp'].size()"),
    "get_data_parallel_group": ("the dp process group", "mesh['dp'].get_group()"),
    "get_data_parallel_replica_groups": ("XLA replica groups of dp", "group=mesh['dp'].get_group() in dist.all_reduce & co."),
    "get_pipeline_model_parallel_rank": ("rank within the pp group", f"mesh['pp'].get_local_rank(); pipelining: {_PP}"),
    "get_pipeline_model_parallel_size": ("size of the pp group", f"mesh['pp'].size(); pipelining: {_PP}"),
    "get_pipeline_model_parallel_group": ("the pp process group", f"mesh['pp'].get_group(); pipelining: {_PP}"),
    "get_kv_shared_group": ("NxD's group of ranks sharing replicated KV heads", "no native group: replicate the KV heads in the model (repeat_interleave) so tp divides them"),
    "rmsg": ("NxD's rank-prefixed log message", "an f-string with dist.get_rank()"),
    # -- layers -------------------------------------------------------------------------------------------------
    "layers": ("NxD's parallel layers", "nn.Linear / nn.Embedding plus one parallelize_module(model, mesh['tp'], plan) where the model is built"),
    "ColumnParallelLinear": ("a Linear whose output features are split over tp",
                             "nn.Linear(in, out, bias=...) + ColwiseParallel() in a parallelize_module plan"),
    "RowParallelLinear": ("a Linear whose input features are split over tp, outputs all-reduced",
                          "nn.Linear(in, out, bias=...) + RowwiseParallel() in a parallelize_module plan"),
    "ParallelEmbedding": ("an Embedding whose vocabulary is split over tp",
                          "nn.Embedding(num, dim) + RowwiseParallel() in the plan (vocab-sharded; "
                          "shard_across_embedding=True: ColwiseParallel())"),
    "GQAQKVColumnParallelLinear": ("fused q/k/v projections with KV heads replicated to a multiple of tp",
                                   "three nn.Linear (q_proj, k_proj, v_proj) each with ColwiseParallel(); kv_size_multiplier "
                                   "> 1 (fewer KV heads than tp) has no DTensor equivalent: replicate the KV heads by hand, "
                                   "and the fused weight's layout changes (checkpoints need converting)"),
    "qkv_linear": ("NxD's GQA q/k/v module", "separate nn.Linear projections with ColwiseParallel() (see GQAQKVColumnParallelLinear)"),
    "OutputChannelParallelConv2d": ("a Conv2d split over output channels", "nn.Conv2d with distribute_module / a custom ParallelStyle (no built-in DTensor conv plan)"),
    "InputChannelParallelConv2d": ("a Conv2d split over input channels", "nn.Conv2d with distribute_module / a custom ParallelStyle (no built-in DTensor conv plan)"),
    "LayerNorm": ("NxD's LayerNorm (sequence-parallel aware)", "nn.LayerNorm, with SequenceParallel() in the plan when sequence parallelism is on"),
    "parallel_cross_entropy": ("cross entropy on vocab-sharded logits",
                               "F.cross_entropy on logits gathered by the LM head's ColwiseParallel(output_layouts=Replicate()), "
                               "or under torch.distributed.tensor.parallel.loss_parallel() with the head's "
                               "ColwiseParallel(use_local_output=False) (no gather)"),
    "mappings": ("NxD's tp collectives as autograd functions",
                 "DTensor layouts in the plan (input_layouts/output_layouts) or DTensor.redistribute(); by hand: "
                 "torch.distributed._functional_collectives (all_gather_tensor, reduce_scatter_tensor, all_reduce)"),
    "gather_from_tensor_model_parallel_region": ("all-gather over tp in forward", "output_layouts=Replicate() in the plan, or dtensor.redistribute(mesh['tp'], [Replicate()])"),
    "scatter_to_tensor_model_parallel_region": ("split over tp in forward", "input_layouts=Replicate() on a RowwiseParallel, or distribute_tensor(x, mesh['tp'], [Shard(-1)])"),
    "reduce_from_tensor_model_parallel_region": ("all-reduce over tp in forward", "RowwiseParallel's output (Partial -> Replicate), or dist.all_reduce(x, group=mesh['tp'].get_group())"),
    "copy_to_tensor_model_parallel_region": ("identity forward, all-reduce backward", "ColwiseParallel's input (Replicate) does this"),
    "gather_from_sequence_parallel_region": ("sequence-parallel all-gather", "SequenceParallel() / ColwiseParallel(input_layouts=Shard(1)) in the plan"),
    "reduce_scatter_to_sequence_parallel_region": ("sequence-parallel reduce-scatter", "RowwiseParallel(output_layouts=Shard(1)) in the plan"),
    "scatter_to_sequence_parallel_region": ("sequence-parallel split", "SequenceParallel() / PrepareModuleInput(desired_input_layouts=(Shard(1),))"),
    # -- grads, random, utils ---------------------------------------------------------------------------------
    "grads": ("NxD's gradient utilities", "torch.nn.utils.clip_grad_norm_ (handles DTensor parameters) and DDP/FSDP2 for reduction"),
    "clip_grad_norm": ("global gradient-norm clipping over tp/dp",
                       "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm) under DDP or FSDP2; under a tp plan, "
                       "where replicated parameters (norm weights) stay plain tensors beside DTensors, clip_grad_norm_ "
                       "raises 'mixed torch.Tensor and DTensor': take torch.nn.utils.get_total_norm of each kind (the "
                       "DTensor one .full_tensor()), combine them, and call clip_grads_with_norm_ on each kind"),
    "bucket_allreduce_gradients": ("NxD's dp gradient all-reduce", "DistributedDataParallel over mesh['dp'] (or FSDP2) averages the gradients"),
    "random": ("NxD's XLA RNG tracker", "torch.manual_seed(seed) on every rank; DTensor keeps dropout in tp regions consistent itself"),
    "model_parallel_xla_manual_seed": ("seeds NxD's XLA RNG tracker", "torch.manual_seed(seed) (same on every rank: DTensor's RNG tracker offsets sharded random ops)"),
    "get_xla_rng_tracker": ("NxD's XLA RNG tracker", "none needed: DTensor handles random ops on sharded tensors (torch.distributed.tensor._random)"),
    "move_model_to_device": ("moves an NxD model to the XLA device", 'model.to("neuron") before parallelize_module / fully_shard'),
    "requires_init_pg_override": ("an NxD/XLA process-group workaround", "delete it: dist.init_process_group(\"neuron\") needs none"),
    "utils": ("NxD utilities", "plain Python / torch.distributed per call (e.g. divide(n, tp) -> n // mesh['tp'].size(); "
                               "each call has its own finding)"),
    "divide": ("integer division that asserts divisibility", "n // mesh['tp'].size() (assert n % mesh['tp'].size() == 0)"),
    "get_local_world_size": ("processes per node", "int(os.environ['LOCAL_WORLD_SIZE']) (torchrun sets it)"),
    "is_pjrt_device": ("tests for the XLA PJRT runtime", "delete: always False on TorchNeuron (torch.distributed with the neuron backend)"),
    "EmbeddingUtility": ("NxD embedding helper", "nn.Embedding with RowwiseParallel() in the plan"),
    "AdamW_FP32OptimParams": ("AdamW keeping fp32 master copies of bf16 parameters",
                              "torch.optim.AdamW on fp32 parameters with torch.autocast(\"neuron\", dtype=torch.bfloat16), "
                              "or FSDP2 with MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)"),
    "adamw_fp32_optim_params": ("AdamW with fp32 master weights", "see AdamW_FP32OptimParams"),
    "activation_checkpoint": ("NxD activation checkpointing", "torch.distributed.algorithms._checkpoint.checkpoint_wrapper.apply_activation_checkpointing(model, check_fn=...)"),
    "apply_activation_checkpointing": ("NxD activation checkpointing", "torch.distributed.algorithms._checkpoint.checkpoint_wrapper.apply_activation_checkpointing"),
    # -- trainer API (nxd.*) ---------------------------------------------------------------------------------
    "trainer": ("NxD's trainer API (config, model, optimizer, checkpoints)", "a DeviceMesh + parallelize_module + DDP/FSDP2 + torch.distributed.checkpoint (see each call)"),
    "neuronx_distributed_config": ("NxD's parallelism config",
                                   f"{_MESH} for tensor_parallel_size; pipeline_parallel_size > 1: {_PP}; optimizer_config "
                                   "zero_one_enabled: see initialize_parallel_optimizer; sequence_parallel: SequenceParallel() "
                                   "in the plan; activation_checkpoint_config: apply_activation_checkpointing; "
                                   "mixed_precision_config: autocast or MixedPrecisionPolicy; model_init_config "
                                   "(meta_device_init): build on torch.device(\"meta\") then to_empty(device=\"neuron\") and init"),
    "initialize_parallel_model": ("builds the model and shards it over tp (and pp)",
                                  "build the plain model, then parallelize_module(model, mesh['tp'], {'...q_proj': "
                                  "ColwiseParallel(), '...o_proj': RowwiseParallel(), ...}) and, for dp, "
                                  "DistributedDataParallel(model, device_mesh=mesh['dp']) or fully_shard(block, mesh=mesh['dp']) "
                                  "per block; the result is the module itself (no NxDModel wrapper, no run_train)"),
    "initialize_parallel_optimizer": ("builds the optimizer, ZeRO-1 sharded over dp when zero_one_enabled",
                                      f"{_ZERO}; optimizer.grad_norm does not exist: keep the value clip_grad_norm_ returns"),
    "save_checkpoint": ("NxD's sharded checkpoint (xser, per tp/pp rank)", _DCP),
    "load_checkpoint": ("loads an NxD sharded checkpoint", _DCP),
    "has_checkpoint": ("tests for an NxD checkpoint", "os.path.exists(os.path.join(path, \".metadata\")) on the torch.distributed.checkpoint folder"),
    "finalize_checkpoint": ("waits for NxD's async checkpoint", "torch.distributed.checkpoint.async_save(...).result()"),
    "checkpointing": ("NxD's checkpoint module", _DCP),
    "NxDModel": ("NxD's model wrapper", "the plain module after parallelize_module / fully_shard"),
    "NxDOptimizer": ("NxD's optimizer wrapper", _ZERO),
    "NeuronZero1Optimizer": ("NxD's ZeRO-1 optimizer", _ZERO),
    "zero_redundancy_optimizer": ("NxD's ZeRO-1 optimizer", _ZERO),
    "optimizer": ("NxD's optimizer wrappers (ZeRO-1)", _ZERO),
    "convert_zero_checkpoints": ("converts NxD ZeRO-1 checkpoints", "run it once under NxD; new runs save with torch.distributed.checkpoint"),
    # -- pipeline, modules, kernels ---------------------------------------------------------------------------
    "pipeline": ("NxD pipeline parallelism", _PP),
    "NxDPPModel": ("NxD's pipeline-parallel model", _PP),
    "modules": ("NxD model modules", "the plain torch.nn module each replaces, sharded by a parallelize_module plan (each class has its own finding)"),
    "moe": ("NxD mixture-of-experts layers", "experts as nn.Modules sharded with DTensor (expert parallelism by hand); torch._grouped_mm for grouped GEMMs"),
    "lora": ("NxD LoRA", "peft on the plain model before parallelize_module"),
    "ring_attention_kernel": ("NxD's NKI ring-attention kernel (context parallelism)",
                              "torch.distributed.tensor.experimental.context_parallel(mesh['cp'], buffers=..., buffer_seq_dims=...) "
                              "around F.scaled_dot_product_attention"),
    "nki_ring_attn_func": ("NxD's NKI ring attention (context parallelism)",
                           "torch.distributed.tensor.experimental.context_parallel around F.scaled_dot_product_attention"),
    "flash_attn": ("NxD's NKI flash attention", "F.scaled_dot_product_attention (TorchNeuron lowers it to its fused attention)"),
    "nki_flash_attn_func": ("NxD's NKI flash attention", "F.scaled_dot_product_attention(q, k, v, is_causal=True) (TorchNeuron lowers it to its fused attention)"),
    "overrides": ("NxD's patched transformers functions", "the plain transformers functions (e.g. transformers' apply_rotary_pos_emb)"),
    "apply_rotary_pos_emb": ("NxD's rotary embedding override", "transformers.models.llama.modeling_llama.apply_rotary_pos_emb (or the model's own)"),
    "kernels": ("NxD's NKI kernels (flash attention and others)", "F.scaled_dot_product_attention (TorchNeuron lowers it to fused attention), or the kernel as an NKI op (NM162)"),
    "lightning": ("NxD's PyTorch Lightning integration (XLA strategy)",
                  "Lightning with a native strategy (ModelParallelStrategy / FSDPStrategy) on the neuron device is unverified; "
                  "a plain torch training loop under torchrun is the documented path"),
    "scripts": ("NxD checkpoint scripts", "run once under NxD to convert; new checkpoints use torch.distributed.checkpoint"),
    "quantization": ("NxD quantization", "no native training equivalent documented: by hand"),
    "neuronx_distributed": ("NeuronX Distributed (on torch_xla; training at end of support)",
                            "DTensor tensor parallelism (init_device_mesh(\"neuron\"), parallelize_module), FSDP2 and "
                            "torch.distributed.checkpoint: each use has its own finding"),
    "neuronx_distributed_training": ("NxD Training (NeMo-based, on torch_xla; end of support)",
                                     "TorchTitan or a plain torchrun training loop with DTensor TP + FSDP2; its YAML configs "
                                     "do not carry over"),
}
_GENERIC = ("DTensor tensor parallelism (init_device_mesh(\"neuron\"), parallelize_module), FSDP2 fully_shard, "
            "torch.distributed.checkpoint or torch.distributed.pipelining, by hand")


# parallel_state queries by the group they ask about: (what, mesh dimension, what else the native path needs)
_GROUP_QUERIES = (
    ("tensor_model_parallel", "the tp group", "tp", ""),
    ("data_parallel", "the dp group", "dp", ""),
    ("pipeline_model_parallel", "the pp group", "pp", f"; pipelining: {_PP}"),
    ("context_model_parallel", "the context-parallel group", "cp",
     "; context parallelism: torch.distributed.tensor.experimental.context_parallel over mesh['cp'] (ring attention "
     "around F.scaled_dot_product_attention); NxD's src/tgt pairs have no equivalent"),
    ("expert_model_parallel", "the expert-parallel group", "ep", "; expert parallelism has no built-in DTensor plan: shard the experts by hand"),
)


def _group_query(name: str):
    for marker, what, dim, extra in _GROUP_QUERIES:
        if name.startswith("get_") and marker in name:
            call = ".get_local_rank()" if name.endswith("_rank") else ".size()" if name.endswith(("_size", "_world_size")) else ".get_group()"
            return f"a parallel_state query of {what}", f"mesh['{dim}']{call} on a DeviceMesh with a '{dim}' dimension{extra}"
    return None


def nxd_plan(key: str) -> tuple[str, str, str]:
    """(the NxD name shown, what it is, its native plan) for a qualified name in neuronx_distributed."""
    parts = key.split(".")
    for part in reversed(parts):
        if part in NXD_PLANS:
            what, plan = NXD_PLANS[part]
            return part, what, plan
        query = _group_query(part)
        if query is not None:
            return (part, *query)
    return parts[-1], "an NxD API with no specific plan", _GENERIC


def _layer_plan(name: str, call: ast.Call) -> str:
    """The plan for one ColumnParallelLinear / RowParallelLinear / ParallelEmbedding call, by its arguments."""
    extra = []
    if name == "ColumnParallelLinear":
        g = kwarg(call, "gather_output", 3)
        gv = const_value(g, True if g is None else None)
        if gv is True:
            style = "ColwiseParallel(output_layouts=Replicate())  (gather_output=True: the output is all-gathered)"
        elif gv is False:
            style = "ColwiseParallel()  (gather_output=False: the output stays split on its last dim)"
        else:
            style = "ColwiseParallel() or ColwiseParallel(output_layouts=Replicate()) as gather_output is False/True"
        head = "nn.Linear(in, out, bias=...) + " + style
    elif name == "RowParallelLinear":
        p = kwarg(call, "input_is_parallel", 3)
        pv = const_value(p, False if p is None else None)
        if pv is True:
            style = "RowwiseParallel()  (input_is_parallel=True: input split on its last dim, output all-reduced)"
        elif pv is False:
            style = "RowwiseParallel(input_layouts=Replicate())  (input_is_parallel=False: the input is split first)"
        else:
            style = "RowwiseParallel() / RowwiseParallel(input_layouts=Replicate()) as input_is_parallel is True/False"
        head = "nn.Linear(in, out, bias=...) + " + style
    else:
        s = const_value(kwarg(call, "shard_across_embedding"), False)
        head = "nn.Embedding(num, dim) + " + ("ColwiseParallel()  (shard_across_embedding=True)" if s is True
                                              else "RowwiseParallel()  (vocabulary split over tp)")
    for kw, why in (("sequence_parallel_enabled", "sequence parallelism: SequenceParallel() on the norms and "
                                                  "input_layouts=Shard(1) / output_layouts=Shard(1) in the plan"),
                    ("stride", "stride > 1 interleaves fused weights (e.g. qkv): split them into separate Linears"),
                    ("init_method", "init_method: initialise the full nn weight before parallelize_module (same values "
                                    "on every rank: seed first)"),
                    ("keep_master_weight", "keep_master_weight: not needed (the full weight exists until it is sharded)"),
                    ("pad", "pad=True padded the vocabulary to a multiple of tp: DTensor shards unevenly without padding")):
        v = kwarg(call, kw)
        if v is not None and const_value(v, object()) not in (False, None, 1):
            extra.append(why)
    return head + (" in parallelize_module(model, mesh['tp'], plan)" + ("; " + "; ".join(extra) if extra else ""))


@rule(
    code="NM160",
    name="neuronx-distributed",
    summary="NeuronX Distributed (NxD) runs on torch_xla: each use is reported with its DTensor / FSDP2 / DCP plan; its common core is rewritten where meaning is kept",
    fix="unsafe",
    severity="error",
    triggers=[(kind, q) for q in ("neuronx_distributed*", "neuronx_distributed_training*")
              for kind in ("call", "ref", "store", "import", "star_import")] + [("method", "init_weight_cpu")],
    docs=f"""
        NeuronX Distributed (`neuronx_distributed`, "NxD") is built on torch_xla: its parallel layers call XLA
        collectives, its groups are XLA replica groups, its checkpoints are xser files, and its training library is
        at end of support. TorchNeuron's documented path ({NATIVE_TUTORIAL}) is native torch.distributed:

        | NxD | native |
        |---|---|
        | `parallel_state.initialize_model_parallel(tensor_model_parallel_size=T)` | `mesh = init_device_mesh("neuron", (dp, tp), mesh_dim_names=("dp", "tp"))` |
        | `get_tensor_model_parallel_rank/size/group()` | `mesh["tp"].get_local_rank()` / `.size()` / `.get_group()` |
        | `get_data_parallel_rank/size/group()` | `mesh["dp"].get_local_rank()` / `.size()` / `.get_group()` |
        | `ColumnParallelLinear(gather_output=False)` | `nn.Linear` + `ColwiseParallel()` |
        | `ColumnParallelLinear(gather_output=True)` | `nn.Linear` + `ColwiseParallel(output_layouts=Replicate())` |
        | `RowParallelLinear(input_is_parallel=True)` | `nn.Linear` + `RowwiseParallel()` |
        | `RowParallelLinear(input_is_parallel=False)` | `nn.Linear` + `RowwiseParallel(input_layouts=Replicate())` |
        | `ParallelEmbedding` | `nn.Embedding` + `RowwiseParallel()` |
        | `GQAQKVColumnParallelLinear` | `q_proj`, `k_proj`, `v_proj` `nn.Linear` + `ColwiseParallel()` each (KV replication by hand) |
        | `parallel_cross_entropy` | `F.cross_entropy` on gathered logits, or inside `loss_parallel()` |
        | `nxd.initialize_parallel_model` | `parallelize_module(model, mesh["tp"], plan)` (+ DDP or `fully_shard` over `mesh["dp"]`) |
        | `nxd.initialize_parallel_optimizer` (ZeRO-1) | DDP + `torch.distributed.optim.ZeroRedundancyOptimizer`, or FSDP2 `fully_shard` |
        | `nxd.save_checkpoint` / `load_checkpoint` | `torch.distributed.checkpoint` with `get_state_dict` / `set_state_dict` |
        | `NxDPPModel` | `torch.distributed.pipelining` |
        | `AdamW_FP32OptimParams` | fp32 parameters + autocast, or FSDP2 `MixedPrecisionPolicy(param_dtype=torch.bfloat16)` |

        The plan for a model: build it with `nn.Linear`/`nn.Embedding`, then apply one plan where it is built, e.g.
        `parallelize_module(model, mesh["tp"], {{"embed_tokens": RowwiseParallel(input_layouts=Replicate()),
        "layers.0.self_attn.q_proj": ColwiseParallel(), ..., "layers.0.self_attn.o_proj": RowwiseParallel(),
        "lm_head": ColwiseParallel(output_layouts=Replicate())}})`. Attention code that computes the number of
        local heads from `get_tensor_model_parallel_size()` keeps doing so from `mesh["tp"].size()` (colwise
        q/k/v outputs are local shards by default). ZeRO-1 needs DDP (or FSDP2) for the gradient average:
        `torch.distributed.optim.ZeroRedundancyOptimizer` alone never averages gradients over ranks.

        `rewrite --unsafe-fixes` migrates the common core where it keeps meaning (rules/builtin/nxd_fixes.py).
        NxD's `parallel_state` is global state queried from many files, so the rewrite writes one module,
        `parallel_mesh.py`, beside the files that import it: the DeviceMesh ("dp", "tp") with NxD's query names,
        the dp gradient average and clipping NxD's optimizer did in `step()` (`optimizer_step_pre_hook`),
        `clip_grad_norm` over DTensor and plain parameters, and `save_checkpoint`/`load_checkpoint`/`has_checkpoint`
        in torch.distributed.checkpoint format with NxD's `<dir>/<tag>`, `<dir>/newest` layout. Imports of
        `parallel_state` (and `grads.clip_grad_norm`) are re-pointed to it when every use in the file is one it
        defines (`import parallel_mesh as parallel_state`); `ColumnParallelLinear`/`RowParallelLinear`/
        `ParallelEmbedding` become `parallelize_module(nn.Linear(...)/nn.Embedding(...), parallel_state.mesh["tp"],
        ColwiseParallel()/RowwiseParallel())` at the site (outputs stay local tensors, so head counts computed from
        the tp size keep working); `isinstance` checks on them become `nn.Linear`/`nn.Embedding` (now matching
        every such module) and `init_weight_cpu()` `reset_parameters()`; `parallel_cross_entropy(logits, labels)`
        becomes `F.cross_entropy` of `DTensor.from_local(logits, mesh["tp"], [Shard(-1)]).full_tensor()` with
        `reduction="none"`; `nxd.neuronx_distributed_config` with the `initialize_parallel_model` and
        `initialize_parallel_optimizer` calls that take it (one fix) become `initialize_model_parallel`, the plain
        model moved to the device, and the optimizer (`AdamW_FP32OptimParams`: `torch.optim.AdamW` with NxD's
        eps=1e-6, weight_decay=0.0) with the pre-hook; `divide(a, b)` -> `a // b`;
        `model_parallel_xla_manual_seed` -> `torch.manual_seed`.

        What changes (a note at each line): weights are initialised by torch.nn on the full matrix and split from
        tp rank 0 (a Linear bias uniformly where NxD zeroed it); labels of -100 give 0 loss; torch's AdamW puts
        eps after bias correction; ZeRO-1's optimizer-state sharding is not kept (same updates, more memory;
        FSDP2 for the saving) and `optimizer.grad_norm` does not exist; `mixed_precision_config`, `use_xser`,
        `num_workers` are dropped; NxD's xser checkpoints do not load (convert once with NxD). Left as findings:
        `GQAQKVColumnParallelLinear` (a `kv_size_multiplier` has no DTensor form), layer arguments such as
        `init_method`, `stride`, `sequence_parallel_enabled`, `shard_across_embedding=True`, sequence, pipeline and
        context parallelism, queries the module does not define, a config used elsewhere; a file that keeps one
        still imports NxD and `rewrite` counts it as not migrated. Checked by running
        (tests/integration/test_nxd_rewrite.py): the rewritten NxD Llama fixture trains under torchrun at TP=2
        with per-step loss within 1e-5 of one process and, at DP=2 with ZeRO-1, ends with the parameters of one
        process on the whole batch (gradients averaged); the hand-written native target
        (tests/test_trainium_parity.py) also runs DDP + ZeRO-1 and FSDP2. CPU with gloo; unverified on a Trainium
        host.
    """,
    examples=[("from neuronx_distributed.parallel_layers import parallel_state\n"
               "parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)", None),
              ("from neuronx_distributed.parallel_layers.layers import RowParallelLinear\n"
               "o_proj = RowParallelLinear(64, 64, bias=False, input_is_parallel=True)", None)],
)
def neuronx_distributed(site, ctx):
    if site.kind == "method":  # `module.init_weight_cpu()` in a file that uses NxD's layers
        made = nxd_fix(site, ctx, "init_weight_cpu")
        if made is None:
            return None
        return ctx.finding(site, "`init_weight_cpu()` (NxD parallel layers) -> reset_parameters() of the nn.Linear / nn.Embedding",
                           fix=made[0], note=made[1])
    shown, what, plan = nxd_plan(site.key)
    made = nxd_fix(site, ctx, shown)
    fix, note = made if made else (None, "")
    if site.kind == "star_import":
        return ctx.finding(site, f"star import from {site.key} (NxD, on torch_xla): import names explicitly; the native "
                                 f"stack is {_GENERIC}")
    if site.kind == "store":
        return ctx.finding(site, f"`{ctx.src(site.node)}` patches NxD ({what}): move the patch into its native replacement: {plan}")
    if site.kind == "call" and shown in ("ColumnParallelLinear", "RowParallelLinear", "ParallelEmbedding"):
        plan = _layer_plan(shown, site.node)
    if site.kind == "import":
        if fix is None:
            unused = remove_unused_import(site, ctx, "neuronx_distributed", "NxD")
            if unused is not None:
                return unused
        return ctx.finding(site, f"`{site.key}` is NxD ({what}; runs on torch_xla): native plan: {plan}", fix=fix, note=note)
    return ctx.finding(site, f"`{shown}` (NxD: {what}) -> {plan}", fix=fix, note=note)


# -- NM161: optimum-neuron training -------------------------------------------------------------------------
_TRAINER_PLAN = ("transformers.Trainer / TrainingArguments (or a torch training loop) under torchrun on the neuron device; "
                 "its parallelism flags have no TrainingArguments equivalent: tensor_parallel_size -> DTensor "
                 "parallelize_module, zero_1 -> FSDP2 fully_shard (TrainingArguments fsdp=) or DDP + "
                 "ZeroRedundancyOptimizer, pipeline_parallel_size -> torch.distributed.pipelining; transformers' Trainer "
                 "on TorchNeuron is unverified")
OPTIMUM_PLANS = {
    "NeuronTrainer": _TRAINER_PLAN,
    "Seq2SeqNeuronTrainer": _TRAINER_PLAN,
    "NeuronSFTTrainer": "trl's SFTTrainer on the native device; " + _TRAINER_PLAN,
    "NeuronORPOTrainer": "trl's ORPOTrainer on the native device; " + _TRAINER_PLAN,
    "NeuronTrainingArguments": ("transformers.TrainingArguments: drop tensor_parallel_size, pipeline_parallel_size, "
                                "zero_1, disable_sequence_parallel, kv_size_multiplier, fuse_qkv, "
                                "async_save, use_xser and the other Neuron-only fields; bf16=True maps to autocast"),
    "Seq2SeqNeuronTrainingArguments": "transformers.Seq2SeqTrainingArguments (drop the Neuron-only fields, as for NeuronTrainingArguments)",
    "NeuronSFTConfig": "trl.SFTConfig (drop the Neuron-only fields, as for NeuronTrainingArguments)",
    "NeuronORPOConfig": "trl.ORPOConfig (drop the Neuron-only fields)",
    "TrainingNeuronConfig": ("a DeviceMesh (init_device_mesh(\"neuron\", (dp, tp))) and a parallelize_module plan; "
                             "its checkpoint/recompute options map to DCP and apply_activation_checkpointing"),
    "NeuronAccelerator": "accelerate.Accelerator on the native device (unverified on TorchNeuron) or a plain torchrun loop",
    "distributed": ("optimum-neuron's NxD model parallelisation", "DTensor parallelize_module plans (Colwise/Rowwise) on the plain model"),
    "models": "the plain transformers model class (optimum-neuron's training models are NxD-parallel copies): shard it with parallelize_module",
}
_OPTIMUM_INFERENCE = ("an optimum-neuron inference/export API (neuronx-cc traced models, NxD Inference): not a training "
                      "migration; native inference is the plain model under torch.compile(backend=\"neuron\")")


@rule(
    code="NM161",
    name="optimum-neuron-training",
    summary="optimum-neuron's trainers and NeuronTrainingArguments run on torch_xla/NxD: each use is reported with its native plan",
    fix="none",
    severity="error",
    triggers=[(kind, "optimum.neuron*") for kind in ("call", "ref", "store", "import", "star_import")],
    docs="""
        optimum-neuron's training API (`NeuronTrainer`, `Seq2SeqNeuronTrainer`, `NeuronSFTTrainer`,
        `NeuronTrainingArguments`, `NeuronSFTConfig`, `TrainingNeuronConfig`, `optimum.neuron.distributed`) runs on
        torch_xla and NeuronX Distributed: its trainer steps with `xm` calls, its `tensor_parallel_size`,
        `pipeline_parallel_size` and `zero_1` options build NxD groups and layers, and it saves xser checkpoints.
        The native plan: the transformers (or trl) class it extends, on the `neuron` device under torchrun, with
        the parallelism written natively (DTensor `parallelize_module` for tensor parallelism, FSDP2 `fully_shard`
        or DDP + `ZeroRedundancyOptimizer` for ZeRO-1, `torch.distributed.pipelining`), and the Neuron-only
        arguments dropped. Whether transformers' Trainer runs unchanged on TorchNeuron is unverified (no
        TorchNeuron document covers it). Inference classes (`NeuronModelFor...`, export) are reported as not part
        of a training migration. Nothing is rewritten; `rewrite` counts a file that still imports optimum.neuron
        as not migrated.
    """,
    examples=[("from optimum.neuron import NeuronTrainer, NeuronTrainingArguments\n"
               "args = NeuronTrainingArguments(output_dir='out', tensor_parallel_size=2, zero_1=True)", None)],
)
def optimum_neuron_training(site, ctx):
    parts = site.key.split(".")
    name = next((p for p in reversed(parts) if p in OPTIMUM_PLANS), parts[-1])
    plan = OPTIMUM_PLANS.get(name)
    if isinstance(plan, tuple):
        plan = plan[1]
    if plan is None:
        plan = _OPTIMUM_INFERENCE if ("NeuronModel" in name or "export" in parts or "pipelines" in parts) else (
            "the transformers/torch API it wraps on the neuron device, with parallelism via DTensor/FSDP2 (by hand)")
    if site.kind == "call" and name == "NeuronTrainingArguments":
        neuron_only = [k.arg for k in site.node.keywords if k.arg in ("tensor_parallel_size", "pipeline_parallel_size", "zero_1",
                                                                       "disable_sequence_parallel", "kv_size_multiplier",
                                                                       "fuse_qkv", "async_save", "use_xser")]
        if neuron_only:
            plan += f"; here: {', '.join(neuron_only)}"
    return ctx.finding(site, f"`{name}` (optimum-neuron, runs on torch_xla/NxD) -> {plan}")


# -- NM162: NKI kernels ---------------------------------------------------------------------------------------
@rule(
    code="NM162",
    name="nki-kernel",
    summary="NKI kernels called from model code: the legacy neuronxcc.nki / torch_xla path becomes an NKI op with a reference path",
    fix="none",
    severity="warning",
    triggers=[(kind, q) for q in ("neuronxcc.nki*", "torch_neuronx.xla_impl*", "neuronxcc.starfish*")
              for kind in ("call", "ref", "import", "star_import")],
    docs="""
        Kernels written with the Neuron Kernel Interface and called from model code under torch_xla
        (`from neuronxcc import nki`, `neuronxcc.nki.language`, `@nki.jit` applied to XLA tensors,
        `torch_neuronx.xla_impl` custom calls, NxD's flash-attention kernels) are launched through the XLA graph.
        On TorchNeuron NKI ships as its own package (`nki`, `@nki.jit`) and kernels are registered as operators
        (`torch_neuronx` `nki_op`) so that eager, autograd and `torch.compile(backend="neuron")` see them;
        NKI's language changed between the neuronxcc releases and NKI 0.x, so each kernel needs review. Keep a
        PyTorch reference implementation beside it (CPU runs, tests) and, for attention,
        prefer `F.scaled_dot_product_attention`, which TorchNeuron lowers to its fused attention (named only in
        files that mention attention). `torch_neuronx.xla_impl.custom_op` loads a C++ custom-op library, not NKI
        (AWS's customop_mlp sample): its ops are rebuilt and registered with `torch.library`. Reported: the
        kernel body and its call site need a human; unverified on a Trainium host.
    """,
    examples=[("from neuronxcc import nki\nimport neuronxcc.nki.language as nl\n\n@nki.jit\ndef add_kernel(a, b):\n    return a", None)],
)
def nki_kernel(site, ctx):
    name = site.key
    if name.startswith("torch_neuronx.xla_impl.custom_op"):
        # aws-neuron-samples' customop_mlp: a C++ library of ops (torch.ops.my_ops.*) built for the XLA runtime, not NKI
        return ctx.finding(site, f"`{name}` loads a C++ custom-op library built for torch_xla's runtime: rebuild the ops "
                                 "for TorchNeuron and register them with torch.library (torch.library.custom_op, or "
                                 "TORCH_LIBRARY with a kernel for the neuron device), keeping a PyTorch reference "
                                 "implementation; their torch.ops.* calls stay as they are")
    if site.kind == "import" or site.kind == "star_import":
        attention = "; attention: F.scaled_dot_product_attention" if "attention" in ctx.analysis.text.lower() else ""
        return ctx.finding(site, f"`{name}` is legacy NKI (launched through torch_xla): port the kernel to the `nki` package "
                                 "(NKI 0.x language) and register it as an operator (torch_neuronx nki_op), keeping a "
                                 f"PyTorch reference implementation{attention}")
    return ctx.finding(site, f"`{name}`: an NKI kernel launched through torch_xla: call it as a registered NKI op on the "
                             "neuron device (review it for NKI 0.x), or replace it with the PyTorch computation it implements")
