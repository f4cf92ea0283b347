"""The rewritten fixtures of the value-set, device-flow, device-choice, GradScaler and XLA FSDP rules are real programs: each
`.out.py` imports, and a script (one with a `__main__` guard) runs to the end on CPU with the test-only `neuron`
stand-in (`tests/integration/neuron_on_cpu`), torch_xla absent."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

FIXTURES = Path(__file__).parent / "fixtures" / "rules"
SHIM = Path(__file__).parent / "integration" / "neuron_on_cpu"
CASES = ["NM103/value_sets", "NM304/float64", "NM304/device_flow", "NM207/bf16_removed", "NM203/dispatch", "NM203/dispatch_two", "NM203/idiom",
         "NM203/idiom_accelerator", "NM151/spawn_reshard",
         "NM130/named_parallel"]


@pytest.mark.parametrize("case", CASES)
def test_rewritten_fixture_runs(case, tmp_path):
    out = FIXTURES / f"{case}.out.py"
    text = out.read_text()
    assert "torch_xla" not in text
    env = {**os.environ, "PYTHONPATH": str(SHIM), "OMP_NUM_THREADS": "1"}
    if "__main__" in text:
        cmd = [sys.executable, str(out)]
    else:
        cmd = [sys.executable, "-c", f"import runpy; runpy.run_path({str(out)!r}, run_name='fixture')"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
