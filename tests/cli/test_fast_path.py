"""cli/fast.py parses the one-line forms of audit and rewrite without typer: it must hand the command exactly what
typer would, and leave everything else to typer."""
from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from neuron_migrate.cli import audit_run, fast, rewrite_run
from neuron_migrate.cli.typer_app import app

AUDIT = [
    ["audit"],
    ["audit", "src", "tests/x.py"],
    ["audit", "--no-cache", "-f", "json", "a.py"],
    ["audit", "--output-format=concise", "--select", "NM1", "--select", "NM2,NM3", "--ignore", "NM101", "a.py"],
    ["audit", "-q", "--exit-zero", "--statistics", "--fail-level", "error", "-j", "2", "--color", "never", "."],
    ["audit", "--force-exclude", "--no-respect-gitignore", "--config", "pyproject.toml", "--table", "t.yaml", "x"],
    ["audit", "--extend-select", "NM404", "--exclude", "build/*", "--extend-exclude", "*.ipynb", "--max-file-size", "10"],
    ["audit", "--no-color", "--show-fixes", "--min-confidence", "high", "-o", "out.txt", "a.py", "b.py"],
    ["audit", "--jobs=1", "--no-force-exclude", "a.py"],
]
REWRITE = [
    ["rewrite"],
    ["rewrite", "--write", "a.py"],
    ["rewrite", "-w", "--unsafe-fixes", "--no-cache", "-q", "src"],
    ["rewrite", "--check", "--diff", "--show-fixes", "--no-unsafe-fixes", "--fail-level", "warning", "."],
    ["rewrite", "--device-style", "accelerator", "--helpers-module", "h.py", "--select", "NM1", "-j", "1", "x.py"],
]
TO_TYPER = [
    ["audit", "-"], ["audit", "--help"], ["audit", "-h"], ["audit", "--watch", "."], ["audit", "--add-noqa"],
    ["audit", "--stdin-filename", "x.py", "-"], ["audit", "--", "x.py"], ["audit", "--bogus"], ["audit", "-j"],
    ["audit", "-j", "two"], ["audit", "-qf", "json"], ["audit", "--no-cache=1"], ["rewrite", "-W"], ["rewrite", "-"],
    ["probe", "x.py"], ["table", "show"], ["--version"], [], ["rewrite", "--output-format", "json"],
]


def _typer_kwargs(monkeypatch, argv: list[str]) -> dict:
    seen: dict = {}

    def capture(**kwargs):
        seen.update(kwargs)
        return 0

    monkeypatch.setattr(audit_run, "run_audit", capture)
    monkeypatch.setattr(rewrite_run, "run_rewrite", capture)
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    return seen


@pytest.mark.parametrize("argv", AUDIT + REWRITE, ids=" ".join)
def test_fast_parse_gives_the_command_what_typer_gives(monkeypatch, argv):
    parsed = fast.parse(argv)
    assert parsed is not None and parsed[0] == argv[0]
    fn = audit_run.run_audit if argv[0] == "audit" else rewrite_run.run_rewrite
    # parameters the fast path leaves out take the run function's defaults, which must be typer's too
    defaults = {k: p.default for k, p in inspect.signature(fn).parameters.items()}
    want = _typer_kwargs(monkeypatch, argv)
    assert {**defaults, **parsed[1]} == want


@pytest.mark.parametrize("argv", TO_TYPER, ids=lambda a: " ".join(a) or "(none)")
def test_everything_else_is_left_to_typer(argv):
    assert fast.parse(argv) is None


def test_the_fast_path_imports_neither_typer_nor_rich(tmp_path):
    (tmp_path / "t.py").write_text("import torch_xla.core.xla_model as xm\ndevice = xm.xla_device()\n")
    code = ("import sys\nfrom neuron_migrate.cli.app import main\nsys.argv = ['neuron-migrate', 'audit', '--no-cache', 't.py']\n"
            "try:\n    main()\nexcept SystemExit as e:\n    print('EXIT', e.code, 'typer' in sys.modules, any(m.startswith('rich') for m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert "NM102" in out.stdout, out.stdout + out.stderr  # it did run the audit
    assert out.stdout.strip().splitlines()[-1] == "EXIT 1 False False", out.stdout + out.stderr


def test_a_bad_option_value_fails_the_same_way_on_both_paths(tmp_path, capsys):
    assert fast.run(["audit", "--output-format", "yaml", str(tmp_path)]) == 2
    fast_err = capsys.readouterr().err
    result = CliRunner().invoke(app, ["audit", "--output-format", "yaml", str(tmp_path)])
    assert result.exit_code == 2
    assert "--output-format must be one of" in fast_err and "--output-format must be one of" in (result.output + (result.stderr if result.stderr_bytes is not None else ""))


def test_version_is_answered_without_typer_and_as_typer_answers_it(capsys):
    typer_out = CliRunner().invoke(app, ["--version"])
    assert typer_out.exit_code == 0
    assert fast.run(["--version"]) == 0
    assert capsys.readouterr().out == typer_out.output
    code = ("import sys\nfrom neuron_migrate.cli.app import main\nsys.argv = ['neuron-migrate', '--version']\n"
            "try:\n    main()\nexcept SystemExit as e:\n    print('EXIT', e.code, 'typer' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "EXIT 0 False", out.stdout + out.stderr


def test_version_comes_from_the_metadata_beside_the_package(tmp_path):
    """A regular install: the version is read from the `.dist-info` folder next to the package (no importlib.metadata
    import); a source tree without one falls back to importlib.metadata."""
    import shutil

    import neuron_migrate

    site = tmp_path / "site"
    shutil.copytree(Path(neuron_migrate.__file__).parent, site / "neuron_migrate",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (site / "neuron_migrate-9.8.7.dist-info").mkdir()
    code = "import sys, neuron_migrate; print(neuron_migrate.__version__, 'importlib.metadata' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(site)}, cwd=tmp_path)
    assert out.stdout.split() == ["9.8.7", "False"], out.stdout + out.stderr


# The run is wrapped so that, once it is over, an object is left that only interpreter teardown would finalize (a
# module entry: shutdown empties sys.modules; objects made before the run are frozen out of the GC's reach).
_ENTRY = ("import atexit, os, sys\nfrom neuron_migrate.cli import app, fast\n"
          "class Finalized:\n    def __del__(self, write=os.write):\n        write(1, b'FINALIZED\\n')\n"
          "run = fast.run\n"
          "def wrapped(argv):\n    code = run(argv)\n    sys.modules['teardown_probe'] = Finalized()\n    return code\n"
          "fast.run = wrapped\n"
          "atexit.register(lambda: sys.stdout.write('ATEXIT\\n'))\n"
          "{extra}"
          "sys.argv = ['neuron-migrate', 'audit', '--no-cache', {args}]\napp.{fn}()\n")


def _entry_run(tmp_path, fn: str, args: str, extra: str = "") -> subprocess.CompletedProcess:
    code = _ENTRY.format(fn=fn, args=args, extra=extra)
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)


def test_the_console_entry_exits_at_once_with_main_s_output_and_status(tmp_path):
    """entry() (the console script) ends a fast-path run without interpreter teardown: same output (block-buffered
    into a pipe, flushed), same exit status, exit handlers run; objects are not finalized (main() finalizes them)."""
    for i in range(40):
        (tmp_path / f"t{i}.py").write_text("import torch_xla.core.xla_model as xm\ndevice = xm.xla_device()\nxm.mark_step()\n")
    (tmp_path / "clean.py").write_text("x = 1\n")
    for args, status in (("'.'", 1), ("'clean.py'", 0), ("'missing.py'", 2)):
        fast_run = _entry_run(tmp_path, "entry", args)
        normal = _entry_run(tmp_path, "main", args)
        assert fast_run.returncode == normal.returncode == status, fast_run.stderr + normal.stderr
        assert fast_run.stderr == normal.stderr
        assert normal.stdout.endswith("ATEXIT\nFINALIZED\n"), normal.stdout
        assert fast_run.stdout == normal.stdout[: -len("FINALIZED\n")], fast_run.stdout
    assert fast_run.stdout.count("\n") > 1 and _entry_run(tmp_path, "entry", "'.'").stdout.count("NM1") >= 80


def test_the_console_entry_takes_the_normal_exit_while_a_thread_runs(tmp_path):
    """Interpreter shutdown joins non-daemon threads: with one alive, entry() must not cut it short."""
    (tmp_path / "clean.py").write_text("x = 1\n")
    # the thread is still blocked when the run ends; interpreter shutdown releases it (threading's own exit hook,
    # which concurrent.futures uses too) and then joins it, so the file exists only if shutdown ran
    extra = ("import threading, pathlib\nrelease = threading.Event()\n"
             "def late():\n    release.wait()\n    pathlib.Path('thread-done').write_text('yes')\n"
             "threading.Thread(target=late).start()\nthreading._register_atexit(release.set)\n")
    out = _entry_run(tmp_path, "entry", "'clean.py'", extra)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "thread-done").read_text() == "yes"
    assert out.stdout.endswith("ATEXIT\nFINALIZED\n")


def test_the_console_entry_lets_a_profiler_write_its_data(tmp_path):
    """`python -m cProfile -m neuron_migrate ...` writes its data after the program returns: with a profiler
    attached the normal exit is taken (the benchmark profiles the audit this way)."""
    (tmp_path / "t.py").write_text("import torch_xla.core.xla_model as xm\nxm.mark_step()\n")
    out = subprocess.run([sys.executable, "-m", "cProfile", "-o", "out.prof", "-m", "neuron_migrate", "audit", "--no-cache", "t.py"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert "NM101" in out.stdout, out.stdout + out.stderr  # (cProfile itself exits 0 after SystemExit)
    import pstats

    assert any("check_text" in str(fn) for fn in pstats.Stats(str(tmp_path / "out.prof")).stats)


@pytest.mark.parametrize("command", ["audit", "rewrite"])
def test_a_reader_that_stops_reading_gets_no_traceback(tmp_path, command):
    """`neuron-migrate audit . | head -1`: once the reader closes the pipe, the run stops with status 1 (as click
    stops the other commands) and nothing on stderr, not a BrokenPipeError traceback. The output is far larger than
    a pipe holds, so the write after the close is certain to fail."""
    body = "import torch_xla.core.xla_model as xm\n\n\ndef step(x):\n" + "".join(
        f"    y{i} = x.to(xm.xla_device())\n    xm.mark_step()\n" for i in range(30))
    for i in range(40):
        (tmp_path / f"t{i}.py").write_text(body)
    proc = subprocess.Popen([sys.executable, "-m", "neuron_migrate", command, "--no-cache", "-j", "1", "."], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 1, err
    assert first and "Traceback" not in err and "BrokenPipe" not in err and err == "", err
