"""Checkpoint rows appended by delta-rs: the same rows Spark's append writes, idempotent by the
owner's txn version, and read back by Spark."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from chispa import assert_df_equality

from replicator.delta.checkpoints import CheckpointsTable
from replicator.delta.commit_metadata import CommitMetadata
from replicator.delta.schema import MirrorConfig
from replicator.delta.table import (
    CommitRecord,
    MirrorTable,
    delta_snapshot,
    open_or_create,
    table_version,
)
from replicator.model.positions import VbucketPosition

pytestmark = pytest.mark.spark

UUID = 0xFEEDFACECAFEBEEF  # above 2**63: a decimal(20, 0) in the table


def _commits(owner: str, batches: range, vbuckets: range) -> list[CommitRecord]:
    records = []
    for batch in batches:
        positions = {
            vb: VbucketPosition(vb, UUID, 100 * batch + vb, 100 * batch, 100 * batch + vb,
                                purge_seqno=batch, manifest_uid=7)
            for vb in vbuckets
        }  # fmt: skip
        moment = datetime(2026, 11, 28, 12, batch, 30, 123456, tzinfo=UTC)
        records.append(CommitRecord(
            10 + batch, moment, CommitMetadata("commit", batch, 0, owner, "merge", positions)
        ))  # fmt: skip
    return records


def _mirror(spark: Any, path: Path) -> MirrorTable:
    return open_or_create(spark, str(path), MirrorConfig("b", num_vbuckets=64))


def test_delta_rs_appends_the_rows_spark_appends(spark: Any, tmp_path: Path) -> None:
    by_spark = CheckpointsTable.of(_mirror(spark, tmp_path / "s"), spark_appends=True)
    by_delta_rs = CheckpointsTable.of(_mirror(spark, tmp_path / "r"))
    commits = [*_commits("vb0-31", range(1, 4), range(32)), *_commits("vb32-63", range(2, 4),
                                                                     range(32, 64))]  # fmt: skip
    for table in (by_spark, by_delta_rs):
        table.record(commits)

    assert_df_equality(
        by_delta_rs.read(), by_spark.read(), ignore_row_order=True, ignore_nullable=False
    )
    from delta.tables import DeltaTable

    newest = DeltaTable.forPath(spark, by_delta_rs.path).history(1).collect()[0]
    assert str(newest["engineInfo"]).startswith("delta-rs")
    assert {vb: c.seqno for vb, c in by_delta_rs.latest(range(64)).items()} == {
        vb: 300 + vb for vb in range(64)
    }


def test_an_owner_s_rows_recorded_already_are_not_appended_again(
    spark: Any, tmp_path: Path
) -> None:
    mirror = _mirror(spark, tmp_path / "m")
    checkpoints = CheckpointsTable.of(mirror)
    checkpoints.record(_commits("vb0-7", range(1, 3), range(8)))
    version = table_version(spark, checkpoints.path)

    checkpoints.record(_commits("vb0-7", range(2, 3), range(8)))  # a repeat after a restart
    assert table_version(spark, checkpoints.path) == version
    checkpoints.record(_commits("vb0-7", range(3, 4), range(8)))  # the next batch
    assert table_version(spark, checkpoints.path) == version + 1
    assert checkpoints.read().count() == 3 * 8
    # The pruner's count of the table's files, from delta-rs, is Delta's own.
    delta_s_count = int(delta_snapshot(spark, checkpoints.path).numOfFiles())
    assert checkpoints.live_files() == delta_s_count == 2
    log = Path(checkpoints.path) / "_delta_log" / f"{version + 1:020d}.json"
    txns = [json.loads(line)["txn"] for line in log.read_text().splitlines() if '"txn"' in line]
    assert [t["version"] for t in txns] == [_commits("vb0-7", range(3, 4), range(8))[0]
                                            .metadata.txn_version]  # fmt: skip
