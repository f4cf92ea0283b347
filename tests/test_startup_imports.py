"""What the command line imports for the one-file case (pre-commit, the editor): a piped audit needs neither
rich.console, yaml, libcst, torch, hashlib (OpenSSL), tempfile, dataclasses, inspect, textwrap, typing, tokenize
nor shlex (about 30 ms of start-up together; rules dedent their docs when something reads them, annotations need
no typing at run time, and the encoding is UTF-8 without tokenize where no cookie can be); a rewrite with nothing
to fix needs no libcst."""
from __future__ import annotations

import subprocess
import sys

WATCHED = ("rich.console", "yaml", "libcst", "torch", "hashlib", "tempfile", "dataclasses", "inspect", "textwrap", "typing", "tokenize", "shlex")


def _run(tmp_path, command: str, source: str) -> tuple[str, list]:
    """Run `neuron-migrate COMMAND FILE` in a fresh interpreter: (its output, the watched modules it imported)."""
    f = tmp_path / "train.py"
    f.write_text(source, encoding="utf-8")
    code = ("import atexit, sys\n"
            f"atexit.register(lambda: print('IMPORTED', sorted(m for m in {WATCHED!r} if m in sys.modules)))\n"
            f"sys.argv = ['neuron-migrate', {command!r}, '--no-cache', '-j', '1', {str(f)!r}]\n"
            "from neuron_migrate.cli.app import main\nmain()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    last = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    assert last.startswith("IMPORTED "), out.stdout[-500:] + out.stderr[-2000:]
    return out.stdout, eval(last[len("IMPORTED "):])  # noqa: S307 - our own repr of a list of names


def test_piped_audit_of_one_file_imports_neither_rich_console_nor_yaml(tmp_path):
    out, imported = _run(tmp_path, "audit", "import torch_xla.core.xla_model as xm\ndevice = xm.xla_device()\n")
    assert "NM1" in out  # the audit ran and found the torch_xla use
    assert imported == []


def test_audit_of_a_file_that_touches_the_table_imports_none_of_them(tmp_path):
    out, imported = _run(tmp_path, "audit", "import torch\n\nmodel = torch.compile(torch.nn.Linear(2, 2), mode='max-autotune')\n"
                                             "x = torch.ones(3, dtype=torch.float64)\n")
    assert "NM" in out
    assert imported == []


def test_rewrite_of_a_file_with_nothing_to_fix_does_not_import_libcst(tmp_path):
    out, imported = _run(tmp_path, "rewrite", "import torch\n\nx = torch.ones(3)\n")
    assert "libcst" not in imported and "torch" not in imported


def test_rewrite_whose_edits_are_all_spliced_does_not_import_libcst(tmp_path):
    """Expression edits and plain statement deletions are written into the text (rewrite/apply.py:_splice):
    libcst (0.1-0.3 s to import) loads only for an edit it must make, such as a block a deletion empties."""
    spliced = ("import torch\nimport torch_xla.core.xla_model as xm\n\n\ndef step(model, x):\n"
               "    device = xm.xla_device()\n    y = model(x.to(device))\n    xm.mark_step()\n    return y\n")
    out, imported = _run(tmp_path, "rewrite", spliced)
    assert 'torch.device("neuron")' in out and "-    xm.mark_step()" in out  # it did rewrite the file
    assert "libcst" not in imported
    emptied = "import torch_xla.core.xla_model as xm\n\n\ndef step():\n    xm.mark_step()\n"  # the body becomes `pass`
    out, imported = _run(tmp_path, "rewrite", emptied)
    assert "+    pass" in out and "libcst" in imported
