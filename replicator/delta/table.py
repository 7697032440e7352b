"""The mirror on storage: open or create it, read its history, write to it safely.

One module past 500 lines on purpose: the handle, the creation and validation of the tables and
the log probes both rest on are one concern, the mirror's storage (conflicts and their retries
are in conflicts.py).

`open_or_create` is the one entry point: it creates the data table and the replicator's own
tables at a fresh path, and refuses (NotAMirrorError) a path that holds anything else. Engine
errors on the way become errors.* with a one-line cause, never a JVM stack trace.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from replicator.delta.commit_metadata import CommitMetadata
from replicator.delta.conflicts import ConflictRetry, retry_on_conflict
from replicator.delta.schema import (
    BUCKET_PROPERTY,
    CHECKPOINT_SCHEMA,
    DATA_SCHEMA,
    FAILOVER_LOG_SCHEMA,
    FORMAT_VERSION,
    GROUP_WIDTH_PROPERTY,
    METADATA_DIR,
    OWNER_SCHEMA,
    VBUCKET_GROUP,
    DataLayout,
    MirrorConfig,
    MirrorLayout,
    check_mirror_properties,
)
from replicator.errors import ConfigError, NotAMirrorError

if TYPE_CHECKING:
    from delta.tables import DeltaTable
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"
USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"
LAST_COMMIT_VERSION_CONF = "spark.databricks.delta.lastCommitVersionInSession"
"""Where Delta leaves the version of the session's latest commit."""

SESSION_WRITE_LOCK = threading.RLock()
"""Held around every Delta write of this package: the txn and userMetadata confs are
session-wide, so two threads writing at once would stamp each other's commits."""

_RECENT_HISTORY = 64
"""How many recent commits to search first for a commit just made (others may have landed)."""


@contextlib.contextmanager
def delta_write_confs(
    spark: SparkSession,
    *,
    user_metadata: str,
    app_id: str | None = None,
    version: int | None = None,
) -> Iterator[None]:
    """Set the commit-metadata (and, given both, idempotency) confs for the writes inside.

    DML (MERGE, UPDATE, DELETE) only takes these from the session; they must never outlive the
    write, or an unrelated write would be skipped or mislabelled. Holds SESSION_WRITE_LOCK.
    """
    confs = {USER_METADATA_CONF: user_metadata}
    if app_id is not None and version is not None:
        confs[TXN_APP_ID_CONF] = app_id
        confs[TXN_VERSION_CONF] = str(version)
    with SESSION_WRITE_LOCK:
        for key, value in confs.items():
            spark.conf.set(key, value)
        try:
            yield
        finally:
            for key in confs:
                spark.conf.unset(key)


def engine_error_summary(exc: BaseException) -> str:
    """The first line of an engine exception's own message, without the JVM stack trace."""
    text = ""
    java_exception = getattr(exc, "java_exception", None)
    if java_exception is not None:
        with contextlib.suppress(Exception):
            text = str(java_exception.toString())
    if not text:
        get_message = getattr(exc, "getMessage", None)
        if callable(get_message):
            with contextlib.suppress(Exception):
                text = str(get_message())
    if not text:
        text = str(exc)
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
    return first[:500]


UNREADABLE_VERSION_MARKERS = (
    "FILE_NOT_EXIST",
    "FileNotFoundException",
    "DELTA_FILE_NOT_FOUND",
    "VERSION_NOT_FOUND",
    "VersionNotFound",
    "Cannot time travel",
    "DELTA_TIME_TRAVEL",
    "DELTA_CHANGE_DATA_FILE_NOT_FOUND",
)
"""What the engines' errors say when an old version's log entries, data files or change data
are gone (VACUUM or log cleanup): rollback then resyncs, and the audit says which versions are
still readable."""


def is_unreadable_version(exc: BaseException) -> bool:
    """The error (or one it was raised from) says an old version's log or files are gone, not
    some other failure."""
    seen: BaseException | None = exc
    while seen is not None:
        text = engine_error_summary(seen) + " " + str(seen)[:4000]
        if any(marker in text for marker in UNREADABLE_VERSION_MARKERS):
            return True
        seen = seen.__cause__
    return False


@dataclass(frozen=True, slots=True)
class CommitRecord:
    """A commit of the data table made by the replicator: its version, time and metadata."""

    version: int
    timestamp: datetime
    metadata: CommitMetadata


class MirrorTable:
    """Handle on one mirror: the data table and the replicator's tables beside it.

    `data_layout` is how the data table is partitioned (read from its log when not given).
    """

    def __init__(
        self,
        spark: SparkSession,
        layout: MirrorLayout,
        config: MirrorConfig,
        data_layout: DataLayout | None = None,
    ) -> None:
        self.spark = spark
        self.layout = layout
        self.config = config
        self._data_layout = data_layout

    @property
    def data_layout(self) -> DataLayout:
        if self._data_layout is None:
            properties, partitioning = table_properties_and_partitioning(
                self.spark, self.layout.data
            )
            self._data_layout = _data_layout(self.layout.data, properties, partitioning)
        return self._data_layout

    def delta(self) -> DeltaTable:
        """The data table as a DeltaTable (fresh: sees the latest commit)."""
        from delta.tables import DeltaTable

        return DeltaTable.forPath(self.spark, self.layout.data)

    def read(self, version: int | None = None) -> DataFrame:
        """The mirrored documents, at `version` when given (time travel)."""
        reader = self.spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        return reader.load(self.layout.data)

    def version(self) -> int:
        """The latest version of the data table."""
        return table_version(self.spark, self.layout.data)

    def find_commit(
        self, owner_id: str, batch_id: int, part: int, *, recent_only: bool = False
    ) -> CommitRecord | None:
        """The replicator commit of (owner, batch, part), searched in recent history first.

        `recent_only` stops after the recent commits: enough to spot a batch re-run at once
        (an older duplicate is still skipped by Delta's txn ids), without reading the whole log.
        """
        for limit in (_RECENT_HISTORY,) if recent_only else (_RECENT_HISTORY, None):
            records = self._commits(limit, owner_id=owner_id, batch_id=batch_id, part=part)
            if records:
                return records[-1]
        return None

    def commits_after(self, floors: Mapping[str, int]) -> list[CommitRecord]:
        """Replicator commits, oldest first, newer than their owner's floor version.

        Owners missing from `floors` contribute all their commits. Spark drops everything at or
        below the lowest floor, so the driver only receives recent commits' metadata.
        """
        from pyspark.sql import functions as F

        if only_created(self.spark, self.layout.data):
            return []  # a new mirror: no history to read
        history = self._history_with_owner(None)
        if floors:
            history = history.where(
                (F.col("version") > min(floors.values())) | ~F.col("owner").isin(sorted(floors))
            )
        return [
            record
            for record in self._records(history)
            if record.version > floors.get(record.metadata.owner_id, -1)
        ]

    def commit_timestamps(self, since_version: int = 0) -> list[tuple[int, datetime]]:
        """(version, timestamp) of every commit from `since_version` on still in the log, oldest
        first. History reads one log file per commit, and the log keeps a month of them: only
        the newest ones are read (with slack for commits other writers land meanwhile; missing
        one only makes the caller more cautious)."""
        history = self.delta().history(max(self.version() - since_version, 0) + 64)
        rows = (
            history.where(f"version >= {int(since_version)}").select("version", "timestamp")
            .orderBy("version").collect()
        )  # fmt: skip
        return [(int(r["version"]), as_utc(r["timestamp"])) for r in rows]

    def _history_with_owner(self, limit: int | None) -> DataFrame:
        from pyspark.sql import functions as F

        delta = self.delta()
        history = delta.history(limit) if limit is not None else delta.history()
        return (
            history.select("version", "timestamp", "userMetadata")
            .where(F.get_json_object("userMetadata", "$.replicator") == str(FORMAT_VERSION))
            .withColumn("owner", F.get_json_object("userMetadata", "$.owner"))
        )

    def _commits(
        self, limit: int | None, *, owner_id: str, batch_id: int, part: int
    ) -> list[CommitRecord]:
        from pyspark.sql import functions as F

        history = self._history_with_owner(limit).where(
            (F.col("owner") == owner_id)
            & (F.get_json_object("userMetadata", "$.batch") == str(batch_id))
            & (F.get_json_object("userMetadata", "$.part") == str(part))
        )
        return self._records(history)

    @staticmethod
    def _records(history: DataFrame) -> list[CommitRecord]:
        records = []
        for row in history.select("version", "timestamp", "userMetadata").collect():
            metadata = CommitMetadata.from_json(row["userMetadata"])
            if metadata is not None:
                records.append(
                    CommitRecord(int(row["version"]), as_utc(row["timestamp"]), metadata)
                )
        return sorted(records, key=lambda record: record.version)


def as_utc(value: datetime) -> datetime:
    # PySpark hands timestamps back as naive local time.
    return value.astimezone(UTC) if value.tzinfo is None else value


def now_utc() -> datetime:
    """The current time, timezone-aware (what every table's timestamps are written from)."""
    return datetime.now(UTC)


def open_or_create(spark: SparkSession, path: str, config: MirrorConfig) -> MirrorTable:
    """Open the mirror of `config.bucket` at `path`, creating it when the path is new or empty.

    Raises NotAMirrorError when the path holds non-Delta files, a Delta table that is not a
    mirror, or a mirror of another bucket; ConfigError when the path cannot be written. An
    existing mirror whose retention properties differ from `config` gets `config`'s (logged).

    >>> config = MirrorConfig("travel-sample")
    >>> mirror = open_or_create(spark, "/data/travel", config)  # doctest: +SKIP
    """
    layout = MirrorLayout(path)
    data_layout = config.new_layout

    def open_tables() -> None:
        nonlocal data_layout
        data_layout = _ensure_data_table(spark, layout, config)
        for role, table_path, schema in (
            ("checkpoints", layout.checkpoints, CHECKPOINT_SCHEMA),
            ("failover_logs", layout.failover_logs, FAILOVER_LOG_SCHEMA),
            ("owners", layout.owners, OWNER_SCHEMA),
        ):
            create_if_missing(spark, table_path, schema, config.metadata_table_properties(role))

    try:
        # Shards started together race to create the tables; the loser's next pass finds
        # them made and validates them.
        retry_on_conflict(
            open_tables, what=f"opening the mirror at {path}", policy=ConflictRetry(attempts=3)
        )
    except (NotAMirrorError, ConfigError):
        raise
    except Exception as exc:
        raise ConfigError(
            f"cannot open or create the mirror at {path}: {engine_error_summary(exc)}"
        ) from None
    return MirrorTable(spark, layout, config, data_layout)


def _ensure_data_table(
    spark: SparkSession, layout: MirrorLayout, config: MirrorConfig
) -> DataLayout:

    path = layout.data
    if not has_commits(spark, path):
        foreign = _foreign_entries(spark, path)
        if foreign:
            shown = ", ".join(sorted(foreign)[:5])
            raise NotAMirrorError(
                f"{path} is not a Delta table but holds other files ({shown}); "
                "point the mirror at a new or empty directory"
            )
        try:
            _create_data_table(spark, path, config)
        except Exception:
            # Another replicator may have created it at the same moment; validate theirs.
            if not has_commits(spark, path):
                raise
    properties, data_layout = _validate_data_table(spark, path, config)
    _apply_retention(spark, path, properties, config)
    return data_layout


RETENTION_PROPERTIES = ("delta.deletedFileRetentionDuration", "delta.logRetentionDuration")
"""Data table properties that follow the configuration on every open, not only at creation:
rollback computes its time-travel horizon from the configured values, so the table must keep
files and log entries for exactly as long."""


def _apply_retention(
    spark: SparkSession, path: str, properties: Mapping[str, str], config: MirrorConfig
) -> None:
    """Set the configured retention properties on an existing data table where they differ."""
    wanted = config.data_table_properties()
    changed = {
        key: wanted[key] for key in RETENTION_PROPERTIES if properties.get(key) != wanted[key]
    }
    if not changed:
        return
    assignments = ", ".join(
        f"'{key}' = '{value.replace(chr(39), chr(39) * 2)}'" for key, value in changed.items()
    )
    quoted_path = path.replace("`", "``")
    # The session's txn and userMetadata confs must not leak into this commit.
    with SESSION_WRITE_LOCK:
        spark.sql(f"ALTER TABLE delta.`{quoted_path}` SET TBLPROPERTIES ({assignments})")
    log.info(
        "mirror at %s: retention set from the configuration: %s",
        path,
        ", ".join(f"{key} {properties.get(key)!r} -> {value!r}" for key, value in changed.items()),
    )


def _create_data_table(spark: SparkSession, path: str, config: MirrorConfig) -> None:
    from delta.tables import DeltaTable

    layout = config.new_layout
    assert layout.group_width is not None
    builder = (
        DeltaTable.createIfNotExists(spark)
        .location(path)
        .addColumns(DATA_SCHEMA)
        # Generated, so that every writer (ours, or a user's repair) fills it the same way.
        .addColumn(
            VBUCKET_GROUP, "INT", nullable=False,
            generatedAlwaysAs=layout.generation_expression(),
        )
        .partitionedBy(VBUCKET_GROUP)
        .comment(f"Mirror of Couchbase bucket {config.bucket}, maintained by replicator")
    )
    properties = {
        **config.data_table_properties(),
        GROUP_WIDTH_PROPERTY: str(layout.group_width),
    }
    for key, value in properties.items():
        builder = builder.property(key, value)
    builder.execute()


def _validate_data_table(
    spark: SparkSession, path: str, config: MirrorConfig
) -> tuple[Mapping[str, str], DataLayout]:
    """Check that `path` is this bucket's mirror; return its properties and layout."""
    properties, partitioning = table_properties_and_partitioning(spark, path)
    check_mirror_properties(path, properties, bucket=config.bucket, writing=True)
    return properties, _data_layout(path, properties, partitioning)


def _data_layout(
    path: str, properties: Mapping[str, str], partitioning: list[str]
) -> DataLayout:
    """The layout of the mirror at `path`: grouped, or one partition per vbucket (older)."""
    width = properties.get(GROUP_WIDTH_PROPERTY)
    if partitioning == [VBUCKET_GROUP] and width is not None and width.isdigit():
        return DataLayout(int(width))
    if partitioning == ["vbucket"] and width is None:
        return DataLayout(None)
    raise NotAMirrorError(
        f"{path} claims to mirror {properties.get(BUCKET_PROPERTY)!r} but is partitioned by "
        f"{partitioning} (group width {width}), not as replicator lays a mirror out; it was "
        "not created by replicator"
    )


def last_commit_version(spark: SparkSession) -> int | None:
    """The version of the session's latest Delta commit, None if it made none since the reset.

    Call with SESSION_WRITE_LOCK held around the write and the read, after
    `reset_last_commit_version`: the value is session-wide.
    """
    value = spark.conf.get(LAST_COMMIT_VERSION_CONF, None)
    return None if value is None else int(value)


def reset_last_commit_version(spark: SparkSession) -> None:
    spark.conf.unset(LAST_COMMIT_VERSION_CONF)


def create_if_missing(
    spark: SparkSession, path: str, schema: StructType, properties: Mapping[str, str]
) -> None:
    from delta.tables import DeltaTable

    # A commit file is proof enough: loading the snapshot to ask Delta would cost a Spark job
    # per table on every start, and the table's first real read checks it anyway.
    if has_commits(spark, path):
        return
    builder = DeltaTable.createIfNotExists(spark).location(path).addColumns(schema)
    for key, value in properties.items():
        builder = builder.property(key, value)
    try:
        builder.execute()
    except Exception:
        if not has_commits(spark, path):
            raise


def has_commits(spark: SparkSession, path: str) -> bool:
    """Whether `path` itself is the root of a Delta table: its `_delta_log` holds a commit.

    One filesystem listing, where is_delta_table_at loads the table's snapshot. Delta never
    deletes a table's newest commit file, so a table always has one.
    """
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    log_dir, filesystem = _hadoop_path(spark, f"{path.rstrip('/')}/_delta_log")
    if not filesystem.exists(log_dir):
        return False
    # A filter on the listing, not a glob of the whole path: `[` or `{` in `path` is literal.
    commit_files = jvm.org.apache.hadoop.fs.GlobFilter(f"{'[0-9]' * 20}.json")
    return len(filesystem.listStatus(log_dir, commit_files)) > 0


def delta_snapshot(spark: SparkSession, path: str) -> Any:
    """Delta's snapshot of the table at `path`, brought up to date (a JVM Snapshot).

    Updating lists the log and reads the newest checksum file: no Spark job, unlike
    DeltaTable.detail() and history(). Its version is -1 when `path` has no Delta table.
    Python's Delta API has no such call, so this goes through Delta's DeltaLog class.
    """
    return _delta_log(spark).forTableWithSnapshot(spark._jsparkSession, path)._2()


def _delta_log(spark: SparkSession) -> Any:
    """Delta's DeltaLog class, `spark` made this thread's active session first.

    Delta computes a snapshot's state with Spark jobs when no checksum file holds it (versions
    committed without Spark have none), and looks the session up on the calling thread: the
    commit thread may have run no Spark operation, and the default session goes when another
    session stops.
    """
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
    return jvm.org.apache.spark.sql.delta.DeltaLog


DELTA_CHECKPOINT_INTERVAL = 10
"""Delta's default `delta.checkpointInterval`: Spark checkpoints after its own commits whose
version is a multiple of it."""


def checkpoint_delta_log(spark: SparkSession, path: str) -> None:
    """Write Delta's checkpoint of the table's newest version, as Spark does after its own
    commits: for versions committed without Spark (Arrow appends, deletion-vector merges)."""
    pair = _delta_log(spark).forTableWithSnapshot(spark._jsparkSession, path)
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    pair._1().checkpoint(pair._2(), jvm.scala.Option.empty())


def table_version(spark: SparkSession, path: str) -> int:
    """The newest version of the Delta table at `path`, -1 when there is none."""
    return int(delta_snapshot(spark, path).version())


def only_created(spark: SparkSession, path: str) -> bool:
    """Whether the table at `path` is at its first version and that version holds no file.

    A reader of such a table can answer "nothing" without a Spark job: on a new mirror that
    spares the start of every run a read of each table (a job apiece, a second or more on 2
    cores). The answer comes from the version's checksum file, which Delta writes with each
    commit; a table created with rows (older mirrors wrote some that way), or without a
    checksum, is read as usual.
    """
    snapshot = delta_snapshot(spark, path)
    if int(snapshot.version()) != 0:
        return False
    checksum = snapshot.checksumOpt()
    return bool(checksum.isDefined()) and int(checksum.get().numFiles()) == 0


def table_properties_and_partitioning(
    spark: SparkSession, path: str
) -> tuple[dict[str, str], list[str]]:
    """The table properties and partition columns of the Delta table at `path`, from its log."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    metadata = delta_snapshot(spark, path).metadata()
    converters = jvm.scala.jdk.javaapi.CollectionConverters
    properties = {str(k): str(v) for k, v in converters.asJava(metadata.configuration()).items()}
    partitioning = [str(column) for column in converters.asJava(metadata.partitionColumns())]
    return properties, partitioning


def is_delta_table_at(spark: SparkSession, path: str) -> bool:
    """Whether `path` itself is the root of a Delta table.

    DeltaTable.isDeltaTable also answers True for any directory inside a table, which is
    exactly where the replicator's own tables live.
    """
    from delta.tables import DeltaTable

    return path_exists(spark, f"{path.rstrip('/')}/_delta_log") and DeltaTable.isDeltaTable(
        spark, path
    )


def _foreign_entries(spark: SparkSession, path: str) -> list[str]:
    """Names at `path` other than our metadata directory; [] when it does not exist."""
    hadoop_path, filesystem = _hadoop_path(spark, path)
    if not filesystem.exists(hadoop_path):
        return []
    if not filesystem.getFileStatus(hadoop_path).isDirectory():
        return [path]
    names = [str(status.getPath().getName()) for status in filesystem.listStatus(hadoop_path)]
    return [name for name in names if name != METADATA_DIR]


def path_exists(spark: SparkSession, path: str) -> bool:
    """Whether a file exists, through Hadoop's filesystem (works for local paths and URIs)."""
    hadoop_path, filesystem = _hadoop_path(spark, path)
    return bool(filesystem.exists(hadoop_path))


def _hadoop_path(spark: SparkSession, path: str) -> tuple[Any, Any]:
    """`path` as a Hadoop Path, with the FileSystem that serves it (JVM objects)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    filesystem = hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())  # type: ignore[union-attr]
    return hadoop_path, filesystem
