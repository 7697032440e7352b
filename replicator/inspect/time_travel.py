"""The mirror at a point of its history: as of a table version or a time, as it stood at a source
seqno, and the change data feed between two points.

Spark DataFrames (`mirror_as_of`, `mirror_at_source_seqno`, `changes_between`), or Arrow through
either engine (`changes_table`). A point outside the history raises VersionOutOfRangeError, one
whose files VACUUM removed VersionVacuumedError (`replicator.inspect.mirror_history`).

>>> then = mirror_as_of(spark, "/data/mirror", timestamp="2026-01-30T00:00:00Z")  # doctest: +SKIP
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from replicator.errors import ConfigError
from replicator.inspect.mirror_history import MirrorHistory
from replicator.inspect.versions import first_version_from, parse_moment, version_at

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from replicator.inspect.mirror_history import SourceBoundary
    from replicator.inspect.versions import TableVersion


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


def _range_end(history: MirrorHistory, value: int | datetime | str, *, first: bool) -> int | None:
    if isinstance(value, bool):
        raise ConfigError(f"a change range end is a version or a timestamp, got {value!r}")
    if isinstance(value, int):
        return history.check_version(value)
    moment = parse_moment(value)
    if first:
        return first_version_from(history.versions, moment)
    return version_at(history.versions, moment)
