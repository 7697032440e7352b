"""Probe: one steady batch committed by hand with deletion vectors, against Spark's MERGE.

A measurement behind the steady-state design (README, "A steady commit without Spark's MERGE"),
not product code. It copies a mirror three times and builds one batch of changes (80% updates,
10% deletes, 10% inserts, documents of about 1 KB). Spark MERGEs it into two copies, the first
only to warm the JVM as a replicator's earlier MERGEs would. Into the third it writes what the
MERGE would leave, without a Spark job: a deletion vector for every row the batch replaces or
deletes (found through an index of the files' key columns), the new rows in one Parquet file per
partition, and the log entry. Then it checks both copies hold the same rows, and reads each
version's change data feed.

    .venv/bin/python -m jobs.probes.steady_dv_commit SOURCE_MIRROR WORK_DIR [CHANGES]

The source mirror must hold no deletion vectors yet (a first load does not write any).
"""

from __future__ import annotations

import base64
import json
import os
import random
import shutil
import struct
import sys
import time
import uuid
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

KEY_COLUMNS = ["vbucket", "collection_id", "key"]
DV_MAGIC = 1681511377
Z85_ALPHABET = (
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
)


def z85(data: bytes) -> str:
    """Z85 of `data` (a multiple of 4 bytes): how a deletion vector's file UUID is written."""
    out: list[str] = []
    for start in range(0, len(data), 4):
        number = int.from_bytes(data[start : start + 4], "big")
        chunk: list[str] = []
        for _ in range(5):
            number, digit = divmod(number, 85)
            chunk.append(Z85_ALPHABET[digit])
        out.extend(reversed(chunk))
    return "".join(out)


def live_files(path: str) -> tuple[dict[str, dict[str, Any]], int]:
    """The add actions of the table's current files, and its version (JSON log only)."""
    files: dict[str, dict[str, Any]] = {}
    version = -1
    log = os.path.join(path, "_delta_log")
    for name in sorted(os.listdir(log)):
        if not name.endswith(".json"):
            continue
        version = int(name[:20])
        with open(os.path.join(log, name)) as entry:
            for line in entry:
                action = json.loads(line)
                if "add" in action:
                    files[action["add"]["path"]] = action["add"]
                elif "remove" in action:
                    files.pop(action["remove"]["path"], None)
    return files, version


def group_width(path: str) -> int:
    """Vbuckets per partition, from the table's creation (its metaData's configuration)."""
    with open(os.path.join(path, "_delta_log", f"{0:020d}.json")) as entry:
        for line in entry:
            metadata = json.loads(line).get("metaData")
            if metadata is not None:
                return int(metadata["configuration"]["replicator.vbucketGroupWidth"])
    raise SystemExit(f"{path} is not a mirror with vbucket groups")


def key_index(path: str, paths: Sequence[str]) -> pa.Table:
    """Every row's key, file number and row position: what a deletion vector names."""
    parts = []
    for number, relative in enumerate(paths):
        keys = pq.read_table(os.path.join(path, relative), columns=KEY_COLUMNS)
        parts.append(
            keys.append_column("file", pa.array([number] * keys.num_rows, pa.int32()))
            .append_column("row", pa.array(range(keys.num_rows), pa.int64()))
        )
    return pa.concat_tables(parts)


def make_batch(index: pa.Table, changes: int, width: int, seed: int) -> tuple[pa.Table, pa.Array]:
    """The batch's rows (the mirror's columns) and each row's op (upsert or delete)."""
    rng = random.Random(seed)
    picked = index.take(rng.sample(range(index.num_rows), int(changes * 0.9))).select(KEY_COLUMNS)
    updates = int(changes * 0.8)
    inserts = changes - picked.num_rows
    ops = ["upsert"] * updates + ["delete"] * (picked.num_rows - updates) + ["upsert"] * inserts
    vbuckets = [rng.randrange(1024) for _ in range(inserts)]
    now = time.time_ns()
    rows = pa.table({
        "vbucket": pa.concat_arrays([
            picked["vbucket"].combine_chunks(), pa.array(vbuckets, pa.int32())
        ]),
        "scope": pa.array(["_default"] * changes),
        "collection": pa.array(["_default"] * changes),
        "collection_id": pa.concat_arrays([
            picked["collection_id"].combine_chunks(), pa.array([0] * inserts, pa.int64())
        ]),
        "key": pa.concat_arrays([
            picked["key"].combine_chunks(), pa.array([f"new-{i}" for i in range(inserts)])
        ]),
        "seqno": pa.array(range(10**9, 10**9 + changes), pa.int64()),
        "rev_seqno": pa.array([2] * changes, pa.int64()),
        "cas": pa.array([now + i for i in range(changes)], pa.int64()),
        "flags": pa.array([0] * changes, pa.int64()),
        "expiry": pa.nulls(changes, pa.timestamp("us", tz="UTC")),
        "is_json": pa.array([True] * changes),
        "doc": pa.array([
            '{"v":"' + base64.b64encode(rng.randbytes(750)).decode() + '"}' for _ in range(changes)
        ]),
        "value": pa.nulls(changes, pa.binary()),
        "xattrs": pa.nulls(changes, pa.string()),
    })
    group = pc.cast(pc.divide(rows["vbucket"], width), pa.int32())
    return rows.append_column("vbucket_group", group), pa.array(ops)


def deletion_vector(rows: Sequence[int]) -> tuple[bytes, int]:
    """Delta's RoaringBitmapArray of row positions (all below 2**32: one bucket), and its size."""
    from pyroaring import BitMap

    bitmap = BitMap(rows)
    return struct.pack("<iqi", DV_MAGIC, 1, 0) + bitmap.serialize(), len(bitmap)


def dv_commit(
    path: str,
    files: Mapping[str, Mapping[str, Any]],
    paths: Sequence[str],
    version: int,
    index: pa.Table,
    rows: pa.Table,
    ops: pa.Array,
) -> tuple[dict[str, float], pa.Table]:
    """Commit the batch as deletion vectors plus new files; the timings and the matched rows."""
    timings: dict[str, float] = {}
    started = time.perf_counter()
    keys = rows.select(KEY_COLUMNS)
    matched = keys.join(index, KEY_COLUMNS, join_type="inner")
    timings["lookup (hash join of the batch's keys with the index)"] = time.perf_counter() - started
    mark = time.perf_counter()
    now = int(time.time() * 1000)
    name = uuid.uuid4()
    payload = bytearray(b"\x01")
    actions: list[dict[str, Any]] = []
    by_file = matched.group_by("file").aggregate([("row", "list")])
    for number, positions in zip(
        by_file["file"].to_pylist(), by_file["row_list"].to_pylist(), strict=True
    ):
        data, cardinality = deletion_vector(positions)
        offset = len(payload)
        payload += struct.pack(">i", len(data)) + data + struct.pack(">I", zlib.crc32(data))
        add = files[paths[number]]
        stats = json.loads(add["stats"])
        stats["tightBounds"] = False
        common = {key: add[key] for key in ("path", "partitionValues", "size")}
        actions.append({"remove": {**common, "deletionTimestamp": now, "dataChange": True,
                                   "extendedFileMetadata": True}})  # fmt: skip
        actions.append({"add": {
            **common, "modificationTime": add["modificationTime"], "dataChange": True,
            "stats": json.dumps(stats),
            "deletionVector": {"storageType": "u", "pathOrInlineDv": z85(name.bytes),
                               "offset": offset, "sizeInBytes": len(data),
                               "cardinality": cardinality},
        }})  # fmt: skip
    with open(os.path.join(path, f"deletion_vector_{name}.bin"), "wb") as out:
        out.write(payload)
    timings["deletion vectors (bitmaps, one file)"] = time.perf_counter() - mark
    mark = time.perf_counter()
    upserts = rows.filter(pc.equal(ops, "upsert"))
    for group in sorted(set(upserts["vbucket_group"].to_pylist())):
        part = upserts.filter(pc.equal(upserts["vbucket_group"], group)).sort_by("vbucket")
        relative = f"vbucket_group={group}/part-dv-{uuid.uuid4()}.c000.snappy.parquet"
        pq.write_table(part.drop_columns(["vbucket_group"]), os.path.join(path, relative))
        actions.append({"add": {
            "path": relative, "partitionValues": {"vbucket_group": str(group)},
            "size": os.path.getsize(os.path.join(path, relative)), "modificationTime": now,
            "dataChange": True, "stats": json.dumps({"numRecords": part.num_rows}),
        }})  # fmt: skip
    timings["the new rows' files (pyarrow)"] = time.perf_counter() - mark
    mark = time.perf_counter()
    info = {"commitInfo": {"timestamp": now, "operation": "MERGE", "operationParameters": {},
                           "readVersion": version, "isolationLevel": "Serializable",
                           "isBlindAppend": False}}  # fmt: skip
    # Create-exclusive: another writer's commit of this version makes it fail, not vanish.
    descriptor = os.open(
        os.path.join(path, "_delta_log", f"{version + 1:020d}.json"),
        os.O_WRONLY | os.O_CREAT | os.O_EXCL,
    )
    with os.fdopen(descriptor, "w") as log:
        log.writelines(json.dumps(action) + "\n" for action in [info, *actions])
    timings["the log entry"] = time.perf_counter() - mark
    timings["hand-written commit, total"] = time.perf_counter() - started
    return timings, by_file


def preimages(path: str, paths: Sequence[str], by_file: pa.Table) -> tuple[float, int]:
    """Seconds to read the rows the batch replaced (a change feed's preimages), and how many."""
    started = time.perf_counter()
    count = 0
    for number, positions in zip(
        by_file["file"].to_pylist(), by_file["row_list"].to_pylist(), strict=True
    ):
        table = pq.read_table(os.path.join(path, paths[number]))
        count += table.take(pa.array(sorted(positions))).num_rows
    return time.perf_counter() - started, count


def spark_merge(spark: Any, path: str, source: str, columns: Sequence[str]) -> float:
    """Seconds for Spark's MERGE of the batch (the replicator's shape) into the table at `path`."""
    spark.read.parquet(source).createOrReplaceTempView("batch")
    spark.sql("SELECT count(*) FROM batch").collect()
    sets = ", ".join(f"t.{c} = s.{c}" for c in columns)
    started = time.perf_counter()
    spark.sql(
        f"MERGE INTO delta.`{path}` t USING batch s ON t.vbucket_group = s.vbucket_group"
        " AND t.vbucket = s.vbucket AND t.collection_id = s.collection_id AND t.key = s.key"
        " WHEN MATCHED AND s.op = 'delete' THEN DELETE"
        f" WHEN MATCHED THEN UPDATE SET {sets}"
        f" WHEN NOT MATCHED AND s.op = 'upsert' THEN INSERT ({', '.join(columns)})"
        f" VALUES ({', '.join('s.' + c for c in columns)})"
    )
    return time.perf_counter() - started


def main(argv: Sequence[str]) -> None:
    source, work = argv[0], argv[1]
    changes = int(argv[2]) if len(argv) > 2 else 40_000
    by_hand, by_spark = os.path.join(work, "by_hand"), os.path.join(work, "by_spark")
    warm_up = os.path.join(work, "warm_up")
    for copy in (by_hand, by_spark, warm_up):
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(source, copy)
    files, version = live_files(by_hand)
    if any(add.get("deletionVector") for add in files.values()):
        raise SystemExit(f"{source} holds deletion vectors: give a mirror right after its load")
    width = group_width(by_hand)
    paths = sorted(files)
    started = time.perf_counter()
    index = key_index(by_hand, paths)
    timings = {"index (key columns of every file)": time.perf_counter() - started}
    rows, ops = make_batch(index, changes, width, seed=7)
    batch_file = os.path.join(work, "batch.parquet")
    pq.write_table(rows.append_column("op", ops), batch_file)

    from replicator.runtime.spark import build_session

    spark = build_session("steady-dv-probe")
    columns = [c for c in rows.column_names if c != "vbucket_group"]
    # The same MERGE once first, on a third copy: the one timed runs in a warm JVM, as a
    # replicator's steady MERGEs do.
    timings["Spark MERGE, first in the JVM (a third copy)"] = spark_merge(
        spark, warm_up, batch_file, columns
    )
    timings["Spark MERGE of the same batch"] = spark_merge(spark, by_spark, batch_file, columns)
    committed, by_file = dv_commit(by_hand, files, paths, version, index, rows, ops)
    timings.update(committed)
    seconds, count = preimages(by_hand, paths, by_file)
    timings[f"preimages: {count} replaced rows read from {by_file.num_rows} files"] = seconds
    print(f"{index.num_rows} rows in {len(paths)} files; batch of {changes} changes")
    for label, value in timings.items():
        print(f"  {label:58s} {value:6.2f} s")
    hand, merged = (spark.read.format("delta").load(p) for p in (by_hand, by_spark))
    print(f"rows: by hand {hand.count()}, by Spark {merged.count()}; differing:"
          f" {hand.exceptAll(merged).count()} + {merged.exceptAll(hand).count()}")  # fmt: skip
    for label, table in (("by hand", by_hand), ("by Spark", by_spark)):
        feed = (
            spark.read.format("delta").option("readChangeFeed", "true")
            .option("startingVersion", version + 1).option("endingVersion", version + 1)
            .load(table).groupBy("_change_type").count().collect()
        )  # fmt: skip
        print(f"change data feed {label}: {sorted((r[0], r[1]) for r in feed)}")


if __name__ == "__main__":
    main(sys.argv[1:])
