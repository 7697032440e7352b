"""Which vbucket a document key lives in, computed the way Couchbase clients compute it.

libcouchbase, gocbcore and the Java client all take the CRC-32 (IEEE, as zlib computes it) of
the key without its collection prefix, keep bits 16..30 and reduce them modulo the number of
vbuckets. The producer must agree with the clients, or reads would miss the documents written.
"""

from __future__ import annotations

import zlib

MAX_VBUCKETS = 0x10000
"""The vbucket id travels in a 16-bit header field."""


def vbucket_for_key(key: bytes, num_vbuckets: int) -> int:
    """The vbucket that owns `key` in a bucket of `num_vbuckets` vbuckets.

    >>> vbucket_for_key(b"hello", 1024)
    528
    """
    if not 0 < num_vbuckets <= MAX_VBUCKETS:
        raise ValueError(f"num_vbuckets must be in 1..{MAX_VBUCKETS}, got {num_vbuckets}")
    return ((zlib.crc32(key) >> 16) & 0x7FFF) % num_vbuckets
