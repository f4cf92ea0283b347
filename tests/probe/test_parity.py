"""Numerical parity (`probe --save-reference/--compare/--emulate-precision`) on small models whose answer is known.

Each model in parity_models/models.py marks the line that introduces its divergence with `# CULPRIT <kind>`;
the probe must fail the gates and name that module and line, and confirm it by a replay.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # end-to-end: trains, runs several processes or the whole corpus

torch = pytest.importorskip("torch")

MODELS = Path(__file__).parent / "parity_models"
MODELS_PY = MODELS / "models.py"


def culprit_line(kind: str) -> int:
    for no, line in enumerate(MODELS_PY.read_text().splitlines(), start=1):
        if line.rstrip().endswith(f"# CULPRIT {kind}"):
            return no
    raise AssertionError(kind)


def probe(*args, cwd=MODELS):
    res = subprocess.run([sys.executable, "-m", "neuron_migrate", "probe", *args], cwd=cwd, capture_output=True,
                         text=True, timeout=600)
    return res


def probe_json(*args, cwd=MODELS):
    args = list(args)
    extra = []
    if "--" in args:  # script arguments stay last
        extra = args[args.index("--"):]
        args = args[:args.index("--")]
    res = probe(*args, "--format", "json", *extra, cwd=cwd)
    assert res.stdout.strip(), res.stderr
    return res.returncode, json.loads(res.stdout)


def _culprit_sites(doc):
    loc = doc["localisation"]
    sites = []
    for c in loc["culprits"]:
        sites.append((c["op"], Path(c["file"]).name, c["line"]))
        sites += [(w["op"], Path(w["file"]).name, w["line"]) for w in c["with"]]
    return loc, sites


def test_float64_cancellation_is_caught_and_localised():
    rc, doc = probe_json("models.py:energy", "--parity", "--emulate-precision", "float64")
    assert rc == 1
    assert not doc["ok"]
    assert doc["origin_module"] == "<model>"  # the cancellation is in Energy.forward, between its children
    loc, sites = _culprit_sites(doc)
    line = culprit_line("float64")
    assert loc["culprits"][0]["op"] == "aten::sub" and loc["culprits"][0]["line"] == line
    # the subtraction only shows what the addition one line above rounded away: both are named
    assert ("aten::add", "models.py", line - 1) in sites
    assert loc["confirmed"] and loc["module_error_with_culprits_exempt"] < 1e-3 < loc["module_error"]


def test_int64_overflow_is_caught_and_localised():
    rc, doc = probe_json("models.py:hash_embed", "--parity", "--emulate-precision", "int64")
    assert rc == 1
    loc, sites = _culprit_sites(doc)
    assert doc["origin_module"] == "<model>"
    assert loc["culprits"][0]["op"] == "aten::mul" and loc["culprits"][0]["line"] == culprit_line("int64")
    assert loc["confirmed"]


def test_bf16_one_pass_variance_is_caught_and_localised():
    rc, doc = probe_json("models.py:block", "--parity", "--emulate-precision", "bf16")
    assert rc == 1
    assert doc["origin_module"] == "norm"
    by_name = {m["module"]: m for m in doc["modules"]}
    assert by_name["up"]["ok"] and not by_name["norm"]["ok"]
    assert by_name["norm"]["class"].endswith("OnePassNorm") and by_name["norm"]["line"] == culprit_line("bf16") - 2  # def forward
    loc, _ = _culprit_sites(doc)
    assert loc["culprits"][0]["line"] == culprit_line("bf16")
    assert loc["confirmed"]


def test_clean_model_passes_every_gate_under_all_emulations():
    rc, doc = probe_json("models.py:clean", "--parity", "--emulate-precision", "float64,int64,bf16")
    assert rc == 0, doc
    assert doc["ok"] and doc["checks"] and all(c["ok"] for c in doc["checks"])
    assert {c["gate"] for c in doc["checks"]} >= {"output[0] cosine", "output[0] relative error", "loss curve", "gradients"}
    assert doc["first_divergent_module"] is None
    # bf16 really was emulated: the outputs differ a little, within the gates
    rel = next(c for c in doc["checks"] if c["gate"] == "output[0] relative error")["value"]
    assert 0 < rel < 0.05


def test_reference_saved_then_compared(tmp_path):
    ref = tmp_path / "clean.nmref"
    res = probe("models.py:clean", "--save-reference", str(ref), "--steps", "4")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Reference saved" in res.stdout and ref.exists()
    saved = torch.load(ref, weights_only=True)  # the reference loads without running pickled code
    assert len(saved["losses"]) == 4 and saved["order"][-1] == "<model>"
    assert set(saved["grad_norms"]) == {"net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias", "net.3.weight",
                                        "net.3.bias"}
    assert saved["activations"]["net.1"]["shape"] == [8, 32]

    same = probe("models.py:clean", "--compare", str(ref))
    assert same.returncode == 0, same.stdout + same.stderr
    assert "All gates passed" in same.stdout and "differs from the reference" not in same.stdout

    rc, doc = probe_json("models.py:clean_migrated", "--compare", str(ref))
    assert rc == 1
    assert doc["first_divergent_module"] == doc["origin_module"] == "net.1"
    assert {m["module"] for m in doc["modules"] if m["ok"]} >= {"net.0"}
    timing = doc["timing"]
    assert timing["reference"]["steps"] == timing["run"]["steps"] == 4
    assert "steady_step_s" in timing["run"] and timing["run"]["first_step_s"] > 0


def test_gates_are_configurable_and_checked(tmp_path):
    rc, doc = probe_json("models.py:clean", "--parity", "--emulate-precision", "bf16", "--gates", "output-rtol=1e-6")
    assert rc == 1
    failed = [c["gate"] for c in doc["checks"] if not c["ok"]]
    assert failed == ["output[0] relative error"]
    bad = probe("models.py:clean", "--parity", "--emulate-precision", "bf16", "--gates", "speed=1")
    assert bad.returncode == 2 and "bad gate" in bad.stdout


def test_unreadable_reference_is_a_one_line_error(tmp_path):
    junk = tmp_path / "junk.nmref"
    junk.write_bytes(b"not a reference")
    res = probe("models.py:clean", "--compare", str(junk))
    assert res.returncode == 2
    assert "not a neuron-migrate reference" in res.stdout and "Traceback" not in res.stdout + res.stderr
    missing = probe("models.py:clean", "--compare", str(tmp_path / "nope.nmref"))
    assert missing.returncode == 2 and "no such reference file" in missing.stdout


def test_script_without_a_model_is_a_one_line_error(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    res = probe(str(script), "--parity", "--emulate-precision", "bf16", cwd=tmp_path)
    assert res.returncode == 2 and "never called a torch.nn.Module" in res.stdout


# ------------------------------------------------------------------------------------------ the emulation itself


def test_emulated_precision_keeps_dtypes_and_changes_values():
    from neuron_migrate.probe.precision import EmulatedPrecision

    a = torch.tensor([1.0e8], dtype=torch.float64)
    with EmulatedPrecision(["float64"]):
        r = (a + 1.0) - a
    assert r.dtype == torch.float64 and float(r) != 1.0  # float32 has no room for the 1 next to 1e8
    i = torch.tensor([70_000], dtype=torch.int64)
    with EmulatedPrecision(["int64"]):
        w = i * i
    assert w.dtype == torch.int64 and int(w) == (70_000 * 70_000 + 2**31) % 2**32 - 2**31
    x = torch.full((1, 1), 1.0 + 2**-10)
    with EmulatedPrecision(["bf16"]):
        y = x @ torch.ones(1, 1)  # mm: in autocast's lower-precision list
        z = x + 0  # elementwise on a float32 input: stays float32
    assert y.dtype == torch.float32 and float(y) == 1.0 and float(z) == 1.0 + 2**-10


def test_emulated_precision_trains(tmp_path):
    """Backward and optimizer steps run under the emulation (dtypes unchanged, gradients finite)."""
    from neuron_migrate.probe.precision import EmulatedPrecision

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1)).double()
    opt = torch.optim.AdamW(model.parameters())
    with EmulatedPrecision(["float64", "int64", "bf16"]):
        loss = model(torch.randn(3, 4, dtype=torch.float64)).sum()
        loss.backward()
        opt.step()
    assert all(p.dtype == torch.float64 and torch.isfinite(p).all() for p in model.parameters())


def test_example_project_walk_through(tmp_path):
    """The README's parity walk-through: reference before migration, compare after `rewrite --write`."""
    import shutil

    repo = Path(__file__).resolve().parents[2]
    before = tmp_path / "before"
    shutil.copytree(repo / "examples" / "xla_project", before)
    ref = tmp_path / "mlp.nmref"
    saved = probe("common.py:parity_model", "--save-reference", str(ref), cwd=before)
    assert saved.returncode == 0, saved.stdout + saved.stderr
    after = tmp_path / "after"
    shutil.copytree(before, after)
    rw = subprocess.run([sys.executable, "-m", "neuron_migrate", "rewrite", "--write", "--no-cache", "."], cwd=after,
                        capture_output=True, text=True, timeout=600)
    assert rw.returncode in (0, 1), rw.stderr
    cmp = probe("common.py:parity_model", "--compare", str(ref), "--emulate-precision", "bf16", cwd=after)
    assert cmp.returncode == 0, cmp.stdout + cmp.stderr
    assert "All gates passed" in cmp.stdout and "emulated precision: bf16" in cmp.stdout


SCRIPT = '''\
import argparse
import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--data-seed", type=int, default=1)
p.add_argument("--shift", type=float, default=0.0)
args = p.parse_args()
torch.manual_seed(1)
device = torch.device("neuron") if hasattr(torch, "neuron") else torch.device("cpu")
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).double().to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(args.data_seed)
data = [(torch.randn(8, 16, dtype=torch.float64, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(10)]
for x, y in data:
    x, y = x.to(device), y.to(device)
    big = model(x) + args.shift
    loss = nn.functional.cross_entropy((big - args.shift) * 100, y)  # CULPRIT script
    opt.zero_grad()
    loss.backward()
    opt.step()
'''


def test_script_reference_and_compare(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    ref = tmp_path / "ref.nmref"
    saved = probe("train.py", "--save-reference", str(ref), "--steps", "2", cwd=tmp_path)
    assert saved.returncode == 0, saved.stdout + saved.stderr
    doc = torch.load(ref, weights_only=True)
    assert len(doc["losses"]) == 2 and len(doc["grad_norms"]["0.weight"]) == 2 and doc["order"][-1] == "<model>"

    rc, same = probe_json("train.py", "--compare", str(ref), cwd=tmp_path)
    assert rc == 0 and same["ok"], same
    assert same["checks"][0]["gate"] == "inputs" and same["checks"][0]["ok"]

    # other data: the inputs gate says so instead of blaming the model
    rc, other = probe_json("train.py", "--compare", str(ref), "--", "--data-seed", "2", cwd=tmp_path)
    assert rc == 1
    assert other["checks"][0]["gate"] == "inputs" and not other["checks"][0]["ok"]


def test_script_parity_finds_divergence_outside_the_model(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    res = probe("train.py", "--parity", "--emulate-precision", "float64", "--steps", "2", "--", "--shift", "1e8",
                cwd=tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "FAIL  loss curve" in res.stdout
    assert "Every module output is within tolerance: the divergence is made after the model's forward" in res.stdout
    clean = probe("train.py", "--parity", "--emulate-precision", "float64", "--steps", "2", cwd=tmp_path)
    assert clean.returncode == 0, clean.stdout
