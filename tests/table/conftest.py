from __future__ import annotations

from pathlib import Path

import pytest

from table_testdata import MINI, MINI_MAP

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(autouse=True)
def _clear_table_cache():
    from neuron_migrate.table import load_api_map, load_table

    load_table.cache_clear()
    load_api_map.cache_clear()
    yield
    load_table.cache_clear()
    load_api_map.cache_clear()


@pytest.fixture
def mini_dir(tmp_path: Path) -> Path:
    (tmp_path / "torchneuron-9.9.9.yaml").write_text(MINI, encoding="utf-8")
    (tmp_path / "api_to_aten.yaml").write_text(MINI_MAP, encoding="utf-8")
    return tmp_path


@pytest.fixture
def mini_table(mini_dir: Path):
    from neuron_migrate.table import load_table

    return load_table(mini_dir / "torchneuron-9.9.9.yaml")
