"""Comments that spoke of torch_xla statements the rewrite removed go with them (issue 36, point 7: leftovers a
reviewer rejects); comments above code that was replaced, or that do not speak of the removed code, stay."""
from neuron_migrate.rewrite.engine import fix_text
from neuron_migrate.rules.api import Settings
from neuron_migrate.rules.registry import RuleSet, all_rules


def _rewrite(text: str) -> str:
    return fix_text(text, "train.py", RuleSet(all_rules()), Settings(unsafe_fixes=True)).text


LOOP = """\
import torch
# XLA imports
import torch_xla.core.xla_model as xm

device = "xla"
model = torch.nn.Linear(2, 2).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    loss = model(torch.ones(1, 2, device=device)).sum()
    loss.backward()
    opt.step()
    ## xm.mark_step is executing the current graph, updating the model params
    xm.mark_step()
    # clear the gradients
    opt.zero_grad()
"""


def test_comments_about_removed_xla_statements_go():
    out = _rewrite(LOOP)
    assert "mark_step" not in out and "XLA imports" not in out, out
    assert out.startswith("import torch\n\ndevice = ")  # one blank line where the import block stood
    assert "    opt.step()\n    # clear the gradients\n    opt.zero_grad()\n" in out  # the user's other comment stays


def test_comments_above_replaced_or_unrelated_code_stay():
    text = """\
import torch
import torch_xla.core.xla_model as xm

# use the XLA device
device = xm.xla_device()
model = torch.nn.Linear(2, 2).to(device)
# the step below syncs (keep this note)
x = model(torch.ones(1, 2, device=device))
# log the result
xm.mark_step()
print(x)
"""
    out = _rewrite(text)
    assert "# use the XLA device\ndevice = torch.device(" in out, out  # replaced, not removed: the comment stays
    assert "# the step below syncs (keep this note)\nx = model(" in out
    assert "# log the result\nprint(x)" in out, out  # names no torch_xla word: it stays


def test_comment_repeated_elsewhere_stays():
    # the same comment text twice: which copy stood above the removed line is not decided by text alone
    text = LOOP + "# XLA imports\nprint(model)\n"
    out = _rewrite(text)
    assert out.count("XLA imports") == 2, out


def test_unused_names_leave_a_one_per_line_import_line_by_line():
    # accelerate's utils/other.py: once xm._maybe_convert_to_cpu is migrated, the guarded torch_xla import and
    # is_torch_xla_available go; the parenthesised import keeps its layout, less that one line
    text = """\
import torch

from mylib.imports import (
    is_numpy_available,
    is_torch_xla_available,
    is_weights_only_available,
)

if is_torch_xla_available():
    import torch_xla.core.xla_model as xm


def save(obj):
    if is_numpy_available() and is_weights_only_available():
        obj = xm._maybe_convert_to_cpu(obj)
    torch.save(obj, "x.pt")
"""
    out = _rewrite(text)
    assert "from mylib.imports import (\n    is_numpy_available,\n    is_weights_only_available,\n)\n" in out, out
    assert "torch_xla" not in out and "_neuron_to_cpu(obj)" in out


def test_a_trailing_comment_about_the_xla_call_goes_with_it():
    text = """\
import torch
import torch_xla.core.xla_model as xm

model = torch.nn.Linear(2, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
if __name__ == "__main__":
    model(torch.ones(1, 2)).sum().backward()
    xm.optimizer_step(optimizer) # XLA MP: performs grad allreduce and optimizer step
    optimizer.zero_grad()  # plain PyTorch (XLA or not): stays
    print("done")  # stays: the line did not change
"""
    out = _rewrite(text)
    assert "    optimizer.step()\n" in out, out
    assert "optimizer.zero_grad()  # plain PyTorch (XLA or not): stays" in out
    assert 'print("done")  # stays' in out


def test_comment_naming_the_removed_device_loader_goes():
    # aws-neuron-samples' ddp/mnist_mlp.py: the comment names MpDeviceLoader, the removed line builds one
    text = """\
import torch
import torch_xla.core.xla_model as xm
import torch_xla.distributed.parallel_loader as pl


def main(train_loader, model):
    device = xm.xla_device()
    # XLA MP: use MpDeviceLoader from torch_xla.distributed
    train_device_loader = pl.MpDeviceLoader(train_loader, device)

    # Run the training loop
    for x, y in train_device_loader:
        model(x).sum().backward()
"""
    out = _rewrite(text)
    assert "MpDeviceLoader" not in out, out
    assert "    # Run the training loop\n    for x, y in train_loader:\n" in out, out


def test_file_without_final_newline_keeps_it_when_an_import_is_added():
    # `import torch` comes in with the rewrite; the untouched last line keeps the file's missing newline
    text = "import torch_xla\n\n\nclass A:\n    def f(self, g):\n        self.g = torch_xla.compile(g)\n\n\nA().f(print)"
    out = _rewrite(text)
    assert out.startswith("import torch\n") and "torch.compile(g, backend=" in out, out
    assert out.endswith("\nA().f(print)"), repr(out[-30:])
