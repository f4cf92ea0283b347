"""A fresh install: probes started at once on an empty emulator cache build the emulated device once and all
succeed (issue 40, point 4).

The fast test drives the build cache with a stand-in compiler that publishes the already built library in
pieces, so a reader that looked at the cache while it was being written would see a partial file; it counts its
runs (one build however many processes ask at once) and the published library must be whole. The slow test runs
two real probes at once on an empty cache with the real compiler."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import REPO, run_json

FAKE_CXX = r'''#!{python}
import os, sys
log = os.environ["NM_FAKE_CXX_LOG"]
if "--version" in sys.argv:
    print("fake-c++ (neuron-migrate test) 1.0")
    sys.exit(0)
with open(log, "a") as fh:  # O_APPEND: one line per build, whoever runs it
    fh.write(f"{{os.getpid()}}\n")
out = sys.argv[sys.argv.index("-o") + 1]
data = open(os.environ["NM_FAKE_CXX_LIB"], "rb").read()
with open(out, "wb") as fh:  # written in pieces, as a compiler writes: a partial file exists for a while
    step = max(1, len(data) // 50)
    for i in range(0, len(data), step):
        fh.write(data[i:i + step])
        fh.flush()
        os.sched_yield()
'''

ASK = r'''
import json, sys
from neuron_migrate.probe.emulator.build import library_path
p = library_path()
print(json.dumps({"path": str(p), "size": p.stat().st_size}))
'''


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_concurrent_first_builds_build_once_and_publish_a_whole_library(tmp_path, emulator_lib):
    cxx = tmp_path / "fake-cxx"
    cxx.write_text(FAKE_CXX.format(python=sys.executable))
    cxx.chmod(0o755)
    log = tmp_path / "builds.log"
    env = dict(os.environ, NM_EMULATOR_CACHE=str(tmp_path / "cache"), NM_EMULATOR_CXX=str(cxx),
               NM_FAKE_CXX_LOG=str(log), NM_FAKE_CXX_LIB=str(emulator_lib),
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = [subprocess.Popen([sys.executable, "-c", ASK], env=env, cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    got = [json.loads(o[0].strip().splitlines()[-1]) for o in outs]
    assert len({g["path"] for g in got}) == 1
    lib = Path(got[0]["path"])
    assert len(log.read_text().splitlines()) == 1  # one build for four processes
    assert all(g["size"] == emulator_lib.stat().st_size for g in got)  # no one saw a partial library
    assert _sha(lib) == _sha(emulator_lib)
    assert not [p.name for p in lib.parent.iterdir() if ".tmp" in p.name]  # nothing left half-written


@pytest.mark.slow
def test_a_failed_build_is_not_published_and_the_next_probe_builds_again(tmp_path, emulator_lib):
    cxx = tmp_path / "fake-cxx"
    cxx.write_text(FAKE_CXX.format(python=sys.executable).replace(
        'data = open(', 'sys.exit(1) if os.environ.get("NM_FAKE_FAIL") else None\ndata = open('))
    cxx.chmod(0o755)
    env = dict(os.environ, NM_EMULATOR_CACHE=str(tmp_path / "cache"), NM_EMULATOR_CXX=str(cxx),
               NM_FAKE_CXX_LOG=str(tmp_path / "builds.log"), NM_FAKE_CXX_LIB=str(emulator_lib),
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    bad = subprocess.run([sys.executable, "-c", ASK], env=dict(env, NM_FAKE_FAIL="1"), cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode != 0 and "building the emulated device failed" in bad.stderr
    good = subprocess.run([sys.executable, "-c", ASK], env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert good.returncode == 0, good.stderr[-2000:]
    assert _sha(Path(json.loads(good.stdout.strip().splitlines()[-1])["path"])) == _sha(emulator_lib)


@pytest.mark.slow
def test_two_probes_started_at_once_on_a_fresh_install_both_succeed(tmp_path, emulator_lib):
    """The real compiler on an empty emulator cache (one build, about a minute of CPU) and an empty Hugging Face
    cache, two probes of tiny transformers models started at once (the models issue 40 saw fail on a fresh install
    were transformers models: the emulator's build and the transformers import both race there)."""
    pytest.importorskip("transformers")
    import concurrent.futures as cf
    import threading

    env = {"NM_EMULATOR_CACHE": str(tmp_path / "cache"), "XDG_CACHE_HOME": str(tmp_path / "xdg"),
           "HF_HOME": str(tmp_path / "hf")}
    start = threading.Barrier(2)

    def probe(entry):
        start.wait()  # both processes start together
        return run_json([f"benchmarks/probe_zoo.py:{entry}", "--steps", "2"], env_extra=env, timeout=1200)

    with cf.ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(probe, ["causal_lm__llama", "causal_lm__gpt2"]))
    for rc, rep, p in runs:
        assert rc == 0 and rep["status"] == "ok" and rep["device_kind"] == "emulated", (rc, p.stderr[-3000:])
        assert rep["ranks"][0]["steps"] == 2
    built = list((tmp_path / "cache").glob("*/libneuron_emulator.so"))
    assert len(built) == 1
