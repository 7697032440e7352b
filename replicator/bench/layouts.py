"""Measurement: candidate Delta layouts of the mirror table, side by side in one Spark session.

Four layouts of the same rows (`DATA_SCHEMA`, deletion vectors and change data feed on, as the
real mirror; `--no-change-data-feed` measures the same without the feed, whose pre-images make a
MERGE read every file it touches):

- `vbucket`: partitioned by `vbucket` (one partition per vbucket);
- `groups16`: partitioned by the generated `vbucket_group = vbucket DIV 64` (16 at 1024);
- `unpartitioned`: no partitions, rows written sorted by vbucket;
- `clustered`: liquid clustering by `vbucket`, clustered by OPTIMIZE.

Each candidate is built from rows generated in Spark (appended in vbucket order), then takes
three MERGE batches shaped as the replicator's (80% updates, 10% inserts, 10% deletes over every
vbucket), a compaction, and a one-vbucket "rollback" MERGE. A scaling run then merges into
`groups16` and `unpartitioned` tables of growing size. Every measurement records the wall clock,
Delta's operationMetrics, the table's files and `os.getloadavg()` at its start and end.

    python -m replicator.bench.layouts --docs 200000 --work-dir DIR --output FILE.json

Benchmarks are measurements, not tests: nothing here asserts a speed. One module though over
500 lines: it is a self-contained measurement script (`make bench-layouts`), its parts useful
only together.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from replicator.delta.compaction import MIN_FILE_SIZE_CONF
from replicator.delta.schema import (
    DATA_COLUMNS,
    DATA_SCHEMA,
    DELETE,
    UPSERT,
    VBUCKET_GROUP,
    DataLayout,
    vbucket_group_width,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, Row, SparkSession

T = TypeVar("T")
LoadAvg = tuple[float, float, float]

NUM_VBUCKETS = 1024
GROUP_LAYOUT = DataLayout(vbucket_group_width(NUM_VBUCKETS))
GROUP_WIDTH = vbucket_group_width(NUM_VBUCKETS)
"""Vbuckets per `vbucket_group` partition, as the mirror has them: 16 partitions at 1024."""
GROUP_COLUMN = VBUCKET_GROUP
GROUP_EXPRESSION = GROUP_LAYOUT.generation_expression()
ROLLBACK_VBUCKET = 341
TABLE_PROPERTIES = {
    "delta.enableDeletionVectors": "true",
    "delta.enableChangeDataFeed": "true",
}
SMALL_FILE_BYTES = 16 * 1024 * 1024
"""The compaction measured here takes files under 16 MB: every file of a 200,000-row table."""

DOC_FIELDS = 13
"""Fields of 64 hex characters in a generated JSON document: about 1 KB of text."""
ROWS_PER_WRITE_TASK = 100_000
"""A build append gets one write task per this many rows (at least two): ~100 MB files."""

MERGE_METRICS = (
    "numTargetFilesAdded",
    "numTargetFilesRemoved",
    "numTargetRowsCopied",
    "numTargetDeletionVectorsAdded",
    "numTargetChangeFilesAdded",
    "executionTimeMs",
    "scanTimeMs",
    "rewriteTimeMs",
)
"""The MERGE operationMetrics the printed tables show (the JSON keeps all of them)."""


# -- results ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Clock:
    """The wall clock of one measurement and the load average at its start and end."""

    seconds: float
    load_start: LoadAvg
    load_end: LoadAvg


@dataclass(frozen=True, slots=True)
class TableFiles:
    """What `DeltaTable.detail()` says of a table at one moment."""

    files: int
    size_bytes: int


@dataclass(frozen=True, slots=True)
class BuildResult:
    """A table created and filled with `rows` rows in `appends` appends."""

    rows: int
    appends: int
    clock: Clock
    table: TableFiles


@dataclass(frozen=True, slots=True)
class ChangeMix:
    """The source rows of one MERGE, by what they do to the table."""

    updates: int
    inserts: int
    deletes: int

    @property
    def rows(self) -> int:
        return self.updates + self.inserts + self.deletes


@dataclass(frozen=True, slots=True)
class MergeResult:
    """One MERGE: its source, clock, operationMetrics and the table's files after it."""

    label: str
    mix: ChangeMix
    vbuckets: int
    condition_head: str
    clock: Clock
    metrics: Mapping[str, int]
    table: TableFiles


@dataclass(frozen=True, slots=True)
class CompactionResult:
    """One OPTIMIZE; `min_file_size` None means Delta's default (or clustering)."""

    label: str
    min_file_size: int | None
    committed: bool
    clock: Clock
    before: TableFiles
    after: TableFiles
    metrics: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class RowCheck:
    """Live rows counted against the rows the changes should have left."""

    stage: str
    expected_rows: int
    rows: int


@dataclass(frozen=True, slots=True)
class GeneratedCheck:
    """Rows of `groups16` whose `vbucket_group` Delta left null or wrong (both should be 0)."""

    stage: str
    rows: int
    merge_inserted_rows: int
    null_groups: int
    wrong_groups: int


@dataclass(frozen=True, slots=True)
class CandidateResult:
    """Everything measured on one layout; `error` set when a step failed (the rest is partial)."""

    layout: str
    build: BuildResult | None = None
    merges: tuple[MergeResult, ...] = ()
    compactions: tuple[CompactionResult, ...] = ()
    rollback: MergeResult | None = None
    restore_seconds: float | None = None
    row_checks: tuple[RowCheck, ...] = ()
    generated_checks: tuple[GeneratedCheck, ...] = ()
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ScalingResult:
    """One layout at one size: the build and two MERGE batches of the same mix."""

    layout: str
    docs: int
    build: BuildResult | None = None
    merges: tuple[MergeResult, ...] = ()
    error: str | None = None


@dataclass(frozen=True, slots=True)
class LayoutsReport:
    """A whole run, as written to JSON."""

    started_at: str
    finished_at: str
    docs: int
    changes: int
    batches: int
    doc_bytes: float
    cpu_count: int | None
    driver_memory: str
    spark_conf: Mapping[str, str]
    load_start: LoadAvg
    load_end: LoadAvg
    candidates: tuple[CandidateResult, ...]
    scaling: tuple[ScalingResult, ...] = field(default_factory=tuple)


# -- layouts ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Layout:
    """How one candidate table is created and how a MERGE names its vbuckets."""

    name: str
    partition_column: str | None = None
    generated_group: bool = False
    clustered: bool = False
    change_data_feed: bool = True

    def create(self, spark: SparkSession, path: str) -> None:
        from delta.tables import DeltaTable

        builder = DeltaTable.create(spark).location(path).addColumns(DATA_SCHEMA)
        if self.generated_group:
            builder = builder.addColumn(GROUP_COLUMN, "INT", generatedAlwaysAs=GROUP_EXPRESSION)
        for key, value in TABLE_PROPERTIES.items():
            builder = builder.property(key, value)
        if not self.change_data_feed:
            builder = builder.property("delta.enableChangeDataFeed", "false")
        if self.partition_column is not None:
            builder = builder.partitionedBy(self.partition_column)
        if self.clustered:
            builder = builder.clusterBy("vbucket")
        builder.execute()

    def prune(self, vbuckets: Sequence[int]) -> str:
        """The literal predicate on the target naming `vbuckets` (partition column first).

        >>> LAYOUTS["groups16"].prune([341])
        't.vbucket_group = 5 AND t.vbucket = 341'
        >>> LAYOUTS["vbucket"].prune([1, 2])
        't.vbucket IN (1, 2)'
        """
        wanted = sorted(set(vbuckets))
        by_vbucket = _literal_in("t.vbucket", wanted)
        if not self.generated_group:
            return by_vbucket
        groups = sorted({vb // GROUP_WIDTH for vb in wanted})
        return f"{_literal_in(f't.{GROUP_COLUMN}', groups)} AND {by_vbucket}"

    def merge_condition(self, vbuckets: Sequence[int]) -> str:
        return (
            f"{self.prune(vbuckets)} AND t.vbucket = s.vbucket "
            "AND t.collection_id = s.collection_id AND t.key = s.key"
        )


def _literal_in(column: str, values: Sequence[int]) -> str:
    if len(values) == 1:
        return f"{column} = {values[0]}"
    return f"{column} IN ({', '.join(str(v) for v in values)})"


LAYOUTS: dict[str, Layout] = {
    "vbucket": Layout("vbucket", partition_column="vbucket"),
    "groups16": Layout("groups16", partition_column=GROUP_COLUMN, generated_group=True),
    "unpartitioned": Layout("unpartitioned"),
    "clustered": Layout("clustered", clustered=True),
}
SCALING_LAYOUTS = ("groups16", "unpartitioned")


# -- measuring ----------------------------------------------------------------------------------


def timed(action: Callable[[], T]) -> tuple[T, Clock]:
    """Run `action`, returning its value and its wall clock with the load around it."""
    load_start = os.getloadavg()
    start = time.perf_counter()
    value = action()
    seconds = time.perf_counter() - start
    return value, Clock(round(seconds, 3), load_start, os.getloadavg())


@contextmanager
def session_conf(spark: SparkSession, key: str, value: str | None) -> Iterator[None]:
    """Set (or, with None, unset) a session conf for the block, then put the old one back."""
    old = spark.conf.get(key, None)
    if value is None:
        spark.conf.unset(key)
    else:
        spark.conf.set(key, value)
    try:
        yield
    finally:
        if old is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, old)


def table_files(spark: SparkSession, path: str) -> TableFiles:
    from delta.tables import DeltaTable

    row = _first(DeltaTable.forPath(spark, path).detail().select("numFiles", "sizeInBytes"))
    return TableFiles(int(row["numFiles"]), int(row["sizeInBytes"]))


def last_commit(spark: SparkSession, path: str) -> tuple[int, str, dict[str, int]]:
    """The newest commit's version, operation and numeric operationMetrics."""
    from delta.tables import DeltaTable

    history = DeltaTable.forPath(spark, path).history(1)
    row = _first(history.select("version", "operation", "operationMetrics"))
    metrics = {
        key: int(value)
        for key, value in (row["operationMetrics"] or {}).items()
        if value is not None and value.lstrip("-").isdigit()
    }
    return int(row["version"]), str(row["operation"]), metrics


# -- generated rows -----------------------------------------------------------------------------


def _doc(version: int) -> Column:
    """About 1 KB of JSON text for document `n` at `version` (different text per version)."""
    from pyspark.sql import functions as F

    n = F.col("n").cast("string")
    fields = [
        F.concat(
            F.lit(f'"field_{i:02d}":"'),
            F.sha2(F.concat_ws("-", n, F.lit(str(i)), F.lit(str(version))), 256),
            F.lit('"'),
        )
        for i in range(DOC_FIELDS)
    ]
    return F.concat(
        F.lit('{"n":'), n, F.lit(f',"version":{version},'), F.concat_ws(",", *fields), F.lit("}")
    )


def data_rows(frame: DataFrame, version: int, *, with_op: bool = False) -> DataFrame:
    """The mirror's columns for a frame of document numbers `n` (and `op` when `with_op`).

    Document `n` lives in vbucket `n % 1024` under key `doc-<n>`; a delete carries no body.
    """
    from pyspark.sql import functions as F

    n = F.col("n")
    deleted = F.col("op") == F.lit(DELETE) if with_op else F.lit(False)
    columns = [
        (n % NUM_VBUCKETS).cast("int").alias("vbucket"),
        F.lit("_default").alias("scope"),
        F.lit("_default").alias("collection"),
        F.lit(0).cast("long").alias("collection_id"),
        F.concat(F.lit("doc-"), n.cast("string")).alias("key"),
        (F.lit(version * 10_000_000) + F.floor(n / NUM_VBUCKETS) + 1).cast("long").alias("seqno"),
        F.lit(version + 1).cast("long").alias("rev_seqno"),
        (F.lit(1_700_000_000_000_000_000) + n * 16 + version).cast("long").alias("cas"),
        F.lit(33554438).cast("long").alias("flags"),
        F.lit(None).cast("timestamp").alias("expiry"),
        F.lit(True).alias("is_json"),
        F.when(deleted, F.lit(None).cast("string")).otherwise(_doc(version)).alias("doc"),
        F.lit(None).cast("binary").alias("value"),
        F.lit(None).cast("string").alias("xattrs"),
    ]
    if with_op:
        columns.append(F.col("op"))
    return frame.select(*columns)


def measure_doc_bytes(spark: SparkSession) -> float:
    from pyspark.sql import functions as F

    frame = data_rows(spark.range(1000).withColumnRenamed("id", "n"), 0)
    return float(_first(frame.select(F.avg(F.length("doc"))))[0])


def build_table(
    spark: SparkSession, layout: Layout, path: str, docs: int, *, appends: int = 4
) -> BuildResult:
    """Create the table and append `docs` documents in vbucket order, `appends` commits."""
    from pyspark.sql import functions as F

    bounds = [NUM_VBUCKETS * i // appends for i in range(appends + 1)]

    def build() -> None:
        layout.create(spark, path)
        for low, high in itertools.pairwise(bounds):
            rows = sum(len(range(vb, docs, NUM_VBUCKETS)) for vb in range(low, high))
            tasks = max(2, math.ceil(rows / ROWS_PER_WRITE_TASK))
            vbucket = F.col("n") % NUM_VBUCKETS
            numbers = (
                spark.range(docs)
                .withColumnRenamed("id", "n")
                .where((vbucket >= low) & (vbucket < high))
                .withColumn("vb", vbucket)
                .repartitionByRange(tasks, "vb")
                .sortWithinPartitions("vb", "n")
            )
            data_rows(numbers, 0).write.format("delta").mode("append").save(path)

    _, clock = timed(build)
    return BuildResult(docs, appends, clock, table_files(spark, path))


def change_source(
    spark: SparkSession, *, docs: int, changes: int, batch: int, batches: int
) -> tuple[DataFrame, ChangeMix]:
    """Batch `batch` of `batches`: 80% updates, 10% inserts, 10% deletes, one row per key.

    The existing documents a batch touches are every `stride`-th one (an odd stride, so they
    cover all 1024 vbuckets), disjoint between batches: no batch touches a deleted document.
    The inserts are fresh numbers above `docs`.
    """
    from pyspark.sql import functions as F

    inserts = changes // 10
    existing = changes - inserts
    stride = docs // (existing * batches)
    if stride < 1:
        raise ValueError(
            f"{batches} batches of {changes} changes need {existing * batches} documents; "
            f"the table has {docs}"
        )
    if stride % 2 == 0:
        stride -= 1
    index = F.col("id")
    touched = spark.range(batch * existing, (batch + 1) * existing).select(
        (index * stride).alias("n"),
        F.when(index % 9 == 0, F.lit(DELETE)).otherwise(F.lit(UPSERT)).alias("op"),
    )
    first_new = docs + batch * inserts
    fresh = spark.range(first_new, first_new + inserts).select(
        index.alias("n"), F.lit(UPSERT).alias("op")
    )
    first = batch * existing
    deletes = len(range(first + (-first) % 9, first + existing, 9))
    source = data_rows(touched.unionByName(fresh), batch + 1, with_op=True)
    return source, ChangeMix(existing - deletes, inserts, deletes)


def rollback_source(
    spark: SparkSession, path: str, *, rows: int = 300, vbucket: int = ROLLBACK_VBUCKET
) -> tuple[DataFrame, ChangeMix]:
    """`rows` changes of one vbucket: half updates, a quarter deletes, the rest inserts.

    When the vbucket holds fewer documents than the updates and deletes need, the shortfall
    becomes inserts (the source keeps `rows` rows).
    """
    present = sorted(
        int(row["key"].removeprefix("doc-"))
        for row in spark.read.format("delta").load(path)
        .where(f"vbucket = {vbucket}").select("key").collect()
    )
    updates = present[: rows // 2]
    deletes = present[rows // 2 : rows // 2 + rows // 4]
    start = max(present, default=0) + NUM_VBUCKETS
    start += (vbucket - start) % NUM_VBUCKETS
    fresh = [start + NUM_VBUCKETS * i for i in range(rows - len(updates) - len(deletes))]
    numbered = (
        [(n, UPSERT) for n in updates] + [(n, DELETE) for n in deletes]
        + [(n, UPSERT) for n in fresh]
    )
    frame = spark.createDataFrame(numbered, "n long, op string")
    return data_rows(frame, 9, with_op=True), ChangeMix(len(updates), len(fresh), len(deletes))


# -- operations ---------------------------------------------------------------------------------


def run_merge(
    spark: SparkSession, layout: Layout, path: str, source: DataFrame, mix: ChangeMix, label: str
) -> MergeResult:
    """MERGE `source` into the table as the replicator does; the source is cached first."""
    from delta.tables import DeltaTable

    source = source.orderBy("vbucket", "key").cache()
    try:
        count = source.count()
        if count != mix.rows:
            raise RuntimeError(f"{label}: source has {count} rows, expected {mix.rows}")
        vbuckets = [int(r[0]) for r in source.select("vbucket").distinct().collect()]
        condition = layout.merge_condition(vbuckets)
        columns: dict[str, str | Column] = {name: f"s.{name}" for name in DATA_COLUMNS}

        def merge() -> None:
            (
                DeltaTable.forPath(spark, path)
                .alias("t")
                .merge(source.alias("s"), condition)
                .whenMatchedDelete(condition=f"s.op = '{DELETE}'")
                .whenMatchedUpdate(condition=f"s.op = '{UPSERT}'", set=columns)
                .whenNotMatchedInsert(condition=f"s.op = '{UPSERT}'", values=columns)
                .execute()
            )

        _, clock = timed(merge)
    finally:
        source.unpersist()
    _, operation, metrics = last_commit(spark, path)
    if operation != "MERGE":
        raise RuntimeError(f"{label}: the newest commit is {operation}, not MERGE")
    head = condition if len(condition) <= 80 else condition[:77] + "..."
    return MergeResult(
        label, mix, len(vbuckets), head, clock, metrics, table_files(spark, path)
    )


def compact(
    spark: SparkSession, path: str, label: str, min_file_size: int | None
) -> CompactionResult:
    """OPTIMIZE (bin-packing, or clustering on a clustered table) with `min_file_size` set."""
    from delta.tables import DeltaTable

    before = table_files(spark, path)
    version_before, _, _ = last_commit(spark, path)
    setting = None if min_file_size is None else str(min_file_size)
    with session_conf(spark, MIN_FILE_SIZE_CONF, setting):
        _, clock = timed(lambda: DeltaTable.forPath(spark, path).optimize().executeCompaction())
    version, operation, metrics = last_commit(spark, path)
    committed = version > version_before and operation == "OPTIMIZE"
    return CompactionResult(
        label,
        min_file_size,
        committed,
        clock,
        before,
        table_files(spark, path),
        metrics if committed else {},
    )


def count_rows(spark: SparkSession, path: str) -> int:
    return int(spark.read.format("delta").load(path).count())


def check_generated(spark: SparkSession, path: str, stage: str, docs: int) -> GeneratedCheck:
    """Count `vbucket_group` values Delta did not compute as `vbucket DIV 64`."""
    from pyspark.sql import functions as F

    table = spark.read.format("delta").load(path)
    group = F.col(GROUP_COLUMN)
    number = F.regexp_extract(F.col("key"), r"^doc-(\d+)$", 1).cast("long")
    row = _first(
        table.select(
            F.count(F.lit(1)).alias("rows"),
            F.sum((number >= docs).cast("int")).alias("inserted"),
            F.sum(group.isNull().cast("int")).alias("nulls"),
            F.sum((group != F.expr(GROUP_EXPRESSION)).cast("int")).alias("wrong"),
        )
    )
    return GeneratedCheck(
        stage, int(row["rows"]), int(row["inserted"] or 0), int(row["nulls"] or 0),
        int(row["wrong"] or 0),
    )


def restore(spark: SparkSession, path: str, version: int) -> float:
    from delta.tables import DeltaTable

    start = time.perf_counter()
    DeltaTable.forPath(spark, path).restoreToVersion(version)
    return round(time.perf_counter() - start, 3)


# -- runs ---------------------------------------------------------------------------------------


def measure_candidate(
    spark: SparkSession,
    layout: Layout,
    path: str,
    *,
    docs: int,
    changes: int,
    batches: int,
    progress: Callable[[str], None],
) -> CandidateResult:
    """Build, merge `batches` times, compact, roll one vbucket back; then drop the table."""
    result = CandidateResult(layout.name)
    expected = docs
    try:
        progress(f"{layout.name}: building {docs} rows")
        build = build_table(spark, layout, path, docs)
        result = _replace(result, build=build)
        if layout.generated_group:
            check = check_generated(spark, path, "after appends", docs)
            result = _replace(result, generated_checks=(check,))
        for batch in range(batches):
            progress(f"{layout.name}: MERGE batch {batch + 1}/{batches}")
            source, mix = change_source(
                spark, docs=docs, changes=changes, batch=batch, batches=batches
            )
            merge = run_merge(spark, layout, path, source, mix, f"batch {batch + 1}")
            expected += mix.inserts - mix.deletes
            result = _replace(result, merges=(*result.merges, merge))
        checks: tuple[RowCheck, ...] = (
            RowCheck("after merges", expected, count_rows(spark, path)),
        )
        result = _replace(result, row_checks=checks)
        if layout.generated_group:
            check = check_generated(spark, path, "after merges", docs)
            result = _replace(result, generated_checks=(*result.generated_checks, check))

        before_compaction, _, _ = last_commit(spark, path)
        first_min = None if layout.clustered else SMALL_FILE_BYTES
        first_label = "OPTIMIZE (clustering)" if layout.clustered else "compaction minFileSize=16MB"
        progress(f"{layout.name}: {first_label}")
        first = compact(spark, path, first_label, first_min)
        result = _replace(result, compactions=(first,))

        progress(f"{layout.name}: rollback MERGE of vbucket {ROLLBACK_VBUCKET}")
        source, mix = rollback_source(spark, path)
        rollback = run_merge(spark, layout, path, source, mix, f"rollback vb {ROLLBACK_VBUCKET}")
        expected += mix.inserts - mix.deletes
        checks = (*result.row_checks, RowCheck("after rollback", expected, count_rows(spark, path)))
        result = _replace(result, rollback=rollback, row_checks=checks)
        if layout.generated_group:
            check = check_generated(spark, path, "after rollback", docs)
            result = _replace(result, generated_checks=(*result.generated_checks, check))

        if not layout.clustered:
            progress(f"{layout.name}: restore to v{before_compaction}, compaction with defaults")
            restore_seconds = restore(spark, path, before_compaction)
            second = compact(spark, path, "compaction Delta default", None)
            result = _replace(
                result, compactions=(first, second), restore_seconds=restore_seconds
            )
    except Exception as exc:
        result = _replace(result, error=f"{type(exc).__name__}: {_first_line(exc)}")
        progress(f"{layout.name}: FAILED {result.error}")
    finally:
        shutil.rmtree(path, ignore_errors=True)
    return result


def measure_scaling(
    spark: SparkSession,
    layout: Layout,
    path: str,
    *,
    docs: int,
    changes: int,
    progress: Callable[[str], None],
) -> ScalingResult:
    """Build a `docs`-row table and MERGE two batches of `changes` into it; then drop it."""
    result = ScalingResult(layout.name, docs)
    try:
        progress(f"scaling {layout.name} @ {docs}: building")
        result = _replace(result, build=build_table(spark, layout, path, docs))
        for batch in range(2):
            progress(f"scaling {layout.name} @ {docs}: MERGE {batch + 1}/2")
            source, mix = change_source(spark, docs=docs, changes=changes, batch=batch, batches=2)
            merge = run_merge(spark, layout, path, source, mix, f"merge {batch + 1}")
            result = _replace(result, merges=(*result.merges, merge))
    except Exception as exc:
        result = _replace(result, error=f"{type(exc).__name__}: {_first_line(exc)}")
        progress(f"scaling {layout.name} @ {docs}: FAILED {result.error}")
    finally:
        shutil.rmtree(path, ignore_errors=True)
    return result


def _first(frame: DataFrame) -> Row:
    row = frame.first()
    if row is None:
        raise RuntimeError("expected a row, the query returned none")
    return row


def _replace(value: T, **changes: Any) -> T:
    from dataclasses import replace

    return replace(value, **changes)  # type: ignore[type-var]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:500] if text else repr(exc)


# -- report -------------------------------------------------------------------------------------


def _mb(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


def _load(clock: Clock) -> str:
    return f"{clock.load_start[0]:.2f}->{clock.load_end[0]:.2f}"


MERGE_HEADER = (
    f"{'':24} {'secs':>7} {'+files':>7} {'-files':>7} {'copied':>7} {'DVs':>5} {'cdc':>5} "
    f"{'execMs':>7} {'scanMs':>7} {'rwMs':>7} {'files':>6} {'load1':>11}"
)


def _merge_line(merge: MergeResult) -> str:
    m = merge.metrics

    def g(key: str) -> str:
        return str(m[key]) if key in m else "-"

    return (
        f"{merge.label:24} {merge.clock.seconds:7.1f} {g('numTargetFilesAdded'):>7} "
        f"{g('numTargetFilesRemoved'):>7} {g('numTargetRowsCopied'):>7} "
        f"{g('numTargetDeletionVectorsAdded'):>5} {g('numTargetChangeFilesAdded'):>5} "
        f"{g('executionTimeMs'):>7} {g('scanTimeMs'):>7} {g('rewriteTimeMs'):>7} "
        f"{merge.table.files:>6} {_load(merge.clock):>11}"
    )


def _compaction_line(c: CompactionResult) -> str:
    added = c.metrics.get("numAddedFiles", c.metrics.get("numFilesAdded", 0))
    removed = c.metrics.get("numRemovedFiles", c.metrics.get("numFilesRemoved", 0))
    dvs = c.metrics.get("numDeletionVectorsRemoved")
    return (
        f"{c.label:28} {c.clock.seconds:7.1f} s  files {c.before.files} -> {c.after.files} "
        f"(+{added} -{removed}{'' if dvs is None else f', DVs removed {dvs}'})  "
        f"{_mb(c.before.size_bytes)} -> {_mb(c.after.size_bytes)}"
        f"{'' if c.committed else '  (no commit)'}  load {_load(c.clock)}"
    )


def render_candidate(result: CandidateResult) -> str:
    lines = [f"== {result.layout} =="]
    if result.build is not None:
        b = result.build
        lines.append(
            f"build: {b.rows} rows in {b.appends} appends: {b.clock.seconds:.1f} s, "
            f"{b.table.files} files, {_mb(b.table.size_bytes)}  load {_load(b.clock)}"
        )
    if result.merges or result.rollback is not None:
        lines.append(MERGE_HEADER)
        for merge in result.merges:
            lines.append(_merge_line(merge))
        if result.rollback is not None:
            lines.append(_merge_line(result.rollback))
            mix = result.rollback.mix
            lines.append(
                f"{'':24} rollback source: {mix.updates} updates, {mix.deletes} deletes, "
                f"{mix.inserts} inserts; condition {result.rollback.condition_head}"
            )
    for compaction in result.compactions:
        lines.append(_compaction_line(compaction))
    if result.restore_seconds is not None:
        lines.append(f"(restore before the default compaction: {result.restore_seconds:.1f} s)")
    for check in result.row_checks:
        verdict = "ok" if check.rows == check.expected_rows else "MISMATCH"
        lines.append(f"rows {check.stage}: {check.rows} (expected {check.expected_rows}) {verdict}")
    for g in result.generated_checks:
        lines.append(
            f"vbucket_group {g.stage}: {g.rows} rows ({g.merge_inserted_rows} MERGE-inserted), "
            f"null {g.null_groups}, wrong {g.wrong_groups}"
        )
    if result.error:
        lines.append(f"ERROR: {result.error}")
    return "\n".join(lines)


def render_summary(candidates: Sequence[CandidateResult]) -> str:
    lines = [
        f"{'layout':14} {'build s':>8} {'files':>6} {'merge1 s':>9} {'merge2 s':>9} "
        f"{'merge3 s':>9} {'files':>6} {'compact s':>10} {'files':>12} {'rollbk s':>9} "
        f"{'+/-files':>9}"
    ]
    for c in candidates:
        build = (
            f"{c.build.clock.seconds:8.1f} {c.build.table.files:>6}" if c.build else f"{'-':>15}"
        )
        merges = [f"{m.clock.seconds:9.1f}" for m in c.merges] + [f"{'-':>9}"] * 3
        files = f"{c.merges[-1].table.files:>6}" if c.merges else f"{'-':>6}"
        if c.compactions:
            first = c.compactions[0]
            compacted = (
                f"{first.clock.seconds:10.1f} {f'{first.before.files}->{first.after.files}':>12}"
            )
        else:
            compacted = f"{'-':>10} {'-':>12}"
        if c.rollback is not None:
            m = c.rollback.metrics
            touched = f"+{m.get('numTargetFilesAdded', 0)}/-{m.get('numTargetFilesRemoved', 0)}"
            rollback = f"{c.rollback.clock.seconds:9.1f} {touched:>9}"
        else:
            rollback = f"{'-':>9} {'-':>9}"
        lines.append(f"{c.layout:14} {build} {' '.join(merges[:3])} {files} {compacted} {rollback}")
    return "\n".join(lines)


def render_scaling(results: Sequence[ScalingResult]) -> str:
    lines = [
        f"{'layout':14} {'docs':>9} {'build s':>8} {'files':>6} {'size':>10}  " + MERGE_HEADER
    ]
    for r in results:
        head = f"{r.layout:14} {r.docs:>9} "
        if r.build is not None:
            head += (
                f"{r.build.clock.seconds:8.1f} {r.build.table.files:>6} "
                f"{_mb(r.build.table.size_bytes):>10}"
            )
        else:
            head += f"{'-':>26}"
        if not r.merges:
            lines.append(head + ("  ERROR: " + r.error if r.error else ""))
        for index, merge in enumerate(r.merges):
            prefix = head if index == 0 else " " * len(head)
            lines.append(f"{prefix}  {_merge_line(merge)}")
        if r.merges and r.error:
            lines.append(f"{' ' * len(head)}  ERROR: {r.error}")
    return "\n".join(lines)


def write_json(report: LayoutsReport, output: Path) -> None:
    output.parent.mkdir(parents=True, exist_ok=True)
    temporary = output.with_suffix(output.suffix + ".tmp")
    temporary.write_text(json.dumps(asdict(report), indent=2) + "\n")
    temporary.replace(output)


# -- command line -------------------------------------------------------------------------------


def _sizes(text: str) -> tuple[int, ...]:
    sizes = tuple(int(part.replace("_", "")) for part in text.split(",") if part.strip())
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of sizes, got {text!r}")
    return sizes


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m replicator.bench.layouts",
        description="Measure candidate Delta layouts of the mirror table side by side.",
    )
    parser.add_argument("--docs", type=int, default=200_000, help="rows of each candidate table")
    parser.add_argument("--changes", type=int, default=20_000, help="source rows of a MERGE batch")
    parser.add_argument("--batches", type=int, default=3, help="MERGE batches per candidate")
    parser.add_argument("--work-dir", type=Path, required=True, help="where tables are made")
    parser.add_argument("--output", type=Path, required=True, help="JSON file of all figures")
    parser.add_argument(
        "--layouts", default=",".join(LAYOUTS),
        help=f"candidates to run, in order (of {', '.join(LAYOUTS)}; empty: none)",
    )
    parser.add_argument(
        "--scaling", type=_sizes, default=(200_000, 1_000_000, 5_000_000),
        help="table sizes of the scaling run (groups16 and unpartitioned)",
    )
    parser.add_argument(
        "--scaling-layouts", default=",".join(SCALING_LAYOUTS),
        help="layouts of the scaling run, in the order they run at each size",
    )
    parser.add_argument("--skip-scaling", action="store_true", help="no scaling run")
    parser.add_argument("--driver-memory", default="4g", help="the local Spark driver's heap")
    parser.add_argument(
        "--no-change-data-feed", action="store_true",
        help="create every table without the change data feed (the mirror has it on)",
    )
    args = parser.parse_args(argv)
    args.layouts = _names(parser, args.layouts)
    args.scaling_layouts = _names(parser, args.scaling_layouts)
    return args


def _names(parser: argparse.ArgumentParser, text: str) -> tuple[str, ...]:
    """Layout names from a comma-separated list; an empty list runs none of them."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in LAYOUTS]
    if unknown:
        parser.error(f"unknown layouts {unknown}; known: {', '.join(LAYOUTS)}")
    return names


def main(argv: Sequence[str] | None = None) -> int:
    from replicator.runtime.spark import build_session

    args = parse_args(argv)
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    load_start = os.getloadavg()

    def progress(message: str) -> None:
        stamp = datetime.now(UTC).strftime("%H:%M:%S")
        print(f"[{stamp} load {os.getloadavg()[0]:.2f}] {message}", file=sys.stdout, flush=True)

    work_dir: Path = args.work_dir.resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    spark = build_session("layouts", driver_memory=args.driver_memory)
    shown_conf = {
        key: str(spark.conf.get(key, None) or "(unset)")
        for key in (
            "spark.master",
            "spark.sql.shuffle.partitions",
            "spark.databricks.delta.merge.repartitionBeforeWrite.enabled",
            "spark.databricks.delta.optimize.maxFileSize",
            "spark.databricks.delta.optimize.maxDeletedRowsRatio",
        )
    }
    doc_bytes = measure_doc_bytes(spark)
    progress(f"documents average {doc_bytes:.0f} bytes of JSON text")

    candidates: list[CandidateResult] = []
    scaling: list[ScalingResult] = []

    def report() -> LayoutsReport:
        return LayoutsReport(
            started_at=started_at,
            finished_at=datetime.now(UTC).isoformat(timespec="seconds"),
            docs=args.docs,
            changes=args.changes,
            batches=args.batches,
            doc_bytes=doc_bytes,
            cpu_count=os.cpu_count(),
            driver_memory=args.driver_memory,
            spark_conf=shown_conf,
            load_start=load_start,
            load_end=os.getloadavg(),
            candidates=tuple(candidates),
            scaling=tuple(scaling),
        )

    def chosen(name: str) -> Layout:
        return _replace(LAYOUTS[name], change_data_feed=not args.no_change_data_feed)

    for name in args.layouts:
        layout = chosen(name)
        result = measure_candidate(
            spark,
            layout,
            str(work_dir / name),
            docs=args.docs,
            changes=args.changes,
            batches=args.batches,
            progress=progress,
        )
        candidates.append(result)
        print(render_candidate(result), flush=True)
        write_json(report(), args.output)

    if not args.skip_scaling:
        for docs in args.scaling:
            for name in args.scaling_layouts:
                scaled = measure_scaling(
                    spark,
                    chosen(name),
                    str(work_dir / f"scaling-{name}-{docs}"),
                    docs=docs,
                    changes=args.changes,
                    progress=progress,
                )
                scaling.append(scaled)
                print(render_scaling([scaled]), flush=True)
                write_json(report(), args.output)

    final = report()
    write_json(final, args.output)
    print("\n== summary ==")
    print(render_summary(final.candidates))
    for candidate in final.candidates:
        print()
        print(render_candidate(candidate))
    if final.scaling:
        print("\n== scaling: one MERGE of the same mix, twice, per table size ==")
        print(render_scaling(final.scaling))
    print(
        f"\nload average at start {final.load_start}, at end {final.load_end}; "
        f"JSON written to {args.output}",
        flush=True,
    )
    spark.stop()
    failed = [c.layout for c in final.candidates if c.error] + [
        f"{s.layout}@{s.docs}" for s in final.scaling if s.error
    ]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
