"""What the command line imports for the one-file case (pre-commit, the editor): a piped audit needs neither
rich.console, yaml, libcst nor torch; a rewrite with nothing to fix needs no libcst."""
from __future__ import annotations

import subprocess
import sys


def test_piped_audit_of_one_file_imports_neither_rich_console_nor_yaml(tmp_path):
    f = tmp_path / "train.py"
    f.write_text("import torch_xla.core.xla_model as xm\ndevice = xm.xla_device()\n", encoding="utf-8")
    code = ("import atexit, sys\n"
            "atexit.register(lambda: print(sorted(m for m in ('rich.console', 'yaml', 'libcst', 'torch') if m in sys.modules)))\n"
            f"sys.argv = ['neuron-migrate', 'audit', '--no-cache', '-j', '1', {str(f)!r}]\n"
            "from neuron_migrate.cli.app import main\nmain()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "NM1" in out.stdout, out.stdout + out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout[-500:]


def test_rewrite_of_a_file_with_nothing_to_fix_does_not_import_libcst(tmp_path):
    f = tmp_path / "model.py"
    f.write_text("import torch\n\nx = torch.ones(3)\n", encoding="utf-8")
    code = ("import atexit, sys\n"
            "atexit.register(lambda: print('LIBCST' if 'libcst' in sys.modules else 'NO-LIBCST'))\n"
            f"sys.argv = ['neuron-migrate', 'rewrite', '--no-cache', '-j', '1', {str(f)!r}]\n"
            "from neuron_migrate.cli.app import main\nmain()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().endswith("NO-LIBCST"), out.stdout[-500:] + out.stderr[-2000:]
