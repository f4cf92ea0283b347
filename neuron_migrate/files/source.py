"""Reading and writing user files without losing anything: encoding, BOM, newlines, mode, atomicity."""
from __future__ import annotations

import codecs
import io
import os
import stat
import tempfile
import tokenize
from dataclasses import dataclass
from pathlib import Path


class SourceError(Exception):
    """A file that cannot be read as Python source; the message is one line naming the cause."""


@dataclass
class SourceFile:
    path: Path
    raw: bytes
    text: str
    encoding: str  # as declared/detected ("utf-8", "latin-1", ...)
    bom: bool
    mode: int
    mtime_ns: int

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
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
    except SyntaxError as exc:
        raise SourceError(f"bad encoding declaration: {exc}") from None
    if encoding == "utf-8-sig":
        encoding = "utf-8"
    body = raw[3:] if bom else raw
    try:
        text = body.decode(encoding)
    except (UnicodeDecodeError, LookupError) as exc:
        raise SourceError(f"cannot decode as {encoding}: {exc}") from None
    # a round trip must give the same bytes, or writing back could change what we did not touch
    if text.encode(encoding) != body:
        raise SourceError(f"{encoding} does not round-trip this file's bytes")
    return text, encoding, bom


def write_atomic(src: SourceFile, data: bytes) -> None:
    """Replace the file with `data` atomically, keeping its mode; refuse if it changed since it was read."""
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
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".nm-tmp", dir=str(target.parent))
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, stat.S_IMODE(st.st_mode))
        try:
            os.chown(tmp, st.st_uid, st.st_gid)
        except OSError:
            pass
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
