"""Crashes at every step of a commit, then recovery: exact positions, nothing applied twice."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from replicator.delta.checkpoints import CheckpointsTable
from replicator.delta.executor import FAULT_STEPS, CommitExecutor
from replicator.delta.failover_logs import FailoverLogsTable
from replicator.delta.ownership import OwnerClaim, OwnersTable
from replicator.delta.recovery import FIRST_BATCH_ID, recover, repair_checkpoints
from replicator.delta.rollback import plan_rollback, rollback_vbucket
from replicator.delta.schema import MirrorConfig
from replicator.delta.table import MirrorTable, open_or_create
from replicator.model.positions import FailoverLog, VbucketPosition
from tests.delta.helpers import (
    UUID,
    batch,
    commits_of_batch,
    delete,
    documents,
    every_version_consistent,
    state_at,
    upsert,
    vbucket_commit,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark


class Crash(Exception):
    """The process 'dies' here."""


def crash_at(step: str) -> Callable[[str], None]:
    def hook(name: str) -> None:
        if name == step:
            raise Crash(step)

    return hook


@pytest.mark.parametrize("step", FAULT_STEPS)
def test_crash_at_each_step_then_recovery_resumes_exactly(
    mirror: MirrorTable, owners: OwnersTable, step: str
) -> None:
    vb = 30 + FAULT_STEPS.index(step)
    claim = owners.claim([vb], f"crash-{step}")
    start_version = mirror.version()
    first = [upsert(vb, "a", 1), upsert(vb, "b", 2)]
    second = [upsert(vb, "a", 3, '"a3"'), delete(vb, "b", 4), upsert(vb, "c", 5)]
    CommitExecutor(mirror, claim, owners).execute(
        batch(1, vbucket_commit(vb, first, seqno=2, first_load=True))
    )
    steady = batch(2, vbucket_commit(vb, second, seqno=5, first_load=False, previous_seqno=2))
    with pytest.raises(Crash):
        CommitExecutor(mirror, claim, owners, fault_hook=crash_at(step)).execute(steady)

    # A new process: recover, then replay the batch it was applying (same batch id).
    state = recover(mirror, owner_id=claim.owner_id, vbuckets=[vb])
    data_committed = step != "before_data_commit"
    expected_seqno = 5 if data_committed else 2
    assert state.positions == {vb: VbucketPosition.at_boundary(vb, UUID, expected_seqno)}
    assert state.next_batch_id == (3 if data_committed else 2)
    assert len(state.repaired_versions) == (1 if step == "after_data_commit" else 0)
    before_replay = documents(mirror, [vb])

    outcome = CommitExecutor(mirror, claim, owners).execute(steady)
    assert outcome.commits[0].already_committed is data_committed
    assert documents(mirror, [vb]) == {(vb, "a", 3, '"a3"'), (vb, "c", 5, '{"v":5}')}
    if data_committed:
        assert before_replay == documents(mirror, [vb])
    assert len(commits_of_batch(mirror, claim.owner_id, 2)) == 1
    assert [c.seqno for c in CheckpointsTable.of(mirror).for_vbucket(vb)] == [2, 5]
    assert (
        every_version_consistent(
            mirror, state_at(first + second), vbuckets=[vb], from_version=start_version
        )
        == []
    )


def test_crash_between_the_parts_of_a_mixed_batch(mirror: MirrorTable, owners: OwnersTable) -> None:
    claim = owners.claim([40, 41], "mixed")
    start_version = mirror.version()
    executor = CommitExecutor(mirror, claim, owners)
    executor.execute(batch(1, vbucket_commit(40, [upsert(40, "a", 1)], seqno=1, first_load=True)))
    mixed = batch(
        2,
        vbucket_commit(40, [upsert(40, "a", 2, '"a2"')], seqno=2, first_load=False),
        vbucket_commit(41, [upsert(41, "z", 7)], seqno=7, first_load=True),
    )
    steps: list[str] = []

    def crash_after_first_part(name: str) -> None:
        steps.append(name)
        if steps.count("after_checkpoint") == 1 and name == "after_checkpoint":
            raise Crash(name)

    with pytest.raises(Crash):
        CommitExecutor(mirror, claim, owners, fault_hook=crash_after_first_part).execute(mixed)
    # The append part (vbucket 41) landed whole; the merge part (vbucket 40) did not start.
    state = recover(mirror, owner_id=claim.owner_id, vbuckets=[40, 41])
    assert {vb: p.seqno for vb, p in state.positions.items()} == {40: 1, 41: 7}
    assert documents(mirror, [40, 41]) == {(40, "a", 1, '{"v":1}'), (41, "z", 7, '{"v":7}')}

    replay = CommitExecutor(mirror, claim, owners).execute(mixed)
    assert [c.already_committed for c in replay.commits] == [True, False]
    assert documents(mirror, [40, 41]) == {(40, "a", 2, '"a2"'), (41, "z", 7, '{"v":7}')}

    # The consistency check itself notices a version that disagrees with the model.
    nothing_expected = every_version_consistent(
        mirror, lambda vb, position: {}, vbuckets=[40], from_version=start_version
    )
    assert nothing_expected and "vbucket 40 at seqno 1: rows {(0, 'a'): 1}" in nothing_expected[0]


def test_checkpoints_are_repaired_from_history_once(
    mirror: MirrorTable, owners: OwnersTable
) -> None:
    claim = owners.claim([45], "repair")
    executor = CommitExecutor(mirror, claim, owners)
    executor.execute(batch(1, vbucket_commit(45, [upsert(45, "a", 1)], seqno=1, first_load=True)))
    lost = CommitExecutor(mirror, claim, owners, fault_hook=crash_at("after_data_commit"))
    for batch_id, seqno in ((2, 3), (3, 4)):
        # Two commits whose checkpoints never landed (say, the checkpoint table was unwritable).
        with pytest.raises(Crash):
            lost.execute(
                batch(
                    batch_id,
                    vbucket_commit(45, [upsert(45, "a", seqno)], seqno=seqno, first_load=False),
                )
            )
    checkpoints = CheckpointsTable.of(mirror)
    assert [c.seqno for c in checkpoints.for_vbucket(45)] == [1]

    repaired = repair_checkpoints(mirror)
    versions = commits_of_batch(mirror, "repair", 2) + commits_of_batch(mirror, "repair", 3)
    assert repaired == tuple(versions)
    rows = checkpoints.for_vbucket(45)
    assert [(c.seqno, c.batch_id, c.table_version) for c in rows[1:]] == [
        (3, 2, versions[0]),
        (4, 3, versions[1]),
    ]
    assert repair_checkpoints(mirror) == ()
    assert len(checkpoints.for_vbucket(45)) == 3


def crashed_rollback(
    mirror: MirrorTable, owners: OwnersTable, vbucket: int, writer: str, log: FailoverLog
) -> OwnerClaim:
    """Commit seqnos 2 and 5 to `vbucket`, then roll it back to 2 carrying `log`, and die right
    after the rollback's data commit (its checkpoints unwritten). Returns the writer's claim."""
    claim = owners.claim([vbucket], writer)
    executor = CommitExecutor(mirror, claim, owners)
    first = vbucket_commit(vbucket, [upsert(vbucket, "a", 2)], seqno=2, first_load=True)
    executor.execute(batch(1, first))
    later = vbucket_commit(vbucket, [upsert(vbucket, "b", 5)], seqno=5, first_load=False)
    executor.execute(batch(2, later))
    plan = plan_rollback(CheckpointsTable.of(mirror).for_vbucket(vbucket), vbucket, 4, horizon=0)
    crashing = CommitExecutor(mirror, claim, owners, fault_hook=crash_at("after_data_commit"))
    with pytest.raises(Crash):
        rollback_vbucket(crashing, plan, batch_id=3, failover_log=log, reason="test")
    return claim


def test_a_crashed_rollback_is_recovered_with_its_failover_log(
    mirror: MirrorTable, owners: OwnersTable
) -> None:
    fresh_log = FailoverLog.of([(0xABCDEF, 3), (UUID, 0)])
    claim = crashed_rollback(mirror, owners, 46, "rollback-crash", fresh_log)

    state = recover(mirror, owner_id=claim.owner_id, vbuckets=[46])
    assert state.positions[46] == VbucketPosition.at_boundary(46, UUID, 2)
    assert state.failover_logs == {46: fresh_log}
    assert state.next_batch_id == 4
    assert documents(mirror, [46]) == {(46, "a", 2, '{"v":2}')}
    assert FailoverLogsTable.of(mirror).load([46]) == {46: fresh_log}


def test_a_repair_that_crashes_writing_checkpoints_has_restored_the_failover_log(
    mirror: MirrorTable, owners: OwnersTable, monkeypatch: pytest.MonkeyPatch
) -> None:
    fresh_log = FailoverLog.of([(0xFEDCBA, 3), (UUID, 0)])
    claim = crashed_rollback(mirror, owners, 47, "repair-crash", fresh_log)

    def crash_recording(self: CheckpointsTable, commits: object) -> None:
        raise Crash("the repair died writing checkpoint rows")

    with monkeypatch.context() as patched:
        patched.setattr(CheckpointsTable, "record", crash_recording)
        with pytest.raises(Crash):
            repair_checkpoints(mirror)
    # Whatever the repair managed before it died, the next start must see the rollback's log.
    assert FailoverLogsTable.of(mirror).load([47]) == {47: fresh_log}
    state = recover(mirror, owner_id=claim.owner_id, vbuckets=[47])
    assert state.positions[47] == VbucketPosition.at_boundary(47, UUID, 2)
    assert state.failover_logs == {47: fresh_log}
    owners.release(claim)


def test_a_repaired_rollback_log_does_not_replace_a_newer_saved_one(
    mirror: MirrorTable, owners: OwnersTable
) -> None:
    # The rollback commits and the process goes on: its stream request saves a newer log, then
    # the process dies before the rollback's checkpoints are written. The repair restores the
    # rollback's log as of the rollback's commit, so the newer log stays the answer.
    rollback_log = FailoverLog.of([(0xAAAA, 3), (UUID, 0)])
    claim = crashed_rollback(mirror, owners, 48, "repair-newer-log", rollback_log)
    newer_log = FailoverLog.of([(0xBBBB, 4), (0xAAAA, 3), (UUID, 0)])
    FailoverLogsTable.of(mirror).save({48: newer_log})

    state = recover(mirror, owner_id=claim.owner_id, vbuckets=[48])

    assert state.repaired_versions  # the rollback's checkpoints were missing
    assert state.failover_logs == {48: newer_log}
    owners.release(claim)


def test_a_new_mirror_is_claimed_and_recovered_with_one_spark_job(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Every table of a new mirror holds only its creation: nothing needs a Spark job to read,
    and a claim with no one to evict is an append, one job."""
    mirror = open_or_create(spark, str(tmp_path / "new"), MirrorConfig("new", num_vbuckets=64))
    context = spark.sparkContext
    context.setJobGroup("new-mirror-start", "claim and recover a new mirror")
    try:
        claim = OwnersTable.of(mirror).claim(range(64), "first-writer")
        state = recover(mirror, owner_id=claim.owner_id, vbuckets=claim.vbuckets)
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    assert len(context.statusTracker().getJobIdsForGroup("new-mirror-start")) == 1
    assert state.first_loads == frozenset(range(64))
    assert state.failover_logs == {}
    assert state.next_batch_id == FIRST_BATCH_ID
    history = spark.sql(f"DESCRIBE HISTORY delta.`{mirror.layout.owners}`").orderBy("version")
    assert [row["operation"] for row in history.collect()] == ["CREATE TABLE", "WRITE"]
