"""Bad and unusual input: a clear per-file message, bytes untouched, the run goes on, exit code 2."""
from __future__ import annotations

import ast
import codecs
import json
import os
import shutil
import stat
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from neuron_migrate.cli.app import app

XLA = "import torch_xla.core.xla_model as xm\n"


def run(*args):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "good.py").write_text(XLA + "xm.mark_step()\nprint('ok')\n")
    return tmp_path


@pytest.mark.parametrize(
    "name,content,needle",
    [
        ("syntax.py", b"def f(:\n    pass\n" + XLA.encode(), "syntax error line 1"),
        ("py2.py", b"print 'hello'\nimport torch_xla\n", "syntax error line 1"),
        ("binary.py", bytes(range(256)) * 8, "binary file"),
        ("bad.ipynb", b'{"cells": [', "invalid JSON"),
        ("notcells.ipynb", b'{"x": 1}', "no 'cells' list"),
        ("badenc.py", b"# -*- coding: no-such-codec -*-\nimport torch_xla\n", "encoding"),
        ("undecodable.py", b"import torch_xla\nx = '\xff\xfe'\n", "cannot decode"),
    ],
)
def test_bad_file_gets_message_and_stays_untouched(tree, name, content, needle):
    bad = tree / name
    bad.write_bytes(content)
    res = run("rewrite", "--write", str(tree))
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if name in ln]
    assert lines and needle in lines[0], res.output
    assert "Traceback" not in res.output
    assert bad.read_bytes() == content
    # the run went on: the good file was rewritten
    assert "mark_step" not in (tree / "good.py").read_text()


def test_symlink_loop_reported(tree):
    os.symlink("b.py", tree / "a.py")
    os.symlink("a.py", tree / "b.py")
    res = run("rewrite", "--write", str(tree))
    assert res.exit_code == 2
    assert "a.py" in res.output and "symlink loop" in res.output
    assert "mark_step" not in (tree / "good.py").read_text()


@pytest.mark.skipif(not shutil.which("setpriv") or os.geteuid() != 0, reason="needs root and setpriv to drop privileges")
def test_unreadable_file_reported():
    import tempfile
    from pathlib import Path

    tree = Path(tempfile.mkdtemp(prefix="nm-unreadable-", dir="/tmp"))
    (tree / "good.py").write_text(XLA + "xm.mark_step()\nprint('ok')\n")
    secret = tree / "secret.py"
    secret.write_text(XLA + "xm.mark_step()\n")
    secret.chmod(0)
    os.chmod(tree, 0o777)
    (tree / "good.py").chmod(0o666)
    drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    probe = subprocess.run([*drop, sys.executable, "-c", "import neuron_migrate"], capture_output=True, text=True)
    if probe.returncode != 0:
        shutil.rmtree(tree)
        pytest.skip(f"this interpreter cannot run as an unprivileged user here: {probe.stderr.strip()[:200]}")
    cmd = [*drop, sys.executable, "-m", "neuron_migrate", "rewrite", "--write", str(tree)]
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HOME": str(tree)})
    assert p.returncode == 2, p.stdout + p.stderr
    assert "secret.py" in p.stderr and "cannot read" in p.stderr
    assert "Traceback" not in p.stderr
    secret.chmod(0o644)
    assert "xm.mark_step()" in secret.read_text()
    assert "mark_step" not in (tree / "good.py").read_text()
    shutil.rmtree(tree)


def test_empty_file_list_and_empty_file(tmp_path, monkeypatch):
    none = run("rewrite", str(tmp_path))  # a folder without any file to process is an error (issue 15)
    assert none.exit_code == 2 and "no Python files found" in none.output
    (tmp_path / "empty.py").write_bytes(b"")
    res = run("rewrite", "--write", str(tmp_path))
    assert res.exit_code == 0
    assert (tmp_path / "empty.py").read_bytes() == b""
    monkeypatch.chdir(tmp_path)
    assert run("rewrite").exit_code == 0  # no path: the current folder


def _rewrite_bytes(tmp_path, name: str, data: bytes) -> bytes:
    f = tmp_path / name
    f.write_bytes(data)
    res = run("rewrite", "--write", str(f))
    assert res.exit_code in (0, 1), res.output
    return f.read_bytes()


def test_latin1_with_cookie_stays_latin1(tmp_path):
    src = "# -*- coding: latin-1 -*-\n" + XLA + "xm.mark_step()\nprint('café')\n"
    out = _rewrite_bytes(tmp_path, "l.py", src.encode("latin-1"))
    assert out == "# -*- coding: latin-1 -*-\nprint('café')\n".encode("latin-1")


def test_bom_stays(tmp_path):
    out = _rewrite_bytes(tmp_path, "b.py", codecs.BOM_UTF8 + (XLA + "xm.mark_step()\nprint('é')\n").encode())
    assert out == codecs.BOM_UTF8 + "print('é')\n".encode()


def test_crlf_and_tabs_preserved_exactly(tmp_path):
    src = "import torch\r\n" + XLA.replace("\n", "\r\n") + "\r\n\r\ndef f(x):\r\n\txm.mark_step()\r\n\treturn x.to(xm.xla_device())  # keep\r\n"
    out = _rewrite_bytes(tmp_path, "c.py", src.encode())
    assert out == b'import torch\r\n\r\n\r\ndef f(x):\r\n\treturn x.to(torch.device("neuron"))  # keep\r\n'


def test_mixed_line_endings_stay(tmp_path):
    src = b"import torch\n" + XLA.encode() + b"a = 1\r\nxm.mark_step()\nb = 2\r\nc = 3\n"
    out = _rewrite_bytes(tmp_path, "m.py", src)
    assert out == b"import torch\na = 1\r\nb = 2\r\nc = 3\n"


def test_file_mode_kept(tmp_path):
    f = tmp_path / "run.py"
    f.write_text("#!/usr/bin/env python\n" + XLA + "xm.mark_step()\n")
    f.chmod(0o751)
    run("rewrite", "--write", str(f))
    assert stat.S_IMODE(f.stat().st_mode) == 0o751
    assert f.read_text() == "#!/usr/bin/env python\n"


def test_large_file_and_deep_nesting(tmp_path):
    big = XLA + "".join(f"x{i} = {i}\n" for i in range(50_000)) + "xm.mark_step()\n"
    out = _rewrite_bytes(tmp_path, "big.py", big.encode())
    assert out.decode() == big[len(XLA):].replace("xm.mark_step()\n", "")
    deep = XLA + "y = " + "(" * 180 + "xm.xla_device()" + ")" * 180 + "\n"
    out = _rewrite_bytes(tmp_path, "deep.py", deep.encode())
    ast.parse(out)
    assert b'torch.device("neuron")' in out


def test_absurd_nesting_is_an_error_not_a_crash(tmp_path):
    f = tmp_path / "nest.py"
    data = (XLA + "y = " + "[" * 5000 + "]" * 5000 + "\n").encode()
    f.write_bytes(data)
    res = run("rewrite", "--write", str(f))
    assert res.exit_code == 2 and "nest.py" in res.output
    assert f.read_bytes() == data


def test_notebook_magics_and_outputs_survive(tmp_path):
    nb = {
        "cells": [
            {"cell_type": "code", "execution_count": 1, "metadata": {}, "outputs": [{"output_type": "stream", "name": "stdout", "text": ["hi\n"]}],
             "source": ["%load_ext autoreload\n", "!nvidia-smi\n", "import torch_xla.core.xla_model as xm\n", "import torch"]},
            {"cell_type": "markdown", "metadata": {}, "source": ["xm.mark_step() in markdown stays\n"]},
            {"cell_type": "code", "execution_count": 2, "metadata": {"tags": ["x"]}, "outputs": [],
             "source": ["%%time\n", "xm.mark_step()\n"]},
            {"cell_type": "code", "execution_count": 3, "metadata": {}, "outputs": [],
             "source": ["d = xm.xla_device()\n", "x = torch.ones(2).to(d)\n", "xm.mark_step()\n", "x?"]},
        ],
        "metadata": {"language_info": {"name": "python"}}, "nbformat": 4, "nbformat_minor": 5,
    }
    f = tmp_path / "n.ipynb"
    f.write_text(json.dumps(nb, indent=1) + "\n")
    res = run("rewrite", "--write", str(f))
    assert res.exit_code in (0, 1), res.output
    out = json.loads(f.read_text())
    cells = out["cells"]
    assert "".join(cells[0]["source"]) == "%load_ext autoreload\n!nvidia-smi\nimport torch"
    assert cells[0]["outputs"] == nb["cells"][0]["outputs"]
    assert cells[1] == nb["cells"][1]
    assert cells[2] == nb["cells"][2]  # a %%time cell magic is not Python: untouched
    assert "".join(cells[3]["source"]) == 'd = torch.device("neuron")\nx = torch.ones(2).to(d)\nx?'
    assert out["metadata"] == nb["metadata"]


def test_file_changed_during_run_is_not_overwritten(tmp_path, monkeypatch):
    from neuron_migrate.files import source

    f = tmp_path / "t.py"
    f.write_text(XLA + "xm.mark_step()\n")
    real = source.write_atomic

    def edit_then_write(src, data):
        f.write_text("# edited by the user meanwhile\n")
        return real(src, data)

    monkeypatch.setattr(source, "write_atomic", edit_then_write)
    res = run("rewrite", "--write", str(f))
    assert res.exit_code == 2
    assert "changed on disk" in res.output
    assert f.read_text() == "# edited by the user meanwhile\n"


def test_a_crashing_rule_costs_only_its_own_findings(tmp_path):
    """A bug in one rule gives that file one internal-error finding naming the rule; the file is still checked and
    rewritten by the other rules (issue 38: it used to be a per-file error that cost the whole file)."""
    from neuron_migrate.pipeline.process import process_file
    from neuron_migrate.rules.api import Settings
    from neuron_migrate.rules.model import FixSafety, Rule, Severity
    from neuron_migrate.rules.registry import RuleSet, all_rules

    def boom(site, ctx):
        raise ZeroDivisionError("bug")

    bad = Rule("NM999", "crashes", "test rule", FixSafety.NONE, Severity.INFO, "doc", triggers=[("call", "torch_xla.core.xla_model.xla_device")],
               check=boom, trigger_words=("torch_xla",))
    f = tmp_path / "a.py"
    f.write_text(XLA + "xm.mark_step()\nd = xm.xla_device()\n")
    for fix in (False, True):
        res = process_file(str(f), RuleSet([bad, *all_rules()]), Settings(), fix=fix, write=fix)
        assert not res.error
        crash = [x for x in res.findings if x.rule.code == "NM999"]
        assert len(crash) == 1 and crash[0].message.startswith("internal error in rule NM999 at line ")
        assert crash[0].span.line == (2 if fix else 3)  # the call's line (in the rewritten text once written)
    # the other rules still ran: mark_step is gone, the device is torch's
    assert f.read_text() == 'import torch\nd = torch.device("neuron")\n'

