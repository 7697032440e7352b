"""Staged change rows as Spark frames: what an APPEND writes and a MERGE merges.

The executor's strategies take their rows from here: a batch's staged Arrow tables and spill
files become one frame of change rows (CHANGE_SCHEMA, one per document), a dropped collection
becomes delete rows, and a REPLACE becomes the difference between two sets of rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.compute as pc

from replicator.delta.schema import CHANGE_SCHEMA, DATA_COLUMNS, DATA_SCHEMA, in_list
from replicator.planning.planner import VbucketCommit, deduplicate_changes
from replicator.planning.replacement import METADATA_COLUMNS, replacement_rows
from replicator.staging.rows import CHANGE_SCHEMA as ARROW_CHANGE_SCHEMA
from replicator.staging.rows import DELETE, DOCUMENT, UPSERT

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from replicator.delta.table import MirrorTable


def change_rows(spark: SparkSession, commits: Sequence[VbucketCommit]) -> DataFrame:
    """The staged changes of `commits`, one row per document (its highest seqno).

    Rows of collections dropped in the batch are left out: collection ids are never reused,
    and the dropped collection's rows are removed as a whole.
    """
    # One DataFrame per source, not per vbucket: each createDataFrame or file scan is a
    # fixed cost, and a union of hundreds of them plans and schedules slowly. Likewise one
    # concatenation and one deduplication for all in-memory vbuckets. Rows of a single
    # snapshot without duplicate keys need no deduplication (an initial load's are).
    repeating: list[pa.Table] = []
    unique: list[pa.Table] = []
    spilled: dict[bool, tuple[list[pa.Table], list[str]]] = {False: ([], []), True: ([], [])}
    for commit in commits:
        if commit.spill_files:
            tables, files = spilled[commit.unique_keys]
            tables.extend(commit.tables)
            files.extend(commit.spill_files)
        else:
            (unique if commit.unique_keys else repeating).extend(commit.tables)
    frames: list[DataFrame] = []
    in_memory = concat_changes([deduplicate_changes(concat_changes(repeating)), *unique])
    if in_memory.num_rows:
        frames.append(arrow_frame(spark, in_memory))
    for unique_keys, (tables, files) in spilled.items():
        if not files:
            continue
        parts = [spark.read.schema(CHANGE_SCHEMA).parquet(*_uris(files))]
        in_memory_part = concat_changes(tables)
        if in_memory_part.num_rows:
            parts.append(arrow_frame(spark, in_memory_part))
        frame = union_frames(parts)
        frames.append(frame if unique_keys else _latest_per_document(frame))
    if not frames:
        return spark.createDataFrame([], CHANGE_SCHEMA)
    changes = union_frames(frames)
    for commit in commits:
        if commit.dropped_collection_ids:
            changes = changes.where(_not_in_dropped(commit))
    return changes


def arrow_frame(spark: SparkSession, table: pa.Table) -> DataFrame:
    """A DataFrame of staged rows whose Spark partitions each hold a run of vbuckets.

    Spark makes one partition per Arrow record batch, and staging leaves thousands of small
    ones; sorted and rebatched, each partition writes few vbucket directories, so a commit
    writes about one file per vbucket instead of one per vbucket per batch.
    """
    ordered = table.sort_by([("vbucket", "ascending")]).combine_chunks()
    return spark.createDataFrame(ordered, CHANGE_SCHEMA)


def dropped_collection_rows(
    mirror: MirrorTable, commits: Sequence[VbucketCommit]
) -> list[DataFrame]:
    """Delete rows for every stored document of the collections the batch dropped.

    DCP sends no deletions for a dropped collection's documents. Only this owner writes
    these vbuckets, so the rows read here are the ones the MERGE will see.
    """
    from pyspark.sql import functions as F

    frames = []
    for commit in commits:
        if not commit.dropped_collection_ids:
            continue
        dropped = sorted(set(commit.dropped_collection_ids))
        stored = (
            mirror.read()
            .where(mirror.data_layout.predicate([commit.vbucket]))
            .where(F.col("collection_id").isin(dropped))
        )
        frames.append(
            stored.withColumn("op", F.lit(DELETE)).select(*CHANGE_SCHEMA.fieldNames())
        )
    return frames


def concat_changes(tables: Iterable[pa.Table]) -> pa.Table:
    """Staged tables as one table of the staging schema (tables of older runs are cast)."""
    parts = [t.cast(ARROW_CHANGE_SCHEMA) if t.schema != ARROW_CHANGE_SCHEMA else t for t in tables]
    if not parts:
        return ARROW_CHANGE_SCHEMA.empty_table()
    return pa.concat_tables(parts)


def union_frames(frames: Sequence[DataFrame]) -> DataFrame:
    result = frames[0]
    for frame in frames[1:]:
        result = result.unionByName(frame)
    return result


REPLACE_ON_DRIVER_ROWS = 20_000
"""At most this many rows on each side of a REPLACE are brought to the driver to plan it there
(`replacement_rows`): the old rows whole, the current ones without their bodies. A vbucket of
a 20,000,000-document bucket fits; a larger one is planned by Spark (`replacement_changes`)."""


def rows_on_driver(frame: DataFrame, columns: Sequence[str], limit: int) -> pa.Table | None:
    """`frame`'s `columns` as one Arrow table, or None when it holds more than `limit` rows."""
    table = frame.select(*columns).limit(limit + 1).toArrow()
    return None if table.num_rows > limit else table


def replacement_source(
    mirror: MirrorTable, wanted: DataFrame | pa.Table, vbuckets: Sequence[int]
) -> DataFrame:
    """The change rows that make `wanted`'s rows of `vbuckets` all their rows in `mirror`.

    Planned on the driver (`replacement_rows`) when `wanted` is there already and the stored
    rows are few enough, otherwise by Spark.
    """
    current = mirror.read().where(mirror.data_layout.predicate(vbuckets))
    if isinstance(wanted, pa.Table):
        wanted = wanted.filter(pc.is_in(wanted["vbucket"], pa.array(vbuckets, pa.int32())))
        stored = rows_on_driver(current, METADATA_COLUMNS, REPLACE_ON_DRIVER_ROWS)
        if stored is not None:
            return arrow_frame(mirror.spark, replacement_rows(stored, wanted))
        wanted = mirror.spark.createDataFrame(wanted.select(list(DATA_COLUMNS)), DATA_SCHEMA)
    chosen = wanted.where(in_list("vbucket", vbuckets)).select(*DATA_COLUMNS)
    return replacement_changes(current, chosen)


def replacement_changes(current: DataFrame, wanted: DataFrame) -> DataFrame:
    """The change rows that turn `current` (some vbuckets' rows) into `wanted` (pure plan).

    Upserts of wanted rows that are new or differ (by seqno and cas: a seqno names one change
    on a vbucket's history), deletes of current rows whose document `wanted` lacks.
    """
    from pyspark.sql import functions as F

    document = list(DOCUMENT)
    stored = current.select(
        *document, F.col("seqno").alias("_seqno"), F.col("cas").alias("_cas")
    )
    upserts = (
        wanted.join(stored, document, "left")
        .where(
            F.col("_seqno").isNull()
            | (F.col("_seqno") != F.col("seqno"))
            | (F.col("_cas") != F.col("cas"))
        )
        .withColumn("op", F.lit(UPSERT))
    )
    deletes = current.join(wanted.select(*document), document, "left_anti").withColumn(
        "op", F.lit(DELETE)
    )
    names = CHANGE_SCHEMA.fieldNames()
    return upserts.select(*names).unionByName(deletes.select(*names))


def _latest_per_document(changes: DataFrame) -> DataFrame:
    """Spark twin of deduplicate_changes, for rows that live in spill files."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    newest_first = Window.partitionBy("vbucket", "collection_id", "key").orderBy(
        F.col("seqno").desc()
    )
    # Partitioned by vbucket alone (which the window accepts), each task holds whole vbuckets
    # and writes one file for each, not one per vbucket per shuffle partition.
    return (
        changes.repartition("vbucket")
        .withColumn("_rank", F.row_number().over(newest_first))
        .where(F.col("_rank") == 1)
        .drop("_rank")
    )


def _not_in_dropped(commit: VbucketCommit) -> Any:
    from pyspark.sql import functions as F

    dropped = sorted(set(commit.dropped_collection_ids))
    return (F.col("vbucket") != commit.vbucket) | ~F.col("collection_id").isin(dropped)


def _uris(paths: Iterable[str]) -> list[str]:
    """Spill files are written by the driver's local filesystem: say so to Hadoop."""
    return [path if urlparse(path).scheme else f"file://{path}" for path in paths]
