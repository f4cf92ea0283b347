"""The shipped fast-loading (compiled JSON) form: current, equal to the YAML, used, and never used when stale."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from neuron_migrate.table import (
    _build,
    _resolve,
    available_tables,
    compile_table,
    compiled_path,
    load_api_map,
    load_table,
)

TABLES = available_tables()


@pytest.mark.parametrize("path", TABLES, ids=lambda p: p.name)
def test_shipped_compiled_form_is_current(path):
    """Fails when a YAML table or the API map changed without `python -m neuron_migrate.table._generate
    --compile-only`."""
    shipped = json.loads(compiled_path(path).read_text(encoding="utf-8"))
    assert shipped == json.loads(json.dumps(compile_table(path)))


@pytest.mark.parametrize("path", TABLES, ids=lambda p: p.name)
def test_compiled_table_equals_yaml_table(path):
    fast = load_table(path)
    assert fast.loaded_from == "compiled"
    slow = _build(path.resolve(), _resolve(path.resolve()))
    assert fast.entries == slow.entries
    assert fast.sources == slow.sources and fast.meta == slow.meta
    assert fast._amap() == load_api_map(path.parent / "api_to_aten.yaml")


def _copy_tables(tmp_path: Path) -> Path:
    src = TABLES[0].parent
    for p in src.iterdir():
        if p.suffix in (".yaml", ".json"):
            shutil.copy(p, tmp_path / p.name)
    return tmp_path / "torchneuron-2.14.3.yaml"


def test_stale_compiled_form_is_not_used(tmp_path):
    child = _copy_tables(tmp_path)
    assert load_table(child).loaded_from == "compiled"
    load_table.cache_clear()
    parent = tmp_path / "torchneuron-2.13.3.yaml"  # editing the parent of an extends chain makes the child stale
    parent.write_text(parent.read_text(encoding="utf-8").replace(
        "- name: aten::atan2\n  kind: aten_op\n  status: cpu_fallback", "- name: aten::atan2\n  kind: aten_op\n  status: native"),
        encoding="utf-8")
    t = load_table(child)
    assert t.loaded_from == "yaml"
    assert t.op("aten::atan2").status.value == "native"


def test_api_map_change_makes_compiled_stale(tmp_path):
    child = _copy_tables(tmp_path)
    amap = tmp_path / "api_to_aten.yaml"
    amap.write_text(amap.read_text(encoding="utf-8").replace("  torch.atan2:\n  - aten::atan2\n",
                                                             "  torch.atan2:\n  - aten::mm\n"), encoding="utf-8")
    load_api_map.cache_clear()
    t = load_table(child)
    assert t.loaded_from == "yaml" and t.ops_for_api("torch.atan2") == ["aten::mm"]


def test_default_load_reads_no_yaml():
    code = (
        "import sys\n"
        "from neuron_migrate.table import load_table\n"
        "t = load_table()\n"
        "assert t.loaded_from == 'compiled', t.loaded_from\n"
        "t.worst_status_for_api('torch.atan2'); t.classify_op('aten::zeros_like'); t.classify_api('torch.sparse.mm')\n"
        "assert 'yaml' not in sys.modules, 'yaml imported'\n"
        "assert 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("path", TABLES, ids=lambda p: p.name)
@pytest.mark.parametrize("switch", [None, "0", "1"])
def test_compiled_build_skips_no_form_of_any_entry(path, switch):
    """The compiled table is built without re-validating each entry; its entries (the when_env form chosen for the
    environment, and the forms kept) are the validating build's, whichever way the switches are set."""
    from neuron_migrate.table.loader import ENV_SWITCHES, _build_compiled, _load_compiled

    env = {} if switch is None else {v: switch for v in ENV_SWITCHES}
    data, api = _load_compiled(path.resolve())
    fast, slow = _build_compiled(path.resolve(), data, env, api), _build(path.resolve(), data, env, api)
    assert [(e, e.when_env) for e in fast.entries] == [(e, e.when_env) for e in slow.entries]
    assert (fast.version, fast.meta, fast.sources, fast._dispatch_path, fast._api_map_path) == (
        slow.version, slow.meta, slow.sources, slow._dispatch_path, slow._api_map_path)
    assert any(e.env_applied for e in fast.entries) == (switch == "0")  # the shipped forms are for "0"


def test_a_compiled_form_edited_by_hand_fails_as_the_yaml_would():
    from neuron_migrate.table.loader import TableError, _build_compiled, _load_compiled

    data, api = _load_compiled(TABLES[0].resolve())
    broken = {**data, "entries": [*data["entries"][:3], {"name": "x", "kind": "api"}]}
    with pytest.raises(TableError, match="entry 'x'"):
        _build_compiled(TABLES[0].resolve(), broken, {}, api)
