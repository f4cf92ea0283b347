"""The whole-program distributed model: launch mode, process-group state, DDP wrapping, API families."""
from __future__ import annotations

import ast
import textwrap

import pytest

from neuron_migrate.names.analysis import Analysis
from neuron_migrate.program.distributed import Group, facts

HEAD = """\
import os
import torch
import torch.distributed as dist
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.distributed.xla_multiprocessing as xmp
from torch.nn.parallel import DistributedDataParallel as DDP
"""


def _facts(body: str):
    a = Analysis(HEAD + textwrap.dedent(body))
    return a, facts(a)


def _call(a, name: str, nth: int = 0) -> ast.Call:
    found = [n for n in ast.walk(a.tree) if isinstance(n, ast.Call) and ast.unparse(n.func).endswith(name)]
    found.sort(key=lambda n: (n.lineno, n.col_offset))
    return found[nth]


def test_facts_are_built_once_per_analysis():
    a, f = _facts("x = 1\n")
    assert facts(a) is f


def test_library_has_no_launch_and_no_known_group():
    a, f = _facts("""
        def step(opt):
            xm.optimizer_step(opt)
    """)
    assert not f.entry_point and f.launch is None and not f.single_device
    assert f.group_at(_call(a, "optimizer_step")) is Group.MAYBE


def test_single_device_script_never_starts_a_group():
    a, f = _facts("""
        def main():
            print(xm.get_ordinal())

        if __name__ == "__main__":
            main()
    """)
    assert f.entry_point and f.single_device
    assert f.group_at(_call(a, "get_ordinal")) is Group.NONE


@pytest.mark.parametrize("evidence", [
    'rank = int(os.environ["LOCAL_RANK"])',
    "model = DDP(torch.nn.Linear(1, 1))",
    'dist.init_process_group("xla")',
])
def test_any_sign_of_several_processes_is_not_single_device(evidence):
    _, f = _facts(f"""
        def main():
            {evidence}

        if __name__ == "__main__":
            main()
    """)
    assert not f.single_device


def test_unconditional_init_guarantees_the_group_after_it_and_in_callees():
    a, f = _facts("""
        def setup():
            dist.init_process_group("xla", init_method="xla://")

        def train():
            return xm.get_ordinal()

        def main():
            before = xm.xrt_world_size()
            setup()
            train()

        if __name__ == "__main__":
            main()
    """)
    assert f.launch == "torchrun"
    assert f.group_at(_call(a, "xrt_world_size")) is Group.MAYBE
    assert f.group_at(_call(a, "get_ordinal")) is Group.ALWAYS


def test_flag_guarded_init_is_not_a_guarantee():
    a, f = _facts("""
        def main(flags):
            if flags.ddp:
                dist.init_process_group("xla")
            return xm.get_ordinal()

        if __name__ == "__main__":
            main(None)
    """)
    assert f.group_at(_call(a, "get_ordinal")) is Group.MAYBE


def test_a_function_called_from_sure_and_unsure_places_is_unsure():
    a, f = _facts("""
        def rank():
            return xm.get_ordinal()

        def main():
            rank()
            dist.init_process_group("xla")
            rank()

        if __name__ == "__main__":
            main()
    """)
    assert f.group_at(_call(a, "get_ordinal")) is Group.MAYBE


def test_spawned_worker_gets_the_launch_group_before_and_after_the_rewrite():
    body = """
        def _mp_fn(index, flags):
            if flags.ddp:
                dist.init_process_group("xla")
            return xm.get_ordinal()

        if __name__ == "__main__":
            {launch}
    """
    a, f = _facts(body.format(launch="xmp.spawn(_mp_fn, args=(None,))"))
    assert f.launch == "spawn" and f.launch_needs_init("_mp_fn") and f.launch_inits()
    assert f.group_at(_call(a, "get_ordinal")) is Group.ALWAYS
    rewritten = ('if "WORLD_SIZE" in os.environ:  # started by torchrun\n'
                 '                dist.init_process_group("neuron")\n'
                 '            else:\n'
                 '                dist.init_process_group("neuron", store=dist.HashStore(), rank=0, world_size=1)\n'
                 '            _mp_fn(dist.get_rank(), None)')
    a, f = _facts(body.format(launch=rewritten))
    assert f.launch_inits()
    assert f.group_at(_call(a, "get_ordinal")) is Group.ALWAYS
    # torchrun-only init (no one-process group): a group exists only when torchrun started the program
    a, f = _facts(body.format(launch=rewritten.split("            else")[0] + "            _mp_fn(0, None)"))
    assert f.group_at(_call(a, "get_ordinal")) is Group.LAUNCHED


def test_worker_that_always_inits_needs_no_launch_init():
    a, f = _facts("""
        def _mp_fn(index):
            dist.init_process_group("xla")
            return xm.get_ordinal()

        if __name__ == "__main__":
            torch_xla.launch(_mp_fn)
    """)
    assert f.launch == "launch" and not f.launch_needs_init("_mp_fn") and not f.launch_inits()
    assert f.group_at(_call(a, "get_ordinal")) is Group.ALWAYS


def test_is_initialized_guard_counts_as_a_sure_init():
    a, f = _facts("""
        def main():
            if not dist.is_initialized():
                dist.init_process_group("neuron")
            return xm.get_ordinal()
    """)
    assert f.group_at(_call(a, "get_ordinal")) is Group.ALWAYS


def test_ddp_wrap_behind_a_flag_is_not_always():
    a, f = _facts("""
        def train(model, opt):
            xm.optimizer_step(opt)

        def main(flags):
            model = torch.nn.Linear(2, 2)
            if flags.ddp:
                model = DDP(model)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            train(model, opt)
    """)
    step = _call(a, "optimizer_step")
    assert f.always_wrapped(step.args[0], step) is False
    assert not f.wraps_unconditionally()


def test_unconditional_wrap_followed_through_parameters():
    a, f = _facts("""
        def train(model, opt):
            xm.optimizer_step(opt)

        def main():
            model = DDP(torch.nn.Linear(2, 2))
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            train(model, opt)
    """)
    step = _call(a, "optimizer_step")
    assert f.always_wrapped(step.args[0], step) is True


def test_wrap_of_the_optimizer_model_under_another_name():
    a, f = _facts("""
        def main():
            model = torch.nn.Linear(2, 2)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            ddp_model = DDP(model)
            xm.optimizer_step(opt)
    """)
    step = _call(a, "optimizer_step")
    assert f.always_wrapped(step.args[0], step) is True


def test_unknown_optimizer_is_unknown():
    a, f = _facts("""
        def step(opt):
            xm.optimizer_step(opt)
    """)
    step = _call(a, "optimizer_step")
    assert f.always_wrapped(step.args[0], step) is None


def test_uses_lists_an_api_family_in_source_order():
    a, f = _facts("""
        from torch_xla.core.xla_model import all_reduce

        def g(t):
            x = xm.all_reduce("sum", t)
            fn = xm.all_reduce
            return all_reduce("max", x), fn
    """)
    uses = f.uses(["torch_xla.core.xla_model.all_reduce"])
    assert [type(n).__name__ for n in uses] == ["Call", "Attribute", "Call"]


def test_group_state_is_answered_from_each_block_once(monkeypatch):
    """Every site asks for the group state before its statement; in a 3,000-statement function that rescanned the
    block per site (9.7 s for one file). Each statement's start is now judged once, and the answers stay those of a
    scan: before the init MAYBE, after it ALWAYS, and inside a branch the branch's own init counts."""
    import neuron_migrate.program.distributed as distributed

    n = 300
    body = "".join(f"    x{i} = xm.get_ordinal()\n" + ("    dist.init_process_group('xla')\n" if i == n // 2 else "")
                   for i in range(n))
    a = Analysis(HEAD + "def main():\n" + body + "    if x0:\n        dist.init_process_group('xla')\n"
                 "        y = xm.get_ordinal()\n\nif __name__ == '__main__':\n    main()\n")
    f = facts(a)
    judged = []
    real = distributed.DistributedFacts._starts
    monkeypatch.setattr(distributed.DistributedFacts, "_starts", lambda self, s: judged.append(s) or real(self, s))
    calls = sorted((c for c in ast.walk(a.tree) if isinstance(c, ast.Call) and getattr(c.func, "attr", "") == "get_ordinal"),
                   key=lambda c: c.lineno)
    states = [f.group_at(c) for c in calls]
    assert len(calls) == n + 1 and len(judged) <= n + 10  # a scan per site judged some 45,000
    assert all(s is Group.MAYBE for s in states[: n // 2 + 1])
    assert all(s is Group.ALWAYS for s in states[n // 2 + 1:])  # after the init, and in the branch that inits
