"""What `rewrite` and `audit` share: configuration, rule selection, file discovery, progress, error printing."""
from __future__ import annotations

import os
import sys
from pathlib import Path

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2
LEVELS = ("info", "warning", "error")
RANK = {"info": 0, "warning": 1, "error": 2, "none": 3}
COLOR_MODES = ("auto", "always", "never")


def split_codes(values: list[str] | None) -> list[str]:
    out = []
    for v in values or []:
        out += [x.strip() for x in v.split(",") if x.strip()]
    return out


# Plain classes, not dataclasses: importing dataclasses (and the inspect module it imports) costs every start-up
# about 20 ms. Nothing compares these records, so they keep identity equality.
class Selection:
    """What the command line says about which rules and files; the configuration fills in the rest."""

    def __init__(self, select: list | None = None, extend_select: list | None = None, ignore: list | None = None,
                 exclude: list | None = None, extend_exclude: list | None = None, force_exclude: bool | None = None,
                 respect_gitignore: bool | None = None, unsafe_fixes: bool | None = None,
                 device_style: str | None = None, config: str | None = None, table: str | None = None,
                 max_file_size: int | None = None):
        self.select = [] if select is None else select
        self.extend_select = [] if extend_select is None else extend_select
        self.ignore = [] if ignore is None else ignore
        self.exclude = [] if exclude is None else exclude
        self.extend_exclude = [] if extend_exclude is None else extend_exclude
        self.force_exclude = force_exclude
        self.respect_gitignore = respect_gitignore
        self.unsafe_fixes = unsafe_fixes
        self.device_style = device_style
        self.config = config
        self.table = table
        self.max_file_size = max_file_size


class Group:
    """Files that share one configuration and rule set (nested pyproject.toml, per-file-ignores)."""

    def __init__(self, config: object, ruleset: object, settings_kw: dict, items: list | None = None):
        self.config = config
        self.ruleset = ruleset
        self.settings_kw = settings_kw
        self.items = [] if items is None else items  # (path, display path)


class Run:
    """What a command runs on: the paths' configuration, the groups of files by settings, and the messages."""

    def __init__(self, config: object, groups: list, messages: list, skipped: dict | None = None,
                 stdin: tuple | None = None):
        self.config = config  # the configuration of the first path (cache folder, messages)
        self.groups = groups
        self.messages = messages  # errors (one line each, no traceback)
        self.skipped = {} if skipped is None else skipped  # discovery statistics: reason -> count
        self.stdin = stdin  # (display name, bytes) for `-`
        self.paths: list = []  # the paths as given (`.` when none)

    @property
    def items(self) -> list:
        return [it for g in self.groups for it in g.items]

    @property
    def ruleset(self):
        from neuron_migrate.rules.registry import RuleSet

        if not self.groups:
            return getattr(self, "empty_ruleset", None) or RuleSet(())
        if len(self.groups) == 1:
            return self.groups[0].ruleset
        seen = {}
        for g in self.groups:
            for r in g.ruleset.rules:
                seen[r.code] = r
        return RuleSet(seen.values()) if seen else RuleSet(())

    @property
    def settings_kw(self) -> dict:
        return self.groups[0].settings_kw if self.groups else {}

    def skipped_note(self) -> str:
        """`3 files skipped: 2 ignored by .gitignore, 1 excluded`, or ''."""
        s = self.skipped
        parts = []
        gi, gid = s.get("gitignore", 0), s.get("gitignore-dirs", 0)
        ex, exd = s.get("exclude", 0) + s.get("force-exclude", 0), s.get("exclude-dirs", 0)
        if gi or gid:
            parts.append(_count_text(gi, gid) + " ignored by .gitignore (--no-respect-gitignore includes them)")
        if ex or exd:
            parts.append(_count_text(ex, exd) + " excluded by the configuration or --exclude")
        return "; ".join(parts)


def _count_text(files: int, dirs: int) -> str:
    bits = []
    if files:
        bits.append(f"{files} file{'s' if files != 1 else ''}")
    if dirs:
        bits.append(f"{dirs} folder{'s' if dirs != 1 else ''}")
    return " and ".join(bits)


def check_level(name: str, value: str, allowed=LEVELS) -> str:
    v = (value or "").lower()
    if v not in allowed:
        fail(f"{name} must be one of {', '.join(allowed)}, not {value!r}")
    return v


def check_color(value: str | None, no_color: bool) -> str:
    if no_color:
        return "never"
    v = (value or "auto").lower()
    if v not in COLOR_MODES:
        fail(f"--color must be auto, always or never, not {value!r}")
    return v


def check_jobs(jobs: int | None) -> int | None:
    if jobs is not None and jobs < 1:
        fail(f"--jobs must be 1 or more, not {jobs}")
    return jobs


def prepare(paths: list[str], sel: Selection, stdin_filename: str | None = None, cached: bool = False) -> Run:
    """Load configuration(s), select rules, discover files. Exits 2 on bad options or configuration.
    `cached`: the run uses the results cache, so rules may be selected from its rule catalogue (warm runs)."""
    from neuron_migrate.files.config import ConfigError, load_config, load_file

    paths = list(paths or []) or ["."]  # as Ruff: no path means the current folder
    stdin = None
    if paths == ["-"]:
        if not stdin_filename:
            stdin_filename = "stdin.py"
        stdin = (stdin_filename, sys.stdin.buffer.read())
        paths = [stdin_filename]
    elif "-" in paths:
        fail("`-` (standard input) cannot be combined with other paths")
    try:
        root_cfg = load_config(paths, sel.config)
    except ConfigError as exc:
        fail(str(exc))
    if cached and root_cfg.cache and stdin is None:
        from neuron_migrate.pipeline.cache import cache_folder, load_catalogue

        load_catalogue(cache_folder(root_cfg.source))
    base = root_cfg.root or Path.cwd()
    cfg_by_file: dict = {}  # pyproject path -> Config
    default_cfg = _default_config()
    closest_in: dict = {}  # folder -> closest pyproject with our section (or None), memoised along the chain
    root_src = str(Path(root_cfg.source).resolve()) if root_cfg.source is not None else None

    def closest(folder: str):
        from neuron_migrate.files.config import _has_section

        chain = []
        d = folder
        found = None
        while True:
            if d in closest_in:
                found = closest_in[d]
                break
            chain.append(d)
            candidate = os.path.join(d, "pyproject.toml")
            if os.path.isfile(candidate) and _has_section(Path(candidate)):
                found = candidate
                break
            parent = os.path.dirname(d)
            if parent == d or os.path.exists(os.path.join(d, ".git")):
                break
            d = parent
        for c in chain:
            closest_in[c] = found
        return found

    cfg_of_folder: dict = {}  # a file's folder as discovery wrote it -> its Config (files come folder by folder)

    def config_of(p: Path):
        if sel.config:
            return root_cfg
        folder = os.path.dirname(p)
        cfg = cfg_of_folder.get(folder)
        if cfg is None:
            cfg = cfg_of_folder[folder] = _config_in(folder)
        return cfg

    def _config_in(folder: str):
        found = closest(os.path.abspath(folder))
        if found is None:
            return root_cfg if root_cfg.source is None else default_cfg
        if found not in cfg_by_file:
            if root_src is not None and (found == str(root_cfg.source) or str(Path(found).resolve()) == root_src):
                cfg_by_file[found] = root_cfg
            else:
                try:
                    cfg_by_file[found] = load_file(Path(found))
                except ConfigError as exc:
                    fail(str(exc))
        return cfg_by_file[found]

    force = sel.force_exclude if sel.force_exclude is not None else root_cfg.force_exclude
    respect = sel.respect_gitignore if sel.respect_gitignore is not None else root_cfg.respect_gitignore
    excludes = root_cfg.exclude + split_codes(sel.exclude) + split_codes(sel.extend_exclude)
    skipped: dict = {}
    if stdin is not None:
        from neuron_migrate.files.discover import _excluded, _rel_to

        p = Path(stdin[0])
        files, messages = ([] if force and _excluded(p.as_posix(), p.name, excludes, _rel_to(p, base)) else [p]), []
        if not files:
            skipped["force-exclude"] = 1
    else:
        from neuron_migrate.files.discover import discover

        files, messages = discover(paths, excludes, respect, force=force, base=base, stats=skipped)

    groups: dict = {}
    cwd = Path.cwd()
    for f in files:
        cfg = config_of(f)
        if cfg is not root_cfg and cfg.exclude:
            from neuron_migrate.files.discover import _excluded, _rel_to

            if _excluded(f.name, f.name, cfg.exclude, _rel_to(f, cfg.root)):
                skipped["exclude"] = skipped.get("exclude", 0) + 1
                continue
        from neuron_migrate.files.config import per_file_ignored

        extra = tuple(per_file_ignored(cfg, f))
        key = (id(cfg), extra)
        if key not in groups:
            groups[key] = Group(cfg, _ruleset(cfg, sel, extra), _settings(cfg, sel))
        groups[key].items.append((str(f), _display(f, cwd)))
    run = Run(root_cfg, list(groups.values()), messages, skipped, stdin)
    run.paths = paths
    if not run.groups:  # still validate the selection, and give the renderers a rule set
        run.groups = []
        run.empty_ruleset = _ruleset(root_cfg, sel, ())
    return run


def _default_config():
    from neuron_migrate.files.config import Config

    return Config()


def _ruleset(cfg, sel: Selection, extra_ignores: tuple):
    from neuron_migrate.rules.registry import RuleError, RuleSet

    chosen = split_codes(sel.select) or cfg.select
    chosen = chosen + cfg.extend_select + split_codes(sel.extend_select)
    ign = cfg.ignore + split_codes(sel.ignore) + list(extra_ignores)
    try:
        return RuleSet.select(chosen, ign)
    except RuleError as exc:
        fail(f"{exc}" + (f" in {cfg.source}" if cfg.source and not split_codes(sel.select) else ""))


def _settings(cfg, sel: Selection) -> dict:
    unsafe = cfg.unsafe_fixes if sel.unsafe_fixes is None else sel.unsafe_fixes
    style = sel.device_style or cfg.device_style
    if style not in ("neuron", "accelerator"):
        fail(f"--device-style must be 'neuron' or 'accelerator', not {style!r}")
    kw = {"device_style": style, "unsafe_fixes": unsafe}
    table = sel.table or cfg.table
    if table:
        kw["table_path"] = str(Path(table).resolve())
    size = sel.max_file_size or cfg.max_file_size
    from neuron_migrate.files.config import DEFAULT_MAX_FILE_SIZE

    if size != DEFAULT_MAX_FILE_SIZE:
        kw["max_file_size"] = size
    return kw


def _display(f: Path, cwd: Path) -> str:
    s = str(f)
    if not os.path.isabs(s) and not s.startswith(".."):
        return os.path.normpath(s)  # already relative to cwd (the common case: no path, or `.`)
    prefix = str(cwd) + os.sep
    if s.startswith(prefix):
        return s[len(prefix):]
    try:
        display = os.path.relpath(f, cwd)
        if display.startswith(".." + os.sep + ".."):
            display = str(f)
    except ValueError:
        display = str(f)
    return display


def unsafe_source(run: Run) -> str:
    """Where --unsafe-fixes came from, for the summary: 'the command line', 'unsafe-fixes = true in X'."""
    for g in run.groups:
        if g.settings_kw.get("unsafe_fixes") and "unsafe-fixes" in g.config.explicit:
            return f"`unsafe-fixes = true` in {g.config.source}"
    return "--unsafe-fixes"


def no_files(run: Run) -> bool:
    """True (after printing why) when the run has nothing to do; the caller exits 2, or 0 when every path was
    a file named explicitly and force-excluded (pre-commit passing a vendored file)."""
    return not run.items and not run.messages


def report_no_files(run: Run, paths: list[str]) -> int:
    note = run.skipped_note()
    only_forced = run.skipped.get("force-exclude", 0) and not any(
        k for k, v in run.skipped.items() if v and k != "force-exclude")
    if only_forced:
        return EXIT_CLEAN  # every named file is excluded: nothing to do, as pre-commit expects
    where = " ".join(paths or ["."])
    sys.stderr.write(f"neuron-migrate: error: no Python files found in {where}" + (f" ({note})" if note else "") + "\n")
    return EXIT_ERROR


def open_cache(group: Group, fix: bool, no_cache: bool, root_config=None):
    """The result cache for one group, or None when disabled (--no-cache or `cache = false`)."""
    if no_cache or not group.config.cache:
        return None
    from neuron_migrate.pipeline.cache import ResultCache, cache_folder, cache_key

    src = (root_config.source if root_config is not None and root_config.source else None) or group.config.source
    return ResultCache(cache_folder(src), cache_key(group.ruleset.spec, group.settings_kw, fix))


def add_repository_facts(run: Run, no_cache: bool, jobs: int | None = 1, lazy: bool = True) -> None:
    """Build the repository model of the run's files once, and give every group what it says about its files
    (`outside` in the settings: pipeline/repository_facts.py). `lazy=False` (a run that writes its files): every
    file's answers are computed before the first file is written, since some answers read other files' text (a
    file's answers computed after another was rewritten would describe the rewritten program)."""
    from neuron_migrate.pipeline.repository_facts import repository_facts

    folder = None
    if not no_cache and run.config.cache:
        from neuron_migrate.pipeline.cache import cache_folder

        folder = cache_folder(run.config.source)
    paths = [path for path, _display in run.items]
    if run.stdin is not None:  # the text comes on stdin; the model reads the tree it names
        paths = [display for _path, display in run.items]
    if jobs is None:
        from neuron_migrate.pipeline.parallel import default_jobs

        jobs = default_jobs()
    outside = repository_facts(paths, run.paths, folder, jobs=jobs, lazy=lazy)
    for g in run.groups:
        if outside:
            g.settings_kw["outside"] = outside
        else:
            g.settings_kw.pop("outside", None)


def iterate(run: Run, fix: bool, write: bool, jobs, no_cache: bool, err, show_progress: bool):
    """Yield FileResults of every group, with a progress bar on a terminal; save caches at the end."""
    from neuron_migrate.pipeline.parallel import run_files
    from neuron_migrate.report.text import labelled

    add_repository_facts(run, no_cache, jobs, lazy=not write)

    total = len(run.items)
    progress = None
    if show_progress and total >= PROGRESS_MIN_FILES and err.is_terminal:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        progress = Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=err, transient=True)
        task = progress.add_task("rewrite" if fix else "audit", total=total)
        progress.start()
    try:
        for g in run.groups:
            cache = open_cache(g, fix, no_cache, run.config)
            if cache is not None and cache.warning:
                err.print(labelled("warning", "yellow", cache.warning))
            advance = (lambda: progress.advance(task)) if progress is not None else None
            yield from run_files(g.items, g.ruleset.spec, g.settings_kw, fix=fix, write=write, jobs=jobs, cache=cache,
                                 on_done=advance)
            if cache is not None:
                problem = cache.save()  # a cache that cannot be written only costs time
                if problem:
                    err.print(labelled("warning", "yellow", problem))
                else:
                    from neuron_migrate.pipeline.cache import save_catalogue

                    save_catalogue(cache.folder)
    finally:
        if progress is not None:
            progress.stop()


PROGRESS_MIN_FILES = 20  # below this a bar only flickers


def fail(message: str) -> None:
    sys.stderr.write(f"neuron-migrate: error: {message}\n")
    raise SystemExit(EXIT_ERROR)  # typer and the fast parser alike exit with it
