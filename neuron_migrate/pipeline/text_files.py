"""Per-file processing of launchers, job files and dependency lists (pipeline.process dispatches here by kind)."""
from __future__ import annotations

from typing import Callable

from neuron_migrate.rules.text_runner import LANGUAGE, Doc, TextFixError, check_doc, could_match, fix_doc_text


def parser_for(kind: str) -> Callable[[str, str], Doc]:
    if kind in ("shell", "dockerfile", "env", "yaml"):
        from neuron_migrate.shell.parse import parse
    else:
        from neuron_migrate.deps.parse import parse
    return lambda text, path: parse(kind, text, path)


def process_text_file(path, kind: str, res, ruleset, settings, fix: bool, write: bool):
    """pipeline.process.process_file for a launcher, job file or dependency list (res: its FileResult)."""
    from neuron_migrate.files.source import SourceError, read_source, write_atomic
    from neuron_migrate.pipeline.cache import digest
    from neuron_migrate.rules.runner import RuleCrash

    try:
        src = read_source(path)
    except SourceError as exc:
        res.error = str(exc).replace("not Python source", "not a text file")
        return res
    res.digest = digest(src.raw)
    if not could_match(kind, src.text, ruleset):
        res.skipped = True
        return res
    parse = parser_for(kind)
    try:
        if not fix:
            out = check_doc(parse(src.text, res.path), ruleset, settings)
            res.findings, res.suppressed = out.findings, out.suppressed
            _uncached_if_cross_file(res, kind, src.text)
            return res
        new, applied, applied_findings, remaining, suppressed = fix_doc_text(src.text, res.path, parse, ruleset, settings)
    except (TextFixError, RuleCrash) as exc:
        res.error = str(exc)
        return res
    except RecursionError:
        res.error = "nesting too deep to process"
        return res
    except ImportError as exc:  # the shell grammar is a dependency; a broken install is one line, not a traceback
        res.error = f"cannot parse shell: {exc.name or exc} is not installed (pip install tree-sitter tree-sitter-bash)"
        return res
    res.findings, res.applied, res.applied_findings, res.suppressed = remaining, applied, applied_findings, suppressed
    _uncached_if_cross_file(res, kind, src.text)
    if new != src.text:
        try:
            data = src.encode(new)
        except UnicodeEncodeError as exc:
            res.error = f"cannot encode the rewrite: {exc}; file left unchanged"
            return res
        res.old_text, res.new_text, res.new_bytes = src.text, new, data
        if write:
            try:
                write_atomic(src, data)
                res.written = True
            except (SourceError, OSError) as exc:
                res.error = f"not written: {exc}"
    return res


def _uncached_if_cross_file(res, kind: str, text: str) -> None:
    """A launcher's result can depend on the script it starts (NM505 reads it), which the cache key does not
    cover: such results are not cached (no digest)."""
    if LANGUAGE[kind] == "shell" and "python" in text:
        res.digest = None
