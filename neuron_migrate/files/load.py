"""Read a file the way the rules see it."""
from __future__ import annotations

from pathlib import Path

from neuron_migrate.files.source import read_source


def load_for_analysis(path: Path):
    """(SourceFile, text the rules see, Notebook or None): a notebook's text is its code cells joined."""
    src = read_source(path) if path.suffix != ".ipynb" else None
    if src is not None:
        return src, src.text, None
    from neuron_migrate.files.notebook import load_notebook
    from neuron_migrate.files.source import SourceFile as SF

    import os
    import stat

    raw = path.read_bytes()
    st = os.stat(path)
    nb = load_notebook(raw)
    sf = SF(path, raw, raw.decode("utf-8-sig"), "utf-8", False, stat.S_IMODE(st.st_mode), st.st_mtime_ns)
    return sf, nb.text, nb
