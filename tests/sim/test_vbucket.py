"""One vbucket: history, what streams are served (disk then memory), purge, expiry, failover."""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass

import pytest

from replicator.dcp.protocol.events import (
    Deletion,
    Expiration,
    Mutation,
    SnapshotFlags,
    SnapshotMarker,
    StreamEnd,
    StreamEndReason,
    SystemEvent,
    SystemEventType,
)
from replicator.sim.collections import ManifestChange
from replicator.sim.failover_table import StreamAccepted, StreamRequest, StreamRollback
from replicator.sim.history_items import (
    DocumentNotFoundError,
    DocumentWrite,
    HistoryItem,
    WriteKind,
    expiration_as_deletion,
)
from replicator.sim.vbucket import ServedSnapshot, StreamCursor, VBucket

DISK = SnapshotFlags.DISK | SnapshotFlags.CHECKPOINT
MEMORY = SnapshotFlags.MEMORY | SnapshotFlags.CHECKPOINT
NOW_S = 1_700_000_000


class FakeClock:
    """A settable wall clock in nanoseconds."""

    def __init__(self, seconds: int = NOW_S) -> None:
        self.ns = seconds * 1_000_000_000

    def __call__(self) -> int:
        return self.ns


def new_vbucket(**options: object) -> VBucket:
    return VBucket(3, rng=random.Random(11), clock_ns=FakeClock(), **options)  # type: ignore[arg-type]


def upsert(key: str, value: str = "{}", *, cid: int = 0, expiry: int = 0) -> DocumentWrite:
    return DocumentWrite(WriteKind.UPSERT, cid, key.encode(), value.encode(), expiry=expiry)


def delete(key: str, *, cid: int = 0) -> DocumentWrite:
    return DocumentWrite(WriteKind.DELETE, cid, key.encode())


def write(vb: VBucket, *writes: DocumentWrite) -> tuple[HistoryItem, ...]:
    return vb.apply_writes(writes)


@dataclass(frozen=True)
class Snapshot:
    """A snapshot reassembled from its served parts."""

    marker: SnapshotMarker
    items: tuple[HistoryItem, ...]
    parts: int


def drain(cursor: StreamCursor, max_items: int = 1000) -> list[Snapshot | StreamEnd]:
    """Everything the cursor has now, parts joined into whole snapshots."""
    result: list[Snapshot | StreamEnd] = []
    marker: SnapshotMarker | None = None
    items: list[HistoryItem] = []
    parts = 0
    while (served := cursor.next_snapshot(max_items)) is not None:
        if isinstance(served, StreamEnd):
            result.append(served)
            continue
        assert isinstance(served, ServedSnapshot)
        if served.marker is not None:
            assert marker is None, "a new marker before the previous snapshot ended"
            marker, items, parts = served.marker, [], 0
        assert marker is not None, "a continuation without a marker"
        items.extend(served.items)
        parts += 1
        if served.is_last_part:
            result.append(Snapshot(marker, tuple(items), parts))
            marker = None
    assert marker is None, "caught up in the middle of a snapshot"
    return result


def snapshots(cursor: StreamCursor, max_items: int = 1000) -> list[Snapshot]:
    drained = drain(cursor, max_items)
    assert all(isinstance(s, Snapshot) for s in drained)
    return [s for s in drained if isinstance(s, Snapshot)]


def keys(items: tuple[HistoryItem, ...]) -> list[tuple[str, int]]:
    return [
        (item.key.decode() if not isinstance(item, SystemEvent) else item.name, item.by_seqno)
        for item in items
    ]


# -- writes and state --------------------------------------------------------------------


def test_writes_get_consecutive_seqnos_revisions_and_rising_cas() -> None:
    vb = new_vbucket()
    first, second = write(vb, upsert("a"), upsert("a", '{"v":2}'))
    (third,) = write(vb, delete("a"))
    (fourth,) = write(vb, upsert("a"))
    assert [i.by_seqno for i in (first, second, third, fourth)] == [1, 2, 3, 4]
    assert isinstance(first, Mutation) and isinstance(second, Mutation)
    assert isinstance(third, Deletion) and isinstance(fourth, Mutation)
    # A key written again after its deletion continues the tombstone's revision.
    assert [first.rev_seqno, second.rev_seqno, third.rev_seqno, fourth.rev_seqno] == [1, 2, 3, 4]
    cas = [first.cas, second.cas, third.cas, fourth.cas]
    assert cas == sorted(set(cas)), "CAS must rise even while the clock stands still"
    assert third.delete_time == NOW_S
    assert vb.high_seqno == 4


def test_deletion_keeps_system_xattrs_only() -> None:
    vb = new_vbucket()
    xattrs = (("_sync", '{"rev":1}'), ("user", '"x"'))
    write(vb, DocumentWrite(WriteKind.UPSERT, 0, b"a", b"{}", xattrs=xattrs))
    (deletion,) = write(vb, delete("a"))
    assert isinstance(deletion, Deletion)
    assert deletion.xattrs == (("_sync", '{"rev":1}'),)


def test_missing_document_fails_the_whole_batch() -> None:
    vb = new_vbucket()
    with pytest.raises(DocumentNotFoundError, match="b'ghost'"):
        write(vb, upsert("a"), delete("ghost"))
    assert vb.high_seqno == 0
    # Within one batch, a delete may follow the upsert that creates the document.
    assert [type(i) for i in write(vb, upsert("b"), delete("b"))] == [Mutation, Deletion]
    with pytest.raises(DocumentNotFoundError):
        write(vb, delete("b"))


def test_documents_are_the_latest_live_versions() -> None:
    vb = new_vbucket()
    write(vb, upsert("a", "1"), upsert("b", "1"), upsert("c", "1"))
    write(vb, upsert("a", "2"), delete("b"))
    assert [(d.key, d.value, d.by_seqno) for d in vb.documents()] == [
        (b"c", b"1", 3),
        (b"a", b"2", 4),
    ]


def replay(vb: VBucket, seqno: int) -> dict[tuple[int, bytes], bytes]:
    """The state at `seqno` the slow way: apply every item in order."""
    state: dict[tuple[int, bytes], bytes] = {}
    for s in range(1, seqno + 1):
        item = vb.item_at(s)
        if isinstance(item, Mutation):
            state[(item.collection_id, item.key)] = item.value
        elif isinstance(item, Deletion | Expiration):
            state.pop((item.collection_id, item.key), None)
    return state


def test_state_at_matches_a_replay_at_every_seqno() -> None:
    vb = new_vbucket()
    rng = random.Random(5)
    for round_number in range(40):
        live = {d.key.decode() for d in vb.documents()}
        key = f"k{rng.randrange(8)}"
        if key in live and rng.random() < 0.3:
            write(vb, delete(key))
        else:
            write(vb, upsert(key, str(round_number)))
    for seqno in range(vb.high_seqno + 1):
        state = {(d.collection_id, d.key): d.value for d in vb.state_at(seqno)}
        assert state == replay(vb, seqno)
    with pytest.raises(ValueError, match="beyond the high seqno"):
        vb.state_at(vb.high_seqno + 1)


# -- disk snapshots ----------------------------------------------------------------------


def test_disk_snapshot_has_one_item_per_key_and_ends_at_the_high_seqno() -> None:
    vb = new_vbucket()
    write(vb, upsert("a", "1"), upsert("b", "1"))
    write(vb, upsert("a", "2"), upsert("c", "1"))
    write(vb, delete("b"))
    vb.evict_checkpoints()
    (snapshot,) = snapshots(vb.open_cursor(0))
    assert snapshot.marker.flags == DISK
    assert (snapshot.marker.start_seqno, snapshot.marker.end_seqno) == (0, 5)
    assert keys(snapshot.items) == [("a", 3), ("c", 4), ("b", 5)]
    assert isinstance(snapshot.items[-1], Deletion)


def test_disk_snapshot_end_stays_the_high_seqno_when_its_last_item_is_gone() -> None:
    vb = new_vbucket()
    write(vb, upsert("a"), upsert("b"))
    write(vb, delete("b"))
    vb.purge_tombstones(3)
    (snapshot,) = snapshots(vb.open_cursor(0))
    assert snapshot.marker.end_seqno == 3
    assert keys(snapshot.items) == [("a", 1)]
    assert snapshot.marker.purge_seqno == 3


def test_disk_snapshot_from_a_resume_point_holds_only_later_changes() -> None:
    vb = new_vbucket()
    write(vb, upsert("a", "1"), upsert("b", "1"))
    write(vb, upsert("c", "1"), upsert("a", "2"))
    vb.evict_checkpoints()
    (snapshot,) = snapshots(vb.open_cursor(2))
    assert (snapshot.marker.start_seqno, snapshot.marker.end_seqno) == (2, 4)
    assert keys(snapshot.items) == [("c", 3), ("a", 4)]


def test_large_backfill_is_served_in_parts_frozen_at_its_start() -> None:
    vb = new_vbucket()
    write(vb, *(upsert(f"k{i}", "old") for i in range(10)))
    vb.evict_checkpoints()
    cursor = vb.open_cursor(0)
    parts = [cursor.next_snapshot(4)]
    # A write during the backfill does not change it: k9 "old" is still served.
    write(vb, upsert("k9", "new"))
    while isinstance(parts[-1], ServedSnapshot) and not parts[-1].is_last_part:
        parts.append(cursor.next_snapshot(4))
    disk_items = [i for p in parts if isinstance(p, ServedSnapshot) for i in p.items]
    first = parts[0]
    assert isinstance(first, ServedSnapshot) and first.marker is not None
    assert (first.marker.flags, first.marker.end_seqno) == (DISK, 10)
    assert [i.by_seqno for i in disk_items] == list(range(1, 11))
    assert isinstance(disk_items[-1], Mutation) and disk_items[-1].value == b"old"
    # ... and the new version follows as a memory snapshot.
    (memory,) = snapshots(cursor, 4)
    assert memory.marker.flags == MEMORY
    assert keys(memory.items) == [("k9", 11)]


def test_parts_carry_the_marker_only_once() -> None:
    vb = new_vbucket()
    write(vb, *(upsert(f"k{i}") for i in range(10)))
    vb.evict_checkpoints()
    cursor = vb.open_cursor(0)
    parts = []
    while isinstance(part := cursor.next_snapshot(3), ServedSnapshot):
        parts.append(part)
    assert [len(p.items) for p in parts] == [3, 3, 3, 1]
    assert [p.marker is not None for p in parts] == [True, False, False, False]
    assert [p.is_last_part for p in parts] == [False, False, False, True]
    assert cursor.position == 10


# -- memory snapshots --------------------------------------------------------------------


def test_memory_snapshots_follow_batches_in_order() -> None:
    vb = new_vbucket()
    write(vb, upsert("a"), upsert("b"))
    write(vb, upsert("c"))
    write(vb, upsert("a", "2"), delete("c"))
    served = snapshots(vb.open_cursor(0))
    assert [(s.marker.start_seqno, s.marker.end_seqno) for s in served] == [(0, 2), (3, 3), (4, 5)]
    assert all(s.marker.flags == MEMORY for s in served)
    assert [keys(s.items) for s in served] == [
        [("a", 1), ("b", 2)],
        [("c", 3)],
        [("a", 4), ("c", 5)],
    ]


def test_memory_snapshot_deduplicates_a_key_within_its_batch() -> None:
    vb = new_vbucket()
    write(vb, upsert("a", "1"), upsert("b"), upsert("a", "2"))
    (snapshot,) = snapshots(vb.open_cursor(0))
    assert (snapshot.marker.start_seqno, snapshot.marker.end_seqno) == (0, 3)
    assert keys(snapshot.items) == [("b", 2), ("a", 3)]


def test_duplicates_switch_keeps_every_version_and_flags_the_marker() -> None:
    vb = new_vbucket(may_contain_duplicates=True)
    write(vb, upsert("a", "1"), upsert("b"), upsert("a", "2"))
    (snapshot,) = snapshots(vb.open_cursor(0))
    assert snapshot.marker.flags == MEMORY | SnapshotFlags.MAY_CONTAIN_DUPLICATES
    assert snapshot.marker.may_contain_duplicates
    assert keys(snapshot.items) == [("a", 1), ("b", 2), ("a", 3)]


def test_stream_behind_memory_gets_disk_then_memory_snapshots() -> None:
    vb = new_vbucket()
    write(vb, upsert("a", "1"), upsert("b"))
    write(vb, upsert("a", "2"))
    vb.evict_checkpoints()
    write(vb, upsert("c"))
    cursor = vb.open_cursor(0)
    # The backfill covers everything up to the high seqno when it starts, in-memory or not.
    (disk,) = snapshots(cursor)
    assert disk.marker.flags == DISK
    assert (disk.marker.start_seqno, disk.marker.end_seqno) == (0, 4)
    assert keys(disk.items) == [("b", 2), ("a", 3), ("c", 4)]
    write(vb, upsert("a", "3"))
    write(vb, upsert("d"))
    served = snapshots(cursor)
    assert [s.marker.flags for s in served] == [MEMORY, MEMORY]
    assert [(s.marker.start_seqno, s.marker.end_seqno) for s in served] == [(5, 5), (6, 6)]


def test_stream_resuming_inside_memory_starts_at_its_seqno() -> None:
    vb = new_vbucket()
    write(vb, upsert("a"), upsert("b"), upsert("c"))
    write(vb, upsert("d"))
    served = snapshots(vb.open_cursor(1))
    assert [(s.marker.start_seqno, s.marker.end_seqno) for s in served] == [(1, 3), (4, 4)]
    assert keys(served[0].items) == [("b", 2), ("c", 3)]


def test_checkpoints_are_expelled_whole_beyond_their_capacity() -> None:
    vb = new_vbucket(checkpoint_max_items=4)
    write(vb, upsert("a"), upsert("b"))
    write(vb, upsert("c"), upsert("d"))
    assert vb.memory_low_seqno == 0
    write(vb, upsert("e"), upsert("f"), upsert("g"))
    assert vb.memory_low_seqno == 4  # batch [1, 2] and [3, 4] are gone; [5, 7] fits
    (disk,) = snapshots(vb.open_cursor(3))
    assert (disk.marker.flags, disk.marker.end_seqno) == (DISK, 7)
    (memory,) = snapshots(vb.open_cursor(4))
    assert (memory.marker.flags, memory.marker.start_seqno, memory.marker.end_seqno) == (
        MEMORY,
        4,
        7,
    )


def test_cursor_stops_at_its_end_seqno_with_stream_end_ok() -> None:
    vb = new_vbucket()
    write(vb, upsert("a"), upsert("b"))
    write(vb, upsert("c"), upsert("d"))
    drained = drain(vb.open_cursor(0, end_seqno=3))
    assert isinstance(drained[-1], StreamEnd) and drained[-1].reason is StreamEndReason.OK
    snaps = [s for s in drained if isinstance(s, Snapshot)]
    assert [(s.marker.start_seqno, s.marker.end_seqno) for s in snaps] == [(0, 2), (3, 3)]
    assert keys(snaps[1].items) == [("c", 3)]


def test_cursor_waits_for_the_end_seqno_before_ending() -> None:
    vb = new_vbucket()
    write(vb, upsert("a"))
    cursor = vb.open_cursor(0, end_seqno=2)
    assert len(snapshots(cursor)) == 1
    assert cursor.next_snapshot() is None and not cursor.finished
    write(vb, upsert("b"))
    drained = drain(cursor)
    assert isinstance(drained[-1], StreamEnd) and drained[-1].reason is StreamEndReason.OK
    assert cursor.next_snapshot() is None


def test_closed_cursor_serves_nothing() -> None:
    vb = new_vbucket()
    write(vb, upsert("a"))
    cursor = vb.open_cursor(0)
    cursor.close()
    assert cursor.next_snapshot() is None
    assert not cursor.has_pending()


def test_open_cursor_rejects_start_beyond_high_seqno() -> None:
    vb = new_vbucket()
    write(vb, upsert("a"))
    with pytest.raises(ValueError, match="beyond the high seqno 1"):
        vb.open_cursor(2)


def test_wait_for_items_wakes_on_a_write_from_another_thread() -> None:
    vb = new_vbucket()
    cursor = vb.open_cursor(0)
    assert cursor.wait_for_items(timeout=0.01) is False
    writer = threading.Thread(target=write, args=(vb, upsert("a")))
    with vb.lock:
        writer.start()  # it can only write once wait_for releases the lock
        assert cursor.wait_for_items(timeout=10)
    writer.join()
    (snapshot,) = snapshots(cursor)
    assert keys(snapshot.items) == [("a", 1)]


def test_reader_and_writer_threads_agree_on_the_final_state() -> None:
    vb = new_vbucket()
    cursor = vb.open_cursor(0)
    mirror: dict[bytes, bytes] = {}
    done = threading.Event()

    def read() -> None:
        while True:
            served = cursor.next_snapshot(7)
            if served is None:
                if done.is_set() and cursor.position == vb.high_seqno:
                    return
                cursor.wait_for_items(timeout=0.05)
                continue
            assert isinstance(served, ServedSnapshot)
            for item in served.items:
                if isinstance(item, Mutation):
                    mirror[item.key] = item.value
                else:
                    mirror.pop(item.key if not isinstance(item, SystemEvent) else b"", None)

    reader = threading.Thread(target=read)
    reader.start()
    rng = random.Random(9)
    for round_number in range(300):
        key = f"k{rng.randrange(20)}"
        live = {d.key.decode() for d in vb.documents()}
        op = delete(key) if key in live and rng.random() < 0.3 else upsert(key, str(round_number))
        write(vb, op)
        if round_number == 150:
            vb.evict_checkpoints()
    done.set()
    with vb.lock:
        vb.lock.notify_all()
    reader.join(timeout=20)
    assert not reader.is_alive()
    assert mirror == {d.key: d.value for d in vb.documents()}


# -- purge -------------------------------------------------------------------------------


def test_purged_tombstones_are_not_served_but_live_documents_are() -> None:
    vb = new_vbucket()
    write(vb, upsert("a"), upsert("b"), upsert("c"))
    write(vb, delete("a"))
    write(vb, delete("b"))
    assert vb.purge_tombstones(4) == 4
    (snapshot,) = snapshots(vb.open_cursor(0))
    assert keys(snapshot.items) == [("c", 3), ("b", 5)]  # a's tombstone is gone, b's is not


def test_purge_seqno_forces_rollback_to_zero_of_consumers_behind_it() -> None:
    vb = new_vbucket()
    write(vb, upsert("a"), upsert("b"))
    write(vb, delete("a"))
    uuid = vb.failover_log().newest.vbucket_uuid
    vb.purge_tombstones()
    behind = vb.stream_request(StreamRequest(2, 2**64 - 1, uuid, 2, 2))
    assert isinstance(behind, StreamRollback) and behind.rollback_seqno == 0
    at_purge = vb.stream_request(StreamRequest(3, 2**64 - 1, uuid, 3, 3))
    assert isinstance(at_purge, StreamAccepted)


def test_purge_beyond_high_seqno_is_refused() -> None:
    vb = new_vbucket()
    write(vb, upsert("a"))
    with pytest.raises(ValueError, match="high seqno is 1"):
        vb.purge_tombstones(2)


# -- expiry ------------------------------------------------------------------------------


def test_expired_document_is_a_mutation_until_the_pager_runs() -> None:
    vb = new_vbucket()
    write(vb, upsert("old", expiry=NOW_S - 10), upsert("later", expiry=NOW_S + 100))
    write(vb, upsert("forever"))
    (early,) = snapshots(vb.open_cursor(0))[:1]
    assert isinstance(early.items[0], Mutation) and early.items[0].expiration == NOW_S - 10
    assert {d.key for d in vb.documents()} == {b"old", b"later", b"forever"}

    (expiration,) = vb.run_expiry_pager(NOW_S)
    assert isinstance(expiration, Expiration)
    assert (expiration.key, expiration.by_seqno, expiration.rev_seqno) == (b"old", 4, 2)
    assert expiration.delete_time == NOW_S
    assert {d.key for d in vb.documents()} == {b"later", b"forever"}
    assert vb.run_expiry_pager(NOW_S) == ()  # nothing left that is due


def test_pager_expirations_are_a_memory_snapshot_of_their_own() -> None:
    vb = new_vbucket()
    write(vb, upsert("x", expiry=NOW_S + 5), upsert("y", expiry=NOW_S + 6))
    cursor = vb.open_cursor(2)
    assert len(vb.run_expiry_pager(NOW_S + 10)) == 2
    (snapshot,) = snapshots(cursor)
    assert snapshot.marker.flags == MEMORY
    assert [type(i) for i in snapshot.items] == [Expiration, Expiration]
    assert keys(snapshot.items) == [("x", 3), ("y", 4)]


def test_touch_moves_the_expiry_and_expire_writes_an_expiration() -> None:
    vb = new_vbucket()
    write(vb, upsert("a", "body", expiry=NOW_S - 1))
    (touched,) = write(vb, DocumentWrite(WriteKind.TOUCH, 0, b"a", expiry=NOW_S + 60))
    assert isinstance(touched, Mutation)
    assert (touched.value, touched.expiration, touched.rev_seqno) == (b"body", NOW_S + 60, 2)
    assert vb.run_expiry_pager(NOW_S) == ()
    (expired,) = write(vb, DocumentWrite(WriteKind.EXPIRE, 0, b"a"))
    assert isinstance(expired, Expiration)
    assert vb.documents() == []
    assert vb.run_expiry_pager(NOW_S + 120) == ()


def test_expiration_as_deletion_keeps_seqno_revision_and_time() -> None:
    vb = new_vbucket()
    write(vb, upsert("a", expiry=NOW_S))
    (expiration,) = vb.run_expiry_pager(NOW_S)
    deletion = expiration_as_deletion(expiration)
    assert isinstance(deletion, Deletion)
    assert (deletion.by_seqno, deletion.rev_seqno, deletion.cas, deletion.delete_time) == (
        expiration.by_seqno,
        expiration.rev_seqno,
        expiration.cas,
        expiration.delete_time,
    )


# -- failover ----------------------------------------------------------------------------


def test_failover_truncates_and_restores_previous_versions() -> None:
    vb = new_vbucket()
    write(vb, upsert("a", "1"), upsert("b", "1"))
    write(vb, upsert("a", "2"))
    write(vb, delete("b"))
    write(vb, upsert("c", "1"))
    old_log = vb.failover_log()
    entry = vb.failover(lose_last=3)
    assert vb.high_seqno == 2
    assert [(d.key, d.value) for d in vb.documents()] == [(b"a", b"1"), (b"b", b"1")]
    assert vb.failover_log().entries == (entry, *old_log.entries)
    assert entry.seqno == 2 and entry.vbucket_uuid != old_log.newest.vbucket_uuid
    # The restored versions are the latest again: a backfill serves them.
    vb.evict_checkpoints()
    (snapshot,) = snapshots(vb.open_cursor(0))
    assert keys(snapshot.items) == [("a", 1), ("b", 2)]


def test_writes_after_failover_diverge_from_the_lost_branch() -> None:
    vb = new_vbucket()
    write(vb, upsert("a", "1"))
    (lost,) = write(vb, upsert("a", "2"))
    vb.failover(lose_last=1)
    (replacement,) = write(vb, upsert("a", "3"))
    assert replacement.by_seqno == lost.by_seqno == 2
    assert isinstance(replacement, Mutation) and replacement.value == b"3"
    assert replacement.rev_seqno == 2  # continues from the restored version
    assert isinstance(lost, Mutation) and replacement.cas > lost.cas


def test_failover_ends_open_cursors_with_state_changed() -> None:
    vb = new_vbucket()
    write(vb, upsert("a"))
    cursor = vb.open_cursor(0)
    vb.failover(lose_last=1)
    assert cursor.has_pending()
    end = cursor.next_snapshot()
    assert end == StreamEnd(3, StreamEndReason.STATE_CHANGED)
    assert cursor.next_snapshot() is None


def test_consumer_of_the_lost_branch_is_told_to_roll_back_to_the_branch_point() -> None:
    vb = new_vbucket()
    write(vb, upsert("a"), upsert("b"))
    write(vb, upsert("c"))
    old_uuid = vb.failover_log().newest.vbucket_uuid
    vb.failover(lose_last=1)
    decision = vb.stream_request(StreamRequest(3, 2**64 - 1, old_uuid, 3, 3))
    assert isinstance(decision, StreamRollback) and decision.rollback_seqno == 2


def test_failover_restores_expiry_tracking_and_collections() -> None:
    vb = new_vbucket()
    write(vb, upsert("a", expiry=NOW_S - 1))
    vb.run_expiry_pager(NOW_S)
    drop = ManifestChange(0, SystemEventType.COLLECTION_DROPPED, 1, 0, 8, "")
    write(vb, upsert("x", cid=8))
    vb.apply_manifest_changes([drop])
    assert vb.manifest_events_applied == 1
    vb.failover(lose_last=3)  # loses the drop, the write to 8 and the expiration
    assert vb.manifest_events_applied == 0
    assert [d.key for d in vb.documents()] == [b"a"]
    (expiration,) = vb.run_expiry_pager(NOW_S)
    assert expiration.key == b"a"


def test_failover_that_undoes_a_collection_drop_revives_its_documents() -> None:
    vb = new_vbucket()
    write(vb, upsert("x", cid=8, expiry=NOW_S - 1))
    vb.apply_manifest_changes([ManifestChange(0, SystemEventType.COLLECTION_DROPPED, 1, 0, 8, "")])
    assert vb.documents() == [] and vb.run_expiry_pager(NOW_S) == ()
    vb.failover(lose_last=1)
    assert [d.key for d in vb.documents()] == [b"x"]
    assert [e.key for e in vb.run_expiry_pager(NOW_S)] == [b"x"]


def test_failover_rejects_losing_more_than_it_has() -> None:
    vb = new_vbucket()
    write(vb, upsert("a"))
    with pytest.raises(ValueError, match=r"0\.\.1"):
        vb.failover(lose_last=2)


# -- collections -------------------------------------------------------------------------


def test_dropped_collection_items_leave_backfills_and_documents() -> None:
    vb = new_vbucket()
    create = ManifestChange(0, SystemEventType.COLLECTION_CREATED, 1, 0, 8, "c")
    drop = ManifestChange(1, SystemEventType.COLLECTION_DROPPED, 2, 0, 8, "")
    vb.apply_manifest_changes([create])
    write(vb, upsert("in8", cid=8), upsert("in0"))
    live_cursor = vb.open_cursor(0)
    before = snapshots(live_cursor)
    vb.apply_manifest_changes([drop])
    assert [d.key for d in vb.documents()] == [b"in0"]
    # A consumer streaming live saw the items, then the drop.
    assert keys(before[1].items) == [("in8", 2), ("in0", 3)]
    (drop_snapshot,) = snapshots(live_cursor)
    (event,) = drop_snapshot.items
    assert isinstance(event, SystemEvent) and event.event is SystemEventType.COLLECTION_DROPPED
    # A backfill after the drop has neither the items nor the creation, only the drop.
    vb.evict_checkpoints()
    (backfill,) = snapshots(vb.open_cursor(0))
    assert [type(i).__name__ for i in backfill.items] == ["Mutation", "SystemEvent"]
    assert keys(backfill.items) == [("in0", 3), ("", 4)]
    with pytest.raises(ValueError, match="dropped"):
        write(vb, upsert("late", cid=8))
