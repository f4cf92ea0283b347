"""The rewrite command as a user drives it: modes, exit codes, selection, configuration, summary."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from neuron_migrate.cli.app import app

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "xla_project"
SPAWN = "import torch_xla.core.xla_model as xm\nimport torch_xla.distributed.xla_multiprocessing as xmp\n\n\ndef _mp_fn(i):\n    xm.mark_step()\n\n\nif __name__ == '__main__':\n    xmp.spawn(_mp_fn, args=())\n"


def run(*args):
    return CliRunner().invoke(app, [*args, "--no-color", "--no-cache"], catch_exceptions=False)


@pytest.fixture
def proj(tmp_path) -> Path:
    (tmp_path / "train.py").write_text(SPAWN)
    return tmp_path


def test_default_shows_diff_and_writes_nothing(proj):
    res = run("rewrite", str(proj))
    assert res.exit_code == 1
    assert "-    xm.mark_step()" in res.output and "+++ b/" in res.output
    assert "Nothing was written" in res.output
    assert (proj / "train.py").read_text() == SPAWN


def test_write_then_check_is_clean_and_summary_has_launch_command(proj):
    res = run("rewrite", "--write", str(proj))
    assert "1 of 1 file rewritten (1 written)" in res.output
    assert "NM127 xmp-spawn: 1 fix" in res.output
    # the note's line is of the rewritten file: its launch block starts at line 11 (imports went in above)
    assert "train.py:11: Launch with: torchrun --nproc_per_node=" in res.output
    text = (proj / "train.py").read_text()
    assert "torch_xla" not in text and 'dist.init_process_group("neuron")' in text
    assert res.exit_code == 0  # nothing left to do
    again = run("rewrite", "--check", str(proj))
    assert again.exit_code == 0 and "0 of 1 file would be rewritten" in again.output


def test_check_exits_1_and_writes_nothing(proj):
    res = run("rewrite", "--check", str(proj))
    assert res.exit_code == 1
    assert (proj / "train.py").read_text() == SPAWN


def test_plain_diff(proj):
    res = run("rewrite", "--diff", str(proj))
    assert res.output.startswith("--- a/")
    assert "would be rewritten" not in res.output


def test_select_and_ignore(proj):
    only_mark_step = run("rewrite", "--diff", "--select", "NM101", str(proj)).output
    assert "-    xm.mark_step()" in only_mark_step and "xmp.spawn" not in only_mark_step.split("+++")[1].replace("     xmp.spawn", "")
    ignored = run("rewrite", "--diff", "--ignore", "NM101,NM100", str(proj)).output
    assert "-    xm.mark_step()" not in ignored and "-    xmp.spawn(_mp_fn, args=())" in ignored
    bad = run("rewrite", "--select", "NM9999", str(proj))
    assert bad.exit_code == 2 and "unknown rule selector" in bad.output


def test_configuration_from_pyproject(proj):
    (proj / "pyproject.toml").write_text('[tool.neuron-migrate]\nignore = ["NM101"]\nexclude = ["skip_me.py"]\n')
    (proj / "skip_me.py").write_text("import torch_xla.core.xla_model as xm\nxm.mark_step()\n")
    res = run("rewrite", "--diff", str(proj))
    assert "skip_me.py" not in res.output
    assert "-    xm.mark_step()" not in res.output
    (proj / "pyproject.toml").write_text('[tool.neuron-migrate]\nunknown-key = 1\n')
    bad = run("rewrite", str(proj))
    assert bad.exit_code == 2 and "unknown [tool.neuron-migrate] keys: unknown-key" in bad.output


def test_gitignored_files_are_skipped(proj):
    (proj / ".gitignore").write_text("generated/\n")
    (proj / "generated").mkdir()
    (proj / "generated" / "g.py").write_text("import torch_xla.core.xla_model as xm\nxm.mark_step()\n")
    res = run("rewrite", "--diff", str(proj))
    assert "generated/g.py" not in res.output and "train.py" in res.output


def test_device_style_option(tmp_path):
    f = tmp_path / "d.py"
    f.write_text("import torch_xla.core.xla_model as xm\ndevice = xm.xla_device()\n")
    out = run("rewrite", "--diff", "--device-style", "accelerator", str(f)).output
    assert "+device = _accelerator_device()" in out
    assert run("rewrite", "--device-style", "tpu", str(f)).exit_code == 2


def test_example_project_migrates_completely(tmp_path):
    work = tmp_path / "proj"
    shutil.copytree(EXAMPLES, work)
    res = run("rewrite", "--write", str(work))
    assert res.exit_code == 0, res.output  # everything migrated, nothing left for the user
    assert "need manual migration" not in res.output


def test_performance_notes_are_not_counted_as_manual_work(tmp_path):
    """Issue 36 point 7 / issue 37 point 7: a host-fallback op and a tf32 flag need no change; they are listed apart
    and the "need manual migration" count holds only what does (here: one torch_xla API with no migration)."""
    f = tmp_path / "t.py"
    f.write_text("import torch\nimport torch_xla.core.xla_model as xm\n\ntorch.backends.cuda.matmul.allow_tf32 = True\n\n\n"
                 "def f(a):\n    q, r = torch.linalg.qr(a.to(xm.xla_device()))\n    xm.some_unknown_api()\n    return q\n")
    out = run("rewrite", "--no-color", str(f)).output
    assert "1 item needs manual migration" in out, out
    assert "2 performance notes (listed apart: no change needed)" in out, out
    left, _, notes = out.partition("Performance notes (the program runs as it is; no change needed):")
    assert "NM199" in left and "NM310" not in left and "NM217" not in left
    assert "NM310" in notes and "NM217" in notes
