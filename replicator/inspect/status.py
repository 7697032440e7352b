"""`replicator status`: where a mirror stands, per vbucket, and how far behind the source it is.

Reads the mirror only: it never repairs, claims or writes anything, and needs no password unless
`--source` asks for the lag. Positions are what recovery would resume from: the newest
checkpoint of each vbucket, overlaid with data commits whose checkpoint rows were never
written (a process that died between the two commits).

The vbuckets reported are the source's with `--source`; without it, every vbucket the mirror's
replicators took on: claimed in the owners table (live or expired claims) or streamed (the
failover logs table keeps them after a claim is released), and any that committed. Those that
never committed are shown and counted, never left out.

>>> status = read_status(config, spark=spark)  # doctest: +SKIP
>>> print(status.render())  # doctest: +SKIP
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from replicator.config import ReplicatorConfig
from replicator.errors import ConfigError, NotAMirrorError, ReplicatorError
from replicator.model.positions import VbucketPosition
from replicator.pipeline.health import HealthThresholds, HealthVerdict, judge

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from replicator.delta.checkpoints import Checkpoint
    from replicator.delta.ownership import OwnerRecord
    from replicator.delta.reader import HistoryEntry, TableReader
    from replicator.delta.schema import MirrorConfig
    from replicator.delta.table import CommitRecord, MirrorTable

FOLD_ABOVE = 64
"""With more vbuckets than this, runs of vbuckets in identical state print as one range."""

ROLLBACK_KINDS = ("rollback", "resync")
"""Checkpoint kinds that record a rollback (rewind to a boundary, or a full resync from 0)."""


# --- opening a mirror without writing -----------------------------------------------------


def check_mirror(reader: TableReader, target: str, *, bucket: str | None = None) -> MirrorConfig:
    """The config of the existing mirror at `target`, read through `reader`; writes nothing.

    NotAMirrorError when nothing is there, when it holds something other than a replicator
    mirror, or (given `bucket`) when it mirrors another bucket.
    """
    from replicator.delta.schema import (
        BUCKET_PROPERTY,
        FORMAT_PROPERTY,
        FORMAT_VERSION,
        MirrorConfig,
        MirrorLayout,
    )
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
    mirrored = properties.get(BUCKET_PROPERTY)
    layout_format = properties.get(FORMAT_PROPERTY)
    if mirrored is None or layout_format is None:
        raise NotAMirrorError(
            f"{target} is a Delta table but not a replicator mirror (no {BUCKET_PROPERTY} / "
            f"{FORMAT_PROPERTY} properties)"
        )
    if layout_format != str(FORMAT_VERSION):
        raise NotAMirrorError(
            f"{target} is a mirror in format {layout_format}; this replicator reads format "
            f"{FORMAT_VERSION}"
        )
    if bucket is not None and mirrored != bucket:
        raise NotAMirrorError(
            f"{target} is the mirror of bucket {mirrored!r}, not of {bucket!r}"
        )
    return MirrorConfig(mirrored)


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
    from replicator.delta.checkpoints import Checkpoint

    return [
        Checkpoint(
            owner_id=record.metadata.owner_id,
            batch_id=record.metadata.batch_id,
            table_version=record.version,
            kind=record.metadata.kind,
            position=position,
            committed_at=record.timestamp,
        )
        for record in sorted(commits, key=lambda r: r.version)
        if record.version > floors.get(record.metadata.owner_id, -1)
        for position in record.metadata.positions.values()
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


# --- the status values --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RollbackRecord:
    """One rollback of a vbucket as the mirror recorded it.

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


@dataclass(frozen=True, slots=True)
class VbucketStatus:
    """Where one vbucket of the mirror stands (and, with a source, how far behind it is)."""

    vbucket: int
    position: VbucketPosition | None
    committed_at: datetime | None = None
    table_version: int | None = None
    owner_id: str | None = None
    rollbacks: int = 0
    last_rollback: RollbackRecord | None = None
    source_high_seqno: int | None = None

    @property
    def seqno(self) -> int:
        """The committed seqno (0 when nothing is committed)."""
        return 0 if self.position is None else self.position.seqno

    @property
    def mirrored(self) -> bool:
        return self.position is not None

    @property
    def lag(self) -> int | None:
        """Seqnos the mirror is behind the source's high seqno; negative when ahead of it."""
        if self.source_high_seqno is None:
            return None
        return self.source_high_seqno - self.seqno

    def cells(self, *, with_source: bool, with_owner: bool = False) -> tuple[str, ...]:
        """The table cells after the vbucket column (the owner's last, when asked for)."""
        cells: tuple[str, ...] = (
            str(self.seqno) if self.mirrored else "-",
            str(self.position.vbucket_uuid) if self.position is not None else "-",
            format_time(self.committed_at) if self.committed_at is not None else "-",
            str(self.rollbacks),
            self.last_rollback.describe() if self.last_rollback is not None else "-",
        )
        if with_source:
            cells += (
                str(self.source_high_seqno) if self.source_high_seqno is not None else "-",
                str(self.lag) if self.lag is not None else "-",
            )
        if with_owner:
            cells += (self.owner_id or "-",)
        return cells

    def to_json(self) -> dict[str, Any]:
        return {
            "vbucket": self.vbucket,
            "seqno": self.seqno,
            "mirrored": self.mirrored,
            "vbucket_uuid": self.position.vbucket_uuid if self.position is not None else None,
            "last_commit": self.committed_at.isoformat() if self.committed_at else None,
            "table_version": self.table_version,
            "owner": self.owner_id,
            "rollbacks": self.rollbacks,
            "last_rollback": self.last_rollback.to_json() if self.last_rollback else None,
            "source_high_seqno": self.source_high_seqno,
            "lag": self.lag,
        }


@dataclass(frozen=True, slots=True)
class OwnerStatus:
    """A claim in the owners table, and whether its lease is current."""

    owner_id: str
    vbuckets: int
    host: str
    pid: int
    heartbeat_at: datetime
    live: bool
    claimed: frozenset[int] = frozenset()

    def to_json(self) -> dict[str, Any]:
        return {
            "owner": self.owner_id,
            "vbuckets": self.vbuckets,
            "host": self.host,
            "pid": self.pid,
            "heartbeat_at": self.heartbeat_at.isoformat(),
            "live": self.live,
        }


@dataclass(frozen=True, slots=True)
class MirrorStatus:
    """The whole answer of `replicator status`."""

    target: str
    bucket: str
    table_version: int
    checked_at: datetime
    vbuckets: tuple[VbucketStatus, ...]
    owners: tuple[OwnerStatus, ...] = ()
    with_source: bool = False
    thresholds: HealthThresholds = field(default_factory=HealthThresholds)

    @property
    def health(self) -> HealthVerdict:
        """ok, lagging, stalled or fenced, and why (replicator.pipeline.health)."""
        return judge(self, self.thresholds)

    @property
    def vbuckets_mirrored(self) -> int:
        return sum(1 for vb in self.vbuckets if vb.mirrored)

    @property
    def never_committed(self) -> int:
        """Vbuckets reported that have no committed position (not even seqno 0)."""
        return len(self.vbuckets) - self.vbuckets_mirrored

    @property
    def seqnos_committed(self) -> int:
        return sum(vb.seqno for vb in self.vbuckets)

    @property
    def last_commit(self) -> datetime | None:
        times = [vb.committed_at for vb in self.vbuckets if vb.committed_at is not None]
        return max(times) if times else None

    @property
    def rollbacks(self) -> int:
        return sum(vb.rollbacks for vb in self.vbuckets)

    @property
    def sharded(self) -> bool:
        """More than one owner committed the vbuckets shown (replicators ran as shards)."""
        return len({vb.owner_id for vb in self.vbuckets if vb.owner_id is not None}) > 1

    @property
    def owners_live(self) -> int:
        return sum(1 for owner in self.owners if owner.live)

    @property
    def lag(self) -> int | None:
        """Total seqnos behind the source (vbuckets ahead of it count 0), None without one."""
        if not self.with_source:
            return None
        return sum(max(vb.lag or 0, 0) for vb in self.vbuckets)

    @property
    def vbuckets_behind(self) -> int:
        return sum(1 for vb in self.vbuckets if (vb.lag or 0) > 0)

    def summary(self) -> str:
        """The first line: the mirror in numbers."""
        last = self.last_commit
        never = f" ({self.never_committed} never committed)" if self.never_committed else ""
        text = (
            f"mirror of bucket {self.bucket!r} at {self.target} (table version "
            f"{self.table_version}): {self.vbuckets_mirrored} of {len(self.vbuckets)} vbuckets "
            f"mirrored{never}, {self.seqnos_committed} seqnos committed, last commit "
            f"{format_time(last) if last is not None else 'never'}, rollbacks {self.rollbacks}, "
            f"owners live {self.owners_live}"
        )
        if self.with_source:
            text += f", lag {self.lag} seqnos in {self.vbuckets_behind} vbuckets"
        return text

    def render(self, *, fold: bool | None = None) -> str:
        """Summary line, live owners, then an aligned table of vbuckets.

        `fold` merges consecutive vbuckets in identical state into one row (`0-511`); by
        default only when there are more than FOLD_ABOVE vbuckets, but runs of vbuckets that
        never committed always fold (`fold=False` shows every vbucket on its own row). A
        sharded mirror gets an `owner` column: which replicator committed each vbucket last.
        """
        lines = [self.summary(), self.health.describe()]
        for owner in self.owners:
            if owner.live:
                lines.append(
                    f"  owner {owner.owner_id} ({owner.vbuckets} vbuckets) on {owner.host} pid "
                    f"{owner.pid}, last heartbeat {format_time(owner.heartbeat_at)}"
                )
        header: tuple[str, ...] = (
            "vbucket", "seqno", "vbucket uuid", "last commit", "rollbacks", "last rollback"
        )
        if self.with_source:
            header += ("source high", "lag")
        with_owner = self.sharded
        if with_owner:
            header += ("owner",)
        rows = [
            (label, *cells)
            for label, cells in _rows(
                self.vbuckets,
                with_source=self.with_source,
                with_owner=with_owner,
                fold=len(self.vbuckets) > FOLD_ABOVE if fold is None else fold,
                fold_never_committed=fold is not False,
            )
        ]
        if rows:
            lines.append("")
            lines.extend(align_columns([header, *rows], numeric=_numeric_columns(header)))
        else:
            lines.append("no vbucket has committed anything yet")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        last = self.last_commit
        return {
            "target": self.target,
            "bucket": self.bucket,
            "table_version": self.table_version,
            "checked_at": self.checked_at.isoformat(),
            "health": self.health.to_json(),
            "summary": {
                "vbuckets": len(self.vbuckets),
                "vbuckets_mirrored": self.vbuckets_mirrored,
                "never_committed": self.never_committed,
                "seqnos_committed": self.seqnos_committed,
                "last_commit": last.isoformat() if last is not None else None,
                "rollbacks": self.rollbacks,
                "owners_live": self.owners_live,
                "lag": self.lag,
                "vbuckets_behind": self.vbuckets_behind if self.with_source else None,
            },
            "vbuckets": [vb.to_json() for vb in self.vbuckets],
            "owners": [owner.to_json() for owner in self.owners],
        }

    def to_json_text(self) -> str:
        return json.dumps(self.to_json(), indent=2)


def format_time(moment: datetime) -> str:
    """UTC, to the second: `2026-01-31 12:00:05Z`."""
    from datetime import UTC

    utc = moment.astimezone(UTC) if moment.tzinfo is not None else moment
    return utc.strftime("%Y-%m-%d %H:%M:%SZ")


def align_columns(rows: Sequence[Sequence[str]], *, numeric: Iterable[int] = ()) -> list[str]:
    """Rows of cells as lines with aligned columns; `numeric` columns are right-aligned."""
    right = set(numeric)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


def _numeric_columns(header: Sequence[str]) -> list[int]:
    numeric = {"vbucket", "seqno", "vbucket uuid", "rollbacks", "source high", "lag"}
    return [i for i, name in enumerate(header) if name in numeric]


def _rows(
    vbuckets: Sequence[VbucketStatus],
    *,
    with_source: bool,
    fold: bool,
    with_owner: bool = False,
    fold_never_committed: bool = False,
) -> list[tuple[str, tuple[str, ...]]]:
    rows: list[tuple[str, tuple[str, ...]]] = []
    run_start = run_end = -1
    run_cells: tuple[str, ...] | None = None
    for vb in sorted(vbuckets, key=lambda v: v.vbucket):
        cells = vb.cells(with_source=with_source, with_owner=with_owner)
        folds = fold or (fold_never_committed and not vb.mirrored)
        if folds and cells == run_cells and vb.vbucket == run_end + 1:
            run_end = vb.vbucket
            continue
        if run_cells is not None:
            rows.append((_range_label(run_start, run_end), run_cells))
        run_start = run_end = vb.vbucket
        run_cells = cells
    if run_cells is not None:
        rows.append((_range_label(run_start, run_end), run_cells))
    return rows


def _range_label(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}-{last}"


# --- reading ------------------------------------------------------------------------------


def rollback_history(
    rollback_rows: Iterable[Checkpoint],
    checkpoints: Mapping[int, Checkpoint],
    entries: Iterable[HistoryEntry],
) -> dict[int, tuple[int, RollbackRecord]]:
    """vbucket -> (number of rollbacks, the newest one), from checkpoint rows and commits (pure).

    `rollback_rows` are the checkpoint rows of a rollback kind; `checkpoints` the committed
    boundaries (a newest boundary of a rollback kind without a checkpoint row yet counts too);
    `entries` the data table's history, which holds each rollback's reason and origin.
    """
    seen: dict[int, dict[int, RollbackRecord]] = {}
    for checkpoint in [*rollback_rows, *checkpoints.values()]:
        if checkpoint.kind in ROLLBACK_KINDS:
            seen.setdefault(checkpoint.vbucket, {}).setdefault(
                checkpoint.table_version,
                RollbackRecord(
                    checkpoint.kind, checkpoint.committed_at, checkpoint.table_version,
                    checkpoint.seqno,
                ),
            )
    newest = {vb: records[max(records)] for vb, records in seen.items()}
    wanted = {record.table_version for record in newest.values()}
    details: dict[int, Mapping[str, Any]] = {}
    for entry in entries:
        if entry.version in wanted:
            metadata = entry.commit_metadata
            if metadata is not None:
                details[entry.version] = metadata.details
    result = {}
    for vbucket, record in newest.items():
        facts = details.get(record.table_version, {})
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


def owner_statuses(records: Iterable[OwnerRecord], now: datetime) -> tuple[OwnerStatus, ...]:
    """The claims `records`, live or stale at `now`, by owner id (pure)."""
    return tuple(
        OwnerStatus(
            owner_id=record.owner_id,
            vbuckets=len(record.vbuckets),
            host=record.host,
            pid=record.pid,
            heartbeat_at=record.heartbeat_at,
            live=record.is_live(now),
            claimed=record.vbuckets,
        )
        for record in sorted(records, key=lambda r: r.owner_id)
    )


@dataclass(frozen=True, slots=True)
class MirrorReadout:
    """What status reads of a mirror, whichever engine read it.

    `checkpoints` are the committed boundaries (checkpoint rows overlaid with data commits that
    have none yet); `streamed` the vbuckets with a stored failover log: a replicator opened
    their streams (kept when a claim is released, which the owners table forgets).
    """

    bucket: str
    table_version: int
    checkpoints: Mapping[int, Checkpoint]
    rollbacks: Mapping[int, tuple[int, RollbackRecord]]
    owners: tuple[OwnerRecord, ...]
    streamed: frozenset[int]


def read_mirror(reader: TableReader, target: str, *, bucket: str | None = None) -> MirrorReadout:
    """Read what status needs of the mirror at `target` through `reader` (writes nothing)."""
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


@dataclass(frozen=True, slots=True)
class SourceSeqnos:
    """What the producer says: its bucket, vbucket count and each active vbucket's high seqno."""

    bucket: str
    num_vbuckets: int
    high_seqnos: Mapping[int, int]


def read_source_seqnos(config: ReplicatorConfig) -> SourceSeqnos:
    """Connect to `config.source` and read every vbucket's high seqno."""
    from replicator.pipeline.runner import connect_source

    client = connect_source(config)
    try:
        return SourceSeqnos(client.bucket, client.cluster_map.num_vbuckets, client.high_seqnos())
    finally:
        client.close()


def selected_vbuckets(
    config: ReplicatorConfig, known: Iterable[int], num_vbuckets: int | None
) -> tuple[int, ...] | None:
    """The vbuckets `--vbuckets` asks for, None for all of them."""
    selection = config.vbuckets
    if selection.shard is None and not selection.ranges:
        return None
    if num_vbuckets is None:
        if selection.shard is not None:
            raise ConfigError(
                f"--vbuckets {selection} is a shard: give --source too, so the bucket's vbucket "
                "count is known"
            )
        num_vbuckets = max([*known, *(high for _, high in selection.ranges)]) + 1
    return selection.resolve(num_vbuckets)


def build_status(
    config: ReplicatorConfig,
    *,
    bucket: str,
    table_version: int,
    checked_at: datetime,
    checkpoints: Mapping[int, Checkpoint],
    rollbacks: Mapping[int, tuple[int, RollbackRecord]],
    owners: Sequence[OwnerRecord],
    streamed: Iterable[int] = (),
    source: SourceSeqnos | None = None,
    thresholds: HealthThresholds | None = None,
) -> MirrorStatus:
    """The status of a mirror from what was read of it (pure).

    Reports the source's vbuckets when there is one; otherwise every vbucket claimed in
    `owners`, `streamed` (see streamed_vbuckets) or committed. Either way `--vbuckets` narrows
    it, and a vbucket without a checkpoint is reported as never committed.
    """
    known = set(checkpoints) | set(rollbacks)
    if source is not None:
        known |= set(range(source.num_vbuckets))
    else:
        known |= set(streamed)
        for record in owners:
            known |= record.vbuckets
    wanted = selected_vbuckets(config, known, source.num_vbuckets if source else None)
    if wanted is not None:
        known &= set(wanted)
    vbuckets = []
    for vbucket in sorted(known):
        checkpoint = checkpoints.get(vbucket)
        count, last = rollbacks.get(vbucket, (0, None))
        vbuckets.append(
            VbucketStatus(
                vbucket=vbucket,
                position=checkpoint.position if checkpoint is not None else None,
                committed_at=checkpoint.committed_at if checkpoint is not None else None,
                table_version=checkpoint.table_version if checkpoint is not None else None,
                owner_id=checkpoint.owner_id if checkpoint is not None else None,
                rollbacks=count,
                last_rollback=last,
                source_high_seqno=source.high_seqnos.get(vbucket) if source else None,
            )
        )
    return MirrorStatus(
        target=config.target,
        bucket=bucket,
        table_version=table_version,
        checked_at=checked_at,
        vbuckets=tuple(vbuckets),
        owners=owner_statuses(owners, checked_at),
        with_source=source is not None,
        thresholds=thresholds or HealthThresholds(),
    )


def read_status(
    config: ReplicatorConfig,
    *,
    spark: SparkSession | None = None,
    engine: str | None = None,
    now: datetime | None = None,
    thresholds: HealthThresholds | None = None,
) -> MirrorStatus:
    """Read the mirror at `config.target` (and, with `config.source`, the producer's seqnos).

    `engine` is delta-rs (the default: no JVM) or spark (the default when `spark` is given).
    """
    from replicator.delta.reader import table_reader
    from replicator.delta.table import now_utc

    if not config.target:
        raise ConfigError("status needs a target: pass --target PATH")
    source = read_source_seqnos(config) if config.source else None
    reader = table_reader(engine, spark)
    try:
        readout = read_mirror(reader, config.target, bucket=source.bucket if source else None)
    except ReplicatorError:
        raise
    except Exception as exc:
        from replicator.delta.table import engine_error_summary

        raise ReplicatorError(
            f"cannot read the mirror at {config.target}: {engine_error_summary(exc)}"
        ) from None
    return build_status(
        config,
        bucket=readout.bucket,
        table_version=readout.table_version,
        checked_at=now or now_utc(),
        checkpoints=readout.checkpoints,
        rollbacks=readout.rollbacks,
        owners=readout.owners,
        streamed=readout.streamed if source is None else (),
        source=source,
        thresholds=thresholds,
    )
