"""What the language server does with a buffer, without any LSP types: findings, one fix, all fixes, noqa.

Configuration is the one the command line would use for the file (the closest pyproject.toml with a
`[tool.neuron-migrate]` section); `reload()` forgets it, so that an edited pyproject.toml takes effect.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

CELL_RE = re.compile(r"^# %%neuron-migrate-cell (\d+)$")


@dataclass
class FileSetup:
    """The configuration, rules and settings that apply to one open document."""

    config: object
    ruleset: object
    settings: object
    excluded: bool = False


# The editor asks about the same repository at every keystroke: its model (pipeline/repository_facts.py) is built
# again, reading only the files whose size or mtime changed, once it is this many seconds old.
MODEL_MAX_AGE = 5.0


class Checker:
    def __init__(self) -> None:
        self._setups: dict = {}

    @staticmethod
    def _with_repository(path: str, settings):
        """The settings with what the repository model says about the file (the programs that run it, across files)."""
        from neuron_migrate.pipeline.repository_facts import repository_facts

        try:
            outside = repository_facts([path], (), None, MODEL_MAX_AGE)
        except Exception:  # noqa: BLE001 - the model is an aid: without it the file is judged alone
            outside = {}
        settings.outside = outside or None
        return settings

    def reload(self) -> None:
        self._setups.clear()
        from neuron_migrate.files import config

        config._has_section.cache_clear()

    def setup_for(self, path: str) -> FileSetup:
        """Config, rules and settings for `path` (cached per folder until reload)."""
        from neuron_migrate.files.config import Config, ConfigError, find_pyproject, load_file, per_file_ignored
        from neuron_migrate.rules.api import Settings
        from neuron_migrate.rules.registry import RuleError, RuleSet

        p = Path(path)
        key = str(p)
        if key in self._setups:
            return self._setups[key]
        found = find_pyproject(p.parent)
        try:
            cfg = load_file(found) if found else Config()
        except ConfigError:
            cfg = Config()  # a broken configuration: the editor still gets the default rules
        try:
            ruleset = RuleSet.select(cfg.select + cfg.extend_select, cfg.ignore + per_file_ignored(cfg, p))
        except RuleError:
            ruleset = RuleSet.select()
        settings = Settings(device_style=cfg.device_style, unsafe_fixes=cfg.unsafe_fixes, table_path=cfg.table)
        excluded = False
        if cfg.exclude:
            from neuron_migrate.files.discover import _excluded, _rel_to

            excluded = _excluded(p.name, p.name, cfg.exclude, _rel_to(p, cfg.root))
        setup = FileSetup(cfg, ruleset, settings, excluded)
        self._setups[key] = setup
        return setup

    def config_error(self, path: str) -> Optional[str]:
        from neuron_migrate.files.config import ConfigError, find_pyproject, load_file
        from neuron_migrate.rules.registry import RuleError, RuleSet

        found = find_pyproject(Path(path).parent)
        if not found:
            return None
        try:
            cfg = load_file(found)
            RuleSet.select(cfg.select + cfg.extend_select, cfg.ignore)
        except (ConfigError, RuleError) as exc:
            return str(exc)
        return None

    def check(self, text: str, path: str) -> tuple[list, Optional[str]]:
        """(findings, error message). A syntax error is an error message, never an exception."""
        from neuron_migrate.names.analysis import AnalysisError
        from neuron_migrate.rules.runner import check_text

        s = self.setup_for(path)
        if s.excluded:
            return [], None
        try:
            result = check_text(text, path, s.ruleset, self._with_repository(path, s.settings))
        except AnalysisError as exc:
            return [], str(exc)
        except RecursionError:
            return [], "nesting too deep to check"
        if result.analysis is not None:
            # the tree and its sites form reference cycles: freed now, they do not pile up for the cyclic GC, whose
            # passes over them slowed every later check of a large buffer (transformers trainer.py: median 116 -> 83 ms)
            result.analysis.release()
        return result.findings, None

    def fix_one(self, text: str, path: str, finding) -> Optional[str]:
        """The text with only this finding's fix applied (None when it cannot be applied)."""
        if finding.fix is None:
            return None
        from neuron_migrate.rules.builtin.meta import COMMENT_EDIT, apply_comment_fixes

        if any(e.kind == COMMENT_EDIT for e in finding.fix.edits):
            new, done = apply_comment_fixes(text, [finding])
            return new if done else None
        import ast

        from neuron_migrate.rewrite.apply import ApplyError, apply_fixes

        try:
            new, applied = apply_fixes(text, [finding.fix], ast.parse(text))
            ast.parse(new)
        except (ApplyError, SyntaxError, ValueError, RecursionError):
            return None
        except Exception:  # noqa: BLE001 - a bad fix must never take the editor session down
            return None
        return new if applied and new != text else None

    def fix_all(self, text: str, path: str, unsafe: Optional[bool] = None) -> Optional[str]:
        from neuron_migrate.names.analysis import AnalysisError
        from neuron_migrate.rewrite.engine import FixError, fix_text
        from neuron_migrate.rules.api import Settings

        s = self.setup_for(path)
        if s.excluded:
            return None
        settings = s.settings
        if unsafe is not None:
            settings = Settings(device_style=settings.device_style, unsafe_fixes=unsafe, table_path=settings.table_path)
        settings = self._with_repository(path, settings)
        try:
            out = fix_text(text, path, s.ruleset, settings)
        except (AnalysisError, FixError, RecursionError):
            return None
        return out.text if out.text != text else None

    @staticmethod
    def noqa(text: str, line: int, code: str) -> Optional[str]:
        from neuron_migrate.rules.noqa import add_to_text

        new, added, _missed = add_to_text(text, {line: {code}})
        return new if added else None


def rule_hover(code: str) -> Optional[str]:
    """The rule's documentation as Markdown (the `explain` page)."""
    from neuron_migrate.rules.registry import get_rule

    r = get_rule(code)
    if r is None:
        return None
    fix = {"safe": "safe fix", "unsafe": "unsafe fix (`--unsafe-fixes`)", "none": "no automatic fix"}[r.fix_safety.value]
    md = [f"**{r.code} {r.name}** ({r.severity.value}, {fix})", "", r.summary, "", r.docs]
    for e in r.examples[:1]:
        md += ["", "```python", e.before.rstrip(), "```"]
        if e.after is not None and e.after.strip():
            md += ["becomes", "```python", e.after.rstrip(), "```"]
    md += ["", f"[{r.code} in the rule reference]({r.url})"]
    return "\n".join(md)


# -- notebooks: the cells joined as the command line joins them ---------------------------------------
def join_cells(cells: list[tuple[str, str]]) -> tuple[str, list[tuple[str, int, int]]]:
    """cells: (uri, source) of the code cells in order. Returns (joined text, [(uri, first line, n lines)])
    where `first line` is the 1-based line of the cell's first source line in the joined text."""
    from neuron_migrate.files.notebook import CELL_MARK, mask_cell

    parts = []
    spans = []
    line = 1
    for i, (uri, src) in enumerate(cells):
        lines = mask_cell(src)
        parts.append(CELL_MARK.format(index=i) + "\n" + "\n".join(lines) + "\n")
        spans.append((uri, line + 1, len(lines)))
        line += 1 + len(lines)
    return "".join(parts), spans


def split_cells(text: str, n: int) -> Optional[list[str]]:
    """The cell sources of a joined text (what join_cells made, after a fix); None if markers were lost."""
    from neuron_migrate.files.notebook import unmask_line

    cells: dict[int, list[str]] = {}
    pre: list[str] = []
    current = None
    for line in text.split("\n"):
        m = CELL_RE.match(line)
        if m:
            current = int(m.group(1))
            cells[current] = []
            continue
        (pre if current is None else cells[current]).append(line)
    if sorted(cells) != list(range(n)):
        return None
    while pre and not pre[-1].strip():
        pre.pop()
    if pre and n:
        cells[0] = pre + cells[0]
    out = []
    for i in range(n):
        lines = cells[i]
        if lines and lines[-1] == "":
            lines = lines[:-1]
        out.append("\n".join(unmask_line(ln) for ln in lines))
    return out
