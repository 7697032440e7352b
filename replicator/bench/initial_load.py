"""Measurement 3: initial load, from an empty target to a caught-up mirror, end to end.

`run_replication` with `until_caught_up`, exactly as `replicator run --until-caught-up` runs,
against a producer in its own process; the clock runs from the call to its return (connect,
create the tables, stream, stage, commit every vbucket).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from replicator.bench.procfs import CpuMeter, spark_jvm_pid
from replicator.config import ReplicatorConfig, Secret
from replicator.pipeline.runner import run_replication

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True, slots=True)
class InitialLoadResult:
    """An initial load: rows committed, how long, and where the CPU went.

    `rows_in_mirror` is counted from the table afterwards; `complete` says it holds every
    document (`expected_rows`). CPU seconds are of the Python driver and of its JVM;
    `spark_jobs` counts the Spark jobs the run started (each a fixed cost, whatever its size).
    """

    expected_rows: int
    rows_in_mirror: int
    complete: bool
    commits: int
    seconds: float
    rows_per_second: float
    python_cpu_seconds: float
    jvm_cpu_seconds: float
    spark_jobs: int
    jvm_warmup_seconds: float = 0.0
    """How long the untimed warm-up before it took (0: none; see `suite.warm_up_jvm`)."""


def bench_config(source: str, target: str, password: str, **settings: Any) -> ReplicatorConfig:
    """A replicator config for a benchmark run: product defaults but for what is given."""
    values: dict[str, Any] = {
        "source": source,
        "target": target,
        "password": Secret(password),
        "progress": "off",
    }
    values.update(settings)
    return dataclasses.replace(ReplicatorConfig(), **values)


def measure_initial_load(
    spark: SparkSession, config: ReplicatorConfig, *, expected_rows: int
) -> InitialLoadResult:
    """Run `config` (which must say until_caught_up) and time it; the target must be new."""
    if not config.until_caught_up:
        raise ValueError("an initial load measurement needs until_caught_up")
    meter = CpuMeter(python="self", jvm=spark_jvm_pid(spark)).start()
    first_job = last_spark_job(spark)
    started = time.perf_counter()
    summary = run_replication(config, spark=spark)
    seconds = time.perf_counter() - started
    cpu = meter.stop()
    jobs = last_spark_job(spark) - first_job
    rows = spark.read.format("delta").load(config.target).count()
    return InitialLoadResult(
        expected_rows=expected_rows,
        rows_in_mirror=rows,
        complete=summary.caught_up and rows == expected_rows,
        commits=summary.commits,
        seconds=seconds,
        rows_per_second=rows / seconds,
        python_cpu_seconds=cpu["python"],
        jvm_cpu_seconds=cpu["jvm"],
        spark_jobs=jobs,
    )


def last_spark_job(spark: SparkSession) -> int:
    """The id of the newest Spark job started outside job groups (-1 before any)."""
    return max(spark.sparkContext.statusTracker().getJobIdsForGroup(None), default=-1)
