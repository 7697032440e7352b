"""The measured runs: building a candidate table, MERGE batches, compactions, a rollback and
a restore, each timed with the load around it; `measure_candidate` and `measure_scaling` chain
them and record what failed instead of stopping."""

from __future__ import annotations

import itertools
import math
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from replicator.bench.layouts.report import (
    BuildResult,
    CandidateResult,
    ChangeMix,
    Clock,
    CompactionResult,
    GeneratedCheck,
    MergeResult,
    RowCheck,
    ScalingResult,
    TableFiles,
)
from replicator.bench.layouts.workload import (
    GROUP_COLUMN,
    GROUP_EXPRESSION,
    NUM_VBUCKETS,
    ROLLBACK_VBUCKET,
    Layout,
    change_source,
    data_rows,
    rollback_source,
)
from replicator.delta.compaction import MIN_FILE_SIZE_CONF
from replicator.delta.schema import DATA_COLUMNS
from replicator.staging.rows import DELETE, UPSERT

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, Row, SparkSession

T = TypeVar("T")

SMALL_FILE_BYTES = 16 * 1024 * 1024
"""The compaction measured here takes files under 16 MB: every file of a 200,000-row table."""

ROWS_PER_WRITE_TASK = 100_000
"""A build append gets one write task per this many rows (at least two): ~100 MB files."""


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
