"""Pruning the replicator's own tables, so that reading them costs what the vbuckets need, not
the mirror's age.

Every data commit adds a row per vbucket it touched: at 1024 vbuckets and a commit every 10 s,
some 8.6 million rows a day. A restart reads the whole table and every rollback reads a
vbucket's rows, and files mix vbuckets, so data skipping cannot help (a 3,000-commit table of
3 million rows: 2.2 to 3.2 s for a restart's read). The rows a rollback can use are far fewer:
it rewinds to the newest live boundary at or below the producer's rollback seqno, and any
older live boundary is also correct (it only streams again more). So pruning keeps, of each
vbucket:

- every row that is not a plain commit (rollbacks and resyncs: they decide which boundaries are
  live, and `audit rollbacks` counts them);
- the rows of each owner's newest commit (a restart takes its next batch id and its repair
  floor from them);
- of its live boundaries (see `rollback.live_boundaries`): the newest `recent`, the newest of
  each hour for `hourly_for`, the newest of each day for `daily_for`.

A boundary that was abandoned (on a branch a rollback or resync cut off) is kept only when it
is an owner's newest commit, and then the rollback or resync that cut it off is kept too, so
the live boundaries of what remains are exactly the kept ones of the whole: a rollback never
rewinds to an abandoned branch because its cutter was pruned.

The failover logs table gains a row per vbucket at every stream request and rollback, and is
read for each vbucket's newest row: pruning keeps each vbucket's newest rows only.

The pruner runs on the commit thread after a data commit, like compaction, when the checkpoints
table has gained `prune_every_files` files. It deletes with a MERGE per table whose source is
the rows to drop read at one version of that table: rows appended after it (another shard's
flush or save) are never in it, and blind appends do not conflict with the MERGE. It prunes
only the owner's vbuckets, so shards never prune the same rows; a prune that still meets a
concurrent delete gives way until the next due point.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from replicator.delta.checkpoints import CheckpointsTable
from replicator.delta.commit_metadata import RESYNC, ROLLBACK
from replicator.delta.conflicts import is_concurrent_modification
from replicator.delta.schema import in_list
from replicator.delta.table import (
    MirrorTable,
    delta_snapshot,
    delta_write_confs,
    engine_error_summary,
    now_utc,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CheckpointRetention:
    """Which live boundaries of a vbucket pruning keeps, and how often it runs.

    The defaults keep about 16 + 24 + 7 rows per vbucket (some 48,000 at 1024 vbuckets) once
    a mirror is a week old. A pruner's `daily_for` is the mirror's file retention unless given:
    a rollback to a boundary older than that finds its files vacuumed and resyncs anyway.
    """

    recent: int = 16
    hourly_for: timedelta = timedelta(days=1)
    daily_for: timedelta = timedelta(days=7)
    prune_every_files: int = 16
    """A prune is due once the table holds this many more files than after the last one. A
    checkpoints flush appends one file, for 16 commits by default: every 256 commits."""

    def __post_init__(self) -> None:
        if self.recent < 1:
            raise ValueError(f"recent must be at least 1, got {self.recent}")
        if self.prune_every_files < 1:
            raise ValueError(
                f"prune_every_files must be at least 1, got {self.prune_every_files}"
            )
        for name in ("hourly_for", "daily_for"):
            value: timedelta = getattr(self, name)
            if value < timedelta(0):
                raise ValueError(f"{name} must not be negative, got {value}")


def rows_to_drop(
    frame: DataFrame, vbuckets: Iterable[int], retention: CheckpointRetention, now: datetime
) -> DataFrame:
    """The (vbucket, table_version) of the rows of `frame` (the checkpoints table) to prune.

    Only rows of `vbuckets` are candidates. A vbucket's rows are ordered by (table_version,
    batch_id), as `live_boundaries` orders them; a row is live when no later row of its vbucket
    is a resync and no later rollback went below its seqno (what `live_boundaries` computes
    by walking the chain, here as windows over the later rows).
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    newest_first = [F.col("table_version").desc(), F.col("batch_id").desc()]
    later = Window.partitionBy("vbucket").orderBy(*newest_first).rowsBetween(
        Window.unboundedPreceding, -1
    )
    # Per owner, over the whole table (a few rows: a join, not a window holding every row).
    owners = frame.groupBy("owner_id").agg(
        F.max("batch_id").alias("owner_batch"), F.max("table_version").alias("owner_version")
    )
    rows = (
        frame.select("owner_id", "batch_id", "table_version", "kind", "vbucket", "seqno",
                     "committed_at")
        .where(in_list("vbucket", vbuckets))
        .join(F.broadcast(owners), "owner_id")
        .withColumn("resync_later", F.max((F.col("kind") == RESYNC).cast("int")).over(later))
        .withColumn(
            "rollback_later",
            F.min(F.when(F.col("kind") == ROLLBACK, F.col("seqno"))).over(later),
        )
        .withColumn(
            "live",
            (F.coalesce(F.col("resync_later"), F.lit(0)) == 0)
            & (F.col("rollback_later").isNull() | (F.col("rollback_later") >= F.col("seqno"))),
        )
        .withColumn("hour", F.date_trunc("hour", "committed_at"))
        .withColumn("day", F.date_trunc("day", "committed_at"))
    )

    def newest_of(*keys: str) -> Column:
        window = Window.partitionBy("vbucket", "live", *keys).orderBy(*newest_first)
        return F.row_number().over(window)

    rows = (
        rows.withColumn("rank", newest_of())
        .withColumn("hour_rank", newest_of("hour"))
        .withColumn("day_rank", newest_of("day"))
    )
    kept_boundary = F.col("live") & (
        (F.col("rank") <= retention.recent)
        | ((F.col("hour_rank") == 1) & (F.col("committed_at") >= now - retention.hourly_for))
        | ((F.col("day_rank") == 1) & (F.col("committed_at") >= now - retention.daily_for))
    )
    protected = (
        F.col("kind").isin(ROLLBACK, RESYNC)
        | (F.col("batch_id") == F.col("owner_batch"))
        | (F.col("table_version") == F.col("owner_version"))
    )
    return rows.where(~(protected | kept_boundary)).select("vbucket", "table_version")


def failover_rows_to_drop(frame: DataFrame, vbuckets: Iterable[int]) -> DataFrame:
    """The (vbucket, updated_at) of the failover log rows of `vbuckets` older than the newest.

    Loading takes each vbucket's newest row; the older ones are what earlier saves left.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    return (
        frame.where(in_list("vbucket", vbuckets))
        .withColumn("newest", F.max("updated_at").over(Window.partitionBy("vbucket")))
        .where(F.col("updated_at") < F.col("newest"))
        .select("vbucket", "updated_at")
        .distinct()
    )


@dataclass(frozen=True, slots=True)
class PruneOutcome:
    """One prune: the checkpoints table's files before and after, rows dropped from each table,
    how long it took."""

    files_before: int
    files_after: int
    rows_dropped: int
    seconds: float
    failover_rows_dropped: int = 0


class MetadataPruner:
    """Prunes one owner's vbuckets' rows of a mirror's checkpoints and failover logs tables."""

    def __init__(
        self,
        mirror: MirrorTable,
        vbuckets: Iterable[int],
        retention: CheckpointRetention | None = None,
    ) -> None:
        self.mirror = mirror
        self.path = mirror.layout.checkpoints
        self._checkpoints = CheckpointsTable.of(mirror)
        self.vbuckets = tuple(sorted(set(vbuckets)))
        self.retention = retention or CheckpointRetention(
            daily_for=mirror.config.deleted_file_retention
        )
        self._files_after_last = 0
        """0 at start: a table that grew before this process (or this release) is pruned at
        the first due check."""
        self.prunes = 0

    def table_files(self) -> int:
        """Files of the checkpoints table (no Spark job)."""
        return self._checkpoints.live_files()

    def due(self) -> bool:
        if not self.vbuckets:
            return False
        return self.table_files() >= self._files_after_last + self.retention.prune_every_files

    def prune_if_due(self, now: datetime | None = None) -> PruneOutcome | None:
        return self.prune(now) if self.due() else None

    def prune(self, now: datetime | None = None) -> PruneOutcome | None:
        """Drop the rows the retention does not keep, then pack the table's files; None when a
        concurrent commit got in the way (retried at the next due point)."""
        return self.apply(self.drops(now))

    def drops(self, now: datetime | None = None) -> PlannedDrops:
        """The rows a prune would drop, as of each table's current version.

        Pinned to that version: a DataFrame read by path sees the newest version whenever it
        runs, and a MERGE runs its source after the rows appended meanwhile (measured: they
        were dropped unread).
        """
        checkpoints = self._pinned(self.path)
        failover_logs = self._pinned(self.mirror.layout.failover_logs)
        return PlannedDrops(
            rows_to_drop(checkpoints, self.vbuckets, self.retention, now or now_utc()),
            failover_rows_to_drop(failover_logs, self.vbuckets),
        )

    def _pinned(self, path: str) -> DataFrame:
        spark = self.mirror.spark
        version = int(delta_snapshot(spark, path).version())
        return spark.read.format("delta").option("versionAsOf", version).load(path)

    def apply(self, drops: PlannedDrops) -> PruneOutcome | None:
        """Delete `drops` (from `drops()`), a commit per table, then pack the checkpoints
        table's files.

        Each MERGE deletes only rows its source names, read at the source's version: rows
        appended since are kept whatever they are.
        """
        from delta.tables import DeltaTable

        spark = self.mirror.spark
        started = time.monotonic()
        before = self.table_files()
        # Said before the work: commits wait for it, 15 to 20 s per million rows here (a whole
        # table that grew before pruning existed is read once).
        log.info("pruning the checkpoints (%d files) and failover logs of %d vbuckets; commits "
                 "wait until it is done", before, len(self.vbuckets))
        try:
            with delta_write_confs(spark, user_metadata='{"replicator_metadata_pruning":1}'):
                dropped = _delete(spark, self.path, drops.checkpoints,
                                  ("vbucket", "table_version"))
                DeltaTable.forPath(spark, self.path).optimize().executeCompaction()
                failover_dropped = _delete(spark, self.mirror.layout.failover_logs,
                                           drops.failover_logs, ("vbucket", "updated_at"))
        except Exception as exc:
            if not is_concurrent_modification(exc):
                raise
            log.info("pruning the replicator's tables gave way to a concurrent commit: %s",
                     engine_error_summary(exc))
            return None
        after = self.table_files()
        self._files_after_last = after
        self.prunes += 1
        outcome = PruneOutcome(
            before, after, dropped, time.monotonic() - started, failover_dropped
        )
        log.info("pruned %d checkpoint rows and %d failover log rows of %d vbuckets: "
                 "checkpoints %d -> %d files in %.1fs", dropped, failover_dropped,
                 len(self.vbuckets), before, after, outcome.seconds)
        return outcome


@dataclass(frozen=True, slots=True)
class PlannedDrops:
    """The rows a prune deletes: keys of the checkpoints and of the failover logs tables."""

    checkpoints: DataFrame
    failover_logs: DataFrame


def _delete(spark: SparkSession, path: str, drops: DataFrame, keys: tuple[str, ...]) -> int:
    """Delete the rows of the table at `path` whose `keys` match a row of `drops`."""
    from delta.tables import DeltaTable

    condition = " AND ".join(f"t.{key} = d.{key}" for key in keys)
    summary = (
        DeltaTable.forPath(spark, path).alias("t").merge(drops.alias("d"), condition)
        .whenMatchedDelete().execute().first()
    )
    return int(summary["num_deleted_rows"]) if summary is not None else 0
