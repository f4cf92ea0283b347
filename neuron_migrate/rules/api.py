"""What a rule module uses: the `rule` decorator, the check context and the fix builder.

A Python rule is one function plus its metadata:

    @rule(code="NM101", name="mark-step", summary="...", fix="safe", severity="warning",
          triggers=[("call", "torch_xla.core.xla_model.mark_step")], docs="...",
          examples=[("xm.mark_step()", "")])
    def mark_step(site, ctx):
        fx = ctx.fixer()
        fx.delete(site.stmt)
        return ctx.finding(site, "xm.mark_step() is not needed: TorchNeuron runs eagerly", fix=fx.build())
"""
from __future__ import annotations

import ast
from collections.abc import Callable, Iterable

from neuron_migrate.rules.model import Edit, Example, Finding, Fix, FixSafety, ImportReq, Rule, Severity, Span

TYPE_CHECKING = False  # typing is not imported at run time (start-up): it serves annotations only
if TYPE_CHECKING:
    from typing import Optional, Union

_DEFINED: list[Rule] = []

# Local names a fix prefers when it has to import a module.
PREFERRED_ALIAS = {"torch.distributed": "dist", "torch.nn.functional": "F", "numpy": "np"}


def rule(
    *,
    code: str,
    name: str,
    summary: str,
    fix: str = "none",
    severity: str = "warning",
    triggers: Iterable[tuple[str, str]],
    docs: str,
    examples: Iterable[Union[tuple, Example]] = (),
    trigger_words: Iterable[str] = (),
    opt_in: bool = False,
    language: str = "python",
) -> Callable:
    """Declare a Python rule; the decorated function is its check(site, ctx)."""

    def register(check: Callable) -> Callable:
        _DEFINED.append(
            Rule(
                code=code,
                name=name,
                summary=summary,
                fix_safety=FixSafety(fix),
                severity=Severity(severity),
                docs="",
                examples=[e if isinstance(e, Example) else Example(*e) for e in examples],
                triggers=list(triggers),
                check=check,
                trigger_words=tuple(trigger_words) or _words_from_triggers(triggers),
                origin=check.__module__,
                opt_in=opt_in,
                language=language,
            ).docs_to_dedent(docs)
        )
        return check

    return register


def defined_rules() -> list[Rule]:
    return list(_DEFINED)


def _words_from_triggers(triggers: Iterable[tuple[str, str]]) -> tuple[str, ...]:
    """A word that must occur in any file the trigger can match (the cheap text prefilter)."""
    words = set()
    for kind, key in triggers:
        key = key.rstrip(".*")
        if kind in ("call", "ref", "store", "import", "star_import"):
            # the last component is written literally unless bound by an alias... which still requires
            # the module's root name in an import line
            words.add(key.split(".")[0])
        else:
            words.add(key)
    return tuple(sorted(words))


class Settings:
    """Options that change what fixes produce."""

    def __init__(self, device_style: str = "neuron", unsafe_fixes: bool = False, table_path: Optional[str] = None,
                 helpers_module: Optional[str] = None, outside: Optional[dict] = None):
        self.device_style = device_style  # "neuron" | "accelerator"
        self.unsafe_fixes = unsafe_fixes
        self.table_path = table_path  # compatibility table for NM3xx rules (None: the newest shipped one)
        self.helpers_module = helpers_module  # dotted module the helpers are imported from (--helpers-module)
        # what the repository model (repository/) says about the files of the run, by absolute path: plain data
        # that a file's analysis carries as `analysis.outside` (pipeline/repository_facts.py builds it)
        self.outside = outside

    def outside_of(self, path: str) -> Optional[dict]:
        """The repository model's facts about the file at `path` (None: none known)."""
        if not self.outside:
            return None
        import os

        return self.outside.get(os.path.abspath(path))

    def forces_check(self, path: str) -> bool:
        """The repository model asks a rule to edit the file at `path` whatever its text says (NM130's
        "loader_params": a function that another file hands a device loader to), past the text prefilter."""
        facts = self.outside_of(path)
        return bool(facts and facts.get("loader_params"))


class Ctx:
    """Per-file context handed to every check: the analysis, file facts and builders."""

    def __init__(self, analysis, settings: Optional[Settings] = None):
        self.analysis = analysis
        self.settings = settings or Settings()
        self.rule: Optional[Rule] = None  # set by the runner before each check
        self.suppressions = None  # runner.Suppressions of the file (set by the runner; read by NM9xx rules)
        self.ruleset = None  # the active RuleSet (set by the runner)

    # -- facts -----------------------------------------------------------------------------------
    def uses_any(self, *qualnames: str) -> bool:
        q = self.analysis.qualnames
        return any(name in q for name in qualnames)

    def src(self, node: ast.AST) -> str:
        """The node's exact source text (comments and line breaks inside it included, columns as in the file)."""
        return self.analysis.source(node)

    def src_relative(self, node: ast.AST) -> str:
        """The node's exact source, ready to be part of a fix's text: comments and layout kept, continuation
        lines re-indented relative to the statement that holds the node (the fix applier writes a multi-line
        fix text relative to the statement's own indentation). Lines inside a multi-line string stay as they are.
        """
        text = self.analysis.source(node)
        if "\n" not in text:
            return text
        stmt = node
        parents = self.analysis.parent_of
        while stmt is not None and not isinstance(stmt, ast.stmt):
            stmt = parents.get(stmt)
        first = self.analysis.lines[(stmt or node).lineno - 1]
        indent = len(first) - len(first.lstrip(" "))
        return _dedent_continuation(text, indent)

    def src_moved(self, node: ast.AST, column: int) -> str:
        """`src_relative(node)` for a fix that writes the node's text starting at `column` (0-based, in characters)
        instead of where it starts now: continuation lines move by the same amount, so that what was aligned under
        an opening bracket stays aligned (lines inside a multi-line string stay as they are)."""
        text = self.src_relative(node)
        delta = column - self.analysis.span(node).col
        if "\n" not in text or not delta:
            return text
        return _shift_lines(text, delta, 1, _string_lines(text) or set())

    def args_src(self, call: ast.Call) -> str:
        """The text between a call's parentheses as `src_relative` gives it (comments, line breaks and
        alignment kept), for a fix that keeps the arguments of a call it rewrites: `f"{new}({ctx.args_src(call)})"`."""
        whole = self.src_relative(call)
        head = self.src_relative(call.func)
        rest = whole[len(head):].lstrip()
        return rest[1:-1] if rest.startswith("(") and rest.endswith(")") else rest

    # -- results ---------------------------------------------------------------------------------
    def finding(self, at, message: str, fix: Optional[Fix] = None, note: str = "", rule: Optional[Rule] = None,
                confidence: str = "", source: str = "") -> Finding:
        node = at.node if hasattr(at, "node") else at
        span = at if isinstance(at, Span) else self.analysis.span(node)
        return Finding(rule=rule or self.rule, path=self.analysis.path, span=span, message=message, fix=fix, note=note,
                       confidence=confidence or "", source=source or "")

    def fixer(self, safety: Optional[str] = None) -> "FixBuilder":
        default = self.rule.fix_safety if self.rule else FixSafety.SAFE
        return FixBuilder(self, FixSafety(safety) if safety else (default if default != FixSafety.NONE else FixSafety.UNSAFE))


class FixBuilder:
    """Builds one fix. What the engine does with it (rule modules can rely on this):

    - `replace(node, text)`, `delete(stmt)`, `unwrap(with_stmt)`, `insert_before(stmt, text)`: edits by source
      range; everything else stays byte-identical. A multi-line `text` is written relative to the
      indentation of the statement it lands in; build it from `ctx.src_relative(node)` /
      `ctx.args_src(call)` to keep the user's comments and layout (e.g. `f"{new}({ctx.args_src(call)})"`).
    - Text that lands inside an f-string is re-quoted (`torch.device('neuron')` in `f"..."`) so the output
      parses on Python 3.10+; when that is impossible (nested f-strings using both quotes) the fix is left
      out and its finding stays.
    - `not <comparison>` where the fix wrote the comparison becomes the negated operator (`!=`, `not in`,
      `is not`); an `else:`/`elif FLAG:` whose body the fix emptied is dropped; an `if FLAG:` left with `pass`
      and no else is removed.
    - `ref(module)` / `name(qualname)`: the local spelling, importing when needed. New imports go where isort
      puts them (stdlib / third-party / first-party sections of the header, sorted), never a private alias
      when the plain name is free; an existing import that only comes after the first statement running the
      fixed code is imported again in the header.
    - `helper(name)`: inserts a helper from `rules/helpers.py` once per file, below the header imports and
      before the first module-level statement that runs it (its own imports and helpers before it).
    - Imports that the applied fixes left unused (used before, unused after) are removed by the engine: a
      rule need not delete `from torch import float64` itself.
    """

    def __init__(self, ctx: Ctx, safety: FixSafety):
        self.ctx = ctx
        self.safety = safety
        self.edits: list[Edit] = []
        self.imports: list[ImportReq] = []
        self.helpers: list[tuple[str, str]] = []
        self.scope = None  # scope of the site being fixed, when a rule sets it: `ref` looks names up from there

    def ref(self, module: str, scope=None) -> str:
        """The local spelling of `module` (existing alias if any), importing it when needed.

        An existing module-level import is reused; the engine still imports the module in the header when
        that import comes only after the first statement that runs the fixed code (a late `import time`).
        """
        a = self.ctx.analysis
        scope = scope or self.scope
        bound = a.binding_for(module, scope)
        if bound:
            found = (scope or a.module_scope).lookup(bound)[1]
            if found is a.module_scope:
                self.imports.append(ImportReq(module, None if bound == module else bound))
            return bound
        alias = PREFERRED_ALIAS.get(module)
        if alias and (alias not in a.defined_names or a.binding_for(module) == alias):
            self.imports.append(ImportReq(module, alias))
            return alias
        root = module.split(".")[0]
        if "." in module and a.binding_for(root) == root and module in ("torch.distributed", "torch.nn", "torch.optim", "torch.autograd", "torch.accelerator", "torch.amp", "torch.nn.functional"):
            return module  # `import torch` makes these attributes available
        if root in a.defined_names and a.binding_for(root) != root:
            # the root name means something else here: import under a private alias
            alias = "_nm_" + module.replace(".", "_")
            self.imports.append(ImportReq(module, alias))
            return alias
        self.imports.append(ImportReq(module))
        return module

    def name(self, qualname: str, scope=None) -> str:
        """Spelling of `module.attr` using `ref` for the module part."""
        module, _, attr = qualname.rpartition(".")
        return f"{self.ref(module, scope)}.{attr}"

    def member(self, qualname: str, alias: Optional[str] = None) -> str:
        """Import `package.name` as `from package import name [as alias]` (where isort puts it); returns the local name."""
        self.imports.append(ImportReq(qualname, alias, member=True))
        return alias or qualname.rpartition(".")[2]

    def helper(self, name: str) -> str:
        from neuron_migrate.rules.helpers import HELPERS

        spec = HELPERS[name]
        for dep in spec.requires:
            self.helper(dep)
        names = {ph: self.ref(module) for ph, module in (spec.imports or {}).items()}
        if name not in [n for n, _ in self.helpers]:
            self.helpers.append((name, spec.source.format(**names)))
        return name

    def replace(self, node: ast.AST, text: str) -> "FixBuilder":
        kind = "replace_stmt" if isinstance(node, ast.stmt) else "replace_expr"
        self.edits.append(Edit(kind, self.ctx.analysis.span(node), text))
        return self

    def delete(self, stmt: ast.stmt) -> "FixBuilder":
        self.edits.append(Edit("delete_stmt", self.ctx.analysis.span(stmt)))
        return self

    def unwrap(self, with_stmt: ast.With) -> "FixBuilder":
        self.edits.append(Edit("unwrap_with", self.ctx.analysis.span(with_stmt)))
        return self

    def insert_before(self, stmt: ast.stmt, text: str) -> "FixBuilder":
        self.edits.append(Edit("insert_before_stmt", self.ctx.analysis.span(stmt), text))
        return self

    def build(self, safety: Optional[str] = None, description: str = "", unused_import_only: bool = False) -> Fix:
        return Fix(
            safety=FixSafety(safety) if safety else self.safety,
            edits=list(self.edits),
            imports=list(dict.fromkeys(self.imports)),
            helpers=list(self.helpers),
            description=description,
            unused_import_only=unused_import_only,
        )


def _string_lines(text: str):
    """The numbers (1-based) of the lines of `text` that begin inside a multi-line string, or None when it does not
    tokenize."""
    import io
    import tokenize

    in_string: set[int] = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.STRING and tok.end[0] > tok.start[0]:
                in_string.update(range(tok.start[0] + 1, tok.end[0] + 1))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return None
    return in_string


def _shift_lines(text: str, delta: int, start: int, in_string: set) -> str:
    """`text` with its lines from index `start` on moved `delta` columns: right, spaces before each line that is not
    blank; left, up to `-delta` of its leading spaces removed. Lines that begin inside a multi-line string
    (`in_string`, 1-based numbers) stay: their text is the string's."""
    lines = text.split("\n")
    for i in range(start, len(lines)):
        ln = lines[i]
        if i + 1 in in_string or (delta > 0 and not ln.strip()):
            continue
        lines[i] = " " * delta + ln if delta > 0 else ln[min(-delta, len(ln) - len(ln.lstrip(" "))):]
    return "\n".join(lines)


def indent_statement(text: str, pad: str = "    ") -> str:
    """A statement's text (as `Ctx.src_relative` gives it) moved one block deeper: `pad` before each line, except
    lines that begin inside a multi-line string (their text is the string's)."""
    return _shift_lines(text, len(pad), 0, _string_lines(text) or set())


def _dedent_continuation(text: str, indent: int) -> str:
    """Remove `indent` leading spaces from the second and later lines of `text`, except lines that begin
    inside a multi-line string."""
    in_string = _string_lines(text)
    return text if in_string is None else _shift_lines(text, -indent, 1, in_string)


# -- small AST helpers rules share ----------------------------------------------------------------
def kwarg(call: ast.Call, name: str, position: Optional[int] = None) -> Optional[ast.expr]:
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    if position is not None and len(call.args) > position and not any(isinstance(a, ast.Starred) for a in call.args[: position + 1]):
        return call.args[position]
    return None


def has_star_args(call: ast.Call) -> bool:
    return any(isinstance(a, ast.Starred) for a in call.args) or any(kw.arg is None for kw in call.keywords)


def const_value(node: Optional[ast.AST], default=None):
    if isinstance(node, ast.Constant):
        return node.value
    return default
