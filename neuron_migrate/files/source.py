"""Reading and writing user files without losing anything: encoding, BOM, newlines, mode, atomicity."""
from __future__ import annotations

import codecs
import functools
import io
import os
import stat
import time
from pathlib import Path


class SourceError(Exception):
    """A file that cannot be read as Python source; the message is one line naming the cause."""


# Plain classes, not dataclasses: importing dataclasses (and the inspect module it imports) costs every start-up
# about 20 ms. Nothing compares these records, so they keep identity equality.
class SourceFile:
    """A file as read: its bytes, decoded text, and what writing it back must keep."""

    def __init__(self, path: Path, raw: bytes, text: str, encoding: str, bom: bool, mode: int, mtime_ns: int):
        self.path = path
        self.raw = raw
        self.text = text
        self.encoding = encoding  # as declared/detected ("utf-8", "latin-1", ...)
        self.bom = bom
        self.mode = mode
        self.mtime_ns = mtime_ns

    def encode(self, text: str) -> bytes:
        data = text.encode(self.encoding)
        return codecs.BOM_UTF8 + data if self.bom else data


MAX_BYTES = 20_000_000


def read_source(path: Path) -> SourceFile:
    try:
        st = os.stat(path)
    except OSError as exc:
        raise SourceError(f"cannot read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise SourceError("not a regular file")
    if st.st_size > MAX_BYTES:
        raise SourceError(f"file too large ({st.st_size} bytes; the limit is {MAX_BYTES}: raise `max-file-size` in "
                          "[tool.neuron-migrate] or pass --max-file-size)")
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise SourceError(f"cannot read: {exc.strerror or exc}") from None
    text, encoding, bom = decode_source(raw)
    return SourceFile(Path(path), raw, text, encoding, bom, stat.S_IMODE(st.st_mode), st.st_mtime_ns)


def decode_source(raw: bytes) -> tuple[str, str, bool]:
    """Decode bytes the way Python does (BOM, PEP 263 cookie); refuse binary data."""
    if b"\x00" in raw[:8192]:
        raise SourceError("binary file (contains NUL bytes), not Python source")
    bom = raw.startswith(codecs.BOM_UTF8)
    body = raw[3:] if bom else raw
    # a PEP 263 cookie can only stand on the first two lines: without "coding" there, the encoding is UTF-8, as
    # tokenize.detect_encoding says (and tokenize, ~2 ms of a one-file run, is not imported)
    first = raw.find(b"\n")
    second = raw.find(b"\n", first + 1) if first >= 0 else -1
    head = raw if second < 0 else raw[:second]
    if b"coding" not in head:
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            text = None  # what detect_encoding says about it (an undeclared non-UTF-8 first line is its error)
        if text is not None:
            return text, "utf-8", bom
    import tokenize

    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
    except SyntaxError as exc:
        raise SourceError(f"bad encoding declaration: {exc}") from None
    if encoding == "utf-8-sig":
        encoding = "utf-8"
    try:
        text = body.decode(encoding)
    except (UnicodeDecodeError, LookupError) as exc:
        raise SourceError(f"cannot decode as {encoding}: {exc}") from None
    # a round trip must give the same bytes, or writing back could change what we did not touch (strict UTF-8 and
    # ASCII decoding is one-to-one: what decoded encodes back to the same bytes, so only other codecs are checked)
    if encoding not in ("utf-8", "ascii") and text.encode(encoding) != body:
        raise SourceError(f"{encoding} does not round-trip this file's bytes")
    return text, encoding, bom


TMP_SUFFIX = ".nm-tmp"
COPYBACK_SUFFIX = ".nm-copyback"  # the complete new bytes of a file being written in place
STALE_AFTER_S = 600  # a temp file of a live run older than this is stale too (pid reuse)


def _tmp_prefix(target: Path) -> str:
    return f".{target.name}."


PRIVATE_TMP = "neuron-migrate-tmp-{uid}"


def _private_dir_in(base: str) -> str | None:
    """`<base>/neuron-migrate-tmp-<uid>`, made if need be: a folder of this user's only (mode 0700, not a link), or
    None when it cannot be (then another place is tried)."""
    uid = os.geteuid() if hasattr(os, "geteuid") else 0
    path = os.path.join(base, PRIVATE_TMP.format(uid=uid))
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or stat.S_IMODE(st.st_mode) & 0o077:
        return None  # someone else's, or open to others: not ours to write in
    return path


@functools.lru_cache(maxsize=64)
def private_tmp_dir(device: int) -> str | None:
    """Where a write's temp file goes for a file on the filesystem `device`: a private folder of this user's outside
    the user's tree (`neuron-migrate-tmp-<uid>` in the temp folder, else in the user's cache folder), on that same
    filesystem so that the finished file is renamed into place (atomic). A run killed meanwhile leaves its temp file
    there, never in the tree, and the next run that writes on that filesystem removes it. None when neither is on
    that filesystem: the temp file then goes beside the file (and the next --write of that file removes it)."""
    import tempfile  # only a run that writes gets here

    bases = [tempfile.gettempdir(), os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")]
    for base in bases:
        try:
            if os.stat(base).st_dev != device:
                continue
        except OSError:
            continue
        path = _private_dir_in(base)
        if path is not None:
            _remove_dead_writers(path)
            return path
    return None


def _remove_dead_writers(folder: str) -> int:
    """Remove the temp files in our private folder whose writer is gone (`<pid>.<random>.nm-tmp`)."""
    removed = 0
    try:
        with os.scandir(folder) as it:
            entries = [(e.name, e.path) for e in it if e.name.endswith(TMP_SUFFIX)]
    except OSError:
        return 0
    now = time.time()
    for name, path in entries:
        head = name.split(".", 1)[0]
        if not head.isdigit():
            continue
        try:
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and (_writer_gone(int(head), st.st_mtime) or now - st.st_mtime > STALE_AFTER_S):
                os.unlink(path)
                removed += 1
        except OSError:
            pass
    return removed


def remove_stale_temps(target: Path) -> int:
    """Remove temp files an interrupted run left beside `target` (`.<name>.<pid>.<random>.nm-tmp`, ours only):
    those whose process is gone, or that are older than STALE_AFTER_S. Returns how many were removed."""
    prefix = _tmp_prefix(target)
    removed = 0
    names = [n for n in _temp_names(str(target.parent)) if n.startswith(prefix)]
    if not names:
        return 0
    entries = []
    for n in names:
        try:
            entries.append(_Entry(n, os.path.join(target.parent, n), os.stat(os.path.join(target.parent, n), follow_symlinks=False)))
        except OSError:
            pass
    now = time.time()
    for entry in entries:
        name = entry.name
        if not name.endswith(TMP_SUFFIX):
            continue
        middle = name[len(prefix) : -len(TMP_SUFFIX)].split(".")
        if len(middle) != 2 or not middle[0].isdigit():
            continue  # not our naming: leave it
        pid = int(middle[0])
        st = entry.st
        if not stat.S_ISREG(st.st_mode):
            continue
        if _writer_gone(pid, st.st_mtime) or now - st.st_mtime > STALE_AFTER_S:
            try:
                os.unlink(entry.path)
                removed += 1
            except OSError:
                pass
    for entry in entries:
        if entry.name.startswith(prefix) and entry.name.endswith(COPYBACK_SUFFIX):
            _finish_copy_back(target, Path(entry.path))
    return removed


class _Entry:
    """A folder entry with its stat result."""

    def __init__(self, name: str, path: str, st: os.stat_result):
        self.name = name
        self.path = path
        self.st = st


@functools.lru_cache(maxsize=4096)
def _temp_names(directory: str) -> tuple[str, ...]:
    """Names in `directory` that look like our temp files (one listing per directory and process)."""
    try:
        with os.scandir(directory) as it:
            return tuple(e.name for e in it if e.name.endswith((TMP_SUFFIX, COPYBACK_SUFFIX)) and e.name.startswith("."))
    except OSError:
        return ()


def _finish_copy_back(target: Path, pending: Path) -> None:
    """An in-place write was interrupted: its complete new bytes are in `pending`. The file is then either
    as it was, complete, or partly written; writing the new bytes again makes it complete. Done only when
    the file was not modified after the interruption; otherwise both are left and the write is refused."""
    middle = pending.name[len(_tmp_prefix(target)) : -len(COPYBACK_SUFFIX)].split(".")
    if len(middle) != 2 or not middle[0].isdigit() or int(middle[0]) == os.getpid() or _alive(int(middle[0])):
        return
    try:
        if os.stat(target).st_mtime - os.stat(pending).st_mtime > 60:
            raise SourceError(f"an interrupted in-place write left {pending.name} (its new content) and the file was "
                              f"modified afterwards; check the file, then delete {pending.name}")
        _copy_back(target, pending.read_bytes())
        os.unlink(pending)
    except OSError as exc:
        raise SourceError(f"cannot finish the interrupted in-place write from {pending.name}: {exc.strerror or exc}") from None


def _writer_gone(pid: int, mtime: float) -> bool:
    """Has the process that wrote a temp file (last modified at `mtime`) ended? A killed process can linger a moment
    as a zombie, and its pid may belong to a newer process by now (pids wrap at 32768 on many Linux machines, and a
    busy one gets there in minutes): the process with that pid is not the writer when it is a zombie, when it started
    after the file's last write, or when it is this process, which cleans a file's temps before it writes the file
    and so has none of its own in flight."""
    if pid == os.getpid() or not _alive(pid):
        return True
    got = _proc_state(pid)
    return got is not None and (got[0] in (b"Z", b"X") or got[1] > mtime)


@functools.lru_cache(maxsize=1)
def _boot_time() -> int:
    """When the machine booted, in whole seconds since the epoch, rounded down (so a start time is never overstated)."""
    with open("/proc/stat", "rb") as fh:
        return int(next(ln for ln in fh if ln.startswith(b"btime ")).split()[1])


def _proc_state(pid: int) -> tuple[bytes, float] | None:
    """(state letter, start time in seconds since the epoch, never later than the truth) of the process `pid`, from
    /proc on Linux; None where that cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()  # after the command name, which may hold anything
        ticks = int(fields[19])  # field 22, starttime: clock ticks after boot (fields[0] is field 3, the state)
        return fields[0], _boot_time() + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError, StopIteration):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def write_atomic(src: SourceFile, data: bytes, hardlinks: str = "copy-back") -> None:
    """Replace the file with `data`, keeping its mode and group; refuse if it changed since it was read.

    Normally a temp file beside the target is renamed over it (atomic). A file with several hard links
    would lose the link that way (the other names keep the old code), so it is written in place
    (`hardlinks="copy-back"`: the new bytes are first made durable in a `.nm-copyback` file, then copied
    into the file, which keeps its inode, owner and links; a run killed meanwhile is completed by the next
    one) or refused (`hardlinks="refuse"`). A file whose owner or group this process cannot give a new
    file (someone else's file in a shared directory) is written in place the same way.
    """
    path = src.path
    try:
        st = os.stat(path)
        with open(path, "rb") as fh:
            current = fh.read()
    except OSError as exc:
        raise SourceError(f"cannot re-read before writing: {exc.strerror or exc}") from None
    if current != src.raw:
        raise SourceError("file changed on disk during the run; not overwritten")
    target = Path(os.path.realpath(path))  # write through a symlink to its target, keeping the link
    remove_stale_temps(target)
    if st.st_nlink > 1 and hardlinks == "refuse":
        raise SourceError(f"has {st.st_nlink} hard links; not rewritten (writing would break the links)")
    suffix = COPYBACK_SUFFIX if st.st_nlink > 1 else TMP_SUFFIX
    import tempfile  # here: an audit never writes, and tempfile brings shutil and random (milliseconds of start-up)

    private = private_tmp_dir(os.stat(target.parent).st_dev) if suffix == TMP_SUFFIX else None
    if private is not None:  # outside the tree, on its filesystem: a kill never leaves a temp file in the tree
        fd, tmp = tempfile.mkstemp(prefix=f"{os.getpid()}.", suffix=suffix, dir=private)
    else:
        fd, tmp = tempfile.mkstemp(prefix=f"{_tmp_prefix(target)}{os.getpid()}.", suffix=suffix, dir=str(target.parent))
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if st.st_nlink == 1:
            os.chmod(tmp, stat.S_IMODE(st.st_mode))
            if _keep_owner(tmp, st):
                os.replace(tmp, target)
                return
            # we may not give the new file the owner/group the file has: write in place instead (the new bytes wait
            # beside the file, where the next run finds them if this one is killed)
            pending = os.path.join(str(target.parent), f"{_tmp_prefix(target)}{os.getpid()}.{os.path.basename(tmp).split('.')[-2]}{COPYBACK_SUFFIX}")
            os.rename(tmp, pending)
            tmp = pending
        _copy_back(target, data)
        os.unlink(tmp)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _keep_owner(tmp: str, st: os.stat_result) -> bool:
    """Give the temp file the target's owner and group; False when that is not allowed here."""
    for uid in (st.st_uid, -1):
        try:
            os.chown(tmp, uid, st.st_gid)
            break
        except OSError:
            continue
    now = os.stat(tmp)
    return now.st_uid == st.st_uid and now.st_gid == st.st_gid


def _copy_back(target: Path, data: bytes) -> None:
    """Write `data` into the existing file (same inode: hard links, owner, group and mode stay)."""
    with open(target, "r+b") as fh:
        fh.write(data)
        fh.truncate(len(data))
        fh.flush()
        os.fsync(fh.fileno())
