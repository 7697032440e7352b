"""The history table (`--history`): every revision change streams deliver, kept beside the mirror.

Delta has no multi-table transactions, so a batch's revisions are appended *before* the data
commit that applies them, under the same (owner_id, batch_id). A revision counts once the
mirror holds a commit of that batch: readers join on the mirror's commits and skip the rest,
and a restart removes the rows of the batches that never committed (their ids are reused).
A rollback appends a marker row first, in the same way; the revisions it discarded stay, and
readers mark them as the rolled-back branch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

from replicator.delta.conflicts import retry_on_conflict
from replicator.delta.schema import HISTORY_SCHEMA, ROLLBACK_OP, MirrorConfig
from replicator.delta.table import (
    SESSION_WRITE_LOCK,
    MirrorTable,
    create_if_missing,
    has_commits,
    now_utc,
)
from replicator.staging.rows import CHANGE_SCHEMA

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

HISTORY_ROLE = "history"


class HistoryTable:
    """Appends to the history table at `path` (created by `ensure`)."""

    def __init__(self, spark: SparkSession, path: str) -> None:
        self.spark = spark
        self.path = path

    @classmethod
    def of(cls, mirror: MirrorTable) -> HistoryTable:
        return cls(mirror.spark, mirror.layout.history)

    def ensure(self, config: MirrorConfig) -> None:
        """Create the table when it does not exist yet."""
        properties = config.metadata_table_properties(HISTORY_ROLE)
        retry_on_conflict(
            lambda: create_if_missing(self.spark, self.path, HISTORY_SCHEMA, properties),
            what=f"creating the history table {self.path}",
        )

    def append(self, revisions: pa.Table, *, owner_id: str, batch_id: int, part: int) -> int:
        """Append `revisions` (CHANGE_SCHEMA rows) of one commit; returns the row count."""
        if revisions.num_rows == 0:
            return 0
        if not revisions.schema.equals(CHANGE_SCHEMA):
            raise ValueError(f"history revisions must have CHANGE_SCHEMA, got {revisions.schema}")
        count = int(revisions.num_rows)
        rows = revisions.add_column(0, "owner_id", pa.array([owner_id] * count, pa.string()))
        rows = rows.add_column(1, "batch_id", pa.array([batch_id] * count, pa.int64()))
        rows = rows.add_column(2, "part", pa.array([part] * count, pa.int32()))
        rows = rows.append_column(
            "recorded_at", pa.array([now_utc()] * count, pa.timestamp("us", tz="UTC"))
        )
        self._append(rows)
        return count

    def record_rollbacks(
        self, to_seqnos: Mapping[int, int], *, owner_id: str, batch_id: int
    ) -> None:
        """Mark that each vbucket of `to_seqnos` goes back to its seqno in batch `batch_id`
        (before its commit, which is the batch's part 0): one append for a whole failover."""
        vbuckets = sorted(to_seqnos)
        count = len(vbuckets)
        if not count:
            return
        marker: dict[str, Sequence[object]] = {
            name: [None] * count for name in HISTORY_SCHEMA.fieldNames()
        }
        marker.update(
            owner_id=[owner_id] * count, batch_id=[batch_id] * count, part=[0] * count,
            vbucket=vbuckets, scope=[""] * count, collection=[""] * count,
            collection_id=[-1] * count, key=[""] * count, rev_seqno=[0] * count, cas=[0] * count,
            seqno=[to_seqnos[vb] for vb in vbuckets],
            is_json=[False] * count, op=[ROLLBACK_OP] * count, recorded_at=[now_utc()] * count,
        )  # fmt: skip
        self._append(pa.table(marker, schema=_arrow_schema()))

    def forget_uncommitted(self, owner_id: str, from_batch: int) -> None:
        """Remove `owner_id`'s rows of batches `from_batch` and above: none of them committed.

        Run on a restart before the first batch: those ids are used again. Files whose
        batch_id statistics lie below `from_batch` are skipped unread.
        """
        from delta.tables import DeltaTable

        if not has_commits(self.spark, self.path):
            return
        quoted = owner_id.replace("'", "''")

        def delete() -> None:
            with SESSION_WRITE_LOCK:
                DeltaTable.forPath(self.spark, self.path).delete(
                    f"owner_id = '{quoted}' AND batch_id >= {int(from_batch)}"
                )

        retry_on_conflict(delete, what=f"removing uncommitted history rows of owner {owner_id!r}")

    def _append(self, rows: pa.Table) -> None:
        frame = self.spark.createDataFrame(rows, HISTORY_SCHEMA)

        def append() -> None:
            with SESSION_WRITE_LOCK:
                frame.write.format("delta").mode("append").save(self.path)

        retry_on_conflict(append, what=f"appending to the history table {self.path}")


def _arrow_schema() -> pa.Schema:
    return pa.schema(
        [
            pa.field("owner_id", pa.string(), nullable=False),
            pa.field("batch_id", pa.int64(), nullable=False),
            pa.field("part", pa.int32(), nullable=False),
            *CHANGE_SCHEMA,
            pa.field("recorded_at", pa.timestamp("us", tz="UTC"), nullable=False),
        ]
    )
