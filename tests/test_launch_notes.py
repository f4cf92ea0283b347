"""The launch note of NM127 tells how many processes torchrun should start, from what xmp.spawn was given."""
from neuron_migrate.rules.api import Settings
from neuron_migrate.rules.registry import RuleSet, all_rules
from neuron_migrate.rules.runner import check_text

SPAWN = """\
import torch_xla.distributed.xla_multiprocessing as xmp


def _mp_fn(index, n):
    print(index, n)


if __name__ == "__main__":
    xmp.spawn(_mp_fn, args=(1,), nprocs={nprocs})
"""


def _note(nprocs: str) -> str:
    text = SPAWN.format(nprocs=nprocs)
    found = [f for f in check_text(text, "train.py", RuleSet(all_rules()), Settings()).findings if f.rule.code == "NM127"]
    assert len(found) == 1 and found[0].note.startswith("Launch with: torchrun --nproc_per_node="), found
    return found[0].note


def test_a_literal_process_count_becomes_the_flag():
    assert _note("8").endswith("(nprocs=8 becomes --nproc_per_node=8)")


def test_a_computed_process_count_is_named_not_pasted_into_the_flag():
    note = _note("args.nproc_per_node")
    assert "--nproc_per_node=args" not in note
    assert note.endswith("(the process count came from `args.nproc_per_node`: give that number as --nproc_per_node)")


def test_one_process_or_none_adds_nothing():
    for nprocs in ("1", "None"):
        assert _note(nprocs).endswith("train.py")
