"""`neuron-migrate verify` as a user runs it: the exit codes, the one message when torch_xla is missing, JSON."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.verify.programs import plant, planted_line, write_program


def _cli(args, env=None, cwd=None):
    return subprocess.run([sys.executable, "-m", "neuron_migrate", "verify", *args], capture_output=True, text=True,
                          timeout=900, env=env, cwd=cwd)


def test_without_an_xla_environment_it_says_how_to_install_one_and_exits_3(tmp_path):
    prog = write_program(tmp_path / "p", "xla")
    env = {k: v for k, v in os.environ.items() if k != "NM_VERIFY_XLA_PYTHON"}
    env["NM_VERIFY_XLA_ENV"] = str(tmp_path / "no-env-here")
    out = _cli([str(prog / "train.py"), "--steps", "2"], env=env)
    assert out.returncode == 3, out.stdout + out.stderr
    msg = out.stderr.strip()
    assert msg.count("\n") == 0  # one line
    assert "python -m neuron_migrate.verify.xla_env --install" in msg and str(tmp_path / "no-env-here") in msg
    assert "--xla-python" in msg
    # a named interpreter without torch_xla: also exit 3, saying which
    out = _cli([str(prog / "train.py"), "--xla-python", sys.executable], env=env)
    assert out.returncode == 3 and "cannot import torch_xla" in out.stderr


def test_no_such_script_exits_2(tmp_path):
    out = _cli([str(tmp_path / "nope.py")])
    assert out.returncode == 2 and "no such script" in out.stderr


def test_a_planted_defect_exits_1_with_json_that_names_the_line(tmp_path):
    pytest.importorskip("torch")
    orig = write_program(tmp_path / "original", "native")
    mig = tmp_path / "migrated"
    shutil.copytree(orig, mig)
    args = plant(mig, "lr x1.001")
    out = _cli([str(mig / "train.py"), "--original", str(orig), "--native-original", "--float64", "--steps", "3",
                "--format", "json", "--json-out", str(tmp_path / "v.json"), "--", *args])
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
    result = json.loads(out.stdout)
    assert result == json.loads((tmp_path / "v.json").read_text())
    assert result["verdict"] == "diverged" and result["comparison"]["first"]["step"] == 0
    assert result["comparison"]["first"]["hparams"][0]["key"] == "lr"
    path, line = planted_line(mig, "lr x1.001")
    assert [h["new"][0] for h in result["where"]["hunks"]] == [line]
    # the faithful copy: exit 0, text
    shutil.rmtree(mig)
    shutil.copytree(orig, mig)
    out = _cli([str(mig / "train.py"), "--original", str(orig), "--native-original", "--steps", "3"])
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert out.stdout.startswith("EQUIVALENT") and "3 optimizer steps compared in float32 mode" in out.stdout
