"""A float16 autocast moved to Neuron beside a loss scaler that is still CUDA's: the scaler turns itself off there, so
the float16 run loses its loss scaling; the autocast's finding says so (minGPT-ddp's trainer, VICReg, DeiT via timm)."""
from neuron_migrate.rules.api import Settings
from neuron_migrate.rules.registry import RuleSet, all_rules
from neuron_migrate.rules.runner import check_text

TRAIN = """\
import torch
{scaler}

def step(model, opt, x):
    with torch.amp.autocast(device_type="cuda", dtype={dtype}):
        loss = model(x).sum()
    with torch.cuda.amp.autocast():
        loss = loss + model(x).sum()
    return loss
"""


def _notes(scaler: str, dtype: str = "torch.float16") -> dict:
    text = TRAIN.format(scaler=scaler, dtype=dtype)
    found = check_text(text, "train.py", RuleSet(all_rules()), Settings()).findings
    return {f.span.line: f.note for f in found if f.rule.code in ("NM201", "NM206")}


def test_the_autocasts_name_the_cuda_scaler():
    notes = _notes("SCALER = torch.cuda.amp.GradScaler()")
    assert set(notes) == {5, 7}
    assert all("The loss scaler at line 2 is CUDA's, which disables itself on Neuron" in n for n in notes.values()), notes


def test_no_word_without_a_cuda_scaler_or_with_bfloat16():
    assert not any("loss scaler" in n for n in _notes('SCALER = torch.amp.GradScaler("neuron")').values())
    notes = _notes("SCALER = torch.cuda.amp.GradScaler()", dtype="torch.bfloat16")
    assert "loss scaler" not in notes.get(5, "") and "loss scaler" in notes[7]  # the CUDA autocast's default is float16
