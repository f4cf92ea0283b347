"""compare.py on hand-made recordings: the gates, the magnitude check cosine misses, settings, localisation."""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from neuron_migrate.verify.changes import change_map, file_hunks, hunks_in
from neuron_migrate.verify.compare import (
    GATES,
    compare_runs,
    localise_module,
    loss_rel,
    mode_of,
    tensor_diff,
)


def _run(losses, grads, params, dtype="float32", hparams=None):
    meta = {"dtype": dtype, "loss_steps": list(range(len(losses))), "optimizers": [{"params": ["w", "b"]}],
            "hparams": hparams or [[{"lr": 0.1}] for _ in params]}
    data = {"losses": [torch.tensor(x, dtype=torch.float64) for x in losses], "grads": grads, "params": params}
    return meta, data


def _trajectory(n=4, scale=1.0, lr=0.1, dtype=torch.float64):
    torch.manual_seed(0)
    w, b = torch.randn(5, 3, dtype=dtype), torch.randn(3, dtype=dtype)
    losses, grads, params = [], [], []
    for _ in range(n):
        gw, gb = w * 0.3 * scale, b * 0.2 * scale
        losses.append(float((w ** 2).sum() * scale))
        grads.append([gw.clone(), gb.clone()])
        w, b = w - lr * gw, b - lr * gb
        params.append([w.clone(), b.clone()])
    return losses, grads, params


def test_identical_runs_are_equivalent_and_the_mode_follows_the_dtype():
    a = _run(*_trajectory(), dtype="float64")
    out = compare_runs(*a, *a)
    assert out["equivalent"] and out["first"] is None and out["mode"] == "float64"
    assert out["steps"] == 4 and out["worst"]["loss"] == 0.0
    assert mode_of({"dtype": "float64"}, {"dtype": "float32"}) == "float32"


def test_noise_below_the_float32_gate_passes_and_above_the_float64_gate_fails():
    la, ga, pa = _trajectory()
    lb = [x * (1 + 3e-6) for x in la]
    a, b = _run(la, ga, pa), _run(lb, ga, pa)
    assert compare_runs(*a, *b)["equivalent"]  # float32: 3e-6 is noise
    out = compare_runs(*a, *b, mode="float64")
    assert not out["equivalent"] and out["first"]["step"] == 0 and out["first"]["what"] == "loss"


def test_a_uniformly_scaled_gradient_keeps_cosine_1_but_fails_on_magnitude():
    g = torch.randn(100, dtype=torch.float64)
    rel, cos = tensor_diff(g, g * 0.5)
    assert cos == pytest.approx(1.0, abs=1e-12) and rel > 0.4
    la, ga, pa = _trajectory()
    _, gb, _ = _trajectory(scale=0.5)
    out = compare_runs(*_run(la, ga, pa), *_run(la, gb, pa))
    assert out["first"]["what"] == "grad" and out["first"]["step"] == 0 and out["first"]["param"] == "w"


def test_a_changed_learning_rate_shows_in_the_parameters_after_step_0_and_in_the_settings():
    a = _run(*_trajectory(lr=0.1), dtype="float64")
    lb, gb, pb = _trajectory(lr=0.1001)
    b = _run(lb, gb, pb, dtype="float64", hparams=[[{"lr": 0.1001}]] * 4)
    out = compare_runs(*a, *b)
    assert out["first"]["what"] == "hparams" and out["first"]["step"] == 0
    assert out["first"]["hparams"] == [{"group": 0, "key": "lr", "original": 0.1, "migrated": 0.1001}]
    assert out["first_numeric"]["what"] == "param" and out["first_numeric"]["step"] == 0


def test_a_setting_only_one_side_has_is_not_a_difference():
    a = _run(*_trajectory(), hparams=[[{"lr": 0.1}]] * 4)
    b = _run(*_trajectory(), hparams=[[{"lr": 0.1, "decoupled_weight_decay": False}]] * 4)
    assert compare_runs(*a, *b)["equivalent"]


def test_implementation_settings_are_not_differences():
    # torch.compile of a step that calls optimizer.step() turns Adam's `capturable` on: the same update
    a = _run(*_trajectory(), hparams=[[{"lr": 0.1, "capturable": False, "foreach": None}]] * 4)
    b = _run(*_trajectory(), hparams=[[{"lr": 0.1, "capturable": True, "foreach": True}]] * 4)
    assert compare_runs(*a, *b)["equivalent"]


def test_a_gradient_of_rounding_noise_on_both_sides_is_not_compared_on_its_own_scale():
    # pytorch/xla's decoder example feeds constant tokens: the query projection's true gradient is zero, and each
    # side holds rounding noise there (cosine ~0) while the other gradients agree
    la, ga, pa = _trajectory()
    ga = [[g[0], torch.full_like(g[1], 1e-12)] for g in ga]
    gb = [[g[0], torch.full_like(g[1], -3e-12)] for g in ga]
    out = compare_runs(*_run(la, ga, pa), *_run(la, gb, pa))
    assert out["equivalent"], out["first"]
    # the same noise against a gradient that is not noise is a difference
    gc = [[g[0], g[0][0] * 0 + 1e-2] for g in ga]
    gd = [[g[0], g[0][0] * 0] for g in ga]
    out = compare_runs(*_run(la, gc, pa), *_run(la, gd, pa))
    assert not out["equivalent"] and out["first"]["what"] == "grad" and out["first"]["param"] == "b"


def test_fewer_steps_on_one_side_is_a_divergence():
    la, ga, pa = _trajectory(4)
    out = compare_runs(*_run(la, ga, pa), *_run(la[:2], ga[:2], pa[:2]))
    assert not out["equivalent"] and out["first"]["what"] == "steps"


def test_loss_rel_handles_nan_and_zero():
    assert loss_rel(float("nan"), float("nan")) == 0.0
    assert math.isinf(loss_rel(1.0, float("nan")))
    assert loss_rel(0.0, 0.0) == 0.0


def test_localise_names_the_first_module_whose_output_differs():
    rows = [{"index": i, "name": n, "class": c, "path": "/p/model.py", "first": f, "last": f + 5}
            for i, (n, c, f) in enumerate([("Net.inp", "Linear", 1), ("Net.block", "Block", 7), ("Net.head", "Linear", 1)])]
    x = torch.randn(4, 3, dtype=torch.float64)
    outs_a = [x, x * 2, x * 3]
    outs_b = [x, x * 2 + 1e-3, x * 3 + 1e-3]
    found = localise_module({"modules": rows}, {"module_outs": outs_a}, {"modules": rows}, {"module_outs": outs_b}, "float64")
    assert found["module"] == "Net.block" and found["phase"] == "forward"
    assert localise_module({"modules": rows}, {"module_outs": outs_a}, {"modules": rows}, {"module_outs": outs_a}, "float64") is None
    # forward agrees; the gradient into the head differs: backward order names it
    grads_a = {0: x, 2: x}
    grads_b = {0: x + 1, 2: x + 1}
    found = localise_module({"modules": rows}, {"module_outs": outs_a, "module_grads": grads_a},
                            {"modules": rows}, {"module_outs": outs_a, "module_grads": grads_b}, "float64")
    assert found["module"] == "Net.head" and found["phase"] == "backward"
    assert GATES["float64"]["module"] < GATES["float32"]["module"]


def test_change_map_names_the_rule_of_each_hunk_and_finds_hunks_by_line(tmp_path):
    old = "import a\nx = 1\ny = 2\nz = 3\n"
    new = "import b\nx = 1\ny = 2\nz = 4\nw = 5\n"
    hunks = file_hunks("t.py", old, new, [("NM100", 1), ("NM999", 3)])  # lines of the new text
    assert [h["codes"] for h in hunks] == [["NM100"], []]
    deleted = file_hunks("t.py", "a\nb\nc\n", "a\nc\n", [("NM100", 2)])
    assert deleted[0]["new"] == [2, 1] and deleted[0]["codes"] == ["NM100"]
    assert hunks[1]["new"] == [4, 5] and hunks[1]["added"] == ["z = 4", "w = 5"]
    assert hunks_in(hunks, "t.py", 4, 4) == [hunks[1]] and hunks_in(hunks, "t.py", 2, 3) == []
    assert hunks_in(hunks, "other.py", 1, 9) == []
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "t.py").write_text(old)
    (tmp_path / "b" / "t.py").write_text(new)
    (tmp_path / "a" / "same.py").write_text("q = 1\n")
    (tmp_path / "b" / "same.py").write_text("q = 1\n")
    assert [h["path"] for h in change_map(tmp_path / "a", tmp_path / "b")] == ["t.py", "t.py"]


def test_compare_ranks_needs_one_group_of_n_and_the_same_parameters_on_every_rank():
    from neuron_migrate.verify.compare import compare_ranks

    w = torch.randn(4, 3, dtype=torch.float64)
    meta = {"world_sizes": [2, 2], "optimizers": [{"params": ["w"]}]}
    same = {"params": [[w], [w * 2]]}
    ok = compare_ranks([meta, meta], [same, same], 2, "float64")
    assert ok["ok"] and ok["first"] is None and ok["world_sizes"] == [2, 2]
    apart = {"params": [[w], [w * 2 + 1e-3]]}
    out = compare_ranks([meta, meta], [same, apart], 2, "float64")
    assert out["first"]["what"] == "ranks" and out["first"]["step"] == 1 and "rank 1" in out["first"]["detail"]
    alone = {"world_sizes": [1, 1]}
    out = compare_ranks([alone, alone], [same, same], 2, "float64")
    assert out["first"]["what"] == "world size" and "group of 1" in out["first"]["detail"]


def test_the_report_shows_the_distributed_check():
    from neuron_migrate.report.html import _divergence_chart, _e
    from neuron_migrate.report.verify_html import verify_section, verify_summary

    doc = {"verdict": "diverged", "script": "train.py", "comparison": {"mode": "float64", "steps": 3, "gates": {"loss": 1e-6},
           "first": {"step": 0, "what": "ranks", "detail": "w differs between rank 0 and rank 1"},
           "rows": [{"step": 0, "loss_rel": 0.0}]},
           "distributed": {"nproc": 2, "world_sizes": [2, 2], "worst_rank_difference": 0.5, "gate": 1e-12, "ok": False}}
    page = verify_section(0, verify_summary("v", doc), _e, _divergence_chart)
    assert 'data-testid="verify-0-distributed">2 processes' in page and "NOT consistent" in page
    assert "w differs between rank 0 and rank 1" in page


def test_parameters_listed_in_another_order_are_matched_by_name():
    """XLA FSDP lists a wrapper's own (remainder) parameters before its wrapped children's; FSDP2 keeps the model's
    order: the same parameters by name are compared with each other, and a real difference still fails."""
    losses, grads, params = _trajectory()
    meta_a, data_a = _run(losses, grads, params)
    swapped = lambda steps: [[ts[1], ts[0]] for ts in steps]  # noqa: E731
    meta_b, data_b = _run(losses, swapped(grads), swapped(params))
    meta_b["optimizers"] = [{"params": ["b", "w"]}]
    assert compare_runs(meta_a, data_a, meta_b, data_b)["equivalent"]
    meta_b["optimizers"] = [{"params": ["w", "b"]}]  # positions alone would compare w with b
    assert not compare_runs(meta_a, data_a, meta_b, data_b)["equivalent"]
    bad = swapped(params)
    bad[1][0] = bad[1][0] * 1.5  # b after step 1
    meta_c, data_c = _run(losses, swapped(grads), bad)
    meta_c["optimizers"] = [{"params": ["b", "w"]}]
    first = compare_runs(meta_a, data_a, meta_c, data_c)["first"]
    assert first["step"] == 1 and first["what"] == "param" and first["param"] == "b"


def test_sharded_parameters_are_recorded_as_the_model_defines_them():
    """XLA FSDP's parameter names and shards (one replica: the whole parameter flattened and padded), and FSDP2's
    DTensors, are recorded as the unwrapped model's parameter: its name and its full tensor."""
    from neuron_migrate.verify import bootstrap

    assert bootstrap._param_name("_fsdp_wrapped_module.0._fsdp_shard_FSDP_SHARD_SEPARATOR__fsdp_wrapped_module"
                                 "_FSDP_SHARD_SEPARATOR_weight") == "0.weight"
    assert bootstrap._param_name("_fsdp_shard_FSDP_SHARD_SEPARATOR__fsdp_wrapped_module_FSDP_SHARD_SEPARATOR_2"
                                 "_FSDP_SHARD_SEPARATOR_bias") == "2.bias"
    assert bootstrap._param_name("module.layers.0.weight") == "module.layers.0.weight"  # DDP's prefix stays
    full = torch.arange(6.0).view(2, 3)
    shard = torch.nn.Parameter(torch.cat([full.reshape(-1), torch.zeros(122)]))
    shard._is_sharded, shard._orig_size = True, full.size()
    assert torch.equal(bootstrap._logical(shard.detach(), shard), full)
    plain = torch.ones(3)
    assert bootstrap._logical(plain, plain) is plain

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        d = distribute_tensor(full, init_device_mesh("cpu", (1,)), [Shard(0)])
        got = bootstrap._logical(d, d)
        assert type(got) is torch.Tensor and torch.equal(got, full)
    finally:
        dist.destroy_process_group()
