"""pipeline.parallel.fork_pool: the worker processes of `audit` and `rewrite` on many files (where fork exists).

The workers run parallel._init and parallel._one; the tests put their own in place before the pool forks (the
children inherit them), so that they control what a worker does. Nothing here waits on a clock.
"""
from __future__ import annotations

import os
import signal

import pytest

from neuron_migrate.pipeline import parallel

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="fork_pool needs fork")


def _chunks(n: int, size: int = 2) -> list:
    items = [(i, (f"file{i}.py", f"file{i}.py")) for i in range(n)]
    return [items[k:k + size] for k in range(0, n, size)]


def _use(monkeypatch, one, init=lambda *a: None) -> None:
    monkeypatch.setattr(parallel, "_one", one)
    monkeypatch.setattr(parallel, "_init", init)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_every_item_comes_back_once_from_the_workers(monkeypatch):
    _use(monkeypatch, lambda item: (item[0], os.getpid()))
    got = list(parallel.fork_pool(_chunks(40), 2, ()))
    assert sorted(i for i, _ in got) == list(range(40))
    assert all(res[0] == f"file{i}.py" for i, res in got)
    pids = {res[1] for _, res in got}
    assert len(pids) == 2 and os.getpid() not in pids  # two workers, neither of them this process
    assert all(_gone(p) for p in pids)  # both exited and were reaped


def test_a_worker_initialises_once_before_its_first_item(monkeypatch, tmp_path):
    def init(*args):
        (tmp_path / f"init-{os.getpid()}").write_text(repr(args))

    _use(monkeypatch, lambda item: (os.getpid(), sorted(p.name for p in tmp_path.iterdir())), init)
    got = list(parallel.fork_pool(_chunks(10), 2, ("codes", {"k": 1})))
    for _i, (pid, seen) in got:
        assert f"init-{pid}" in seen
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"init-{pid}" for pid in {r[0] for _, r in got})
    assert all(p.read_text() == repr(("codes", {"k": 1})) for p in tmp_path.iterdir())


def test_results_larger_than_a_pipe_buffer_arrive_whole(monkeypatch):
    _use(monkeypatch, lambda item: item[0] * 200_000)  # ~2 MB a result
    got = dict(parallel.fork_pool(_chunks(6, size=3), 2, ()))
    assert got == {i: f"file{i}.py" * 200_000 for i in range(6)}


def test_an_exception_in_a_worker_is_raised_here(monkeypatch):
    def one(item):
        if item[0] == "file7.py":
            raise ValueError("cannot check file7.py")
        return item[0]

    _use(monkeypatch, one)
    with pytest.raises(ValueError, match="cannot check file7.py"):
        list(parallel.fork_pool(_chunks(20), 2, ()))


def test_a_failing_initialisation_is_raised_here(monkeypatch):
    def init(*args):
        raise LookupError("unknown rule code NM000")

    _use(monkeypatch, lambda item: item, init)
    with pytest.raises(LookupError, match="NM000"):
        list(parallel.fork_pool(_chunks(4), 2, ()))


def test_a_worker_that_dies_is_reported_with_its_files(monkeypatch):
    def one(item):
        if item[0] == "file5.py":
            os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's OOM killer would
        return item[0]

    _use(monkeypatch, one)
    with pytest.raises(parallel.WorkerError, match=r"died \(exit status -9\) while checking .*file5\.py"):
        list(parallel.fork_pool(_chunks(20), 2, ()))


def test_leaving_early_stops_and_reaps_every_worker(monkeypatch, tmp_path):
    ready = tmp_path / "ready"
    ready.mkdir()

    def one(item):
        (ready / str(os.getpid())).touch()
        if item[0] != "file0.py":
            signal.pause()  # busy until killed (no SIGINT: workers ignore it)
        return item[0]

    _use(monkeypatch, one)
    pool = parallel.fork_pool(_chunks(8, size=1), 2, ())
    assert next(pool) == (0, "file0.py")
    pool.close()  # what Ctrl-C or an error in the caller does to the generator
    pids = [int(p.name) for p in ready.iterdir()]
    assert pids and all(_gone(p) for p in pids)


def test_workers_ignore_ctrl_c_which_the_parent_handles(monkeypatch, tmp_path):
    def one(item):
        os.kill(os.getpid(), signal.SIGINT)  # as a terminal's Ctrl-C reaches the whole process group
        return item[0]

    _use(monkeypatch, one)
    assert sorted(parallel.fork_pool(_chunks(6), 2, ())) == [(i, f"file{i}.py") for i in range(6)]


def test_a_run_over_many_files_uses_the_fork_pool_and_keeps_serial_results(tmp_path, monkeypatch):
    paths = []
    for i in range(parallel.PARALLEL_MIN_FILES + 6):
        p = tmp_path / f"m{i:02d}.py"
        p.write_text("import torch_xla.core.xla_model as xm\n" + "y = 2\n" * i + "d = xm.xla_device()\nxm.mark_step()\n")
        paths.append(str(p))
    for a, b in _pooled_and_serial(monkeypatch, paths, fix=True):
        assert a.new_text == b.new_text and a.changed and "mark_step" not in a.new_text


def _pooled_and_serial(monkeypatch, paths: list, fix: bool) -> list:
    """(result on two cores, result on one) per file, once the run on two cores is seen to use the pool and the
    two runs to report the same findings in the same order."""
    from neuron_migrate.rules.model import finding_to_dict
    from neuron_migrate.rules.registry import RuleSet

    used = []
    original = parallel.fork_pool
    monkeypatch.setattr(parallel, "fork_pool", lambda *a: used.append(1) or original(*a))
    spec = RuleSet.select().spec
    two = list(parallel.run_files([(p, p) for p in paths], spec, {}, fix=fix, write=False, jobs=2))
    one = list(parallel.run_files([(p, p) for p in paths], spec, {}, fix=fix, write=False, jobs=1))
    assert used == [1]
    assert [r.path for r in two] == paths
    for a, b in zip(two, one):
        assert [finding_to_dict(f) for f in a.findings] == [finding_to_dict(f) for f in b.findings]
    return list(zip(two, one))


def test_the_cli_reports_a_killed_worker_in_one_line(tmp_path, monkeypatch, capsys):
    from neuron_migrate.cli import app

    for i in range(parallel.PARALLEL_MIN_FILES + 2):
        (tmp_path / f"k{i:02d}.py").write_text("import torch_xla.core.xla_model as xm\nxm.mark_step()\n")
    real = parallel._one

    def one(item):
        if item[0].endswith("k03.py"):
            os.kill(os.getpid(), signal.SIGKILL)
        return real(item)

    monkeypatch.setattr(parallel, "_one", one)
    monkeypatch.setattr("sys.argv", ["neuron-migrate", "audit", "--no-cache", "-j", "2", str(tmp_path)])
    with pytest.raises(SystemExit) as stop:
        app.main()
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert err.startswith("neuron-migrate: error: a worker process died") and "k03.py" in err
    assert "Traceback" not in err and err.count("\n") == 1


def test_two_files_go_to_two_workers(monkeypatch):
    """Chunks are dealt one round at a time: the first worker does not take both of two files while the second
    idles (a pre-commit run of two large files took as long as running them one after the other)."""
    _use(monkeypatch, lambda item: os.getpid())
    got = dict(parallel.fork_pool(_chunks(2, size=1), 2, ()))
    assert len(set(got.values())) == 2


def test_with_few_chunks_the_next_goes_to_the_worker_that_is_free(monkeypatch, tmp_path):
    """Three files, two workers: file0 (large) holds its worker until file2 is done; file2 must go to the worker
    that finished file1, not wait behind file0 in the busy worker's queue. (Waits on a file, never on a clock;
    the bound only ends a broken run.)"""
    done = tmp_path / "file2-done"

    def one(item):
        if item[0] == "file0.py":
            for _ in range(2_000_000):
                if done.exists():
                    return (os.getpid(), "file2 was done first")
                os.sched_yield()
            return (os.getpid(), "file2 never came")
        if item[0] == "file2.py":
            done.touch()
        return (os.getpid(), "")

    _use(monkeypatch, one)
    got = dict(parallel.fork_pool(_chunks(3, size=1), 2, ()))
    assert got[0][1] == "file2 was done first"
    assert got[2][0] == got[1][0] != got[0][0]


@pytest.mark.parametrize("sizes, pooled", [
    ([200_000, 200_000], True),  # two large files: one each
    ([250_000, 100_000, 80_000], True),  # the rest holds enough work for the second core
    ([236_000, 79_000, 8_000, 6_000], False),  # a large file and a few smaller: a worker's start costs more
    ([6_000, 5_000], False),  # two small ones: forking costs more than it saves
    ([300_000], False),  # one file: nothing to share
    ([parallel.PARALLEL_MIN_REST_BYTES, 0], False),
    ([5_000_000, 200_000], False),  # a file checked in pieces keeps both cores for its pieces
])
def test_a_few_files_use_the_pool_when_the_second_core_has_work(tmp_path, monkeypatch, sizes, pooled):
    items = []
    for k, size in enumerate(sizes):
        p = tmp_path / f"f{k}.py"
        p.write_text("x = 1\n" * (size // 6))
        items.append((str(p), str(p)))
    assert parallel._worth_a_pool([parallel._size(path) for path, _display in items]) is pooled


def test_two_large_files_are_checked_on_two_cores_with_the_serial_results(tmp_path, monkeypatch):
    body = "".join(f"def step{i}(model, x):\n    y = model(x)\n    xm.mark_step()\n    return y\n\n\n" for i in range(2500))
    paths = []
    for name in ("a.py", "b.py"):
        p = tmp_path / name
        p.write_text("import torch_xla.core.xla_model as xm\n\n\n" + body)
        paths.append(str(p))
    for a, _b in _pooled_and_serial(monkeypatch, paths, fix=False):
        assert len(a.findings) >= 2500
