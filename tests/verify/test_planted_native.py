"""verify end to end with native torch on both sides (the XLA environment is not needed): a faithful migrated copy
is equivalent, bit for bit; each planted one-line defect is caught by the numbers themselves (not only by the
optimizer-settings check), at the step it starts, and localised to the module or optimizer line it is in.
The same defects against the real torch_xla original: test_xla_slow.py."""
from __future__ import annotations

import shutil

import pytest

pytest.importorskip("torch")

from neuron_migrate.verify import harness
from neuron_migrate.verify.render import render_text, summary_line
from neuron_migrate.verify.changes import hunk_line
from tests.verify.programs import ALLREDUCE_TRAIN, MODE_DEFECTS, plant, planted_line, write_program


def _pair(tmp_path, defect=None):
    orig = write_program(tmp_path / "original", "native")
    mig = tmp_path / "migrated"
    shutil.copytree(orig, mig)
    args = plant(mig, defect) if defect else []
    return orig, mig, args


def _verify(orig, mig, args, float64=True, steps=8, localise=False, keep=None):
    return harness.verify(mig, "train.py", args, xla_python="", original=orig, native_original=True, emulate=False,
                          steps=steps, float64=float64, localise=localise, timeout=300, keep=keep)


@pytest.mark.parametrize("float64", [True, False])
def test_a_faithful_copy_is_equivalent(tmp_path, float64):
    orig, mig, args = _pair(tmp_path)
    result = _verify(orig, mig, args + ["--opt", "adamw"], float64=float64)
    assert result["verdict"] == "equivalent", render_text(result)
    cmp = result["comparison"]
    assert cmp["steps"] == 8 and cmp["mode"] == ("float64" if float64 else "float32")
    assert cmp["worst"] == {"loss": 0.0, "grad": 0.0, "param": 0.0, "cosine": 1.0}  # same program, same numbers
    assert result["hunks"] == []


@pytest.mark.parametrize("defect", ["lr x1.001", "momentum 0.9 -> 0.899", "weight decay dropped"])
def test_planted_optimizer_defects_are_caught_at_step_0_and_point_at_the_line(tmp_path, defect):
    orig, mig, args = _pair(tmp_path, defect)
    result = _verify(orig, mig, args)
    assert result["verdict"] == "diverged", render_text(result)
    cmp = result["comparison"]
    assert cmp["first"]["what"] == "hparams" and cmp["first"]["step"] == 0
    # the numbers part too: the parameters after step 0 (lr, weight decay) or step 1 (momentum: no buffer yet)
    assert cmp["first_numeric"] is not None and cmp["first_numeric"]["step"] <= 1, cmp["first_numeric"]
    path, line = planted_line(mig, defect)
    where = result["where"]
    assert where["source"] == f"{path}:{where['source'].split(':')[1]}" and where["optimizer"] in ("SGD", "AdamW")
    assert [h["new"][0] for h in where["hunks"]] == [line]
    assert f"changed by hand at {path}:{line}" in summary_line(result)


def test_a_planted_module_defect_is_localised_to_the_module(tmp_path):
    orig, mig, args = _pair(tmp_path, "gelu made approximate")
    result = _verify(orig, mig, args, localise=True)
    assert result["verdict"] == "diverged"
    assert result["comparison"]["first"]["step"] == 0 and result["comparison"]["first"]["what"] in ("loss", "grad")
    where = result["where"]
    assert where["module"] == "Net.block" and where["phase"] == "forward"
    path, line = planted_line(mig, "gelu made approximate")
    assert where["source"] == "model.py:6"  # class Block
    assert [h["new"][0] for h in where["hunks"]] == [line]
    assert summary_line(result).startswith(f"diverges at step 0 in Net.block (model.py:6), changed by hand at model.py:{line}")


def test_a_program_that_fails_is_reported_as_such(tmp_path):
    orig, mig, args = _pair(tmp_path)
    (mig / "train.py").write_text((mig / "train.py").read_text().replace("model = Net()", "model = Nett()"))
    with pytest.raises(harness.CannotRun, match="(?s)migrated program failed before its first optimizer step.*Nett"):
        _verify(orig, mig, args)


def test_a_migrated_program_that_still_imports_torch_xla_cannot_run(tmp_path):
    prog = write_program(tmp_path / "p", "xla")
    with pytest.raises(harness.CannotRun, match=r"still imports torch_xla \(train.py\)"):
        harness.verify(prog, "train.py", [], xla_python="", original=prog, steps=2)


def test_an_already_migrated_tree_without_a_git_history_asks_for_the_original(tmp_path):
    prog = write_program(tmp_path / "p", "native")
    with pytest.raises(harness.CannotRun, match="--original DIR"):
        harness.verify(prog, "train.py", [], xla_python="", steps=2)


def test_a_program_that_differs_from_itself_is_reported_as_not_deterministic(tmp_path):
    orig, mig, args = _pair(tmp_path)
    for tree in (orig, mig):  # noise the host generator does not draw: os.urandom
        path = tree / "train.py"
        path.write_text(path.read_text().replace(
            "loss = loss_fn(model(data), target)",
            "loss = loss_fn(model(data), target) * (1 + int.from_bytes(__import__('os').urandom(2), 'little') / 1e6)"))
    result = harness.verify(mig, "train.py", args, xla_python="", original=orig, native_original=True, emulate=False,
                            steps=2, check_determinism=True, timeout=300)
    assert result["verdict"] == "not-deterministic" and result["deterministic"] is False
    assert "NOT DETERMINISTIC" in render_text(result)


@pytest.mark.parametrize("defect", [None, pytest.param("gradient averaging dropped", marks=pytest.mark.slow),
                                    pytest.param("world size became 1", marks=pytest.mark.slow)])
def test_two_processes_under_torchrun_show_what_one_cannot(tmp_path, defect):
    """Both defects are invisible with one process (1 process: equivalent); under torchrun with 2 the ranks'
    parameters part after the first step, or their process group has 1 member."""
    from tests.verify.programs import write_ddp_program

    orig = write_ddp_program(tmp_path / "original")
    mig = write_ddp_program(tmp_path / "migrated", defect)
    result = harness.verify(mig, "train.py", [], xla_python="", original=orig, native_original=True, emulate=False,
                            steps=3, timeout=300, nproc=2)
    dist = result["distributed"]
    assert dist["nproc"] == 2 and dist["steps"] == 3
    if defect is None:
        assert result["verdict"] == "equivalent", render_text(result)
        assert dist["ok"] and dist["world_sizes"] == [2, 2] and dist["worst_rank_difference"] == 0.0
        return
    assert result["comparison"]["first_numeric"] is None  # 1 process: nothing to see
    assert result["verdict"] == "diverged"
    first = result["comparison"]["first"]
    if defect == "world size became 1":
        assert first["what"] == "world size" and dist["world_sizes"] == [1, 1]
    else:
        assert first["what"] == "ranks" and first["step"] == 0 and "not averaged" in first["detail"]
    assert summary_line(result).startswith(f"diverges at step {first['step']}")


@pytest.mark.parametrize("defect", MODE_DEFECTS)
def test_a_lost_train_call_is_caught_at_step_0_naming_the_dropout_and_the_line(tmp_path, defect):
    """The program looks at its untrained model in eval mode first; the migrated copy lost the `model.train()`
    after it (a deletion: reported at its line in the original) or kept `model.eval()` there. The modules'
    training flags, recorded at every step, name the Dropout that now runs in eval mode, before any number is
    compared."""
    orig, mig, args = _pair(tmp_path, defect)
    result = _verify(orig, mig, args, localise=True)
    assert result["verdict"] == "diverged", render_text(result)
    first = result["comparison"]["first"]
    assert first["step"] == 0 and first["what"] == "mode", first
    assert first["module"] == "Net.block.drop" and first["migrated_mode"] == "eval"
    assert "Net.block.drop (Dropout) runs in eval mode in the migrated program and in training mode" in first["detail"]
    path, line = planted_line(mig, defect, original=orig)
    where = result["where"]
    assert where["module"] == "Net.block.drop"
    assert [hunk_line(h)[0] for h in where["hunks"]] == [line]
    assert summary_line(result).startswith(f"diverges at step 0 in Net.block.drop ({path}:{line}")
    assert f"changed by hand at {path}:{line}" in summary_line(result)
    text = render_text(result)
    if defect == "model.train() lost":
        assert f"removed at {path}:{line} of the original (not by a rewrite rule): model.train()" in text
        assert where["source"] == f"{path}:{line} of the original"


def test_the_training_flags_agree_on_a_faithful_copy_and_the_mode_calls_are_recorded(tmp_path):
    orig, mig, args = _pair(tmp_path)
    result = _verify(orig, mig, args, steps=3, keep=tmp_path / "keep")
    assert result["verdict"] == "equivalent", render_text(result)
    import json

    meta = json.loads((tmp_path / "keep" / "migrated" / "meta.json").read_text())
    # the first look ran without gradients: no module counts as trained in eval mode
    assert meta["eval_modules"] == {}
    assert [(c["mode"], c["class"], c["step"]) for c in meta["mode_calls"]] == [(False, "Net", 0), (True, "Net", 0)]


def _allreduce_pair(tmp_path, defect):
    from tests.verify.programs import write_allreduce_program

    orig = write_allreduce_program(tmp_path / "original")
    mig = write_allreduce_program(tmp_path / "migrated", defect)
    result = harness.verify(mig, "train.py", [], xla_python="", original=orig, native_original=True, emulate=False,
                            steps=3, timeout=300, nproc=2)
    return orig, mig, result


def test_a_dropped_scale_in_the_gradient_all_reduce_shows_against_the_one_process_trajectory(tmp_path):
    """`p.grad /= world` lost after `dist.all_reduce(p.grad)`: with one process nothing changes (1-process run
    equivalent), the ranks agree with each other and call the same collectives; only the 2-process trajectory
    against the 1-process one shows the gradients summed instead of averaged, at step 0, and the deleted line."""
    orig, mig, result = _allreduce_pair(tmp_path, "scale of the gradient all_reduce dropped")
    assert result["comparison"]["first_numeric"] is None  # 1 process: invisible
    dist = result["distributed"]
    assert dist["world_sizes"] == [2, 2] and dist["worst_rank_difference"] == 0.0 and dist["collectives"]["first"] is None
    traj = dist["trajectory"]
    assert traj["comparable"] and traj["step0_loss_rel"] < 1e-6
    assert result["verdict"] == "diverged", render_text(result)
    first = result["comparison"]["first"]
    assert first["step"] == 0 and first["what"] == "grad (2 processes against 1)"
    assert "norm is 2x the 1-process one" in first["detail"]
    line = ALLREDUCE_TRAIN.splitlines().index("        p.grad /= world") + 1
    assert result["where"]["collective"] == "all_reduce" and result["where"]["source"] == f"train.py:{line - 1}"
    assert summary_line(result).startswith(f"diverges at step 0 in the gradient all_reduce (train.py:{line - 1}), "
                                           f"changed by hand at train.py:{line} of the original (removed: p.grad /= world)")


def test_a_faithful_distributed_copy_matches_its_one_process_trajectory_and_collectives(tmp_path):
    orig, mig, result = _allreduce_pair(tmp_path, None)
    assert result["verdict"] == "equivalent", render_text(result)
    dist = result["distributed"]
    assert dist["trajectory"]["comparable"] and dist["trajectory"]["first"] is None
    assert dist["collectives"]["rows"][0] == {"step": 0, "original": {"all_reduce (gradients)": 6},
                                              "migrated": {"all_reduce (gradients)": 6}}
    text = render_text(result)
    assert "2 processes against 1 (the data split makes them comparable" in text
    assert "migrated (rank 0 of 2): all_reduce (gradients) x6" in text


@pytest.mark.slow
@pytest.mark.parametrize("defect", ["gradient all_reduce added (DDP too)", "gradient all_reduce dropped"])
def test_a_gradient_collective_added_or_dropped_under_torchrun_is_named(tmp_path, defect):
    """DDP kept on top of the manual average reduces every gradient twice (the numbers stay the same: an average
    of equal values): only the count of gradient collectives per step shows it. A dropped all_reduce leaves each
    rank with its own gradients: the count names it along with the ranks' parameters parting."""
    orig, mig, result = _allreduce_pair(tmp_path, defect)
    assert result["comparison"]["first_numeric"] is None
    assert result["verdict"] == "diverged", render_text(result)
    coll = result["distributed"]["collectives"]
    assert coll["first"]["step"] == 0
    text = render_text(result)
    if defect.startswith("gradient all_reduce added"):
        assert coll["first"].get("added") and result["comparison"]["first"]["what"] == "collectives"
        assert result["distributed"]["worst_rank_difference"] == 0.0
        assert coll["rows"][0]["migrated"] == {"all_reduce (DDP)": 1, "all_reduce (gradients)": 6}
        line = ALLREDUCE_TRAIN.splitlines().index("    model = Net()") + 1
        assert "reduces the gradients at 2 places in step 0" in coll["first"]["detail"]
        assert f"changed by hand at train.py:{line}" in summary_line(result), text
    else:
        assert coll["first"].get("dropped") and "calls no all-reduce" in coll["first"]["detail"]
        assert coll["rows"][0]["migrated"] == {}
        line = ALLREDUCE_TRAIN.splitlines().index("        dist.all_reduce(p.grad)") + 1
        assert f"changed by hand at train.py:{line} of the original (removed: dist.all_reduce(p.grad))" in summary_line(result), text
