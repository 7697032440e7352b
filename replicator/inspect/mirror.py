"""Reading an existing mirror without writing it: the read side's one way in.

`status`, `verify`, `audit` and the collection views open a mirror here: `check_mirror` refuses a
path that is not a replicator mirror (the same checks as a writer's, `delta.schema`), and
`read_mirror` reads where each vbucket stands, the rollbacks it went through and who claims it.
Positions are what recovery would resume from: the newest checkpoint of each vbucket, overlaid
with data commits whose checkpoint rows were never written (a process that died between the two
commits). Nothing here repairs, claims or writes anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from replicator.errors import ConfigError, NotAMirrorError, ReplicatorError
from replicator.inspect.formatting import format_time

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from replicator.delta.checkpoints import Checkpoint
    from replicator.delta.ownership import OwnerRecord
    from replicator.delta.reader import HistoryEntry, TableReader
    from replicator.delta.schema import MirrorConfig
    from replicator.delta.table import CommitRecord, MirrorTable

ROLLBACK_KINDS = ("rollback", "resync")
"""Checkpoint kinds that record a rollback (rewind to a boundary, or a full resync from 0)."""


@dataclass(frozen=True, slots=True)
class LastRollback:
    """A vbucket's latest rollback, as `status` shows it (the audit's RollbackRecord has it all).

    `kind` is `rollback` (rewound to the committed boundary `to_seqno`) or `resync` (streamed
    again from 0). `from_seqno` and `reason` come from the data commit's metadata, None when
    that commit's log entry was already cleaned up.
    """

    kind: str
    at: datetime
    table_version: int
    to_seqno: int
    from_seqno: int | None = None
    reason: str | None = None

    def describe(self) -> str:
        moved = f"{self.from_seqno}->{self.to_seqno}" if self.from_seqno is not None else (
            f"to {self.to_seqno}"
        )
        return f"{self.kind} {moved} at {format_time(self.at)}"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "at": self.at.isoformat(),
            "table_version": self.table_version,
            "from_seqno": self.from_seqno,
            "to_seqno": self.to_seqno,
            "reason": self.reason,
        }


def check_mirror(reader: TableReader, target: str, *, bucket: str | None = None) -> MirrorConfig:
    """The config of the existing mirror at `target`, read through `reader`; writes nothing.

    NotAMirrorError when nothing is there, when it holds something other than a replicator
    mirror, or (given `bucket`) when it mirrors another bucket.
    """
    from replicator.delta.schema import MirrorConfig, MirrorLayout, check_mirror_properties
    from replicator.delta.table import engine_error_summary

    layout = MirrorLayout(target)
    try:
        if not reader.is_table(layout.data):
            if reader.path_exists(layout.data):
                raise NotAMirrorError(
                    f"{target} is not a replicator mirror: it holds no Delta table"
                )
            raise NotAMirrorError(
                f"no mirror at {target}: the path does not exist (run `replicator run` first)"
            )
        properties = reader.properties(layout.data)
    except ReplicatorError:
        raise
    except Exception as exc:
        raise ConfigError(f"cannot read {target}: {engine_error_summary(exc)}") from None
    return MirrorConfig(check_mirror_properties(target, properties, bucket=bucket))


def open_mirror(spark: SparkSession, target: str, *, bucket: str | None = None) -> MirrorTable:
    """Open the existing mirror at `target` with Spark; never creates anything (check_mirror)."""
    from replicator.delta.reader import SparkReader
    from replicator.delta.schema import MirrorLayout
    from replicator.delta.table import MirrorTable

    config = check_mirror(SparkReader(spark), target, bucket=bucket)
    return MirrorTable(spark, MirrorLayout(target), config)


def pending_checkpoints(
    commits: Iterable[CommitRecord], floors: Mapping[str, int]
) -> list[Checkpoint]:
    """The checkpoints of data commits newer than their owner's floor version (pure).

    `floors` is each owner's newest version in the checkpoints table: commits above it have no
    checkpoint rows yet (their process died between the two commits), one checkpoint per
    vbucket moved.
    """
    from replicator.delta.checkpoints import checkpoints_of_commit

    return [
        checkpoint
        for record in sorted(commits, key=lambda r: r.version)
        if record.version > floors.get(record.metadata.owner_id, -1)
        for checkpoint in checkpoints_of_commit(record)
    ]


def with_pending(
    latest: Mapping[int, Checkpoint], pending: Iterable[Checkpoint]
) -> dict[int, Checkpoint]:
    """`latest` checkpoints, each replaced by a newer pending one of its vbucket (pure)."""
    merged = dict(latest)
    for checkpoint in pending:
        known = merged.get(checkpoint.vbucket)
        if known is None or known.table_version < checkpoint.table_version:
            merged[checkpoint.vbucket] = checkpoint
    return merged


def commits_above_floors(
    entries: Iterable[HistoryEntry], floors: Mapping[str, int]
) -> list[CommitRecord]:
    """The replicator's commits newer than their owner's floor version, oldest first (pure).

    Only those commits' metadata is parsed whole: a group commit's holds a position per
    vbucket, and a long history holds hundreds of them.
    """
    from replicator.delta.table import CommitRecord

    records = []
    for entry in entries:
        header = entry.commit_header
        if header is None or entry.version <= floors.get(header.owner_id, -1):
            continue
        metadata = entry.commit_metadata
        if metadata is not None:
            records.append(CommitRecord(entry.version, entry.timestamp, metadata))
    return sorted(records, key=lambda record: record.version)


def rollback_history(
    rollback_rows: Iterable[Checkpoint],
    checkpoints: Mapping[int, Checkpoint],
    entries: Iterable[HistoryEntry],
) -> dict[int, tuple[int, LastRollback]]:
    """vbucket -> (number of rollbacks, the newest one), from checkpoint rows and commits (pure).

    `rollback_rows` are the checkpoint rows of a rollback kind; `checkpoints` the committed
    boundaries (a newest boundary of a rollback kind without a checkpoint row yet counts too);
    `entries` the data table's history, which holds each rollback's reason and origin.
    """
    seen: dict[int, dict[int, LastRollback]] = {}
    for checkpoint in [*rollback_rows, *checkpoints.values()]:
        if checkpoint.kind in ROLLBACK_KINDS:
            seen.setdefault(checkpoint.vbucket, {}).setdefault(
                checkpoint.table_version,
                LastRollback(
                    checkpoint.kind, checkpoint.committed_at, checkpoint.table_version,
                    checkpoint.seqno,
                ),
            )
    newest = {vb: records[max(records)] for vb, records in seen.items()}
    wanted = {record.table_version for record in newest.values()}
    details: dict[int, dict[int, Mapping[str, Any]]] = {}
    for entry in entries:
        if entry.version in wanted:
            metadata = entry.commit_metadata
            if metadata is not None:
                details[entry.version] = metadata.vbucket_details()
    result = {}
    for vbucket, record in newest.items():
        facts = details.get(record.table_version, {}).get(vbucket, {})
        from_seqno = facts.get("from_seqno")
        reason = facts.get("reason")
        result[vbucket] = (
            len(seen[vbucket]),
            replace(
                record,
                from_seqno=int(from_seqno) if from_seqno is not None else None,
                reason=str(reason) if reason is not None else None,
            ),
        )
    return result


@dataclass(frozen=True, slots=True)
class MirrorReadout:
    """What the read side reads of a mirror, whichever engine read it.

    `checkpoints` are the committed boundaries (checkpoint rows overlaid with data commits that
    have none yet); `rollbacks` per vbucket, how many it went through and the newest one;
    `streamed` the vbuckets with a stored failover log: a replicator opened their streams (kept
    when a claim is released, which the owners table forgets).
    """

    bucket: str
    table_version: int
    checkpoints: Mapping[int, Checkpoint]
    rollbacks: Mapping[int, tuple[int, LastRollback]]
    owners: tuple[OwnerRecord, ...]
    streamed: frozenset[int]


def read_mirror(reader: TableReader, target: str, *, bucket: str | None = None) -> MirrorReadout:
    """Read the positions, rollbacks and claims of the mirror at `target` through `reader`.

    Checks first that it is a mirror (of `bucket`, when given); writes nothing.
    """
    import pyarrow.compute as pc

    from replicator.delta.checkpoints import (
        CHECKPOINT_COLUMNS,
        checkpoint_of_row,
        newest_per_vbucket,
        newest_versions_per_owner,
    )
    from replicator.delta.ownership import owner_record_of_row
    from replicator.delta.schema import OWNER_SCHEMA, MirrorLayout

    config = check_mirror(reader, target, bucket=bucket)
    layout = MirrorLayout(target)
    version = reader.version(layout.data)
    entries = reader.history(layout.data)
    latest: dict[int, Checkpoint] = {}
    floors: dict[str, int] = {}
    rollback_rows: list[Checkpoint] = []
    if reader.is_table(layout.checkpoints):
        rows = reader.read(layout.checkpoints, CHECKPOINT_COLUMNS)
        latest = newest_per_vbucket(rows)
        floors = newest_versions_per_owner(rows)
        rolled = rows.filter(pc.is_in(rows.column("kind"), _string_array(ROLLBACK_KINDS)))
        rollback_rows = [checkpoint_of_row(row) for row in rolled.to_pylist()]
    checkpoints = with_pending(
        latest, pending_checkpoints(commits_above_floors(entries, floors), floors)
    )
    owners: tuple[OwnerRecord, ...] = ()
    if reader.is_table(layout.owners):
        owner_rows = reader.read(layout.owners, OWNER_SCHEMA.fieldNames()).to_pylist()
        owners = tuple(owner_record_of_row(row) for row in owner_rows)
    streamed: frozenset[int] = frozenset()
    if reader.is_table(layout.failover_logs):
        logged = reader.read(layout.failover_logs, ["vbucket"]).column("vbucket").to_pylist()
        streamed = frozenset(int(vb) for vb in logged)
    return MirrorReadout(
        bucket=config.bucket,
        table_version=version,
        checkpoints=checkpoints,
        rollbacks=rollback_history(rollback_rows, checkpoints, entries),
        owners=owners,
        streamed=streamed,
    )


def _string_array(values: Iterable[str]) -> Any:
    import pyarrow as pa

    return pa.array(list(values), pa.string())
