"""SHA-256 and BLAKE2b from the interpreter's builtin modules: `import hashlib` loads OpenSSL, a few milliseconds of
a one-file run and about a tenth of a warm one; the builtin implementations compute the same digests."""
from __future__ import annotations

try:
    from _blake2 import blake2b
except ImportError:  # pragma: no cover - an interpreter built without it
    from hashlib import blake2b

try:
    from _sha2 import sha256  # Python 3.12+
except ImportError:
    try:
        from _sha256 import sha256  # Python 3.10, 3.11
    except ImportError:  # pragma: no cover
        from hashlib import sha256

__all__ = ["blake2b", "sha256", "sha256_hex"]


def sha256_hex(data: bytes) -> str:
    return sha256(data).hexdigest()
