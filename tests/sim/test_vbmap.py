"""vbucket_for_key agrees with the values Couchbase clients' own tests expect."""

from __future__ import annotations

import pytest

from replicator.sim.vbmap import vbucket_for_key

# From libvbucket's test suite (a 4-vbucket map), as copied into the Enyim client's tests.
LIBVBUCKET_4 = {
    "hello": 0,
    "doctor": 0,
    "name": 3,
    "continue": 3,
    "yesterday": 0,
    "tomorrow": 1,
    "another key": 2,
}

# From go-couchbase's vbmap_test.go (256 vbuckets).
GO_COUCHBASE_256 = {"k0": 9, "k1": 14, "k2": 7, "k3": 0, "k4": 100, "k5": 99}


@pytest.mark.parametrize(("key", "expected"), sorted(LIBVBUCKET_4.items()))
def test_libvbucket_keys(key: str, expected: int) -> None:
    assert vbucket_for_key(key.encode(), 4) == expected


@pytest.mark.parametrize(("key", "expected"), sorted(GO_COUCHBASE_256.items()))
def test_go_couchbase_keys(key: str, expected: int) -> None:
    assert vbucket_for_key(key.encode(), 256) == expected


def test_cbgb_hello_in_1024() -> None:
    # couchbaselabs/cbgb vbucket_test.go
    assert vbucket_for_key(b"hello", 1024) == 528


def test_keys_spread_over_every_vbucket() -> None:
    owners = [vbucket_for_key(f"doc-{i}".encode(), 64) for i in range(5000)]
    counts = [owners.count(vb) for vb in range(64)]
    assert min(counts) > 0
    assert max(counts) < 3 * (5000 / 64)


@pytest.mark.parametrize("bad", [0, -1, 0x10001])
def test_rejects_impossible_vbucket_counts(bad: int) -> None:
    with pytest.raises(ValueError, match="num_vbuckets"):
        vbucket_for_key(b"k", bad)
