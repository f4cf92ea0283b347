"""Which shipped compatibility table applies: the installed torch-neuronx or torch family, else the newest.

Kept apart from the table itself (neuron_migrate/table/loader.py) so that what only needs the choice (the results
cache's fingerprint, the audit's table warning) does not import the table's loader.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

TABLE_GLOB = "torchneuron-*.yaml"


def confidence_rank(c: str | None) -> int:
    """high 3, medium 2, low 1, none 0 (for --min-confidence and for taking the weakest of several)."""
    return {"high": 3, "medium": 2, "low": 1}.get(c or "", 0)


class TableError(ValueError):
    """A compatibility table (or the API map) is missing, is not valid YAML, or does not follow the schema."""


def _data_dir() -> Path:
    from neuron_migrate._data import data_dir

    return data_dir("compat_table")


def _version_key(path: Path) -> tuple:
    m = re.match(r"torchneuron-(.+)\.ya?ml$", path.name)
    ver = m.group(1) if m else path.stem
    parts: list[tuple[int, object]] = []
    for piece in re.split(r"[.\-+]", ver):
        parts.append((0, int(piece)) if piece.isdigit() else (1, piece))
    return tuple(parts)


def available_tables() -> list[Path]:
    """The shipped tables (`compat_table/torchneuron-*.yaml`), oldest version first."""
    d = _data_dir()
    if not d.is_dir():
        return []
    return sorted(d.glob(TABLE_GLOB), key=_version_key)


def _installed(dist: str) -> str | None:
    """The installed version of a distribution, from its `.dist-info` / `.egg-info` folder name on sys.path (what
    importlib.metadata reads, without its 30-70 ms import)."""
    import sys

    key = (dist, tuple(sys.path))
    if key not in _INSTALLED:
        _INSTALLED[key] = _find_installed(dist)
    return _INSTALLED[key]


_INSTALLED: dict[tuple, str | None] = {}  # a process asks for the same distributions again (cache key, warning)


def _find_installed(dist: str) -> str | None:
    import sys

    want = re.sub(r"[-_.]+", "_", dist).lower()
    head = want[:1]
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for n in names:
            if n[:1].lower() != head or not n.endswith((".dist-info", ".egg-info")):
                continue  # a site-packages folder holds hundreds of names: most differ in the first letter
            name, _, ver = n.rsplit(".", 1)[0].partition("-")
            if ver and re.sub(r"[-_.]+", "_", name).lower() == want:
                return ver
    return None


def _family(version: str, parts: int = 2) -> str:
    nums = re.findall(r"\d+", version.split("+")[0])
    return ".".join(nums[:parts])


def _table_version(p: Path) -> str:
    m = re.match(r"torchneuron-(.+)\.ya?ml$", p.name)
    return m.group(1) if m else p.stem


def default_table_path(torch_version: str | None = None, neuronx_version: str | None = None) -> tuple[Path, str | None]:
    """The table for the installed stack and a warning when it does not match (None when it does).

    torch-neuronx, when installed, decides (its family "2.13.3" is the table version; legacy XLA torch-neuronx
    2.9 and older is named in the warning); else the installed torch family (2.13.x <-> torchneuron-2.13.*);
    else, with neither installed (audit usually runs without torch), the newest table. Versions come from
    importlib.metadata: torch is never imported."""
    tables = available_tables()
    if not tables:
        raise TableError(f"no compatibility tables ({TABLE_GLOB}) found in {_data_dir()}")
    by_version = {_table_version(p): p for p in tables}
    tnx = neuronx_version if neuronx_version is not None else _installed("torch-neuronx")
    if tnx:
        fam3 = _family(tnx, 3)
        if fam3 in by_version:
            return by_version[fam3], None
        same = [p for p in tables if _family(_table_version(p)) == _family(tnx)]
        if same:
            return same[-1], (f"no table for torch-neuronx {tnx}; using {same[-1].name} (same torch family)")
        if tuple(int(x) for x in _family(tnx).split(".")) < (2, 13):
            return tables[-1], (f"torch-neuronx {tnx} is the legacy XLA-based library, not TorchNeuron; "
                                f"using {tables[-1].name}")
        return tables[-1], f"no table for torch-neuronx {tnx}; using the newest, {tables[-1].name}"
    tv = torch_version if torch_version is not None else _installed("torch")
    if tv:
        same = [p for p in tables if _family(_table_version(p)) == _family(tv)]
        if same:
            return same[-1], None
        return tables[-1], (f"no TorchNeuron table for the installed torch {tv} (TorchNeuron 2.33 supports torch "
                            f"{' and '.join(sorted({_family(_table_version(p)) for p in tables}))}); "
                            f"using {tables[-1].name}")
    return tables[-1], None
