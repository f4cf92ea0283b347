"""`neuron-migrate audit -` / `rewrite -`: the source comes on standard input, named by --stdin-filename.

The text is processed through a private temporary file of the same name (so that suffix-based handling,
notebooks included, is the one every file gets); results carry the given name. Never cached.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def stdin_results(run, fix: bool, no_cache: bool = False):
    from neuron_migrate.pipeline.parallel import run_files

    name, data = run.stdin
    if not run.groups:
        return
    g = run.groups[0]
    from neuron_migrate.cli.common import add_repository_facts

    # the text is not cached, but the repository it names is read from disk: its model is (unless --no-cache)
    add_repository_facts(run, no_cache=no_cache)
    with tempfile.TemporaryDirectory(prefix="neuron-migrate-stdin-") as tmp:
        path = Path(tmp) / (Path(name).name or "stdin.py")
        path.write_bytes(data)
        os.chmod(path, 0o600)
        for res in run_files([(str(path), g.items[0][1])], g.ruleset.spec, g.settings_kw, fix=fix, write=False, jobs=1):
            yield res
