"""The audit surface: what the mirror held at any committed point, and why it changed.

Read-only: nothing here writes, claims or repairs. Every answer comes from the data table's own
Delta history (time travel, the change data feed, and the `CommitMetadata` each replicator
commit carries); `mirror_at_source_seqno` also reads the checkpoints table. Points of history
that cannot be read any more (beyond the log, vacuumed) raise `HistoryUnavailableError`s that
say which versions are still readable.

>>> from replicator.inspect.audit import document_history, rollbacks
>>> history = document_history(spark, "/data/mirror", "order::7")  # doctest: +SKIP
>>> [(v.table_version, str(v.operation), v.value) for v in history]  # doctest: +SKIP
>>> [record.explain() for record in rollbacks(spark, "/data/mirror")]  # doctest: +SKIP
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from replicator.delta.reader import SPARK, HistoryEntry
from replicator.delta.schema import DATA_COLUMNS, RESYNC, ROLLBACK, MirrorLayout
from replicator.delta.table import as_utc, engine_error_summary
from replicator.errors import ConfigError, ReplicatorError
from replicator.inspect.status import check_mirror, format_time, pending_checkpoints
from replicator.model.positions import FailoverLog

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from replicator.delta.checkpoints import Checkpoint
    from replicator.delta.reader import TableReader

T = TypeVar("T")

CHANGE_COLUMNS: tuple[str, ...] = (*DATA_COLUMNS, "_change_type", "_commit_version",
                                   "_commit_timestamp")
"""Columns of `changes_between`: the data columns and Delta's change data feed columns."""

VACUUM_START = "VACUUM START"

_UNREADABLE_MARKERS = (
    "FILE_NOT_EXIST",
    "FileNotFoundException",
    "DELTA_FILE_NOT_FOUND",
    "VERSION_NOT_FOUND",
    "VersionNotFound",
    "Cannot time travel",
    "DELTA_TIME_TRAVEL",
    "DELTA_CHANGE_DATA_FILE_NOT_FOUND",
)

_CONTENT_COLUMNS = (
    "vbucket", "seqno", "rev_seqno", "cas", "flags", "expiry", "is_json", "doc", "value", "xattrs"
)
"""What makes two rows of one document the same version of it."""


# --- errors -------------------------------------------------------------------------------


class HistoryUnavailableError(ReplicatorError):
    """The asked-for point of the mirror's history cannot be read."""


class VersionOutOfRangeError(HistoryUnavailableError):
    """A version, timestamp or seqno lies outside the history the mirror has."""


class VersionVacuumedError(HistoryUnavailableError):
    """The files of that version (or its change data) were removed by VACUUM or log cleanup."""


# --- values -------------------------------------------------------------------------------


class ChangeOperation(enum.StrEnum):
    """What a table version did to one document."""

    INSERT = "insert"
    UPDATE = "update"
    DELETE = "delete"
    BASELINE = "baseline"
    """Present at the oldest version still in the log: earlier changes are no longer known."""


@dataclass(frozen=True, slots=True)
class TableVersion:
    """One commit of the data table: its version and commit time."""

    version: int
    committed_at: datetime


@dataclass(frozen=True, slots=True)
class DocumentVersion:
    """One document as a table version left it.

    `value` is the JSON text (or the raw bytes of a binary document); for a delete it is None,
    as are `seqno` and `cas` (the mirror keeps no tombstones). `commit_kind` is the replicator
    commit's kind (commit, rollback, resync), None when the commit is not the replicator's.
    """

    table_version: int
    committed_at: datetime
    operation: ChangeOperation
    key: str
    scope: str
    collection: str
    vbucket: int
    seqno: int | None
    cas: int | None
    value: str | bytes | None
    expiry: datetime | None = None
    xattrs: str | None = None
    commit_kind: str | None = None

    @property
    def collection_path(self) -> str:
        """`scope.collection`."""
        return f"{self.scope}.{self.collection}"

    def json_value(self) -> Any:
        """The document parsed from JSON; None for a delete or a binary document."""
        if not isinstance(self.value, str):
            return None
        return json.loads(self.value)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (binary values as hex)."""
        value: Any = self.value.hex() if isinstance(self.value, bytes) else self.value
        return {
            "table_version": self.table_version,
            "committed_at": self.committed_at.isoformat(),
            "operation": str(self.operation),
            "key": self.key,
            "collection": self.collection_path,
            "vbucket": self.vbucket,
            "seqno": self.seqno,
            "cas": self.cas,
            "expiry": self.expiry.isoformat() if self.expiry is not None else None,
            "commit_kind": self.commit_kind,
            "value": value,
            "xattrs": self.xattrs,
        }


class FieldChangeKind(enum.StrEnum):
    """How one field differs between two versions of a document."""

    ADDED = "added"
    REMOVED = "removed"
    CHANGED = "changed"


@dataclass(frozen=True, slots=True)
class FieldChange:
    """One field that differs: its path (`address.city`, `items[0]`), old and new value.

    `before` is None for an added field, `after` for a removed one; `kind` tells those apart
    from a JSON null.
    """

    path: str
    kind: FieldChangeKind
    before: Any = None
    after: Any = None


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


# --- pure logic -----------------------------------------------------------------------------


def readable_versions(entries: Sequence[HistoryEntry]) -> tuple[int, int]:
    """(oldest version readable as a snapshot, oldest version whose change data is readable).

    Every VACUUM START in the history deletes files removed before its time minus the retention
    it ran with: versions before the newest commit older than that cutoff may miss files, and
    that commit's own removed files and change data are gone too.
    """
    if not entries:
        raise ValueError("a Delta table has at least one version")
    oldest = min(entry.version for entry in entries)
    snapshots = changes = oldest
    for vacuum in (e for e in entries if e.operation == VACUUM_START):
        retention_ms = vacuum.parameters.get("specifiedRetentionMillis") or vacuum.parameters.get(
            "defaultRetentionMillis"
        )
        if retention_ms is None:
            continue
        cutoff = vacuum.timestamp - timedelta(milliseconds=int(retention_ms))
        expired = [
            e.version for e in entries if e.version < vacuum.version and e.timestamp < cutoff
        ]
        if expired:
            snapshots = max(snapshots, max(expired))
            changes = max(changes, max(expired) + 1)
    return snapshots, changes


def version_at(versions: Sequence[TableVersion], moment: datetime) -> int | None:
    """The newest version committed at or before `moment`; None when `moment` precedes them all."""
    eligible = [v.version for v in versions if v.committed_at <= moment]
    return max(eligible) if eligible else None


def first_version_from(versions: Sequence[TableVersion], moment: datetime) -> int | None:
    """The oldest version committed at or after `moment`; None when none is."""
    eligible = [v.version for v in versions if v.committed_at >= moment]
    return min(eligible) if eligible else None


def parse_moment(value: datetime | str) -> datetime:
    """A timestamp argument as an aware datetime; naive values and ISO strings are UTC."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError(
                f"invalid timestamp {value!r}: use ISO 8601, e.g. 2026-01-31T12:00:00Z"
            ) from None
    if not isinstance(value, datetime):
        raise ConfigError(f"a timestamp must be a datetime or ISO 8601 text, got {value!r}")
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def split_collection(path: str) -> tuple[str, str]:
    """`scope.collection` -> (scope, collection), ConfigError when it is not of that form."""
    scope, dot, collection = path.partition(".")
    if not dot or not scope or not collection or "." in collection:
        raise ConfigError(
            f"collection {path!r} is not of the form scope.collection (e.g. app.orders, "
            "_default._default)"
        )
    return scope, collection


def collapse_changes(
    changes: Iterable[Mapping[str, Any]], commit_kinds: Mapping[int, str] | None = None
) -> list[DocumentVersion]:
    """Change data feed rows of ONE document -> its versions, oldest first (pure).

    Each table version's rows give the state after it: an insert or update_postimage row, or
    nothing (deleted). The operation compares that with the state before, so a rewrite that
    leaves the document as it was (a rollback or resync rewriting its whole vbucket shows as
    delete + insert of the same row) is no version at all. A row whose `_change_type` is
    `baseline` is the document as found at the start of the readable history.
    """
    by_version: dict[int, list[Mapping[str, Any]]] = {}
    for row in changes:
        by_version.setdefault(int(row["_commit_version"]), []).append(row)
    kinds = commit_kinds or {}
    versions: list[DocumentVersion] = []
    current: Mapping[str, Any] | None = None
    for version in sorted(by_version):
        rows = by_version[version]
        after = [r for r in rows if r["_change_type"] in ("insert", "update_postimage", "baseline")]
        state = max(after, key=lambda r: int(r["seqno"])) if after else None
        if state is None and current is None:
            continue
        if state is not None and current is not None and _content(state) == _content(current):
            continue
        if state is None:
            assert current is not None
            versions.append(_document_version(current, rows[0], ChangeOperation.DELETE, kinds,
                                              deleted=True))
        else:
            if state["_change_type"] == "baseline":
                operation = ChangeOperation.BASELINE
            elif current is None:
                operation = ChangeOperation.INSERT
            else:
                operation = ChangeOperation.UPDATE
            versions.append(_document_version(state, state, operation, kinds))
        current = state
    return versions


def _content(row: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(row[name] for name in _CONTENT_COLUMNS)


def _document_version(
    row: Mapping[str, Any],
    commit: Mapping[str, Any],
    operation: ChangeOperation,
    kinds: Mapping[int, str],
    *,
    deleted: bool = False,
) -> DocumentVersion:
    version = int(commit["_commit_version"])
    value: str | bytes | None = None
    if not deleted:
        raw = row["value"]
        value = row["doc"] if row["is_json"] else (bytes(raw) if raw is not None else None)
    return DocumentVersion(
        table_version=version,
        committed_at=as_utc(commit["_commit_timestamp"]),
        operation=operation,
        key=str(row["key"]),
        scope=str(row["scope"]),
        collection=str(row["collection"]),
        vbucket=int(row["vbucket"]),
        seqno=None if deleted else int(row["seqno"]),
        cas=None if deleted else int(row["cas"]),
        value=value,
        expiry=None if deleted or row["expiry"] is None else as_utc(row["expiry"]),
        xattrs=None if deleted else row["xattrs"],
        commit_kind=kinds.get(version),
    )


def diff_documents(
    before: DocumentVersion | None, after: DocumentVersion | None
) -> list[FieldChange]:
    """The fields that differ between two versions of a document, by path (pure).

    Nested objects are walked (`address.city`), arrays by index (`items[0]`). A missing side
    (None, or a delete) counts as no fields; a binary document is one field with path `""`.

    >>> def order(version, text):
    ...     return DocumentVersion(version, datetime(2026, 1, 31, tzinfo=UTC),
    ...                            ChangeOperation.UPDATE, "order::7", "app", "orders",
    ...                            vbucket=5, seqno=50 + version, cas=version, value=text)
    >>> old = order(3, '{"status": "paid", "items": [{"sku": "a1"}]}')
    >>> new = order(4, '{"status": "shipped", "items": [{"sku": "a1"}], "carrier": "DHL"}')
    >>> [(c.path, str(c.kind), c.before, c.after) for c in diff_documents(old, new)]
    [('carrier', 'added', None, 'DHL'), ('status', 'changed', 'paid', 'shipped')]
    """
    return _diff_fields(_flatten(before), _flatten(after))


def _flatten(version: DocumentVersion | None) -> dict[str, Any]:
    if version is None or version.value is None:
        return {}
    if isinstance(version.value, bytes):
        return {"": version.value}
    fields: dict[str, Any] = {}
    _walk(json.loads(version.value), "", fields)
    return fields


def _walk(node: Any, path: str, fields: dict[str, Any]) -> None:
    if isinstance(node, dict) and node:
        for name, child in node.items():
            _walk(child, f"{path}.{name}" if path else str(name), fields)
    elif isinstance(node, list) and node:
        for index, child in enumerate(node):
            _walk(child, f"{path}[{index}]", fields)
    else:
        fields[path] = node


def _diff_fields(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[FieldChange]:
    changes = []
    for path in sorted(old.keys() | new.keys()):
        if path not in new:
            changes.append(FieldChange(path, FieldChangeKind.REMOVED, before=old[path]))
        elif path not in old:
            changes.append(FieldChange(path, FieldChangeKind.ADDED, after=new[path]))
        elif old[path] != new[path] or type(old[path]) is not type(new[path]):
            changes.append(FieldChange(path, FieldChangeKind.CHANGED, old[path], new[path]))
    return changes


def rollback_record(entry: HistoryEntry) -> RollbackRecord | None:
    """The rollback a history entry carried out; None for any other commit (pure)."""
    header = entry.commit_header
    if header is None or header.kind not in (ROLLBACK, RESYNC):
        return None
    metadata = entry.commit_metadata
    if metadata is None:
        return None
    details = metadata.details
    vbucket = details.get("vbucket")
    if vbucket is None and len(metadata.positions) == 1:
        vbucket = next(iter(metadata.positions))
    if vbucket is None:
        return None
    position = metadata.positions.get(int(vbucket))
    to_seqno = details.get("to_seqno", position.seqno if position is not None else 0)
    pairs = details.get("failover_log")
    return RollbackRecord(
        table_version=entry.version,
        committed_at=entry.timestamp,
        kind=metadata.kind,
        vbucket=int(vbucket),
        to_seqno=int(to_seqno),
        from_seqno=_optional_int(details.get("from_seqno")),
        rollback_seqno=_optional_int(details.get("rollback_seqno")),
        from_table_version=_optional_int(details.get("from_table_version")),
        reason=str(details["reason"]) if details.get("reason") is not None else None,
        failover_log=FailoverLog.of((int(u), int(s)) for u, s in pairs) if pairs else None,
        owner_id=metadata.owner_id,
    )


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


# --- reading the mirror ---------------------------------------------------------------------


class MirrorHistory:
    """The data table's history, read once: versions, vacuum horizons, replicator commits.

    Built by `MirrorHistory.open` (any engine's reader) or `MirrorHistory.read` (Spark); every
    public function of this module starts from one. Rows come back as Arrow tables through
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
        missing = _guarded(lambda: self.reader.missing_files(self.target, version),
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
        return _guarded(
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

        return _guarded(
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

        return _guarded(feed, f"the changes of versions {start}-{end} of {self.target}")

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
        total, rows = _guarded(
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
        from replicator.inspect.status import ROLLBACK_KINDS

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
        checkpoints = _guarded(
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


def _guarded(action: Callable[[], T], what: str) -> T:
    """Run an engine action; its errors become errors.* with one line of cause."""
    try:
        return action()
    except ReplicatorError:
        raise
    except Exception as exc:
        summary = engine_error_summary(exc)
        if _unreadable(exc):
            raise VersionVacuumedError(
                f"cannot read {what}: its files are gone (VACUUM or log cleanup): {summary}"
            ) from None
        raise ReplicatorError(f"cannot read {what}: {summary}") from None


def _unreadable(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        text = engine_error_summary(seen) + " " + str(seen)[:4000]
        if any(marker in text for marker in _UNREADABLE_MARKERS):
            return True
        seen = seen.__cause__
    return False


# --- the public questions -------------------------------------------------------------------


def document_history(
    spark: SparkSession | None, target: str, key: str, *, collection: str | None = None,
    engine: str | None = None,
) -> list[DocumentVersion]:
    """Every version of one document the mirror committed, oldest first.

    Read from the change data feed over the whole history still in the log; a table version
    that rewrote the document unchanged (a rollback of its vbucket that did not touch it) is
    left out. When older changes were cleaned up or vacuumed, the first entry is a BASELINE:
    the document as the oldest fully readable version held it. `collection`
    (`scope.collection`) is needed when the key exists in several collections. Empty when the
    mirror never held the key. Read with delta-rs unless a SparkSession is given or `engine`
    is "spark"; with Spark anyway where delta-rs would misread the feed (old rollbacks).

    >>> history = document_history(spark, "/data/mirror", "order::7",  # doctest: +SKIP
    ...                            collection="app.orders")
    >>> [(v.table_version, str(v.operation), v.seqno) for v in history]  # doctest: +SKIP
    [(1, 'insert', 12), (4, 'update', 57), (9, 'delete', None)]
    """
    from replicator.delta.reader import table_reader

    if not key:
        raise ConfigError("document_history needs a document key")
    history = MirrorHistory.open(table_reader(engine, spark), target)
    # Changes before the log's oldest version, or vacuumed ones, are gone: start from the
    # document as the oldest fully readable version held it.
    base = None
    if history.oldest > 0 or history.change_horizon > history.oldest:
        base = max(history.oldest, history.change_horizon - 1)
    start = history.oldest if base is None else base + 1
    if start <= history.latest:
        history = history.for_changes(start, history.latest, engine=engine, spark=spark)
    literal = history.reader.literal
    condition = f"key = {literal(key)}"
    if collection is not None:
        scope, name = split_collection(collection)
        condition += f" AND scope = {literal(scope)} AND collection = {literal(name)}"

    def rows() -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        if base is not None:
            history.check_readable(base)
            baseline = history.reader.read(
                history.target, DATA_COLUMNS, version=base, where=condition
            )
            found += [
                {**row, "_change_type": "baseline", "_commit_version": base,
                 "_commit_timestamp": history.commit_time(base)}
                for row in baseline.to_pylist()
            ]
        if start <= history.latest:
            found += history.change_rows(start, history.latest, where=condition)[1].to_pylist()
        return found

    changes = _guarded(rows, f"the history of {key!r} in {target}")
    collections = sorted({f"{row['scope']}.{row['collection']}" for row in changes})
    if len(collections) > 1:
        raise ConfigError(
            f"key {key!r} exists in several collections ({', '.join(collections)}); pass "
            "collection= (--collection) to pick one"
        )
    return collapse_changes(changes, history.commit_kinds())


def resolve_version(
    spark: SparkSession,
    target: str,
    *,
    version: int | None = None,
    timestamp: datetime | str | None = None,
) -> TableVersion:
    """The table version `mirror_as_of` reads for these arguments, with its commit time.

    >>> resolve_version(spark, "/data/mirror", timestamp="2026-01-31T12:00:00Z")  # doctest: +SKIP
    TableVersion(version=41, committed_at=datetime.datetime(2026, 1, 31, 11, 59, 58, ...))
    """
    return MirrorHistory.read(spark, target).resolve(version=version, timestamp=timestamp)


def mirror_as_of(
    spark: SparkSession,
    target: str,
    *,
    version: int | None = None,
    timestamp: datetime | str | None = None,
) -> DataFrame:
    """The mirrored documents as table `version`, or as of `timestamp`, left them.

    A timestamp (a datetime, naive means UTC, or ISO 8601 text) selects the newest version
    committed at or before it. Raises VersionOutOfRangeError outside the history and
    VersionVacuumedError when the version's files were vacuumed.

    >>> mirror_as_of(spark, "/data/mirror", version=3).count()  # doctest: +SKIP
    1200
    >>> then = mirror_as_of(spark, "/data/mirror",  # doctest: +SKIP
    ...                     timestamp="2026-01-30T00:00:00Z")
    """
    history = MirrorHistory.read(spark, target)
    resolved = history.resolve(version=version, timestamp=timestamp)
    return history.snapshot(resolved.version)


def resolve_source_seqno(
    spark: SparkSession, target: str, vbucket: int, seqno: int
) -> SourceBoundary:
    """The committed boundary and table version `mirror_at_source_seqno` answers from.

    The newest committed boundary of `vbucket` at or below `seqno` on its live history (the
    boundaries a later rollback abandoned, or a full resync replaced, are not on it).

    >>> resolve_source_seqno(spark, "/data/mirror", 17, 5000).table_version  # doctest: +SKIP
    12
    """
    return MirrorHistory.read(spark, target).source_boundary(vbucket, seqno)


def mirror_at_source_seqno(
    spark: SparkSession, target: str, vbucket: int, seqno: int
) -> DataFrame:
    """What the mirror held of `vbucket` when it stood at source seqno `seqno`.

    The rows of that vbucket at the table version of its newest committed boundary at or
    below `seqno` (see `resolve_source_seqno`): exactly the producer's state at that boundary.

    >>> rows = mirror_at_source_seqno(spark, "/data/mirror", 17, 5000)  # doctest: +SKIP
    >>> rows.select("key", "seqno").orderBy("seqno").show()  # doctest: +SKIP
    """
    from pyspark.sql import functions as F

    history = MirrorHistory.read(spark, target)
    boundary = history.source_boundary(vbucket, seqno)
    return history.snapshot(boundary.table_version).where(F.col("vbucket") == vbucket)


def changes_between(
    spark: SparkSession,
    target: str,
    start: int | datetime | str,
    end: int | datetime | str,
) -> DataFrame:
    """The change data feed from `start` to `end`, both included: versions or timestamps.

    Rows carry the data columns plus `_change_type` (insert, update_preimage,
    update_postimage, delete), `_commit_version` and `_commit_timestamp`. A timestamp start
    means the first version committed at or after it, a timestamp end the last one at or
    before it; an empty frame when no version falls between. A rollback or resync rewrites
    its vbucket's rows: its version shows them as deletes and inserts.

    >>> feed = changes_between(spark, "/data/mirror", 3, 5)  # doctest: +SKIP
    >>> feed.groupBy("_change_type").count().show()  # doctest: +SKIP
    >>> changes_between(spark, "/data/mirror",  # doctest: +SKIP
    ...                 "2026-01-31T10:00:00Z", "2026-01-31T11:00:00Z")
    """
    history = MirrorHistory.read(spark, target)
    first = _range_end(history, start, first=True)
    last = _range_end(history, end, first=False)
    if first is None or last is None or first > last:
        if isinstance(start, int) and isinstance(end, int):
            raise ConfigError(f"the change range starts at version {start}, after its end {end}")
        return history.changes(history.latest, history.latest).limit(0)
    return history.changes(first, last)


def changes_table(
    spark: SparkSession | None,
    target: str,
    start: int | datetime | str,
    end: int | datetime | str,
    *,
    limit: int = 0,
    engine: str | None = None,
) -> tuple[int, pa.Table]:
    """`changes_between` as Arrow: how many feed rows there are, and the first `limit` of them
    (all for 0) in feed order (by version, document, old image before new). Read with delta-rs
    unless a SparkSession is given or `engine` is "spark" (and with Spark where delta-rs
    would misread the feed).

    >>> total, first = changes_table(None, "/data/mirror", 3, 5, limit=20)  # doctest: +SKIP
    """
    from replicator.delta.reader import table_reader

    history = MirrorHistory.open(table_reader(engine, spark), target)
    first = _range_end(history, start, first=True)
    last = _range_end(history, end, first=False)
    if first is None or last is None or first > last:
        if isinstance(start, int) and isinstance(end, int):
            raise ConfigError(f"the change range starts at version {start}, after its end {end}")
        _, rows = history.change_rows(history.latest, history.latest, where="false")
        return 0, rows
    reading = history.for_changes(first, last, engine=engine, spark=spark)
    return reading.change_rows(first, last, limit=limit)


_FEED_ORDER = ("_commit_version", "vbucket", "scope", "collection", "key", "_change_type")
"""Feed rows by version, then document, a document's old image before its new one."""


def _range_end(history: MirrorHistory, value: int | datetime | str, *, first: bool) -> int | None:
    if isinstance(value, bool):
        raise ConfigError(f"a change range end is a version or a timestamp, got {value!r}")
    if isinstance(value, int):
        return history.check_version(value)
    moment = parse_moment(value)
    if first:
        return first_version_from(history.versions, moment)
    return version_at(history.versions, moment)


def read_history(reader: TableReader, target: str, *, checked: bool = False) -> list[HistoryEntry]:
    """The history of the mirror at `target`, oldest first, read through `reader`.

    `checked`: the caller already knows `target` is a mirror (check_mirror otherwise).
    """
    if not checked:
        check_mirror(reader, target)
    return _guarded(
        lambda: reader.history(MirrorLayout(target).data), f"the history of {target}"
    )


def rollbacks(
    spark: SparkSession | None, target: str, *, engine: str | None = None
) -> list[RollbackRecord]:
    """Every rollback and full resync still in the table history, oldest first.

    Read with delta-rs unless a SparkSession is given or `engine` is "spark".

    >>> for record in rollbacks(spark, "/data/mirror"):  # doctest: +SKIP
    ...     print(record.explain())
    """
    records = (rollback_record(entry) for entry in _history_of(spark, target, engine))
    return [record for record in records if record is not None]


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
    from replicator.inspect.status import commits_above_floors

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


__all__ = [
    "CHANGE_COLUMNS",
    "ChangeOperation",
    "CommitActivity",
    "DocumentVersion",
    "FieldChange",
    "FieldChangeKind",
    "HistoryEntry",
    "HistoryUnavailableError",
    "MirrorHistory",
    "RollbackRecord",
    "SourceBoundary",
    "TableVersion",
    "VersionOutOfRangeError",
    "VersionVacuumedError",
    "changes_between",
    "changes_table",
    "collapse_changes",
    "commit_activities",
    "commit_activity",
    "diff_documents",
    "document_history",
    "mirror_as_of",
    "mirror_at_source_seqno",
    "read_history",
    "readable_versions",
    "resolve_source_seqno",
    "resolve_version",
    "rollbacks",
    "vbucket_checkpoints",
]
