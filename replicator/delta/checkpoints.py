"""The checkpoints table: where each data commit left each vbucket it touched.

Written after the data commits, in commits of its own (Delta has no multi-table transactions),
one for several data commits when the executor queues them: it can lag the data table by those
commits after a crash, and recovery repairs it from the data commits' metadata. Appends are
idempotent: they carry the owner's txnAppId and the newest data commit's txnVersion.

On the local filesystem delta-rs commits the appends, in this process: a few thousand rows
every heartbeat, which Spark's append took 1 to 1.5 s of the commit thread to write (its fixed
costs, not the rows). Elsewhere, or with `spark_appends`, Spark appends them.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema

from replicator.delta.commit_metadata import txn_app_id
from replicator.delta.conflicts import DeltaRsConflict, delta_rs_conflicts
from replicator.delta.paths import newest_table, on_local_filesystem
from replicator.delta.schema import CHECKPOINT_SCHEMA, in_list
from replicator.delta.table import (
    SESSION_WRITE_LOCK,
    CommitRecord,
    MirrorTable,
    as_utc,
    delta_snapshot,
    only_created,
)
from replicator.model.positions import VbucketPosition

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame, SparkSession

CHECKPOINT_COLUMNS = tuple(field.name for field in CHECKPOINT_SCHEMA.fields)


ARROW_CHECKPOINT_SCHEMA = to_arrow_schema(CHECKPOINT_SCHEMA)
"""CHECKPOINT_SCHEMA as delta-rs appends it (PySpark's own conversion: decimal(20, 0) uuids,
microsecond UTC timestamps, NOT NULL kept)."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One vbucket's committed position as of data table version `table_version`."""

    owner_id: str
    batch_id: int
    table_version: int
    kind: str
    position: VbucketPosition
    committed_at: datetime

    @property
    def vbucket(self) -> int:
        return self.position.vbucket

    @property
    def seqno(self) -> int:
        return self.position.seqno


@dataclass(frozen=True, slots=True)
class CheckpointsOverview:
    """What a restart needs of the checkpoints table, read in one Spark job.

    `newest_versions` and `newest_batches` are per owner (as newest_versions_by_owner and
    newest_batch answer); `latest` has the newest checkpoint of each requested vbucket that has
    one (as latest answers).
    """

    newest_versions: Mapping[str, int]
    newest_batches: Mapping[str, int]
    latest: Mapping[int, Checkpoint]


class CheckpointsTable:
    """Reads and appends rows of the checkpoints table at `path`."""

    def __init__(self, spark: SparkSession, path: str, *, spark_appends: bool = False) -> None:
        self.spark = spark
        self.path = path
        self._by_delta_rs = not spark_appends and on_local_filesystem(path)
        self._table: DeltaTable | None = None

    @classmethod
    def of(cls, mirror: MirrorTable, *, spark_appends: bool = False) -> CheckpointsTable:
        """The checkpoints table of a mirror."""
        return cls(mirror.spark, mirror.layout.checkpoints, spark_appends=spark_appends)

    def record(self, commits: Sequence[CommitRecord]) -> None:
        """Append one row per vbucket of each data commit, one append per owner.

        A no-op for an owner whose newest commit here is recorded already: commits are
        recorded in order, never skipping one, so the newest txnVersion speaks for them all.
        """
        by_owner: dict[str, list[CommitRecord]] = {}
        for commit in commits:
            by_owner.setdefault(commit.metadata.owner_id, []).append(commit)
        for owner_id, owned in sorted(by_owner.items()):
            rows = [
                (
                    owner_id,
                    commit.metadata.batch_id,
                    commit.version,
                    commit.metadata.kind,
                    position.vbucket,
                    Decimal(position.vbucket_uuid),
                    position.seqno,
                    position.snapshot_start,
                    position.snapshot_end,
                    position.purge_seqno,
                    position.manifest_uid,
                    commit.timestamp,
                )
                for commit in owned
                for position in sorted(commit.metadata.positions.values(), key=lambda p: p.vbucket)
            ]
            version = max(c.metadata.txn_version for c in owned)
            if self._by_delta_rs:
                self._append_by_delta_rs(rows, txn_app_id(owner_id), version)
                continue
            # One file per append: a list becomes one partition per core (two here, dozens
            # on a cluster), each a file of a few rows that every later read opens.
            frame = self.spark.createDataFrame(rows, CHECKPOINT_SCHEMA).coalesce(1)
            with SESSION_WRITE_LOCK:
                (
                    frame.write.format("delta")
                    .mode("append")
                    .option("txnAppId", txn_app_id(owner_id))
                    .option("txnVersion", version)
                    .save(self.path)
                )

    def _append_by_delta_rs(
        self, rows: Sequence[tuple[Any, ...]], app_id: str, version: int
    ) -> None:
        """Append `rows` in one file, unless `version` of `app_id` is recorded already (as
        Spark's append skips it)."""
        from deltalake import write_deltalake
        from deltalake.transaction import CommitProperties, Transaction

        table = self._current_table()
        recorded = table.transaction_version(app_id)
        if recorded is not None and recorded >= version:
            return
        columns = zip(CHECKPOINT_COLUMNS, zip(*rows, strict=True), strict=True)
        data = pa.table(dict(columns), schema=ARROW_CHECKPOINT_SCHEMA)
        try:
            with delta_rs_conflicts("appending checkpoints"):
                write_deltalake(
                    table, data, mode="append",
                    commit_properties=CommitProperties(
                        app_transactions=[Transaction(app_id=app_id, version=version)]
                    ),
                )  # fmt: skip
        except DeltaRsConflict:
            self._table = None  # read afresh at the next attempt
            raise

    def read(self) -> DataFrame:
        return self.spark.read.format("delta").load(self.path)

    def live_files(self) -> int:
        """The table's files now. From delta-rs when it appends: Delta's snapshot of a version
        Spark did not commit has no checksum, and counting its files is a Spark job."""
        if not self._by_delta_rs:
            return int(delta_snapshot(self.spark, self.path).numOfFiles())
        return len(self._current_table().file_uris())

    def _current_table(self) -> DeltaTable:
        self._table = newest_table(self._table, self.path)
        return self._table

    def latest(self, vbuckets: Iterable[int] | None = None) -> dict[int, Checkpoint]:
        """The newest checkpoint (highest table version) of each vbucket that has one."""
        frame = self.read()
        if vbuckets is not None:
            wanted = sorted(set(vbuckets))
            if not wanted:
                return {}
            frame = frame.where(in_list("vbucket", wanted))
        rows = _newest_per_vbucket(frame).collect()
        return {int(row["vbucket"]): checkpoint_of_row(row) for row in rows}

    def overview(self, vbuckets: Iterable[int]) -> CheckpointsOverview:
        """Every owner's newest version and batch, and the latest checkpoint of `vbuckets`.

        One job instead of three: a restart used to pay newest_versions_by_owner, latest and
        newest_batch one after the other.
        """
        from pyspark.sql import functions as F

        wanted = sorted(set(vbuckets))
        if only_created(self.spark, self.path):
            return CheckpointsOverview(newest_versions={}, newest_batches={}, latest={})
        frame = self.read()
        by_owner = (
            frame.groupBy("owner_id")
            .agg(F.max("table_version").alias("table_version"), F.max("batch_id").alias("batch_id"))
            .withColumn("per_owner", F.lit(True))
        )
        in_wanted = frame.where(in_list("vbucket", wanted))
        newest = _newest_per_vbucket(in_wanted).withColumn("per_owner", F.lit(False))
        rows = by_owner.unionByName(newest, allowMissingColumns=True).collect()
        owner_rows = [row for row in rows if row["per_owner"]]
        return CheckpointsOverview(
            newest_versions={str(r["owner_id"]): int(r["table_version"]) for r in owner_rows},
            newest_batches={str(r["owner_id"]): int(r["batch_id"]) for r in owner_rows},
            latest={
                int(row["vbucket"]): checkpoint_of_row(row) for row in rows if not row["per_owner"]
            },
        )

    def for_vbucket(self, vbucket: int) -> list[Checkpoint]:
        """Every checkpoint of one vbucket, oldest (lowest table version) first."""
        return self.for_vbuckets([vbucket])[vbucket]

    def for_vbuckets(self, vbuckets: Collection[int]) -> dict[int, list[Checkpoint]]:
        """Every checkpoint of each of `vbuckets` (one read), oldest first."""
        wanted = sorted(set(vbuckets))
        found: dict[int, list[Checkpoint]] = {vb: [] for vb in wanted}
        if wanted:
            for row in self.read().where(in_list("vbucket", wanted)).collect():
                checkpoint = checkpoint_of_row(row)
                found[checkpoint.vbucket].append(checkpoint)
        return {vb: _oldest_first(checkpoints) for vb, checkpoints in found.items()}

    def newest_versions_by_owner(self) -> dict[str, int]:
        """For each owner, the newest data table version it has checkpoints for."""
        from pyspark.sql import functions as F

        rows = self.read().groupBy("owner_id").agg(F.max("table_version").alias("v")).collect()
        return {str(row["owner_id"]): int(row["v"]) for row in rows}

    def newest_batch(self, owner_id: str) -> int | None:
        """The highest batch id an owner has checkpoints for, None if it has none."""
        from pyspark.sql import functions as F

        row = self.read().where(F.col("owner_id") == owner_id).agg(F.max("batch_id")).first()
        value = row[0] if row is not None else None
        return None if value is None else int(value)


def newest_per_vbucket(rows: pa.Table) -> dict[int, Checkpoint]:
    """The newest checkpoint of each vbucket in Arrow `rows` of the table (pure).

    What CheckpointsTable.latest answers, for rows another engine read. The table gains a row
    per vbucket per commit, so the choice is made in Arrow and only the winners become objects.
    """
    import numpy as np

    if rows.num_rows == 0:
        return {}
    vbuckets = rows.column("vbucket").to_numpy()
    # Newest first within each vbucket: lexsort's last key is the primary one.
    order = np.lexsort((
        -rows.column("batch_id").to_numpy(), -rows.column("table_version").to_numpy(), vbuckets,
    ))  # fmt: skip
    ordered = vbuckets[order]
    firsts = order[np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))]
    return {int(row["vbucket"]): checkpoint_of_row(row) for row in rows.take(firsts).to_pylist()}


def newest_versions_per_owner(rows: pa.Table) -> dict[str, int]:
    """For each owner in Arrow `rows`, its newest table version (newest_versions_by_owner)."""
    if rows.num_rows == 0:
        return {}
    grouped = rows.group_by("owner_id").aggregate([("table_version", "max")])
    return {
        str(owner): int(version)
        for owner, version in zip(
            grouped.column("owner_id").to_pylist(),
            grouped.column("table_version_max").to_pylist(),
            strict=True,
        )
    }


def _newest_per_vbucket(frame: DataFrame) -> DataFrame:
    """The row of each vbucket with the highest table version (then batch id)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    newest_first = Window.partitionBy("vbucket").orderBy(
        F.col("table_version").desc(), F.col("batch_id").desc()
    )
    return (
        frame.withColumn("rank", F.row_number().over(newest_first))
        .where(F.col("rank") == 1)
        .drop("rank")
    )


def checkpoints_of_commit(commit: CommitRecord) -> list[Checkpoint]:
    """The checkpoints `CheckpointsTable.record` writes for one data commit (pure)."""
    return [
        Checkpoint(
            owner_id=commit.metadata.owner_id,
            batch_id=commit.metadata.batch_id,
            table_version=commit.version,
            kind=commit.metadata.kind,
            position=position,
            committed_at=commit.timestamp,
        )
        for position in sorted(commit.metadata.positions.values(), key=lambda p: p.vbucket)
    ]


def with_queued(
    written: Iterable[Checkpoint], queued: Iterable[CommitRecord], vbuckets: Collection[int]
) -> dict[int, list[Checkpoint]]:
    """Each of `vbuckets`' checkpoints as they will be once the `queued` commits are recorded
    (pure).

    A commit recorded already (a flush that landed before its queue was cleared) counts once.
    Oldest (lowest table version) first, as `CheckpointsTable.for_vbuckets` answers.
    """
    wanted = set(vbuckets)
    merged: dict[int, dict[tuple[str, int, int], Checkpoint]] = {vb: {} for vb in wanted}
    for checkpoint in written:
        if checkpoint.vbucket in wanted:
            merged[checkpoint.vbucket][_identity(checkpoint)] = checkpoint
    for commit in queued:
        if wanted.isdisjoint(commit.metadata.positions):
            continue
        for checkpoint in checkpoints_of_commit(commit):
            if checkpoint.vbucket in wanted:
                merged[checkpoint.vbucket].setdefault(_identity(checkpoint), checkpoint)
    return {vb: _oldest_first(found.values()) for vb, found in merged.items()}


def _identity(checkpoint: Checkpoint) -> tuple[str, int, int]:
    return checkpoint.owner_id, checkpoint.batch_id, checkpoint.table_version


def _oldest_first(checkpoints: Iterable[Checkpoint]) -> list[Checkpoint]:
    return sorted(checkpoints, key=lambda c: (c.table_version, c.batch_id))


def checkpoint_of_row(row: Any) -> Checkpoint:
    """A Checkpoint from a row of the table (a Spark Row or a dict of its columns)."""
    position = VbucketPosition(
        int(row["vbucket"]),
        int(row["vbucket_uuid"]),
        int(row["seqno"]),
        int(row["snapshot_start"]),
        int(row["snapshot_end"]),
        int(row["purge_seqno"]),
        int(row["manifest_uid"]),
    )
    return Checkpoint(
        owner_id=str(row["owner_id"]),
        batch_id=int(row["batch_id"]),
        table_version=int(row["table_version"]),
        kind=str(row["kind"]),
        position=position,
        committed_at=as_utc(row["committed_at"]),
    )
