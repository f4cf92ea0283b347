"""The rule registry: Python rule modules in `neuron_migrate/rules/builtin/` plus YAML rules in `rules/*.yaml`."""
from __future__ import annotations

import importlib
from collections.abc import Iterable
from functools import lru_cache

from neuron_migrate.rules.model import CataloguedRule, Rule


class RuleError(Exception):
    pass


SCAN_BEFORE_COMPILE = 100_000  # characters of text prefiltered word by word before the words' pattern is compiled

# rules for files that are not Python (language "shell", "deps"), defined next to their parsers
OTHER_RULE_MODULES = ("neuron_migrate.shell.rules", "neuron_migrate.deps.rules")


@lru_cache(maxsize=1)
def all_rules() -> tuple[Rule, ...]:
    import os

    from neuron_migrate.rules import api, builtin
    from neuron_migrate.rules.yaml_rules import load_yaml_rules

    # the rule modules, listed as pkgutil.iter_modules would (which imports inspect: ~10 ms of every start-up)
    for folder in builtin.__path__:
        names = {f[:-3] for f in os.listdir(folder) if f.endswith(".py") and f[:-3].isidentifier()} - {"__init__"}
        for name in sorted(names):
            importlib.import_module(f"{builtin.__name__}.{name}")
    for module in OTHER_RULE_MODULES:
        importlib.import_module(module)
    rules = list(api.defined_rules()) + load_yaml_rules()
    seen_codes: dict[str, str] = {}
    seen_names: dict[str, str] = {}
    for r in rules:
        if r.code in seen_codes:
            raise RuleError(f"rule code {r.code} defined twice ({seen_codes[r.code]} and {r.origin})")
        if r.name in seen_names:
            raise RuleError(f"rule name {r.name} defined twice ({seen_names[r.name]} and {r.origin})")
        seen_codes[r.code] = r.origin
        seen_names[r.name] = r.origin
    return tuple(sorted(rules, key=lambda r: r.code))


# -- the rule catalogue: what selection and reports of cached findings need, without importing the rules ----------
# A warm run answers every file from the results cache; importing ~30 rule modules only to select codes and to name
# the cached findings' rules would be a large part of its time. The catalogue (one plain-data entry per rule, see
# CataloguedRule) is written by a run that imported the rules and read back by the next one, keyed by the rule
# sources' fingerprint (pipeline/cache.py); the rules are imported as soon as a file has to be checked.
_CATALOGUE: dict[str, CataloguedRule] = {}


def rules_loaded() -> bool:
    return all_rules.cache_info().currsize > 0


def catalogue() -> list[dict]:
    """Every rule's catalogue entry (imports the rules)."""
    return [CataloguedRule.entry(r) for r in all_rules()]


def use_catalogue(entries: list | None) -> None:
    """Select from, and name cached findings' rules by, these entries until the rules are imported (None: stop)."""
    _CATALOGUE.clear()
    for e in entries or ():
        r = CataloguedRule(e)
        _CATALOGUE[r.code] = r


def _known() -> tuple:
    """The rules to select from: the rules themselves once imported, else the catalogue's entries when one is in use."""
    if _CATALOGUE and not rules_loaded():
        return tuple(_CATALOGUE.values())
    return all_rules()


def rule_for_findings(code: str):
    """The rule a finding from plain data names: the catalogue's entry while the rules are not imported."""
    if _CATALOGUE and not rules_loaded():
        r = _CATALOGUE.get(code)
        if r is not None:
            return r
    return get_rule(code)


@lru_cache(maxsize=1)
def _rule_index() -> dict:
    index = {}
    for r in all_rules():
        index[r.code.lower()] = r
        index[r.name] = r
    return index


def get_rule(code_or_name: str) -> Rule | None:
    return _rule_index().get(code_or_name.strip().lower())


def _matches(rule: Rule, selectors: Iterable[str], selecting: bool = False) -> bool:
    """Does a selector (ALL, a code prefix, a rule name; any case) cover the rule?

    When selecting, opt-in rules (opinionated advice) are covered only by their exact code or name.
    """
    for s in selectors:
        s = s.strip()
        if not s:
            continue
        exact = s.upper() == rule.code or s.lower() == rule.name
        if selecting and rule.opt_in and not exact:
            continue
        if exact or s.upper() == "ALL" or rule.code.upper().startswith(s.upper()):
            return True
    return False


def known_selector(s: str) -> bool:
    s = s.strip()
    return not s or s.upper() == "ALL" or any(_matches(r, [s]) for r in _known())


class RuleSet:
    """The active rules, indexed by (site kind, key) for the runner."""

    def __init__(self, rules: Iterable[Rule], ignored: Iterable[str] = ()):
        from neuron_migrate.names.analysis import Wanted

        self.rules = tuple(rules)
        self.ignored_codes = tuple(sorted(set(ignored)))
        # rules for other file kinds, by language; the Python index below holds only Python rules
        self.by_language: dict[str, list[Rule]] = {}
        for r in self.rules:
            self.by_language.setdefault(r.language, []).append(r)
        self.exact: dict[tuple[str, str], list[Rule]] = {}
        self.prefix: dict[str, list[tuple[str, Rule]]] = {}
        self.module_rules: list[Rule] = []
        exact_keys: dict[str, set] = {}
        prefixes: dict[str, set] = {}
        any_kinds: set = set()
        words: set = set()
        for r in self.by_language.get("python", ()):
            words.update(r.trigger_words)
            for kind, key in r.triggers:
                if kind == "module":
                    self.module_rules.append(r)
                elif key == "*":
                    any_kinds.add(kind)
                    self.prefix.setdefault(kind, []).append(("", r))
                elif key.endswith("*"):
                    p = key[:-1]
                    prefixes.setdefault(kind, set()).add(p)
                    self.prefix.setdefault(kind, []).append((p, r))
                else:
                    exact_keys.setdefault(kind, set()).add(key)
                    self.exact.setdefault((kind, key), []).append(r)
        self.wanted = Wanted(exact_keys, {k: tuple(sorted(v)) for k, v in prefixes.items()}, any_kinds)
        self.trigger_words = tuple(sorted(words))
        self._trigger_re = None  # the words as one pattern, compiled once the process has scanned enough text
        self._scanned = 0
        self._last_text: str | None = None  # the text could_match answered last, and its answer
        self._last_answer = False
        # exact triggers of the ignored rules: when one of them would have matched a site, a prefix fallback
        # (NM199 "no automatic migration") must stay silent: the site is known, the user chose not to hear of it
        active = set(self.codes)
        self.shadow: dict[tuple[str, str], list[Rule]] = {}
        if self.prefix and self.ignored_codes:
            for r in all_rules():
                if r.code in active or r.code not in self.ignored_codes:
                    continue
                for kind, key in r.triggers:
                    if kind in self.prefix and kind != "module" and not key.endswith("*"):
                        self.shadow.setdefault((kind, key), []).append(r)

    @classmethod
    def select(cls, select: Iterable[str] = ("ALL",), ignore: Iterable[str] = ()) -> "RuleSet":
        select = list(select) or ["ALL"]
        ignore = list(ignore)
        for s in [*select, *ignore]:
            if not known_selector(s):
                raise RuleError(f"unknown rule selector {s!r} (see `neuron-migrate rules`)")
        known = _known()
        ignored = [r.code for r in known if _matches(r, ignore)]
        chosen = [r for r in known if _matches(r, select, selecting=True) and r.code not in ignored]
        if known and type(known[0]) is CataloguedRule:
            return DeferredRuleSet(tuple(r.code for r in chosen), tuple(sorted(set(ignored))))
        return cls(chosen, ignored)

    @classmethod
    def from_codes(cls, codes: Iterable[str], ignored: Iterable[str] = ()) -> "RuleSet":
        wanted = set(codes)
        return cls((r for r in all_rules() if r.code in wanted), ignored)

    @property
    def spec(self) -> tuple:
        """What rebuilds this set in a worker process: RuleSet.from_codes(*spec)."""
        return (self.codes, self.ignored_codes)

    @property
    def codes(self) -> tuple[str, ...]:
        return tuple(r.code for r in self.rules)

    def could_match(self, text: str) -> bool:
        """Cheap text prefilter: a file with none of the trigger words cannot produce a finding."""
        if text is self._last_text:  # the pipeline asks, then check_text asks again for the same text
            return self._last_answer
        self._last_text, self._last_answer = text, self._could_match(text)
        return self._last_answer

    def _could_match(self, text: str) -> bool:
        rx = self._trigger_re
        if rx is None:
            if not self.trigger_words:
                return False
            # one scan of the text for all the words is about twice as fast as one `in` per word, but compiling the
            # pattern costs as much as ~40 small files' scans: a process that checks little text never compiles it
            self._scanned += len(text)
            if self._scanned < SCAN_BEFORE_COMPILE:
                return any(w in text for w in self.trigger_words)
            import re

            rx = self._trigger_re = re.compile("|".join(map(re.escape, self.trigger_words)))
        return rx.search(text) is not None

    def fingerprint(self) -> str:
        return ",".join(r.code for r in self.rules)


class DeferredRuleSet:
    """A selection known by its codes (chosen from the catalogue): the rules are imported, and the RuleSet built, only
    when something needs more than the codes (a file to check, a SARIF driver), so that a warm run imports none."""

    def __init__(self, codes: tuple, ignored_codes: tuple):
        self.codes, self.ignored_codes = codes, ignored_codes
        self._built: RuleSet | None = None

    @property
    def spec(self) -> tuple:
        return (self.codes, self.ignored_codes)

    def fingerprint(self) -> str:
        return ",".join(self.codes)

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        if self._built is None:
            self._built = RuleSet.from_codes(self.codes, self.ignored_codes)
        return getattr(self._built, attr)
