"""Measurement 4: the sink's physical limit: the same rows, plainly appended from Arrow.

The mirror's own rows are read back (untimed) in chunks of vbuckets, each chunk no larger than
a first load's commit byte cap, and appended from Arrow to a fresh Delta table partitioned like the
mirror (by its generated `vbucket_group`, or by `vbucket` for a mirror of the older layout).
Only the appends are timed: that is what any writer of these rows into Delta must pay, with no
DCP, staging or commit protocol around it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql.types import StructType

from replicator.bench.procfs import CpuMeter, spark_jvm_pid
from replicator.delta.schema import DATA_COLUMNS, DATA_SCHEMA
from replicator.delta.table import table_properties_and_partitioning

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

READ_BYTES = 64 * 1024 * 1024
"""The most row bytes read back from the mirror in one collect (untimed)."""


@dataclass(frozen=True, slots=True)
class PlainAppendResult:
    """Plain appends of `rows` rows (`arrow_bytes` in Arrow) in `appends` commits."""

    rows: int
    arrow_bytes: int
    appends: int
    seconds: float
    rows_per_second: float
    python_cpu_seconds: float
    jvm_cpu_seconds: float


def vbucket_chunks(vbuckets: list[int], chunks: int) -> list[list[int]]:
    """Split sorted `vbuckets` into `chunks` contiguous groups of near-equal size (pure).

    >>> vbucket_chunks([0, 1, 2, 3, 4], 2)
    [[0, 1, 2], [3, 4]]
    """
    if chunks < 1:
        raise ValueError(f"chunks must be positive, got {chunks}")
    chunks = min(chunks, len(vbuckets)) or 1
    size, extra = divmod(len(vbuckets), chunks)
    groups, start = [], 0
    for index in range(chunks):
        end = start + size + (1 if index < extra else 0)
        groups.append(vbuckets[start:end])
        start = end
    return [group for group in groups if group]


def measure_plain_append(
    spark: SparkSession, mirror_path: str, target: str, *, max_chunk_bytes: int
) -> PlainAppendResult:
    """Append the mirror's rows to a new table at `target`, timing only the appends."""
    from pyspark.sql import functions as F

    _properties, partitioning = table_properties_and_partitioning(spark, mirror_path)
    generated = [c for c in partitioning if c not in DATA_COLUMNS]  # vbucket_group
    mirror = spark.read.format("delta").load(mirror_path).select(*DATA_COLUMNS, *generated)
    schema = StructType([*DATA_SCHEMA.fields, *(mirror.schema[c] for c in generated)])
    sizes = (
        mirror.groupBy("vbucket")
        .agg(F.sum(F.length("doc") + F.length("key") + F.lit(96)).alias("bytes"))
        .collect()
    )
    by_vbucket = {int(row["vbucket"]): int(row["bytes"] or 0) for row in sizes}
    total = sum(by_vbucket.values())
    groups = vbucket_chunks(sorted(by_vbucket), max(1, -(-total // max_chunk_bytes)))
    meter = CpuMeter(python="self", jvm=spark_jvm_pid(spark))
    rows = arrow_bytes = 0
    seconds = 0.0
    cpu = {"python": 0.0, "jvm": 0.0}
    for group in groups:
        # Read in pieces: one task's result of hundreds of MB can be dropped from the block
        # manager of a 2 GB driver before it is fetched (TaskResultLost at 1,000,000 rows).
        group_bytes = sum(by_vbucket[vbucket] for vbucket in group)
        table = pa.concat_tables(
            mirror.where(F.col("vbucket").isin(piece)).toArrow()
            for piece in vbucket_chunks(group, -(-group_bytes // READ_BYTES))
        )
        rows += table.num_rows
        arrow_bytes += table.nbytes
        meter.start()
        started = time.perf_counter()
        (
            spark.createDataFrame(table, schema)
            .write.format("delta")
            .mode("append")
            .partitionBy(*partitioning)
            .save(target)
        )
        seconds += time.perf_counter() - started
        for name, used in meter.stop().items():
            cpu[name] += used
        del table
    return PlainAppendResult(
        rows=rows,
        arrow_bytes=arrow_bytes,
        appends=len(groups),
        seconds=seconds,
        rows_per_second=rows / seconds if seconds else 0.0,
        python_cpu_seconds=cpu["python"],
        jvm_cpu_seconds=cpu["jvm"],
    )
