"""Snapshot assembly: completion rules (NOTES section 4), OSO, validation, discard."""

from __future__ import annotations

from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicator.dcp.protocol.events import (
    Deletion,
    Expiration,
    ItemEvent,
    Mutation,
    OsoFlags,
    OsoSnapshot,
    RollbackRequired,
    SeqnoAdvanced,
    SnapshotFlags,
    SnapshotMarker,
    StreamEnd,
    StreamEndReason,
    StreamOpened,
    SystemEvent,
    SystemEventType,
)
from replicator.errors import ProtocolError
from replicator.model.positions import FailoverLog
from replicator.staging.assembly import CompleteSnapshot, Completion, SnapshotAssembler
from tests.dcp.runs import read_runs

VB = 12


def marker(
    start: int,
    end: int,
    flags: SnapshotFlags = SnapshotFlags.MEMORY,
    *,
    vbucket: int = VB,
    purge_seqno: int | None = None,
) -> SnapshotMarker:
    return SnapshotMarker(vbucket, start, end, flags, purge_seqno=purge_seqno)


def mutation(seqno: int, key: bytes = b"k", *, vbucket: int = VB) -> Mutation:
    return Mutation(vbucket, seqno, 1, 1000 + seqno, 0, 0, 0, 0, key, b"{}", True)


def system_event(
    seqno: int,
    event: SystemEventType = SystemEventType.COLLECTION_CREATED,
    *,
    collection_id: int | None = 8,
    manifest_uid: int = 3,
) -> SystemEvent:
    return SystemEvent(VB, seqno, event, 0, "orders", manifest_uid, 0, collection_id)


def feed_all(assembler: SnapshotAssembler, events: list[object]) -> list[CompleteSnapshot]:
    done = []
    for event in events:
        result = assembler.feed(event)  # type: ignore[arg-type]
        if result is not None:
            done.append(result)
    return done


def test_item_at_end_seqno_completes_the_snapshot() -> None:
    assembler = SnapshotAssembler()
    assert assembler.feed(marker(1, 3)) is None
    assert assembler.feed(mutation(1, b"a")) is None
    assert assembler.feed(mutation(2, b"b")) is None
    assert assembler.has_partial(VB)
    done = assembler.feed(mutation(3, b"c"))
    assert done is not None
    assert (done.vbucket, done.start_seqno, done.end_seqno) == (VB, 1, 3)
    assert done.flags == SnapshotFlags.MEMORY
    assert [item.by_seqno for item in done.items] == [1, 2, 3]
    assert done.item_count == 3
    assert done.completed_by is Completion.END_ITEM
    assert not assembler.has_partial(VB)
    assert assembler.high_completed_end(VB) == 3


@pytest.mark.parametrize(
    "last_item",
    [
        Deletion(VB, 9, 2, 77, 0, b"gone"),
        Expiration(VB, 9, 2, 77, 0, b"old", 1_700_000_000),
        SystemEvent(VB, 9, SystemEventType.SCOPE_CREATED, 0, "s", 4, 8, None),
        SeqnoAdvanced(VB, 9),
    ],
    ids=["deletion", "expiration", "system-event", "seqno-advanced"],
)
def test_every_item_kind_at_end_seqno_completes(last_item: ItemEvent) -> None:
    assembler = SnapshotAssembler()
    assembler.feed(marker(5, 9))
    done = assembler.feed(last_item)
    assert done is not None and done.end_seqno == 9
    assert done.items == (last_item,)


def test_deduplicated_first_items_do_not_block_completion() -> None:
    # Items 10..13 were deduplicated away: the snapshot starts with 14.
    assembler = SnapshotAssembler()
    done = feed_all(assembler, [marker(10, 15), mutation(14), mutation(15)])
    assert len(done) == 1
    assert (done[0].start_seqno, done[0].end_seqno) == (10, 15)
    assert [item.by_seqno for item in done[0].items] == [14, 15]


def test_missing_last_item_is_completed_by_the_next_marker() -> None:
    assembler = SnapshotAssembler()
    assert feed_all(assembler, [marker(1, 10), mutation(3), mutation(7)]) == []
    done = assembler.feed(marker(11, 20))
    assert done is not None
    assert (done.start_seqno, done.end_seqno) == (1, 10)
    assert done.completed_by is Completion.NEXT_MARKER
    assert [item.by_seqno for item in done.items] == [3, 7]
    # The new marker's snapshot is open and takes items of its own range.
    assert assembler.has_partial(VB)
    assert assembler.feed(mutation(20)) is not None


def test_empty_snapshot_is_completed_by_the_next_marker() -> None:
    assembler = SnapshotAssembler()
    assembler.feed(marker(1, 4))
    done = assembler.feed(marker(5, 8))
    assert done is not None and (done.end_seqno, done.item_count, done.items) == (4, 0, ())


def test_stream_end_ok_completes_the_open_snapshot() -> None:
    assembler = SnapshotAssembler()
    feed_all(assembler, [marker(1, 50, SnapshotFlags.DISK), mutation(20)])
    done = assembler.feed(StreamEnd(VB, StreamEndReason.OK))
    assert done is not None
    assert (done.end_seqno, done.completed_by) == (50, Completion.STREAM_END)
    assert assembler.high_completed_end(VB) == 50


@pytest.mark.parametrize(
    "reason", [reason for reason in StreamEndReason if reason is not StreamEndReason.OK]
)
def test_stream_end_for_other_reasons_drops_the_partial(reason: StreamEndReason) -> None:
    assembler = SnapshotAssembler()
    feed_all(assembler, [marker(1, 5), mutation(5), marker(6, 10), mutation(7)])
    assert assembler.feed(StreamEnd(VB, reason)) is None
    assert not assembler.has_partial(VB)
    assert assembler.high_completed_end(VB) == 5
    # The half-received snapshot is gone: a later marker completes nothing.
    assert assembler.feed(marker(6, 12)) is None
    with pytest.raises(ProtocolError, match="outside any snapshot"):
        feed_all(assembler, [StreamEnd(VB, StreamEndReason.CLOSED), mutation(8)])


def test_stream_end_without_open_snapshot_completes_nothing() -> None:
    assembler = SnapshotAssembler()
    feed_all(assembler, [marker(1, 2), mutation(2)])
    assert assembler.feed(StreamEnd(VB, StreamEndReason.OK)) is None


def test_may_contain_duplicates_snapshot_keeps_every_version() -> None:
    assembler = SnapshotAssembler()
    flags = SnapshotFlags.DISK | SnapshotFlags.HISTORY | SnapshotFlags.MAY_CONTAIN_DUPLICATES
    done = feed_all(
        assembler, [marker(1, 4, flags), mutation(1, b"a"), mutation(2, b"a"), mutation(4, b"a")]
    )
    assert len(done) == 1
    assert done[0].flags & SnapshotFlags.MAY_CONTAIN_DUPLICATES
    assert [(item.key, item.by_seqno) for item in done[0].items if isinstance(item, Mutation)] == [
        (b"a", 1),
        (b"a", 2),
        (b"a", 4),
    ]


def test_item_before_any_marker_is_rejected() -> None:
    with pytest.raises(ProtocolError, match=f"vbucket {VB}: Mutation seqno 3 arrived outside"):
        SnapshotAssembler().feed(mutation(3))


@pytest.mark.parametrize("seqno", [4, 11])
def test_item_outside_the_marker_range_is_rejected(seqno: int) -> None:
    assembler = SnapshotAssembler()
    assembler.feed(marker(5, 10))
    with pytest.raises(ProtocolError, match=r"outside the open snapshot \[5, 10\]") as caught:
        assembler.feed(mutation(seqno))
    assert caught.value.opcode == 0x57


@pytest.mark.parametrize("seqno", [6, 7])
def test_item_going_backwards_or_repeating_is_rejected_and_changes_nothing(seqno: int) -> None:
    assembler = SnapshotAssembler()
    feed_all(assembler, [marker(5, 10), mutation(7)])
    with pytest.raises(ProtocolError, match="not after the previous item's 7"):
        assembler.feed(mutation(seqno))
    # The rejected item left no trace: the snapshot goes on from 7.
    done = assembler.feed(mutation(10))
    assert done is not None and [item.by_seqno for item in done.items] == [7, 10]


def test_item_after_completion_before_next_marker_is_rejected() -> None:
    assembler = SnapshotAssembler()
    feed_all(assembler, [marker(1, 2), mutation(2)])
    with pytest.raises(ProtocolError, match="outside any snapshot"):
        assembler.feed(mutation(3))


def test_marker_starting_after_its_end_is_rejected() -> None:
    with pytest.raises(ProtocolError, match=r"\[9, 3\] starts after its end") as caught:
        SnapshotAssembler().feed(marker(9, 3))
    assert caught.value.opcode == 0x56


def test_stream_restarted_lower_needs_discard_with_the_resume_seqno() -> None:
    assembler = SnapshotAssembler()
    feed_all(assembler, [marker(1, 100), mutation(100)])
    with pytest.raises(ProtocolError, match="discard"):
        assembler.feed(marker(41, 60))
    with pytest.raises(ProtocolError, match="not above the vbucket's completed end 100"):
        feed_all(assembler, [marker(41, 160), mutation(50)])
    assembler.discard(VB, resume_seqno=40)
    assert assembler.high_completed_end(VB) == 40
    done = feed_all(assembler, [marker(41, 60), mutation(60)])
    assert [snapshot.end_seqno for snapshot in done] == [60]
    with pytest.raises(ProtocolError, match="completed end 60"):
        feed_all(assembler, [marker(60, 70), mutation(60)])


def test_discard_drops_the_partial_snapshot() -> None:
    assembler = SnapshotAssembler()
    feed_all(assembler, [marker(1, 5), mutation(5), marker(6, 10), mutation(6)])
    assembler.discard(VB, resume_seqno=5)
    assert not assembler.has_partial(VB)
    # Items of the dropped snapshot are no longer accepted; a new marker completes nothing.
    with pytest.raises(ProtocolError):
        assembler.feed(mutation(7))
    assert assembler.feed(marker(6, 10)) is None
    done = assembler.feed(mutation(10))
    assert done is not None and [item.by_seqno for item in done.items] == [10]


def test_discard_without_resume_seqno_forgets_the_ordering() -> None:
    assembler = SnapshotAssembler()
    feed_all(assembler, [marker(1, 100), mutation(100)])
    assembler.discard(VB)
    assert assembler.high_completed_end(VB) is None
    assert feed_all(assembler, [marker(0, 3), mutation(3)])[0].end_seqno == 3


def test_stream_opened_drops_a_stale_partial() -> None:
    assembler = SnapshotAssembler()
    feed_all(assembler, [marker(1, 5), mutation(5), marker(6, 10), mutation(6)])
    assembler.feed(StreamOpened(VB, FailoverLog.of([(0xAB, 0)])))
    assert not assembler.has_partial(VB)
    assert assembler.high_completed_end(VB) == 5
    # Without the drop, this marker would wrongly complete [6, 10] with only item 6.
    assert assembler.feed(marker(6, 10)) is None


def test_rollback_required_drops_partial_and_forgets_the_completed_end() -> None:
    assembler = SnapshotAssembler()
    feed_all(assembler, [marker(1, 5), mutation(5), marker(6, 10), mutation(6)])
    assembler.feed(RollbackRequired(VB, 3))
    assert not assembler.has_partial(VB)
    assert assembler.high_completed_end(VB) is None


def test_vbuckets_are_assembled_independently() -> None:
    assembler = SnapshotAssembler()
    events: list[object] = [
        marker(1, 3, vbucket=1),
        marker(1, 2, vbucket=2),
        mutation(2, vbucket=2),
        mutation(3, vbucket=1),
    ]
    done = feed_all(assembler, events)
    assert [(snapshot.vbucket, snapshot.end_seqno) for snapshot in done] == [(2, 2), (1, 3)]


def test_keep_items_false_counts_but_does_not_hold_items() -> None:
    assembler = SnapshotAssembler(keep_items=False)
    done = feed_all(assembler, [marker(1, 3), mutation(1), mutation(3)])
    assert done[0].items == ()
    assert done[0].item_count == 2


def test_snapshot_carries_purge_seqno_manifest_uid_and_dropped_collections() -> None:
    assembler = SnapshotAssembler()
    events: list[object] = [
        marker(1, 3, SnapshotFlags.DISK, purge_seqno=17),
        system_event(1, SystemEventType.COLLECTION_CREATED, collection_id=9, manifest_uid=4),
        system_event(2, SystemEventType.COLLECTION_DROPPED, collection_id=8, manifest_uid=5),
        mutation(3),
        marker(4, 5),
        mutation(5),
    ]
    first, second = feed_all(assembler, events)
    assert (first.purge_seqno, first.manifest_uid, first.dropped_collection_ids) == (17, 5, (8,))
    # The manifest uid is the vbucket's, so it carries over to later snapshots.
    assert (second.purge_seqno, second.manifest_uid, second.dropped_collection_ids) == (
        None,
        5,
        (),
    )


def test_oso_snapshot_completes_at_end_with_the_highest_seqno_seen() -> None:
    assembler = SnapshotAssembler()
    assembler.discard(VB, resume_seqno=0)
    events: list[object] = [
        OsoSnapshot(VB, OsoFlags.START),
        mutation(7, b"a"),
        mutation(3, b"b"),
        mutation(12, b"c"),
        mutation(5, b"d"),
        SeqnoAdvanced(VB, 15),
    ]
    assert feed_all(assembler, events) == []
    assert assembler.has_partial(VB)
    done = assembler.feed(OsoSnapshot(VB, OsoFlags.END))
    assert done is not None
    assert (done.start_seqno, done.end_seqno) == (0, 15)
    assert done.is_oso and done.completed_by is Completion.OSO_END
    assert done.flags & SnapshotFlags.DISK
    assert [item.by_seqno for item in done.items] == [7, 3, 12, 5, 15]
    assert assembler.high_completed_end(VB) == 15
    # Memory snapshots follow, above the OSO end.
    assert feed_all(assembler, [marker(16, 16), mutation(16)])[0].end_seqno == 16


def test_oso_start_without_known_resume_point_uses_the_lowest_seqno() -> None:
    assembler = SnapshotAssembler()
    done = feed_all(
        assembler,
        [OsoSnapshot(VB, OsoFlags.START), mutation(9), mutation(4), OsoSnapshot(VB, OsoFlags.END)],
    )
    assert (done[0].start_seqno, done[0].end_seqno) == (4, 9)


def test_oso_items_must_lie_above_the_resume_point() -> None:
    assembler = SnapshotAssembler()
    assembler.discard(VB, resume_seqno=10)
    assembler.feed(OsoSnapshot(VB, OsoFlags.START))
    with pytest.raises(ProtocolError, match="completed end 10"):
        assembler.feed(mutation(10))


def test_empty_oso_snapshot_completes_nothing() -> None:
    assembler = SnapshotAssembler()
    assert assembler.feed(OsoSnapshot(VB, OsoFlags.START)) is None
    assert assembler.feed(OsoSnapshot(VB, OsoFlags.END)) is None
    assert not assembler.has_partial(VB)


@pytest.mark.parametrize(
    ("events", "message"),
    [
        ([OsoSnapshot(VB, OsoFlags.END)], "OSO snapshot end without an OSO start"),
        ([OsoSnapshot(VB, OsoFlags.START), marker(1, 2)], "inside an OSO snapshot"),
        ([OsoSnapshot(VB, OsoFlags.START)] * 2, "OSO snapshot start while an OSO snapshot"),
        ([marker(1, 2), OsoSnapshot(VB, OsoFlags.START)], "OSO snapshot start while a snapshot"),
        (
            [OsoSnapshot(VB, OsoFlags.START), StreamEnd(VB, StreamEndReason.OK)],
            "ended OK inside an OSO snapshot",
        ),
        ([OsoSnapshot(VB, OsoFlags(0))], "neither start nor end"),
    ],
)
def test_inconsistent_oso_sequences_are_rejected(events: list[object], message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        feed_all(SnapshotAssembler(), events)


def test_oso_snapshot_interrupted_by_a_failed_stream_is_dropped() -> None:
    assembler = SnapshotAssembler()
    assembler.discard(VB, resume_seqno=0)
    feed_all(assembler, [OsoSnapshot(VB, OsoFlags.START), mutation(8)])
    assert assembler.feed(StreamEnd(VB, StreamEndReason.BACKFILL_FAILED)) is None
    assert not assembler.has_partial(VB)
    assert assembler.high_completed_end(VB) == 0


def test_negative_resume_seqno_is_rejected() -> None:
    with pytest.raises(ValueError, match="negative"):
        SnapshotAssembler().discard(VB, resume_seqno=-1)


_STEPS = st.one_of(
    st.tuples(st.just("marker"), st.integers(0, 30), st.integers(0, 30)),
    st.tuples(st.just("items"), st.lists(st.integers(1, 30), min_size=1, max_size=6)),
    st.tuples(st.just("oso"), st.sampled_from([OsoFlags.START, OsoFlags.END])),
    st.tuples(st.just("end"), st.sampled_from([StreamEndReason.OK, StreamEndReason.TOO_SLOW])),
)


def _outcomes(steps: list[tuple[object, ...]], *, runs: bool) -> list[object]:
    """What the assembler says step by step: snapshots completed (without items), then the
    first error's text. A step that fails completes nothing (a run fails whole)."""
    assembler = SnapshotAssembler(keep_items=False)
    said: list[object] = []
    try:
        for step in steps:
            done_in_step: list[object] = []
            kind = step[0]
            if kind == "items":
                items = [mutation(seqno) for seqno in cast(list[int], step[1])]
                fed: list[object] = list(read_runs(items)) if runs else list(items)
            elif kind == "marker":
                fed = [marker(cast(int, step[1]), cast(int, step[2]))]
            elif kind == "oso":
                fed = [OsoSnapshot(VB, cast(OsoFlags, step[1]))]
            else:
                fed = [StreamEnd(VB, cast(StreamEndReason, step[1]))]
            for event in fed:
                done = assembler.feed(event)  # type: ignore[arg-type]
                if done is not None:
                    done_in_step.append(done)
            said.extend(done_in_step)
    except ProtocolError as exc:
        said.append(str(exc))
    return said


@settings(max_examples=400, deadline=None)
@given(steps=st.lists(_STEPS, max_size=12))
def test_runs_of_items_are_assembled_exactly_as_the_items_one_by_one(
    steps: list[tuple[object, ...]],
) -> None:
    """A DocumentChanges run is checked as a whole; whatever the sequence (in order or not,
    inside the snapshot or not, OSO or not), it completes the same snapshots and fails with
    the same error as its items fed one by one."""
    assert _outcomes(steps, runs=True) == _outcomes(steps, runs=False)


def test_a_run_ending_at_the_end_seqno_completes_the_snapshot() -> None:
    assembler = SnapshotAssembler(keep_items=False)
    assembler.feed(marker(1, 4))
    [run] = read_runs([mutation(2), mutation(3), mutation(4)])
    done = assembler.feed(run)
    assert done is not None
    assert (done.start_seqno, done.end_seqno, done.item_count) == (1, 4, 3)
    assert done.completed_by is Completion.END_ITEM


DISK = SnapshotFlags.DISK | SnapshotFlags.CHECKPOINT
DISK_HISTORY = DISK | SnapshotFlags.HISTORY | SnapshotFlags.MAY_CONTAIN_DUPLICATES


def test_a_history_marker_of_the_same_range_continues_a_backfill_as_its_history_part() -> None:
    assembler = SnapshotAssembler()
    assert assembler.feed(marker(1, 9, DISK)) is None
    assert assembler.feed(mutation(2, b"a")) is None
    assert assembler.feed(mutation(4, b"b")) is None
    assert assembler.feed(marker(1, 9, DISK_HISTORY)) is None  # not a new snapshot
    assert assembler.feed(mutation(5, b"c")) is None
    assert assembler.feed(mutation(7, b"c")) is None  # a key repeats in the history part
    done = assembler.feed(mutation(9, b"c"))
    assert done is not None
    assert (done.start_seqno, done.end_seqno, done.item_count) == (1, 9, 5)
    assert done.flags == DISK_HISTORY and done.history_from == 5


def test_a_history_backfill_without_a_deduplicated_part_is_history_from_its_start() -> None:
    assembler = SnapshotAssembler()
    assembler.feed(marker(3, 4, DISK_HISTORY))
    assembler.feed(mutation(3))
    done = assembler.feed(mutation(4))
    assert done is not None and done.history_from == 3


def test_a_second_marker_that_is_not_a_history_part_still_ends_the_open_snapshot() -> None:
    assembler = SnapshotAssembler()
    assembler.feed(marker(1, 9, DISK))
    assembler.feed(mutation(2))
    # Another range: kv_engine's "next marker completes the previous snapshot" rule holds.
    done = assembler.feed(marker(10, 12, SnapshotFlags.MEMORY | SnapshotFlags.HISTORY))
    assert done is not None and done.completed_by is Completion.NEXT_MARKER
    assert done.history_from is None
