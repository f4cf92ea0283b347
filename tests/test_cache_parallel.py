"""Output is identical with and without the cache and with one or two worker processes."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "xla_project"


@pytest.fixture
def tree(tmp_path) -> Path:
    root = tmp_path / "proj"
    for i in range(8):  # enough files to use the process pool
        shutil.copytree(EXAMPLES, root / f"copy{i}")
    (root / "pyproject.toml").write_text("[tool.neuron-migrate]\nunsafe-fixes = true\n")
    return root


def nm(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "neuron_migrate", *args], capture_output=True, text=True, cwd=root)


@pytest.mark.parametrize("command", [["rewrite", "--diff"], ["rewrite", "--no-color"], ["audit", "--output-format", "json"],
                                     ["audit", "--no-color"], ["audit", "--output-format", "sarif"]])
@pytest.mark.slow
def test_same_output_with_and_without_cache_and_workers(tree, command):
    base = nm(tree, *command, "--no-cache", "-j", "1", ".")
    assert base.returncode == 1 and base.stdout
    cold = nm(tree, *command, "-j", "2", ".")
    assert (tree / ".neuron-migrate-cache").is_dir()
    warm = nm(tree, *command, "-j", "2", ".")
    assert cold.stdout == base.stdout
    assert warm.stdout == base.stdout
    assert cold.returncode == warm.returncode == base.returncode


@pytest.mark.slow
def test_corrupt_cache_is_a_warning(tree):
    first = nm(tree, "rewrite", "--diff", ".")
    for f in (tree / ".neuron-migrate-cache").glob("results-*.json"):
        f.write_text("{not json")
    again = nm(tree, "rewrite", "--diff", ".")
    assert again.returncode == first.returncode
    assert again.stdout == first.stdout
    assert "ignoring unreadable cache" in again.stderr


@pytest.mark.slow
def test_cache_follows_content_changes(tree):
    nm(tree, "rewrite", "--diff", ".")
    target = tree / "copy0" / "new_style.py"
    target.write_text("import torch\nprint(torch.ones(1))\n")
    out = nm(tree, "rewrite", "--diff", ".")
    assert "copy0/new_style.py" not in out.stdout
    assert "copy1/new_style.py" in out.stdout


@pytest.mark.slow
def test_write_with_warm_cache_writes(tree):
    nm(tree, "rewrite", "--diff", ".")  # warm the cache with would-change results
    res = nm(tree, "rewrite", "--write", ".")
    assert res.returncode in (0, 1), res.stderr
    assert "torch_xla" not in (tree / "copy3" / "single_device.py").read_text()
    assert nm(tree, "rewrite", "--check", ".").stdout.count("0 of") == 1


def _age(root: Path, seconds: int = 3600) -> None:
    """Date every file back, so that the cache trusts their stat signatures (recent files are 'racy')."""
    import os
    import time

    past = time.time_ns() - seconds * 1_000_000_000
    for f in root.rglob("*.py"):
        os.utime(f, ns=(past, past))


def test_warm_audit_report_reads_no_source(tree):
    """The code frames of a warm run come from the cache: a file whose content changed behind an unchanged stat
    signature (same size, mtime and inode) still shows the frames of the content the findings are for."""
    import os

    _age(tree)
    cold = nm(tree, "audit", "--show-fixes", ".")
    assert cold.returncode == 1 and " | " in cold.stdout
    target = tree / "copy0" / "torchrun_ddp.py"
    st = os.stat(target)
    data = target.read_bytes()
    target.write_bytes(bytes(b if b in b"\r\n" else ord("#") for b in data))  # same size, every line a comment
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    warm = nm(tree, "audit", "--show-fixes", ".")
    assert warm.stdout == cold.stdout
    assert "copy0/torchrun_ddp.py" in warm.stdout and "####" not in warm.stdout


def test_warm_rewrite_summary_reads_no_source(tree):
    """Which files still import an XLA-based library after the rewrite is worked out where each file is rewritten
    and cached with its result: a warm run's summary lists what the cold one listed for the same content, even where
    a file changed behind an unchanged stat signature (the warm run reads no file and parses nothing)."""
    import os

    target = tree / "debug.py"
    target.write_text("import torch_xla\ntorch_xla._XLAC._set_ir_debug(True)\n")  # kept: a finding, no fix
    _age(tree)
    cold = nm(tree, "rewrite", ".")
    assert cold.returncode == 1, cold.stderr
    assert re.search(r"^\s*debug\.py: torch_xla$", cold.stdout, re.M), cold.stdout
    st = os.stat(target)
    data = target.read_bytes()
    target.write_bytes(bytes(b if b in b"\r\n" else ord("#") for b in data))  # same size, every line a comment
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    warm = nm(tree, "rewrite", ".")
    assert warm.stdout == cold.stdout
    fresh = nm(tree, "rewrite", "--no-cache", ".")
    assert "debug.py" not in fresh.stdout  # what a cacheless run says of the new content


def test_stdin_audit_shows_frames_of_the_input_not_of_a_file(tmp_path):
    (tmp_path / "train.py").write_text("x = 1\n")  # a different file of the given name must not be shown
    src = "import torch_xla.core.xla_model as xm\ndevice = xm.xla_device()\n"
    out = subprocess.run([sys.executable, "-m", "neuron_migrate", "audit", "-", "--stdin-filename", "train.py"],
                         input=src, capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 1, out.stderr
    assert "    2 | device = xm.xla_device()" in out.stdout


def _imports_rules(root: Path, *args: str) -> tuple[subprocess.CompletedProcess, bool]:
    """Run the CLI in a fresh interpreter: (the run, whether any rule module was imported)."""
    code = ("import atexit, sys\n"
            "atexit.register(lambda: sys.stderr.write('RULES-IMPORTED %s\\n' % any(m.startswith('neuron_migrate.rules.builtin.') for m in sys.modules)))\n"
            f"sys.argv = ['neuron-migrate', *{list(args)!r}]\n"
            "from neuron_migrate.cli.app import main\nmain()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root)
    flag = [ln for ln in out.stderr.splitlines() if ln.startswith("RULES-IMPORTED ")]
    assert flag, out.stderr[-2000:]
    return out, flag[-1].endswith("True")


def test_warm_run_selects_and_reports_from_the_rule_catalogue(tree):
    _age(tree)
    # (the json audit shares the text audit's results; the rewrite has its own)
    # (the rewrite's summary names each rule it applied, and lists the fixes: from the catalogue too)
    for args, is_cold in ((["audit", "."], True), (["audit", "--output-format", "json", "."], False),
                          (["rewrite", "--diff", "."], True), (["rewrite", "--show-fixes", "."], False)):
        base = nm(tree, *args, "--no-cache")
        cold, cold_imported = _imports_rules(tree, *args)
        warm, warm_imported = _imports_rules(tree, *args)
        assert cold_imported == is_cold and not warm_imported, args  # the warm run imported no rule module
        assert base.stdout == cold.stdout == warm.stdout and warm.returncode == base.returncode == 1, args
    assert list((tree / ".neuron-migrate-cache").glob("rules-*.json"))
    # a changed file is checked: the rules are imported then, and the report is the uncached one
    target = tree / "copy5" / "new_style.py"
    target.write_text(target.read_text() + "\nimport torch_xla.core.xla_model as xm\nxm.mark_step()\n")
    again, imported = _imports_rules(tree, "audit", ".")
    assert imported and again.stdout == nm(tree, "audit", "--no-cache", ".").stdout
    # the catalogue's codes and names validate selectors as the rules do
    bad, _ = _imports_rules(tree, "audit", "--select", "NM9999", ".")
    assert bad.returncode == 2 and "unknown rule selector 'NM9999'" in bad.stderr
    only, only_imported = _imports_rules(tree, "audit", "--select", "NM101", ".")
    assert only.stdout == nm(tree, "audit", "--no-cache", "--select", "NM101", ".").stdout


def test_unreadable_rule_catalogue_only_costs_the_import(tree):
    _age(tree)
    first = nm(tree, "audit", ".")
    for f in (tree / ".neuron-migrate-cache").glob("rules-*.json"):
        f.write_text('{"rules": [{"code": "NM101"}]}')
    again, imported = _imports_rules(tree, "audit", ".")
    assert imported and again.stdout == first.stdout and again.returncode == first.returncode


def test_catalogued_rules_report_what_the_rules_do():
    from neuron_migrate.rules.model import CataloguedRule
    from neuron_migrate.rules.registry import all_rules

    for r in all_rules():
        c = CataloguedRule(CataloguedRule.entry(r))
        for attr in (*CataloguedRule.FIELDS, "category", "url", "docs", "examples", "trigger_words"):
            assert getattr(c, attr) == getattr(r, attr), (r.code, attr)


def test_workers_take_the_largest_files_first_and_results_keep_the_input_order(tmp_path, monkeypatch):
    from neuron_migrate.pipeline import parallel
    from neuron_migrate.rules.registry import RuleSet, all_rules

    paths = []
    for i in range(30):  # sizes out of order; enough files for the process pool
        p = tmp_path / f"f{i:02d}.py"
        p.write_text("import torch_xla.core.xla_model as xm\n" + "x = 1\n" * ((i * 7) % 30) + "xm.mark_step()\n")
        paths.append(str(p))
    sent = []
    original = parallel.fork_pool

    def spy(chunks, jobs, initargs):
        sent.extend(item[0] for c in chunks for _, item in c)
        return original(chunks, jobs, initargs)

    monkeypatch.setattr(parallel, "fork_pool", spy)
    done = []
    results, done_before = [], []
    for r in parallel._run([(p, p) for p in paths], RuleSet(all_rules()).spec, {}, False, False, 2, lambda: done.append(1)):
        done_before.append(len(done))
        results.append(r)
    assert [r.path for r in results] == paths
    # progress counts files as they are done, never fewer than have been handed back
    assert all(d >= k + 1 for k, d in enumerate(done_before)) and len(done) == 30
    assert [r.findings[-1].span.line for r in results] == [2 + (i * 7) % 30 for i in range(30)]
    sizes = [Path(p).stat().st_size for p in sent]
    assert sizes == sorted(sizes, reverse=True) and sorted(sent) == sorted(paths)


def test_cached_rewrite_keeps_the_bytes_of_every_encoding(tmp_path):
    """A rewrite's cached bytes are marked as the UTF-8 of its text where they are that, and kept where they are
    not (BOM, CRLF, Latin-1): the warm result gives back exactly the bytes the cold one computed."""
    from neuron_migrate.pipeline.cache import result_from_dict, result_to_dict
    from neuron_migrate.pipeline.process import FileResult

    text = "import torch\nd = torch.device('neuron')  # é\n"
    for data in (text.encode("utf-8"), b"\xef\xbb\xbf" + text.encode("utf-8"), text.replace("\n", "\r\n").encode("utf-8"),
                 text.encode("latin-1")):
        r = FileResult("t.py", old_text="old\n", new_text=text, new_bytes=data, digest="d")
        d = result_to_dict(r)
        assert ("bt" in d) == (data == text.encode("utf-8"))  # marked, not stored twice
        back = result_from_dict("t.py", json.loads(json.dumps(d)))
        assert back.new_bytes == data and back.new_text == text and back.old_text == "old\n" and back.changed
    same = result_from_dict("t.py", result_to_dict(FileResult("t.py", digest="d")))
    assert same.new_bytes is None and not same.changed and same.xla_libs is None
    r = FileResult("t.py", digest="d")
    r.xla_libs = ["torch_xla"]
    assert result_from_dict("t.py", json.loads(json.dumps(result_to_dict(r)))).xla_libs == ["torch_xla"]


def test_warm_write_of_crlf_and_bom_files_matches_the_cold_write(tmp_path):
    """End to end: files with CRLF line ends and a BOM, rewritten from a warm cache, get the bytes a cacheless
    rewrite writes."""
    import os

    src = "import torch_xla.core.xla_model as xm\n\ndevice = xm.xla_device()\n"
    variants = {"lf.py": src.encode(), "crlf.py": src.replace("\n", "\r\n").encode(), "bom.py": b"\xef\xbb\xbf" + src.encode()}
    expected = {}
    for name, data in variants.items():
        (tmp_path / "nocache").mkdir(exist_ok=True)
        (tmp_path / "nocache" / name).write_bytes(data)
    assert nm(tmp_path / "nocache", "rewrite", "--write", "--no-cache", ".").returncode == 0
    expected = {name: (tmp_path / "nocache" / name).read_bytes() for name in variants}
    root = tmp_path / "cached"
    root.mkdir()
    for name, data in variants.items():
        (root / name).write_bytes(data)
    past = __import__("time").time_ns() - 3600 * 1_000_000_000
    for f in root.iterdir():
        os.utime(f, ns=(past, past))
    assert nm(root, "rewrite", "--diff", ".").returncode == 1  # fills the cache
    assert nm(root, "rewrite", "--write", ".").returncode == 0
    for name in variants:
        assert (root / name).read_bytes() == expected[name], name
    assert expected["crlf.py"].count(b"\r\n") == expected["crlf.py"].count(b"\n")
    assert expected["bom.py"].startswith(b"\xef\xbb\xbf")


def _finding(code: str, line: int, message: str, note: str = "", fix=None):
    from neuron_migrate.rules.model import Finding, Span
    from neuron_migrate.rules.registry import get_rule

    return Finding(get_rule(code), "x.py", Span(line, 0, line, 4), message, fix=fix, note=note)


def test_results_share_one_string_table_that_drops_what_no_entry_uses(tmp_path):
    """A message or note repeated across files is stored once; after a file's result is replaced and the cache is
    saved, the old result's strings are gone from the file, and every result reads back as it was stored."""
    from neuron_migrate.pipeline.cache import ResultCache
    from neuron_migrate.pipeline.process import FileResult
    from neuron_migrate.rules.model import Edit, Fix, FixSafety, ImportReq, Span, finding_to_dict

    fix = Fix(FixSafety.SAFE, [Edit("replace_expr", Span(3, 1, 3, 9), "torch.device('neuron')")],
              [ImportReq("torch"), ImportReq("a.b", "c", True)], [("_h", "def _h(): pass\n")], "use the neuron device")
    shared = "the same advice at every site"
    cache = ResultCache(tmp_path, "k")
    for i in range(3):
        res = FileResult(f"f{i}.py", findings=[_finding("NM101", 1 + i, f"message {i}", note=shared, fix=fix),
                                               _finding("NM103", 7, f"only in file {i}")],
                         frames={1 + i: "xm.mark_step()"}, notes=["checked in pieces"] if i == 2 else [])
        cache.store(f"/p/f{i}.py", f"d{i}", res, [10, 20, 30 + i])
    cache.store("/p/f1.py", "d1b", FileResult("f1.py", findings=[_finding("NM101", 2, "replaced")]))
    assert cache.save() is None
    raw = (tmp_path / "results-k.json").read_text()
    assert raw.count(shared) == 1
    assert "message 1" not in raw and "only in file 1" not in raw and "replaced" in raw and "only in file 2" in raw
    back = ResultCache(tmp_path, "k")
    assert back.warning is None
    got = back.lookup_stat("/p/f2.py", "shown/f2.py", [10, 20, 32])
    assert [finding_to_dict(f) for f in got.findings] == [
        {**finding_to_dict(f), "path": "shown/f2.py"} for f in
        [_finding("NM101", 3, "message 2", note=shared, fix=fix), _finding("NM103", 7, "only in file 2")]]
    assert got.frames == {3: "xm.mark_step()"} and got.notes == ["checked in pieces"]
    assert got.findings[0].fix == fix and got.findings[0].rule.code == "NM101"
    assert back.lookup("/p/f1.py", "f1.py", "d1b").findings[0].message == "replaced"
    assert back.lookup("/p/f1.py", "f1.py", "d1") is None and back.lookup_stat("/p/f0.py", "f0.py", [10, 20, 99]) is None


def test_a_cache_entry_that_does_not_decode_is_recomputed_not_fatal(tmp_path):
    """A string ref past the table (a hand-edited or truncated cache) is a miss for that file, and the next save
    drops the entry; an older layout of the whole file is ignored with a warning."""
    from neuron_migrate.pipeline.cache import ResultCache
    from neuron_migrate.pipeline.process import FileResult

    cache = ResultCache(tmp_path, "k")
    cache.store("/p/a.py", "da", FileResult("a.py", findings=[_finding("NM101", 1, "kept")]))
    cache.store("/p/b.py", "db", FileResult("b.py", findings=[_finding("NM101", 1, "broken")]))
    cache.entries["/p/b.py"]["result"]["f"][0][5] = 10_000
    assert cache.lookup("/p/b.py", "b.py", "db") is None
    cache.save()
    back = ResultCache(tmp_path, "k")
    assert back.lookup("/p/a.py", "a.py", "da").findings[0].message == "kept" and "/p/b.py" not in back.entries
    (tmp_path / "results-k.json").write_text(json.dumps({"files": {"/p/a.py": {"digest": "da", "result": {}}}}))
    old = ResultCache(tmp_path, "k")
    assert old.entries == {} and "unexpected layout" in old.warning
