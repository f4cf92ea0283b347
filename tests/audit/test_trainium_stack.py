"""The Trainium stack on torch_xla (NxD, optimum-neuron trainers, NKI; NM160-NM162) is never silent.

The fixture tests/fixtures/trainium/nxd_llama/ is written in the style of neuronx-distributed's
examples/training/llama/tp_zero1_llama_hf_pretrain (modeling_llama_nxd.py, training_utils.py, the entry script).
Every line that names something bound from neuronx_distributed (found here independently of the rule, by walking
the AST) must carry an NM160 finding with a native plan; `rewrite` must say that the files still depend on an
XLA-based library and are not migrated.
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from typer.testing import CliRunner

from neuron_migrate.cli.app import app
from neuron_migrate.files.xla_deps import xla_based_imports
from neuron_migrate.rules.api import Settings
from neuron_migrate.rules.nxd_state import HEADER_LINE
from neuron_migrate.rules.registry import RuleSet, all_rules
from neuron_migrate.rules.runner import check_text

NXD = Path(__file__).resolve().parents[1] / "fixtures" / "trainium" / "nxd_llama"
FILES = sorted(NXD.glob("*.py"))


def cli(*args):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def _lines_using(text: str, prefixes: tuple, imports: bool = True) -> set[int]:
    """Lines that use a name bound by an import of a module under one of `prefixes`, and (`imports`) `from` imports
    of names from such a module."""
    tree = ast.parse(text)
    bound, lines = set(), set()

    def under(module):
        return any(module == p or module.startswith(p + ".") for p in prefixes)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if under(a.name):
                    bound.add(a.asname or a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and under(node.module or ""):
            bound.update(a.asname or a.name for a in node.names)
            if imports:
                lines.add(node.lineno)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in bound:
            lines.add(node.lineno)
    return lines


def _nxd_lines(text: str) -> set[int]:
    """Lines that import neuronx_distributed or use a name bound by such an import."""
    lines = _lines_using(text, ("neuronx_distributed",))
    tree = ast.parse(text)
    lines.update(n.lineno for n in ast.walk(tree) if isinstance(n, ast.Import) and any(a.name.startswith("neuronx_distributed") for a in n.names))
    return lines


def _by_line(findings) -> dict:
    out: dict = {}
    for f in findings:
        if f.rule.code == "NM160":
            out[f.span.line] = out.get(f.span.line, "") + " | " + f.message
    return out


def _findings(path: Path):
    text = path.read_text()
    return text, check_text(text, str(path), RuleSet(all_rules()), Settings()).findings


def test_every_nxd_site_has_a_plan():
    total = 0
    for path in FILES:
        text, findings = _findings(path)
        expected = _nxd_lines(text)
        assert expected, path
        got = {f.span.line for f in findings if f.rule.code == "NM160"}
        assert expected <= got, f"{path.name}: NxD lines without an NM160 finding: {sorted(expected - got)}"
        for f in findings:
            if f.rule.code == "NM160":
                # each finding names a native API, not just "NxD"
                assert any(k in f.message for k in ("init_device_mesh", "mesh[", "Parallel", "fully_shard", "DistributedDataParallel",
                                                    "torch.distributed.checkpoint", "clip_grad_norm_", "torch.manual_seed",
                                                    "autocast", "nn.", "dist.", "DTensor", "pipelining")), f.message
        total += len(expected)
    assert total >= 35  # the three files use NxD on this many lines


def test_layer_plans_follow_the_arguments():
    text, findings = _findings(NXD / "modeling_llama_nxd.py")
    by_line = _by_line(findings)
    lines = text.splitlines()

    def msg(snippet):
        return by_line[next(i + 1 for i, ln in enumerate(lines) if snippet in ln)]

    assert "ColwiseParallel()" in msg("self.gate_proj = ColumnParallelLinear") and "gather_output=False" in msg("self.gate_proj =")
    assert "RowwiseParallel()" in msg("self.down_proj = RowParallelLinear") and "input_is_parallel=True" in msg("self.down_proj =")
    assert "nn.Embedding" in msg("self.embed_tokens = ParallelEmbedding") and "RowwiseParallel" in msg("self.embed_tokens =")
    assert "loss_parallel" in msg("loss = parallel_cross_entropy")
    assert "mesh['tp'].size()" in msg("tp = parallel_state.get_tensor_model_parallel_size()")


def test_entry_script_plans():
    text, findings = _findings(NXD / "tp_zero1_llama_pretrain.py")
    lines = text.splitlines()
    by_line = _by_line(findings)

    def msg(snippet):
        return by_line[next(i + 1 for i, ln in enumerate(lines) if snippet in ln)]

    assert 'init_device_mesh("neuron"' in msg("nxd_config = nxd.neuronx_distributed_config(")
    assert "parallelize_module" in msg("model = nxd.initialize_parallel_model(")
    opt = msg("optimizer = nxd.initialize_parallel_optimizer(")
    assert "ZeroRedundancyOptimizer" in opt and "DistributedDataParallel" in opt and "does not average gradients" in opt
    assert "torch.distributed.checkpoint" in msg("nxd.save_checkpoint(") and "torch.distributed.checkpoint" in msg("nxd.load_checkpoint(")
    assert "MixedPrecisionPolicy" in msg("from neuronx_distributed.utils.adamw_fp32_optim_params")


GQA_MODEL = """import torch.nn as nn
from neuronx_distributed.modules.qkv_linear import GQAQKVColumnParallelLinear
from neuronx_distributed.parallel_layers.grads import clip_grad_norm


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv_proj = GQAQKVColumnParallelLinear(64, [64, 16], bias=False, gather_output=False, kv_size_multiplier=2)


def step(model):
    clip_grad_norm(model.parameters(), 1.0)
"""


def test_rewrite_migrates_the_program(tmp_path):
    """The fixture's NxD core is rewritten (NM160's fixes): no NxD import is left, the shared parallel_mesh module
    is written beside the files, and the summary does not count the files as still depending on an XLA library."""
    for p in FILES:
        (tmp_path / p.name).write_text(p.read_text())
    res = cli("rewrite", str(tmp_path), "--write", "--unsafe-fixes")
    out = res.output
    assert res.exit_code == 0, out
    assert "still depend" not in out, out
    for p in FILES:
        assert xla_based_imports((tmp_path / p.name).read_text()) == [], p.name
    assert (tmp_path / "parallel_mesh.py").read_text().startswith(HEADER_LINE)
    assert "3 rewritten files import parallel_mesh" in out, out
    # a second rewrite changes nothing (the module is already there and the files are native)
    again = cli("rewrite", str(tmp_path), "--unsafe-fixes", "--check")
    assert again.exit_code == 0, again.output


def test_rewrite_says_what_is_not_migrated(tmp_path):
    """GQAQKVColumnParallelLinear with replicated KV heads has no DTensor form: it stays reported, the file still
    imports NxD and the summary and the HTML report's data count it as not migrated; clip_grad_norm in the same
    file is re-pointed to the shared module."""
    (tmp_path / "attn.py").write_text(GQA_MODEL)
    res = cli("rewrite", str(tmp_path), "--write", "--unsafe-fixes")
    out = res.output
    assert "1 file still depends on an XLA-based library (neuronx_distributed) and is not migrated" in out, out
    assert re.search(r"^\s*\S*attn\.py: neuronx_distributed", out, re.M), out
    text = (tmp_path / "attn.py").read_text()
    assert "GQAQKVColumnParallelLinear(64" in text and "from parallel_mesh import clip_grad_norm" in text
    assert xla_based_imports(text) == ["neuronx_distributed"]
    data_path = tmp_path / "r.json"
    cli("report", str(tmp_path), "-o", str(tmp_path / "r.html"), "--json", str(data_path))
    data = json.loads(data_path.read_text())
    assert {f["status"] for f in data["files"] if f["path"].endswith("attn.py")} == {"manual"}
    msgs = [f.message for f in check_text(GQA_MODEL, "attn.py", RuleSet(all_rules()), Settings()).findings
            if "GQAQKVColumnParallelLinear(" in GQA_MODEL.splitlines()[f.span.line - 1]]
    assert msgs and all("kv_size_multiplier" in m for m in msgs)


def test_plain_xla_program_is_counted_too(tmp_path):
    (tmp_path / "a.py").write_text("import torch_xla\ntorch_xla._XLAC._set_ir_debug(True)\n")
    (tmp_path / "b.py").write_text("import torch_xla.core.xla_model as xm\nxm.mark_step()\n")
    out = cli("rewrite", str(tmp_path), "--write").output
    assert "1 file still depends on an XLA-based library (torch_xla) and is not migrated" in out, out
    assert re.search(r"^\s*\S*a\.py: torch_xla", out, re.M) and "b.py: torch_xla" not in out, out


def test_optional_imports_do_not_count():
    probe = "try:\n    import torch_xla\n    HAVE = True\nexcept ImportError:\n    HAVE = False\n"
    assert xla_based_imports(probe) == []
    assert xla_based_imports("import os\nif os.environ.get('X'):\n    from optimum.neuron import NeuronTrainer\n") == ["optimum.neuron"]
    assert xla_based_imports("from optimum import neuron\n") == ["optimum.neuron"]
    assert xla_based_imports("import optimum.exporters\n") == []
    notebook = '{"cells": [{"source": [\n    "import torch\\n",\n    "import neuronx_distributed as nxd\\n"\n]}]}'
    assert xla_based_imports(notebook, python=False) == ["neuronx_distributed"]


def test_optimum_neuron_and_nki_are_reported():
    text = ("from optimum.neuron import NeuronTrainer, NeuronTrainingArguments\n"
            "from neuronxcc import nki\n"
            "import neuronxcc.nki.language as nl\n"
            "args = NeuronTrainingArguments(output_dir='o', tensor_parallel_size=2, zero_1=True)\n"
            "trainer = NeuronTrainer(model=None, args=args)\n"
            "@nki.jit\n"
            "def k(a):\n"
            "    return nl.load(a)\n")
    findings = check_text(text, "t.py", RuleSet(all_rules()), Settings()).findings
    got = {(f.rule.code, f.span.line) for f in findings}
    assert {("NM161", 1), ("NM161", 4), ("NM161", 5), ("NM162", 2), ("NM162", 3), ("NM162", 6), ("NM162", 8)} <= got, got
    args = next(f.message for f in findings if (f.rule.code, f.span.line) == ("NM161", 4))
    assert "TrainingArguments" in args and "tensor_parallel_size, zero_1" in args


def test_every_xla_fsdp_and_spmd_site_has_a_plan():
    """The XLA FSDP and SPMD fixtures (tests/fixtures/trainium/xla_fsdp, xla_spmd): each line using an FSDP or SPMD name
    carries NM151/NM141 or NM150 with its native plan (torch_xla imports in use need no finding of their own: their
    uses have them, NM100)."""
    root = NXD.parent
    cases = [(root / "xla_fsdp" / "train_fsdp.py", ("torch_xla.distributed.fsdp",), {"NM151", "NM141"}, ("fully_shard", "torch.distributed.fsdp")),
             (root / "xla_spmd" / "train_spmd.py", ("torch_xla.distributed.spmd", "torch_xla.experimental.spmd_fully_sharded_data_parallel"),
              {"NM150"}, ("init_device_mesh", "distribute_tensor", "fully_shard", "DeviceMesh", "torchrun", "get_world_size"))]
    for path, prefixes, codes, plan_words in cases:
        text, findings = _findings(path)
        expected = _lines_using(text, prefixes, imports=False)
        assert len(expected) >= 4, path
        got = {f.span.line for f in findings if f.rule.code in codes}
        assert expected <= got, f"{path.name}: lines without a finding: {sorted(expected - got)}"
        planned = {f.span.line for f in findings if f.rule.code in codes and any(w in f.message for w in plan_words)}
        for f in findings:
            if f.rule.code in codes and f.rule.code != "NM141":
                # the plan is said once (NM151: at the file's first kept finding), the other sites point to its line
                pointer = re.search(r"see line (\d+) for why and the native plan", f.message)
                assert any(w in f.message for w in plan_words) or (pointer and int(pointer.group(1)) in planned), f.message
    # the SPMD runtime switches are reported too
    text, findings = _findings(root / "xla_spmd" / "train_spmd.py")
    lines = text.splitlines()
    spmd = {f.span.line for f in findings if f.rule.code == "NM150"}
    assert {i + 1 for i, ln in enumerate(lines) if "xr.use_spmd()" in ln or "global_runtime_device_count" in ln} <= spmd


def test_spmd_plans_are_written_from_the_call():
    from neuron_migrate.rules.builtin.xla_spmd import spec_placements

    names = ("data", "model")
    assert spec_placements(("model", None), names) == ["Replicate()", "Shard(0)"]  # rows split over "model"
    assert spec_placements((None, "model"), names) == ["Replicate()", "Shard(1)"]
    assert spec_placements(("data", None), names) == ["Shard(0)", "Replicate()"]
    assert spec_placements(("data", "model"), names) == ["Shard(0)", "Shard(1)"]
    assert spec_placements((("data", "model"), None), names) == ["Shard(0)", "Shard(0)"]  # one dim over both axes
    assert spec_placements((None, 1), (0, 1)) == ["Replicate()", "Shard(1)"]  # mesh axes by index
    assert spec_placements(("expert", None), names) is None  # not an axis of this mesh
    assert spec_placements(("model", "model"), names) is None  # one mesh axis cannot split two tensor dims
    text, findings = _findings(NXD.parent / "xla_spmd" / "train_spmd.py")
    lines = text.splitlines()
    by_line = {f.span.line: f.message for f in findings if f.rule.code == "NM150"}

    def msg(snippet):
        return by_line[next(i + 1 for i, ln in enumerate(lines) if snippet in ln)]

    assert 'init_device_mesh("neuron", (num_devices // 2, 2), mesh_dim_names=("data", "model"))' in msg("mesh = xs.Mesh(")
    assert "distribute_tensor(model[0].weight, mesh, [Replicate(), Shard(0)])" in msg("xs.mark_sharding(model[0].weight")
    assert "ColwiseParallel()" in msg("xs.mark_sharding(model[0].weight")
    assert "RowwiseParallel()" in msg("xs.mark_sharding(model[2].weight")
    assert "distribute_tensor(x, mesh, [Shard(0), Replicate()])" in msg("xs.mark_sharding(x, mesh")
    assert "fully_shard" in msg("wrapped = FSDPv2(")
    assert "dist.get_world_size()" in msg("num_devices = xr.global_runtime_device_count()")


def test_context_parallel_kernels_and_overrides_have_their_own_plans():
    text = ("from neuronx_distributed.parallel_layers.parallel_state import get_context_model_parallel_size, "
            "get_expert_model_parallel_rank\n"
            "from neuronx_distributed.kernels.flash_attn import nki_flash_attn_func\n"
            "from neuronx_distributed.kernels.ring_attention_kernel import nki_ring_attn_func\n"
            "from neuronx_distributed.overrides.transformer_overrides import apply_rotary_pos_emb\n"
            "ring = get_context_model_parallel_size() > 1\n"
            "ep = get_expert_model_parallel_rank()\n"
            "out = nki_ring_attn_func(1, 2, 3) if ring else nki_flash_attn_func(1, 2, 3)\n"
            "q = apply_rotary_pos_emb(1, 2, 3, 4)\n")
    findings = check_text(text, "m.py", RuleSet(all_rules()), Settings()).findings
    by_line = {}
    for f in findings:
        if f.rule.code == "NM160":
            by_line[f.span.line] = by_line.get(f.span.line, "") + f.message
    assert "mesh['cp'].size()" in by_line[5] and "context_parallel" in by_line[5]
    assert "mesh['ep'].get_local_rank()" in by_line[6]
    assert "context_parallel" in by_line[7] and "scaled_dot_product_attention" in by_line[7]
    assert "transformers" in by_line[8]
