"""Tiny random-weight transformers models (tests/probe/hf_models.py, built from configs, no downloads) on the
emulated device: the ops, statuses and locations reported, with fallbacks pointing into the modeling files."""
from __future__ import annotations

import os

import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from .helpers import run_json  # noqa: E402

pytestmark = pytest.mark.slow
TF_DIR = os.path.dirname(os.path.dirname(os.path.abspath(transformers.__file__)))  # its site-packages


def _source_line(lib_file: str, line: int) -> str:
    return open(os.path.join(TF_DIR, lib_file), encoding="utf-8").read().splitlines()[line - 1]


@pytest.fixture(scope="module")
def runs(emulator_lib):
    cache: dict[str, dict] = {}

    def get(name: str) -> dict:
        if name not in cache:
            rc, rep, p = run_json([f"tests/probe/hf_models.py:{name}", "--steps", "1"], timeout=900)
            assert rc == 0 and rep["status"] == "ok", p.stderr[-3000:]
            cache[name] = rep
        return cache[name]

    return get


@pytest.mark.parametrize("name,modeling", [("gpt2", "gpt2"), ("bert", "bert"), ("llama", "llama"), ("vit", "vit"),
                                           ("fnet", "fnet")])
def test_ops_are_located_in_the_modeling_files(runs, name, modeling):
    rep = runs(name)
    assert rep["device_kind"] == "emulated"
    # (ones_like: the gradient seed of the probe harness's own loss.backward(), which has no frame outside torch)
    fwd = [o for o in rep["ops"] if o["phase"] == "forward" and o["op"] != "aten::ones_like.default"]
    # every forward op has a location; nearly all of them inside transformers, shown relative to site-packages
    assert all(o.get("lib_file") or o.get("file") for o in fwd)
    in_tf = [o for o in fwd if (o.get("lib_file") or "").startswith("transformers/")]
    assert len(in_tf) >= 0.9 * len(fwd)
    assert any(o["lib_file"] == f"transformers/models/{modeling}/modeling_{modeling}.py" for o in in_tf)
    for o in in_tf[:40]:  # the reported line exists in that file
        assert _source_line(o["lib_file"], o["lib_line"]).strip()
    # backward ops carry the forward site that created their autograd node
    bwd = [o for o in rep["ops"] if o["phase"] == "backward" and o["grad_fn"] != "torch::autograd::AccumulateGrad"]
    assert bwd and sum(o["attributed"] for o in bwd) >= 0.95 * len(bwd)
    assert all((o.get("lib_file") or "").startswith("transformers/") for o in bwd if o["attributed"])
    # the device's dispatch path: AdamW's _foreach_ ops, and no CPU-only flash attention kernel
    names = {o["op"] for o in rep["ops"]}
    assert any(n.startswith("aten::_foreach_") for n in names)
    assert not any("flash_attention_for_cpu" in n for n in names)


def test_vit_fallback_has_its_modeling_line(runs):
    rep = runs("vit")
    fb = {r["op"]: r for r in rep["cpu_fallback"]}
    sites = fb["aten::select_backward.default"]["sites"]
    site = sites[0]
    assert site["lib_file"] == "transformers/models/vit/modeling_vit.py" and site["phase"] == "backward"
    assert "[:, 0" in _source_line(site["lib_file"], site["lib_line"])  # the CLS-token select in the forward
    assert "modeling_vit.py:" in site["site"]
    # select_backward is composite on a backend: the device gets zeros/select/copy_ kernels, its tracker no
    # fallback; the table's note says the same of TorchNeuron ("not reported by get_fallback_ops()")
    row = next(r for r in rep["measured"]["comparison"] if r["op"] == "aten::select_backward")
    assert row["predicted"] == "cpu_fallback" and "aten::select_backward" not in rep["measured"]["fallback_ops"]
    assert "not reported by get_fallback_ops" in fb["aten::select_backward.default"]["note"]


def test_fnet_fft_is_partial_at_the_fft_line(runs):
    rep = runs("fnet")
    part = {r["op"]: r for r in rep["partial"]}
    row = part["aten::_fft_c2c.default"]
    assert "verify on device" in row["note"]  # the table's own fft entry (complex decomposition, unverified)
    for s in row["sites"]:
        assert s["lib_file"] == "transformers/models/fnet/modeling_fnet.py"
        # FNet calls torch.fft.fftn through `self.fourier_transform = partial(torch.fft.fftn, ...)`
        assert "fourier_transform(" in _source_line(s["lib_file"], s["lib_line"])
    # the emulated device gives ops the table rates partial a device kernel: measured as the table predicts
    cmp = {r["op"]: r for r in rep["measured"]["comparison"]}
    assert cmp["aten::_fft_c2c"]["measured"] == "native" and "aten::_fft_c2c" not in rep["measured"]["fallback_ops"]


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_decoder_models_have_no_fallback_in_forward(runs, name):
    rep = runs(name)
    assert not [r for r in rep["cpu_fallback"] if "forward" in r["phases"]]
    assert rep["summary"]["by_status"]["unsupported"]["ops"] == 0
