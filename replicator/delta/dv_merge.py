"""Steady commits without Spark's MERGE: what the MERGE would leave, written here.

A warm Spark MERGE of one batch into a 1,000,000-document mirror takes 9 to 13 s on two cores,
whatever the batch; what it leaves takes well under a second to write from the driver (README,
"A steady commit without Spark's MERGE"). For a batch of change rows (one per document):

- the rows it replaces or deletes are found through the `KeyIndex` and hidden by deletion
  vectors (each touched file's vector is the old one and the new positions);
- its upserts are written as new files into their partitions (`PartitionFiles`, with Delta
  statistics);
- change data files carry what the MERGE's change data feed would: `update_preimage` (the
  replaced rows, read back from their files), `update_postimage`, `insert` and `delete`;
- one log entry names all of it, with the txn id, the `CommitMetadata` and the metrics Spark's
  MERGE writes under its names (status and audits count rows by them). It is created
  exclusively: when another writer took the version, the batch is planned again on the newer
  table.

Only the grouped layout (vbucket groups as partitions, the vbucket a data column) is written
here; a batch with dropped collections (whose rows are removed by collection, not by key) goes
to Spark, as the caller decides.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyroaring import BitMap64

from replicator.delta.arrow_append import (
    ARROW_DATA_SCHEMA,
    FILE_BYTES,
    ROW_GROUP_BYTES,
    AppendedCommit,
    PartitionFiles,
    grouped_write_refusal,
)
from replicator.delta.bin_packing import PackedFiles, pack_partitions
from replicator.delta.changes import concat_changes
from replicator.delta.commit_metadata import CommitMetadata, txn_app_id
from replicator.delta.conflicts import MergeConflict
from replicator.delta.deletion_vectors import write_vectors
from replicator.delta.file_reads import READ_BATCH_BYTES, group_starts, read_parts
from replicator.delta.key_index import KEY_COLUMNS, KeyIndex
from replicator.delta.log_entry import publish_entry, remove_files
from replicator.delta.log_snapshot import LogSnapshot, carries_txn, read_snapshot
from replicator.delta.paths import local_path
from replicator.delta.row_images import IMAGES_DIRECTORY, ImageWriter, RowImages, take_rows
from replicator.delta.schema import DATA_COLUMNS, DataLayout
from replicator.planning.planner import VbucketCommit, deduplicate_changes
from replicator.staging.rows import CHANGE_SCHEMA, DELETE, UPSERT

_log = logging.getLogger(__name__)

MERGE_CONDITION = "t.vbucket = s.vbucket AND t.collection_id = s.collection_id AND t.key = s.key"

ATTEMPTS = 5
"""Plans of one batch before giving up when other writers keep taking the next version."""

CHANGE_TYPE = "_change_type"

FEED_SCHEMA = ARROW_DATA_SCHEMA.append(pa.field(CHANGE_TYPE, pa.string(), nullable=False))
"""A change data file's columns (its partition column is in the path, as for data files)."""


@dataclass(frozen=True, slots=True)
class MergedRows:
    """What a commit did to the table's rows (Spark's MERGE metrics)."""

    inserted: int
    updated: int
    deleted: int
    source: int


class DeletionVectorMerger:
    """Commits steady batches into one data table, exactly once per txn version."""

    def __init__(
        self,
        path: str,
        layout: DataLayout,
        *,
        file_bytes: int = FILE_BYTES,
        row_group_bytes: int = ROW_GROUP_BYTES,
        read_batch_bytes: int = READ_BATCH_BYTES,
        row_images: bool = True,
    ) -> None:
        if layout.group_width is None:
            raise ValueError("deletion-vector commits need the grouped layout")
        self.path = path
        self.root = local_path(path)
        self.layout = layout
        self.file_bytes = file_bytes
        self.row_group_bytes = row_group_bytes
        self.read_batch_bytes = read_batch_bytes
        self.index = KeyIndex(self.root)
        self.images = RowImages(self.root) if row_images else None
        """Where preimages are taken from by position (`row_images`); None: from Parquet."""
        self._swept = False
        self._snapshot: LogSnapshot | None = None
        self.last_rows: MergedRows | None = None
        self.conflicts = 0
        """Plans made again because another writer took the version first."""

    def merge(self, changes: pa.Table, metadata: CommitMetadata) -> AppendedCommit | None:
        """Commit `changes` (the staged change schema, one row per document) with `metadata`;
        None when this owner's txn version is in the table already (Spark skips it too)."""
        app_id = txn_app_id(metadata.owner_id)
        for _ in range(ATTEMPTS):
            snapshot = self._snapshot = read_snapshot(self.root, since=self._snapshot)
            if snapshot.txn_versions.get(app_id, -1) >= metadata.txn_version:
                return None
            gone = self.index.refresh(snapshot)
            if self.images is not None:
                self.images.drop(gone)
            if not self._swept:  # images a crash left behind, or all when turned off
                self._sweep_images(path for path, _ in snapshot.files)
            written: list[str] = []
            version = snapshot.version + 1
            log_file = os.path.join(self.root, "_delta_log", f"{version:020d}.json")
            try:
                actions, rows = self._actions(changes, written)
                now = int(time.time() * 1000)
                head = [
                    {"commitInfo": self._commit_info(now, snapshot.version, metadata, rows)},
                    {"txn": {"appId": app_id, "version": metadata.txn_version,
                             "lastUpdated": now}},
                ]  # fmt: skip
                landed = publish_entry(log_file, [*head, *actions])
            except BaseException:
                if not carries_txn(log_file, app_id, metadata.txn_version):
                    remove_files(written)  # files of a commit that did not land
                raise
            if not landed:
                remove_files(written)  # another writer took the version: plan again on its table
                self.conflicts += 1
                continue
            self.last_rows = rows
            if self.images is not None:  # the images of files whose every row went
                added = {action["add"]["path"] for action in actions if "add" in action}
                self.images.drop(
                    action["remove"]["path"] for action in actions
                    if "remove" in action and action["remove"]["path"] not in added
                )  # fmt: skip
            live = len(snapshot.files) + sum(1 for a in actions if "add" in a) - sum(
                1 for a in actions if "remove" in a
            )
            return AppendedCommit(
                version,
                datetime.fromtimestamp(os.stat(log_file).st_mtime_ns / 1e9, tz=UTC),
                live,
            )
        raise MergeConflict(
            f"other writers took {ATTEMPTS} versions in a row of {self.path}; "
            f"txn {metadata.txn_version} of {app_id} was not committed"
        )

    def _sweep_images(self, live: Iterable[str]) -> None:
        self._swept = True
        if self.images is not None:
            self.images.sweep(live)
            return
        directory = os.path.join(self.root, IMAGES_DIRECTORY)
        if os.path.isdir(directory):  # kept by an earlier run; nobody would drop them now
            _log.info("row images are off: removing %s", directory)
            shutil.rmtree(directory, ignore_errors=True)

    def pack(self, packed_under: Mapping[int, int]) -> PackedFiles | None:
        """Compact partitions of the newest table (`bin_packing.pack_partitions`, reading and
        writing row images with this writer's); None when another writer committed first."""
        snapshot = self._snapshot = read_snapshot(self.root, since=self._snapshot)
        return pack_partitions(
            self.root, self.layout, snapshot, packed_under, images=self.images
        )

    # -- one plan -------------------------------------------------------------------------

    def _actions(
        self, changes: pa.Table, written: list[str]
    ) -> tuple[list[dict[str, Any]], MergedRows]:
        changes = changes.append_column("row", pa.array(range(changes.num_rows), pa.int64()))
        located = self.index.locate(changes.select([*KEY_COLUMNS, "row"]))
        located = located.append_column("op", pc.take(changes["op"], located["row"])).sort_by(
            [("file", "ascending"), ("position", "ascending")]
        )  # one run of ascending positions per touched file
        upsert_mask = pc.equal(changes["op"], UPSERT)
        is_matched = pc.is_in(changes["row"], value_set=located["row"].combine_chunks())
        touched = runs(located["file"])
        actions: list[dict[str, Any]] = []
        now = int(time.time() * 1000)
        # Deletion vectors: the old one of each touched file and the new positions.
        vectors = []
        for number, start, length in touched:
            positions = located["position"].slice(start, length).to_numpy()
            vectors.append(self.index.deleted(number) | BitMap64(positions.astype(np.uint64)))
        descriptors = write_vectors(self.root, vectors) if vectors else []
        if descriptors:
            written.append(descriptors[0].file_path(self.root))
        for (number, _, _), descriptor in zip(touched, descriptors, strict=True):
            data_file = self.index.data_file(number)
            remove = data_file.to_add_json()
            del remove["modificationTime"]
            remove |= {"deletionTimestamp": now, "dataChange": True, "extendedFileMetadata": True}
            actions.append({"remove": remove})
            if descriptor.cardinality == self.index.file_rows(number):
                continue  # every row gone: the file leaves the table, as Spark's MERGE does
            stats = json.loads(data_file.stats or "{}") | {"tightBounds": False}
            actions.append({"add": data_file.to_add_json() | {
                "dataChange": True, "stats": json.dumps(stats),
                "deletionVector": descriptor.to_json(),
            }})  # fmt: skip
        # The new rows' files.
        upserts = changes.filter(upsert_mask)
        new_files = PartitionFiles(
            self.root, self.layout, self.file_bytes, self.row_group_bytes, self.images
        )
        try:
            ordered = upserts.select(list(DATA_COLUMNS)).cast(ARROW_DATA_SCHEMA)
            for batch in ordered.sort_by("vbucket").to_batches():
                new_files.write(batch)
            adds = new_files.close()
        except BaseException:
            new_files.discard()
            raise
        written += [os.path.join(self.root, add.path) for add in adds]
        if self.images is not None:  # removed with their files when the entry does not land
            written += [path for add in adds if (path := self.images.image_path(add.path))]
        actions += [{"add": {
            "path": add.path, "partitionValues": add.partition_values, "size": add.size,
            "modificationTime": add.modification_time, "dataChange": True, "stats": add.stats,
        }} for add in adds]  # fmt: skip
        # The change data feed: preimages read back, postimages and inserts from the batch.
        preimages = self._preimages(located, touched)
        upsert_types = pc.if_else(
            pc.filter(is_matched, upsert_mask), "update_postimage", "insert"
        )
        postimages = upserts.select(list(DATA_COLUMNS)).append_column(CHANGE_TYPE, upsert_types)
        feed = pa.concat_tables([preimages, postimages.cast(FEED_SCHEMA)])
        actions += self._change_files(feed, written, now)
        updated = int(pc.sum(pc.equal(located["op"], UPSERT)).as_py() or 0)
        deleted = int(pc.sum(pc.equal(located["op"], DELETE)).as_py() or 0)
        rows = MergedRows(upserts.num_rows - updated, updated, deleted, changes.num_rows)
        return actions, rows

    def _preimages(self, located: pa.Table, touched: Sequence[tuple[int, int, int]]) -> pa.Table:
        """The rows `located` (sorted by file and position) replaces, read back from their
        files, typed `update_preimage` or `delete` by the change that replaces them."""
        types = pc.if_else(pc.equal(located["op"], UPSERT), "update_preimage", "delete")
        parts = []
        for number, start, length in touched:
            positions = located["position"].slice(start, length).to_numpy()
            replaced = self._rows_at(number, positions)
            parts.append(
                replaced.append_column(CHANGE_TYPE, types.slice(start, length)).cast(FEED_SCHEMA)
            )
        return pa.concat_tables(parts) if parts else FEED_SCHEMA.empty_table()

    def _rows_at(self, number: int, positions: np.ndarray) -> pa.Table:
        """The data columns of file `number`'s rows at ascending `positions`: from its row
        image, or read from Parquet (which then writes the image, for the next batches)."""
        data_file = self.index.data_file(number)
        path = data_file.local_path(self.root)
        if self.images is None:
            return rows_at(path, positions, self.read_batch_bytes)
        image = self.images.read(data_file.path, self.index.file_rows(number))
        if image is not None:
            return take_rows(image, positions).select(list(DATA_COLUMNS))
        writer = self.images.writer(data_file.path)
        try:
            rows = rows_at(path, positions, self.read_batch_bytes, image=writer)
            if writer is not None:
                writer.publish()
        except BaseException:
            if writer is not None:
                writer.discard()
            raise
        return rows

    def _change_files(self, feed: pa.Table, written: list[str], now: int) -> list[dict[str, Any]]:
        column = self.layout.partition_column
        width = self.layout.group_width or 1
        groups = pc.divide(feed["vbucket"], pa.scalar(width, pa.int32()))
        actions = []
        for group in sorted(pc.unique(groups).to_pylist()):
            rows = feed.filter(pc.equal(groups, group))
            relative = f"_change_data/{column}={group}/cdc-00000-{uuid.uuid4()}.c000.snappy.parquet"
            full = os.path.join(self.root, relative)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            written.append(full)
            pq.write_table(rows, full, compression="snappy")
            actions.append({"cdc": {
                "path": relative, "partitionValues": {column: str(group)},
                "size": os.stat(full).st_size, "dataChange": False,
            }})  # fmt: skip
        return actions

    def _commit_info(
        self, now: int, read_version: int, metadata: CommitMetadata, rows: MergedRows
    ) -> dict[str, Any]:
        # As Spark's MERGE names it: the partitions' literal first (audits read which).
        vbuckets = sorted(metadata.positions)
        predicate = f"{self.layout.predicate(vbuckets, alias='t')} AND {MERGE_CONDITION}"
        return {
            "timestamp": now,
            "operation": "MERGE",
            "operationParameters": {"predicate": json.dumps([predicate])},
            "readVersion": read_version,
            "isolationLevel": "Serializable",
            "isBlindAppend": False,
            # Spark's MERGE's metrics, under its names: status and audits count rows by them.
            "operationMetrics": {
                "numSourceRows": str(rows.source),
                "numTargetRowsInserted": str(rows.inserted),
                "numTargetRowsUpdated": str(rows.updated),
                "numTargetRowsDeleted": str(rows.deleted),
                "numOutputRows": str(rows.inserted + rows.updated),
            },
            "userMetadata": metadata.to_json(),
            "engineInfo": "replicator deletion-vector merge",
        }


def dv_merge_refusal(path: str, layout: DataLayout) -> str | None:
    """Why Spark must MERGE steady batches into the data table at `path` (None: this writer
    can): the table is not local, has writer features not tested here, has no change data
    feed, or uses the per-vbucket layout."""
    refusal = grouped_write_refusal(path, layout)
    if refusal is None:
        from deltalake import DeltaTable

        configuration = DeltaTable(path).metadata().configuration
        if configuration.get("delta.enableChangeDataFeed") != "true":
            refusal = "the table has no change data feed"
    return refusal


def dv_mergeable(commits: Sequence[VbucketCommit]) -> bool:
    """Whether the batch drops no collection (a dropped collection's rows go by collection,
    which the key index does not answer)."""
    return all(not c.dropped_collection_ids for c in commits)


def steady_changes(commits: Sequence[VbucketCommit]) -> pa.Table:
    """The batch's change rows, one per document (its highest seqno), spilled rows read back:
    a steady batch is capped in bytes (`CommitThresholds`), so the commit holds at most that."""
    repeating: list[pa.Table] = []
    unique: list[pa.Table] = []
    for commit in commits:
        rows = [*commit.tables, *(pq.read_table(path, schema=CHANGE_SCHEMA)
                                  for path in commit.spill_files)]  # fmt: skip
        (unique if commit.unique_keys else repeating).extend(rows)
    # The writer filters, takes and sorts the rows: cheap over a few chunks, 7x dearer over the
    # thousands a batch is staged in. Each part is made one chunk, each row copied once: the
    # deduplication's output is one chunk already.
    deduplicated = deduplicate_changes(concat_changes(repeating))
    return concat_changes([deduplicated, concat_changes(unique).combine_chunks()])


def rows_at(
    path: str,
    positions: np.ndarray,
    batch_bytes: int = READ_BATCH_BYTES,
    *,
    image: ImageWriter | None = None,
) -> pa.Table:
    """The data columns of the rows at ascending `positions` of the Parquet file at `path`.

    Only the row groups holding one of them are read, about `batch_bytes` at a time: a
    compacted file holds a whole partition (64 MB of documents on the 1M mirror, more as the
    table grows), and reading it whole held it all in memory to take a few of its rows. With
    `image`, every row group is read and written to it (the caller publishes it).
    """
    parquet = pq.ParquetFile(path)
    columns = list(DATA_COLUMNS)
    if not len(positions) and image is None:
        return parquet.schema_arrow.empty_table().select(columns)
    starts = group_starts(parquet)
    if len(positions) and positions[-1] >= starts[-1]:
        raise ValueError(f"{path} has {starts[-1]} rows; position {positions[-1]} is not one")
    groups = None
    if image is None:
        groups = np.unique(np.searchsorted(starts, positions, side="right") - 1).tolist()
    parts = [parquet.schema_arrow.empty_table().select(columns)]
    taken = 0
    for part in read_parts(parquet, columns, batch_bytes, groups):
        if image is not None:
            image.write(part.rows)
        upto = int(np.searchsorted(positions, part.end_row, side="left"))
        if upto > taken:  # a batch of a large row group may hold none of them
            parts.append(part.rows.take(positions[taken:upto] - part.first_row))
            taken = upto
    return pa.concat_tables(parts)


def runs(numbers: pa.ChunkedArray) -> list[tuple[int, int, int]]:
    """Each run of equal values in sorted `numbers`: the value, where it starts, its length."""
    encoded = pc.run_end_encode(numbers.combine_chunks())
    ends = encoded.run_ends.to_pylist()
    starts = [0, *ends][: len(ends)]
    return [
        (number, start, end - start)
        for number, start, end in zip(encoded.values.to_pylist(), starts, ends, strict=True)
    ]
