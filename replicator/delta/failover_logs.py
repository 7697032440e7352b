"""The failover logs table: each vbucket's whole failover log, as the producer last sent it.

Saved after every successful stream request, and for a rollback from the log its commit
carries (`carried_failover_logs`: with the checkpoints of that commit, or by recovery's repair),
so a restart resumes with the real log: a placeholder log would turn every partial rollback
into a full one.

Saving appends one row per vbucket and loading takes each vbucket's newest row (by
`updated_at`). A blind append never conflicts with another shard's save and costs a fraction
of the MERGE it replaced (which was 1.2-2.3 s of each rollback: README, Performance). Tables
written by earlier versions, one row per vbucket, read the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING

from replicator.delta.commit_metadata import ROLLBACK
from replicator.delta.conflicts import retry_on_conflict
from replicator.delta.schema import FAILOVER_LOG_SCHEMA, in_list
from replicator.delta.table import (
    SESSION_WRITE_LOCK,
    CommitRecord,
    MirrorTable,
    now_utc,
    only_created,
)
from replicator.model.positions import FailoverLog

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class FailoverLogsTable:
    """Reads and replaces rows of the failover logs table at `path`."""

    def __init__(self, spark: SparkSession, path: str) -> None:
        self.spark = spark
        self.path = path

    @classmethod
    def of(cls, mirror: MirrorTable) -> FailoverLogsTable:
        """The failover logs table of a mirror."""
        return cls(mirror.spark, mirror.layout.failover_logs)

    def save(self, logs: Mapping[int, FailoverLog], *, at: datetime | None = None) -> None:
        """Store the logs of the given vbuckets: one append, newer than every earlier row."""
        updated_at = at or now_utc()
        self.save_timed({vbucket: (log, updated_at) for vbucket, log in logs.items()})

    def save_timed(self, logs: Mapping[int, tuple[FailoverLog, datetime]]) -> None:
        """Store each vbucket's log as of its own time, in one append: a row older than one
        already stored for its vbucket stays in the table but is not what `load` answers."""
        if not logs:
            return
        rows = [
            (
                vbucket,
                [(Decimal(entry.vbucket_uuid), entry.seqno) for entry in log.entries],
                updated_at,
            )
            for vbucket, (log, updated_at) in sorted(logs.items())
        ]
        source = self.spark.createDataFrame(rows, FAILOVER_LOG_SCHEMA).coalesce(1)  # one file

        def append() -> None:
            with SESSION_WRITE_LOCK:
                source.write.format("delta").mode("append").save(self.path)

        # Appends do not conflict with each other; a concurrent metadata change still might.
        retry_on_conflict(append, what="saving failover logs")

    def load(self, vbuckets: Iterable[int] | None = None) -> dict[int, FailoverLog]:
        """The stored failover log of every vbucket that has one (or of the given ones)."""
        from pyspark.sql import functions as F

        if only_created(self.spark, self.path):
            return {}
        frame = self.spark.read.format("delta").load(self.path)
        if vbuckets is not None:
            wanted = sorted(set(vbuckets))
            if not wanted:
                return {}
            frame = frame.where(in_list("vbucket", wanted))
        newest = frame.groupBy("vbucket").agg(
            F.max_by("entries", "updated_at").alias("entries")
        )
        logs = {}
        for row in newest.collect():
            pairs = [(int(entry["vbucket_uuid"]), int(entry["seqno"])) for entry in row["entries"]]
            logs[int(row["vbucket"])] = FailoverLog.of(pairs)
        return logs


def carried_failover_logs(
    commits: Iterable[CommitRecord],
) -> dict[int, tuple[FailoverLog, datetime]]:
    """The failover logs rollback `commits` carry, each as of its commit's time (pure).

    Timed by the commit, not by when they are stored: a stream request's save made after the
    rollback holds the newer log and must stay the answer. The newest commit of a vbucket wins.
    """
    logs: dict[int, tuple[FailoverLog, datetime]] = {}
    for record in sorted(commits, key=lambda r: r.version):
        if record.metadata.kind != ROLLBACK:
            continue
        for vbucket, facts in record.metadata.vbucket_details().items():
            pairs = facts.get("failover_log")
            if pairs and vbucket in record.metadata.positions:
                log = FailoverLog.of((int(u), int(s)) for u, s in pairs)
                logs[vbucket] = (log, record.timestamp)
    return logs
