"""Rollback end to end (issue 6): failover, purge and vacuum against the embedded producer.

Each scenario commits a vbucket, changes history on the producer, then runs the replicator
again: the mirror must end equal to the producer, and only the affected vbucket may change.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chispa import assert_df_equality
from delta.tables import DeltaTable

from replicator.delta.checkpoints import CheckpointsTable
from replicator.delta.schema import MirrorConfig
from replicator.delta.table import open_or_create
from replicator.sim.bucket import SimBucket
from replicator.sim.cluster import SimCluster
from replicator.sim.workload import initial_load
from tests.mirror_check import assert_mirror_equals_bucket, mirror_frame
from tests.replication_runs import replicate

pytestmark = pytest.mark.spark

VBUCKETS = 4
ROLLED = 2


def write_docs(bucket: SimBucket, keys: list[str], round_: int) -> None:
    for key in keys:
        bucket.upsert(key, json.dumps({"key": key, "round": round_}).encode())


@pytest.fixture
def cluster() -> Iterator[SimCluster]:
    bucket = SimBucket("orders", num_vbuckets=VBUCKETS, seed=11)
    initial_load(bucket, docs=120, doc_size=150, seed=11)
    with SimCluster(bucket, nodes=1) as running:
        yield running


def positions(spark: Any, target: Path) -> dict[int, tuple[int, int]]:
    mirror = open_or_create(spark, str(target), MirrorConfig("orders"))
    latest = CheckpointsTable.of(mirror).latest()
    return {vb: (c.seqno, c.position.vbucket_uuid) for vb, c in latest.items()}


def others(frame: Any) -> Any:
    return frame.where(f"vbucket != {ROLLED}").orderBy("vbucket", "collection_id", "key")


def test_failover_losing_last_mutations_rolls_back_only_that_vbucket(
    spark: Any, cluster: SimCluster, tmp_path: Path
) -> None:
    target = tmp_path / "mirror"
    bucket = cluster.bucket
    replicate(spark, cluster, target)
    first_boundary = positions(spark, target)[ROLLED][0]
    write_docs(bucket, bucket.keys_in_vbucket(ROLLED, 6, "late"), round_=1)
    replicate(spark, cluster, target)
    before = positions(spark, target)
    other_rows_before = others(mirror_frame(spark, str(target))).collect()
    assert before[ROLLED][0] == first_boundary + 6

    cluster.failover(ROLLED, lose_last=4)  # branch point between the two committed boundaries
    write_docs(bucket, bucket.keys_in_vbucket(ROLLED, 3, "after-failover"), round_=2)
    summary = replicate(spark, cluster, target)

    assert summary.rollbacks == 1
    assert summary.full_resyncs == 0
    assert_mirror_equals_bucket(spark, str(target), bucket)
    after = positions(spark, target)
    assert {vb: p for vb, p in after.items() if vb != ROLLED} == {
        vb: p for vb, p in before.items() if vb != ROLLED
    }
    assert after[ROLLED][0] == bucket.high_seqnos()[ROLLED]
    assert_df_equality(
        others(mirror_frame(spark, str(target))),
        spark.createDataFrame(other_rows_before, mirror_frame(spark, str(target)).schema),
        ignore_nullable=True,
    )
    history = DeltaTable.forPath(spark, str(target)).history().collect()
    rollbacks = [
        json.loads(row["userMetadata"])
        for row in history
        if row["userMetadata"] and json.loads(row["userMetadata"]).get("kind") == "rollback"
    ]
    assert len(rollbacks) == 1
    details = rollbacks[0]
    assert details["vbucket"] == ROLLED
    assert details["to_seqno"] == first_boundary
    assert details["from_seqno"] == first_boundary + 6
    assert details["failover_log"][0][0] == bucket.failover_log(ROLLED).newest.vbucket_uuid


def test_purged_tombstones_force_full_resync_that_drops_deleted_keys(
    spark: Any, cluster: SimCluster, tmp_path: Path
) -> None:
    target = tmp_path / "mirror"
    bucket = cluster.bucket
    doomed = bucket.keys_in_vbucket(ROLLED, 3, "doomed")
    write_docs(bucket, doomed, round_=0)
    replicate(spark, cluster, target)
    for key in doomed:
        bucket.delete(key)
    write_docs(bucket, bucket.keys_in_vbucket(ROLLED, 2, "fresh"), round_=1)
    cluster.purge_tombstones(ROLLED)
    other_rows_before = others(mirror_frame(spark, str(target))).collect()

    summary = replicate(spark, cluster, target)

    assert summary.full_resyncs == 1
    assert_mirror_equals_bucket(spark, str(target), bucket)
    mirrored_keys = {row["key"] for row in mirror_frame(spark, str(target)).collect()}
    assert not mirrored_keys & set(doomed)
    assert_df_equality(
        others(mirror_frame(spark, str(target))),
        spark.createDataFrame(other_rows_before, mirror_frame(spark, str(target)).schema),
        ignore_nullable=True,
    )


def test_rollback_beyond_vacuumed_history_resyncs_instead_of_failing(
    spark: Any, cluster: SimCluster, tmp_path: Path
) -> None:
    target = tmp_path / "mirror"
    bucket = cluster.bucket
    replicate(spark, cluster, target)
    write_docs(bucket, bucket.keys_in_vbucket(ROLLED, 6, "late"), round_=1)
    replicate(spark, cluster, target)
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    try:
        # Rewrite everything, then vacuum: no old version can be read any more.
        spark.sql(f"OPTIMIZE delta.`{target}`")
        spark.sql(f"VACUUM delta.`{target}` RETAIN 0 HOURS")
    finally:
        spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")
    cluster.failover(ROLLED, lose_last=4)

    summary = replicate(spark, cluster, target)

    assert summary.rollbacks == 1
    assert summary.full_resyncs == 1
    assert_mirror_equals_bucket(spark, str(target), bucket)
