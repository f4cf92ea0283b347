"""CUDA training libraries that pick the device themselves (NM228).

accelerate's `Accelerator`, transformers' `TrainingArguments`/`Trainer`, Lightning's `Trainer` and ignite's `idist`
choose among cuda, mps, xpu, ... and the CPU inside the library. The program has no device choice for the CUDA rules
to migrate: on a Trainium host it trains wherever the library's own order ends, the host CPU unless the installed
release knows the `neuron` device. The finding names the release or the setting that selects it; what no
documentation says is marked [verify].

Sources: TorchNeuron's training page says HF transformers/diffusers/PEFT/accelerate "run natively on TorchNeuron with
no Neuron-specific path" (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/training.html); transformers
PR #44302 (merged 2026-03) adds the neuron device to TrainingArguments/Trainer, and transformers 5.24.0's own
source (checked) selects `neuron:0` when torch-neuronx is installed and sets `torch_compile_backend="neuron"`;
accelerate PR #4042 adds the neuron device case and #4097 (merged 2026-07) registers the neuron dynamo backend
(https://github.com/huggingface/accelerate/pull/4042, /pull/4097); no Lightning or ignite release documents a
neuron accelerator or backend.
"""
from __future__ import annotations

from neuron_migrate.rules.api import const_value, kwarg, rule

_ACCELERATE = ("accelerate.Accelerator", "accelerate.accelerator.Accelerator")
_HF_ARGS = ("transformers.TrainingArguments", "transformers.training_args.TrainingArguments",
            "transformers.Seq2SeqTrainingArguments", "transformers.training_args_seq2seq.Seq2SeqTrainingArguments")
_LIGHTNING = ("lightning.Trainer", "lightning.pytorch.Trainer", "pytorch_lightning.Trainer",
              "lightning.pytorch.trainer.trainer.Trainer", "pytorch_lightning.trainer.trainer.Trainer")
_IGNITE = ("ignite.distributed.device", "ignite.distributed.Parallel", "ignite.distributed.auto_model",
           "ignite.distributed.utils.device", "ignite.distributed.launcher.Parallel")


def _true(node) -> bool:
    return const_value(node) is True


@rule(
    code="NM228",
    name="cuda-library-trainer",
    summary="accelerate, transformers' Trainer, Lightning and ignite pick the device inside the library: check that the release knows `neuron`",
    fix="none",
    severity="warning",
    triggers=[("call", q) for q in (*_ACCELERATE, *_HF_ARGS, *_LIGHTNING, *_IGNITE)],
    docs="""
        These libraries choose the device themselves (cuda, else mps/xpu/..., else the CPU), so a program built on
        them has no device choice to migrate, and on a Trainium host it trains where the library's order ends.
        - `accelerate.Accelerator(...)`: a release with the neuron device case (huggingface/accelerate#4042) and,
          for `dynamo_backend`, the registered `neuron` backend (#4097, merged 2026-07) [verify: first release];
          check that `accelerator.device` is `neuron` on Trainium. `mixed_precision="fp16"`: prefer `"bf16"`.
        - `transformers.TrainingArguments(...)`: transformers 5.24.0 (checked in its source) selects `neuron:0` when
          torch-neuronx is installed and compiles with `torch_compile_backend="neuron"` (huggingface/transformers#44302);
          older releases train on the host CPU [verify: first release with #44302]. `fp16=True`: use `bf16=True`
          (loss scaling on Neuron is undocumented); `torch_compile_backend="inductor"`: use `"neuron"`.
        - Lightning `Trainer(...)`: Lightning picks among cuda, mps, xla and cpu and documents no `neuron`
          accelerator [verify]: `accelerator="gpu"` (or `"tpu"`) fails on Trainium and `"auto"` trains on the host CPU; use a
          custom Accelerator/Strategy or a plain PyTorch loop (which the CUDA rules migrate).
        - ignite `idist.device()`, `idist.Parallel(...)`, `idist.auto_model(...)`: cuda when available, else cpu;
          its backends are nccl, gloo, xla-tpu and horovod, none `neuron` [verify]: pick the device yourself
          (`torch.device("neuron")`) and start the process group with backend `"neuron"`.
        Calls that ask for the CPU (`Accelerator(cpu=True)`, `TrainingArguments(use_cpu=True)`,
        `Trainer(accelerator="cpu")`) are left alone.
    """,
    examples=[("from accelerate import Accelerator\naccelerator = Accelerator(mixed_precision='bf16')", None)],
)
def cuda_library_trainer(site, ctx):
    call = site.call
    q = site.key
    if q in _ACCELERATE:
        if _true(kwarg(call, "cpu")):
            return None
        extra = ""
        if const_value(kwarg(call, "mixed_precision")) == "fp16":
            extra = " mixed_precision='fp16': prefer 'bf16' (loss scaling on Neuron is undocumented)."
        if kwarg(call, "dynamo_backend") is not None and const_value(kwarg(call, "dynamo_backend")) not in ("neuron", "NEURON"):
            extra += " dynamo_backend: use 'neuron'."
        return ctx.finding(site, "accelerate picks the device itself (cuda, mps, xpu, ... else the CPU): on Trainium it needs a "
                                 "release with the neuron device (huggingface/accelerate#4042; #4097 for dynamo_backend='neuron') "
                                 "[verify: first release]; check that `accelerator.device` is neuron." + extra)
    if q in _HF_ARGS:
        if _true(kwarg(call, "use_cpu")) or _true(kwarg(call, "no_cuda")):
            return None
        extra = ""
        if _true(kwarg(call, "fp16")):
            extra += " fp16=True: use bf16=True (loss scaling on Neuron is undocumented)."
        backend = const_value(kwarg(call, "torch_compile_backend"))
        if isinstance(backend, str) and backend != "neuron":
            extra += f" torch_compile_backend={backend!r}: use 'neuron'."
        return ctx.finding(site, "transformers picks the training device itself: 5.24.0 selects neuron:0 when torch-neuronx is "
                                 "installed and compiles with backend 'neuron' (huggingface/transformers#44302); older releases "
                                 "train on the host CPU [verify: first release with #44302]: pin a release that has it." + extra)
    if q in _LIGHTNING:
        acc = const_value(kwarg(call, "accelerator"))
        if acc == "cpu":
            return None
        given = kwarg(call, "accelerator")
        if acc in ("gpu", "cuda", "tpu", "mps"):
            what = f"accelerator={acc!r} fails on Trainium"  # Lightning refuses an accelerator it cannot find
        elif given is None or acc == "auto":
            what = "accelerator='auto' trains on the host CPU"
        else:
            what = f"accelerator={ctx.src(given)}: 'gpu' or 'tpu' fails on Trainium and 'auto' trains on the host CPU"
        return ctx.finding(site, f"Lightning picks the device among cuda, mps, xla and cpu and documents no neuron accelerator "
                                 f"[verify]: {what}; use a custom Accelerator/Strategy for `neuron` or a plain PyTorch loop")
    # ignite
    name = q.rsplit(".", 1)[1]
    if name == "Parallel":
        backend = const_value(kwarg(call, "backend", 0))
        return ctx.finding(site, f"ignite's idist.Parallel(backend={backend!r}) knows nccl, gloo, xla-tpu and horovod, not neuron "
                                 "[verify]: on Trainium start the process group yourself (torch.distributed backend 'neuron', "
                                 "torchrun) and pick torch.device('neuron')")
    return ctx.finding(site, f"ignite's idist.{name}() picks cuda when available, else the CPU (no neuron device [verify]): on "
                             "Trainium it places the model on the host CPU; use torch.device('neuron') yourself")
