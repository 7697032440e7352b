"""Rollback planning (issue 6): which boundary to rewind to, or a full resync. Pure."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from replicator.delta.checkpoints import Checkpoint, with_queued
from replicator.delta.commit_metadata import COMMIT, RESYNC, ROLLBACK, CommitMetadata
from replicator.delta.rollback import is_recent, live_boundaries, plan_rollback, readable_horizon
from replicator.delta.schema import MirrorConfig
from replicator.delta.table import CommitRecord
from replicator.model.positions import VbucketPosition

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def checkpoint(version: int, seqno: int, kind: str = COMMIT, vbucket: int = 5) -> Checkpoint:
    return Checkpoint(
        owner_id="o",
        batch_id=version,
        table_version=version,
        kind=kind,
        position=VbucketPosition.at_boundary(vbucket, 1, seqno),
        committed_at=T0,
    )


HISTORY = [checkpoint(1, 10), checkpoint(3, 20), checkpoint(4, 30), checkpoint(6, 45, vbucket=6)]


def test_rewinds_to_the_newest_boundary_at_or_below_the_rollback_seqno() -> None:
    plan = plan_rollback(HISTORY, 5, 25, horizon=0)
    assert not plan.full_resync
    assert plan.boundary is not None and plan.boundary.table_version == 3
    assert plan.to_seqno == 20


def test_the_plan_says_where_the_vbucket_stands_before_it() -> None:
    # The newest checkpoint of vbucket 5 (not 6's, and not the boundary) is the rollback's start.
    assert plan_rollback(HISTORY, 5, 25, horizon=0).from_seqno == 30
    after_a_rollback = [*HISTORY, checkpoint(5, 10, ROLLBACK), checkpoint(7, 14)]
    assert plan_rollback(after_a_rollback, 5, 12, horizon=0).from_seqno == 14


def test_a_boundary_equal_to_the_rollback_seqno_is_kept() -> None:
    plan = plan_rollback(HISTORY, 5, 30, horizon=0)
    assert plan.boundary is not None and plan.boundary.table_version == 4


def test_rollback_to_zero_is_a_full_resync() -> None:
    plan = plan_rollback(HISTORY, 5, 0, horizon=0)
    assert plan.full_resync and plan.to_seqno == 0


def test_no_boundary_below_the_rollback_seqno_is_a_full_resync() -> None:
    plan = plan_rollback(HISTORY, 5, 9, horizon=0)
    assert plan.full_resync and "no committed boundary" in plan.reason


def test_other_vbuckets_boundaries_are_ignored() -> None:
    assert plan_rollback(HISTORY, 6, 44, horizon=0).full_resync


def test_a_boundary_older_than_the_horizon_is_a_full_resync() -> None:
    plan = plan_rollback(HISTORY, 5, 25, horizon=4)
    assert plan.full_resync and "horizon" in plan.reason


def test_boundaries_abandoned_by_an_earlier_rollback_are_never_targets() -> None:
    # Rolled back to 10 at v5, then the new branch reached 14 at v7: seqno 20 (v3) and 30 (v4)
    # belong to the abandoned branch, even though 20 <= 25.
    history = [*HISTORY, checkpoint(5, 10, ROLLBACK), checkpoint(7, 14)]
    assert [c.table_version for c in live_boundaries(history, 5)] == [1, 5, 7]
    plan = plan_rollback(history, 5, 25, horizon=0)
    assert plan.boundary is not None and plan.boundary.table_version == 7


def test_a_resync_abandons_everything_before_it() -> None:
    history = [*HISTORY, checkpoint(8, 12, RESYNC)]
    assert [c.table_version for c in live_boundaries(history, 5)] == [8]
    assert plan_rollback(history, 5, 11, horizon=0).full_resync
    plan = plan_rollback(history, 5, 12, horizon=0)
    assert plan.boundary is not None and plan.boundary.table_version == 8


def test_horizon_is_the_newest_commit_past_the_retention() -> None:
    commits = [(v, T0 + timedelta(days=v)) for v in range(3, 10)]
    now = T0 + timedelta(days=12)
    # Commits older than 7 days (v3, v4) may have had their removed files vacuumed.
    assert readable_horizon(commits, timedelta(days=7), now) == 4
    assert readable_horizon(commits, timedelta(days=30), now) == 3
    assert readable_horizon([], timedelta(days=7), now) == 0


def queued_commit(version: int, seqnos: dict[int, int], kind: str = COMMIT) -> CommitRecord:
    positions = {vb: VbucketPosition.at_boundary(vb, 1, seqno) for vb, seqno in seqnos.items()}
    metadata = CommitMetadata(kind, version, 0, "o", "merge", positions)
    return CommitRecord(version, T0, metadata)


def test_queued_commits_count_as_checkpoints_of_their_vbuckets() -> None:
    # Commits 7 and 8 are not written to the checkpoints table yet; 4 was, and also stayed
    # queued (a flush that landed before the queue was cleared): it counts once.
    queued = [
        queued_commit(4, {5: 30}), queued_commit(7, {5: 50, 6: 60}), queued_commit(8, {6: 61}),
    ]  # fmt: skip
    merged = with_queued(HISTORY, queued, {5})[5]
    assert [(c.table_version, c.seqno) for c in merged] == [(1, 10), (3, 20), (4, 30), (7, 50)]
    both = with_queued(HISTORY, queued, {5, 6})  # a failover's vbuckets, in one pass
    assert both[5] == merged
    assert [(c.table_version, c.seqno) for c in both[6]] == [(6, 45), (7, 60), (8, 61)]
    # So a rollback to 55 rewinds to the queued boundary, not to the newest written one.
    plan = plan_rollback(merged, 5, 55, horizon=0)
    assert plan.boundary is not None and plan.boundary.table_version == 7
    assert plan.from_seqno == 50


def test_a_queued_rollback_cuts_the_boundaries_above_it() -> None:
    queued = [queued_commit(7, {5: 15}, kind=ROLLBACK)]
    merged = with_queued(HISTORY, queued, {5})[5]
    assert [c.seqno for c in live_boundaries(merged, 5)] == [10, 15]


def test_a_boundary_within_both_retentions_needs_no_history() -> None:
    config = MirrorConfig(
        "b", deleted_file_retention=timedelta(days=7), log_retention=timedelta(days=30)
    )
    assert is_recent(T0 - timedelta(days=6), config, now=T0)
    assert not is_recent(T0 - timedelta(days=8), config, now=T0)
    short_log = MirrorConfig("b", log_retention=timedelta(days=2))
    assert not is_recent(T0 - timedelta(days=3), short_log, now=T0)
