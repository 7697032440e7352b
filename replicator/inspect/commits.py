"""What each commit of the data table did: the rollback it carried out, its rows and its source
progress, in numbers.

Read from the Delta history alone, each replicator commit's `CommitMetadata` included: no data
file is read, so a commit stays accountable for as long as its log entry is kept.

>>> for record in rollbacks(None, "/data/mirror"):  # doctest: +SKIP
...     print(record.explain())
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from replicator.delta.commit_metadata import RESYNC, ROLLBACK
from replicator.inspect.formatting import format_time
from replicator.inspect.mirror_history import read_history
from replicator.model.positions import FailoverLog

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from replicator.delta.reader import HistoryEntry


@dataclass(frozen=True, slots=True)
class RollbackRecord:
    """One rollback the mirror went through, from the commit that carried it out.

    `kind` is `rollback` (the vbucket's rows rewound to the committed boundary `to_seqno`,
    restored from table version `from_table_version`) or `resync` (streamed again from 0,
    replacing all its rows). `from_seqno` is where the vbucket stood before; `failover_log` the
    producer's log after the failover (None for a resync, which records none).
    """

    table_version: int
    committed_at: datetime
    kind: str
    vbucket: int
    to_seqno: int
    from_seqno: int | None = None
    rollback_seqno: int | None = None
    from_table_version: int | None = None
    reason: str | None = None
    failover_log: FailoverLog | None = None
    owner_id: str | None = None

    @property
    def discarded_seqnos(self) -> int | None:
        """How many seqnos of the vbucket's history the rollback threw away."""
        if self.from_seqno is None:
            return None
        return max(0, self.from_seqno - self.to_seqno)

    def explain(self) -> str:
        """One sentence an auditor can read."""
        when = format_time(self.committed_at)
        if self.kind == RESYNC:
            text = (f"version {self.table_version} ({when}): vbucket {self.vbucket} was streamed "
                    f"again from 0 and all its rows replaced, reaching seqno {self.to_seqno}")
        else:
            start = f"from seqno {self.from_seqno} " if self.from_seqno is not None else ""
            text = (f"version {self.table_version} ({when}): vbucket {self.vbucket} was rewound "
                    f"{start}to seqno {self.to_seqno}")
            if self.rollback_seqno is not None:
                text += f" (the producer asked for a rollback to {self.rollback_seqno})"
            if self.from_table_version is not None:
                text += f", its rows restored from table version {self.from_table_version}"
            if self.failover_log is not None:
                newest = self.failover_log.newest
                text += (f"; the producer's history branched at seqno {newest.seqno} "
                         f"(new vbucket uuid {newest.vbucket_uuid:#x})")
        if self.reason:
            text += f". Reason: {self.reason}"
        return text

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "table_version": self.table_version,
            "committed_at": self.committed_at.isoformat(),
            "kind": self.kind,
            "vbucket": self.vbucket,
            "from_seqno": self.from_seqno,
            "to_seqno": self.to_seqno,
            "rollback_seqno": self.rollback_seqno,
            "from_table_version": self.from_table_version,
            "reason": self.reason,
            "failover_log": self.failover_log.as_pairs() if self.failover_log else None,
            "owner": self.owner_id,
        }


@dataclass(frozen=True, slots=True)
class CommitActivity:
    """One commit of the data table, as numbers: what it did to rows and how far the source moved.

    `source_changes` is how many seqnos the commit's vbuckets advanced past their previous
    committed boundary (0 for a rollback, which goes back); None for a commit the replicator
    did not make.
    """

    table_version: int
    committed_at: datetime
    operation: str
    kind: str | None
    vbuckets: tuple[int, ...]
    rows_inserted: int
    rows_updated: int
    rows_deleted: int
    source_changes: int | None


def rollbacks(
    spark: SparkSession | None, target: str, *, engine: str | None = None
) -> list[RollbackRecord]:
    """Every rollback and full resync still in the table history, oldest first.

    Read with delta-rs unless a SparkSession is given or `engine` is "spark".

    >>> for record in rollbacks(spark, "/data/mirror"):  # doctest: +SKIP
    ...     print(record.explain())
    """
    return [
        record
        for entry in _history_of(spark, target, engine)
        for record in rollback_records(entry)
    ]


def commit_activity(
    spark: SparkSession | None, target: str, *, engine: str | None = None
) -> list[CommitActivity]:
    """Per commit: rows inserted, updated, deleted and source seqnos applied, oldest first.

    Read with delta-rs unless a SparkSession is given or `engine` is "spark".

    >>> import pandas as pd  # doctest: +SKIP
    >>> activity = pd.DataFrame(commit_activity(None, "/data/mirror"))  # doctest: +SKIP
    >>> activity.set_index("committed_at")["source_changes"].plot()  # doctest: +SKIP
    """
    return commit_activities(_history_of(spark, target, engine))


def _history_of(spark: SparkSession | None, target: str, engine: str | None) -> list[HistoryEntry]:
    from replicator.delta.reader import table_reader

    return read_history(table_reader(engine, spark), target)


def rollback_records(entry: HistoryEntry) -> list[RollbackRecord]:
    """The rollbacks a history entry carried out, by vbucket; none for any other commit (pure).

    A failover rolls many vbuckets back in one commit: each gets its record.
    """
    header = entry.commit_header
    if header is None or header.kind not in (ROLLBACK, RESYNC):
        return []
    metadata = entry.commit_metadata
    if metadata is None:
        return []
    records = []
    for vbucket, details in sorted(metadata.vbucket_details().items()):
        position = metadata.positions.get(vbucket)
        to_seqno = details.get("to_seqno", position.seqno if position is not None else 0)
        pairs = details.get("failover_log")
        records.append(RollbackRecord(
            table_version=entry.version,
            committed_at=entry.timestamp,
            kind=metadata.kind,
            vbucket=vbucket,
            to_seqno=int(to_seqno),
            from_seqno=_optional_int(details.get("from_seqno")),
            rollback_seqno=_optional_int(details.get("rollback_seqno")),
            from_table_version=_optional_int(details.get("from_table_version")),
            reason=str(details["reason"]) if details.get("reason") is not None else None,
            failover_log=FailoverLog.of((int(u), int(s)) for u, s in pairs) if pairs else None,
            owner_id=metadata.owner_id,
        ))  # fmt: skip
    return records


def commit_activities(entries: Sequence[HistoryEntry]) -> list[CommitActivity]:
    """Row counts and source progress of every commit, oldest first (pure)."""
    committed: dict[int, int] = {}
    activities = []
    for entry in sorted(entries, key=lambda e: e.version):
        metadata = entry.commit_metadata
        inserted, updated, deleted = _row_counts(entry)
        source_changes: int | None = None
        vbuckets: tuple[int, ...] = ()
        if metadata is not None:
            vbuckets = tuple(sorted(metadata.positions))
            source_changes = 0
            for vbucket, position in metadata.positions.items():
                before = 0 if metadata.kind == RESYNC else committed.get(vbucket, 0)
                if metadata.kind != ROLLBACK:
                    source_changes += max(0, position.seqno - before)
                committed[vbucket] = position.seqno
        activities.append(
            CommitActivity(
                table_version=entry.version,
                committed_at=entry.timestamp,
                operation=entry.operation,
                kind=metadata.kind if metadata is not None else None,
                vbuckets=vbuckets,
                rows_inserted=inserted,
                rows_updated=updated,
                rows_deleted=deleted,
                source_changes=source_changes,
            )
        )
    return activities


def _row_counts(entry: HistoryEntry) -> tuple[int, int, int]:
    metrics = entry.metrics

    def metric(name: str) -> int:
        return int(metrics.get(name) or 0)

    if entry.operation == "MERGE":
        return (metric("numTargetRowsInserted"), metric("numTargetRowsUpdated"),
                metric("numTargetRowsDeleted"))
    if entry.operation in ("WRITE", "CREATE TABLE AS SELECT", "REPLACE TABLE AS SELECT"):
        return metric("numOutputRows"), 0, metric("numDeletedRows")
    if entry.operation in ("DELETE", "UPDATE"):
        return 0, metric("numUpdatedRows"), metric("numDeletedRows")
    return 0, 0, 0


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)
