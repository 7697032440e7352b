"""The failover logs table: each vbucket's whole failover log, as the producer last sent it.

Saved after every successful stream request and after a rollback, so a restart resumes with
the real log: a placeholder log would turn every partial rollback into a full one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING

from replicator.dcp.positions import FailoverLog
from replicator.delta.schema import FAILOVER_LOG_SCHEMA
from replicator.delta.table import SESSION_WRITE_LOCK, MirrorTable, now_utc, retry_on_conflict

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
        """Replace the stored logs of the given vbuckets (one MERGE, retried on conflicts).

        Other replicators save their own vbuckets' logs into the same table; a concurrent
        commit makes Delta refuse ours, and the retry reads theirs.
        """
        if not logs:
            return
        updated_at = at or now_utc()
        rows = [
            (
                vbucket,
                [(Decimal(entry.vbucket_uuid), entry.seqno) for entry in log.entries],
                updated_at,
            )
            for vbucket, log in sorted(logs.items())
        ]
        source = self.spark.createDataFrame(rows, FAILOVER_LOG_SCHEMA)
        vbuckets = ", ".join(str(vb) for vb in sorted(logs))
        condition = f"t.vbucket IN ({vbuckets}) AND t.vbucket = s.vbucket"

        def merge() -> None:
            from delta.tables import DeltaTable

            with SESSION_WRITE_LOCK:
                (
                    DeltaTable.forPath(self.spark, self.path)
                    .alias("t")
                    .merge(source.alias("s"), condition)
                    .whenMatchedUpdateAll()
                    .whenNotMatchedInsertAll()
                    .execute()
                )

        retry_on_conflict(merge, what="saving failover logs")

    def load(self, vbuckets: Iterable[int] | None = None) -> dict[int, FailoverLog]:
        """The stored failover log of every vbucket that has one (or of the given ones)."""
        from pyspark.sql import functions as F

        frame = self.spark.read.format("delta").load(self.path)
        if vbuckets is not None:
            wanted = sorted(set(vbuckets))
            if not wanted:
                return {}
            frame = frame.where(F.col("vbucket").isin(wanted))
        logs = {}
        for row in frame.select("vbucket", "entries").collect():
            pairs = [(int(entry["vbucket_uuid"]), int(entry["seqno"])) for entry in row["entries"]]
            logs[int(row["vbucket"])] = FailoverLog.of(pairs)
        return logs
