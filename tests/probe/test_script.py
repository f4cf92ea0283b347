"""A training script run by path, as __main__, with its own arguments after `--`."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")

from .helpers import MODELS, marker_lines, rel, run_cli, run_json  # noqa: E402


def test_training_script_by_path():
    rc, rep, p = run_json([rel("train_script.py"), "--", "--steps", "4", "--lr", "0.01"])
    assert rc == 0, p.stderr[-2000:]
    assert rep["status"] == "ok" and rep["args"] == ["--steps", "4", "--lr", "0.01"]
    assert rep["ranks"][0]["steps"] == 4
    assert rep["timing"]["steps"] == 4
    line = marker_lines(MODELS / "train_script.py")["loss"]
    ops = [o for o in rep["ops"] if o["line"] == line]
    assert any(o["op"] == "aten::mse_loss.default" and o["phase"] == "forward" for o in ops)
    assert any(o["phase"] == "backward" and o["attributed"] for o in ops)  # mse_loss_backward, from that line
    assert any(o["phase"] == "optimizer" for o in rep["ops"])
    # model construction (nn.Linear init) is recognised in a script too
    assert any(o["phase"] == "init" and o["op"] == "aten::uniform_.default" for o in rep["ops"])
    assert rep["summary"]["by_status"]["cpu_fallback"]["ops"] == 0 or all(
        r["phases"] != ["init"] for r in rep["cpu_fallback"])


def test_max_steps_stops_a_long_run():
    rc, rep, _ = run_json([rel("train_script.py"), "--max-steps", "2"])  # the script defaults to 1000 steps
    assert rc == 0 and rep["status"] == "ok"
    assert rep["stopped"] == "--max-steps 2 reached" and rep["ranks"][0]["steps"] == 2


def test_time_limit_stops_cleanly():
    rc, rep, _ = run_json([rel("train_script.py"), "--time-limit", "1.5", "--", "--steps", "100000000"])
    assert rc == 0 and rep["stopped"] == "time limit reached"


def test_rich_summary_and_markdown(tmp_path):
    md = tmp_path / "r.md"
    p = run_cli([rel("train_script.py"), "--report", str(md), "--", "--steps", "2"])
    assert p.returncode == 0, p.stderr[-2000:]
    assert "aten ops by status" in p.stdout and "no float64" in p.stdout
    assert md.read_text().startswith("# neuron-migrate probe")


def test_child_exits_after_the_run_s_exit_handlers_without_finalizing(tmp_path):
    """The probe child ends with os._exit once every exit handler ran: finalization is where autograd's device
    thread, still releasing a finished backward pass, made libstdc++ abort runs that had written their results.
    The user's exit handlers still run (and after the interpreter joined their threads); finalizers of what is left
    at interpreter teardown do not."""
    script = tmp_path / "exits.py"
    script.write_text(
        "import atexit, pathlib, threading, time, torch\n"
        f"OUT = pathlib.Path({str(tmp_path)!r})\n"
        "class Teardown:\n"
        "    def __del__(self):\n"
        "        (OUT / 'finalized').write_text('x')\n"
        "KEEP = Teardown()\n"
        "atexit.register(lambda: (OUT / 'atexit').write_text('x'))\n"
        "threading.Thread(target=lambda: (time.sleep(1), (OUT / 'thread').write_text('x'))).start()\n"
        "x = torch.randn(4, 3, requires_grad=True, device='neuron' if hasattr(torch, 'neuron') else 'cpu')\n"
        "(x * 2).sum().backward()\n")
    rc, rep, p = run_json([str(script)], cwd=tmp_path)
    assert rc == 0 and rep["status"] == "ok", p.stderr[-2000:]
    assert (tmp_path / "atexit").exists() and (tmp_path / "thread").exists()
    assert not (tmp_path / "finalized").exists()
