"""Rules for launchers and job files (NM5xx): shell scripts, SLURM/sbatch files, Dockerfiles, .env files and
shell in YAML job specs. Same registry, suppression comments, fix safety and output formats as the Python rules.

Sources cited in messages:
- legacy env var page (XLA flow): ENV_DOC below;
- TorchNeuron docs (distributed guide): DIST_GUIDE;
- "TorchNeuron pre-release source": the TorchNeuron source (torch_neuronx/, csrc/), about six months older than
  Neuron 2.33, so unverified for the released wheel (see ../shared/research/torchneuron.md).
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from neuron_migrate.rules.api import rule
from neuron_migrate.rules.builtin.xla_env import BF16_DOC, ENV_DOC, env_kind

TYPE_CHECKING = False  # typing is not imported at run time (start-up): it serves annotations only
if TYPE_CHECKING:
    from typing import Optional

DIST_GUIDE = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/torch/guides/torch-distributed.html"
ENV_REF = "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/torch/reference/env-vars.html"
_WORDS = ("XLA_", "PJRT_", "NEURON", "TPU_", "XRT_", "LIBTPU", "CPU_NUM_DEVICES", "ALLREDUCE_")


# -- NM500 ---------------------------------------------------------------------------------------------
@rule(
    code="NM500",
    name="shell-unparsed",
    summary="A launcher or job file the parser could not read: reported, never rewritten",
    fix="none",
    severity="warning",
    triggers=[("document", "*")],
    trigger_words=("XLA_", "PJRT_", "NEURON", "neuron_parallel_compile", "xla"),
    language="shell",
    docs="""
        Shell is parsed with tree-sitter-bash, Dockerfiles, `.env` files and YAML with their own grammars. Where the
        parser reports a region it could not read, the file is not rewritten at all (a rewrite could land inside
        syntax the tool did not understand); its other findings are still shown, without fixes. Reported only in
        files that mention XLA or Neuron settings.
    """,
    examples=[("export PJRT_DEVICE=NEURON\nif [ x = y ; then\n", None)],
)
def shell_unparsed(doc, ctx):
    if not any(w in doc.text for w in ctx.rule.trigger_words):
        return None  # e.g. a Helm template or a zsh script that has nothing to migrate
    return [ctx.finding((a, b), f"{what}: this file is not rewritten (migrate it by hand or fix the syntax)")
            for a, b, what in doc.problems[:1]]


# -- NM501 ---------------------------------------------------------------------------------------------
def _reads(doc, key: str) -> bool:
    return any(s.kind == "env-read" and s.key == key for s in doc.sites)


def _pending_spawn_launch(doc) -> bool:
    return any(s.kind == "command" and _spawn_launch(s) is not None for s in doc.sites)


@rule(
    code="NM501",
    name="xla-env-launcher",
    summary="XLA/PJRT environment variables in launchers and job files: dead ones removed, bf16 ones need a replacement in code",
    fix="safe",
    severity="warning",
    triggers=[("env", "*"), ("env-read", "*")],
    trigger_words=_WORDS,
    language="shell",
    docs=f"""
        Launchers set torch_xla's environment: `export PJRT_DEVICE=NEURON`, `XLA_IR_DEBUG=1 python ...`, Dockerfile
        `ENV XLA_FLAGS=...`, `.env` lines, Kubernetes `env:` entries. TorchNeuron reads none of them (legacy list:
        {ENV_DOC}). An assignment of a variable only the XLA runtime read (PJRT_*, XLA_IR_DEBUG/XLA_HLO_DEBUG,
        XLA_FLAGS, TPU_*, XRT_*, NEURON_PJRT_*, debug dumps, NEURON_EXTRACT_GRAPHS_ONLY...) is removed, unless the file
        also reads it or removing it would leave invalid syntax (the only command of a block); `PJRT_DEVICE` set to
        something other than `NEURON` is reported (it chose the backend). The native counterpart is named where there is
        one (`TORCH_NEURONX_ENABLE_STACK_TRACE=1` for XLA_IR_DEBUG, `NEURON_LAUNCH_BLOCKING=1` for XLA_SYNC_WAIT).
        `XLA_USE_BF16` / `XLA_DOWNCAST_BF16` / `XLA_USE_FP16` changed numerics: removing them moves training from bf16
        to fp32, so the removal is an unsafe fix and the message gives the replacement in code (`model.to(torch.bfloat16)`
        or `torch.autocast("neuron", dtype=torch.bfloat16)`; {BF16_DOC}). `NEURONCORE_NUM_DEVICES` (how many processes
        `xmp.spawn` started) becomes `torchrun --nproc_per_node` (NM505 reads it first). Reads of
        `NEURON_EXTRACT_GRAPHS_ONLY` are reported: nothing sets it any more.
    """,
    examples=[("export PJRT_DEVICE=NEURON\nexport XLA_IR_DEBUG=1\ntorchrun --nproc_per_node=2 train.py", "torchrun --nproc_per_node=2 train.py")],
)
def xla_env_launcher(site, ctx):
    kind = env_kind(site.key)
    if kind is None:
        return None
    what, advice = kind
    doc = ctx.doc
    if site.kind == "env-read":
        if what == "dead" and not any(s.kind == "env" and s.key == site.key for s in doc.sites):
            return ctx.finding(site, f"${site.key} is read here but never set on TorchNeuron: {advice}")
        return None
    value = site.data.get("value")
    extra = f"; {advice}" if advice else ""
    delete = site.data.get("delete")
    if what == "numerics":
        fx = ctx.fixer("unsafe")
        if delete:
            fx.delete(*delete)
        # the note is what a run that applies the fix shows: it must say what the deletion means for the numbers
        return ctx.finding(site, f"{site.key}: {advice}", fix=fx.build() if delete else None,
                           note=f"TorchNeuron never reads {site.key}: without a bfloat16 cast or autocast in the code the "
                                f"program trains in float32 where XLA trained in bfloat16. Source: {BF16_DOC}")
    if what == "other":
        return ctx.finding(site, f"{site.key} has no effect on TorchNeuron{extra}")
    if site.key == "PJRT_DEVICE" and value is not None and value.upper() != "NEURON":
        return ctx.finding(site, f"PJRT_DEVICE={value} chose the {value} backend under XLA; on TorchNeuron pick the device "
                                 "in code (torch.device(\"neuron\") or \"cpu\"): migrate by hand")
    if _reads(doc, site.key):
        return ctx.finding(site, f"{site.key} is XLA-only but this file also reads it: remove both by hand{extra}")
    if what == "launch":
        # the count moves onto the torchrun command (NM505, same round); kept when no launch here reads it,
        # since a launcher elsewhere may still start an xmp.spawn script with it
        if value is None:
            return ctx.finding(site, f"{site.key} set from an expression: pass it to torchrun --nproc_per_node by hand")
        if not (_pending_spawn_launch(doc) or any(s.kind == "command" and s.key == "torchrun" for s in doc.sites)):
            return ctx.finding(site, f"{site.key} (how many processes xmp.spawn started) is not used by TorchNeuron: "
                                     "remove it once every launcher uses torchrun --nproc_per_node")
    if not delete:
        return ctx.finding(site, f"{site.key} is XLA-only: remove it by hand (removing it here would leave an empty block){extra}")
    fx = ctx.fixer()
    fx.delete(*delete)
    if what == "launch":
        return ctx.finding(site, f"{site.key} (the process count of xmp.spawn) is now torchrun --nproc_per_node: "
                                 f"{ctx.did('removed', 'remove it')}", fix=fx.build())
    return ctx.finding(site, f"{site.key} is read only by torch_xla / the XLA flow: {ctx.did('removed', 'remove it')}{extra}", fix=fx.build())  # source: the rule docs (ENV_DOC)


# -- NM502 ---------------------------------------------------------------------------------------------
_PRECOMPILE_NOTE = ("TorchNeuron compiles on first use and caches the compiled graphs (NEFF cache; TORCH_NEURONX_NEFF_CACHE_DIR "
                    "in the TorchNeuron pre-release source, unverified for 2.33): warm the cache by running the job once; there is no "
                    f"documented native pre-compilation tool (see {ENV_REF})")


def _script_of(words) -> Optional[str]:
    for text, _a, _b in words[1:]:
        if text and text.endswith(".py"):
            return text
    return None


@rule(
    code="NM502",
    name="neuron-parallel-compile",
    summary="neuron_parallel_compile <cmd> (XLA graph pre-compilation): the pre-compile run is removed, or reported",
    fix="safe",
    severity="warning",
    triggers=[("command", "neuron_parallel_compile")],
    trigger_words=("neuron_parallel_compile",),
    language="shell",
    docs=f"""
        `neuron_parallel_compile torchrun ... train.py` ran the training script in a graph-extraction trial mode
        (`NEURON_EXTRACT_GRAPHS_ONLY=1`) and compiled every XLA graph in parallel, so that the real run that followed
        found them cached. It belongs to the XLA flow and is not part of TorchNeuron, which compiles on first use and
        caches the results. When the same script is also run for real later in the file, the pre-compile command is
        deleted (the real run warms the cache itself). When it is the only run of that script (a separate pre-compile
        job), it is reported: dropping the wrapper would turn a compile-only job into a real training run. Removing the
        statement is only done where the rest stays valid shell. Practice: {_PRECOMPILE_NOTE}.
    """,
    examples=[("neuron_parallel_compile torchrun --nproc_per_node=32 train.py --max_steps 10\ntorchrun --nproc_per_node=32 train.py",
               "torchrun --nproc_per_node=32 train.py")],
)
def neuron_parallel_compile(site, ctx):
    words = site.data["words"]
    script = _script_of(words)
    later = [s for s in ctx.doc.sites if s.kind == "command" and s.start > site.end and s.key != "neuron_parallel_compile"
             and script and _script_of(s.data["words"]) == script]
    if script and later and site.data.get("delete"):
        fx = ctx.fixer()
        fx.delete(*site.data["delete"])
        return ctx.finding(site, f"neuron_parallel_compile pre-compiles XLA graphs: {ctx.did('removed', 'remove the command')}, "
                                 f"the run of {script} below compiles and caches on first use", fix=fx.build(), note=_PRECOMPILE_NOTE)
    why = ("it is the only run of the script here, so it is a compile-only job" if not later else
           "it cannot be removed without leaving invalid shell")
    return ctx.finding(site, f"neuron_parallel_compile (XLA graph pre-compilation) does not exist for TorchNeuron; {why}: "
                             "delete the job, or run the command without the wrapper for a real (first) run", note=_PRECOMPILE_NOTE)


# -- NM503 ---------------------------------------------------------------------------------------------
_CC_SRC = "TorchNeuron pre-release source csrc/core/KernelExecution.cpp, kernels/compiler_config.py (unverified for 2.33)"


@rule(
    code="NM503",
    name="neuron-cc-flags",
    summary="NEURON_CC_FLAGS: kept; XLA-flow-only flags and the changed auto-cast default are reported",
    fix="none",
    severity="info",
    triggers=[("env", "NEURON_CC_FLAGS")],
    trigger_words=("NEURON_CC_FLAGS",),
    language="shell",
    docs=f"""
        `NEURON_CC_FLAGS` still reaches the compiler: TorchNeuron passes `--model-type transformer --auto-cast=none`
        by default and appends `NEURON_CC_FLAGS` ({_CC_SRC}); the optimisation level comes from
        `NEURON_COMPILER_OPT_LEVEL` (default `-O1`, same source). So the variable and its flags are kept, with two
        reports: `--cache_dir=...` configured the XLA flow's compile cache; TorchNeuron's NEFF cache is
        `TORCH_NEURONX_NEFF_CACHE_DIR` (TorchNeuron pre-release source, unverified for 2.33). And a value without any
        `--auto-cast` flag: the XLA flow's compiler auto-cast FP32 matrix multiplies to BF16 by default, TorchNeuron
        does not (`--auto-cast=none` default), so the same flags now compute in FP32 (slower, more precise): use
        `torch.autocast("neuron", dtype=torch.bfloat16)` for bf16 speed, or pass `--auto-cast` explicitly.
        `--auto-cast=none` itself is redundant but harmless and stays.
    """,
    examples=[('export NEURON_CC_FLAGS="--model-type transformer --cache_dir=/var/cache/neuron"', None)],
)
def neuron_cc_flags(site, ctx):
    value = site.data.get("value")
    if value is None:
        return None
    import shlex  # only a launcher that sets NEURON_CC_FLAGS needs it: not imported at start-up

    try:
        flags = shlex.split(value)
    except ValueError:
        return None
    out = []
    for i, f in enumerate(flags):
        if f.startswith("--cache_dir"):
            d = f.split("=", 1)[1] if "=" in f else (flags[i + 1] if i + 1 < len(flags) else "DIR")
            out.append(ctx.finding(site, f"NEURON_CC_FLAGS --cache_dir configured the XLA flow's compile cache; TorchNeuron's "
                                         f"NEFF cache is TORCH_NEURONX_NEFF_CACHE_DIR={d} (move it there by hand)",
                                   note=f"source: TorchNeuron pre-release source neuron_dynamo_backend (TORCH_NEURONX_NEFF_CACHE_DIR), unverified for 2.33"))
    if not any(f.startswith("--auto-cast") or f.startswith("--auto_cast") for f in flags):
        out.append(ctx.finding(site, "NEURON_CC_FLAGS has no --auto-cast: the XLA flow auto-cast FP32 matmuls to BF16 by default, "
                                     "TorchNeuron passes --auto-cast=none, so this model now computes in FP32; for bf16 speed use "
                                     "torch.autocast(\"neuron\", dtype=torch.bfloat16) or pass --auto-cast explicitly",
                               note=f"source: {_CC_SRC}"))
    return out


# -- NM504 ---------------------------------------------------------------------------------------------
@rule(
    code="NM504",
    name="neuron-rt-root-comm-id",
    summary="NEURON_RT_ROOT_COMM_ID is set by the neuron process group from MASTER_ADDR; other NEURON_RT_* are kept",
    fix="none",
    severity="info",
    triggers=[("env", "NEURON_RT_ROOT_COMM_ID")],
    trigger_words=("NEURON_RT_ROOT_COMM_ID",),
    language="shell",
    docs="""
        `NEURON_RT_*` variables configure the Neuron runtime, which TorchNeuron still uses: `NEURON_RT_VISIBLE_CORES`
        (the backend sets it to `LOCAL_RANK` when unset, otherwise remaps it), `NEURON_RT_NUM_CORES`,
        `NEURON_RT_VIRTUAL_CORE_SIZE`, `NEURON_RT_STOCHASTIC_ROUNDING_EN` and the runtime tuning variables are kept
        untouched (TorchNeuron pre-release source torch_neuronx/distributed/backend.py `_set_rt_visible_cores`; runtime-level
        variables per the legacy env var page). `NEURON_RT_ROOT_COMM_ID` is the exception that is reported: XLA-era
        multi-node launchers computed it (`$MASTER_ADDR:46820`); the neuron process group now sets it from
        `MASTER_ADDR` and a free port (TorchNeuron pre-release source `_set_root_comm_id`), so a fixed value is only needed
        when that port must be fixed.
    """,
    examples=[('export NEURON_RT_ROOT_COMM_ID="$MASTER_ADDR:46820"', None)],
)
def neuron_rt_root_comm_id(site, ctx):
    return ctx.finding(site, "NEURON_RT_ROOT_COMM_ID is set by the neuron process group from MASTER_ADDR and a free port: "
                             "remove it unless the port must be fixed",
                       note="source: TorchNeuron pre-release source torch_neuronx/distributed/backend.py _set_root_comm_id (unverified for 2.33)")


# -- NM505 ---------------------------------------------------------------------------------------------
_PY = re.compile(r"^python(3(\.\d+)?)?$")
_SPAWN_TEXT = re.compile(r"xla_multiprocessing|torch_xla\.launch\(|from torch_xla import launch")
_SPAWN_CALL = re.compile(r"\bspawn\s*\(|\blaunch\s*\(")
_NPROCS = re.compile(r"\bspawn\s*\([^)]*?\bnprocs\s*=\s*(\d+)")
# what NM127 leaves behind: the script starts its process group when torchrun set WORLD_SIZE
_MIGRATED_SPAWN = re.compile(r"[\"']WORLD_SIZE[\"']\s+in\s+[\w.]*environ\s+and\s+not\s+[\w.]+\.is_initialized\(\)")


def _find_script(doc_path: str, script: str) -> Optional[Path]:
    here = Path(doc_path).resolve().parent
    cands = []
    for base in (here, *list(here.parents)[:3]):
        cands += [base / script, base / os.path.basename(script)]
    for c in cands:
        try:
            if c.is_file():
                return c
        except OSError:
            continue
    return None


def _spawn_script_facts(path: Path) -> Optional[dict]:
    """Whether the script launches its workers with xmp.spawn / torch_xla.launch (or is NM127's rewrite of one)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    if _SPAWN_TEXT.search(text) and _SPAWN_CALL.search(text):
        m = _NPROCS.search(text)
        return {"nprocs": int(m.group(1)) if m else None, "migrated": False}
    if _MIGRATED_SPAWN.search(text):
        return {"nprocs": None, "migrated": True}
    return None


def _spawn_launch(site) -> Optional[dict]:
    """For `python [-u] script.py args` of a spawn script: the facts NM505 needs, else None."""
    if site.kind != "command":
        return None
    words = site.data["words"]
    p = _py_index(words)
    if p is None:
        return None
    i = p + 1
    while i < len(words) and words[i][0] == "-u":
        i += 1
    if i >= len(words) or not words[i][0]:
        return None
    first = words[i][0]
    if first.startswith("-") or not first.endswith(".py"):
        return None  # python -m, other interpreter flags: not rewritten here
    path = _find_script(site.doc.path, first)
    facts = _spawn_script_facts(path) if path is not None else None
    if facts is None:
        return None
    return {**facts, "script": first, "script_at": i, "path": path, "python_at": p}


_WRAPPERS = ("srun", "exec", "nohup", "time")


def _py_index(words) -> Optional[int]:
    """Index of the python word: the command itself, or after a wrapper (`srun python ...`) and its options."""
    if words[0][0] and _PY.match(words[0][0]):
        return 0
    if words[0][0] not in _WRAPPERS:
        return None
    for j in range(1, len(words)):
        w = words[j][0]
        if w is None:
            return None
        if w.startswith("-"):
            if "=" not in w and w not in ("-l", "--label", "-u"):
                return None  # an option that may take the next word as its value: not guessed
            continue
        return j if _PY.match(w) else None
    return None


@rule(
    code="NM505",
    name="spawn-launch-torchrun",
    summary="`python train.py` of an xmp.spawn / torch_xla.launch script becomes `torchrun --nproc_per_node=N train.py`",
    fix="safe",
    severity="warning",
    triggers=[("command", "python*"), *[("command", w) for w in _WRAPPERS]],
    trigger_words=("python",),
    language="shell",
    docs=f"""
        An XLA script that calls `xmp.spawn(fn)` (or `torch_xla.launch(fn)`) was started with a plain
        `python train.py`: the call itself started one process per NeuronCore, `NEURONCORE_NUM_DEVICES` of them
        (default 1; torch_xla `_internal/neuron.py`). The Python rewrite (NM127) turns the call into a direct call of
        the worker that expects torchrun to start the processes ({DIST_GUIDE}), so the launcher must become
        `torchrun --nproc_per_node=N train.py ...`, with the script's arguments kept. N is the literal
        `NEURONCORE_NUM_DEVICES` set earlier in the launcher (or on the command), else the script's literal
        `xmp.spawn(..., nprocs=N)`, else `"${{NEURONCORE_NUM_DEVICES:-1}}"`, exactly what xmp.spawn used. `-u` is
        dropped (torchrun always runs python unbuffered). The target script is found next to the launcher (or up to
        three folders up) and recognised by its `xmp.spawn`/`torch_xla.launch` call or by NM127's rewrite of it; other
        python flags, `python -m` and scripts that cannot be found are left alone. In a Dockerfile exec form
        (`CMD ["python", "train.py"]`) and in YAML argv lists (Kubernetes `command: ["python", "train.py"]`, the
        container's `env` entries giving `NEURONCORE_NUM_DEVICES`) N must be a literal (no shell there), else the
        command is reported. On
        trn2.48xlarge one process per logical NeuronCore is 64.
    """,
    examples=[("export NEURONCORE_NUM_DEVICES=2\npython train.py --epochs 3",
               "export NEURONCORE_NUM_DEVICES=2\ntorchrun --nproc_per_node=2 train.py --epochs 3")],
)
def spawn_launch_torchrun(site, ctx):
    facts = _spawn_launch(site)
    if facts is None:
        return None
    words = site.data["words"]
    env = site.data.get("env_before", {})
    style = site.data["style"]
    if style.startswith("yaml"):  # an argv list: the container's env entries (anywhere in the file) apply
        values = {s.data.get("value") for s in ctx.doc.sites if s.kind == "env" and s.key == "NEURONCORE_NUM_DEVICES"}
        env = {"NEURONCORE_NUM_DEVICES": values.pop()} if len(values) == 1 else ({} if not values else {"NEURONCORE_NUM_DEVICES": None})
    n_env = env.get("NEURONCORE_NUM_DEVICES", "unset")
    if n_env not in ("unset", None) and str(n_env).isdigit():
        n, source = str(n_env), "NEURONCORE_NUM_DEVICES in this file"
    elif n_env is None:
        n, source = None, ""
    elif facts["nprocs"]:
        n, source = str(facts["nprocs"]), f"xmp.spawn(nprocs=...) in {facts['script']}"
    elif style == "shell":
        n, source = '"${NEURONCORE_NUM_DEVICES:-1}"', "what xmp.spawn used: NEURONCORE_NUM_DEVICES, default 1"
    else:
        n, source = None, ""
    note = ("torchrun starts one process per NeuronCore (64 per trn2.48xlarge with one rank per logical core); "
            f"{facts['script']} was migrated from xmp.spawn and joins the group torchrun sets up (source: {DIST_GUIDE})")
    if n is None:
        return ctx.finding(site, f"{facts['script']} used xmp.spawn: launch it with torchrun --nproc_per_node=N "
                                 "(N from NEURONCORE_NUM_DEVICES, which is not a literal here)", note=note)
    fx = ctx.fixer()
    start, end = words[facts["python_at"]][1], words[facts["script_at"]][1]
    if style == "json":
        fx.replace(start, end, f'"torchrun", "--nproc_per_node={n}", ')
    elif style.startswith("yaml"):
        raw = ctx.doc.text[words[facts["python_at"]][1]:words[facts["python_at"]][2]]
        q = raw[:1] if raw[:1] in "\"'" else ""
        if style == "yaml-flow":
            fx.replace(start, end, f"{q}torchrun{q}, {q}--nproc_per_node={n}{q}, ")
        else:  # block list: the flag is an item of its own, indented like the script's
            line_start = ctx.doc.text.rfind("\n", 0, end) + 1
            prefix = ctx.doc.text[line_start:end]
            if prefix.strip() != "-":
                return ctx.finding(site, f"{facts['script']} used xmp.spawn: launch it with torchrun --nproc_per_node={n}", note=note)
            fx.replace(start, end, f"{q}torchrun{q}\n{prefix}{q}--nproc_per_node={n}{q}\n{prefix}")
    else:
        fx.replace(start, end, f"torchrun --nproc_per_node={n} ")
    launched = ctx.did(f"launched with torchrun --nproc_per_node={n}", f"launch it with torchrun --nproc_per_node={n}")
    return ctx.finding(site, f"{facts['script']} started its workers with xmp.spawn: {launched} (N: {source})", fix=fx.build(), note=note)
