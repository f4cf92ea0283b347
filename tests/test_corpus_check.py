"""benchmarks/corpus_check.py, the corpus check of issues 10 and 12, exercised without network.

The comparison (a finding after the rewrite that was not there before), the start classification and the
torch_xla blocker are checked on small synthetic inputs; one end-to-end run checks two realistic scripts with
`--paths` (needs ruff, pinned in the `test` extra; skipped with the reason when it is not installed).
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location("_nm_corpus_check", REPO / "benchmarks" / "corpus_check.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses need the module registered
    spec.loader.exec_module(mod)
    return mod


cc = _load()
F = cc.LintFinding


def test_new_lint_sees_only_what_the_rewrite_added():
    before = "import os\nimport torch_xla.core.xla_model as xm\nx = undefined_a\n"
    after = "import os\nimport torch\n\n\nx = undefined_a\ny = helper()\n"
    old = [F("F401", "os", 1, "`os` imported but unused"), F("F821", "undefined_a", 3, "Undefined name `undefined_a`")]
    new = [F("F401", "os", 1, "`os` imported but unused"), F("F401", "torch", 2, "`torch` imported but unused"),
           F("F821", "undefined_a", 5, "Undefined name `undefined_a`"), F("F821", "helper", 6, "Undefined name `helper`")]
    got = cc.new_lint(before, after, old, new)
    assert [(f.code, f.name, f.line) for f in got] == [("F401", "torch", 2), ("F821", "helper", 6)]
    # a second occurrence of a name that was already undefined once is new as well
    twice = new + [F("F821", "undefined_a", 6, "Undefined name `undefined_a`")]
    assert ("F821", "undefined_a") in {(f.code, f.name) for f in cc.new_lint(before, after + "z = undefined_a\n", old, twice)}


def test_start_classification():
    own = {"mypkg"}
    assert cc.classify(0, "", own)[0] == "ok"
    assert cc.classify(None, "", own)[0] == "ok"  # still running at the limit: it got past start-up
    tb = "Traceback (most recent call last):\n  File \"x.py\", line 1\n"
    assert cc.classify(1, tb + "ModuleNotFoundError: No module named 'torch_xla'\n", own)[0] == "fail"
    assert cc.classify(1, tb + "ModuleNotFoundError: No module named 'torch_xla.core'\n", own)[0] == "fail"
    verdict, detail = cc.classify(1, tb + "ModuleNotFoundError: No module named 'optimum.utils'\n", own)
    assert verdict == "needs" and detail.startswith("needs optimum")
    assert cc.classify(1, tb + "ModuleNotFoundError: No module named 'mypkg.sub'\n", own)[0] == "fail"  # its own package
    assert cc.classify(1, tb + "NameError: name '_neuron_rank' is not defined\n", own)[0] == "fail"
    assert cc.classify(1, tb + "  File \"x.py\", line 3\nSyntaxError: invalid syntax\n", own)[0] == "fail"
    assert cc.classify(1, tb + "RuntimeError: something else\n", own)[0] == "fail"


@pytest.mark.parametrize("source, ok", [
    ("import torch_xla.core.xla_model as xm\n", False),
    ("try:\n    import torch_xla\n    HAVE = True\nexcept ImportError:\n    HAVE = False\nassert not HAVE\n", True),
    ("import json\nimport sys\nassert sys.argv[1:] == ['--help']\n", True),
    # availability checks answer "not installed", as they do without the package
    ("import importlib.util\nassert importlib.util.find_spec('torch_xla') is None\n", True),
    ("import torch_xla\n", False),
])
def test_the_wrapper_makes_torch_xla_unimportable(tmp_path, source, ok):
    (tmp_path / "torch_xla").mkdir()  # a torch_xla package on the path (as in the corpus copy) stays hidden
    (tmp_path / "torch_xla" / "__init__.py").write_text("")
    script = tmp_path / "s.py"
    script.write_text(source)
    p = subprocess.run([sys.executable, "-c", cc.START_WRAPPER, "path", str(script), str(tmp_path)],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    verdict, detail = cc.classify(p.returncode, p.stdout + p.stderr, set())
    assert (verdict == "ok") == ok, detail


def test_helper_names_are_the_rewrites_helpers():
    names = cc.helper_names()
    assert {"_neuron_rank", "_neuron_reduce_gradients", "_DeviceLoader", "_RateTracker"} <= names


def test_metrics_helpers_and_private_api():
    before = "import torch\nx = torch.ones(1)\ny = torch._C._foo()\n"
    after = "import torch\n\n\ndef _neuron_rank():\n    return 0\n\n\nx = torch.ones(1)\ny = torch._C._foo()\nz = torch.utils._pytree.tree_map(f, x)\n"
    assert cc.new_private(before, after) == [(10, "torch.utils._pytree")]
    assert cc.diff_added(before, after) == 7
    assert cc.has_main_block("if __name__ == '__main__':\n    pass\n") and not cc.has_main_block("x = 1\n")


@pytest.mark.slow
def test_end_to_end_on_two_realistic_scripts(tmp_path):
    ruff = cc.find_ruff()
    if ruff is None:
        pytest.skip("ruff is not installed (pip install ruff==0.17.6, in the `test` extra)")
    scripts = [REPO / "tests" / "integration" / "realistic" / n for n in ("single_device.py", "launch_flag.py")]
    out, js = tmp_path / "check.md", tmp_path / "check.json"
    p = subprocess.run([sys.executable, str(REPO / "benchmarks" / "corpus_check.py"), "--paths", *map(str, scripts),
                        "--out", str(out), "--json", str(js), "--quiet", "--start-timeout", "120"],
                       capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    data = json.loads(js.read_text())
    assert data["files"] == 2 and data["changed"] == 2
    assert data["lint_failures"] == 0 and data["private_new"] == 0 and data["start_failures"] == 0
    assert data["started"] == 2 and data["start_ok"] == 2, data["start"]
    assert all(v["counted"] and v["verdict"] == "ok" for v in data["start"].values())
    text = out.read_text()
    assert "**PASS**" in text and "paths/single_device.py" in text and "ruff 0.17.6" in text.replace("ruff ruff", "ruff")


def test_missing_modules_of_a_namespace_package_are_not_the_rewrites(tmp_path):
    (tmp_path / "optimum" / "neuron").mkdir(parents=True)
    (tmp_path / "optimum" / "neuron" / "utils.py").write_text("")
    tb = "Traceback (most recent call last):\n"
    # optimum.exporters is not in this wheel (it is in the `optimum` distribution): not judgeable
    assert cc.classify(1, tb + "ModuleNotFoundError: No module named 'optimum.exporters'\n", {"optimum"}, tmp_path)[0] == "needs"
    # a module the wheel has that cannot be imported: a failure
    assert cc.classify(1, tb + "ModuleNotFoundError: No module named 'optimum.neuron.utils'\n", {"optimum"}, tmp_path)[0] == "fail"
    # package data the corpus did not extract
    missing = f"FileNotFoundError: [Errno 2] No such file or directory: '{tmp_path}/optimum/version.info'\n"
    assert cc.classify(1, tb + missing, {"optimum"}, tmp_path)[0] == "needs"
