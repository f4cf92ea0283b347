"""The probe and the parity run load a target's model and example inputs the same way (child.call_factory)."""
import pytest

torch = pytest.importorskip("torch")

from neuron_migrate.probe import child, parity  # noqa: E402

TARGETS = '''
import torch

def pair():
    return torch.nn.Linear(2, 2), torch.ones(1, 2)

def bare():
    return torch.nn.Linear(2, 2)

def inputs():
    return ((torch.zeros(3, 2),), {})
'''


@pytest.fixture
def spec(tmp_path):
    (tmp_path / "targets.py").write_text(TARGETS)
    return lambda ref, inputs=None: {"target": {"ref": ref}, "cwd": str(tmp_path), **({"inputs": inputs} if inputs else {})}


def test_both_take_the_factorys_inputs_or_inputs_flag(spec):
    model, (args, kwargs) = parity._load_target(spec("targets.py:pair"))
    assert isinstance(model, torch.nn.Linear) and args[0].shape == (1, 2) and kwargs == {}
    model, inputs = child.call_factory(spec("targets.py:bare", "targets.py:inputs"))
    assert isinstance(model, torch.nn.Linear) and inputs[0][0].shape == (3, 2)
    _, (args, _) = parity._load_target(spec("targets.py:pair", "targets.py:inputs"))
    assert args[0].shape == (3, 2)  # --inputs wins over the factory's own


def test_a_model_without_inputs_is_the_same_error_in_both(spec):
    with pytest.raises(parity.ParityError, match="returned a model without example inputs"):
        parity._load_target(spec("targets.py:bare"))

    class Rec:
        phase = ""

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    class W:
        def flush(self, **kw):
            pass

    with pytest.raises(ValueError, match="targets.py:bare returned a model without example inputs; return"):
        child._load_factory(spec("targets.py:bare"), W(), Rec())
