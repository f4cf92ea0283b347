"""The one-line forms of `audit` and `rewrite` (what pre-commit, editors and scripts run), parsed without typer.

typer and the command tree it builds cost about 0.1 s per start, half of a one-file audit. An argument list made
only of paths and the options below is parsed here and handed to the same command functions (`cli/audit_run.py`,
`cli/rewrite_run.py`) typer calls; anything else (help, an unknown or malformed option, `-` for standard input,
`--watch`, `--add-noqa`, `--`) returns None and typer parses it, with its messages. `--version` alone is
answered here too. tests/cli/test_fast_path.py
checks that both parsers give the command the same arguments.
"""
from __future__ import annotations

# option -> (parameter, kind): "flag" sets True, "off" sets False, "str"/"int" take a value, "list" appends one
_COMMON = {
    "--select": ("select", "list"), "--extend-select": ("extend_select", "list"), "--ignore": ("ignore", "list"),
    "--exclude": ("exclude", "list"), "--extend-exclude": ("extend_exclude", "list"),
    "--force-exclude": ("force_exclude", "flag"), "--no-force-exclude": ("force_exclude", "off"),
    "--respect-gitignore": ("respect_gitignore", "flag"), "--no-respect-gitignore": ("respect_gitignore", "off"),
    "--config": ("config", "str"), "--jobs": ("jobs", "int"), "-j": ("jobs", "int"),
    "--no-cache": ("no_cache", "flag"), "--max-file-size": ("max_file_size", "int"),
    "--quiet": ("quiet", "flag"), "-q": ("quiet", "flag"), "--color": ("color", "str"), "--no-color": ("no_color", "flag"),
    "--show-fixes": ("show_fixes", "flag"), "--fail-level": ("fail_level", "str"),
}
OPTIONS = {
    "audit": {**_COMMON, "--output-format": ("output_format", "str"), "-f": ("output_format", "str"),
              "--output-file": ("output_file", "str"), "-o": ("output_file", "str"), "--statistics": ("statistics", "flag"),
              "--exit-zero": ("exit_zero", "flag"), "--table": ("table", "str"), "--min-confidence": ("min_confidence", "str")},
    "rewrite": {**_COMMON, "--write": ("write", "flag"), "-w": ("write", "flag"), "--check": ("check", "flag"),
                "--diff": ("diff", "flag"), "--unsafe-fixes": ("unsafe_fixes", "flag"),
                "--no-unsafe-fixes": ("unsafe_fixes", "off"), "--device-style": ("device_style", "str"),
                "--helpers-module": ("helpers_module", "str")},
}


def parse(argv: list[str]) -> tuple[str, dict] | None:
    """(command, keyword arguments for its run function), or None when typer must parse `argv`."""
    if not argv or argv[0] not in OPTIONS:
        return None
    command, table = argv[0], OPTIONS[argv[0]]
    kwargs: dict = {}
    paths: list[str] = []
    i = 1
    while i < len(argv):
        tok = argv[i]
        i += 1
        if not tok.startswith("-"):
            paths.append(tok)
            continue
        name, eq, inline = tok.partition("=")
        spec = table.get(name)
        if spec is None:
            return None  # `-`, `--`, help, an unknown option, combined short options: typer decides
        param, kind = spec
        if kind in ("flag", "off"):
            if eq:
                return None
            kwargs[param] = kind == "flag"
            continue
        if eq:
            value = inline
        elif i < len(argv):
            value = argv[i]
            i += 1
        else:
            return None  # a missing value: typer's message
        if kind == "int":
            try:
                value = int(value)
            except ValueError:
                return None
        if kind == "list":
            kwargs.setdefault(param, []).append(value)
        else:
            kwargs[param] = value
    kwargs["paths"] = paths or None
    return command, kwargs


def run(argv: list[str]) -> int | None:
    """The exit code of `argv` run through the fast path, or None when it does not apply."""
    if argv == ["--version"]:  # what scripts and bug reports ask first: typer's start-up would be most of it
        import sys

        from neuron_migrate import __version__

        sys.stdout.write(f"neuron-migrate {__version__}\n")
        return 0
    parsed = parse(argv)
    if parsed is None:
        return None
    command, kwargs = parsed
    if command == "audit":
        from neuron_migrate.cli.audit_run import run_audit as fn
    else:
        from neuron_migrate.cli.rewrite_run import run_rewrite as fn
    try:
        return fn(**kwargs)
    except SystemExit as exc:  # cli.common.fail: the message is written, the code is the exit code
        return exc.code if isinstance(exc.code, int) else 2
