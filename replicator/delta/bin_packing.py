"""Compaction written from Arrow: what Delta's bin-packing OPTIMIZE leaves, without Spark.

Spark's OPTIMIZE of the recent files took 5 to 9 s of the commit thread on the 1M mirror (a
third of it at 20,000 changes/s), mostly fixed costs of its jobs; reading the same
files and writing their live rows from the driver takes a fraction of that (README, "Compaction
without Spark"). As OPTIMIZE does, in each partition asked for:

- the candidates are the files under the partition's size bound and those whose deletion
  vector hides more than `max_deleted_share` of their rows;
- a partition's candidates are packed into one new file (or more past `file_bytes`), their
  deleted rows left out; a lone candidate is rewritten only when it has deleted rows;
- one log entry removes them and adds the new files, `dataChange: false` (no change data: the
  rows are the same), under OPTIMIZE's name and metrics.

The entry is created exclusively at the version after the one read: when another writer took
it, the compaction gives way (the caller tries again at its next due point) and leaves nothing
behind.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from replicator.delta.arrow_append import (
    ARROW_DATA_SCHEMA,
    ROW_GROUP_BYTES,
    PartitionFiles,
)
from replicator.delta.deletion_vectors import position_array, read_positions
from replicator.delta.file_reads import READ_BATCH_BYTES, FilePart, read_parts
from replicator.delta.log_entry import publish_entry, remove_files
from replicator.delta.log_snapshot import DataFile, LogSnapshot
from replicator.delta.row_images import RowImages
from replicator.delta.schema import DATA_COLUMNS, DataLayout

PACKED_FILE_BYTES = 1024 * 1024 * 1024
"""A packed file's size cap: OPTIMIZE's target file size (1 GiB)."""

COMPACTION_METADATA = '{"replicator_compaction":1}'
"""The userMetadata of a compaction: not a replicator commit, which recovery and audits skip."""


@dataclass(frozen=True, slots=True)
class PackedFiles:
    """One compaction's entry: its version (None when there was nothing to pack), the files it
    removed and added, and the rows it dropped as deleted."""

    version: int | None
    removed: int = 0
    added: int = 0
    purged_rows: int = 0


ALL_FILES = sys.maxsize
"""A partition's bound in `pack_partitions` that takes all its files (packed whole)."""


def files_by_partition(
    snapshot: LogSnapshot, layout: DataLayout, partitions: Iterable[int]
) -> dict[int, list[DataFile]]:
    """The live files of each of `partitions` (those without files left out)."""
    column = layout.partition_column
    wanted = {str(p): p for p in partitions}
    by_partition: dict[int, list[DataFile]] = {}
    for data_file in snapshot.files.values():
        value = data_file.partition_values.get(column)
        partition = None if value is None else wanted.get(value)
        if partition is not None:
            by_partition.setdefault(partition, []).append(data_file)
    return by_partition


def candidates(
    files: Iterable[DataFile], min_file_bytes: int, max_deleted_share: float
) -> list[DataFile]:
    """The files of one partition that a compaction rewrites, as OPTIMIZE picks them (pure):
    small ones and those with too many deleted rows; none when that is one file without
    deleted rows (rewriting it would change nothing).
    """
    picked = [f for f in files if f.size < min_file_bytes or deleted_share(f) > max_deleted_share]
    if len(picked) == 1 and picked[0].deletion_vector is None:
        return []
    return picked


def deleted_share(data_file: DataFile) -> float:
    """The share of the file's rows its deletion vector hides (0 without one or without
    statistics)."""
    vector, records = data_file.deletion_vector, data_file.num_records
    if vector is None or not records:
        return 0.0
    return vector.cardinality / records


def pack_partitions(
    table_root: str,
    layout: DataLayout,
    snapshot: LogSnapshot,
    packed_under: Mapping[int, int],
    *,
    max_deleted_share: float = 1.0,
    file_bytes: int = PACKED_FILE_BYTES,
    row_group_bytes: int = ROW_GROUP_BYTES,
    read_batch_bytes: int = READ_BATCH_BYTES,
    images: RowImages | None = None,
) -> PackedFiles | None:
    """Pack the small or mostly deleted files of the partitions `packed_under` names in the
    table at `table_root`, as of `snapshot`: in each, the files under its number of bytes
    (`ALL_FILES`: every file), and those whose deleted rows passed `max_deleted_share`; None
    when another writer committed the next version first.

    With `images`, files are read from their row images where they have one, the packed files
    get theirs, and the removed files' images go once the entry landed."""
    column = layout.partition_column
    by_partition = files_by_partition(snapshot, layout, packed_under)
    packed = [
        (partition, picked)
        for partition, files in by_partition.items()
        if (picked := candidates(files, packed_under[partition], max_deleted_share))
    ]
    if not packed:
        return PackedFiles(None)
    packed.sort(key=lambda partition: partition[0])
    removed = [data_file for _, files in packed for data_file in files]
    new_files = PartitionFiles(table_root, layout, file_bytes, row_group_bytes, images)
    written: list[str] = []
    log_file = os.path.join(table_root, "_delta_log", f"{snapshot.version + 1:020d}.json")
    try:
        for data_file in removed:
            for batch in _live_batches(table_root, data_file, read_batch_bytes, images):
                new_files.write(batch)
        adds = new_files.close()
        written = [os.path.join(table_root, add.path) for add in adds]
        now = int(time.time() * 1000)
        actions: list[dict[str, Any]] = []
        for data_file in removed:
            remove = data_file.to_add_json()
            del remove["modificationTime"]
            remove |= {"deletionTimestamp": now, "dataChange": False,
                       "extendedFileMetadata": True}  # fmt: skip
            actions.append({"remove": remove})
        actions += [{"add": {
            "path": add.path, "partitionValues": add.partition_values, "size": add.size,
            "modificationTime": add.modification_time, "dataChange": False, "stats": add.stats,
        }} for add in adds]  # fmt: skip
        predicate = f"{column} IN ({', '.join(str(p) for p, _ in packed)})"
        purged = sum(f.deletion_vector.cardinality for f in removed if f.deletion_vector)
        info = _commit_info(now, snapshot.version, predicate, removed, adds, purged)
        landed = publish_entry(log_file, [{"commitInfo": info}, *actions])
    except BaseException:
        if not _names_any(log_file, [add.path for add in new_files.actions]):
            new_files.discard()  # not when the entry landed before the failure
            remove_files(written)
        raise
    if not landed:
        new_files.discard()
        return None
    if images is not None:
        images.drop(data_file.path for data_file in removed)
    return PackedFiles(snapshot.version + 1, len(removed), len(adds), purged)


def _names_any(log_file: str, paths: Sequence[str]) -> bool:
    """Whether the log entry `log_file` exists and names one of `paths`."""
    try:
        with open(log_file, encoding="utf-8") as entry:
            text = entry.read()
    except FileNotFoundError:
        return False
    return any(json.dumps(path) in text for path in paths)


def _live_batches(
    table_root: str, data_file: DataFile, batch_bytes: int, images: RowImages | None = None
) -> Iterator[pa.RecordBatch]:
    """The file's rows its deletion vector does not hide, about `batch_bytes` at a time
    (a record batch of its image at a time), typed as the writer types data rows."""
    hidden = np.empty(0, np.int64)
    if data_file.deletion_vector is not None:
        hidden = position_array(read_positions(table_root, data_file.deletion_vector))
    for part in _parts(table_root, data_file, batch_bytes, images):
        rows = part.rows.cast(ARROW_DATA_SCHEMA)
        low, high = np.searchsorted(hidden, [part.first_row, part.end_row])
        if high > low:
            keep = np.ones(rows.num_rows, bool)
            keep[hidden[low:high] - part.first_row] = False
            rows = rows.filter(pa.array(keep))
        yield from rows.to_batches()


def _parts(
    table_root: str, data_file: DataFile, batch_bytes: int, images: RowImages | None
) -> Iterator[FilePart]:
    image = None
    if images is not None:  # the row count from the add action's statistics, or the footer
        rows = data_file.num_records
        if rows is None:
            rows = pq.ParquetFile(data_file.local_path(table_root)).metadata.num_rows
        image = images.read(data_file.path, rows)
    if image is None:
        parquet = pq.ParquetFile(data_file.local_path(table_root))
        yield from read_parts(parquet, DATA_COLUMNS, batch_bytes)
        return
    first = 0
    for batch in image.select(list(DATA_COLUMNS)).to_batches():
        yield FilePart(first, pa.Table.from_batches([batch]))
        first += batch.num_rows


def _commit_info(
    now: int,
    read_version: int,
    predicate: str,
    removed: Sequence[DataFile],
    adds: Sequence[Any],
    purged_rows: int,
) -> dict[str, Any]:
    # As Spark's OPTIMIZE names it and its metrics (DESCRIBE HISTORY shows them alike).
    sizes = [f.size for f in removed]
    added = [add.size for add in adds]
    return {
        "timestamp": now,
        "operation": "OPTIMIZE",
        "operationParameters": {
            "predicate": json.dumps([predicate]), "auto": "false", "clusterBy": "[]",
            "zOrderBy": "[]",
        },
        "readVersion": read_version,
        "isolationLevel": "SnapshotIsolation",
        "isBlindAppend": False,
        "operationMetrics": {
            "numRemovedFiles": str(len(removed)),
            "numAddedFiles": str(len(adds)),
            "numRemovedBytes": str(sum(sizes)),
            "numAddedBytes": str(sum(added)),
            "minFileSize": str(min(added, default=0)),
            "maxFileSize": str(max(added, default=0)),
            "numDeletionVectorsRemoved": str(sum(1 for f in removed if f.deletion_vector)),
            "numDeletedRowsPurged": str(purged_rows),
        },
        "userMetadata": COMPACTION_METADATA,
        "engineInfo": "replicator compaction",
    }
