"""The rule registry: Python rule modules in `neuron_migrate/rules/builtin/` plus YAML rules in `rules/*.yaml`."""
from __future__ import annotations

import importlib
import pkgutil
from functools import lru_cache
from typing import Iterable, Optional

from neuron_migrate.rules.model import Rule


class RuleError(Exception):
    pass


# rules for files that are not Python (language "shell", "deps"), defined next to their parsers
OTHER_RULE_MODULES = ("neuron_migrate.shell.rules", "neuron_migrate.deps.rules")


@lru_cache(maxsize=1)
def all_rules() -> tuple[Rule, ...]:
    from neuron_migrate.rules import api, builtin
    from neuron_migrate.rules.yaml_rules import load_yaml_rules

    for info in sorted(pkgutil.iter_modules(builtin.__path__), key=lambda m: m.name):
        importlib.import_module(f"{builtin.__name__}.{info.name}")
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


@lru_cache(maxsize=1)
def _rule_index() -> dict:
    index = {}
    for r in all_rules():
        index[r.code.lower()] = r
        index[r.name] = r
    return index


def get_rule(code_or_name: str) -> Optional[Rule]:
    return _rule_index().get(code_or_name.strip().lower())


def _matches(rule: Rule, selectors: Iterable[str]) -> bool:
    for s in selectors:
        s = s.strip()
        if not s:
            continue
        if s.upper() == "ALL" or rule.code.upper().startswith(s.upper()) or rule.name == s:
            return True
    return False


class RuleSet:
    """The active rules, indexed by (site kind, key) for the runner."""

    def __init__(self, rules: Iterable[Rule]):
        from neuron_migrate.names.analysis import Wanted

        self.rules = tuple(rules)
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

    @classmethod
    def select(cls, select: Iterable[str] = ("ALL",), ignore: Iterable[str] = ()) -> "RuleSet":
        select = list(select) or ["ALL"]
        ignore = list(ignore)
        for s in [*select, *ignore]:
            if s.strip() and s.strip().upper() != "ALL" and not any(_matches(r, [s]) for r in all_rules()):
                raise RuleError(f"unknown rule selector {s!r} (see `neuron-migrate rules`)")
        return cls(r for r in all_rules() if _matches(r, select) and not _matches(r, ignore))

    @classmethod
    def from_codes(cls, codes: Iterable[str]) -> "RuleSet":
        wanted = set(codes)
        return cls(r for r in all_rules() if r.code in wanted)

    @property
    def codes(self) -> tuple[str, ...]:
        return tuple(r.code for r in self.rules)

    def could_match(self, text: str) -> bool:
        """Cheap text prefilter: a file with none of the trigger words cannot produce a finding."""
        return any(w in text for w in self.trigger_words)

    def fingerprint(self) -> str:
        return ",".join(r.code for r in self.rules)
