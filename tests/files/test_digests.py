"""The builtin digests the start-up path uses are the digests hashlib computes."""
from __future__ import annotations

import hashlib

from neuron_migrate.files.digests import blake2b, sha256_hex


def test_builtin_digests_equal_hashlibs():
    for data in (b"", b"abc", bytes(range(256)) * 999):
        assert sha256_hex(data) == hashlib.sha256(data).hexdigest()
        assert blake2b(data, digest_size=16).hexdigest() == hashlib.blake2b(data, digest_size=16).hexdigest()
