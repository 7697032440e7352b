"""`replicator verify`'s parts: fingerprints on both sides, the source scan, the comparison."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from replicator.dcp.protocol.events import (
    Deletion,
    Expiration,
    Mutation,
    OsoFlags,
    OsoSnapshot,
    RollbackRequired,
    SnapshotFlags,
    SnapshotMarker,
    StreamEnd,
    StreamEndReason,
    StreamEvent,
    SystemEvent,
    SystemEventType,
)
from replicator.errors import ProtocolError
from replicator.inspect.fingerprints import ContentDigest, row_fingerprint
from replicator.inspect.mirror_scan import MirrorDocument
from replicator.inspect.source_scan import SourceVbucketScan, VerifyInterrupted
from replicator.inspect.verdicts import (
    Difference,
    VbucketVerdict,
    Verdict,
    VerifyReport,
    boundary_verdict,
    compare_documents,
)
from replicator.staging.collections import CollectionRegistry
from replicator.staging.rows import ChangeRowConverter

NOW = 1_800_000_000
HOTELS = 0x9

MANIFEST = {
    "uid": "2",
    "scopes": [
        {"name": "_default", "uid": "0", "collections": [{"name": "_default", "uid": "0"}]},
        {"name": "inventory", "uid": "8", "collections": [{"name": "hotels", "uid": "9"}]},
    ],
}


def converter() -> ChangeRowConverter:
    return ChangeRowConverter(CollectionRegistry.from_manifest(MANIFEST), now=lambda: NOW)


def mutation(seqno: int, key: str, body: str = '{"a":1}', *, vb: int = 3, collection: int = 0,
             expiry: int = 0, cas: int | None = None) -> Mutation:
    return Mutation(
        vbucket=vb, by_seqno=seqno, rev_seqno=1, cas=cas if cas is not None else 1000 + seqno,
        flags=0x2000006, expiration=expiry, lock_time=0, collection_id=collection,
        key=key.encode(), value=body.encode(), is_json=True,
    )


def deletion(seqno: int, key: str, *, vb: int = 3, collection: int = 0) -> Deletion:
    return Deletion(vb, seqno, 2, 5000 + seqno, collection, key.encode())


def fingerprint_of(item: Mutation) -> int:
    return row_fingerprint(
        item.collection_id, item.key.decode(), item.by_seqno, item.cas, item.value, item.flags,
        item.expiration, item.is_json, None,
    )


def scan_of(events: list[StreamEvent], vb: int = 3) -> SourceVbucketScan:
    scan = SourceVbucketScan(vb, converter(), chunk_rows=2)
    done = [scan.feed(event) for event in events]
    assert done[-1] is True and not any(done[:-1])
    return scan


def marker(start: int, end: int, vb: int = 3) -> SnapshotMarker:
    return SnapshotMarker(vb, start, end, SnapshotFlags.DISK)


# --- fingerprints ---------------------------------------------------------------------------


def test_fingerprint_changes_with_every_field_and_fits_a_signed_long() -> None:
    base: dict[str, Any] = dict(
        collection_id=8, key="k", seqno=5, cas=77, body=b'{"a":1}', flags=2, expiry_s=0,
        is_json=True, xattrs=None,
    )
    reference = row_fingerprint(**base)
    assert 0 <= reference < 2**60
    assert row_fingerprint(**base) == reference
    for field, other in [
        ("collection_id", 9), ("key", "k2"), ("seqno", 6), ("cas", 78), ("body", b'{"a":2}'),
        ("flags", 3), ("expiry_s", 1), ("is_json", False), ("xattrs", '{"x":1}'),
    ]:
        assert row_fingerprint(**{**base, field: other}) != reference, field


def test_fingerprint_does_not_confuse_key_and_following_fields() -> None:
    # Without the key's length in the canonical text "a\x1f1" + seqno 2 could equal "a" + ...
    assert row_fingerprint(0, "a\x1f1", 2, 3, b"", 0, 0, True, None) != row_fingerprint(
        0, "a", 1, 3, b"", 0, 0, True, None
    )


def test_digest_ignores_order_but_not_content() -> None:
    assert ContentDigest.of([5, 9, 2**59]) == ContentDigest.of([2**59, 5, 9])
    assert ContentDigest.of([5, 9]) != ContentDigest.of([5, 10])
    assert ContentDigest.of([5, 5, 9]) != ContentDigest.of([9])  # xor alone would agree
    assert ContentDigest.of([]) == ContentDigest()


# --- the source scan ------------------------------------------------------------------------


def test_scan_keeps_each_documents_last_state_through_the_replication_rules() -> None:
    first = mutation(1, "kept")
    updated = mutation(4, "updated", '{"v":2}')
    events: list[StreamEvent] = [
        marker(1, 3),
        first,
        mutation(2, "updated", '{"v":1}'),
        mutation(3, "deleted"),
        marker(4, 7),
        updated,
        deletion(5, "deleted"),
        mutation(6, "expired", expiry=NOW - 1),
        Expiration(3, 7, 1, 9, 0, b"gone", NOW),
        StreamEnd(3, StreamEndReason.OK),
    ]
    scan = scan_of(events)
    assert scan.live_fingerprints() == {
        (0, "kept"): fingerprint_of(first),
        (0, "updated"): fingerprint_of(updated),
    }
    assert scan.expired_keys() == {(0, "expired")}
    assert not scan.documents[(0, "deleted")].live
    assert not scan.documents[(0, "gone")].expired  # an expiration is a plain removal


def test_scan_of_an_oso_backfill_keeps_the_highest_seqno_whatever_the_order() -> None:
    newer = mutation(9, "a", '{"v":9}')
    events: list[StreamEvent] = [
        OsoSnapshot(3, OsoFlags.START),
        newer,
        mutation(2, "b"),
        OsoSnapshot(3, OsoFlags.END),
        StreamEnd(3, StreamEndReason.OK),
    ]
    scan = scan_of(events)
    assert scan.live_fingerprints()[(0, "a")] == fingerprint_of(newer)
    assert scan.documents[(0, "b")].seqno == 2


def test_scan_drops_the_documents_of_a_dropped_collection() -> None:
    drop = SystemEvent(3, 3, SystemEventType.COLLECTION_DROPPED, 0, "", 3, 8, HOTELS)
    events: list[StreamEvent] = [
        marker(1, 3),
        mutation(1, "h1", collection=HOTELS),
        mutation(2, "d1"),
        drop,
        StreamEnd(3, StreamEndReason.OK),
    ]
    scan = scan_of(events)
    assert set(scan.live_fingerprints()) == {(0, "d1")}
    assert scan.names[HOTELS] == ("inventory", "hotels")


def test_scan_starts_over_when_the_stream_ends_early_and_gives_up_eventually() -> None:
    scan = SourceVbucketScan(3, converter())
    for event in (marker(1, 2), mutation(1, "old")):
        assert scan.feed(event) is False
    assert scan.feed(StreamEnd(3, StreamEndReason.STATE_CHANGED)) is False
    assert scan.documents == {}
    # The client reopens from 0: the same seqnos arrive again and are accepted.
    for event in (marker(1, 2), mutation(1, "new"), mutation(2, "other")):
        assert scan.feed(event) is False
    assert scan.feed(StreamEnd(3, StreamEndReason.OK)) is True
    assert set(scan.live_fingerprints()) == {(0, "new"), (0, "other")}

    for _ in range(4):
        scan.feed(StreamEnd(3, StreamEndReason.TOO_SLOW))
    with pytest.raises(VerifyInterrupted, match="vbucket 3"):
        scan.feed(StreamEnd(3, StreamEndReason.TOO_SLOW))


def test_scan_refuses_a_rollback_from_zero() -> None:
    with pytest.raises(ProtocolError, match="roll back"):
        SourceVbucketScan(3, converter()).feed(RollbackRequired(3, 10))


# --- the comparison -------------------------------------------------------------------------


def mirrored(scan: SourceVbucketScan) -> dict[tuple[int, str], MirrorDocument]:
    return {
        key: MirrorDocument(scan.documents[key].seqno, fingerprint, "_default", "_default")
        for key, fingerprint in scan.live_fingerprints().items()
    }


def source_scan() -> SourceVbucketScan:
    return scan_of([
        marker(1, 4),
        mutation(1, "a"),
        mutation(2, "b"),
        mutation(3, "c"),
        mutation(4, "soon", expiry=NOW - 5),
        StreamEnd(3, StreamEndReason.OK),
    ])


def test_identical_sides_are_equal_and_expired_documents_are_counted() -> None:
    scan = source_scan()
    verdict = compare_documents(3, 4, scan, mirrored(scan))
    assert verdict.verdict is Verdict.EQUAL and verdict.equal
    assert (verdict.source_documents, verdict.mirror_documents) == (3, 3)
    assert verdict.expired_ignored == 1


def test_missing_extra_and_changed_keys_are_named() -> None:
    scan = source_scan()
    mirror = mirrored(scan)
    del mirror[(0, "a")]
    mirror[(0, "b")] = mirror[(0, "b")]._replace(fingerprint=1, seqno=1)
    mirror[(0, "zombie")] = MirrorDocument(2, 7, "_default", "_default")
    verdict = compare_documents(3, 4, scan, mirror)
    assert verdict.verdict is Verdict.DIFFERENT
    assert (verdict.missing, verdict.extra, verdict.changed) == (1, 1, 1)
    by_key = {d.key: d for d in verdict.examples}
    assert by_key["a"].kind is Difference.MISSING and by_key["a"].source_seqno == 1
    assert by_key["b"].kind is Difference.CHANGED
    assert (by_key["b"].mirror_seqno, by_key["b"].source_seqno) == (1, 2)
    assert by_key["zombie"].kind is Difference.EXTRA and by_key["zombie"].source_seqno is None


def test_a_document_expired_on_either_side_is_not_a_difference() -> None:
    scan = source_scan()
    mirror = mirrored(scan)
    # Expired at the source but still a live row in the mirror (the pager had not run):
    mirror[(0, "soon")] = MirrorDocument(4, 123, "_default", "_default")
    # Live at the source, but the mirror's row says it expired (a different, older version):
    del mirror[(0, "c")]
    verdict = compare_documents(3, 4, scan, mirror, mirror_expired={(0, "c")})
    assert verdict.equal
    assert verdict.expired_ignored == 2
    assert verdict.source_documents == 2


def test_examples_are_capped_but_counts_are_complete() -> None:
    scan = source_scan()
    verdict = compare_documents(3, 4, scan, {}, max_examples=2)
    assert verdict.missing == 3 and len(verdict.examples) == 2
    lines = verdict.describe(max_keys=1)
    assert "3 missing in mirror" in lines[0]
    assert lines[-1] == "  ... and 2 more"


def test_boundary_mismatch_is_reported_with_both_seqnos_and_advice() -> None:
    assert boundary_verdict(5, 40, 40) is None
    behind = boundary_verdict(5, 40, 52)
    assert behind is not None and behind.verdict is Verdict.NOT_AT_BOUNDARY
    (line,) = behind.describe()
    assert "mirror at seqno 40, source at seqno 52" in line
    assert "replicator run --until-caught-up" in line
    ahead = boundary_verdict(6, 60, 52)
    assert ahead is not None and "ahead" in ahead.describe()[0]
    # The advice is what repairs it: run rolls back or resyncs such a vbucket (issue 27).
    assert "resyncs it from 0" in ahead.describe()[0]
    assert "resyncs" not in boundary_verdict(6, 52, 60).describe()[0]  # type: ignore[union-attr]


def test_report_is_equal_only_when_every_vbucket_is() -> None:
    equal = VbucketVerdict(0, Verdict.EQUAL, 10, 10, source_documents=4, mirror_documents=4)
    behind = VbucketVerdict(1, Verdict.NOT_AT_BOUNDARY, 8, 10, source_documents=0)
    good = VerifyReport("travel", "/m", (equal,))
    bad = VerifyReport("travel", "/m", (equal, behind))
    assert good.equal and not bad.equal
    assert good.describe().splitlines() == [
        "verify of bucket 'travel' against /m: EQUAL: 1 vbuckets, 1 equal, 0 not at the same "
        "boundary, 0 different; 4 documents compared, 0 past their expiry ignored"
    ]
    text = bad.describe()
    assert text.startswith("verify of bucket 'travel' against /m: DIFFERENT: 2 vbuckets, 1 equal")
    assert "vbucket 1: not at the same boundary" in text.splitlines()[1]


# --- Spark computes the same fingerprints ---------------------------------------------------


def mirror_rows() -> list[tuple[Any, ...]]:
    """Mirror rows (DATA_SCHEMA) of every kind: JSON, xattrs, binary, expired, odd keys."""
    from datetime import UTC, datetime

    later = datetime.fromtimestamp(NOW + 60, UTC)
    past = datetime.fromtimestamp(NOW - 60, UTC)
    return [
        (1, "_default", "_default", 0, "plain", 3, 1, 99, 0, None, True, '{"a":1}', None, None),
        (1, "inventory", "hotels", 9, "clé ü", 4, 1, 2**62, 7, later, True, '{"é":"ü"}', None,
         '{"_sync":{"rev":1}}'),
        (1, "_default", "_default", 0, "bin", 5, 2, 5, 1, None, False, None, b"\x00\xff", None),
        (2, "_default", "_default", 0, "old", 2, 1, 5, 0, past, True, "{}", None, None),
        (3, "_default", "_default", 0, "it's", 8, 1, 6, 0, None, True, "[]", None, None),
    ]


@pytest.mark.spark
def test_spark_fingerprints_and_digests_match_python(spark: Any) -> None:
    from replicator.delta.schema import DATA_SCHEMA
    from replicator.inspect.fingerprints import fingerprint_column
    from replicator.inspect.mirror_scan import mirror_digests, mirror_expired_keys

    frame = spark.createDataFrame(mirror_rows()[:4], DATA_SCHEMA)
    got = {r["key"]: r["f"] for r in frame.select("key", fingerprint_column().alias("f")).collect()}
    expected = {
        "plain": row_fingerprint(0, "plain", 3, 99, b'{"a":1}', 0, 0, True, None),
        "clé ü": row_fingerprint(9, "clé ü", 4, 2**62, '{"é":"ü"}'.encode(), 7, NOW + 60, True,
                                 '{"_sync":{"rev":1}}'),
        "bin": row_fingerprint(0, "bin", 5, 5, b"\x00\xff", 1, 0, False, None),
        "old": row_fingerprint(0, "old", 2, 5, b"{}", 0, NOW - 60, True, None),
    }
    assert got == expected
    digests = mirror_digests(frame, NOW)
    assert digests == {1: ContentDigest.of([expected["plain"], expected["clé ü"], expected["bin"]])}
    assert mirror_expired_keys(frame, NOW) == {2: {(0, "old")}}


@pytest.mark.spark
@pytest.mark.parametrize("engine", ["delta-rs", "spark"])
def test_the_mirror_scan_digests_a_delta_table_as_spark_does(
    spark: Any, tmp_path: Path, engine: str
) -> None:
    # verify's default mirror side: rows read through a TableReader, fingerprinted in Python.

    from replicator.delta.reader import table_reader
    from replicator.delta.schema import DATA_SCHEMA
    from replicator.inspect.mirror_scan import (
        MirrorScan,
        mirror_digests,
        mirror_documents,
        mirror_expired_keys,
    )

    path = str(tmp_path / "table")
    spark.createDataFrame(mirror_rows(), DATA_SCHEMA).write.format("delta").save(path)
    frame = spark.read.format("delta").load(path)

    scan = MirrorScan(table_reader(engine, spark), path, NOW).scan()

    assert scan.digests == mirror_digests(frame, NOW)
    assert set(scan.digests) == {1, 3}
    assert scan.expired == mirror_expired_keys(frame, NOW) == {2: {(0, "old")}}
    for vbucket in (1, 2, 3, 4):
        assert scan.documents(vbucket) == mirror_documents(frame, vbucket, NOW)
    assert set(scan.documents(1)) == {(0, "plain"), (9, "clé ü"), (0, "bin")}
