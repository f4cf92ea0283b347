"""Fix one source text to a fixed point: check, apply compatible fixes, re-parse, repeat."""
from __future__ import annotations

import ast
from collections import Counter
from typing import Optional

from neuron_migrate.names.analysis import AnalysisError
from neuron_migrate.rewrite.prune import survey_of_analysis, survey_without_imports, unused_import_fixes
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
        self.tree = None  # the ast of `text` when a check or validation parsed it (what reads its imports reuses it)


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


def _blocks_kept(analysis, imports: list, fixes: list) -> bool:
    """No statement the fixes delete is the last one left in its block: the applier then removes an emptied
    `if FLAG:` with its test (which loads names), so the text would lose more than import statements. `imports`: the
    text's imports outside `try:` (a deleted statement not among them is not assumed safe)."""
    deleted = {(e.span.line, e.span.end_line) for f in fixes for e in f.edits if e.kind == "delete_stmt"}
    if not deleted:
        return True
    found = 0
    for node in imports:
        if (node.lineno, node.end_lineno) not in deleted:
            continue
        found += 1
        parent = analysis.parent_of.get(node)
        if parent is None or isinstance(parent, ast.Module):
            continue
        for field in ("body", "orelse", "finalbody"):
            block = getattr(parent, field, None)
            if isinstance(block, list) and node in block:
                if all((st.lineno, st.end_lineno) in deleted for st in block):
                    return False
                break
        else:
            return False  # a block not read here (a handler's, a match case's): not assumed kept
    return found == len(deleted)


def _failing_rules(text: str, todo: list[Finding], chosen: list, helpers_module: Optional[str]) -> dict:
    """When applying a round's fixes raised or gave text that does not parse: which rules' fixes do so on their own.
    Returns {rule code: its internal-error finding on `text`, at the line of its first fix that fails alone}; empty
    when no rule fails alone (then the fixes only fail together). Run only on that failure."""
    from neuron_migrate.rewrite.apply import apply_fixes

    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError):
        return {}
    chosen_ids = {id(c) for c in chosen}
    by_rule: dict = {}
    for f in todo:
        if id(f.fix) in chosen_ids:
            by_rule.setdefault(f.rule.code, []).append(f)
    out: dict = {}

    def fails(fixes) -> Optional[str]:
        try:
            new, _ = apply_fixes(text, fixes, tree, helpers_module)
            ast.parse(new)
        except RecursionError:
            return "RecursionError: nesting too deep"
        except SyntaxError as exc:
            return f"its fix gives invalid Python: {exc}"
        except Exception as exc:  # noqa: BLE001 - the failure being looked for
            return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        return None

    for code, found in by_rule.items():
        why = fails([f.fix for f in found])
        if why is None:
            continue
        culprit = next((f for f in found if fails([f.fix]) is not None), found[0])
        rule = culprit.rule
        line = culprit.span.line
        message = (f"internal error in rule {code} at line {line} ({why}): the rule's findings and fixes in this "
                   f"file are left out, the other rules' are kept (please report; --ignore {code} skips the rule)")
        out[code] = Finding(rule=rule, path=culprit.path, span=culprit.span, message=message)
    return out


def _without(findings: list[Finding], broken: dict, current: str) -> list[Finding]:
    """`findings` less those of the rules in `broken` (whose fixes failed), plus their internal-error findings
    (moved from the text they were found in onto `current`)."""
    if not broken:
        return findings
    kept = [f for f in findings if f.rule.code not in broken]
    for found, found_text in broken.values():
        kept.extend(move_findings([found], found_text, current))
    kept.sort(key=Finding.sort_key)
    return kept


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
    # rules whose fixes failed (raised, or gave invalid Python) on their own: code -> (their internal-error finding,
    # the text it was found in). Their findings and fixes are left out from then on; every other rule's stay.
    broken: dict = {}
    previous: Optional[tuple] = None  # (text, todo, chosen) of the round that made `current`
    for _ in range(MAX_ROUNDS + 1):
        if _ == MAX_ROUNDS:
            raise FixError(f"fixes did not converge after {MAX_ROUNDS} rounds; file left unchanged")
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
            bad = _failing_rules(previous[0], previous[1], previous[2], getattr(settings, "helpers_module", None)) \
                if previous is not None else {}
            if not bad:
                raise FixError(f"rewrite by {last_codes} would produce invalid Python ({exc}); file left unchanged") from None
            broken.update((code, (f, previous[0])) for code, f in bad.items())
            current, previous, last_codes = previous[0], None, ""  # that round again, without those rules
            for f in found_in.pop()[1]:
                outcome.applied[f.rule.code] -= 1
            outcome.applied = +outcome.applied  # drops the codes counted down to 0
            continue
        for code, found in result.crashed.items():
            if found is not None and code not in broken:
                broken[code] = (found, current)  # a rule that raised: left out from now on, even where its site goes
        if broken:
            result.findings = _without(result.findings, broken, current)
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
        # a round that only removes unused imports is not analysed again (below): what the pruning reads of the
        # result, its names and strings, is this text's (imports hold neither), read off the analysis before it goes
        removal = all(f.unused_import_only for f in chosen) and result.analysis is not None
        pre_survey = survey_of_analysis(result.analysis) if removal else None
        if pre_survey is not None and not _blocks_kept(result.analysis, pre_survey[2], chosen):
            pre_survey = None
        try:
            new_text, applied = apply_fixes(current, chosen, result.analysis.tree, getattr(settings, "helpers_module", None))
        except RecursionError:
            raise FixError("nesting too deep to rewrite; file left unchanged") from None
        except Exception as exc:  # libcst or a fix's text: never a traceback, never a written file
            bad = _failing_rules(current, todo, chosen, getattr(settings, "helpers_module", None))
            if not bad:
                if isinstance(exc, ApplyError):
                    raise FixError(str(exc)) from None
                codes = ", ".join(sorted({f.rule.code for f in todo}))
                raise FixError(f"internal error applying fixes ({codes}): {type(exc).__name__}: {exc}; file left unchanged") from None
            broken.update((code, (f, current)) for code, f in bad.items())
            new_text, applied = None, []
        finally:
            _release(result)
        if new_text is None:
            continue  # this round again, without the rules whose fixes failed
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
            if pre_survey is not None:
                last_survey = (new_text, survey_without_imports(pre_survey, last_tree[1]))
            outcome.remaining = move_findings(left, current, new_text, fixes=True)
            outcome.suppressed = result.suppressed
            current = new_text
            break
        previous = (current, todo, chosen)
        current = new_text
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
        from neuron_migrate.rewrite.prune import inline_small_helpers

        # a rank / world-size / barrier helper called once or twice reads better as its one-line native form
        pruned, pruned_tree = inline_small_helpers(text, current, {name for name, _src in inserted},
                                                   _tree_of(first_tree, text), _tree_of(last_tree, current))
        if pruned != current:
            current, last_tree, last_survey = pruned, (pruned, pruned_tree), None
        pruned = drop_dead_helpers(text, current, inserted, _tree_of(first_tree, text), _tree_of(last_tree, current))
        if pruned != current:
            current, last_tree, last_survey = pruned, None, None
        from neuron_migrate.rewrite.prune import drop_emptied_blocks

        pruned = drop_emptied_blocks(text, current, _tree_of(first_tree, text), _tree_of(last_tree, current))
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
        from neuron_migrate.rewrite.prune import drop_orphaned_comments

        pruned = drop_orphaned_comments(text, current)
        if pruned != current:
            current, last_tree = pruned, None
    outcome.text = current
    outcome.tree = _tree_of(last_tree, current)
    # every line reported refers to the rewritten text (the file the user gets), not the round a fix was found in
    for round_text, found in found_in:
        outcome.applied_findings.extend(move_findings(found, round_text, current))
    outcome.remaining = move_findings(outcome.remaining, checked, current)
    return outcome
