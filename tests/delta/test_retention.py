"""Pruning the checkpoints and failover logs tables: what it keeps, that rollbacks and restarts
still find their boundaries and logs, and that rows appended during a prune survive it."""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from chispa import assert_df_equality

from replicator.delta.checkpoints import Checkpoint, CheckpointsTable, checkpoint_of_row
from replicator.delta.commit_metadata import RESYNC, ROLLBACK
from replicator.delta.executor import CommitExecutor
from replicator.delta.ownership import OwnersTable
from replicator.delta.retention import CheckpointRetention, MetadataPruner
from replicator.delta.rollback import live_boundaries, plan_rollback
from replicator.delta.schema import CHECKPOINT_SCHEMA, MirrorConfig
from replicator.delta.store import DeltaMirrorStore
from replicator.delta.table import MirrorTable, open_or_create
from replicator.model.positions import FailoverLog
from tests.delta.helpers import batch, upsert, vbucket_commit

pytestmark = pytest.mark.spark

T0 = datetime(2026, 11, 1, tzinfo=UTC)
COMMIT = "commit"


def random_history(seed: int, vbuckets: int, commits: int) -> list[Checkpoint]:
    """Checkpoint rows of `commits` data commits by two owners over about ten days.

    Plain commits touch several vbuckets and move them forward; one commit in eight is a
    rollback (to a seqno at or below where the vbucket stands) or a resync of one vbucket.
    """
    rng = random.Random(seed)
    seqnos = dict.fromkeys(range(vbuckets), 0)
    batches = {"owner-a": 0, "owner-b": 0}
    at = T0
    rows: list[Checkpoint] = []
    for version in range(1, commits + 1):
        at += timedelta(minutes=rng.randint(1, 90))
        owner = "owner-a" if rng.random() < 0.8 else "owner-b"
        batches[owner] += 1
        roll = rng.random()
        if roll < 0.08:
            kind, touched = ROLLBACK, [rng.randrange(vbuckets)]
            seqnos[touched[0]] = rng.randint(0, seqnos[touched[0]])
        elif roll < 0.12:
            kind, touched = RESYNC, [rng.randrange(vbuckets)]
            seqnos[touched[0]] = rng.randint(1, 400)
        else:
            kind, touched = COMMIT, rng.sample(range(vbuckets), rng.randint(1, vbuckets))
            for vbucket in touched:
                seqnos[vbucket] += rng.randint(1, 20)
        for vbucket in touched:
            rows.append(checkpoint_of_row({
                "owner_id": owner, "batch_id": batches[owner], "table_version": version,
                "kind": kind, "vbucket": vbucket, "vbucket_uuid": 77, "seqno": seqnos[vbucket],
                "snapshot_start": seqnos[vbucket], "snapshot_end": seqnos[vbucket],
                "purge_seqno": 0, "manifest_uid": 0, "committed_at": at,
            }))  # fmt: skip
    return rows


def expected_kept(
    rows: Sequence[Checkpoint], owned: Iterable[int], retention: CheckpointRetention,
    now: datetime,
) -> set[tuple[int, int]]:
    """(vbucket, table_version) of the rows pruning keeps, by the rule written out plainly."""
    owned = set(owned)
    kept = {(c.vbucket, c.table_version) for c in rows if c.vbucket not in owned}
    newest_batch: dict[str, int] = {}
    newest_version: dict[str, int] = {}
    for c in rows:
        newest_batch[c.owner_id] = max(newest_batch.get(c.owner_id, 0), c.batch_id)
        newest_version[c.owner_id] = max(newest_version.get(c.owner_id, 0), c.table_version)
    for c in rows:
        if c.vbucket in owned and (
            c.kind != COMMIT
            or c.batch_id == newest_batch[c.owner_id]
            or c.table_version == newest_version[c.owner_id]
        ):
            kept.add((c.vbucket, c.table_version))
    for vbucket in owned:
        hours: set[datetime] = set()
        days: set[datetime] = set()
        for rank, c in enumerate(reversed(live_boundaries(rows, vbucket))):
            hour = c.committed_at.replace(minute=0, second=0, microsecond=0)
            day = hour.replace(hour=0)
            if rank < retention.recent:
                kept.add((vbucket, c.table_version))
            if hour not in hours and c.committed_at >= now - retention.hourly_for:
                kept.add((vbucket, c.table_version))
            if day not in days and c.committed_at >= now - retention.daily_for:
                kept.add((vbucket, c.table_version))
            hours.add(hour)
            days.add(day)
    return kept


def write_rows(spark: Any, path: str, rows: Sequence[Checkpoint], files: int = 4) -> None:
    """Append `rows` to the checkpoints table at `path`, in `files` appends as flushes do."""
    tuples = [
        (c.owner_id, c.batch_id, c.table_version, c.kind, c.vbucket,
         Decimal(c.position.vbucket_uuid), c.seqno, c.position.snapshot_start,
         c.position.snapshot_end, 0, 0, c.committed_at)
        for c in rows
    ]  # fmt: skip
    step = -(-len(tuples) // files)
    for start in range(0, len(tuples), step):
        frame = spark.createDataFrame(tuples[start : start + step], CHECKPOINT_SCHEMA)
        frame.coalesce(1).write.format("delta").mode("append").save(path)


def remaining(mirror: MirrorTable) -> list[Checkpoint]:
    rows = CheckpointsTable.of(mirror).read().collect()
    return [checkpoint_of_row(row) for row in rows]


def new_mirror(spark: Any, path: Path, vbuckets: int = 16) -> MirrorTable:
    return open_or_create(spark, str(path), MirrorConfig("travel", num_vbuckets=vbuckets))


def test_pruning_keeps_what_the_retention_names_and_every_live_boundary_stays_live(
    spark: Any, tmp_path: Path
) -> None:
    mirror = new_mirror(spark, tmp_path / "random")
    rows = random_history(seed=11, vbuckets=16, commits=260)
    write_rows(spark, mirror.layout.checkpoints, rows)
    owned = range(12)  # vbuckets 12-15 belong to another shard: never pruned here
    retention = CheckpointRetention(
        recent=3, hourly_for=timedelta(hours=20), daily_for=timedelta(days=4)
    )
    now = max(c.committed_at for c in rows) + timedelta(minutes=5)
    expected = expected_kept(rows, owned, retention, now)
    assert len(expected) < len(rows) / 2  # the history is long enough to prune most of it

    outcome = MetadataPruner(mirror, owned, retention).prune(now)

    assert outcome is not None and outcome.rows_dropped == len(rows) - len(expected)
    assert outcome.files_after == 1
    left = remaining(mirror)
    assert_df_equality(
        spark.createDataFrame(
            [(c.vbucket, c.table_version) for c in left], "vbucket int, table_version long"
        ),
        spark.createDataFrame(sorted(expected), "vbucket int, table_version long"),
        ignore_row_order=True,
    )
    for vbucket in range(16):
        # What remains answers rollbacks as the whole did, only coarser: the live boundaries
        # of the rest are the kept live boundaries of the whole, never an abandoned one.
        whole = live_boundaries(rows, vbucket)
        assert live_boundaries(left, vbucket) == [c for c in whole if c in set(left)]
        newest = max((c for c in rows if c.vbucket == vbucket), key=lambda c: c.table_version)
        assert newest in left
        for seqno in range(1, 500, 7):
            chosen = plan_rollback(left, vbucket, seqno, horizon=0).boundary
            best = plan_rollback(rows, vbucket, seqno, horizon=0).boundary
            if best is not None and best in left:
                assert chosen == best
            elif chosen is not None:  # an older live boundary: correct, streams again more
                assert chosen in whole and best is not None
                assert chosen.seqno <= best.seqno and chosen.table_version < best.table_version


def test_an_abandoned_newest_commit_of_an_owner_stays_cut_off_by_its_rollback(
    spark: Any, tmp_path: Path
) -> None:
    # owner-b's last commit left vbucket 0 at seqno 100; owner-a then rolled it back to 50 and
    # committed on. owner-b's row is kept (its newest commit) though abandoned: the rollback
    # that cut it off must be kept too, or a rollback to 105 would rewind to it.
    def row(version: int, owner: str, batch_id: int, kind: str, seqno: int) -> Checkpoint:
        return checkpoint_of_row({
            "owner_id": owner, "batch_id": batch_id, "table_version": version, "kind": kind,
            "vbucket": 0, "vbucket_uuid": 77, "seqno": seqno, "snapshot_start": seqno,
            "snapshot_end": seqno, "purge_seqno": 0, "manifest_uid": 0,
            "committed_at": T0 + timedelta(minutes=version),
        })  # fmt: skip

    rows = [row(1, "owner-b", 1, COMMIT, 100), row(2, "owner-a", 1, ROLLBACK, 50)]
    rows += [row(v, "owner-a", v - 1, COMMIT, 40 + 10 * v) for v in range(3, 11)]
    mirror = new_mirror(spark, tmp_path / "abandoned")
    write_rows(spark, mirror.layout.checkpoints, rows, files=2)
    retention = CheckpointRetention(recent=2, hourly_for=timedelta(0), daily_for=timedelta(0))

    MetadataPruner(mirror, [0], retention).prune(T0 + timedelta(days=1))

    left = remaining(mirror)
    assert sorted(c.table_version for c in left) == [1, 2, 9, 10]
    plan = plan_rollback(left, 0, 105, horizon=0)
    assert plan.boundary is not None and plan.boundary.table_version == 2
    assert plan_rollback(rows, 0, 105, horizon=0).boundary == rows[5]  # seqno 100, version 6


def test_a_restart_recovers_the_same_positions_and_batch_ids_after_a_prune(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mirror = new_mirror(spark, tmp_path / "restart")
    owners = OwnersTable.of(mirror)
    claim = owners.claim(range(4), "writer-one")
    executor = CommitExecutor(mirror, claim, owners)
    retention = CheckpointRetention(
        recent=2, hourly_for=timedelta(0), daily_for=timedelta(0), prune_every_files=3
    )
    pruner = MetadataPruner(mirror, range(4), retention)
    store = DeltaMirrorStore(executor, owners, claim, pruner=pruner)
    for uuid in (101, 102, 103):  # three stream requests' saves; vbucket 9 is another shard's
        store.save_failover_logs({vb: FailoverLog.of([(uuid, 0)]) for vb in (0, 1, 2, 3, 9)})
    seqno = 0
    caplog.set_level(logging.INFO, logger="replicator.delta.retention")
    for batch_id in range(1, 9):
        first = batch_id == 1
        changes = [upsert(vbucket, f"k{batch_id}", seqno + 1 + vbucket) for vbucket in range(4)]
        commits = [
            vbucket_commit(vbucket, [changes[vbucket]], seqno=seqno + 1 + vbucket,
                           first_load=first, previous_seqno=0 if first else seqno - 3 + vbucket)
            for vbucket in range(4)
        ]
        store.commit(batch(batch_id, *commits), replace=frozenset())
        seqno += 4
    assert pruner.prunes >= 1  # due every 3 files: the store pruned on its own
    said = [r.getMessage() for r in caplog.records if r.name == "replicator.delta.retention"]
    # An operator sees a prune start (commits wait for it), then what it did.
    assert said[0].startswith("pruning the checkpoints") and said[1].startswith("pruned ")
    left = remaining(mirror)
    assert len({c.table_version for c in left}) < 8
    saved = spark.read.format("delta").load(mirror.layout.failover_logs)
    assert sorted(saved.groupBy("vbucket").count().collect()) == [
        (0, 1), (1, 1), (2, 1), (3, 1), (9, 3)
    ]
    recovered = store.recover((0, 1, 2, 3))
    owners.release(claim)

    again = owners.claim(range(4), "writer-one")
    fresh = DeltaMirrorStore(CommitExecutor(mirror, again, owners), owners, again)
    assert fresh.recover((0, 1, 2, 3)) == recovered
    assert recovered.next_batch_id == 9
    assert recovered.failover_logs == {vb: FailoverLog.of([(103, 0)]) for vb in range(4)}
    assert {vb: p.seqno for vb, p in recovered.positions.items()} == {
        vb: 29 + vb for vb in range(4)
    }
    owners.release(again)


def test_rows_appended_while_a_prune_plans_are_kept(spark: Any, tmp_path: Path) -> None:
    mirror = new_mirror(spark, tmp_path / "race")
    rows = random_history(seed=5, vbuckets=4, commits=60)
    write_rows(spark, mirror.layout.checkpoints, rows)
    pruner = MetadataPruner(mirror, range(4), CheckpointRetention(recent=1))
    now = max(c.committed_at for c in rows) + timedelta(days=30)
    drops = pruner.drops(now)
    # Another owner's flush lands between the plan and the delete, with rows at old versions
    # the rule would drop had the prune read them.
    used = {(c.vbucket, c.table_version) for c in rows}
    free = [(vb, v) for v in range(1, 60) for vb in range(4) if (vb, v) not in used][:6]
    late = [
        checkpoint_of_row({**row_dict(rows[0]), "owner_id": "late-owner", "batch_id": number,
                           "vbucket": vb, "table_version": version})
        for number, (vb, version) in enumerate(free, start=1)
    ]  # fmt: skip
    assert len(late) == 6
    assert not all(
        (c.vbucket, c.table_version) in expected_kept(rows + late, range(4), pruner.retention, now)
        for c in late
    )
    write_rows(spark, mirror.layout.checkpoints, late, files=1)

    outcome = pruner.apply(drops)

    assert outcome is not None and outcome.rows_dropped > 0
    left = remaining(mirror)
    assert all(c in left for c in late)


def row_dict(c: Checkpoint) -> dict[str, Any]:
    return {
        "owner_id": c.owner_id, "batch_id": c.batch_id, "table_version": c.table_version,
        "kind": c.kind, "vbucket": c.vbucket, "vbucket_uuid": c.position.vbucket_uuid,
        "seqno": c.seqno, "snapshot_start": c.position.snapshot_start,
        "snapshot_end": c.position.snapshot_end, "purge_seqno": 0, "manifest_uid": 0,
        "committed_at": c.committed_at,
    }  # fmt: skip


def test_a_retention_that_keeps_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="recent must be at least 1"):
        CheckpointRetention(recent=0)
    with pytest.raises(ValueError, match="prune_every_files"):
        CheckpointRetention(prune_every_files=0)
    with pytest.raises(ValueError, match="hourly_for must not be negative"):
        CheckpointRetention(hourly_for=timedelta(hours=-1))
