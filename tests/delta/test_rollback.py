"""Rollback on the Delta side: rewind one vbucket by time travel, or signal a full resync."""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from chispa import assert_df_equality

from replicator.delta import changes
from replicator.delta.checkpoints import CheckpointsTable
from replicator.delta.executor import CommitExecutor, WriteStrategy
from replicator.delta.failover_logs import FailoverLogsTable
from replicator.delta.ownership import OwnerClaim, OwnersTable
from replicator.delta.rollback import (
    plan_rollback,
    replace_vbucket,
    rewind_horizon,
    rollback_vbucket,
)
from replicator.delta.schema import MirrorConfig
from replicator.delta.store import DeltaMirrorStore
from replicator.delta.table import MirrorTable, open_or_create
from replicator.inspect.commits import rollbacks
from replicator.model.mirror import RollbackRequest
from replicator.model.positions import FailoverLog, VbucketPosition
from tests.delta.helpers import (
    UUID,
    batch,
    delete,
    documents,
    every_version_consistent,
    state_at,
    upsert,
    vbucket_commit,
)

pytestmark = pytest.mark.spark

NEW_UUID = 0x1234
FRESH_LOG = FailoverLog.of([(NEW_UUID, 7), (UUID, 0)])


@pytest.fixture(scope="module")
def executor(mirror: MirrorTable, claim: OwnerClaim, owners: OwnersTable) -> CommitExecutor:
    return CommitExecutor(mirror, claim, owners)


def test_rollback_rewrites_only_that_vbucket_to_its_boundary(
    spark: Any, mirror: MirrorTable, mirror_path: Path, executor: CommitExecutor
) -> None:
    start_version = mirror.version()
    history_20 = [
        upsert(20, "a", 1),
        upsert(20, "b", 3),
        upsert(20, "a", 5, '"a5"'),
        delete(20, "b", 6),
    ]
    history_21 = [upsert(21, "x", 2), upsert(21, "y", 4)]
    later_20 = [upsert(20, "c", 8), upsert(20, "a", 9, '"a9"')]
    executor.execute(
        batch(
            1,
            vbucket_commit(20, history_20[:2], seqno=3, first_load=True),
            vbucket_commit(21, history_21[:1], seqno=2, first_load=True),
        )
    )
    executor.execute(
        batch(
            2,
            vbucket_commit(20, history_20[2:], seqno=6, first_load=False),
            vbucket_commit(21, history_21[1:], seqno=4, first_load=False),
        )
    )
    executor.execute(batch(3, vbucket_commit(20, later_20, seqno=9, first_load=False)))
    before_21 = CheckpointsTable.of(mirror).latest([21])[21]
    rows_21 = mirror.read().where("vbucket = 21")
    expected_21 = rows_21.collect()

    checkpoints = CheckpointsTable.of(mirror).for_vbucket(20)
    plan = plan_rollback(checkpoints, 20, 7, horizon=0)
    assert plan.to_seqno == 6
    assert plan.boundary is not None and rewind_horizon(mirror, plan.boundary) == 0
    outcome = rollback_vbucket(
        executor, plan, batch_id=4, failover_log=FRESH_LOG, reason="failover on node-2"
    )

    assert not outcome.full_resync_required and outcome.commit is not None
    assert outcome.commit.strategy is WriteStrategy.REPLACE
    assert outcome.position == VbucketPosition.at_boundary(20, UUID, 6)
    assert documents(mirror, [20]) == {(20, "a", 5, '"a5"')}
    assert_df_equality(
        mirror.read().where("vbucket = 21"),
        spark.createDataFrame(expected_21, mirror.read().schema),
        ignore_row_order=True,
    )
    latest = CheckpointsTable.of(mirror).latest([20, 21])
    assert latest[20].kind == "rollback"
    assert latest[20].position == outcome.position
    assert latest[20].table_version == outcome.commit.table_version
    assert latest[21] == before_21
    assert FailoverLogsTable.of(mirror).load([20]) == {20: FRESH_LOG}

    entry = mirror.delta().history(1).first()
    assert entry is not None and entry["version"] == outcome.commit.table_version
    metadata = json.loads(entry["userMetadata"])
    assert metadata["kind"] == "rollback"
    assert (metadata["vbucket"], metadata["from_seqno"], metadata["to_seqno"]) == (20, 9, 6)
    assert metadata["failover_log"] == [[NEW_UUID, 7], [UUID, 0]]
    assert metadata["reason"] == "failover on node-2"
    assert metadata["batch"] == 4
    # One MERGE of the difference: deletion vectors on the files that held vbucket 20's rows,
    # nothing copied, no other file touched (vbucket 21 shares 20's partition and files).
    version = outcome.commit.table_version
    log = mirror_path / "_delta_log" / f"{version:020d}.json"
    actions = [json.loads(line) for line in log.read_text().splitlines()]
    removed = [a["remove"]["path"] for a in actions if "remove" in a]
    held_20 = mirror.read(version - 1).where("vbucket = 20").inputFiles()
    assert removed and all(any(f.endswith(path) for f in held_20) for path in removed)
    assert all(p.startswith("vbucket_group=5/") for p in removed)
    assert entry["operation"] == "MERGE"
    assert int(entry["operationMetrics"]["numTargetRowsCopied"]) == 0

    # Every version holds whole boundaries: vbucket 21 exactly its history's state, vbucket 20
    # nothing beyond its position (the rollback commit included).
    in_order = state_at(history_21)
    problems = every_version_consistent(
        mirror,
        lambda vb, position: in_order(vb, position) if vb == 21 else None,
        vbuckets=[20, 21],
        from_version=start_version,
    )
    assert problems == []


def test_replace_vbucket_removes_keys_not_streamed_again(
    mirror: MirrorTable, executor: CommitExecutor
) -> None:
    load = [upsert(22, k, s) for s, k in enumerate("abc", start=1)] + [upsert(23, "keep", 1)]
    executor.execute(
        batch(
            10,
            vbucket_commit(22, load, seqno=3, first_load=True),
            vbucket_commit(23, load, seqno=1, first_load=True),
        )
    )
    untouched = documents(mirror, [23])
    restream = [upsert(22, "a", 10, '"a10"'), upsert(22, "d", 11), delete(22, "x", 12)]
    commit = replace_vbucket(
        executor,
        vbucket_commit(22, restream, seqno=12, first_load=True, uuid=NEW_UUID),
        batch_id=11,
        failover_log=FailoverLog.of([(NEW_UUID, 0)]),
        reason="rollback to 0",
    )
    assert commit.kind == "resync" and commit.strategy is WriteStrategy.REPLACE
    assert documents(mirror, [22]) == {(22, "a", 10, '"a10"'), (22, "d", 11, '{"v":11}')}
    assert documents(mirror, [23]) == untouched
    latest = CheckpointsTable.of(mirror).latest([22])[22]
    assert (latest.kind, latest.position) == (
        "resync",
        VbucketPosition.at_boundary(22, NEW_UUID, 12),
    )
    assert FailoverLogsTable.of(mirror).load([22]) == {22: FailoverLog.of([(NEW_UUID, 0)])}


def test_rollback_past_vacuumed_files_signals_a_full_resync(spark: Any, tmp_path: Path) -> None:
    mirror = open_or_create(spark, str(tmp_path / "vacuumed"), MirrorConfig("travel"))
    owners = OwnersTable.of(mirror)
    claim = owners.claim([1])
    executor = CommitExecutor(mirror, claim, owners)
    executor.execute(
        batch(
            1, vbucket_commit(1, [upsert(1, "a", 1), upsert(1, "b", 2)], seqno=2, first_load=True)
        )
    )
    # Every row of the first file goes: the file leaves the table and VACUUM may delete it.
    executor.execute(
        batch(
            2,
            vbucket_commit(
                1,
                [delete(1, "a", 3), delete(1, "b", 4), upsert(1, "c", 5)],
                seqno=5,
                first_load=False,
            ),
        )
    )
    vacuum_confs = {
        "spark.databricks.delta.retentionDurationCheck.enabled": "false",
        # VACUUM lists files with this many tasks (10000 by default): minutes on two cores.
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": "2",
    }
    # Restored, not unset: unset means Spark's default (10000 listing tasks), not the session's.
    previous = {key: spark.conf.get(key) for key in vacuum_confs}
    for key, value in vacuum_confs.items():
        spark.conf.set(key, value)
    try:
        spark.sql(f"VACUUM delta.`{mirror.layout.data}` RETAIN 0 HOURS")
    finally:
        for key, value in previous.items():
            spark.conf.set(key, value)
    version_before = mirror.version()

    checkpoints = CheckpointsTable.of(mirror).for_vbucket(1)
    plan = plan_rollback(checkpoints, 1, 4, horizon=0)  # the configured retention says readable
    assert plan.to_seqno == 2
    outcome = rollback_vbucket(executor, plan, batch_id=3, failover_log=FRESH_LOG, reason="t")

    assert outcome.full_resync_required
    assert outcome.position == VbucketPosition.beginning(1)
    assert (
        "can no longer be read" in outcome.reason and "stream the vbucket again" in outcome.reason
    )
    assert mirror.version() == version_before
    assert documents(mirror, [1]) == {(1, "c", 5, '{"v":5}')}
    assert FailoverLogsTable.of(mirror).load() == {}
    # VACUUM of the data table leaves the replicator's own tables (under _replicator/) alone.
    owners.verify(claim)
    assert len(CheckpointsTable.of(mirror).for_vbucket(1)) == 2


def own_mirror(
    spark: Any, path: Path, vbucket: int
) -> tuple[MirrorTable, OwnersTable, OwnerClaim]:
    """A mirror of its own for one test, and a claim on `vbucket`."""
    mirror = open_or_create(spark, str(path), MirrorConfig("travel", num_vbuckets=64))
    owners = OwnersTable.of(mirror)
    return mirror, owners, owners.claim([vbucket], f"writer-of-{path.name}")


def test_a_run_rolls_back_from_checkpoints_still_queued_without_writing_them(
    spark: Any, tmp_path: Path
) -> None:
    # A run queues checkpoint rows for several commits; its rollback plans from the table and
    # the queue together, and no checkpoints commit comes before the rewind.
    mirror, owners, claim = own_mirror(spark, tmp_path / "queued", 3)
    executor = CommitExecutor(mirror, claim, owners, checkpoint_every=10)
    store = DeltaMirrorStore(executor, owners, claim)
    first = [upsert(3, "a", 1), upsert(3, "b", 2)]
    store.commit(batch(1, vbucket_commit(3, first, seqno=2, first_load=True)), replace=frozenset())
    later = [upsert(3, "a", 4, '"a4"'), upsert(3, "c", 5)]
    store.commit(
        batch(2, vbucket_commit(3, later, seqno=5, first_load=False, previous_seqno=2)),
        replace=frozenset(),
    )
    assert len(executor.queued_commits) == 2

    rollback_log = FailoverLog.of([(NEW_UUID, 3), (UUID, 0)])
    [outcome] = store.rollback([RollbackRequest(
        3, 3, VbucketPosition.at_boundary(3, UUID, 5), rollback_log, "failover",
    )])  # fmt: skip

    assert not outcome.full_resync
    assert outcome.position == VbucketPosition.at_boundary(3, UUID, 2)
    assert documents(mirror, [3]) == {(3, "a", 1, '{"v":1}'), (3, "b", 2, '{"v":2}')}
    assert CheckpointsTable.of(mirror).for_vbucket(3) == []
    assert [c.metadata.kind for c in executor.queued_commits] == ["commit", "commit", "rollback"]
    # Its failover log is written with its checkpoints, not by the rollback (0.4 to 0.6 s).
    assert FailoverLogsTable.of(mirror).load([3]) == {}
    executor.flush_checkpoints()
    assert [c.seqno for c in CheckpointsTable.of(mirror).for_vbucket(3)] == [2, 5, 2]
    assert FailoverLogsTable.of(mirror).load([3]) == {3: rollback_log}
    owners.release(claim)


def test_an_old_boundary_is_checked_against_the_history_since_it_only(
    spark: Any, tmp_path: Path
) -> None:
    mirror, owners, claim = own_mirror(spark, tmp_path / "horizon", 4)
    executor = CommitExecutor(mirror, claim, owners)
    for batch_id in (1, 2, 3):
        changes = [upsert(4, "a", batch_id)]
        commit = vbucket_commit(4, changes, seqno=batch_id, first_load=batch_id == 1)
        executor.execute(batch(batch_id, commit))
    owners.release(claim)
    checkpoints = CheckpointsTable.of(mirror).for_vbucket(4)
    boundary = checkpoints[1]
    latest = mirror.version()

    since = mirror.commit_timestamps(since_version=boundary.table_version)
    assert [version for version, _ in since] == list(range(boundary.table_version, latest + 1))
    # A boundary older than the retention, by its checkpoint, is checked against the commits
    # since it: none of them has expired yet, so it is still readable...
    old = dataclasses.replace(boundary, committed_at=boundary.committed_at - timedelta(days=8))
    now = boundary.committed_at + timedelta(minutes=5)
    assert rewind_horizon(mirror, old, now=now) == boundary.table_version
    assert not plan_rollback(checkpoints, 4, 2, rewind_horizon(mirror, old, now=now)).full_resync
    # ...until the commit after it has expired: its files may be gone.
    later = now + timedelta(days=8)
    assert rewind_horizon(mirror, old, now=later) == latest
    assert plan_rollback(checkpoints, 4, 2, rewind_horizon(mirror, old, now=later)).full_resync


# How many rows a REPLACE may plan on the driver, and what the driver then reads (rows of each
# read, None where they did not fit): everything (the default): both boundary versions' 2 old
# rows and the 7 current ones; the old rows but not the current ones; the first version's rows,
# after which nothing is left for the second's, so Spark plans it all.
@pytest.mark.parametrize(
    ("driver_rows", "driver_reads"),
    [(None, [2, 2, 7]), (4, [2, 2, None]), (2, [2])],
    ids=["driver", "old", "mixed"],
)
def test_a_failover_rolls_its_vbuckets_back_in_one_commit(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, driver_rows: int | None,
    driver_reads: list[int | None],
) -> None:  # fmt: skip
    # A failover answers the stream requests of every vbucket the lost node was active for with
    # ROLLBACK, to different seqnos: those that rewind go back together, each to its own
    # boundary (at different table versions), in one commit that says what happened to each.
    if driver_rows is not None:
        monkeypatch.setattr(changes, "REPLACE_ON_DRIVER_ROWS", driver_rows)
    reads: list[int | None] = []
    read_rows = changes.rows_on_driver

    def recorded(frame: Any, columns: Any, limit: int) -> Any:
        table = read_rows(frame, columns, limit)
        reads.append(None if table is None else table.num_rows)
        return table

    monkeypatch.setattr(changes, "rows_on_driver", recorded)
    path = tmp_path / "failover"
    mirror = open_or_create(spark, str(path), MirrorConfig("travel", num_vbuckets=64))
    owners = OwnersTable.of(mirror)
    claim = owners.claim([3, 4, 5, 40, 41], "writer-of-failover")
    executor = CommitExecutor(mirror, claim, owners, checkpoint_every=10)
    store = DeltaMirrorStore(executor, owners, claim)
    store.commit(batch(1,
        vbucket_commit(3, [upsert(3, "a", 1), upsert(3, "b", 2)], seqno=2, first_load=True),
        vbucket_commit(4, [upsert(4, "x", 1)], seqno=1, first_load=True),
        vbucket_commit(5, [upsert(5, "p", 1)], seqno=1, first_load=True),
        vbucket_commit(40, [upsert(40, "m", 1)], seqno=1, first_load=True),
        vbucket_commit(41, [upsert(41, "k", 1)], seqno=1, first_load=True),
    ), replace=frozenset())  # fmt: skip
    first = mirror.version()
    store.commit(batch(2,
        vbucket_commit(3, [upsert(3, "a", 4, '"a4"'), upsert(3, "c", 5)], seqno=5,
                       first_load=False, previous_seqno=2),
        vbucket_commit(4, [delete(4, "x", 3), upsert(4, "y", 4)], seqno=4, first_load=False,
                       previous_seqno=1),
        vbucket_commit(40, [upsert(40, "m", 2, '"m2"')], seqno=2, first_load=False,
                       previous_seqno=1),
    ), replace=frozenset())  # fmt: skip
    second = mirror.version()
    store.commit(batch(3,
        vbucket_commit(4, [upsert(4, "z", 6)], seqno=6, first_load=False, previous_seqno=4),
        vbucket_commit(40, [upsert(40, "n", 3)], seqno=3, first_load=False, previous_seqno=2),
    ), replace=frozenset())  # fmt: skip
    before = mirror.version()
    untouched = documents(mirror, [5, 41])
    logs = {vb: FailoverLog.of([(NEW_UUID + vb, vb), (UUID, 0)]) for vb in (3, 4, 5, 40, 41)}

    def request(vb: int, rollback_seqno: int, committed: int) -> RollbackRequest:
        position = VbucketPosition.at_boundary(vb, UUID, committed)
        return RollbackRequest(vb, rollback_seqno, position, logs[vb], f"failover of {vb}")

    outcomes = store.rollback([
        request(40, 2, 3), request(3, 3, 5), request(5, 7, 1), request(4, 5, 6),
        request(41, 0, 1),
    ])  # fmt: skip

    assert reads == driver_reads
    # In the order asked: 40, 3 and 4 rewound by one commit, 5 already there, 41 to resync.
    assert [(o.vbucket, o.position.seqno, o.full_resync) for o in outcomes] == [
        (40, 2, False), (3, 2, False), (5, 1, False), (4, 4, False), (41, 0, True)
    ]
    assert mirror.version() == before + 1 and store.next_batch_id == 5
    assert {o.table_version for o in outcomes if o.vbucket in (3, 4, 40)} == {before + 1}
    assert documents(mirror, [3]) == documents(mirror, [3], version=first)
    assert documents(mirror, [4, 40]) == documents(mirror, [4, 40], version=second)
    assert documents(mirror, [5, 41]) == untouched
    # The audit reads one record per vbucket from the commit.
    records = [r for r in rollbacks(spark, str(path)) if r.table_version == before + 1]
    assert [(r.vbucket, r.from_seqno, r.to_seqno, r.rollback_seqno, r.from_table_version,
             r.reason) for r in records] == [
        (3, 5, 2, 3, first, "failover of 3"), (4, 6, 4, 5, second, "failover of 4"),
        (40, 3, 2, 2, second, "failover of 40"),
    ]  # fmt: skip
    assert {r.vbucket: r.failover_log for r in records} == {vb: logs[vb] for vb in (3, 4, 40)}
    # Only files that held the three vbuckets' rows were touched, and no row was copied.
    entry = mirror.delta().history(1).first()
    assert entry is not None and entry["operation"] == "MERGE"
    assert int(entry["operationMetrics"]["numTargetRowsCopied"]) == 0
    log = path / "_delta_log" / f"{before + 1:020d}.json"
    removed = [json.loads(line)["remove"]["path"] for line in log.read_text().splitlines()
               if "remove" in json.loads(line)]
    held = mirror.read(before).where("vbucket IN (3, 4, 40)").inputFiles()
    assert removed and all(any(f.endswith(name) for f in held) for name in removed)
    # Each carried log and each rollback checkpoint is written with the next flush.
    executor.flush_checkpoints()
    assert FailoverLogsTable.of(mirror).load([3, 4, 40]) == {vb: logs[vb] for vb in (3, 4, 40)}
    latest = CheckpointsTable.of(mirror).latest([3, 4, 5, 40])
    assert {vb: (c.kind, c.seqno) for vb, c in latest.items()} == {
        3: ("rollback", 2), 4: ("rollback", 4), 5: ("commit", 1), 40: ("rollback", 2)
    }
    owners.release(claim)


def test_a_failover_resyncs_only_the_vbuckets_whose_old_version_lost_its_files(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "split"
    mirror = open_or_create(spark, str(path), MirrorConfig("travel", num_vbuckets=64))
    owners = OwnersTable.of(mirror)
    claim = owners.claim([1, 40], "writer-of-split")
    store = DeltaMirrorStore(CommitExecutor(mirror, claim, owners), owners, claim)
    store.commit(batch(1,
        vbucket_commit(1, [upsert(1, "a", 1), upsert(1, "b", 2)], seqno=2, first_load=True),
    ), replace=frozenset())  # fmt: skip
    first = mirror.version()
    store.commit(batch(2,
        vbucket_commit(1, [delete(1, "a", 3), delete(1, "b", 4), upsert(1, "c", 5)], seqno=5,
                       first_load=False, previous_seqno=2),
        vbucket_commit(40, [upsert(40, "m", 1)], seqno=1, first_load=True),
    ), replace=frozenset())  # fmt: skip
    second = mirror.version()
    store.commit(batch(3,
        vbucket_commit(40, [upsert(40, "n", 2)], seqno=2, first_load=False, previous_seqno=1),
    ), replace=frozenset())  # fmt: skip
    before = mirror.version()
    # The file of vbucket 1's first rows left the table at the second commit: delete it, as
    # VACUUM would once the retention passed. The version vbucket 1 rewinds to needs it.
    entry = path / "_delta_log" / f"{second:020d}.json"
    removed = [json.loads(line)["remove"]["path"] for line in entry.read_text().splitlines()
               if "remove" in json.loads(line)]  # fmt: skip
    assert removed
    for name in removed:
        (path / name).unlink()
    current = documents(mirror, [1])
    logs = {vb: FailoverLog.of([(NEW_UUID + vb, vb), (UUID, 0)]) for vb in (1, 40)}

    outcomes = store.rollback([
        RollbackRequest(vb, seqno, VbucketPosition.at_boundary(vb, UUID, committed), logs[vb],
                        "failover")
        for vb, seqno, committed in ((1, 3, 5), (40, 1, 2))
    ])  # fmt: skip

    resync, rewound = outcomes
    assert resync.full_resync and resync.position == VbucketPosition.beginning(1)
    [warning] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warning.startswith(f"vbucket 1: failover; table version {first} ")
    assert f"{len(removed)} of its data files were vacuumed; stream the vbucket again" in warning
    assert not rewound.full_resync and rewound.position.seqno == 1
    assert mirror.version() == before + 1 and rewound.table_version == before + 1
    assert documents(mirror, [40]) == documents(mirror, [40], version=second)
    assert documents(mirror, [1]) == current
    owners.release(claim)
