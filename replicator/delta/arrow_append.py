"""First loads appended from Arrow, without a round trip through the JVM.

A first load's rows are Arrow already: staged tables in memory and Parquet spill files. Spark's
append serialises them to the JVM, decodes the spill files there and encodes them again, and
its job's fixed costs come on top. Here pyarrow writes the Parquet files into the table's
partitions, in this process, and delta-rs (`deltalake`, which the read side uses already)
commits them with the same Delta txn ids (`txnAppId` / `txnVersion`) and `CommitMetadata` as
userMetadata, so recovery, audits and Spark readers see an ordinary append. Measured in the
README ("A first load without the JVM").

It is used when the data table allows it (`arrow_append_refusal`): the table is on the local
filesystem (elsewhere the storage credentials are Hadoop's, which delta-rs does not read),
every writer feature is one this module was tested with, and its generated column is the
partition this module computes (`DataLayout.group_of`; delta-rs evaluates no expression when it
commits files written elsewhere, and could not parse `DIV` if it did). A first load whose
spilled rows need deduplication goes to Spark: deduplicating them here would bring a whole
vbucket into memory, past the staging budget.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from replicator.delta.changes import concat_changes
from replicator.delta.commit_metadata import CommitMetadata, txn_app_id
from replicator.delta.log_snapshot import carries_txn
from replicator.delta.paths import local_path, newest_table, on_local_filesystem
from replicator.delta.row_images import ImageWriter, RowImages
from replicator.delta.schema import DATA_COLUMNS, DataLayout
from replicator.planning.planner import VbucketCommit, deduplicate_changes
from replicator.staging.rows import CHANGE_SCHEMA, UPSERT

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from deltalake.transaction import AddAction, RemoveAction

_log = logging.getLogger(__name__)

ARROW_DATA_SCHEMA = pa.schema([CHANGE_SCHEMA.field(name) for name in DATA_COLUMNS])
"""The data table's columns as staging types them (the partition column Delta generates)."""

WRITER_FEATURES = frozenset(
    {"appendOnly", "changeDataFeed", "deletionVectors", "generatedColumns", "invariants"}
)
"""Delta writer features of the tables this module was tested on (those a mirror gets)."""

FILE_BYTES = 256 * 1024 * 1024
"""A data file is closed once this many bytes of Arrow rows went into it."""

ROW_GROUP_BYTES = 32 * 1024 * 1024
"""Rows buffered before they are written as one row group: what the driver holds."""

BOUNDED_COLUMNS = frozenset({"vbucket", "collection_id", "seqno", "rev_seqno", "cas", "flags"})
"""Columns whose bounds go into a file's Delta statistics."""

SPILL_BATCH_ROWS = 16_384
"""Rows read from a spill file at a time: memory stays a row group's, not the file's."""


def arrow_append_refusal(path: str, layouts: Sequence[DataLayout]) -> str | None:
    """Why first loads cannot be appended from Arrow to the data table at `path` (None: they
    can). `layouts` are those whose generated partition column this module computes."""
    return _checked(path, layouts)[0]


def grouped_write_refusal(path: str, layout: DataLayout) -> str | None:
    """Why the replicator's own writers of steady batches and compactions cannot write the data
    table at `path` (None: they can): as for appends, and they need vbucket groups."""
    refusal = arrow_append_refusal(path, [layout])
    if refusal is None and layout.group_width is None:
        refusal = "the table is partitioned by vbucket (the layout before vbucket groups)"
    return refusal


def arrow_appender_for(path: str, layout: DataLayout, writer: str) -> ArrowAppender | None:
    """The appender of first loads to the data table at `path` (of `layout`), or None when
    Spark appends them: `writer` (FIRST_LOAD_WRITERS) says spark, or delta-rs cannot. Logged."""
    refusal: str | None
    table: DeltaTable | None
    if writer == "spark":
        refusal, table = "first_load_writer is spark", None
    else:
        refusal, table = _checked(path, [layout])
    if refusal is not None or table is None:
        _log.info("first loads are appended by Spark: %s", refusal)
        return None
    _log.info("first loads are appended from Arrow, committed by delta-rs")
    # The table the check opened: the first append only brings it up to date.
    return ArrowAppender(path, layout, table=table)


def _checked(path: str, layouts: Sequence[DataLayout]) -> tuple[str | None, DeltaTable | None]:
    """`arrow_append_refusal`'s answer, and the table it opened (None if it opened none)."""
    from deltalake import DeltaTable

    if not on_local_filesystem(path):
        return "the table is not on the local filesystem", None
    table = DeltaTable(path)
    protocol = table.protocol()
    unknown = sorted(set(protocol.writer_features or ()) - WRITER_FEATURES)
    if protocol.min_writer_version > 7 or unknown:
        return f"writer features {unknown} (writer version {protocol.min_writer_version})", table
    known = {layout.generation_expression() for layout in layouts if layout.group_width}
    for field in table.schema().fields:
        expression = field.metadata.get("delta.generationExpression")
        if expression is not None and expression not in known:
            return f"column {field.name} is generated as {expression}", table
    return None, table


def streamable(commits: Sequence[VbucketCommit]) -> bool:
    """Whether `first_load_batches` can stream these commits within the staging budget."""
    return all(commit.unique_keys or not commit.spill_files for commit in commits)


def first_load_batches(commits: Sequence[VbucketCommit]) -> Iterator[pa.RecordBatch]:
    """The rows a first load appends (ARROW_DATA_SCHEMA), vbucket after vbucket.

    Upserts only (a first load has nothing to delete), the highest seqno of each document,
    none of a collection dropped in the batch. Spill files are read a batch at a time.
    """
    if not streamable(commits):
        raise ValueError("spilled rows that need deduplication cannot be streamed")
    for commit in sorted(commits, key=lambda c: c.vbucket):
        dropped = pa.array(sorted(set(commit.dropped_collection_ids)), pa.int64())
        in_memory = concat_changes(commit.tables)
        if not commit.unique_keys:
            in_memory = deduplicate_changes(in_memory)
        if in_memory.num_rows:
            yield from _upserts(in_memory.combine_chunks(), dropped).to_batches()
        for path in commit.spill_files:
            for batch in pq.ParquetFile(path).iter_batches(SPILL_BATCH_ROWS, use_threads=False):
                rows = _upserts(pa.Table.from_batches([batch]).cast(CHANGE_SCHEMA), dropped)
                yield from rows.to_batches()


@dataclass(frozen=True, slots=True)
class AppendedCommit:
    """What an append landed: its version, its commit time as Spark reads it (the log file's
    modification time) and the files of the table at that version.

    Read from delta-rs and the log, not from Spark: delta-rs writes no checksum file, so a
    Spark snapshot of its version costs three jobs, at every commit of a load.
    """

    version: int
    committed_at: datetime
    table_files: int


class ArrowAppender:
    """Appends first loads to one data table, exactly once per txn version.

    The Parquet files are written here with pyarrow, one partition's file open at a time and
    row groups flushed as they fill, and committed by delta-rs (`create_write_transaction`):
    the driver holds a row group at most. delta-rs's own `write_deltalake` held 1.5 to 2.5
    times what it wrote until the commit (measured: 206 MB of rows, 300 to 500 MiB more RSS
    whatever its row group and file sizes), and a first load's commit may be 512 MB.
    """

    def __init__(
        self,
        path: str,
        layout: DataLayout,
        *,
        file_bytes: int = FILE_BYTES,
        row_group_bytes: int = ROW_GROUP_BYTES,
        table: DeltaTable | None = None,
    ) -> None:
        self.path = path
        self.layout = layout
        self.file_bytes = file_bytes
        self.row_group_bytes = row_group_bytes
        self._table = table

    def append(
        self, batches: Iterator[pa.RecordBatch], metadata: CommitMetadata
    ) -> AppendedCommit | None:
        """Commit `batches` with `metadata`; None when a commit of this owner with this txn
        version or a later one is in the table already (Spark's append skips such a write
        the same way)."""
        from deltalake.transaction import (
            CommitProperties,
            PostCommitHookProperties,
            Transaction,
        )

        table = self._table = newest_table(self._table, self.path)
        app_id = txn_app_id(metadata.owner_id)
        recorded = table.transaction_version(app_id)
        if recorded is not None and recorded >= metadata.txn_version:
            return None
        before = int(table.version())
        files = PartitionFiles(
            local_path(self.path), self.layout, self.file_bytes, self.row_group_bytes
        )
        try:
            for batch in batches:
                files.write(batch)
            actions: list[AddAction | RemoveAction] = [*files.close()]
            # Spark's append's metrics, under its names: status and audits count rows by them.
            metrics = {
                "numFiles": str(len(actions)),
                "numOutputRows": str(files.rows),
                "numOutputBytes": str(sum(action.size for action in files.actions)),
            }
            table.create_write_transaction(
                actions,
                "append",
                table.schema(),
                partition_by=[self.layout.partition_column],
                commit_properties=CommitProperties(
                    custom_metadata={
                        "userMetadata": metadata.to_json(),
                        "isBlindAppend": True,
                        "operationMetrics": metrics,
                    },
                    app_transactions=[Transaction(app_id=app_id, version=metadata.txn_version)],
                ),
                # Checkpoints and log clean-up stay Spark's, as for every other commit.
                post_commithook_properties=PostCommitHookProperties(
                    create_checkpoint=False, cleanup_expired_logs=False
                ),
            )
        except BaseException:
            # Files of a commit that did not land are referred to by nothing; those of one
            # that landed before the error (a post-commit step) are the table's now.
            if self._landed_version(before, app_id, metadata.txn_version) is None:
                files.discard()
            raise
        landed = self._landed_version(before, app_id, metadata.txn_version)
        if landed is None:
            raise RuntimeError(
                f"delta-rs committed txn {metadata.txn_version} of {app_id}, but no version "
                f"after {before} holds it"
            )
        version, log_file = landed
        table.load_as_version(version)
        return AppendedCommit(
            version,
            datetime.fromtimestamp(os.stat(log_file).st_mtime_ns // 1_000_000 / 1000, tz=UTC),
            len(table.file_uris()),
        )

    def _landed_version(
        self, before: int, app_id: str, txn_version: int
    ) -> tuple[int, str] | None:
        """The version our commit took, and its log file: the first after `before` carrying
        our txn (another writer may have committed since); None when none does."""
        log = os.path.join(local_path(self.path), "_delta_log")
        version = before + 1
        while os.path.exists(path := os.path.join(log, f"{version:020d}.json")):
            if carries_txn(path, app_id, txn_version):
                return version, path
            version += 1
        return None


class PartitionFiles:
    """Parquet files of one commit, written into the table's partition directories.

    Rows go to the open file while their partition stays the same (a first load comes in
    vbucket order, so each partition's rows come together); a new partition, or a file past
    `file_bytes`, closes it. Rows are buffered up to `row_group_bytes` and written as one row
    group. Each closed file becomes an AddAction with Delta statistics computed from its rows:
    the record count, nulls of every column, and the bounds of the integer columns (those
    data skipping reads: `vbucket` above all); no string bounds, which would need Delta's
    truncation rules.

    With `images`, each file's row image is written beside it and published once the file is
    closed (`row_images`).
    """

    def __init__(
        self,
        table_path: str,
        layout: DataLayout,
        file_bytes: int,
        row_group_bytes: int,
        images: RowImages | None = None,
    ) -> None:
        self.table_path = table_path
        self.layout = layout
        self.file_bytes = file_bytes
        self.row_group_bytes = row_group_bytes
        self.images = images
        partition = layout.partition_column
        self.columns = [name for name in DATA_COLUMNS if name != partition]
        self.schema = pa.schema([ARROW_DATA_SCHEMA.field(name) for name in self.columns])
        self.actions: list[AddAction] = []
        self.rows = 0
        self._written: list[str] = []
        self._open: _OpenFile | None = None

    def write(self, batch: pa.RecordBatch) -> None:
        if not batch.num_rows:
            return
        groups = self._groups(batch)
        low, high = (bound.as_py() for bound in pc.min_max(groups).values())
        if low == high:
            self._write_group(low, batch)
            return
        for group in pc.unique(groups).to_pylist():
            self._write_group(group, batch.filter(pc.equal(groups, group)))

    def close(self) -> list[AddAction]:
        self._close_open()
        return list(self.actions)

    def discard(self) -> None:
        if self._open is not None:
            self._open.writer.close()
            if self._open.image is not None:
                self._open.image.discard()
            self._open = None
        for path in self._written:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        if self.images is not None:
            self.images.drop(action.path for action in self.actions)

    def _groups(self, batch: pa.RecordBatch) -> pa.Array:
        vbuckets = batch.column(DATA_COLUMNS.index("vbucket"))
        width = self.layout.group_width
        return vbuckets if width is None else pc.divide(vbuckets, pa.scalar(width, pa.int32()))

    def _write_group(self, group: int, batch: pa.RecordBatch) -> None:
        current = self._open
        if current is not None and (current.group != group or current.bytes >= self.file_bytes):
            self._close_open()
            current = None
        if current is None:
            directory = f"{self.layout.partition_column}={group}"
            name = f"part-00000-{uuid.uuid4()}.c000.snappy.parquet"
            full = os.path.join(self.table_path, directory, name)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            self._written.append(full)
            writer = pq.ParquetWriter(full, self.schema, compression="snappy")
            path = f"{directory}/{name}"
            image = None if self.images is None else self.images.writer(path)
            current = self._open = _OpenFile(group, path, full, writer, image)
        rows = pa.RecordBatch.from_arrays(
            [batch.column(DATA_COLUMNS.index(name)) for name in self.columns], schema=self.schema
        )
        current.add(rows)
        if current.buffered_bytes >= self.row_group_bytes:
            current.flush()

    def _close_open(self) -> None:
        current, self._open = self._open, None
        if current is None:
            return
        current.flush()
        current.writer.close()
        if current.image is not None:
            current.image.publish()
        from deltalake.transaction import AddAction

        status = os.stat(current.full_path)
        self.rows += current.records
        self.actions.append(
            AddAction(
                path=current.path,
                size=status.st_size,
                partition_values={self.layout.partition_column: str(current.group)},
                modification_time=status.st_mtime_ns // 1_000_000,
                data_change=True,
                stats=json.dumps(current.stats()),
            )
        )


class _OpenFile:
    """One Parquet file being written: its buffered rows and its statistics so far."""

    def __init__(
        self,
        group: int,
        path: str,
        full_path: str,
        writer: pq.ParquetWriter,
        image: ImageWriter | None = None,
    ) -> None:
        self.group = group
        self.path = path
        self.full_path = full_path
        self.writer = writer
        self.image = image
        self.bytes = 0
        self.buffered: list[pa.RecordBatch] = []
        self.buffered_bytes = 0
        self.records = 0
        self.nulls: dict[str, int] = {}
        self.bounds: dict[str, tuple[int, int]] = {}

    def add(self, rows: pa.RecordBatch) -> None:
        self.buffered.append(rows)
        self.buffered_bytes += rows.nbytes
        self.bytes += rows.nbytes
        self.records += rows.num_rows
        for name, column in zip(rows.schema.names, rows.columns, strict=True):
            self.nulls[name] = self.nulls.get(name, 0) + column.null_count
            if name in BOUNDED_COLUMNS and column.null_count < len(column):
                low, high = pc.min_max(column).values()
                old = self.bounds.get(name)
                low, high = low.as_py(), high.as_py()
                self.bounds[name] = (low, high) if old is None else (
                    min(old[0], low), max(old[1], high)
                )  # fmt: skip

    def flush(self) -> None:
        if self.buffered:
            rows = pa.Table.from_batches(self.buffered)
            self.writer.write_table(rows, row_group_size=max(rows.num_rows, 1))
            if self.image is not None:
                self.image.write(rows)
            self.buffered, self.buffered_bytes = [], 0

    def stats(self) -> dict[str, Any]:
        return {
            "numRecords": self.records,
            "minValues": {name: low for name, (low, _) in self.bounds.items()},
            "maxValues": {name: high for name, (_, high) in self.bounds.items()},
            "nullCount": dict(self.nulls),
        }


def _upserts(rows: pa.Table, dropped: pa.Array) -> pa.Table:
    keep = pc.equal(rows["op"], UPSERT)
    if len(dropped):
        keep = pc.and_(keep, pc.invert(pc.is_in(rows["collection_id"], value_set=dropped)))
    return rows.filter(keep).select(list(DATA_COLUMNS))
