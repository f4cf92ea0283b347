"""The recorder's per-op fast path keeps the facts of the slow one: locations through a cached outer stack walk,
backward attribution from the op's own outputs (also across an in-place op), exact counts, a hit on the per-op
record only when op, sites and dtypes match. In-process on the CPU (no emulated device needed)."""
from __future__ import annotations

import importlib
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from neuron_migrate.probe import recorder as R  # noqa: E402

from .helpers import marker_lines  # noqa: E402


@pytest.fixture()
def fake_lib(tmp_path, monkeypatch):
    """A module in a folder named site-packages: the recorder treats it as an installed library."""
    lib_dir = tmp_path / "site-packages"
    lib_dir.mkdir()
    (lib_dir / "nm_fake_lib.py").write_text(textwrap.dedent("""\
        import torch


        def scale(x):
            return torch.mul(x, 3)  # PROBE: lib-mul


        def nested(x):
            return scale(x) + 1  # PROBE: lib-add
    """), encoding="utf-8")
    monkeypatch.syspath_prepend(str(lib_dir))
    sys.modules.pop("nm_fake_lib", None)
    mod = importlib.import_module("nm_fake_lib")
    yield mod, marker_lines(lib_dir / "nm_fake_lib.py")
    sys.modules.pop("nm_fake_lib", None)


def _ops(rec, name, phase="forward"):
    return [o for o in rec.ops() if o["op"] == name and o["phase"] == phase]


def test_library_calls_from_different_user_lines_keep_their_own_user_line(tmp_path, fake_lib):
    lib, lib_lines = fake_lib
    user = tmp_path / "user_code.py"
    user.write_text(textwrap.dedent("""\
        def run(lib, x):
            for _ in range(3):
                lib.scale(x)  # PROBE: first
            lib.scale(x)  # PROBE: second
            helper(lib, x)


        def helper(lib, x):
            return lib.nested(x)  # PROBE: third
    """), encoding="utf-8")
    ns: dict = {}
    exec(compile(user.read_text(), str(user), "exec"), ns)
    lines = marker_lines(user)
    x = torch.ones(4)
    rec = R.Recorder()
    with rec:
        ns["run"](lib, x)
    muls = {(o["line"], o["lib_line"]): o["count"] for o in _ops(rec, "aten::mul.Tensor")}
    assert muls == {(lines["first"], lib_lines["lib-mul"]): 3, (lines["second"], lib_lines["lib-mul"]): 1,
                    (lines["third"], lib_lines["lib-mul"]): 1}
    assert all(o["file"] == str(user) and o["lib_file"].endswith("nm_fake_lib.py") for o in _ops(rec, "aten::mul.Tensor"))
    adds = _ops(rec, "aten::add.Tensor")
    assert [(o["line"], o["lib_line"], o["count"]) for o in adds] == [(lines["third"], lib_lines["lib-add"], 1)]


def test_backward_ops_get_the_forward_line_of_their_node_across_an_in_place_op(tmp_path):
    user = tmp_path / "train_code.py"
    user.write_text(textwrap.dedent("""\
        import torch


        def step(w):
            y = w * 2  # PROBE: mul
            y.relu_()  # PROBE: relu
            z = torch.atan2(y, w)  # PROBE: atan2
            z.sum().backward()  # PROBE: backward
    """), encoding="utf-8")
    ns: dict = {}
    exec(compile(user.read_text(), str(user), "exec"), ns)
    lines = marker_lines(user)
    w = torch.rand(5, requires_grad=True)
    rec = R.Recorder()
    with rec:
        ns["step"](w)
    bwd = {o["grad_fn"]: o for o in rec.ops() if o["phase"] == "backward" and o["attributed"]}
    assert bwd["MulBackward0"]["line"] == lines["mul"]
    assert bwd["ReluBackward0"]["line"] == lines["relu"]  # the in-place op's node, not the mul's
    assert bwd["Atan2Backward0"]["line"] == lines["atan2"]
    assert bwd["SumBackward0"]["line"] == lines["backward"]
    fwd = {o["op"]: o["line"] for o in rec.ops() if o["phase"] == "forward"}
    assert fwd["aten::mul.Tensor"] == lines["mul"] and fwd["aten::relu_.default"] == lines["relu"]


def test_a_new_dtype_is_merged_into_the_record_and_counts_stay_exact(tmp_path):
    user = tmp_path / "dtypes.py"
    user.write_text(textwrap.dedent("""\
        import torch


        def run(xs):
            for x in xs:
                torch.neg(x)  # PROBE: neg
    """), encoding="utf-8")
    ns: dict = {}
    exec(compile(user.read_text(), str(user), "exec"), ns)
    rec = R.Recorder()
    with rec:
        ns["run"]([torch.ones(2), torch.ones(2), torch.ones(2, dtype=torch.float64), torch.ones(2)])
    (neg,) = _ops(rec, "aten::neg.default")
    assert neg["count"] == 4 and neg["line"] == marker_lines(user)["neg"]
    assert neg["in_dtypes"] == ["float32", "float64"] and neg["float64"] and not neg["float64_source"]


def test_ops_of_one_call_from_different_user_lines_keep_their_own_user_line(tmp_path, fake_lib):
    """One Python call that dispatches several aten ops (linear: a transpose and a matmul) shares one location;
    the same library line reached from another user line, or from a generator resumed elsewhere, does not."""
    lib, _ = fake_lib
    lib_dir = tmp_path / "site-packages"
    (lib_dir / "nm_fake_gen.py").write_text(textwrap.dedent("""\
        import torch


        def lin(x, w):
            return torch.nn.functional.linear(x, w)  # PROBE: lib-linear


        def negs(x):
            while True:
                yield torch.neg(x)  # PROBE: lib-neg
    """), encoding="utf-8")
    sys.modules.pop("nm_fake_gen", None)
    gen_lib = importlib.import_module("nm_fake_gen")
    lib_lines = marker_lines(lib_dir / "nm_fake_gen.py")
    user = tmp_path / "calls.py"
    user.write_text(textwrap.dedent("""\
        def run(lib, x, w):
            lib.lin(x, w)  # PROBE: lin-a
            lib.lin(x, w)  # PROBE: lin-b
            g = lib.negs(x)
            next(g)  # PROBE: neg-a
            next(g)  # PROBE: neg-b
            next(g)  # PROBE: neg-b2
    """), encoding="utf-8")
    ns: dict = {}
    exec(compile(user.read_text(), str(user), "exec"), ns)
    lines = marker_lines(user)
    rec = R.Recorder()
    try:
        with rec:
            ns["run"](gen_lib, torch.ones(2, 3), torch.ones(4, 3))
    finally:
        sys.modules.pop("nm_fake_gen", None)
    lin_ops = [o for o in rec.ops() if o["lib_line"] == lib_lines["lib-linear"]]
    assert len({o["op"] for o in lin_ops}) >= 2  # the one call dispatched several ops
    for op_name in {o["op"] for o in lin_ops}:
        assert {o["line"]: o["count"] for o in lin_ops if o["op"] == op_name} == {lines["lin-a"]: 1, lines["lin-b"]: 1}
    negs = {o["line"]: o["count"] for o in _ops(rec, "aten::neg.default")}
    assert negs == {lines["neg-a"]: 1, lines["neg-b"]: 1, lines["neg-b2"]: 1}
    assert {o["lib_line"] for o in _ops(rec, "aten::neg.default")} == {lib_lines["lib-neg"]}


def test_code_objects_made_and_dropped_keep_their_own_files(tmp_path):
    """The classification cache is keyed by id(code): a code object freed and another made (ids reused) must not
    inherit the first one's file."""
    rec = R.Recorder()
    seen = []
    with rec:
        for i in range(30):
            path = tmp_path / f"gen_{i}.py"
            src = "import torch\n\ndef f(x):\n    return torch.neg(x)\n"
            path.write_text(src, encoding="utf-8")
            ns: dict = {}
            exec(compile(src, str(path), "exec"), ns)
            ns["f"](torch.ones(1))
            seen.append(str(path))
            del ns
    files = {o["file"]: o["count"] for o in _ops(rec, "aten::neg.default")}
    assert files == {p: 1 for p in seen}
