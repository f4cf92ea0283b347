"""Answers about the whole file that rules need at every site are worked out once per file: xm.all_reduce's
plans (its calls migrate together) and whether the short gradient-average helper serves every optimizer step.
Asked per site, they made a file with 400 all_reduce calls seven times slower than one with 100."""
from __future__ import annotations

import neuron_migrate.rules.builtin.xla_collectives as xc
import neuron_migrate.rules.builtin.xla_distributed as xd
from neuron_migrate.rules.registry import RuleSet
from neuron_migrate.rules.runner import check_text

N = 60
SCRIPT = ("import torch\nimport torch.distributed as dist\nimport torch_xla.core.xla_model as xm\n\n\n"
          "def train(model, opt, t):\n    dist.init_process_group('xla')\n"
          + "".join(f"    total{i} = xm.all_reduce(xm.REDUCE_SUM, t)\n    xm.optimizer_step(opt)\n" for i in range(N))
          + "\n\nif __name__ == '__main__':\n    train(None, None, torch.zeros(1))\n")


def test_whole_file_answers_are_made_once(monkeypatch):
    plans, averages = [], []
    real_plan, real_average = xc._all_reduce_plan, xd._every_average_is_short
    monkeypatch.setattr(xc, "_all_reduce_plan", lambda ctx, node: plans.append(node) or real_plan(ctx, node))
    monkeypatch.setattr(xd, "_every_average_is_short", lambda ctx: averages.append(1) or real_average(ctx))
    result = check_text(SCRIPT, "train.py", RuleSet.select([], []))
    codes = [f.rule.code for f in result.findings]
    assert codes.count("NM117") == N and codes.count("NM110") == N
    assert len(plans) == N  # one plan per call; per site it was N * N
    assert len(averages) == 1
    assert all(f.fix is not None for f in result.findings if f.rule.code in ("NM117", "NM110"))


MESH = ("import torch\nimport torch.distributed as dist\nimport torch_xla.core.xla_model as xm\n\n\n"
        "def train(model, opt, t):\n    dist.init_process_group('xla')\n    opt = torch.optim.SGD(model.parameters())\n"
        + "".join(f"    m{i} = xm.mesh_reduce('m{i}', t.item(), lambda xs: sum(xs))\n"
                  f"    xm.save(opt.state_dict(), 'ck{i}.pt')\n" for i in range(N))
        + "\n\nif __name__ == '__main__':\n    train(None, None, torch.zeros(1))\n")


def test_names_and_models_of_a_scope_are_collected_once(monkeypatch):
    import ast

    big = []
    real = xc._name_counts

    def counting(node):
        if not isinstance(node, ast.Lambda):  # a site's own reduce function is small: counted per site
            big.append(node)
        return real(node)

    monkeypatch.setattr(xc, "_name_counts", counting)
    result = check_text(MESH, "train.py", RuleSet.select([], []))
    meshes = [f for f in result.findings if "mesh_reduce" in f.message]
    assert len(meshes) == N and all(f.fix is not None for f in meshes)
    assert len(big) <= 2  # the function's names once (and the file's, for a free name); per site it was N


def test_rng_pairs_scan_each_scope_once(monkeypatch):
    import neuron_migrate.rules.builtin.xla_misc as misc

    text = ("import torch_xla.core.xla_model as xm\n\n\ndef f():\n"
            + "".join(f"    s{i} = xm.get_rng_state()\n    xm.set_rng_state(s{i})\n" for i in range(N))
            + "    t = xm.get_rng_state()\n    print(t)\n    xm.set_rng_state(t)\n")
    scans = []
    real = misc._scope_body_nodes
    monkeypatch.setattr(misc, "_scope_body_nodes", lambda node: scans.append(node) or real(node))
    result = check_text(text, "seeds.py", RuleSet.select([], []))
    restored = [f for f in result.findings if f.rule.code == "NM133" and f.fix is not None]
    assert len(restored) == 2 * N  # every pair migrates; `t` is printed, so its get and set are reported
    assert len([f for f in result.findings if f.rule.code == "NM133"]) == 2 * N + 2
    assert len(scans) <= 3  # the function's body once (was once per get_rng_state call)
