"""Reading a mirror's tables without writing them: one interface, two engines.

One module past 500 lines on purpose: the protocol and its two engines must answer every
question alike, and that is checked by reading them side by side.

The read-side commands (`status`, `verify`, `audit`) need a table's properties, its history, its
rows at a version, its change feed and a few small tables beside it. delta-rs
(`deltalake`) reads those in milliseconds without a JVM; Spark needs a JVM start and a job per
question, tens of seconds on a small machine. delta-rs is therefore the default for them, and
Spark reads the same tables when asked (`--engine spark`) or where delta-rs is known to be wrong
(its change data feed of old rollback commits, see the README). Both engines hand back the same
values: history entries and Arrow tables, so everything above this module is written once.
Filters (`where`) are SQL predicates both engines parse alike (`vbucket = 17`); text goes in
through the reader's `literal`, since the two dialects escape strings differently.

>>> reader = table_reader("delta-rs")  # doctest: +SKIP
>>> reader.history("/data/mirror")[-1].operation  # doctest: +SKIP
'MERGE'
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar
from urllib.parse import urlparse

from replicator.delta.paths import local_path, on_local_filesystem
from replicator.errors import ConfigError, ReplicatorError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from replicator.delta.commit_metadata import CommitHeader, CommitMetadata

_Tabular = TypeVar("_Tabular", "pa.Table", "pa.RecordBatch")

DELTA_RS = "delta-rs"
SPARK = "spark"
ENGINES = (DELTA_RS, SPARK)
"""Engine names the read-side commands accept (`--engine`)."""

CHANGE_TYPE = "_change_type"
CHANGE_TYPE_ORDER = ("update_preimage", "delete", "update_postimage", "insert")
"""Change feed rows of one document in one version, in the order a reader wants them."""
_RANK = "_change_rank"

_DELTA_RS_SCHEMES = frozenset({"", "file", "s3", "s3a", "gs", "az", "abfs", "abfss", "azure"})
"""URI schemes delta-rs opens; anything else (hdfs://, ...) is read with Spark."""


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One commit of a Delta table's history (DESCRIBE HISTORY), whichever engine read it."""

    version: int
    timestamp: datetime
    operation: str
    parameters: Mapping[str, str]
    metrics: Mapping[str, str]
    user_metadata: str | None

    @property
    def commit_header(self) -> CommitHeader | None:
        """Owner and kind of a replicator commit, without parsing its positions."""
        from replicator.delta.commit_metadata import CommitHeader

        return CommitHeader.from_json(self.user_metadata)

    @property
    def commit_metadata(self) -> CommitMetadata | None:
        """The replicator's metadata of this commit, None for any other commit."""
        from replicator.delta.commit_metadata import CommitMetadata

        try:
            return CommitMetadata.from_json(self.user_metadata)
        except ValueError:
            return None


class TableReader(Protocol):
    """Read-only access to Delta tables by path."""

    engine: str

    def is_table(self, path: str) -> bool:
        """Whether `path` itself is the root of a Delta table."""
        ...

    def path_exists(self, path: str) -> bool:
        """Whether anything exists at `path`."""
        ...

    def properties(self, path: str) -> Mapping[str, str]:
        """The table properties (configuration) of the table at `path`."""
        ...

    def version(self, path: str) -> int:
        """The newest version of the table at `path`."""
        ...

    def history(self, path: str) -> list[HistoryEntry]:
        """Every commit still in the table's log, oldest first."""
        ...

    def read(
        self, path: str, columns: Sequence[str], *, version: int | None = None,
        where: str | None = None,
    ) -> pa.Table:
        """The rows of the table at `path` (at `version`, matching `where`), only `columns`."""
        ...

    def batches(
        self, path: str, columns: Sequence[str], *, version: int | None = None,
        where: str | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """The same rows as `read`, a batch at a time (a whole mirror need not fit in memory)."""
        ...

    def first_rows(
        self, path: str, columns: Sequence[str], order_by: Sequence[str], limit: int, *,
        version: int | None = None, where: str | None = None,
    ) -> tuple[int, pa.Table]:
        """How many rows `read` would return, and the first `limit` of them in `order_by`
        order (all of them for 0), only `columns`."""
        ...

    def missing_files(self, path: str, version: int) -> list[str]:
        """Data files `version` of the table needs that are gone (VACUUM); [] if unknown."""
        ...

    def changes(
        self, path: str, start: int, end: int, columns: Sequence[str], *,
        order_by: Sequence[str], limit: int, where: str | None = None,
    ) -> tuple[int, pa.Table]:
        """How many rows the change data feed of versions `start`..`end` (both included) has,
        matching `where`, and the first `limit` of them (all for 0) in `order_by` order, only
        `columns` (data columns and `_change_type`, `_commit_version`, `_commit_timestamp`).
        `_change_type` orders as CHANGE_TYPE_ORDER: a row's old image before its new one."""
        ...

    def literal(self, value: str | int) -> str:
        """`value` as a SQL literal in this engine's dialect, for `where`."""
        ...


class DeltaRsReader:
    """Reads with delta-rs: no JVM, and a table opens in milliseconds.

    Tables are opened once per reader and path; a reader answers for the moment it first
    looked, which is what one command wants.
    """

    engine = DELTA_RS

    def __init__(self, storage_options: Mapping[str, str] | None = None) -> None:
        self._storage_options = dict(storage_options or {})
        self._tables: dict[tuple[str, int | None], Any] = {}

    def is_table(self, path: str) -> bool:
        from deltalake import DeltaTable

        _check_scheme(path)
        if (path, None) in self._tables:
            return True
        if not self.path_exists(f"{path.rstrip('/')}/_delta_log"):
            return False
        return bool(DeltaTable.is_deltatable(path, self._storage_options or None))

    def path_exists(self, path: str) -> bool:
        _check_scheme(path)
        parsed = urlparse(path)
        if parsed.scheme in ("", "file"):
            return os.path.exists(parsed.path if parsed.scheme else path)
        # Object stores have no directories; a table's log is what can be asked for.
        from deltalake import DeltaTable

        root = path.removesuffix("/_delta_log")
        return bool(DeltaTable.is_deltatable(root, self._storage_options or None))

    def properties(self, path: str) -> Mapping[str, str]:
        return dict(self._table(path).metadata().configuration)

    def version(self, path: str) -> int:
        return int(self._table(path).version())

    def history(self, path: str) -> list[HistoryEntry]:
        entries = sorted(
            (_entry_of_commit_info(info) for info in self._table(path).history()),
            key=lambda entry: entry.version,
        )
        return _with_commit_file_times(path, entries)

    def read(
        self, path: str, columns: Sequence[str], *, version: int | None = None,
        where: str | None = None,
    ) -> pa.Table:
        return _without_views(self._scan(path, columns, version, where).read_all())

    def batches(
        self, path: str, columns: Sequence[str], *, version: int | None = None,
        where: str | None = None,
    ) -> Iterator[pa.RecordBatch]:
        for batch in self._scan(path, columns, version, where):
            yield _without_views(batch)

    def first_rows(
        self, path: str, columns: Sequence[str], order_by: Sequence[str], limit: int, *,
        version: int | None = None, where: str | None = None,
    ) -> tuple[int, pa.Table]:
        import pyarrow.compute as pc

        order = [(c, "ascending") for c in order_by]
        if not limit:
            rows = self.read(path, columns, version=version, where=where)
            return rows.num_rows, rows.sort_by(order)
        # Two passes keep memory to the sort columns (a mirror's documents can be far larger
        # than memory): sort those (which also counts the rows), then read whole rows only where
        # the first `limit` are, narrowed by the leading sort column, and keep exactly those.
        keys = self.read(path, order_by, version=version, where=where)
        first = keys.take(pc.sort_indices(keys, order)[:limit])
        leading = sorted(set(first.column(order_by[0]).to_pylist()))
        if not leading:
            return 0, self.read(path, columns, version=version, where="false")
        narrowed = f"{order_by[0]} IN ({', '.join(self.literal(v) for v in leading)})"
        rows = self.read(
            path, list(dict.fromkeys([*columns, *order_by])), version=version,
            where=f"({where}) AND {narrowed}" if where else narrowed,
        )
        chosen = rows.join(first, keys=list(order_by), join_type="left semi")
        return keys.num_rows, chosen.sort_by(order).slice(0, limit).select(list(columns))

    def missing_files(self, path: str, version: int) -> list[str]:
        if not on_local_filesystem(path):
            return []  # an object store is not listed here; the read itself will fail
        uris = self._table(path, version).file_uris()
        return [uri for uri in uris if not os.path.exists(urlparse(uri).path or uri)]

    def changes(
        self, path: str, start: int, end: int, columns: Sequence[str], *,
        order_by: Sequence[str], limit: int, where: str | None = None,
    ) -> tuple[int, pa.Table]:
        import pyarrow as pa
        import pyarrow.compute as pc

        order = [(_RANK if c == CHANGE_TYPE else c, "ascending") for c in order_by]
        if not limit:
            rows = _ranked(self._feed(path, start, end, None, where).read_all())
            return rows.num_rows, rows.sort_by(order).select(list(columns))
        # Two passes keep memory to the rows shown, not the feed (documents can be large): a
        # running first `limit` over the sort columns alone, then the whole rows of those only,
        # read from their versions and narrowed by the second sort column (the vbucket).
        total = 0
        first: pa.Table | None = None
        for batch in self._feed(path, start, end, list(order_by), where):
            total += batch.num_rows
            keys = _ranked(pa.Table.from_batches([batch]))
            merged = keys if first is None else pa.concat_tables([first, keys])
            first = merged.take(pc.sort_indices(merged, order)[:limit])
        if first is None or first.num_rows == 0:
            return 0, self._feed(path, start, end, None, "false").read_all().select(list(columns))
        versions = first.column(order_by[0]).to_pylist()
        narrowed = [where] if where else []
        if len(order_by) > 1:
            values = sorted(set(first.column(order_by[1]).to_pylist()))
            narrowed.append(f"{order_by[1]} IN ({', '.join(map(self.literal, values))})")
        rows = self._feed(path, min(versions), max(versions), None,
                          " AND ".join(f"({p})" for p in narrowed) or None).read_all()
        chosen = rows.join(first.drop_columns([_RANK]), keys=list(order_by),
                           join_type="left semi")
        return total, _ranked(chosen).sort_by(order).slice(0, limit).select(list(columns))

    def _feed(
        self, path: str, start: int, end: int, columns: list[str] | None, where: str | None
    ) -> pa.RecordBatchReader:
        import pyarrow as pa

        feed = self._table(path).load_cdf(
            starting_version=start, ending_version=end, columns=columns, predicate=where
        )
        reader = pa.RecordBatchReader.from_stream(feed)
        schema = _without_views(reader.schema.empty_table()).schema
        return pa.RecordBatchReader.from_batches(
            schema, (_without_views(batch) for batch in reader)
        )

    def literal(self, value: str | int) -> str:
        # DataFusion's generic dialect: a quote doubles, a backslash is itself.
        return _sql_literal(value)

    def _scan(
        self, path: str, columns: Sequence[str], version: int | None, where: str | None
    ) -> pa.RecordBatchReader:
        # scan() is delta-rs's own engine: it applies deletion vectors, which the
        # pyarrow-dataset path (to_pyarrow_table) refuses.
        import pyarrow as pa

        stream = self._table(path, version).scan(columns=list(columns), predicate=where)
        return pa.RecordBatchReader.from_stream(stream)

    def _table(self, path: str, version: int | None = None) -> Any:
        from deltalake import DeltaTable

        table = self._tables.get((path, version))
        if table is None:
            _check_scheme(path)
            try:
                table = DeltaTable(
                    path, version=version, storage_options=self._storage_options or None
                )
            except Exception as exc:
                at = "" if version is None else f" at version {version}"
                raise ReplicatorError(
                    f"delta-rs cannot read the Delta table at {path}{at}: {_first_line(exc)}; "
                    "try --engine spark"
                ) from None
            self._tables[path, version] = table
        return table


class SparkReader:
    """Reads with Spark and Delta's own Scala implementation (the writer's engine)."""

    engine = SPARK

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark

    def is_table(self, path: str) -> bool:
        from replicator.delta.table import is_delta_table_at

        return is_delta_table_at(self.spark, path)

    def path_exists(self, path: str) -> bool:
        from replicator.delta.table import path_exists

        return path_exists(self.spark, path)

    def properties(self, path: str) -> Mapping[str, str]:
        from replicator.delta.table import table_properties_and_partitioning

        return table_properties_and_partitioning(self.spark, path)[0]

    def version(self, path: str) -> int:
        from replicator.delta.table import table_version

        return table_version(self.spark, path)

    def history(self, path: str) -> list[HistoryEntry]:
        from delta.tables import DeltaTable

        from replicator.delta.table import as_utc

        rows = (
            DeltaTable.forPath(self.spark, path)
            .history()
            .select("version", "timestamp", "operation", "operationParameters",
                    "operationMetrics", "userMetadata")
            .collect()
        )
        entries = [
            HistoryEntry(
                version=int(row["version"]),
                timestamp=as_utc(row["timestamp"]),
                operation=str(row["operation"]),
                parameters=dict(row["operationParameters"] or {}),
                metrics=dict(row["operationMetrics"] or {}),
                user_metadata=row["userMetadata"],
            )
            for row in rows
        ]
        return sorted(entries, key=lambda entry: entry.version)

    def read(
        self, path: str, columns: Sequence[str], *, version: int | None = None,
        where: str | None = None,
    ) -> pa.Table:
        return self._frame(path, version, where).select(*columns).toArrow()

    def batches(
        self, path: str, columns: Sequence[str], *, version: int | None = None,
        where: str | None = None,
    ) -> Iterator[pa.RecordBatch]:
        # toArrow collects whole; Spark's readers are for tables that fit the driver.
        yield from self.read(path, columns, version=version, where=where).to_batches()

    def first_rows(
        self, path: str, columns: Sequence[str], order_by: Sequence[str], limit: int, *,
        version: int | None = None, where: str | None = None,
    ) -> tuple[int, pa.Table]:
        frame = self._frame(path, version, where)
        ordered = frame.orderBy(*order_by)
        rows = (ordered.limit(limit) if limit else ordered).select(*columns).toArrow()
        return int(frame.count()), rows

    def missing_files(self, path: str, version: int) -> list[str]:
        from replicator.delta.table import path_exists

        files = self._frame(path, version, None).inputFiles()
        return [f for f in files if not path_exists(self.spark, f)]

    def changes(
        self, path: str, start: int, end: int, columns: Sequence[str], *,
        order_by: Sequence[str], limit: int, where: str | None = None,
    ) -> tuple[int, pa.Table]:
        from pyspark.sql import functions as F

        frame = (
            self.spark.read.format("delta").option("readChangeFeed", "true")
            .option("startingVersion", start).option("endingVersion", end).load(path)
        )
        if where:
            frame = frame.where(where)
        ranks = " ".join(f"WHEN '{name}' THEN {rank}" for rank, name in enumerate(
            CHANGE_TYPE_ORDER))
        rank = F.expr(f"CASE {CHANGE_TYPE} {ranks} ELSE {len(CHANGE_TYPE_ORDER)} END")
        ordered = frame.orderBy(*[rank if c == CHANGE_TYPE else F.col(c) for c in order_by])
        total = int(frame.count())
        return total, (ordered.limit(limit) if limit else ordered).select(*columns).toArrow()

    def literal(self, value: str | int) -> str:
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        # Spark SQL reads backslash escapes in string literals.
        return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"

    def _frame(self, path: str, version: int | None, where: str | None) -> DataFrame:
        reader = self.spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        frame = reader.load(path)
        return frame.where(where) if where else frame


def table_reader(engine: str | None, spark: SparkSession | None = None) -> TableReader:
    """A reader on `engine` (one of ENGINES). None: Spark when a session is given (the caller
    already pays for its JVM), delta-rs otherwise. Spark's reader builds a session if needed."""
    if engine is None:
        engine = SPARK if spark is not None else DELTA_RS
    if engine == DELTA_RS:
        return DeltaRsReader()
    if engine == SPARK:
        if spark is None:
            from replicator.runtime.spark import build_session

            spark = build_session("replicator-read")
        return SparkReader(spark)
    raise ConfigError(f"unknown engine {engine!r}: choose one of {', '.join(ENGINES)}")


def _entry_of_commit_info(info: Mapping[str, Any]) -> HistoryEntry:
    """A delta-rs history dict as the HistoryEntry Spark's DESCRIBE HISTORY gives.

    delta-rs returns the log's commitInfo: the timestamp in epoch milliseconds, and operation
    parameters as written (Spark writes each as a JSON-encoded string; others may not).
    """
    return HistoryEntry(
        version=int(info["version"]),
        timestamp=datetime.fromtimestamp(int(info["timestamp"]) / 1000, UTC),
        operation=str(info.get("operation", "")),
        parameters=_string_map(info.get("operationParameters")),
        metrics=_string_map(info.get("operationMetrics")),
        user_metadata=info.get("userMetadata"),
    )


def _with_commit_file_times(path: str, entries: list[HistoryEntry]) -> list[HistoryEntry]:
    """`entries` timed as Spark times them: by their commit files' modification times.

    Delta's history and timestamp time travel use the commit file's modification time (made
    strictly increasing), not the writer's clock in commitInfo, which runs a little earlier.
    Only local files are looked at; on object stores the commitInfo time stays.
    """
    from dataclasses import replace

    if not on_local_filesystem(path):
        return entries
    log_dir = os.path.join(local_path(path), "_delta_log")
    timed: list[HistoryEntry] = []
    previous_ms = -1
    for entry in entries:
        try:
            stat = os.stat(os.path.join(log_dir, f"{entry.version:020d}.json"))
        except OSError:
            timed.append(entry)
            continue
        millis = max(stat.st_mtime_ns // 1_000_000, previous_ms + 1)
        previous_ms = millis
        timed.append(replace(entry, timestamp=datetime.fromtimestamp(millis / 1000, UTC)))
    return timed


def _without_views(table: _Tabular) -> _Tabular:
    """`table` with delta-rs's string and binary view columns cast to plain ones.

    Spark and most of pyarrow's kernels (take, sort) want the plain types.
    """
    import pyarrow as pa

    plain = {
        "string_view": pa.string(),
        "binary_view": pa.binary(),
    }
    fields = [
        field.with_type(plain.get(str(field.type), field.type)) for field in table.schema
    ]
    schema = pa.schema(fields, metadata=table.schema.metadata)
    return table if schema.equals(table.schema) else table.cast(schema)  # type: ignore[return-value]


def _ranked(rows: pa.Table) -> pa.Table:
    """`rows` with a column ranking each `_change_type` as CHANGE_TYPE_ORDER does."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if CHANGE_TYPE not in rows.column_names:
        return rows
    rank = pc.index_in(rows.column(CHANGE_TYPE), value_set=pa.array(CHANGE_TYPE_ORDER))
    return rows.append_column(_RANK, pc.fill_null(rank, len(CHANGE_TYPE_ORDER)))


def _sql_literal(value: Any) -> str:
    """`value` as a SQL literal both engines read alike (keys, names, numbers)."""
    if isinstance(value, bool) or value is None:
        raise ValueError(f"no SQL literal for {value!r} here")
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


def _string_map(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {
        str(k): v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))
        for k, v in value.items()
    }


def _check_scheme(path: str) -> None:
    scheme = urlparse(path).scheme
    # A one-letter scheme is a Windows drive, not a URI.
    if len(scheme) > 1 and scheme not in _DELTA_RS_SCHEMES:
        raise ConfigError(
            f"delta-rs cannot open {scheme}:// paths ({path}): use --engine spark"
        )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


__all__ = [
    "DELTA_RS", "ENGINES", "SPARK", "DeltaRsReader", "HistoryEntry", "SparkReader",
    "TableReader", "table_reader",
]
