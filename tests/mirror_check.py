"""Row-by-row comparison of a mirror with the embedded producer's own state (chispa)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from chispa import assert_df_equality

from replicator.delta.schema import DATA_COLUMNS, DATA_SCHEMA
from replicator.sim.bucket import DocumentRecord, SimBucket


def expected_row(record: DocumentRecord) -> tuple[Any, ...]:
    """The mirror row a live document must become, written out independently of the pipeline."""
    scope, _, collection = record.collection.partition(".")
    xattrs = (
        "{" + ",".join(f"{json.dumps(name)}:{value}" for name, value in record.xattrs) + "}"
        if record.xattrs
        else None
    )
    return (
        record.vbucket,
        scope,
        collection,
        record.collection_id,
        record.key.decode(),
        record.seqno,
        record.rev_seqno,
        record.cas,
        record.flags,
        datetime.fromtimestamp(record.expiry, UTC).replace(tzinfo=None) if record.expiry else None,
        record.is_json,
        record.value.decode() if record.is_json else None,
        None if record.is_json else record.value,
        xattrs,
    )


def expected_frame(spark: Any, records: Iterable[DocumentRecord]) -> Any:
    return spark.createDataFrame([expected_row(r) for r in records], DATA_SCHEMA)


def mirror_frame(spark: Any, target: str, *, version: int | None = None) -> Any:
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return reader.load(target).select(*DATA_COLUMNS)


def assert_mirror_equals_bucket(
    spark: Any, target: str, bucket: SimBucket, *, vbuckets: Iterable[int] | None = None
) -> None:
    """The mirror holds exactly the bucket's live documents (of `vbuckets`, default all)."""
    wanted = None if vbuckets is None else set(vbuckets)
    records = [r for r in bucket.documents() if wanted is None or r.vbucket in wanted]
    actual = mirror_frame(spark, target)
    if wanted is not None:
        actual = actual.where(actual.vbucket.isin(sorted(wanted)))
    assert_df_equality(
        actual.orderBy("vbucket", "collection_id", "key"),
        expected_frame(spark, records).orderBy("vbucket", "collection_id", "key"),
        ignore_nullable=True,
    )


def committed_positions_by_version(spark: Any, target: str) -> dict[int, dict[int, int]]:
    """For every data table version, each vbucket's committed seqno at that version."""
    from delta.tables import DeltaTable

    checkpoints = spark.read.format("delta").load(f"{target}/_replicator/checkpoints").collect()
    versions = sorted(
        row["version"] for row in DeltaTable.forPath(spark, target).history().collect()
    )
    by_version: dict[int, dict[int, int]] = {}
    for version in versions:
        latest: dict[int, tuple[int, int]] = {}
        for row in checkpoints:
            if row["table_version"] <= version:
                seen = latest.get(row["vbucket"])
                if seen is None or row["table_version"] >= seen[0]:
                    latest[row["vbucket"]] = (row["table_version"], row["seqno"])
        by_version[version] = {vb: seqno for vb, (_, seqno) in latest.items()}
    return by_version


def assert_every_version_consistent(spark: Any, target: str, bucket: SimBucket) -> int:
    """Every table version holds, per vbucket, exactly the producer's state at the committed
    boundary of that version: no version exposes a partial snapshot. Needs an unbroken
    producer history (no failover). Returns how many versions were checked."""
    positions = committed_positions_by_version(spark, target)
    for version, seqnos in positions.items():
        records = [
            record
            for vbucket, seqno in seqnos.items()
            for record in bucket.state_at(vbucket, seqno)
        ]
        actual = mirror_frame(spark, target, version=version).orderBy(
            "vbucket", "collection_id", "key"
        )
        assert_df_equality(
            actual,
            expected_frame(spark, records).orderBy("vbucket", "collection_id", "key"),
            ignore_nullable=True,
        )
    return len(positions)


def assert_no_change_applied_twice(spark: Any, target: str) -> None:
    """In the change data feed, each (vbucket, collection, key, seqno) is written at most once."""
    feed = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", 0)
        .load(target)
        .where("_change_type IN ('insert', 'update_postimage')")
    )
    repeated = (
        feed.groupBy("vbucket", "collection_id", "key", "seqno").count().where("count > 1")
    )
    duplicates = repeated.limit(5).collect()
    assert not duplicates, f"changes applied more than once: {duplicates}"
