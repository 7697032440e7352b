"""Measurement 8: a scheduled `--until-caught-up` run with a few changes pending.

A mirror of `docs` documents over `vbuckets` is built first (untimed), then `changes` changes
are applied to the producer (spread over its vbuckets) and one more until-caught-up run is
timed from the moment it is called with a Spark session already up to its return: what a cron
job pays per run once its JVM has started. The run's own Delta commits and Spark jobs are
counted, as are the table versions it wrote.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from replicator.bench.initial_load import last_spark_job
from replicator.config import ReplicatorConfig, Secret
from replicator.pipeline.runner import run_replication
from replicator.sim.bucket import SimBucket
from replicator.sim.cluster import DEFAULT_PASSWORD, SimCluster
from replicator.sim.workload import initial_load

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True, slots=True)
class CatchUpResult:
    """One until-caught-up run over `vbuckets` with `changes` changes pending."""

    vbuckets: int
    docs: int
    changes: int
    seconds: float
    items_committed: int
    data_commits: int
    table_versions: int
    spark_jobs: int
    caught_up: bool


def measure_catch_up(
    spark: SparkSession, *, target: str, docs: int, doc_size: int, vbuckets: int, changes: int
) -> CatchUpResult:
    """Build a mirror of the producer, apply `changes`, time one more until-caught-up run."""
    bucket = SimBucket("catchup", num_vbuckets=vbuckets, seed=8)
    workload = initial_load(bucket, docs=docs, doc_size=doc_size, seed=8)
    with SimCluster(bucket, nodes=1) as cluster:
        config = ReplicatorConfig(
            source=cluster.connection_string, target=target,
            password=Secret(DEFAULT_PASSWORD), until_caught_up=True, progress="off",
        )  # fmt: skip
        run_replication(config, spark=spark)
        applied = 0
        while applied < changes:
            step = min(100, changes - applied)
            bucket.apply_batch(workload.next_batch(step))
            applied += step
        versions_before = _version(spark, target)
        jobs_before = last_spark_job(spark)
        started = time.perf_counter()
        summary = run_replication(config, spark=spark)
        seconds = time.perf_counter() - started
        jobs = last_spark_job(spark) - jobs_before
    versions = _version(spark, target) - versions_before
    return CatchUpResult(
        vbuckets=vbuckets, docs=docs, changes=changes, seconds=seconds,
        items_committed=summary.items_committed, data_commits=summary.commits,
        table_versions=versions, spark_jobs=jobs, caught_up=summary.caught_up,
    )  # fmt: skip


def _version(spark: SparkSession, target: str) -> int:
    from replicator.delta.table import table_version

    return table_version(spark, target)
