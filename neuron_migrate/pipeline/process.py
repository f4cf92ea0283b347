"""Process one file for audit or rewrite: read, (notebook) unpack, check or fix, and report per file.

Results are plain data so that they cross process boundaries cheaply (the parallel runner ships paths in
and results out, never parsed trees).
"""
from __future__ import annotations

import os
from pathlib import Path

from neuron_migrate.files.lines import source_lines


# A plain class, not a dataclass: importing dataclasses (and the inspect module it imports) costs every start-up
# about 20 ms. Nothing compares this record, so it keeps identity equality.
class FileResult:
    """What checking or fixing one file gave: plain data, cached and shipped between processes."""

    def __init__(self, path: str, findings: list | None = None, applied: dict | None = None,
                 applied_findings: list | None = None, error: str | None = None, old_text: str | None = None,
                 new_text: str | None = None, new_bytes: bytes | None = None, written: bool = False,
                 suppressed: int = 0, skipped: bool = False, digest: str | None = None, frames: dict | None = None,
                 notes: list | None = None):
        self.path = path
        self.findings = [] if findings is None else findings  # remaining findings (after fixes, in rewrite)
        self.applied = {} if applied is None else applied  # rule code -> count (rewrite)
        self.applied_findings = [] if applied_findings is None else applied_findings
        self.error = error
        self.old_text = old_text  # set when the file would change
        self.new_text = new_text
        self.new_bytes = new_bytes
        self.written = written
        self.suppressed = suppressed
        self.skipped = skipped  # prefilter said nothing can match
        self.digest = digest  # content digest of the bytes this result is for (cache key)
        # audit: the source lines the findings' code frames show, {line: text} (cached with the result, so that a
        # warm run's report reads no file); None when not kept (notebooks: their frames count lines per cell)
        self.frames = frames
        self.notes = [] if notes is None else notes  # what the user should know about how the file was checked
        # rewrite: the XLA-based libraries the file still imports after the rewrite (`xla_libraries`; the summary
        # lists them), worked out beside the rewrite and cached with it; None: not worked out here
        self.xla_libs = None

    @property
    def changed(self) -> bool:
        return self.new_bytes is not None


def xla_libraries(res: FileResult, parsed: tuple | None = None) -> list:
    """The XLA-based libraries (torch_xla, NxD, optimum-neuron) a rewritten file imports after the rewrite: its new
    text when it changes, else the file as it is on disk. Only files with findings left can (every such import is
    reported: NM100/NM199, NM150-NM153, NM160/NM161), so only those are read. `parsed`: (a text, its ast) the
    rewrite already has, used when it is that text."""
    if not res.findings:
        return []
    from neuron_migrate.files.xla_deps import xla_based_imports

    if res.new_text is not None and res.changed:
        text = res.new_text
    else:
        try:
            with open(res.path, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except OSError:
            return []
    return xla_based_imports(text, python=res.path.endswith((".py", ".pyi")), parsed=parsed)


def frame_lines(text: str, findings: list) -> dict:
    """{line: text} of the lines the report shows for these findings: each finding's line and its fix's edits'."""
    wanted = set()
    for f in findings:
        wanted.add(f.span.line)
        if f.fix is not None:
            wanted.update(e.span.line for e in f.fix.edits)
    lines = source_lines(text)
    return {n: lines[n - 1] for n in sorted(wanted) if 0 < n <= len(lines)}


def process_file(path: str, ruleset, settings, fix: bool, write: bool = False, display: str | None = None,
                 map_pieces=None, digest_content: bool = True) -> FileResult:
    """Check (fix=False) or fix one file. Never raises for bad input: errors become FileResult.error.
    `map_pieces`: how a file audited in pieces maps the check over them (pipeline.parallel.fork_map: two
    processes); None checks them one after another. `digest_content`: give the result its content digest (what a
    results cache keys it by; a run without a cache skips hashing every file)."""
    # imported here, not at the top: a warm run needs FileResult (the cache's results) but none of these
    from neuron_migrate.files.load import load_for_analysis
    from neuron_migrate.files.source import SourceError
    from neuron_migrate.names.analysis import AnalysisError
    from neuron_migrate.rules.runner import check_text

    shown = display or path
    res = FileResult(shown)
    p = Path(path)
    if write:
        try:  # an interrupted earlier --write may have left our temp files beside this one
            from neuron_migrate.files.source import remove_stale_temps

            remove_stale_temps(Path(os.path.realpath(p)))
        except SourceError as exc:
            res.error = str(exc)
            return res
    from neuron_migrate.files.discover import file_kind

    kind = file_kind(p.name)
    if kind not in ("python", "notebook", ""):  # launchers, job files, dependency lists: their own rules
        from neuron_migrate.pipeline.text_files import process_text_file

        return process_text_file(p, kind, res, ruleset, settings, fix, write)
    try:
        src, text, nb = load_for_analysis(p)
    except SourceError as exc:
        res.error = str(exc)
        return res
    except OSError as exc:
        res.error = f"cannot read: {exc.strerror or exc}"
        return res
    if digest_content:
        from neuron_migrate.pipeline.cache import digest

        res.digest = digest(src.raw)
    if not ruleset.could_match(text) and not (settings is not None and settings.forces_check(shown)):
        res.skipped = True
        return res
    if not fix:  # audit never imports the rewrite engine (libcst costs ~0.3 s to import)
        from neuron_migrate.rules.pieces import PIECES_MIN_CHARS, PIECES_NOTE, check_in_pieces

        try:
            r = None
            if len(text) > PIECES_MIN_CHARS and nb is None:  # a generated file: bounded memory
                r = check_in_pieces(text, shown, ruleset, settings, map_pieces)
                if r is not None:
                    res.notes.append(PIECES_NOTE.format(mb=len(text) / 1e6, n=r.pieces))
            if r is None:
                r = check_text(text, shown, ruleset, settings)
        except AnalysisError as exc:
            res.error = str(exc)
            return res
        except RecursionError:
            res.error = "nesting too deep to process"
            return res
        res.findings, res.suppressed = r.findings, r.suppressed
        if r.analysis is not None:
            r.analysis.release()
        if nb is not None:
            from neuron_migrate.files.notebook import name_cells

            name_cells(res.findings, text)
        elif res.findings:
            res.frames = frame_lines(text, res.findings)
        return res
    from neuron_migrate.rewrite.engine import FixError, fix_text

    try:
        out = fix_text(text, shown, ruleset, settings)
    except AnalysisError as exc:
        res.error = str(exc)
        return res
    except FixError as exc:
        res.error = str(exc)
        try:  # still report what is there
            res.findings = check_text(text, shown, ruleset, settings).findings
        except AnalysisError:
            pass
        return res
    except RecursionError:
        res.error = "nesting too deep to process"
        return res
    res.findings, res.applied, res.applied_findings, res.suppressed = out.remaining, dict(out.applied), out.applied_findings, out.suppressed
    if nb is not None:
        from neuron_migrate.files.notebook import name_cells

        name_cells(res.findings, out.text)
        name_cells(res.applied_findings, out.text)  # their lines are of the rewritten text too
    if out.text != text:
        try:
            if nb is not None:
                from neuron_migrate.files.notebook import dump_notebook

                data = dump_notebook(nb, out.text)
            else:
                data = src.encode(out.text)
        except (SourceError, UnicodeEncodeError) as exc:
            res.error = f"cannot encode the rewrite: {exc}; file left unchanged"
            return res
        res.old_text, res.new_text, res.new_bytes = text, out.text, data
        if nb is not None:
            res.old_text, res.new_text = src.raw.decode("utf-8-sig"), data.decode("utf-8")
        if write:
            try:
                from neuron_migrate.files.source import write_atomic

                write_atomic(src, data)
                res.written = True
            except (SourceError, OSError) as exc:
                res.error = f"not written: {exc}"
    if not res.error:
        res.xla_libs = xla_libraries(res, (out.text, out.tree))
    return res
