"""The failover table and the producer's stream-request decision, case by case.

Case names follow spec/seeds/rollback.txt (kv_engine's rollback.md) and NOTES.md section 5.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from replicator.model.positions import MAX_SEQNO, FailoverEntry
from replicator.sim.failover_table import (
    FailoverTable,
    StreamAccepted,
    StreamDecision,
    StreamRangeError,
    StreamRequest,
    StreamRollback,
    decide_stream_request,
    new_vbucket_uuid,
)

OLD, MIDDLE, NEW = 0xA1, 0xB2, 0xC3


def three_branches() -> FailoverTable:
    """Branches at 0 (OLD), 100 (MIDDLE) and 200 (NEW); the producer's high seqno is 300."""
    return FailoverTable(
        [FailoverEntry(NEW, 200), FailoverEntry(MIDDLE, 100), FailoverEntry(OLD, 0)]
    )


def request(
    start: int,
    uuid: int,
    snap_start: int | None = None,
    snap_end: int | None = None,
    *,
    end: int = MAX_SEQNO,
    strict: bool = False,
    ignore_purged: bool = False,
) -> StreamRequest:
    return StreamRequest(
        start_seqno=start,
        end_seqno=end,
        vbucket_uuid=uuid,
        snap_start_seqno=start if snap_start is None else snap_start,
        snap_end_seqno=start if snap_end is None else snap_end,
        strict_vb_uuid=strict,
        ignore_purged_tombstones=ignore_purged,
    )


def decide(req: StreamRequest, *, high: int = 300, purge: int = 0) -> StreamDecision:
    return decide_stream_request(req, three_branches(), high, purge)


def rollback_seqno(decision: StreamDecision) -> int:
    assert isinstance(decision, StreamRollback), decision
    return decision.rollback_seqno


# -- the failover table ------------------------------------------------------------------


def test_new_table_has_one_random_nonzero_entry_at_zero() -> None:
    first = FailoverTable.new(random.Random(1)).log()
    second = FailoverTable.new(random.Random(2)).log()
    assert [e.seqno for e in first.entries] == [0]
    assert first.newest.vbucket_uuid != 0
    assert first.newest.vbucket_uuid != second.newest.vbucket_uuid
    assert first.newest.vbucket_uuid < 1 << 48


def test_failover_puts_new_branch_in_front() -> None:
    table = FailoverTable([FailoverEntry(OLD, 0)])
    entry = table.failover(42, random.Random(3))
    assert table.log().entries == (entry, FailoverEntry(OLD, 0))
    assert entry.seqno == 42
    assert entry.vbucket_uuid not in (0, OLD)


def test_failover_drops_branches_above_the_new_high_seqno() -> None:
    table = three_branches()
    entry = table.failover(150, random.Random(4))
    assert [e.seqno for e in table] == [150, 100, 0]
    assert table.newest == entry


def test_table_keeps_at_most_25_entries() -> None:
    table = FailoverTable([FailoverEntry(OLD, 0)])
    rng = random.Random(5)
    for high in range(1, 40):
        table.failover(high, rng)
    seqnos = [e.seqno for e in table]
    assert len(seqnos) == 25
    assert seqnos == list(range(39, 14, -1))


class _ZeroFirst(random.Random):
    """A generator whose first draw is 0, the uuid that must never be used."""

    def __init__(self) -> None:
        super().__init__(6)
        self.draws = 0

    def getrandbits(self, k: int, /) -> int:
        self.draws += 1
        return 0 if self.draws == 1 else super().getrandbits(k)


def test_uuid_zero_is_never_generated() -> None:
    rng = _ZeroFirst()
    assert new_vbucket_uuid(rng) != 0
    assert rng.draws == 2


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([], "at least one entry"),
        ([FailoverEntry(0, 0)], "uuid 0"),
        ([FailoverEntry(OLD, 0), FailoverEntry(NEW, 10)], "newest first"),
    ],
)
def test_table_rejects_malformed_entries(entries: list[FailoverEntry], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FailoverTable(entries)


def test_upper_bound_is_next_newer_entry_or_high_seqno() -> None:
    table = three_branches()
    assert table.upper_bound(OLD, 300) == 100
    assert table.upper_bound(MIDDLE, 300) == 200
    assert table.upper_bound(NEW, 300) == 300
    assert table.upper_bound(0xDEAD, 300) is None


# -- 1. base case ------------------------------------------------------------------------


def test_base_case_a_start_zero_uuid_zero_accepted() -> None:
    decision = decide(request(0, 0))
    assert decision == StreamAccepted(three_branches().log())


def test_base_case_b_start_zero_unknown_uuid_accepted_when_not_strict() -> None:
    assert isinstance(decide(request(0, 0xDEAD)), StreamAccepted)


def test_base_case_b_strict_start_zero_unknown_uuid_rolls_back_to_zero() -> None:
    assert rollback_seqno(decide(request(0, 0xDEAD, strict=True))) == 0


def test_base_case_b_strict_start_zero_known_uuid_accepted() -> None:
    assert isinstance(decide(request(0, OLD, strict=True)), StreamAccepted)


def test_base_case_strict_with_uuid_zero_accepted() -> None:
    assert isinstance(decide(request(0, 0, strict=True)), StreamAccepted)


# -- 2. wild card purge ------------------------------------------------------------------


def test_wild_card_purge_start_below_purge_seqno_rolls_back_to_zero() -> None:
    decision = decide(request(250, NEW), purge=260)
    assert rollback_seqno(decision) == 0


def test_wild_card_purge_start_at_purge_seqno_accepted() -> None:
    assert isinstance(decide(request(260, NEW), purge=260), StreamAccepted)


def test_wild_card_purge_start_zero_accepted() -> None:
    assert isinstance(decide(request(0, NEW), purge=260), StreamAccepted)


def test_wild_card_purge_is_checked_before_the_uuid() -> None:
    # Both the purge and the unknown uuid call for 0; the purge reason must be the one given.
    decision = decide(request(10, 0xDEAD), purge=20)
    assert isinstance(decision, StreamRollback)
    assert "purge" in decision.reason


@pytest.mark.parametrize("purge", [241, 250], ids=["purge-inside-snapshot", "purge-at-start"])
def test_wild_card_purge_compares_start_not_snap_start(purge: int) -> None:
    # snap_start (240) < purge seqno <= start (250). NOTES.md section 5, the project's
    # authority, states rule 2 as "start < purge seqno": everything purged is at or below what
    # the consumer already holds, so no deletion can be missed and no rollback is due. (The
    # kv_engine doc, spec/seeds/rollback.txt, writes "SnapStartSeqno < PurgeSeqno", and older
    # kv_engine compared the adjusted snap start; by that reading this would roll back to 0.)
    # History is shared (NEW up to the high seqno 300, snap end 260 below it): accepted.
    decision = decide(request(250, NEW, snap_start=240, snap_end=260), purge=purge)
    assert isinstance(decision, StreamAccepted), decision


def test_ignore_purged_tombstones_flag_skips_the_purge_rollback() -> None:
    assert isinstance(decide(request(250, NEW, ignore_purged=True), purge=260), StreamAccepted)


def test_ignore_purged_tombstones_still_checks_history() -> None:
    decision = decide(request(250, 0xDEAD, ignore_purged=True), purge=260)
    assert rollback_seqno(decision) == 0


# -- 3. diverging history ----------------------------------------------------------------


def test_diverging_history_unknown_uuid_rolls_back_to_zero() -> None:
    decision = decide(request(150, 0xDEAD))
    assert rollback_seqno(decision) == 0
    assert isinstance(decision, StreamRollback) and "not in the table" in decision.reason


# -- 4. partial / full history -----------------------------------------------------------


def test_full_history_match_lagging_consumer_accepted() -> None:
    # MIDDLE's history is shared up to 200; a consumer at 150 with a whole snapshot resumes.
    assert isinstance(decide(request(150, MIDDLE)), StreamAccepted)


def test_full_history_match_consumer_exactly_at_upper_accepted() -> None:
    assert isinstance(decide(request(200, MIDDLE)), StreamAccepted)


def test_full_history_match_newest_uuid_accepted_up_to_high_seqno() -> None:
    assert isinstance(decide(request(300, NEW)), StreamAccepted)


def test_partial_history_leading_consumer_rolls_back_to_upper() -> None:
    # Consumer on OLD's branch holds [150, 160]; OLD's history ends at 100 on this producer.
    assert rollback_seqno(decide(request(155, OLD, 150, 160))) == 100


def test_partial_history_snapshot_mismatch_rolls_back_to_snap_start() -> None:
    # snap_start (90) <= upper (100) < snap_end (120): redo the snapshot from its start.
    assert rollback_seqno(decide(request(95, OLD, 90, 120))) == 90


def test_adjustment_start_equals_snap_start_treats_snap_end_as_start() -> None:
    # A marker [90, 150] received but no item of it: the consumer really stands at 90.
    assert isinstance(decide(request(90, OLD, 90, 150)), StreamAccepted)


def test_adjustment_start_equals_snap_end_treats_snap_start_as_start() -> None:
    # A whole snapshot [90, 120] received: rollback goes to upper (100), not to snap start 90.
    assert rollback_seqno(decide(request(120, OLD, 90, 120))) == 100


def test_whole_snapshot_consumer_beyond_its_branch_rolls_back_to_the_branch_point() -> None:
    assert rollback_seqno(decide(request(250, MIDDLE))) == 200


def test_consumer_beyond_high_seqno_on_newest_uuid_rolls_back_to_high_seqno() -> None:
    # The producer lost data without a new branch (e.g. warm-up from an older copy).
    assert rollback_seqno(decide(request(350, NEW), high=300)) == 300


# -- ERANGE ------------------------------------------------------------------------------


def test_erange_start_beyond_end() -> None:
    decision = decide(request(50, NEW, end=40))
    assert isinstance(decision, StreamRangeError)
    assert "end seqno 40" in decision.reason


@pytest.mark.parametrize(("snap_start", "snap_end"), [(60, 80), (10, 40)])
def test_erange_start_outside_its_snapshot(snap_start: int, snap_end: int) -> None:
    decision = decide(request(50, NEW, snap_start, snap_end))
    assert isinstance(decision, StreamRangeError)
    assert "snap start" in decision.reason


def test_erange_precedes_rollback_for_a_malformed_request() -> None:
    # kv_engine checks the request's own invariant before looking at the failover table.
    decision = decide(request(50, 0xDEAD, 60, 80))
    assert isinstance(decision, StreamRangeError)


def test_erange_start_beyond_high_seqno() -> None:
    # The newest branch began at 200 but the data behind it is gone (high 150): a consumer
    # on MIDDLE at 180 shares history up to 200, so no rollback, yet 180 is beyond the high.
    decision = decide(request(180, MIDDLE), high=150)
    assert isinstance(decision, StreamRangeError)
    assert "high seqno 150" in decision.reason


# -- property: whole-snapshot consumers only ever go back to branch points ---------------


@dataclass
class Producer:
    """A vbucket reduced to what the decision needs: identities of the items by seqno."""

    table: FailoverTable
    history: list[int] = field(default_factory=list)
    purge_seqno: int = 0
    next_id: int = 0

    @property
    def high(self) -> int:
        return len(self.history)

    def write(self, count: int) -> None:
        for _ in range(count):
            self.next_id += 1
            self.history.append(self.next_id)


@dataclass(frozen=True)
class Checkpoint:
    """A whole-snapshot boundary the consumer committed, with the history it had then."""

    seqno: int
    uuid: int
    items: tuple[int, ...]


steps = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.integers(1, 20)),
        st.tuples(st.just("checkpoint"), st.just(0)),
        st.tuples(st.just("failover"), st.integers(0, 25)),
        st.tuples(st.just("purge"), st.integers(0, 100)),
    ),
    max_size=40,
)


def shared_prefix(left: tuple[int, ...], right: list[int]) -> int:
    length = 0
    for a, b in zip(left, right, strict=False):
        if a != b:
            break
        length += 1
    return length


def resume(producer: Producer, committed: list[Checkpoint]) -> None:
    """Request a stream from the newest checkpoint, rolling back as NOTES.md section 4 says.

    Asserts on every answer; on return `committed[-1]` is the accepted position and the
    checkpoints above it are forgotten, as a consumer that rolled back does.
    """
    branch_points = {0} | {e.seqno for e in producer.table}
    for _ in range(len(committed) + 1):
        checkpoint = committed[-1]
        seqno = checkpoint.seqno
        req = StreamRequest(seqno, MAX_SEQNO, checkpoint.uuid, seqno, seqno)
        decision = decide_stream_request(req, producer.table, producer.high, producer.purge_seqno)
        common = shared_prefix(checkpoint.items, producer.history)
        assert not isinstance(decision, StreamRangeError), decision
        if isinstance(decision, StreamAccepted):
            assert seqno <= common, "accepted a consumer whose history diverged"
            assert seqno == 0 or seqno >= producer.purge_seqno
            return
        assert decision.rollback_seqno in branch_points
        assert decision.rollback_seqno <= common
        event("rollback to zero" if decision.rollback_seqno == 0 else "partial rollback")
        # Back to the newest committed boundary at or below the rollback seqno, requested
        # with the uuid the producer's fresh failover log gives for that seqno.
        while committed[-1].seqno > decision.rollback_seqno:
            committed.pop()
        boundary = committed.pop()
        uuid = producer.table.log().entry_at(boundary.seqno).vbucket_uuid if boundary.seqno else 0
        committed.append(Checkpoint(boundary.seqno, uuid, boundary.items))
    pytest.fail("the consumer never got an accepted stream request")


@settings(max_examples=300, deadline=None)
@given(steps=steps, seed=st.integers(0, 2**32))
def test_whole_snapshot_consumer_rolls_back_only_to_branch_points_or_zero(
    steps: list[tuple[str, int]], seed: int
) -> None:
    rng = random.Random(seed)
    producer = Producer(FailoverTable.new(rng))
    committed = [Checkpoint(0, 0, ())]
    for action, amount in steps:
        if action == "write":
            producer.write(amount)
        elif action == "checkpoint":
            # Resume, stream up to the high seqno and commit that whole snapshot, with the
            # uuid the failover log received at the stream request gives for it.
            resume(producer, committed)
            seqno = producer.high
            uuid = producer.table.log().entry_at(seqno).vbucket_uuid
            committed.append(Checkpoint(seqno, uuid, tuple(producer.history)))
        elif action == "failover":
            lose = min(amount, producer.high)
            del producer.history[producer.high - lose :]
            producer.table.failover(producer.high, rng)
            producer.purge_seqno = min(producer.purge_seqno, producer.high)
        else:
            producer.purge_seqno = max(producer.purge_seqno, producer.high * amount // 100)
    resume(producer, committed)
