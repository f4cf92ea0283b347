"""Faults in the user's code: each is reported with what was gathered, the child is killed, exit code 2."""
from __future__ import annotations

import os
import time

import pytest

pytest.importorskip("torch")

from .helpers import MODELS, marker_lines, rel, run_json  # noqa: E402


def _dead(pid: int) -> bool:
    for _ in range(600):  # up to a minute: the kill is sent already, this only waits for it to land
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_model_that_raises():
    rc, rep, _ = run_json([f"{rel('failing_model.py')}:make"])
    assert rc == 2 and rep["status"] == "error"
    err = rep["error"]
    assert err["type"] == "ValueError" and "shape mismatch" in err["message"]
    assert err["file"] == rel("failing_model.py") and err["line"] == marker_lines(MODELS / "failing_model.py")["raise"]
    assert any(o["op"] == "aten::addmm.default" for o in rep["ops"])  # gathered before the raise


@pytest.mark.slow
def test_model_that_hangs_is_killed():
    # no wall-clock assertion: the probe's own --timeout is the event under test, generous enough for torch to
    # start and reach the hang on a busy shared machine (it has taken over 20 s); run_cli's own limit only
    # catches a probe that hangs itself
    rc, rep, _ = run_json([f"{rel('hanging_model.py')}:make", "--timeout", "60"], timeout=900)
    assert rc == 2 and rep["status"] == "timeout"
    assert "did not finish within 60 s" in rep["error"]["message"]
    assert rep["outcome"]["timed_out"] and rep["outcome"]["killed"]
    assert any(o["op"] == "aten::addmm.default" for o in rep["ops"])  # partial results kept
    assert rep["ranks"][0]["status"] == "killed"
    assert _dead(rep["ranks"][0]["pid"])


def test_model_that_calls_os_exit():
    rc, rep, _ = run_json([f"{rel('exit_model.py')}:make"])
    assert rc == 2 and rep["status"] == "error"
    err = rep["error"]
    assert err["type"] == "os._exit" and "os._exit(3)" in err["message"]
    assert err["line"] == marker_lines(MODELS / "exit_model.py")["exit"]
    assert any(o["op"] == "aten::atan2.default" for o in rep["ops"])
    assert rep["outcome"]["returncode"] == 3


def test_model_that_prints_megabytes_is_stopped():
    rc, rep, p = run_json([f"{rel('noisy_model.py')}:make", "--steps", "1"])
    # more than --max-output-mb (default 4 MiB) is an output flood: stopped, reported, exit 2. Whether the child is
    # still printing when the probe looks, or has just finished, is timing: it is a flood either way
    assert rc == 2 and rep["status"] == "error"
    assert rep["error"]["type"] == "OutputFlood" and "4 MiB" in rep["error"]["message"]
    if "killed" in rep["outcome"]:
        assert rep["outcome"]["killed"]["process_group"] > 0  # the whole group was killed
    else:
        assert "it had finished" in rep["error"]["message"] and rep["outcome"]["returncode"] == 0
    assert _dead(rep["ranks"][0]["pid"])
    assert len(p.stdout) < 200_000  # the report itself stays small


@pytest.mark.slow
def test_model_that_prints_megabytes_under_a_raised_limit():
    rc, rep, p = run_json([f"{rel('noisy_model.py')}:make", "--steps", "1", "--max-output-mb", "64"])
    # the output went to files, not pipes that could fill up: a run allowed to print finishes normally
    assert rc == 0 and rep["status"] == "ok"
    out = rep["outcome"]
    assert out["stdout"]["bytes"] >= 4 * 1024 * 1024 and out["stderr"]["bytes"] >= 1024 * 1024
    assert len(out["stdout"]["tail"]) <= 4000
    assert len(p.stdout) < 200_000  # the report itself stays small


def test_noisy_failure_output_is_bounded(tmp_path):
    bad = tmp_path / "noisy_fail.py"
    bad.write_text(
        "import torch\n"
        "def make():\n"
        "    print('y' * 3_000_000)\n"
        "    raise RuntimeError('boom after noise')\n"
    )
    rc, rep, p = run_json([f"{bad}:make"])
    assert rc == 2 and rep["error"]["message"] == "boom after noise" and rep["error"]["line"] == 4
    assert rep["outcome"]["stdout"]["bytes"] > 3_000_000
    assert len(p.stdout) < 200_000


def test_bad_target_and_missing_script():
    from .helpers import run_cli

    p = run_cli(["does/not/exist.py"])
    assert p.returncode == 2 and "no such script" in p.stderr
    p = run_cli(["notatarget"])
    assert p.returncode == 2
    rc, rep, _ = run_json(["no_such_module_xyz:make"])
    assert rc == 2 and rep["error"]["type"] == "ModuleNotFoundError"


def test_hard_crash_is_reported(tmp_path):
    crash = tmp_path / "crash_model.py"
    crash.write_text(
        "import ctypes, torch\n"
        "class M(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        y = torch.atan2(x, x + 1)\n"
        "        ctypes.string_at(0)\n"
        "        return y\n"
        "def make():\n"
        "    return M(), (torch.randn(2, 2, requires_grad=True),)\n"
    )
    rc, rep, _ = run_json([f"{crash}:make", "--steps", "1"])
    assert rc == 2 and rep["status"] == "error"
    assert rep["error"]["type"] == "ChildExit" and "SIGSEGV" in rep["error"]["message"]
    # the op journal keeps ops first seen just before the crash
    assert any(o["op"] == "aten::atan2.default" and o["line"] == 4 for o in rep["ops"])


def test_output_over_the_limit_is_a_flood_even_when_the_child_already_finished(tmp_path):
    """The probe looks at the output's size between waits; a child that printed too much and exited in between is
    an output flood too (the verdict does not depend on when the probe looked)."""
    import subprocess
    import sys

    from neuron_migrate.probe.runner import _wait_watching_output

    for text, limit, expected in (("x" * 5000, 1000, "flood-done"), ("x" * 10, 1000, "done")):
        with open(tmp_path / "out", "wb") as fout, open(tmp_path / "err", "wb") as ferr:
            proc = subprocess.Popen([sys.executable, "-c", f"print({text!r})"], stdout=fout, stderr=ferr)
            proc.wait()  # finished before the probe looks
            assert _wait_watching_output(proc, fout, ferr, timeout=60, max_output=limit) == expected
