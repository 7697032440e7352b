"""Compaction written from Arrow: the rows Spark reads are the same, deleted rows are gone, the
change data feed is silent, and a compaction that meets another writer's commit gives way."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from chispa import assert_df_equality

from replicator.delta import bin_packing
from replicator.delta.bin_packing import candidates, pack_partitions
from replicator.delta.commit_metadata import CommitMetadata
from replicator.delta.deletion_vectors import DeletionVectorDescriptor
from replicator.delta.executor import CommitExecutor
from replicator.delta.log_snapshot import DataFile, read_snapshot
from replicator.delta.ownership import OwnersTable
from replicator.delta.row_images import RowImages
from replicator.delta.schema import MirrorConfig
from replicator.delta.table import open_or_create
from tests.delta.helpers import batch, delete, documents, upsert, vbucket_commit

VBUCKETS = (0, 1, 70)  # partitions 0 and 1 of 64 vbuckets


def _file(name: str, size: int, records: int, deleted: int | None = None) -> DataFile:
    vector = None if deleted is None else DeletionVectorDescriptor("u", "x" * 20, 10, deleted, 1)
    stats = f'{{"numRecords": {records}}}'
    return DataFile(name, {"vbucket_group": "0"}, size, 0, stats, vector)


def test_candidates_are_small_files_and_mostly_deleted_ones_as_optimize_picks_them() -> None:
    large, small, gutted = _file("l", 900, 100), _file("s", 90, 10), _file("g", 900, 100, 40)
    assert candidates([large, small, gutted], 100, 0.3) == [small, gutted]
    assert candidates([large, gutted], 100, 0.5) == []  # 40% deleted is under the share
    assert candidates([large, small], 100, 0.3) == []  # one file, nothing hidden: no change
    assert candidates([large, _file("d", 900, 100, 1)], 1000, 0.3) == [
        large, _file("d", 900, 100, 1)
    ]  # fmt: skip
    assert candidates([_file("d", 90, 100, 1)], 100, 0.3) == [_file("d", 90, 100, 1)]


def _changed_mirror(spark: Any, path: Path) -> tuple[Any, Any, Any]:
    """A mirror loaded by one append, then changed by two steady batches written as deletion
    vectors: each partition has a large file with a vector and two small files."""
    mirror = open_or_create(spark, str(path), MirrorConfig("travel", num_vbuckets=128))
    owners = OwnersTable.of(mirror)
    claim = owners.claim(VBUCKETS)
    executor = CommitExecutor(mirror, claim, owners)
    executor.execute(batch(1, *(
        vbucket_commit(vb, [upsert(vb, f"k{i}", i + 1) for i in range(30)], seqno=30,
                       first_load=True)
        for vb in VBUCKETS
    )))  # fmt: skip
    for n in (2, 3):
        executor.execute(batch(n, *(
            vbucket_commit(vb, [upsert(vb, f"k{n}", 30 + n), delete(vb, f"k{10 + n}", 30 + n),
                                upsert(vb, f"new{n}", 30 + n)],
                           seqno=30 + n, first_load=False, previous_seqno=29 + n)
            for vb in VBUCKETS
        )))  # fmt: skip
    return mirror, owners, claim


@pytest.mark.spark
def test_packed_partitions_read_the_same_rows_without_their_deleted_ones(
    spark: Any, tmp_path: Path
) -> None:
    mirror, owners, claim = _changed_mirror(spark, tmp_path / "m")
    expected = spark.createDataFrame(mirror.read().collect(), mirror.read().schema)
    before = read_snapshot(str(tmp_path / "m"))
    assert any(f.deletion_vector for f in before.files.values())

    packed = pack_partitions(
        str(tmp_path / "m"), mirror.data_layout, before, {0: 1024**3},
        max_deleted_share=0.3,
    )  # fmt: skip

    assert packed is not None and packed.version == before.version + 1
    # Partition 0 (vbuckets 0 and 1): its large file and two small ones -> one file.
    assert (packed.removed, packed.added) == (3, 1)
    assert packed.purged_rows == 2 * 2 * 2  # a batch replaced one row and deleted one a vbucket
    after = read_snapshot(str(tmp_path / "m"))
    packed_files = [f for f in after.files.values() if f.partition_values["vbucket_group"] == "0"]
    assert len(packed_files) == 1 and packed_files[0].deletion_vector is None
    assert packed_files[0].num_records == 2 * (30 + 2 - 2)  # live rows only
    untouched = {k for k, f in before.files.items() if f.partition_values["vbucket_group"] == "1"}
    assert untouched <= set(after.files)
    assert_df_equality(mirror.read(), expected, ignore_row_order=True)
    [entry] = mirror.delta().history(1).collect()
    assert entry["operation"] == "OPTIMIZE" and entry["version"] == packed.version
    assert entry["operationMetrics"]["numRemovedFiles"] == "3"
    assert CommitMetadata.from_json(entry["userMetadata"]) is None  # not a replicator commit
    feed = (
        spark.read.format("delta").option("readChangeFeed", "true")
        .option("startingVersion", packed.version).load(mirror.layout.data)
    )  # fmt: skip
    assert feed.count() == 0  # the same rows: no change data
    # Steady batches go on over the packed file.
    executor = CommitExecutor(mirror, claim, owners)
    executor.execute(batch(4, vbucket_commit(
        0, [upsert(0, "k5", 40), delete(0, "new2", 40)], seqno=40, first_load=False,
        previous_seqno=33,
    )))  # fmt: skip
    rows = documents(mirror, [0])
    assert (0, "k5", 40, '{"v":40}') in rows and not any(r[1] == "new2" for r in rows)
    assert len(rows) == 30 + 2 - 2 - 1
    owners.release(claim)


@pytest.mark.spark
def test_a_compaction_that_meets_another_commit_gives_way_and_leaves_no_file(
    spark: Any, tmp_path: Path
) -> None:
    mirror, owners, claim = _changed_mirror(spark, tmp_path / "m")
    stale = read_snapshot(str(tmp_path / "m"))
    CommitExecutor(mirror, claim, owners).execute(batch(4, vbucket_commit(
        1, [upsert(1, "k1", 40)], seqno=40, first_load=False, previous_seqno=33,
    )))  # fmt: skip
    expected = spark.createDataFrame(mirror.read().collect(), mirror.read().schema)
    on_disk = {p for p in (tmp_path / "m").rglob("*") if p.is_file()}

    packed = pack_partitions(
        str(tmp_path / "m"), mirror.data_layout, stale, {0: 1024**3, 1: 1024**3},
        max_deleted_share=0.3,
    )  # fmt: skip

    assert packed is None
    assert {p for p in (tmp_path / "m").rglob("*") if p.is_file()} == on_disk
    assert read_snapshot(str(tmp_path / "m")).version == stale.version + 1
    assert_df_equality(mirror.read(), expected, ignore_row_order=True)
    # Nothing to pack: no entry at all.
    fresh = read_snapshot(str(tmp_path / "m"))
    assert pack_partitions(
        str(tmp_path / "m"), mirror.data_layout, fresh, {5: 1},
    ).version is None  # type: ignore[union-attr]  # fmt: skip
    assert not os.path.exists(tmp_path / "m" / "_delta_log" / f"{fresh.version + 1:020d}.json")
    owners.release(claim)


@pytest.mark.spark
def test_a_failure_after_the_entry_landed_keeps_its_files(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mirror, owners, claim = _changed_mirror(spark, tmp_path / "m")
    expected = spark.createDataFrame(mirror.read().collect(), mirror.read().schema)
    snapshot = read_snapshot(str(tmp_path / "m"))

    def landed_then_failed(log_file: str, actions: Any) -> bool:
        assert bin_packing_publish(log_file, actions)
        raise OSError("the disk went away after the entry was linked")

    bin_packing_publish = bin_packing.publish_entry
    monkeypatch.setattr(bin_packing, "publish_entry", landed_then_failed)
    with pytest.raises(OSError, match="went away"):
        pack_partitions(
            str(tmp_path / "m"), mirror.data_layout, snapshot, {0: 1024**3, 1: 1024**3},
            max_deleted_share=0.3,
        )  # fmt: skip

    after = read_snapshot(str(tmp_path / "m"))
    assert after.version == snapshot.version + 1
    assert all(os.path.exists(f.local_path(str(tmp_path / "m"))) for f in after.files.values())
    assert_df_equality(mirror.read(), expected, ignore_row_order=True)
    owners.release(claim)


@pytest.mark.spark
def test_a_compaction_reads_row_images_writes_the_packed_files_and_drops_the_removed(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mirror, owners, claim = _changed_mirror(spark, tmp_path / "m")
    root = str(tmp_path / "m")
    expected = spark.createDataFrame(mirror.read().collect(), mirror.read().schema)
    before = read_snapshot(root)
    images = RowImages(root)
    partition_0 = [f for f in before.files.values() if f.partition_values["vbucket_group"] == "0"]
    for data_file in partition_0:  # as the steady writer leaves them
        writer = images.writer(data_file.path)
        assert writer is not None
        writer.write(pq.read_table(data_file.local_path(root)))
        writer.publish()

    def no_parquet(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a file with an image was decoded from Parquet")

    monkeypatch.setattr(bin_packing, "read_parts", no_parquet)
    packed = pack_partitions(
        root, mirror.data_layout, before, {0: 1024**3}, max_deleted_share=0.3,
        images=images,
    )  # fmt: skip

    assert packed is not None and (packed.removed, packed.added) == (3, 1)
    assert_df_equality(mirror.read(), expected, ignore_row_order=True)
    [packed_file] = [
        f for f in read_snapshot(root).files.values() if f.partition_values["vbucket_group"] == "0"
    ]
    image = images.read(packed_file.path, 2 * (30 + 2 - 2))
    assert image is not None
    assert image.equals(pq.read_table(packed_file.local_path(root)))
    assert all(images.read(f.path, f.num_records or 0) is None for f in partition_0)
    owners.release(claim)
