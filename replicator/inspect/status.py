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
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from replicator.config import ReplicatorConfig
from replicator.errors import ConfigError, ReplicatorError
from replicator.inspect.formatting import align_columns, format_time
from replicator.inspect.health import HealthThresholds, HealthVerdict, judge
from replicator.inspect.mirror import LastRollback, read_mirror
from replicator.model.positions import VbucketPosition

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from replicator.delta.checkpoints import Checkpoint
    from replicator.delta.ownership import OwnerRecord

FOLD_ABOVE = 64
"""With more vbuckets than this, runs of vbuckets in identical state print as one range."""


# --- the status values --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VbucketStatus:
    """Where one vbucket of the mirror stands (and, with a source, how far behind it is)."""

    vbucket: int
    position: VbucketPosition | None
    committed_at: datetime | None = None
    table_version: int | None = None
    owner_id: str | None = None
    rollbacks: int = 0
    last_rollback: LastRollback | None = None
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
        """ok, lagging, stalled or fenced, and why (replicator.inspect.health)."""
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
class SourceSeqnos:
    """What the producer says: its bucket, vbucket count and each active vbucket's high seqno."""

    bucket: str
    num_vbuckets: int
    high_seqnos: Mapping[int, int]


def read_source_seqnos(config: ReplicatorConfig) -> SourceSeqnos:
    """Connect to `config.source` and read every vbucket's high seqno."""
    from replicator.source import connect_source

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
    rollbacks: Mapping[int, tuple[int, LastRollback]],
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
