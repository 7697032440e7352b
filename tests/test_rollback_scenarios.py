"""Issue 6's harder rollback cases: repeated failovers, failovers during a continuous run or
while a group commit is being gathered, and the v2.2 purge seqno on stream requests.

Every scenario ends with the mirror equal to the producer and checks every table version
written on the way against the history it was committed on (a branch a failover later threw
away included), with `assert_every_version_consistent_across_rollbacks`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from delta.tables import DeltaTable

from replicator.delta.commit_metadata import COMMIT, ROLLBACK
from replicator.delta.table import table_version
from replicator.pipeline.replication import Replication
from replicator.sim.bucket import SimBucket
from replicator.sim.cluster import SimCluster
from replicator.sim.commands import dcp_streams
from replicator.sim.workload import Workload, WorkloadMix, initial_load
from tests.mirror_check import (
    LostBranch,
    assert_every_version_consistent_across_rollbacks,
    assert_mirror_equals_bucket,
    committed_marks_by_version,
    fail_over_recording,
    mirror_frame,
)
from tests.replication_runs import BackgroundReplication, replicate, replicator_settings

pytestmark = pytest.mark.spark

VBUCKETS = 4
ROLLED = 1
MIX = WorkloadMix(inserts=6, updates=3, deletes=1, expiries=0)


# --- helpers ----------------------------------------------------------------------------------


def write_docs(bucket: SimBucket, vbucket: int, count: int, prefix: str) -> None:
    """`count` new documents in `vbucket`: its high seqno goes up by exactly `count`."""
    for key in bucket.keys_in_vbucket(vbucket, count, prefix):
        bucket.upsert(key, json.dumps({"key": key, "prefix": prefix}).encode())


def rows_outside(spark: Any, target: Path, vbucket: int) -> list[Any]:
    frame = mirror_frame(spark, str(target)).where(f"vbucket != {vbucket}")
    return list(frame.orderBy("vbucket", "collection_id", "key").collect())


def positions_outside(spark: Any, target: Path, vbucket: int) -> dict[int, tuple[int, int]]:
    marks = committed_marks_by_version(spark, str(target))
    newest = marks[max(marks)]
    return {vb: (m.seqno, m.vbucket_uuid) for vb, m in newest.items() if vb != vbucket}


def commit_kinds_since(spark: Any, target: Path, version: int) -> list[tuple[int, str]]:
    """(version, kind) of the replicator's data commits after `version`, oldest first."""
    history = DeltaTable.forPath(spark, str(target)).history().collect()
    kinds = [
        (row["version"], json.loads(row["userMetadata"])["kind"])
        for row in history
        if row["version"] > version and row["userMetadata"]
    ]
    return sorted(kinds)


@pytest.fixture
def cluster() -> Iterator[SimCluster]:
    bucket = SimBucket("orders", num_vbuckets=VBUCKETS, seed=17)
    initial_load(bucket, docs=80, doc_size=120, seed=17)
    with SimCluster(bucket, nodes=1) as running:
        yield running


# --- 1. failovers in a row ----------------------------------------------------------------------


def test_repeated_failovers_before_and_during_a_rollback_rewind_only_that_vbucket(
    spark: Any, cluster: SimCluster, tmp_path: Path
) -> None:
    target = tmp_path / "mirror"
    bucket = cluster.bucket
    boundaries = []
    for round_ in range(4):  # boundaries c0, c0+4, c0+8, c0+12
        if round_:
            write_docs(bucket, ROLLED, 4, f"round{round_}")
        replicate(spark, cluster, target)
        boundaries.append(bucket.high_seqnos()[ROLLED])
    c0 = boundaries[0]
    others_rows = rows_outside(spark, target, ROLLED)
    others_positions = positions_outside(spark, target, ROLLED)

    # Two failovers before the replicator runs again: the second cuts below the first.
    lost: list[LostBranch] = [fail_over_recording(bucket, ROLLED, lose_last=2)]  # branch c0+10
    write_docs(bucket, ROLLED, 2, "branch1")
    lost.append(fail_over_recording(bucket, ROLLED, lose_last=7))  # branch c0+5
    write_docs(bucket, ROLLED, 3, "branch2")  # high c0+8, the run's target

    # A third while the mirror commits its rollback to c0+4: the producer then answers the
    # request from c0+4 with another rollback (to c0+2), and the mirror goes back to c0.
    fired: list[int] = []
    rollbacks_seen: dict[str, Replication] = {}

    def third_failover(step: str) -> None:
        replication = rollbacks_seen["replication"]
        if step == "after_data_commit" and replication.stats.rollbacks == 1 and not fired:
            fired.append(1)
            lost.append(fail_over_recording(bucket, ROLLED, lose_last=6))  # branch c0+2
            write_docs(bucket, ROLLED, 9, "branch3")  # high c0+11

    summary = replicate(
        spark, cluster, target, fault_hook=third_failover,
        on_started=lambda r: rollbacks_seen.update(replication=r),
    )

    assert fired, "the third failover never ran: no rollback commit happened"
    assert summary.rollbacks == 2
    assert summary.full_resyncs == 0
    assert_mirror_equals_bucket(spark, str(target), bucket)
    assert rows_outside(spark, target, ROLLED) == others_rows
    assert positions_outside(spark, target, ROLLED) == others_positions
    rewinds = [
        json.loads(row["userMetadata"])
        for row in DeltaTable.forPath(spark, str(target)).history().collect()
        if row["userMetadata"] and json.loads(row["userMetadata"])["kind"] == ROLLBACK
    ]
    assert sorted(r["to_seqno"] for r in rewinds) == [c0, c0 + 4]
    assert assert_every_version_consistent_across_rollbacks(spark, str(target), bucket, lost) >= 7


# --- 2. failover during the initial load ------------------------------------------------------


def test_failover_during_a_continuous_initial_load_ends_equal_to_the_producer(
    spark: Any, tmp_path: Path
) -> None:
    bucket = SimBucket("orders", num_vbuckets=VBUCKETS, seed=23)
    before = Workload(seed=23, doc_size=120, mix=MIX)
    before.ensure_collections(bucket)
    bucket.apply_batch(before.inserts(40))
    target = tmp_path / "mirror"
    with SimCluster(bucket, nodes=1) as cluster:
        config = replicator_settings(cluster, target, until_caught_up=False, commit_interval_s=0.05)
        with BackgroundReplication(spark, config) as run:
            # The load goes on in waves; V commits its first snapshots meanwhile.
            for _ in range(3):
                bucket.apply_batch(before.next_batch(40))
                reached = bucket.high_seqnos()[ROLLED]
                run.wait_for(
                    lambda s=reached: run.progress.committed.get(ROLLED, 0) >= s,  # type: ignore[misc]
                    f"vbucket {ROLLED} committed seqno {reached}",
                )
            committed = run.progress.committed[ROLLED]
            write_docs(bucket, ROLLED, 3, "uncommitted")
            # Lose the 3 uncommitted items and the last 2 committed: the mirror must roll back.
            lost = [fail_over_recording(bucket, ROLLED, lose_last=5)]
            assert lost[0].branch_seqno == committed - 2
            after = Workload(seed=99, doc_size=120, mix=MIX)
            for _ in range(2):
                bucket.apply_batch(after.next_batch(40))
            run.wait_for(lambda: run.progress.rollbacks >= 1, f"vbucket {ROLLED} rolled back")
            summary = run.finish(bucket.high_seqnos())
    assert summary.caught_up
    assert summary.rollbacks >= 1
    assert_mirror_equals_bucket(spark, str(target), bucket)
    assert assert_every_version_consistent_across_rollbacks(spark, str(target), bucket, lost) >= 4


# --- 3. failover while a group commit is being gathered ---------------------------------------


def test_failover_while_snapshots_wait_for_a_group_commit_drops_only_that_vbuckets(
    spark: Any, cluster: SimCluster, tmp_path: Path
) -> None:
    target = tmp_path / "mirror"
    bucket = cluster.bucket
    replicate(spark, cluster, target)
    c0 = bucket.high_seqnos()[ROLLED]
    write_docs(bucket, ROLLED, 4, "committed")
    replicate(spark, cluster, target)
    c1 = c0 + 4
    start_version = table_version(spark, str(target))

    # Nothing commits on its own during this run: every complete snapshot waits for the stop.
    config = replicator_settings(
        cluster, target, until_caught_up=False, commit_interval_s=3600, commit_max_rows=10**6
    )
    with BackgroundReplication(spark, config) as run:
        for vb in range(VBUCKETS):
            write_docs(bucket, vb, 5, "gathered")
        highs = bucket.high_seqnos()
        run.wait_for(
            lambda: all(run.progress.staged_up_to.get(vb) == highs[vb] for vb in range(VBUCKETS)),
            "every vbucket's new snapshots are staged",
        )
        assert run.progress.committed[ROLLED] == c1
        lost = [fail_over_recording(bucket, ROLLED, lose_last=7)]  # branch c0+2 < c1
        run.wait_for(
            lambda: run.progress.rollbacks == 1 and run.progress.committed.get(ROLLED) == c0,
            f"vbucket {ROLLED} rewound to {c0}",
        )
        write_docs(bucket, ROLLED, 3, "new-branch")
        new_high = bucket.high_seqnos()[ROLLED]
        run.wait_for(
            lambda: run.progress.staged_up_to.get(ROLLED) == new_high,
            f"vbucket {ROLLED}'s new branch is staged up to {new_high}",
        )
        summary = run.stop()

    assert summary.rollbacks == 1
    assert summary.full_resyncs == 0
    assert_mirror_equals_bucket(spark, str(target), bucket)
    # The rollback commit first, then one group commit carrying every vbucket.
    kinds = commit_kinds_since(spark, target, start_version)
    assert [kind for _, kind in kinds] == [ROLLBACK, COMMIT]
    marks = committed_marks_by_version(spark, str(target))
    final = marks[kinds[-1][0]]
    assert {vb: m.seqno for vb, m in final.items()} == bucket.high_seqnos()
    # V's staged snapshots above the branch point never landed: no version shows V above c1.
    before_final = [m[ROLLED].seqno for v, m in marks.items() if v < kinds[-1][0] and ROLLED in m]
    assert max(before_final) == c1
    assert assert_every_version_consistent_across_rollbacks(spark, str(target), bucket, lost) >= 4


# --- 5. the v2.2 purge seqno --------------------------------------------------------------------


def test_purge_below_the_committed_position_resumes_without_rollback_and_sends_the_purge_seqno(
    spark: Any, cluster: SimCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "mirror"
    bucket = cluster.bucket
    doomed = bucket.keys_in_vbucket(ROLLED, 3, "doomed")
    for key in doomed:
        bucket.upsert(key, b'{"doomed": true}')
    for key in doomed[:2]:
        bucket.delete(key)
    last_delete = bucket.high_seqnos()[ROLLED]
    write_docs(bucket, ROLLED, 2, "after-deletes")
    replicate(spark, cluster, target)
    committed = bucket.high_seqnos()[ROLLED]

    purge_seqno = cluster.purge_tombstones(ROLLED, up_to=last_delete)
    assert 0 < purge_seqno < committed
    sent: list[int | None] = []
    parse = dcp_streams._stream_options

    def recording(value: bytes) -> Any:
        options = parse(value)
        sent.append(options.purge_seqno)
        return options

    monkeypatch.setattr(dcp_streams, "_stream_options", recording)

    # The first resume knows no purge yet; its snapshots' v2.2 markers carry the purge seqno.
    write_docs(bucket, ROLLED, 2, "first-resume")
    first = replicate(spark, cluster, target)
    assert (first.rollbacks, first.full_resyncs) == (0, 0)
    assert purge_seqno not in sent
    sent.clear()
    write_docs(bucket, ROLLED, 2, "second-resume")
    second = replicate(spark, cluster, target)

    assert (second.rollbacks, second.full_resyncs) == (0, 0)
    assert purge_seqno in sent, f"no stream request carried purge seqno {purge_seqno}: {sent}"
    assert_mirror_equals_bucket(spark, str(target), bucket)
    mirrored = {row["key"] for row in mirror_frame(spark, str(target)).collect()}
    assert doomed[2] in mirrored and not set(doomed[:2]) & mirrored
    assert assert_every_version_consistent_across_rollbacks(spark, str(target), bucket, []) >= 3
