"""Run `process_file` over many files on all cores, in chunks, shipping paths in and plain results out."""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator

_STATE: dict = {}

DEFAULT_MAX_BYTES = 20_000_000
PARALLEL_MIN_FILES = 24  # from this many files on, always on all cores
# fewer files (a pre-commit run): on all cores when the files besides the largest hold this many bytes, the work a
# second core takes off the first. A fresh worker pays 50-90 ms before its first file runs at full speed (the
# pages it shares with this process are copied as it writes to them: reference counts, allocations), against
# ~0.65 ms of check per kB: transformers' trainer.py with accelerate's accelerator.py (rest 190 kB) 0.31-0.53 ->
# 0.29-0.37 s, while trainer.py with three files of 93 kB went 0.26 -> 0.30 s at 32 kB
PARALLEL_MIN_REST_BYTES = 160_000
RACY_NS = 2_000_000_000  # stat signatures of files changed less than 2 s ago are not trusted


def _init(spec, settings_kw, fix, write, digests=True):
    from neuron_migrate.rules.api import Settings
    from neuron_migrate.rules.registry import RuleSet

    kw = dict(settings_kw)
    size = kw.pop("max_file_size", None)
    from neuron_migrate.files import source

    source.MAX_BYTES = size or DEFAULT_MAX_BYTES  # `max-file-size` (documented in the README)
    codes, ignored = _split_spec(spec)
    tune_gc()
    # piece_workers: the processes one large file's pieces may use (rules/pieces.py); 1 inside a pool's worker,
    # whose siblings already keep the other cores busy
    # digests: whether results carry their content digest (only a results cache reads it)
    _STATE.update(ruleset=RuleSet.from_codes(codes, ignored), settings=Settings(**kw), fix=fix, write=write,
                  piece_workers=1, digests=digests)


def tune_gc() -> None:
    """Per-file work allocates millions of short-lived AST and libcst nodes that reference counting frees (analyses
    are released when a file is done, so they leave no cycles): with the default thresholds the cyclic GC rescans the
    live trees thousands of times per run (8 % of an audit, 23 % of a rewrite, measured on the 198k-line bench tree).
    Objects alive after start-up (modules, rules, the table) are moved out of its reach, and it runs less often;
    it still runs, so a cycle some rule creates is freed."""
    import gc

    gc.freeze()
    gc.set_threshold(100_000, 50, 100)


def _split_spec(spec) -> tuple:
    """RuleSet.spec is (codes, ignored codes); a bare sequence of codes is accepted too."""
    if len(spec) == 2 and all(isinstance(x, (tuple, list)) for x in spec):
        return tuple(spec[0]), tuple(spec[1])
    return tuple(spec), ()


def _one(item):
    from neuron_migrate.pipeline.process import process_file

    path, display = item
    return process_file(path, _STATE["ruleset"], _STATE["settings"], _STATE["fix"], _STATE["write"], display,
                        map_pieces=fork_map if _STATE["piece_workers"] > 1 else None, digest_content=_STATE["digests"])


def fork_map(fn: Callable, items) -> list:
    """[fn(x) for x in items], on two processes: a forked child takes every second item and pickles its results
    back through a pipe while this process does the rest. The child shares this process's memory (the text of a
    large file, its plan) instead of being sent it. Exceptions and results are the serial loop's: when the child
    fails in any way (an exception, a result that cannot be pickled, killed), this process computes its items
    again itself, so the error, if any, is raised here as the loop would raise it."""
    items = list(items)
    if len(items) < 2 or not hasattr(os, "fork"):
        return [fn(x) for x in items]
    import pickle

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns, never runs the parent's exit handlers or flushes its buffers
        status = 1
        try:
            os.close(read_end)
            data = pickle.dumps([fn(x) for x in items[1::2]], protocol=pickle.HIGHEST_PROTOCOL)
            with os.fdopen(write_end, "wb") as out:
                out.write(data)
            status = 0
        except BaseException:  # noqa: BLE001 - the parent recomputes (and raises) what the child could not give
            pass
        finally:
            os._exit(status)
    os.close(write_end)
    try:
        mine = [fn(x) for x in items[0::2]]
        with os.fdopen(read_end, "rb") as got:
            data = got.read()
    except BaseException:  # Ctrl-C or a failure here: the child's work is not wanted any more
        _reap(pid, kill=True)
        raise
    theirs = None
    if _reap(pid) == 0:
        try:
            theirs = pickle.loads(data)
        except Exception:  # noqa: BLE001 - a truncated pipe: computed again below
            theirs = None
    if theirs is None or len(theirs) != len(items[1::2]):
        theirs = [fn(x) for x in items[1::2]]
    out = []
    for k in range(len(items)):
        out.append(mine[k // 2] if k % 2 == 0 else theirs[k // 2])
    return out


def _reap(pid: int, kill: bool = False) -> int:
    """Wait for a forked child (killing it first if asked); its exit status, or -1 when it did not exit normally."""
    import signal

    if kill:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:
        return -1
    return os.waitstatus_to_exitcode(status) if hasattr(os, "waitstatus_to_exitcode") else status


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover
        return os.cpu_count() or 1


def run_files(items: list[tuple[str, str]], codes, settings_kw: dict, fix: bool, write: bool,
              jobs: int | None = None, cache=None, on_done: Callable[[], None] | None = None) -> Iterator:
    """Yield FileResults in input order. `codes` is RuleSet.spec (or the active rule codes, RuleSet.codes).

    With a ResultCache, files whose content and key are unchanged are answered from it and never parsed.
    A cached rewrite that changes the file is recomputed when writing (the write needs a fresh read).
    `on_done` is called as each file is done, which with workers is earlier than its result is yielded (a
    progress bar follows the work, not the order).
    """
    if cache is None:
        yield from _run(items, codes, settings_kw, fix, write, jobs, on_done, digests=False)
        return
    import time

    from neuron_migrate.pipeline.cache import digest
    from neuron_migrate.pipeline.repository_facts import tag

    outside = settings_kw.get("outside")
    now = time.time_ns()
    hits: dict[int, object] = {}
    sigs: dict[int, list] = {}
    misses = []
    for i, (path, display) in enumerate(items):
        try:
            st = os.stat(path)
        except OSError:
            misses.append((i, (path, display)))
            continue
        # a file modified in the last seconds may change again within the clock's granularity ("racy" as git
        # calls it): its stat is not trusted, its content digest is
        # what the repository model says about the file is part of its identity: a result made when no distributed
        # program imported it is not the answer once one does
        extra = tag(outside, path)
        sig = [st.st_size, st.st_mtime_ns, st.st_ino] if now - st.st_mtime_ns > RACY_NS else None
        if sig is not None:
            if extra:
                sig.append(extra)
            sigs[i] = sig
        res = cache.lookup_stat(path, display, sig) if sig is not None else None
        if res is None:
            try:
                with open(path, "rb") as fh:
                    dig = digest(fh.read()) + extra
            except OSError:
                misses.append((i, (path, display)))
                continue
            res = cache.lookup(path, display, dig)
            if res is not None and sig is not None:
                cache.touch(path, sig)
        if res is not None and not (write and (res.changed or res.error)):
            hits[i] = res
        else:
            misses.append((i, (path, display)))
    computed = _run([item for _, item in misses], codes, settings_kw, fix, write, jobs, on_done)
    miss_iter = iter(misses)
    for i in range(len(items)):
        if i in hits:
            if on_done is not None:
                on_done()
            yield hits[i]
            continue
        j, (path, _display) = next(miss_iter)
        res = next(computed)
        if res.digest and not res.written and not (write and res.error):
            cache.store(path, res.digest + tag(outside, path), res, sigs.get(j))
        else:
            cache.entries.pop(path, None)
        yield res


def _run(items, codes, settings_kw, fix, write, jobs, on_done=None, digests=True) -> Iterator:
    done_one = on_done or (lambda: None)
    jobs = jobs or default_jobs()
    # each file's size, read once: it decides whether a few files are worth the workers and orders their work
    sizes = [_size(path) for path, _display in items] if jobs > 1 and len(items) > 1 else []
    if jobs <= 1 or not _worth_a_pool(sizes):
        _init(codes, settings_kw, fix, write, digests)
        _STATE["piece_workers"] = min(jobs, 2)  # a large file among few: its pieces may use a second core
        for item in items:
            res = _one(item)
            done_one()
            yield res
        return
    # the largest files first (in small chunks), so that no worker is left alone with a big file at the end while
    # the others idle; results are handed back in the order of `items`
    order = sorted(range(len(items)), key=lambda i: -sizes[i])
    chunk = max(1, min(8, len(items) // (jobs * 32)))
    initargs = (codes, settings_kw, fix, write, digests)
    done: dict[int, object] = {}
    nxt = 0
    if hasattr(os, "fork"):
        chunks = [[(i, items[i]) for i in order[k:k + chunk]] for k in range(0, len(order), chunk)]
        finished = fork_pool(chunks, jobs, initargs)
    else:  # no fork (Windows): the standard pool, whose workers start a fresh interpreter each
        finished = _spawn_pool(order, items, jobs, chunk, initargs)
    for i, res in finished:
        done_one()
        done[i] = res
        while nxt in done:
            yield done.pop(nxt)
            nxt += 1


def _worth_a_pool(sizes: list[int]) -> bool:
    """Many files, or a few (`sizes`, in bytes) whose work a second core can share (no file so large that its own
    pieces want the cores: rules/pieces.py, run serially with two piece workers)."""
    if len(sizes) >= PARALLEL_MIN_FILES:
        return True
    if len(sizes) < 2:
        return False
    from neuron_migrate.rules.pieces import PIECES_MIN_CHARS

    largest = max(sizes)
    return largest <= PIECES_MIN_CHARS and sum(sizes) - largest >= PARALLEL_MIN_REST_BYTES


def _spawn_pool(order, items, jobs, chunk, initargs) -> Iterator:
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn"), initializer=_init, initargs=initargs) as pool:
        yield from zip(order, pool.map(_one, [items[i] for i in order], chunksize=chunk))


class WorkerError(RuntimeError):
    """A worker process of fork_pool died before it returned the results of the files it was given."""


_HEADER = 8  # a message between fork_pool's processes: its length (8 bytes, little-endian), then a pickle


def fork_pool(chunks: list, jobs: int, initargs: tuple) -> Iterator[tuple[int, object]]:
    """(position, result) for every (position, item) of `chunks`, as `jobs` forked workers finish them (each runs
    _init(*initargs), then _one per item). Chunks go out in the given order, one to each worker in turn (two each
    when there are many), the next as one comes back. Lighter than a ProcessPoolExecutor (whose imports, threads
    and queues cost a short run more than its files): a worker inherits this process's modules and rules, and
    talks to it through two pipes.
    An exception in a worker is raised here; a worker that dies (killed, out of memory) raises WorkerError; when
    this generator is left early (an error, Ctrl-C, close()) the workers are killed."""
    import pickle
    import select

    todo = list(reversed(chunks))  # popped from the end: the given order
    workers: dict[int, list] = {}  # result fd -> [pid, task fd, chunks out]
    try:
        for _ in range(min(jobs, len(chunks))):  # one chunk each as they start, the second each below
            task_r, task_w = os.pipe()
            result_r, result_w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: never returns, never runs the parent's exit handlers or flushes its buffers
                try:
                    for fd in [task_w, result_r, *(x for fd, w in workers.items() for x in (fd, w[1]))]:
                        os.close(fd)  # the other workers' pipes: their ends must close when the parent's do
                    _worker_loop(task_r, result_w, initargs)
                finally:
                    os._exit(0)
            os.close(task_r)
            os.close(result_w)
            workers[result_r] = [pid, task_w, []]
            _send(workers[result_r], todo.pop(), pickle)
        # a second chunk each hides the round trip between chunks; dealt one round at a time (two files for two
        # workers go one to each, not both to the first), and only when there are many: with a few, the next goes
        # to whichever worker is free first (a large file ahead of it would hold it back)
        if len(chunks) >= 8 * len(workers):
            for w in list(workers.values()):
                if todo:
                    _send(w, todo.pop(), pickle)
        while any(w[2] for w in workers.values()):
            ready, _, _ = select.select([fd for fd, w in workers.items() if w[2]], [], [])
            for fd in ready:
                w = workers[fd]
                message = _read_message(fd, pickle)  # the worker is writing it whole: read to its end
                if message is None:
                    status = _reap(w[0])
                    paths = ", ".join(str(item[0]) for c in w[2] for _, item in c)
                    raise WorkerError(f"a worker process died (exit status {status}) while checking {paths}")
                kind, value = message
                if kind == "error":
                    raise value
                w[2].pop(0)
                if todo:
                    _send(w, todo.pop(), pickle)
                yield from value
    finally:
        _stop(workers)


def _send(worker: list, chunk: list, pickle) -> None:
    data = pickle.dumps(chunk, protocol=pickle.HIGHEST_PROTOCOL)
    worker[2].append(chunk)
    try:
        _write_all(worker[1], len(data).to_bytes(_HEADER, "little") + data)
    except BrokenPipeError:  # the worker died: its result pipe's end of file says so, naming this chunk's files
        pass


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read_message(fd: int, pickle):
    """The next message on fd (both directions of fork_pool), or None at end of file, also in mid-message."""
    def read(n: int) -> bytes | None:
        parts, left = [], n
        while left:
            part = os.read(fd, left)
            if not part:
                return None
            parts.append(part)
            left -= len(part)
        return b"".join(parts)

    head = read(_HEADER)
    if head is None:
        return None
    body = read(int.from_bytes(head, "little"))
    return None if body is None else pickle.loads(body)


def _worker_loop(task_fd: int, result_fd: int, initargs: tuple) -> None:
    """A fork_pool worker: chunks in, ("ok", [(position, result), ...]) or ("error", exception) out, until the
    task pipe closes. Ctrl-C is the parent's to handle (it kills the workers), so it is ignored here."""
    import pickle
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _init(*initargs)
        while True:
            chunk = _read_message(task_fd, pickle)
            if chunk is None:
                return
            message = ("ok", [(i, _one(item)) for i, item in chunk])
            try:
                data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:  # noqa: BLE001 - a result that cannot be pickled: the parent raises it
                data = pickle.dumps(("error", WorkerError(f"a result could not be sent back: {exc!r}")))
            _write_all(result_fd, len(data).to_bytes(_HEADER, "little") + data)
    except Exception as exc:  # noqa: BLE001 - raised in the parent, as the serial loop would raise it
        try:
            data = pickle.dumps(("error", exc), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # noqa: BLE001 - an exception that cannot be pickled: its text
            data = pickle.dumps(("error", WorkerError(f"{type(exc).__name__}: {exc}")))
        _write_all(result_fd, len(data).to_bytes(_HEADER, "little") + data)


def _stop(workers: dict) -> None:
    """Close the task pipes (a worker between chunks exits), kill what is still working, wait for all."""
    for fd, (_pid, task_fd, _out) in workers.items():
        os.close(task_fd)
        os.close(fd)
    for pid, _task_fd, out in workers.values():
        _reap(pid, kill=bool(out))
