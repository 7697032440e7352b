"""`--history` end to end (issue 23): change streams from the embedded producer into the history
table beside the mirror, through a failover and rollback.

The producer's own revisions (`history_revisions`) are the oracle: the history table holds each
committed one, the mirror stays deduplicated and equal to the producer, and the revisions a
rollback discarded are kept and marked."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from replicator.delta.schema import MirrorLayout
from replicator.inspect.revisions import revision_history
from replicator.sim.bucket import SimBucket
from replicator.sim.cluster import SimCluster
from tests.mirror_check import assert_mirror_equals_bucket
from tests.replication_runs import replicate

pytestmark = pytest.mark.spark

VBUCKETS = 4
ROLLED = 1
REVISION_SCHEMA = StructType(
    [
        StructField("vbucket", IntegerType(), False),
        StructField("key", StringType(), False),
        StructField("seqno", LongType(), False),
        StructField("cas", LongType(), False),
        StructField("op", StringType(), False),
    ]
)


def write(bucket: SimBucket, keys: list[str], rounds: int, tag: str) -> None:
    """Each key `rounds` times in one go: one snapshot holds every revision of it."""
    for round_ in range(rounds):
        for key in keys:
            bucket.upsert(key, json.dumps({"key": key, "tag": tag, "round": round_}).encode())


@pytest.fixture
def cluster() -> Iterator[SimCluster]:
    bucket = SimBucket("orders", num_vbuckets=VBUCKETS, seed=5, history_retention_seconds=86_400)
    keys = [k for vb in range(VBUCKETS) for k in bucket.keys_in_vbucket(vb, 5, f"doc{vb}-")]
    write(bucket, keys, rounds=3, tag="first")
    bucket.delete(keys[0])
    with SimCluster(bucket, nodes=1) as running:
        yield running


def producer_revisions(spark: Any, bucket: SimBucket) -> Any:
    rows = [
        (vb, item.key.decode(), item.by_seqno, item.cas,
         "upsert" if type(item).__name__ == "Mutation" else "delete")
        for vb in range(bucket.num_vbuckets)
        for item in bucket.history_revisions(vb)
    ]  # fmt: skip
    return spark.createDataFrame(rows, REVISION_SCHEMA)


def standing_revisions(spark: Any, target: Path) -> Any:
    """The history table's committed revisions that no rollback discarded, one row each."""
    keys = {r["key"] for r in spark.read.format("delta").load(MirrorLayout(str(target)).history)
            .where("op <> 'rollback'").select("key").distinct().collect()}  # fmt: skip
    rows = []
    for key in sorted(keys):
        revisions = revision_history(None, str(target), key)
        assert revisions is not None
        rows += [(r.vbucket, r.key, r.seqno, r.cas, r.operation) for r in revisions
                 if r.rolled_back_at is None]  # fmt: skip
    return spark.createDataFrame(rows, REVISION_SCHEMA)


def test_history_keeps_every_revision_and_marks_a_rolled_back_branch(
    spark: Any, cluster: SimCluster, tmp_path: Path
) -> None:
    target = tmp_path / "mirror"
    bucket = cluster.bucket
    replicate(spark, cluster, target, history=True)
    assert_mirror_equals_bucket(spark, str(target), bucket)
    expected = producer_revisions(spark, bucket)
    assert expected.count() == 4 * 5 * 3 + 1  # every revision: 3 per key, and the delete
    assert_df_equality(standing_revisions(spark, target), expected, ignore_row_order=True)

    rolled_keys = bucket.keys_in_vbucket(ROLLED, 2, f"doc{ROLLED}-")
    write(bucket, rolled_keys, rounds=3, tag="doomed")
    replicate(spark, cluster, target, history=True)
    doomed_seqnos = {i.by_seqno for i in bucket.history_revisions(ROLLED)
                     if b"doomed" in (getattr(i, "value", b"") or b"")}  # fmt: skip
    assert len(doomed_seqnos) == 6

    cluster.failover(ROLLED, lose_last=6)  # the doomed branch is lost on the producer
    write(bucket, rolled_keys, rounds=2, tag="after-failover")
    summary = replicate(spark, cluster, target, history=True)

    assert summary.rollbacks == 1
    assert_mirror_equals_bucket(spark, str(target), bucket)
    assert_df_equality(
        standing_revisions(spark, target), producer_revisions(spark, bucket),
        ignore_row_order=True,
    )
    revisions = revision_history(None, str(target), rolled_keys[0])
    assert revisions is not None
    discarded = [r for r in revisions if r.rolled_back_at is not None]
    assert {r.seqno for r in discarded} <= doomed_seqnos and len(discarded) == 3
    assert all(r.value is not None and "doomed" in str(r.value) for r in discarded)
    assert all(r.rolled_back_at is not None and r.rolled_back_at > r.table_version
               for r in discarded)  # fmt: skip
    standing = [json.loads(str(r.value))["tag"] for r in revisions if r.rolled_back_at is None]
    assert standing[-2:] == ["after-failover", "after-failover"]
    history = spark.read.format("delta").load(MirrorLayout(str(target)).history)
    markers = history.where(F.col("op") == "rollback").collect()
    # Back to the boundary the first run committed, just below the lost branch.
    assert [(m["vbucket"], m["seqno"]) for m in markers] == [(ROLLED, min(doomed_seqnos) - 1)]


def test_a_producer_without_change_streams_is_named_and_the_mirror_runs_as_usual(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bucket = SimBucket("plain", num_vbuckets=2, seed=3)  # couchstore: no change streams
    write(bucket, [f"k{i}" for i in range(10)], rounds=2, tag="x")
    target = tmp_path / "mirror"
    with SimCluster(bucket, nodes=1) as cluster, caplog.at_level(logging.WARNING):
        replicate(spark, cluster, target, history=True)
    assert_mirror_equals_bucket(spark, str(target), bucket)
    assert any("refused change streams" in r.getMessage() for r in caplog.records)
    assert revision_history(None, str(target), "k1") is None  # no history table


def test_a_backfill_split_at_the_history_start_records_only_the_history_part(
    spark: Any, tmp_path: Path
) -> None:
    # About 200 bytes a revision, 2,000 bytes a vbucket: each vbucket's history window holds
    # its newest ten or so revisions, and its backfill has a deduplicated part before them.
    bucket = SimBucket("orders", num_vbuckets=2, seed=8, history_retention_bytes=4_000)
    keys = [k for vb in range(2) for k in bucket.keys_in_vbucket(vb, 9, f"doc{vb}-")]
    cold, hot = keys[::3], [k for k in keys if k not in keys[::3]]
    write(bucket, cold, rounds=1, tag="cold")  # below the window: the deduplicated part
    write(bucket, hot, rounds=5, tag="x" * 120)
    bucket.evict_checkpoints()  # streams start with a backfill from "disk"
    starts = [bucket.history_start_seqno(vb) for vb in range(2)]
    assert all(1 < start <= bucket.high_seqnos()[vb] for vb, start in enumerate(starts))
    target = tmp_path / "mirror"
    with SimCluster(bucket, nodes=1) as cluster:
        replicate(spark, cluster, target, history=True)
    assert_mirror_equals_bucket(spark, str(target), bucket)
    history = spark.read.format("delta").load(MirrorLayout(str(target)).history)
    actual = history.select("vbucket", "key", "seqno", "cas", "op")
    expected = producer_revisions(spark, bucket)
    assert 0 < expected.count() < len(hot) * 5
    assert not any("cold" in str(r) for r in actual.collect())
    assert_df_equality(actual, expected, ignore_row_order=True, ignore_nullable=True)
