"""The data table's history, read once: its versions, which can still be read, and the rows and
change data of versions, through either engine.

Read-only: nothing here writes, claims or repairs. Every answer comes from the data table's own
Delta history (time travel, the change data feed, and the `CommitMetadata` each replicator
commit carries); `source_boundary` also reads the checkpoints table. The audit questions
(`documents`, `time_travel`, `commits`) and the collection views start from a `MirrorHistory`.
Points of history that cannot be read any more (beyond the log, vacuumed) raise
`HistoryUnavailableError`s that say which versions are still readable.

>>> history = MirrorHistory.open(table_reader("delta-rs"), "/data/mirror")  # doctest: +SKIP
>>> history.oldest, history.latest, history.change_horizon  # doctest: +SKIP
(0, 41, 12)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, TypeVar

from replicator.delta.reader import SPARK
from replicator.delta.schema import DATA_COLUMNS, MirrorLayout
from replicator.delta.table import engine_error_summary, is_unreadable_version
from replicator.errors import ConfigError, ReplicatorError
from replicator.inspect.mirror import (
    ROLLBACK_KINDS,
    check_mirror,
    commits_above_floors,
    pending_checkpoints,
)
from replicator.inspect.versions import TableVersion, parse_moment, readable_versions, version_at

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from replicator.delta.checkpoints import Checkpoint
    from replicator.delta.reader import HistoryEntry, TableReader

T = TypeVar("T")

CHANGE_COLUMNS: tuple[str, ...] = (*DATA_COLUMNS, "_change_type", "_commit_version",
                                   "_commit_timestamp")
"""Columns of `changes_between`: the data columns and Delta's change data feed columns."""


_FEED_ORDER = ("_commit_version", "vbucket", "scope", "collection", "key", "_change_type")
"""Feed rows by version, then document, a document's old image before its new one."""


class HistoryUnavailableError(ReplicatorError):
    """The asked-for point of the mirror's history cannot be read."""


class VersionOutOfRangeError(HistoryUnavailableError):
    """A version, timestamp or seqno lies outside the history the mirror has."""


class VersionVacuumedError(HistoryUnavailableError):
    """The files of that version (or its change data) were removed by VACUUM or log cleanup."""


@dataclass(frozen=True, slots=True)
class SourceBoundary:
    """Where `mirror_at_source_seqno` found a vbucket: the newest committed boundary at or below
    `requested_seqno` on the vbucket's live history, and the table version that holds it."""

    vbucket: int
    requested_seqno: int
    seqno: int
    vbucket_uuid: int
    table_version: int
    committed_at: datetime
    kind: str


class MirrorHistory:
    """The data table's history, read once: versions, vacuum horizons, replicator commits.

    Built by `MirrorHistory.open` (any engine's reader) or `MirrorHistory.read` (Spark); every
    audit question starts from one. Rows come back as Arrow tables through
    the reader (`rows`), or as Spark DataFrames (`snapshot`, `changes`) on a Spark reader.
    """

    def __init__(self, reader: TableReader, target: str, entries: Sequence[HistoryEntry]) -> None:
        self.reader = reader
        self.layout = MirrorLayout(target)
        self.entries = tuple(sorted(entries, key=lambda e: e.version))
        self.snapshot_horizon, self.change_horizon = readable_versions(self.entries)

    @classmethod
    def open(cls, reader: TableReader, target: str) -> MirrorHistory:
        """Check the mirror at `target` (NotAMirrorError otherwise) and read its history."""
        check_mirror(reader, target)
        return cls(reader, target, read_history(reader, target, checked=True))

    @classmethod
    def read(cls, spark: SparkSession, target: str) -> MirrorHistory:
        """`open` with Spark's reader."""
        from replicator.delta.reader import SparkReader

        return cls.open(SparkReader(spark), target)

    @property
    def target(self) -> str:
        return self.layout.data

    @property
    def spark(self) -> SparkSession:
        """The Spark session of a Spark reader (DataFrames need one)."""
        from replicator.delta.reader import SparkReader

        if not isinstance(self.reader, SparkReader):
            raise ConfigError(f"reading {self.target} as a DataFrame needs Spark's reader")
        return self.reader.spark

    @property
    def versions(self) -> list[TableVersion]:
        return [TableVersion(e.version, e.timestamp) for e in self.entries]

    @property
    def oldest(self) -> int:
        return self.entries[0].version

    @property
    def latest(self) -> int:
        return self.entries[-1].version

    def commit_time(self, version: int) -> datetime:
        for entry in self.entries:
            if entry.version == version:
                return entry.timestamp
        raise VersionOutOfRangeError(self._range_text(version))

    def commit_kinds(self) -> dict[int, str]:
        """version -> kind of every replicator commit still in the log."""
        kinds = {}
        for entry in self.entries:
            metadata = entry.commit_metadata
            if metadata is not None:
                kinds[entry.version] = metadata.kind
        return kinds

    def check_version(self, version: int) -> int:
        """`version` when it is in the log, VersionOutOfRangeError otherwise."""
        if isinstance(version, bool) or not isinstance(version, int):
            raise ConfigError(f"a table version is a whole number, got {version!r}")
        if not self.oldest <= version <= self.latest:
            raise VersionOutOfRangeError(self._range_text(version))
        return version

    def resolve(self, *, version: int | None = None, timestamp: datetime | str | None = None
                ) -> TableVersion:
        """The version given, or the newest one committed at or before `timestamp`."""
        if (version is None) == (timestamp is None):
            raise ConfigError("give exactly one of a table version or a timestamp")
        if version is not None:
            checked = self.check_version(version)
            return TableVersion(checked, self.commit_time(checked))
        assert timestamp is not None
        moment = parse_moment(timestamp)
        if moment > datetime.now(UTC):
            raise VersionOutOfRangeError(f"{moment.isoformat()} is in the future")
        found = version_at(self.versions, moment)
        if found is None:
            first = self.entries[0]
            raise VersionOutOfRangeError(
                f"{moment.isoformat()} is before the oldest version still in the history of "
                f"{self.target} (version {first.version}, committed {first.timestamp.isoformat()})"
            )
        return TableVersion(found, self.commit_time(found))

    def check_readable(self, version: int) -> int:
        """`version` when it is in the log and its data files are all still there."""
        self.check_version(version)
        if version < self.snapshot_horizon:
            raise VersionVacuumedError(self._vacuumed_text(version, self.snapshot_horizon))
        missing = guarded(lambda: self.reader.missing_files(self.target, version),
                           f"version {version} of {self.target}")
        if missing:
            raise VersionVacuumedError(
                f"{len(missing)} data files of version {version} of {self.target} were removed "
                "(VACUUM); only newer versions can be read"
            )
        return version

    def snapshot(self, version: int) -> DataFrame:
        """The data rows at `version` as a Spark DataFrame, its files checked to be there."""
        self.check_readable(version)
        spark = self.spark
        return guarded(
            lambda: spark.read.format("delta").option("versionAsOf", version)
            .load(self.target).select(*DATA_COLUMNS),
            f"version {version} of {self.target}",
        )

    def rows(
        self, version: int, columns: Sequence[str], *, order_by: Sequence[str], limit: int,
        where: str | None = None,
    ) -> tuple[int, pa.Table]:
        """How many data rows `version` holds (matching `where`), and the first `limit` of them
        in `order_by` order (all for 0), read through this history's reader."""
        self.check_readable(version)

        return guarded(
            lambda: self.reader.first_rows(
                self.target, columns, order_by, limit, version=version, where=where
            ),
            f"version {version} of {self.target}",
        )

    def check_change_range(self, start: int, end: int) -> None:
        """Versions `start`..`end` are in the log, in order, and their changes still there."""
        self.check_version(start)
        self.check_version(end)
        if start > end:
            raise ConfigError(f"the change range starts at version {start}, after its end {end}")
        if start < self.change_horizon:
            raise VersionVacuumedError(self._vacuumed_text(start, self.change_horizon, "changes"))

    def changes(self, start: int, end: int) -> DataFrame:
        """The change data feed of versions `start`..`end` as a Spark DataFrame."""
        self.check_change_range(start, end)
        spark = self.spark

        def feed() -> DataFrame:
            return (
                spark.read.format("delta")
                .option("readChangeFeed", "true")
                .option("startingVersion", start)
                .option("endingVersion", end)
                .load(self.target)
                .select(*CHANGE_COLUMNS)
            )

        return guarded(feed, f"the changes of versions {start}-{end} of {self.target}")

    def change_rows(
        self, start: int, end: int, *, where: str | None = None, limit: int = 0
    ) -> tuple[int, pa.Table]:
        """How many rows the change data feed of versions `start`..`end` holds, and the first
        `limit` of them (all for 0), in feed order: by version, document, old image first.

        `_commit_timestamp` is the history's commit time of each version, whichever engine
        read the feed (delta-rs's feed carries the writer's clock, not the commit file's).
        """
        import pyarrow as pa

        self.check_change_range(start, end)
        total, rows = guarded(
            lambda: self.reader.changes(
                self.target, start, end, CHANGE_COLUMNS, order_by=_FEED_ORDER, limit=limit,
                where=where,
            ),
            f"the changes of versions {start}-{end} of {self.target}",
        )
        times = {entry.version: entry.timestamp for entry in self.entries}
        committed = pa.array(
            [times[v] for v in rows.column("_commit_version").to_pylist()],
            pa.timestamp("us", tz="UTC"),
        )
        index = rows.schema.get_field_index("_commit_timestamp")
        return total, rows.set_column(index, "_commit_timestamp", committed)

    def delta_rs_misreads(self, start: int, end: int) -> list[int]:
        """Versions `start`..`end` whose change feed delta-rs reads wrong: rollbacks and
        resyncs written before they were MERGEs of the difference (a replaceWhere over a file
        with a deletion vector, whose vector delta-rs 1.6 inverts)."""
        misread = []
        for entry in self.entries:
            header = entry.commit_header
            if (start <= entry.version <= end and header is not None
                    and header.kind in ROLLBACK_KINDS and entry.operation != "MERGE"):
                misread.append(entry.version)
        return misread

    def for_changes(self, start: int, end: int, *, engine: str | None,
                    spark: SparkSession | None) -> MirrorHistory:
        """This history on a reader whose change feed of `start`..`end` is right: this one,
        or Spark's when delta-rs would misread a version of the range (unless delta-rs was
        asked for by name, which is then an error)."""
        from replicator.delta.reader import DELTA_RS, table_reader

        if self.reader.engine != DELTA_RS:
            return self
        misread = self.delta_rs_misreads(start, end)
        if not misread:
            return self
        if engine == DELTA_RS:
            raise ConfigError(
                f"versions {', '.join(map(str, misread))} of {self.target} are rollbacks written "
                "by an older replicator, whose change feed delta-rs reads wrong; drop --engine "
                "delta-rs to read them with Spark"
            )
        return MirrorHistory(table_reader(SPARK, spark), self.target, self.entries)

    def source_boundary(self, vbucket: int, seqno: int) -> SourceBoundary:
        """The newest committed boundary of `vbucket` at or below `seqno` on its live history."""
        from replicator.delta.rollback import live_boundaries

        for name, number in (("vbucket", vbucket), ("seqno", seqno)):
            if isinstance(number, bool) or not isinstance(number, int) or number < 0:
                raise ConfigError(f"{name} must be a whole number >= 0, got {number!r}")
        checkpoints = guarded(
            lambda: vbucket_checkpoints(self.reader, self.layout, self.entries, vbucket),
            f"the checkpoints of {self.target}",
        )
        chain = live_boundaries(checkpoints, vbucket)
        if not chain:
            raise VersionOutOfRangeError(
                f"vbucket {vbucket} has no committed boundary in {self.target}"
            )
        candidates = [c for c in chain if c.seqno <= seqno]
        if not candidates:
            raise VersionOutOfRangeError(
                f"vbucket {vbucket} has no committed boundary at or below seqno {seqno} on its "
                f"current history; the oldest is seqno {chain[0].seqno} (table version "
                f"{chain[0].table_version})"
            )
        boundary = candidates[-1]
        return SourceBoundary(
            vbucket=vbucket,
            requested_seqno=seqno,
            seqno=boundary.seqno,
            vbucket_uuid=boundary.position.vbucket_uuid,
            table_version=boundary.table_version,
            committed_at=boundary.committed_at,
            kind=boundary.kind,
        )

    def _range_text(self, version: int) -> str:
        return (f"version {version} is not in the history of {self.target}: it has versions "
                f"{self.oldest} to {self.latest}")

    def _vacuumed_text(self, version: int, horizon: int, what: str = "files") -> str:
        return (f"the {what} of version {version} of {self.target} were removed by VACUUM; "
                f"versions from {horizon} on can still be read")


def guarded(action: Callable[[], T], what: str) -> T:
    """Run an engine action; its errors become errors.* with one line of cause."""
    try:
        return action()
    except ReplicatorError:
        raise
    except Exception as exc:
        summary = engine_error_summary(exc)
        if is_unreadable_version(exc):
            raise VersionVacuumedError(
                f"cannot read {what}: its files are gone (VACUUM or log cleanup): {summary}"
            ) from None
        raise ReplicatorError(f"cannot read {what}: {summary}") from None


def read_history(reader: TableReader, target: str, *, checked: bool = False) -> list[HistoryEntry]:
    """The history of the mirror at `target`, oldest first, read through `reader`.

    `checked`: the caller already knows `target` is a mirror (check_mirror otherwise).
    """
    if not checked:
        check_mirror(reader, target)
    return guarded(
        lambda: reader.history(MirrorLayout(target).data), f"the history of {target}"
    )


def vbucket_checkpoints(
    reader: TableReader, layout: MirrorLayout, entries: Sequence[HistoryEntry], vbucket: int
) -> list[Checkpoint]:
    """The vbucket's checkpoints, plus data commits whose checkpoint rows were never written."""
    import pyarrow.compute as pc

    from replicator.delta.checkpoints import (
        CHECKPOINT_COLUMNS,
        checkpoint_of_row,
        newest_versions_per_owner,
    )

    found: dict[int, Checkpoint] = {}
    floors: dict[str, int] = {}
    if reader.is_table(layout.checkpoints):
        rows = reader.read(layout.checkpoints, CHECKPOINT_COLUMNS)
        floors = newest_versions_per_owner(rows)
        own = rows.filter(pc.equal(rows.column("vbucket"), vbucket)).to_pylist()
        found = {c.table_version: c for c in map(checkpoint_of_row, own)}
    for checkpoint in pending_checkpoints(commits_above_floors(entries, floors), floors):
        if checkpoint.vbucket == vbucket:
            found.setdefault(checkpoint.table_version, checkpoint)
    return sorted(found.values(), key=lambda c: (c.table_version, c.batch_id))
