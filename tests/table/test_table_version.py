"""The default table follows the installed torch / torch-neuronx family; entries can depend on an env var."""
from __future__ import annotations

import sys

import pytest

from neuron_migrate.table import Status, _installed, default_table_path, load_table


@pytest.mark.parametrize("torch_version, table", [("2.13.0+cpu", "2.13.3"), ("2.13.1", "2.13.3"), ("2.14.0", "2.14.3")])
def test_torch_family_picks_its_table(torch_version, table):
    path, warning = default_table_path(torch_version=torch_version, neuronx_version="")
    assert path.name == f"torchneuron-{table}.yaml" and warning is None


def test_torch_without_a_table_warns():
    path, warning = default_table_path(torch_version="2.15.0", neuronx_version="")
    assert path.name == "torchneuron-2.14.3.yaml"
    assert "2.15.0" in warning and "2.13" in warning and "2.14" in warning


def test_neuronx_decides_over_torch():
    path, warning = default_table_path(torch_version="2.14.0", neuronx_version="2.13.3.0.1234")
    assert path.name == "torchneuron-2.13.3.yaml" and warning is None
    path, warning = default_table_path(torch_version="2.13.0", neuronx_version="2.13.4.0")
    assert path.name == "torchneuron-2.13.3.yaml" and "2.13.4.0" in warning
    path, warning = default_table_path(neuronx_version="2.9.0.2.15.32035")
    assert "legacy XLA" in warning


def test_nothing_installed_takes_the_newest():
    path, warning = default_table_path(torch_version="", neuronx_version="")
    assert path.name == "torchneuron-2.14.3.yaml" and warning is None


def test_installed_reads_dist_info_names(tmp_path, monkeypatch):
    (tmp_path / "torch_neuronx-2.14.3.0.99.dist-info").mkdir()
    (tmp_path / "Other_Pkg-1.0.egg-info").mkdir()
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    assert _installed("torch-neuronx") == "2.14.3.0.99"
    assert _installed("other-pkg") == "1.0"
    assert _installed("torch") is None
    path, warning = default_table_path()
    assert path.name == "torchneuron-2.14.3.yaml" and warning is None


def test_installed_torch_is_found_without_importing_it():
    torch_version = _installed("torch")
    if torch_version is None:
        pytest.skip("torch not installed")
    assert "torch" not in sys.modules or torch_version.startswith(sys.modules["torch"].__version__.split("+")[0])
    assert default_table_path()[0].name.startswith("torchneuron-" + ".".join(torch_version.split(".")[:2]))


def test_complex_decompose_env_changes_fft_entries():
    on = load_table(env={})
    e = on.op("aten::_fft_c2r")
    assert e.status is Status.PARTIAL and e.confidence == "low" and e.env_applied is None
    for value in ("0", "false", "OFF"):
        load_table.cache_clear()
        off = load_table(env={"TORCH_NEURONX_COMPLEX_DECOMPOSE": value})
        e = off.op("aten::_fft_c2r")
        assert e.status is Status.UNSUPPORTED, value
        assert e.source_id == "community_canallee" and e.env_applied == "TORCH_NEURONX_COMPLEX_DECOMPOSE=0"
        assert "complex dtypes are not supported natively" in e.note
    load_table.cache_clear()
    assert load_table(env={"TORCH_NEURONX_COMPLEX_DECOMPOSE": "1"}).op("aten::_fft_c2r").status is Status.PARTIAL


def test_when_env_in_a_child_table(mini_dir):
    child = mini_dir / "torchneuron-10.0.0.yaml"
    child.write_text(
        "extends: torchneuron-9.9.9.yaml\nversion: '10.0.0'\ntorch_neuronx: '10.0.0.0'\n"
        "sources: {}\n"
        "entries:\n"
        "  - name: aten::atan2\n    kind: aten_op\n    status: native\n    source: pre\n"
        "    when_env: {TORCH_NEURONX_COMPLEX_DECOMPOSE: {'0': {status: unsupported, source: docs, note: 'switched off'}}}\n",
        encoding="utf-8",
    )
    assert load_table(child, env={}).op("atan2").status is Status.NATIVE
    off = load_table(child, env={"TORCH_NEURONX_COMPLEX_DECOMPOSE": "0"}).op("atan2")
    assert off.status is Status.UNSUPPORTED and off.source_id == "docs" and off.confidence == "high"


def test_when_env_form_is_validated(mini_dir):
    bad = mini_dir / "torchneuron-10.0.1.yaml"
    bad.write_text(
        "extends: torchneuron-9.9.9.yaml\nversion: '10.0.1'\nsources: {}\nentries:\n"
        "  - {name: aten::x, kind: aten_op, status: native, source: pre, when_env: {V: {'0': {status: maybe, source: pre}}}}\n",
        encoding="utf-8",
    )
    from neuron_migrate.table import TableError

    with pytest.raises(TableError, match="when_env.V=0"):
        load_table(bad)
