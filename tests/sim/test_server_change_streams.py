"""Change streams (Couchbase 7.2+): history retention on a magma bucket and DCP_CONTROL
change_streams, over real sockets with the project's codec (tests/sim/raw_client.py)."""

from __future__ import annotations

import struct
from dataclasses import dataclass

import pytest

from replicator.dcp.protocol.codec import ServerMessage
from replicator.dcp.protocol.events import (
    Deletion,
    Expiration,
    Mutation,
    SeqnoAdvanced,
    SnapshotFlags,
    SnapshotMarker,
    StreamEnd,
    StreamEndReason,
)
from replicator.dcp.protocol.opcodes import HelloFeature, Status
from replicator.sim.bucket import SimBucket, Upsert
from replicator.sim.history_items import history_item_size
from tests.sim.raw_client import DEFAULT_FEATURES, RawClient, fast_options, producer, serve

CHANGE_STREAMS = (("change_streams", "true"),)
DISK = SnapshotFlags.DISK | SnapshotFlags.CHECKPOINT
MEMORY = SnapshotFlags.MEMORY | SnapshotFlags.CHECKPOINT
HISTORY = SnapshotFlags.HISTORY | SnapshotFlags.MAY_CONTAIN_DUPLICATES
NOW_S = 1_700_000_000
ITEM_BYTES = 10
"""Key "a" (1 byte) and a 9-byte value: what each revision counts against a byte budget."""


class FakeClock:
    """A settable wall clock in nanoseconds (the bucket's HLC reads it)."""

    def __init__(self, seconds: int = NOW_S) -> None:
        self.ns = seconds * 1_000_000_000

    def __call__(self) -> int:
        return self.ns

    def advance(self, seconds: int) -> None:
        self.ns += seconds * 1_000_000_000


@dataclass
class Snapshot:
    marker: SnapshotMarker
    items: list[ServerMessage]

    @property
    def documents(self) -> list[Mutation | Deletion | Expiration]:
        return [m for m in self.items if isinstance(m, Mutation | Deletion | Expiration)]


def snapshots(messages: list[ServerMessage]) -> list[Snapshot]:
    """The messages grouped by snapshot marker (the STREAM_END is dropped)."""
    grouped: list[Snapshot] = []
    for message in messages:
        if isinstance(message, SnapshotMarker):
            grouped.append(Snapshot(message, []))
        elif not isinstance(message, StreamEnd):
            grouped[-1].items.append(message)
    return grouped


def stream_all(
    client: RawClient, bucket: SimBucket, *, start: int = 0, uuid: int = 0
) -> list[Snapshot]:
    """A bounded stream of vbucket 0 from `start` to the high seqno, by snapshot."""
    high = bucket.high_seqnos()[0]
    response = client.stream_request(0, start=start, end=high, vbucket_uuid=uuid)
    assert response.status == Status.SUCCESS, response
    messages = client.stream_until_end(0)
    assert messages[-1] == StreamEnd(0, StreamEndReason.OK)
    return snapshots(messages)


def value(n: int) -> bytes:
    return f"{n:09d}".encode()  # 9 bytes: with key "a" an item is ITEM_BYTES


def write_revisions(bucket: SimBucket, keys: str, *, first: int = 0) -> None:
    """One batch per key letter, values numbered from `first`."""
    for offset, key in enumerate(keys):
        bucket.upsert(key, value(first + offset), is_json=False)


def identity(item: Mutation | Deletion | Expiration) -> tuple[int, int, bytes, int, int, bytes]:
    body = item.value if isinstance(item, Mutation) else b""
    return (item.by_seqno, item.collection_id, item.key, item.rev_seqno, item.cas, body)


def two_collection_bucket(**options: object) -> tuple[SimBucket, int, int]:
    """A magma bucket retaining an hour of history; `app.history` keeps it, `app.plain` not."""
    bucket = SimBucket(
        "b",
        num_vbuckets=1,
        seed=1,
        history_retention_seconds=3600,
        history_collection_default=False,
        **options,  # type: ignore[arg-type]
    )
    bucket.create_scope("app")
    history = bucket.create_collection("app", "history", history=True)
    plain = bucket.create_collection("app", "plain")
    for n in range(3):
        bucket.apply_batch(
            [Upsert("k", {"v": n}, "app.history"), Upsert("p", {"v": n}, "app.plain")]
        )
    bucket.upsert("k", {"v": 3}, collection="app.history")
    return bucket, history, plain


# -- the control ----------------------------------------------------------------------------


def test_change_streams_is_accepted_with_true_on_magma_only() -> None:
    magma = SimBucket("b", num_vbuckets=1, storage_backend="magma")
    with serve(magma) as cluster, producer(cluster) as client:
        assert client.control("change_streams", "false").status == Status.EINVAL
        assert client.control("change_streams", "yes").status == Status.EINVAL
        assert client.control("change_streams", "true").status == Status.SUCCESS
        assert client.control("change_streams", "true").status == Status.SUCCESS
        assert client.control("change_streams", "false").status == Status.EINVAL  # one-way
    couchstore = SimBucket("b", num_vbuckets=1)
    assert couchstore.storage_backend == "couchstore"
    with serve(couchstore) as cluster, producer(cluster) as client:
        assert client.control("change_streams", "true").status == Status.NOT_SUPPORTED
        assert client.control("change_streams", "false").status == Status.EINVAL


def test_change_streams_does_not_ask_for_collections_as_kv_engine_does_not() -> None:
    bucket = SimBucket("b", num_vbuckets=1, history_retention_seconds=60)
    no_collections = tuple(f for f in DEFAULT_FEATURES if f != HelloFeature.COLLECTIONS)
    with serve(bucket) as cluster, producer(cluster, features=no_collections) as client:
        assert HelloFeature.COLLECTIONS not in client.features
        assert client.control("change_streams", "true").status == Status.SUCCESS


# -- serving --------------------------------------------------------------------------------


def test_a_change_streams_backfill_is_one_history_snapshot_with_every_revision() -> None:
    bucket, history, plain = two_collection_bucket()
    bucket.evict_checkpoints()
    high = bucket.high_seqnos()[0]
    assert bucket.history_start_seqno(0) == 1
    with serve(bucket) as cluster, producer(cluster, controls=CHANGE_STREAMS) as client:
        (snapshot,) = stream_all(client, bucket)
    assert snapshot.marker.flags == DISK | HISTORY == 0x36
    assert (snapshot.marker.start_seqno, snapshot.marker.end_seqno) == (0, high)
    documents = snapshot.documents
    keys = [(d.collection_id, d.key) for d in documents]
    assert keys.count((history, b"k")) == 4, "every revision of a history key"
    assert keys.count((plain, b"p")) == 1, "a collection without history stays deduplicated"
    revisions = [d for d in documents if d.collection_id == history]
    assert [identity(d) for d in revisions] == [identity(r) for r in bucket.history_revisions(0)]
    assert cluster.history_revisions(0) == bucket.history_revisions(0)


def test_the_same_bucket_without_the_control_is_deduplicated_without_history_flags() -> None:
    bucket, history, plain = two_collection_bucket()
    bucket.evict_checkpoints()
    with serve(bucket) as cluster, producer(cluster) as client:
        (snapshot,) = stream_all(client, bucket)
    assert snapshot.marker.flags == DISK
    keys = [(d.collection_id, d.key) for d in snapshot.documents]
    assert keys == [(plain, b"p"), (history, b"k")]
    latest = snapshot.documents[-1]
    assert isinstance(latest, Mutation) and latest.value == b'{"v":3}'


@pytest.mark.parametrize("items_per_pull", [1, 128])  # a backfill served in parts, or whole
def test_a_backfill_from_below_the_history_start_is_split_as_kv_engine_splits_it(
    items_per_pull: int,
) -> None:
    # Budget for two revisions: history starts at seqno 4 of a(1) b(2) a(3) c(4) a(5).
    bucket = SimBucket("b", num_vbuckets=1, history_retention_bytes=2 * ITEM_BYTES + 5)
    write_revisions(bucket, "abaca")
    bucket.evict_checkpoints()
    assert bucket.history_start_seqno(0) == 4
    options = fast_options(items_per_pull=items_per_pull)
    with (
        serve(bucket, options=options) as cluster,
        producer(cluster, controls=CHANGE_STREAMS) as client,
    ):
        prologue, history = stream_all(client, bucket)
    # Both markers name the whole backfill; the first is a plain (deduplicated) disk
    # snapshot of the seqnos below the history start, the second the history itself.
    assert (prologue.marker.start_seqno, prologue.marker.end_seqno) == (0, 5)
    assert (history.marker.start_seqno, history.marker.end_seqno) == (0, 5)
    assert (prologue.marker.flags, history.marker.flags) == (DISK, DISK | HISTORY)
    # a(1) and a(3) are replaced within the backfill (by a(5)): only b(2) is left below.
    assert [(d.key, d.by_seqno) for d in prologue.documents] == [(b"b", 2)]
    assert [(d.key, d.by_seqno) for d in history.documents] == [(b"c", 4), (b"a", 5)]
    assert [d.by_seqno for d in history.documents] == [
        r.by_seqno for r in bucket.history_revisions(0)
    ]


def test_an_empty_prologue_sends_no_marker_and_the_first_marker_rule_holds() -> None:
    bucket = SimBucket("b", num_vbuckets=1, history_retention_bytes=2 * ITEM_BYTES + 5)
    write_revisions(bucket, "aaaaa")
    bucket.evict_checkpoints()
    uuid = bucket.failover_log(0).newest.vbucket_uuid
    with serve(bucket) as cluster, producer(cluster, controls=CHANGE_STREAMS) as client:
        # Nothing below seqno 4 survives deduplication: only the history marker is sent.
        (only,) = stream_all(client, bucket)
        assert only.marker.flags == DISK | HISTORY
        assert [d.by_seqno for d in only.documents] == [4, 5]
    with serve(bucket) as cluster, producer(cluster, controls=CHANGE_STREAMS) as client:
        # Resuming at 2 (snap start 1): both markers start at the request's snap start.
        response = client.stream_request(
            0, start=2, end=5, vbucket_uuid=uuid, snap_start=1, snap_end=2
        )
        assert response.status == Status.SUCCESS
        (resumed,) = snapshots(client.stream_until_end(0))
        assert (resumed.marker.start_seqno, resumed.marker.end_seqno) == (1, 5)


def test_retention_by_bytes_moves_the_history_start_as_revisions_arrive() -> None:
    budget = 3 * ITEM_BYTES + 5
    bucket = SimBucket("b", num_vbuckets=2, history_retention_bytes=2 * budget)  # per vbucket
    vb = bucket.vbucket_for("a")
    assert history_item_size(bucket.upsert("a", value(0), is_json=False)) == ITEM_BYTES
    assert bucket.history_start_seqno(vb) == 1
    for n in range(1, 5):
        bucket.upsert("a", value(n), is_json=False)
    assert bucket.history_start_seqno(vb) == 3  # seqnos 3, 4, 5 fit the budget
    assert [identity(r)[-1] for r in bucket.history_revisions(vb)] == [
        value(2),
        value(3),
        value(4),
    ]
    bucket.upsert("a", value(5), is_json=False)
    assert bucket.history_start_seqno(vb) == 4
    bucket.evict_checkpoints()
    with serve(bucket) as cluster, producer(cluster, controls=CHANGE_STREAMS) as client:
        assert client.stream_request(vb, end=6).status == Status.SUCCESS
        history = snapshots(client.stream_until_end(vb))[-1]
    assert history.marker.flags == DISK | HISTORY
    assert [d.by_seqno for d in history.documents] == [4, 5, 6]


def test_retention_by_age_follows_the_cas_time_and_the_clock() -> None:
    clock = FakeClock()
    bucket = SimBucket("b", num_vbuckets=1, clock_ns=clock, history_retention_seconds=15)
    for n in range(3):
        bucket.upsert("a", value(n), is_json=False)  # at NOW_S, +10 s, +20 s
        clock.advance(10)
    clock.advance(-10)  # now: NOW_S + 20
    assert bucket.history_start_seqno(0) == 2  # the first write is 20 s old
    clock.advance(6)
    assert bucket.history_start_seqno(0) == 3
    bucket.evict_checkpoints()
    with serve(bucket) as cluster, producer(cluster, controls=CHANGE_STREAMS) as client:
        # a(1) and a(2) are replaced: no prologue, only the history from seqno 3.
        (history,) = stream_all(client, bucket)
        assert history.marker.flags == DISK | HISTORY
        assert [d.by_seqno for d in history.documents] == [3]
    clock.advance(30)
    assert bucket.history_start_seqno(0) == 4  # nothing left: the next write starts it
    assert bucket.history_revisions(0) == []
    with serve(bucket) as cluster, producer(cluster, controls=CHANGE_STREAMS) as client:
        (plain,) = stream_all(client, bucket)
        assert plain.marker.flags == DISK
    bucket.upsert("a", value(9), is_json=False)
    assert [r.by_seqno for r in bucket.history_revisions(0)] == [4]


def test_a_collection_without_history_is_deduplicated_inside_a_history_snapshot() -> None:
    bucket, history, plain = two_collection_bucket()
    bucket.apply_batch([Upsert("p", {"v": n}, "app.plain") for n in range(4, 7)])
    bucket.evict_checkpoints()
    with serve(bucket) as cluster, producer(cluster, controls=CHANGE_STREAMS) as client:
        (snapshot,) = stream_all(client, bucket)
    assert snapshot.marker.flags & SnapshotFlags.HISTORY
    plain_items = [d for d in snapshot.documents if d.collection_id == plain]
    assert [(d.key, d.value) for d in plain_items if isinstance(d, Mutation)] == [
        (b"p", b'{"v":6}')
    ]
    assert len([d for d in snapshot.documents if d.collection_id == history]) == 4


def test_memory_snapshots_are_history_snapshots_and_a_repeated_key_starts_a_new_one() -> None:
    bucket = SimBucket(
        "b", num_vbuckets=1, history_retention_seconds=3600, history_collection_default=False
    )
    bucket.create_scope("app")
    bucket.create_collection("app", "history", history=True)
    bucket.create_collection("app", "plain")
    start = bucket.high_seqnos()[0]
    uuid = bucket.failover_log(0).newest.vbucket_uuid
    with (
        serve(bucket) as cluster,
        producer(cluster, controls=CHANGE_STREAMS) as changes,
        RawClient("127.0.0.1", cluster.node(0).port) as legacy,
    ):
        legacy.connect("b")
        assert legacy.dcp_open("test:legacy").status == Status.SUCCESS  # another DCP name
        for client in (changes, legacy):
            response = client.stream_request(0, start=start, end=start + 4, vbucket_uuid=uuid)
            assert response.status == Status.SUCCESS
        # One batch: k, p, p, k. kv_engine's historical checkpoint never holds k twice, so
        # the second k opens a new checkpoint (memory snapshot); p is deduplicated.
        bucket.apply_batch(
            [
                Upsert("k", {"v": 1}, "app.history"),
                Upsert("p", {"v": 1}, "app.plain"),
                Upsert("p", {"v": 2}, "app.plain"),
                Upsert("k", {"v": 2}, "app.history"),
            ]
        )
        served = {
            name: snapshots(client.stream_until_end(0))
            for name, client in (("changes", changes), ("legacy", legacy))
        }
    for name, flags in (("changes", MEMORY | SnapshotFlags.HISTORY), ("legacy", MEMORY)):
        first, second = served[name]
        assert [s.marker.flags for s in (first, second)] == [flags, flags], name
        assert [(d.key, d.by_seqno) for d in first.documents] == [(b"k", 4), (b"p", 6)]
        assert (second.marker.start_seqno, second.marker.end_seqno) == (7, 7)
        assert [(d.key, d.by_seqno) for d in second.documents] == [(b"k", 7)]


def test_the_duplicates_fault_still_keeps_every_version_in_memory_snapshots() -> None:
    bucket = SimBucket(
        "b", num_vbuckets=1, may_contain_duplicates=True, history_retention_seconds=3600
    )
    with serve(bucket) as cluster, producer(cluster, controls=CHANGE_STREAMS) as client:
        assert client.stream_request(0, end=2).status == Status.SUCCESS
        bucket.apply_batch([Upsert("p", {"v": 1}), Upsert("q", {"v": 1})])
        (snapshot,) = snapshots(client.stream_until_end(0))
    assert snapshot.marker.flags == (
        MEMORY | SnapshotFlags.HISTORY | SnapshotFlags.MAY_CONTAIN_DUPLICATES
    )


def test_a_filtered_stream_without_items_below_the_history_start_gets_no_prologue() -> None:
    # Three revisions fit; the system events before them count their names (8 bytes).
    bucket = SimBucket("b", num_vbuckets=1, history_retention_bytes=3 * ITEM_BYTES + 2)
    bucket.create_scope("app")
    other = bucket.create_collection("app", "other")  # seqnos 1 and 2 are system events
    write_revisions(bucket, "aab")
    bucket.evict_checkpoints()
    assert bucket.history_start_seqno(0) == 3
    with serve(bucket) as cluster, producer(cluster, controls=CHANGE_STREAMS) as client:
        response = client.filtered_stream_request(0, {"collections": ["0"]}, end=5)
        assert response.status == Status.SUCCESS
        messages = client.stream_until_end(0)
    markers = [m for m in messages if isinstance(m, SnapshotMarker)]
    assert [m.flags for m in markers] == [DISK | HISTORY]
    assert [m.by_seqno for m in messages if isinstance(m, Mutation)] == [3, 4, 5]
    assert not any(isinstance(m, SeqnoAdvanced) for m in messages)
    assert other not in {r.collection_id for r in bucket.history_revisions(0)}


# -- failover ----------------------------------------------------------------------------


def test_history_below_a_failover_stays_and_a_consumer_rolls_back_into_it() -> None:
    bucket = SimBucket("b", num_vbuckets=1, history_retention_bytes=4 * ITEM_BYTES + 5)
    write_revisions(bucket, "aaaaaaaa")  # seqnos 1..8, history from 5
    assert bucket.history_start_seqno(0) == 5
    old_uuid = bucket.failover_log(0).newest.vbucket_uuid
    before = bucket.history_revisions(0)

    log = bucket.failover(0, lose_last=2)  # the replica never got seqnos 7 and 8
    assert log.newest.seqno == 6
    # Only the lost tail goes; the history below it stays (none that was purged comes back,
    # although the byte budget would now hold seqnos 3 and 4 again).
    assert bucket.history_start_seqno(0) == 5
    assert bucket.history_revisions(0) == [r for r in before if r.by_seqno <= 6]
    write_revisions(bucket, "aa", first=100)  # a new 7 and 8 on the new branch
    assert bucket.history_start_seqno(0) == 5
    bucket.evict_checkpoints()

    with serve(bucket) as cluster, producer(cluster, controls=CHANGE_STREAMS) as client:
        stale = client.stream_request(0, start=8, end=8, vbucket_uuid=old_uuid)
        assert stale.status == Status.ROLLBACK
        assert struct.unpack(">Q", stale.value) == (6,)
        # The consumer goes back to a boundary it committed (4) and streams from there.
        (history,) = stream_all(client, bucket, start=4, uuid=old_uuid)
    assert history.marker.flags == DISK | HISTORY
    assert [(d.by_seqno, d.value) for d in history.documents if isinstance(d, Mutation)] == [
        (5, value(4)),
        (6, value(5)),
        (7, value(100)),
        (8, value(101)),
    ]
    assert [identity(d) for d in history.documents] == [
        identity(r) for r in bucket.history_revisions(0)
    ]


def test_lost_history_keeps_the_window_below_the_cut() -> None:
    bucket = SimBucket("b", num_vbuckets=1, history_retention_bytes=4 * ITEM_BYTES + 5)
    write_revisions(bucket, "aaaaaaaa")
    bucket.lose_history(0, 4)  # the whole window but seqno 5 was in the lost tail
    assert [r.by_seqno for r in bucket.history_revisions(0)] == []
    assert bucket.history_start_seqno(0) == 5
    bucket.lose_history(0, 0)
    write_revisions(bucket, "a")
    assert [r.by_seqno for r in bucket.history_revisions(0)] == [5]
