"""Fix one source text to a fixed point: check, apply compatible fixes, re-parse, repeat."""
from __future__ import annotations

import ast
from collections import Counter
from typing import Optional

from neuron_migrate.names.analysis import AnalysisError
from neuron_migrate.rewrite.prune import survey_of_analysis, unused_import_fixes
from neuron_migrate.rules.api import Settings
from neuron_migrate.rules.builtin.meta import COMMENT_EDIT, apply_comment_fixes
from neuron_migrate.rules.lines import line_map, move_findings, names_lines, renumber_lines
from neuron_migrate.rules.model import Finding, FixSafety
from neuron_migrate.rules.registry import RuleSet
from neuron_migrate.rules.runner import RuleCrash, check_text

MAX_ROUNDS = 12


class FixError(Exception):
    pass


# A plain class, not a dataclass: importing dataclasses (and the inspect module it imports) costs every start-up
# about 20 ms. Nothing compares this record, so it keeps identity equality.
class FixOutcome:
    """The rewritten text of a file, the fixes applied, and the findings left."""

    def __init__(self, text: str, applied: Counter | None = None, applied_findings: list[Finding] | None = None,
                 remaining: list[Finding] | None = None, suppressed: int = 0):
        self.text = text
        self.applied = Counter() if applied is None else applied  # rule code -> fixes applied
        self.applied_findings = [] if applied_findings is None else applied_findings
        self.remaining = [] if remaining is None else remaining
        self.suppressed = suppressed


def wants_fix(finding: Finding, unsafe: bool) -> bool:
    if finding.fix is None or any(e.kind == COMMENT_EDIT for e in finding.fix.edits):
        return False  # comment edits (NM901) are applied once the code has converged, below
    return finding.fix.safety == FixSafety.SAFE or unsafe


def _tree_of(kept: Optional[tuple], text: str):
    return kept[1] if kept is not None and kept[0] == text else None


def _release(result) -> None:
    """The round's analysis is done with: free its tree now (see Analysis.release), not at the next GC pass."""
    if result.analysis is not None:
        result.analysis.release()


def _left_after_import_removal(findings: list[Finding], todo: list[Finding], chosen: list, applied: list,
                               old: str, new: str) -> Optional[list[Finding]]:
    """The findings left once this round's fixes are applied, when those fixes only removed unused imports and
    re-analysing the result could not tell more; None when it must be analysed again. That is so when every
    fix found was applied, none had a helper or import to add, and no finding left lies in an edited statement
    (it would be gone or changed) or names a line that is gone (`old` -> `new`). The caller moves them onto `new`
    (move_findings: their spans, the lines their messages name, the fixes of those left: comment edits, unsafe
    fixes), which then reads as an analysis of `new` would report them."""
    if not chosen or len(applied) != len(chosen) or len(chosen) != len(todo):
        return None
    if not all(f.unused_import_only and not f.imports and not f.helpers for f in chosen):
        return None
    edited = [e.span for f in chosen for e in f.edits]
    done = {id(f) for f in applied}
    left = [f for f in findings if f.fix is None or id(f.fix) not in done]
    kept = None
    for f in left:
        if any(sp.line <= f.span.end_line and f.span.line <= sp.end_line for sp in edited):
            return None
        if names_lines(f.message) or names_lines(f.note or ""):
            kept = kept or line_map(old, new, kept_only=True)
            if renumber_lines(f.message, kept) is None or renumber_lines(f.note or "", kept) is None:
                return None
    return left


def fix_text(text: str, path: str, ruleset: RuleSet, settings: Optional[Settings] = None) -> FixOutcome:
    """Apply fixes until none applies. Raises FixError (text left as it was) when output would not parse."""
    settings = settings or Settings()
    outcome = FixOutcome(text)
    current = text
    last_codes = ""
    found_in: list[tuple[str, list[Finding]]] = []  # (text of a round, the findings applied in it)
    # (text, its ast) of the first and the latest round's check, for the import pruning below (saves two parses)
    first_tree: Optional[tuple] = None
    last_tree: Optional[tuple] = None
    last_survey: Optional[tuple] = None  # (text, its names/strings/imports for the pruning), read off its analysis
    for _ in range(MAX_ROUNDS):
        try:
            # the check of each round also re-parses the previous round's output: that is the validation
            result = check_text(current, path, ruleset, settings)
            if result.analysis is None and last_codes:
                ast.parse(current)  # prefiltered (nothing left to match): still make sure it parses
        except RuleCrash:
            raise
        except (AnalysisError, SyntaxError, ValueError) as exc:
            if not last_codes:
                raise
            raise FixError(f"rewrite by {last_codes} would produce invalid Python ({exc}); file left unchanged") from None
        if result.analysis is not None:
            last_tree = (current, result.analysis.tree)
            first_tree = first_tree or last_tree
        todo = [f for f in result.findings if wants_fix(f, settings.unsafe_fixes)]
        if not todo:
            outcome.remaining = result.findings
            outcome.suppressed = result.suppressed
            if outcome.applied and result.analysis is not None:  # the pruning below will survey this text
                last_survey = (current, survey_of_analysis(result.analysis))
            _release(result)
            break
        # the applier is loaded only once a file has a fix to apply, and libcst (0.1-0.3 s to import) only once an
        # edit needs it (rewrite/cst_apply.py)
        from neuron_migrate.rewrite.apply import ApplyError, apply_fixes, select_compatible

        chosen, _deferred = select_compatible([f.fix for f in todo])
        try:
            new_text, applied = apply_fixes(current, chosen, result.analysis.tree, getattr(settings, "helpers_module", None))
        except ApplyError as exc:
            raise FixError(str(exc)) from None
        except RecursionError:
            raise FixError("nesting too deep to rewrite; file left unchanged") from None
        except Exception as exc:  # libcst or a fix's text: never a traceback, never a written file
            codes = ", ".join(sorted({f.rule.code for f in todo}))
            raise FixError(f"internal error applying fixes ({codes}): {type(exc).__name__}: {exc}; file left unchanged") from None
        finally:
            _release(result)
        chosen_ids = {id(c) for c in chosen}
        last_codes = ", ".join(sorted({f.rule.code for f in todo if id(f.fix) in chosen_ids}))
        ids = {id(f) for f in applied}
        found_in.append((current, []))
        for f in todo:
            if id(f.fix) in ids:
                outcome.applied[f.rule.code] += 1
                found_in[-1][1].append(f)
        if new_text == current:
            outcome.remaining = result.findings
            outcome.suppressed = result.suppressed
            break
        left = _left_after_import_removal(result.findings, todo, chosen, applied, current, new_text)
        if left is not None:
            # removing imports nothing used changes no other finding: the text is only parsed, to validate it,
            # and the findings left move onto it (what the import pruning below does too)
            try:
                last_tree = (new_text, ast.parse(new_text))
            except (SyntaxError, ValueError, RecursionError) as exc:
                raise FixError(f"rewrite by {last_codes} would produce invalid Python ({exc}); file left unchanged") from None
            outcome.remaining = move_findings(left, current, new_text, fixes=True)
            outcome.suppressed = result.suppressed
            current = new_text
            break
        current = new_text
    else:
        raise FixError(f"fixes did not converge after {MAX_ROUNDS} rounds; file left unchanged")
    checked = current  # the text the remaining findings were found in (their spans are of it)
    fixed = bool(outcome.applied)
    # unused suppressions (NM901) are judged on the converged code, and edited at the lines they were found
    # at: before the pruning below moves lines (removing them changes no finding)
    current, done = apply_comment_fixes(current, outcome.remaining)
    for f in done:
        outcome.applied[f.rule.code] += 1
        outcome.remaining.remove(f)
    found_in.append((checked, list(done)))
    if fixed and current != text:
        from neuron_migrate.rewrite.prune import drop_dead_helpers

        inserted = {h for _t, found in found_in for f in found if f.fix is not None for h in f.fix.helpers}
        pruned = drop_dead_helpers(text, current, inserted, _tree_of(first_tree, text), _tree_of(last_tree, current))
        if pruned != current:
            current, last_tree, last_survey = pruned, None, None
        prune = unused_import_fixes(text, current, _tree_of(first_tree, text), _tree_of(last_tree, current),
                                    _tree_of(last_survey, current))
        if prune:
            from neuron_migrate.rewrite.apply import ApplyError, apply_fixes

            try:
                current, _ = apply_fixes(current, prune, _tree_of(last_tree, current))
            except ApplyError as exc:
                raise FixError(f"removing imports the rewrite left unused: {exc}") from None
    outcome.text = current
    # every line reported refers to the rewritten text (the file the user gets), not the round a fix was found in
    for round_text, found in found_in:
        outcome.applied_findings.extend(move_findings(found, round_text, current))
    outcome.remaining = move_findings(outcome.remaining, checked, current)
    return outcome
