"""Stream requests against a simulated node: snapshots, rollback, ERANGE, routing, closing."""

from __future__ import annotations

import json
import struct

import pytest

from replicator.dcp.protocol.dcp_requests import CloseStream, GetFailoverLog
from replicator.dcp.protocol.events import (
    Deletion,
    Mutation,
    SeqnoAdvanced,
    SnapshotFlags,
    SnapshotMarker,
    StreamEnd,
    StreamEndReason,
    SystemEvent,
    SystemEventType,
)
from replicator.dcp.protocol.frame import encode_frame
from replicator.dcp.protocol.opcodes import Magic, Status, StreamRequestFlags
from replicator.dcp.protocol.responses import failover_log_of, rollback_seqno_of
from replicator.sim.bucket import Delete, SimBucket, Upsert
from tests.sim.raw_client import RawClient, producer, serve

DISK = SnapshotFlags.DISK | SnapshotFlags.CHECKPOINT
MEMORY = SnapshotFlags.MEMORY | SnapshotFlags.CHECKPOINT


def one_vbucket_bucket() -> SimBucket:
    return SimBucket("b", num_vbuckets=1, seed=11)


def test_stream_from_zero_gets_a_deduplicated_disk_snapshot_then_memory_snapshots() -> None:
    bucket = one_vbucket_bucket()
    bucket.apply_batch([Upsert("a", {"v": 1}), Upsert("b", {"v": 1})])
    bucket.apply_batch([Upsert("a", {"v": 2}), Upsert("c", {"v": 1})])
    bucket.evict_checkpoints()  # the history is on "disk": a new stream backfills
    with serve(bucket) as cluster, producer(cluster) as client:
        opened = client.stream_request(0)
        assert opened.status == Status.SUCCESS
        assert failover_log_of(opened) == bucket.failover_log(0)
        marker = client.next_message()
        assert marker == SnapshotMarker(0, 0, 4, DISK)
        backfill = [client.next_message() for _ in range(3)]
        assert [(m.key, m.by_seqno) for m in backfill if isinstance(m, Mutation)] == [
            (b"b", 2),
            (b"a", 3),
            (b"c", 4),
        ]
        assert backfill[1].value == b'{"v":2}'  # type: ignore[union-attr]
        assert client.nothing_within(0.1)

        bucket.apply_batch([Upsert("d", {"v": 1}), Upsert("a", {"v": 3}), Delete("b")])
        live = client.messages_until(lambda m: getattr(m, "by_seqno", 0) == 7)
        assert live[0] == SnapshotMarker(0, 5, 7, MEMORY)
        assert [type(m).__name__ for m in live[1:]] == ["Mutation", "Mutation", "Deletion"]
        deletion = live[3]
        assert isinstance(deletion, Deletion) and deletion.key == b"b"
        assert deletion.delete_time > 0  # v2 deletion: the connection asked for delete times


def test_rollback_answer_carries_the_seqno_in_the_value_after_a_failover() -> None:
    bucket = one_vbucket_bucket()
    for n in range(6):
        bucket.upsert(f"k{n}", {"n": n})
    with serve(bucket) as cluster:
        with producer(cluster) as client:
            opened = client.stream_request(0)
            old_uuid = failover_log_of(opened).newest.vbucket_uuid
            client.messages_until(lambda m: getattr(m, "by_seqno", 0) == 6)
            new_log = cluster.failover(0, lose_last=2)
            # The open stream ends: the vbucket changed state under it.
            assert client.next_message() == StreamEnd(0, StreamEndReason.STATE_CHANGED)
        assert [e.seqno for e in new_log.entries] == [4, 0]
        with producer(cluster) as client:
            refused = client.stream_request(0, start=6, vbucket_uuid=old_uuid)
            assert refused.status == Status.ROLLBACK
            assert refused.extras == b""
            assert rollback_seqno_of(refused) == 4
            resumed = client.stream_request(0, start=4, vbucket_uuid=old_uuid)
            assert resumed.status == Status.SUCCESS
            assert failover_log_of(resumed) == new_log


def test_erange_cases() -> None:
    bucket = one_vbucket_bucket()
    for n in range(3):
        bucket.upsert(f"k{n}", {"n": n})
    uuid = bucket.failover_log(0).newest.vbucket_uuid
    with serve(bucket) as cluster, producer(cluster) as client:
        # A consumer ahead of the producer on the same history is told to roll back, as
        # kv_engine decides rollback before its start > high seqno check.
        beyond_high = client.stream_request(0, start=5, vbucket_uuid=uuid)
        assert beyond_high.status == Status.ROLLBACK
        assert rollback_seqno_of(beyond_high) == 3
        start_after_end = client.stream_request(0, start=2, end=1, vbucket_uuid=uuid)
        assert start_after_end.status == Status.ERANGE
        snap_start_after_start = client.stream_request(
            0, start=1, vbucket_uuid=uuid, snap_start=2, snap_end=2
        )
        assert snap_start_after_start.status == Status.ERANGE
        start_after_snap_end = client.stream_request(
            0, start=2, vbucket_uuid=uuid, snap_start=0, snap_end=1
        )
        assert start_after_snap_end.status == Status.ERANGE
        # None of them opened a stream.
        assert client.stream_request(0, start=3, vbucket_uuid=uuid).status == Status.SUCCESS


def test_not_my_vbucket_carries_the_cluster_map() -> None:
    bucket = SimBucket("b", num_vbuckets=4, seed=1)
    with serve(bucket, nodes=2) as cluster, producer(cluster, node=0) as client:
        theirs = cluster.topology.vbuckets_of(1)[0]
        refused = client.stream_request(theirs)
        assert refused.status == Status.NOT_MY_VBUCKET
        config = json.loads(refused.value)
        owner = config["vBucketServerMap"]["vBucketMap"][theirs][0]
        assert config["vBucketServerMap"]["serverList"][owner].endswith(f":{cluster.node(1).port}")
        assert client.stream_request(99).status == Status.NOT_MY_VBUCKET  # no such vbucket
        log_request = GetFailoverLog(theirs, client.next_opaque())
        assert client.request(log_request).status == Status.NOT_MY_VBUCKET


def test_second_stream_for_a_vbucket_is_key_eexists() -> None:
    bucket = one_vbucket_bucket()
    with serve(bucket) as cluster, producer(cluster) as client:
        assert client.stream_request(0).status == Status.SUCCESS
        assert client.stream_request(0).status == Status.KEY_EEXISTS


def test_close_stream_with_and_without_stream_end() -> None:
    bucket = one_vbucket_bucket()
    bucket.upsert("a", {"v": 1})
    controls = [("send_stream_end_on_client_close_stream", "true")]
    with serve(bucket) as cluster:
        with producer(cluster, controls=controls) as client:
            assert client.stream_request(0).status == Status.SUCCESS
            client.messages_until(lambda m: isinstance(m, Mutation))
            closed = client.request(_close(client, 0))
            assert closed.status == Status.SUCCESS
            assert client.next_message() == StreamEnd(0, StreamEndReason.CLOSED)
            assert client.request(_close(client, 0)).status == Status.KEY_ENOENT
            assert client.stream_request(0).status == Status.SUCCESS  # may reopen
        with producer(cluster) as client:
            assert client.stream_request(0).status == Status.SUCCESS
            client.messages_until(lambda m: isinstance(m, Mutation))
            assert client.request(_close(client, 0)).status == Status.SUCCESS
            bucket.upsert("b", {"v": 1})
            assert client.nothing_within(0.2)  # no STREAM_END and no more data


def _close(client: RawClient, vbucket: int) -> CloseStream:
    return CloseStream(vbucket, opaque=client.next_opaque())


def test_bounded_stream_ends_ok_at_its_end_seqno() -> None:
    bucket = one_vbucket_bucket()
    for n in range(5):
        bucket.upsert(f"k{n}", {"n": n})  # five memory snapshots of one item each
    with serve(bucket) as cluster, producer(cluster) as client:
        assert client.stream_request(0, end=3).status == Status.SUCCESS
        messages = client.stream_until_end(0)
        seqnos = [m.by_seqno for m in messages if isinstance(m, Mutation)]
        assert seqnos == [1, 2, 3]
        assert messages[-1] == StreamEnd(0, StreamEndReason.OK)
        uuid = bucket.failover_log(0).newest.vbucket_uuid
        # A stream whose end is already reached ends at once.
        assert client.stream_request(0, start=3, end=3, vbucket_uuid=uuid).status == Status.SUCCESS
        assert client.next_message() == StreamEnd(0, StreamEndReason.OK)


def test_to_latest_flag_ends_at_the_high_seqno_of_the_request() -> None:
    bucket = one_vbucket_bucket()
    for n in range(3):
        bucket.upsert(f"k{n}", {"n": n})
    with serve(bucket) as cluster, producer(cluster) as client:
        opened = client.stream_request(0, end=0, flags=StreamRequestFlags.TO_LATEST)
        assert opened.status == Status.SUCCESS
        bucket.upsert("late", {"n": 9})
        messages = client.stream_until_end(0)
        assert [m.by_seqno for m in messages if isinstance(m, Mutation)] == [1, 2, 3]
        assert messages[-1] == StreamEnd(0, StreamEndReason.OK)


def test_live_stream_wakes_on_new_items_without_polling() -> None:
    bucket = SimBucket("b", num_vbuckets=4, seed=5)
    with serve(bucket) as cluster, producer(cluster) as client:
        for vb in range(4):
            assert client.stream_request(vb).status == Status.SUCCESS
        assert client.nothing_within(0.1)
        mutation = bucket.upsert("wake-up", {"x": 1})
        received = client.messages_until(lambda m: isinstance(m, Mutation))
        assert received[-1].key == b"wake-up"  # type: ignore[union-attr]
        assert received[-1].vbucket == mutation.vbucket  # type: ignore[union-attr]


def bucket_with_a_tombstone_at_seqno_3() -> tuple[SimBucket, int]:
    """One vbucket: a, b, delete a (seqno 3), c; and its vbucket uuid."""
    bucket = one_vbucket_bucket()
    bucket.upsert("a", {"v": 1})
    bucket.upsert("b", {"v": 1})
    bucket.delete("a")
    bucket.upsert("c", {"v": 1})
    return bucket, bucket.failover_log(0).newest.vbucket_uuid


def test_purged_tombstones_force_a_rollback_to_zero_unless_the_purge_seqno_is_known() -> None:
    bucket, uuid = bucket_with_a_tombstone_at_seqno_3()
    purge_seqno = bucket.purge_tombstones(0)
    assert purge_seqno == 4
    with serve(bucket) as cluster, producer(cluster) as client:
        behind = client.stream_request(0, start=2, vbucket_uuid=uuid)
        assert behind.status == Status.ROLLBACK
        assert rollback_seqno_of(behind) == 0
        knows_purge = client.stream_request(0, start=2, vbucket_uuid=uuid, purge_seqno=purge_seqno)
        assert knows_purge.status == Status.SUCCESS


def test_a_client_purge_seqno_higher_than_the_vbuckets_still_rolls_back_to_zero() -> None:
    bucket, uuid = bucket_with_a_tombstone_at_seqno_3()
    purge_seqno = bucket.purge_tombstones(0, up_to=3)
    assert purge_seqno == 3
    with serve(bucket) as cluster, producer(cluster) as client:
        # NOTES.md section 5 rule 2 (kv_engine's MB-27800 check) excuses a consumer behind the
        # purge seqno only when it sends the SAME purge seqno: then no purge ran since it last
        # streamed. A higher one was seen on some other history (a branch since failed over,
        # another bucket): the producer cannot vouch for what was purged here, so rule 2 holds.
        higher = client.stream_request(0, start=2, vbucket_uuid=uuid, purge_seqno=purge_seqno + 5)
        assert higher.status == Status.ROLLBACK
        assert rollback_seqno_of(higher) == 0
        lower = client.stream_request(0, start=2, vbucket_uuid=uuid, purge_seqno=purge_seqno - 1)
        assert lower.status == Status.ROLLBACK and rollback_seqno_of(lower) == 0
        same = client.stream_request(0, start=2, vbucket_uuid=uuid, purge_seqno=purge_seqno)
        assert same.status == Status.SUCCESS


@pytest.mark.parametrize("dropped", ["collection", "scope"])
def test_dropping_everything_a_filter_selects_ends_the_stream_filter_empty(dropped: str) -> None:
    bucket = one_vbucket_bucket()
    app = bucket.create_scope("app")
    users = bucket.create_collection("app", "users")
    bucket.upsert("u1", {"v": 1}, collection="app.users")
    bucket.upsert("d1", {"v": 1})  # the default collection: outside the filter
    if dropped == "collection":
        stream_filter: dict[str, object] = {"collections": [f"{users:x}"]}
    else:
        stream_filter = {"scope": f"{app:x}"}
    with serve(bucket) as cluster, producer(cluster) as client:
        assert client.filtered_stream_request(0, stream_filter).status == Status.SUCCESS
        client.messages_until(lambda m: isinstance(m, Mutation) and m.key == b"u1")
        if dropped == "collection":
            bucket.drop_collection("app", "users")  # the filter's only collection
        else:
            bucket.drop_scope("app")
        messages = client.stream_until_end(0)
        events = [m for m in messages if isinstance(m, SystemEvent)]
        expected = [SystemEventType.COLLECTION_DROPPED]
        if dropped == "scope":
            expected.append(SystemEventType.SCOPE_DROPPED)
        assert [e.event for e in events] == expected
        assert events[0].collection_id == users
        assert messages[-1] == StreamEnd(0, StreamEndReason.FILTER_EMPTY)
        bucket.upsert("d2", {"v": 1})
        assert client.nothing_within(0.1)  # the ended stream carries nothing more
        # The vbucket's stream slot is free again: a new (unfiltered) stream opens.
        assert client.stream_request(0).status == Status.SUCCESS


def test_from_latest_starts_at_the_high_seqno() -> None:
    bucket = one_vbucket_bucket()
    for n in range(3):
        bucket.upsert(f"k{n}", {"n": n})
    with serve(bucket) as cluster, producer(cluster) as client:
        uuid = bucket.failover_log(0).newest.vbucket_uuid
        # The start is ignored, the uuid is not: it must be on the producer's history.
        assert client.stream_request(0, flags=StreamRequestFlags.FROM_LATEST).status == (
            Status.ROLLBACK
        )
        opened = client.stream_request(0, vbucket_uuid=uuid, flags=StreamRequestFlags.FROM_LATEST)
        assert opened.status == Status.SUCCESS
        bucket.upsert("new", {"n": 1})
        messages = client.messages_until(lambda m: isinstance(m, Mutation))
        assert messages[-1].by_seqno == 4  # type: ignore[union-attr]


def test_failover_log_and_observe_seqno_answer_for_owned_vbuckets() -> None:
    bucket = one_vbucket_bucket()
    bucket.upsert("a", {"v": 1})
    old_uuid = bucket.failover_log(0).newest.vbucket_uuid
    bucket.upsert("b", {"v": 1})
    bucket.failover(0, lose_last=0)  # a new branch at seqno 2
    bucket.upsert("c", {"v": 1})
    with serve(bucket) as cluster, producer(cluster) as client:
        answer = client.request(GetFailoverLog(0, client.next_opaque()))
        assert failover_log_of(answer) == bucket.failover_log(0)
        # OBSERVE_SEQNO with a uuid from before the failover: format 1 names its branch end.
        observe = encode_frame(Magic.REQUEST, 0x91, opaque=77, value=struct.pack(">Q", old_uuid))
        value = client.raw_request(observe, 77).value
        fmt, vb, uuid, persisted, current, old, branch_end = struct.unpack(">BHQQQQQ", value)
        assert (fmt, vb, persisted, current, old, branch_end) == (1, 0, 3, 3, old_uuid, 2)
        assert uuid == bucket.failover_log(0).newest.vbucket_uuid


def test_a_backfill_leaves_out_purged_tombstones() -> None:
    bucket = one_vbucket_bucket()
    bucket.upsert("gone", {"v": 1})
    bucket.upsert("kept", {"v": 1})
    bucket.delete("gone")
    with serve(bucket) as cluster, producer(cluster) as client:
        cluster.purge_tombstones(0)
        client.stream_request(0)
        messages = client.messages_until(lambda m: getattr(m, "by_seqno", 0) == 2)
        assert [type(m).__name__ for m in messages] == ["SnapshotMarker", "Mutation"]
        marker = messages[0]
        assert isinstance(marker, SnapshotMarker) and marker.end_seqno == 3 and marker.is_disk
        # The snapshot's end was a purged tombstone: a collection-aware stream is told so.
        assert client.next_message() == SeqnoAdvanced(0, 3)
