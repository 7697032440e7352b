"""Deletion vectors in Delta's format and a table's live files from its log: what Spark writes
is read exactly, and what is written here Spark reads."""

from __future__ import annotations

import json
import os
import struct
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from replicator.delta.deletion_vectors import (
    INLINE_STORAGE,
    DeletionVectorDescriptor,
    DeletionVectorError,
    decode_positions,
    encode_positions,
    read_positions,
    write_vectors,
    z85_decode,
    z85_encode,
)
from replicator.delta.dv_merge import runs
from replicator.delta.log_snapshot import LogSnapshotError, carries_txn, read_snapshot

DV_TABLE = "delta.enableDeletionVectors = true"


def test_z85_matches_the_specification_s_example() -> None:
    # ZeroMQ's RFC 32 gives this 8-byte example.
    data = bytes([0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B])
    assert z85_encode(data) == "HelloWorld"
    assert z85_decode("HelloWorld") == data
    uuid_bytes = uuid.uuid4().bytes
    assert z85_decode(z85_encode(uuid_bytes)) == uuid_bytes
    with pytest.raises(DeletionVectorError, match="not a Z85 character"):
        z85_decode("Hello Worl")
    with pytest.raises(ValueError, match="4-byte words"):
        z85_encode(b"abc")


def test_positions_round_trip_and_a_wrong_magic_is_refused() -> None:
    positions = [0, 3, 4, 65_536, 1_000_000, 2**32 + 5]
    data, cardinality = encode_positions(positions)
    assert cardinality == len(positions)
    assert struct.unpack_from("<i", data)[0] == 1681511377
    assert list(decode_positions(data)) == positions
    with pytest.raises(DeletionVectorError, match="magic"):
        decode_positions(b"\x00" + data[1:])


def test_vectors_written_to_a_file_read_back_and_damage_is_named(tmp_path: Path) -> None:
    first, second = [1, 2, 3], list(range(100, 5000, 7))
    descriptors = write_vectors(str(tmp_path), [first, second])
    assert [list(read_positions(str(tmp_path), d)) for d in descriptors] == [first, second]
    assert descriptors[0].offset == 1 and descriptors[0].unique_id != descriptors[1].unique_id
    [name] = os.listdir(tmp_path)
    assert name.startswith("deletion_vector_") and name.endswith(".bin")
    assert descriptors[0].file_path(f"file://{tmp_path}") == str(tmp_path / name)
    lying = DeletionVectorDescriptor(
        descriptors[0].storage_type, descriptors[0].path_or_inline_dv,
        descriptors[0].size_in_bytes, 4, descriptors[0].offset,
    )  # fmt: skip
    with pytest.raises(DeletionVectorError, match="holds 3 rows, its descriptor says 4"):
        read_positions(str(tmp_path), lying)
    damaged = bytearray((tmp_path / name).read_bytes())
    damaged[(descriptors[1].offset or 0) + 10] ^= 0xFF
    (tmp_path / name).write_bytes(bytes(damaged))
    with pytest.raises(DeletionVectorError, match="CRC"):
        read_positions(str(tmp_path), descriptors[1])


def test_an_inline_vector_reads_from_its_descriptor() -> None:
    data, cardinality = encode_positions([7, 9])
    padded = data + b"\x00" * (-len(data) % 4)
    inline = DeletionVectorDescriptor(INLINE_STORAGE, z85_encode(padded), len(data), cardinality)
    assert list(read_positions("/nowhere", inline)) == [7, 9]
    assert "offset" not in inline.to_json()
    assert DeletionVectorDescriptor.from_json(inline.to_json()) == inline


def _table_with_deletes(spark: Any, path: Path) -> list[int]:
    """A table of ids 0..599 over three partitions, then Spark's DELETE of ids divisible by 7
    (deletion vectors), and enough commits for a checkpoint. Returns the deleted ids."""
    spark.sql(
        f"CREATE TABLE delta.`{path}` (id BIGINT, part INT, payload STRING) USING delta "
        f"PARTITIONED BY (part) TBLPROPERTIES ({DV_TABLE})"
    )
    for start in range(0, 600, 50):  # 12 commits: Spark checkpoints at version 10
        spark.range(start, start + 50).selectExpr(
            "id", "CAST(id % 3 AS INT) AS part", "concat('p', id) AS payload"
        ).write.format("delta").mode("append").option("txnAppId", "loader").option(
            "txnVersion", start // 50
        ).save(str(path))
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id % 7 = 0")
    return [i for i in range(600) if i % 7 == 0]


@pytest.mark.spark
def test_spark_s_vectors_and_files_read_from_the_log(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "t"
    deleted = _table_with_deletes(spark, path)
    assert (path / "_delta_log" / f"{10:020d}.checkpoint.parquet").exists()

    snapshot = read_snapshot(str(path))

    live = {f.split("/")[-1] for f in spark.read.format("delta").load(str(path)).inputFiles()}
    assert {os.path.basename(f.path) for f in snapshot.files.values()} == live
    assert snapshot.version == 13 and snapshot.txn_versions == {"loader": 11}
    found_deleted, kept = [], []
    for data_file in snapshot.files.values():
        ids = pq.read_table(data_file.local_path(str(path)), columns=["id"])["id"].to_pylist()
        assert data_file.num_records == len(ids)
        positions = (
            set() if data_file.deletion_vector is None
            else set(read_positions(str(path), data_file.deletion_vector))
        )  # fmt: skip
        found_deleted += [i for n, i in enumerate(ids) if n in positions]
        kept += [i for n, i in enumerate(ids) if n not in positions]
    assert sorted(found_deleted) == deleted
    table = spark.read.format("delta").load(str(path))
    assert sorted(kept) == sorted(r[0] for r in table.collect())


@pytest.mark.spark
def test_a_snapshot_brought_up_to_date_equals_one_read_whole(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "t"
    _table_with_deletes(spark, path)
    before = read_snapshot(str(path))
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id % 5 = 0")  # vectors on vectors
    spark.sql(f"OPTIMIZE delta.`{path}` WHERE part = 0")

    updated = read_snapshot(str(path), since=before)

    assert updated == read_snapshot(str(path))
    assert updated.version > before.version
    live = {f.split("/")[-1] for f in spark.read.format("delta").load(str(path)).inputFiles()}
    assert {os.path.basename(f.path) for f in updated.files.values()} == live


@pytest.mark.spark
def test_spark_reads_the_vectors_written_here(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "t"
    _table_with_deletes(spark, path)
    snapshot = read_snapshot(str(path))
    # Delete ids 1 and 2 of every file of partition 1 by hand: a vector that is the union of
    # Spark's and these positions, replacing the file's entry.
    targets = [f for f in snapshot.files.values() if f.partition_values["part"] == "1"]
    vectors, removed = [], []
    for data_file in targets:
        ids = pq.read_table(data_file.local_path(str(path)), columns=["id"])["id"].to_pylist()
        old = (
            set() if data_file.deletion_vector is None
            else set(read_positions(str(path), data_file.deletion_vector))
        )  # fmt: skip
        mine = {n for n, i in enumerate(ids) if i % 10 in (1, 2)}
        removed += [ids[n] for n in mine - old]
        vectors.append(sorted(old | mine))
    descriptors = write_vectors(str(path), vectors)
    now = int(time.time() * 1000)
    actions: list[dict[str, Any]] = [{"commitInfo": {"timestamp": now, "operation": "DELETE"}}]
    for data_file, descriptor in zip(targets, descriptors, strict=True):
        remove = data_file.to_add_json() | {"deletionTimestamp": now, "dataChange": True}
        remove.pop("modificationTime")
        actions.append({"remove": remove})
        stats = json.loads(data_file.stats or "{}") | {"tightBounds": False}
        actions.append({"add": data_file.to_add_json() | {
            "dataChange": True, "stats": json.dumps(stats), "deletionVector": descriptor.to_json(),
        }})  # fmt: skip
    with open(path / "_delta_log" / f"{snapshot.version + 1:020d}.json", "x") as log:
        log.writelines(json.dumps(action) + "\n" for action in actions)

    rows = sorted(r[0] for r in spark.read.format("delta").load(str(path)).collect())

    before = {i for i in range(600) if i % 7}
    assert rows == sorted(before - set(removed)) and len(removed) > 0
    assert read_snapshot(str(path), since=snapshot) == read_snapshot(str(path))


def test_a_log_with_a_gap_is_refused(tmp_path: Path) -> None:
    log = tmp_path / "_delta_log"
    log.mkdir()
    for version in (0, 2):
        (log / f"{version:020d}.json").write_text(json.dumps({"commitInfo": {}}) + "\n")
    with pytest.raises(LogSnapshotError, match="commit 1 is missing"):
        read_snapshot(str(tmp_path))


def test_a_log_entry_carries_only_its_own_txn(tmp_path: Path) -> None:
    entry = tmp_path / f"{3:020d}.json"
    entry.write_text("\n".join(json.dumps(action) for action in (
        {"commitInfo": {"operation": "MERGE"}},
        {"txn": {"appId": "replicator-a", "version": 7, "lastUpdated": 0}},
    )) + "\n")  # fmt: skip
    assert carries_txn(str(entry), "replicator-a", 7)
    assert not carries_txn(str(entry), "replicator-a", 6)
    assert not carries_txn(str(entry), "replicator-b", 7)
    assert not carries_txn(str(tmp_path / f"{4:020d}.json"), "replicator-a", 7)


@pytest.mark.parametrize(
    ("numbers", "expected"),
    [([], []), ([4], [(4, 0, 1)]), ([1, 1, 3, 7, 7, 7], [(1, 0, 2), (3, 2, 1), (7, 3, 3)])],
)
def test_a_sorted_column_s_runs_are_its_files_and_their_rows(
    numbers: list[int], expected: list[tuple[int, int, int]]
) -> None:
    assert runs(pa.chunked_array([numbers], pa.int32())) == expected
