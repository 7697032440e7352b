"""Measurement 7: a one-vbucket rollback on a large mirror: its time and the files it touches.

On the mirror the initial load built, one more snapshot is committed to one vbucket through
the Delta layer (updates of existing documents and new ones), then that vbucket is rolled back
to its earlier boundary through the store a run uses (`DeltaMirrorStore.rollback`: write the
queued checkpoints, plan, rewrite), as the driver does when the producer answers ROLLBACK.
The rollback commit's add/remove/cdc actions are read from its log entry: every file it removed
(or marked with a deletion vector) must have held rows of that vbucket, and its operation
metrics say how many other rows it copied.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import pyarrow as pa

from replicator.delta.executor import CommitExecutor
from replicator.delta.ownership import OwnersTable
from replicator.delta.schema import DATA_COLUMNS, MirrorConfig
from replicator.delta.store import DeltaMirrorStore
from replicator.delta.table import MirrorTable, open_or_create
from replicator.errors import ReplicatorError
from replicator.model.mirror import RollbackRequest
from replicator.model.positions import FailoverLog, VbucketPosition
from replicator.pipeline.runner import CHECKPOINT_EVERY
from replicator.planning.planner import CommitBatch, CommitTrigger, VbucketCommit
from replicator.staging.rows import CHANGE_SCHEMA, UPSERT

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

OWNER_ID = "bench-rollback"


class RollbackBenchError(ReplicatorError):
    """The rollback measurement could not be set up or did not roll back."""


@dataclass(frozen=True, slots=True)
class FileActions:
    """The data files one Delta commit added and removed, and its change-data files."""

    added: tuple[str, ...]
    removed: tuple[str, ...]
    change_data: tuple[str, ...]
    operation_metrics: dict[str, str]

    def removed_only_from(self, files: Iterable[str]) -> bool:
        """True when the commit removed at least one file and only files among `files`
        (absolute paths or URIs; the log's paths are relative to the table)."""
        held = [unquote(f) for f in files]
        return bool(self.removed) and all(
            any(f.endswith("/" + PurePosixPath(p).as_posix()) for f in held) for p in self.removed
        )

    def rows_copied(self) -> int:
        """Rows the commit rewrote without changing them (0 with deletion vectors)."""
        return int(self.operation_metrics.get("numTargetRowsCopied", "0"))


@dataclass(frozen=True, slots=True)
class RollbackResult:
    """What rolling one vbucket back cost on a table of `table_rows` rows in `table_files`."""

    vbucket: int
    table_rows: int
    table_files: int
    vbucket_rows: int
    from_seqno: int
    to_seqno: int
    seconds: float
    files_added: int
    files_removed: int
    change_data_files: int
    files_only_holding_vbucket: bool
    rows_copied: int
    rows_restored: bool
    operation_metrics: dict[str, str]


def commit_file_actions(log_entry: str) -> FileActions:
    """Parse one `_delta_log/NNN.json` commit (pure): its add, remove and cdc paths."""
    added: list[str] = []
    removed: list[str] = []
    change_data: list[str] = []
    metrics: dict[str, str] = {}
    for line in log_entry.splitlines():
        if not line.strip():
            continue
        action: dict[str, Any] = json.loads(line)
        if "add" in action:
            added.append(unquote(action["add"]["path"]))
        elif "remove" in action:
            removed.append(unquote(action["remove"]["path"]))
        elif "cdc" in action:
            change_data.append(unquote(action["cdc"]["path"]))
        elif "commitInfo" in action:
            reported = action["commitInfo"].get("operationMetrics", {})
            metrics = {name: str(value) for name, value in reported.items()}
    return FileActions(tuple(added), tuple(removed), tuple(change_data), metrics)


def measure_rollback(
    spark: SparkSession, mirror_path: str, bucket: str, *, vbucket: int, changed_docs: int
) -> RollbackResult:
    """Commit one more snapshot to `vbucket`, roll it back, and report the rollback commit."""
    from pyspark.sql import functions as F

    if not Path(mirror_path, "_delta_log").is_dir():
        raise RollbackBenchError(f"{mirror_path} is not a local Delta table")
    mirror = open_or_create(spark, mirror_path, MirrorConfig(bucket))
    owners = OwnersTable.of(mirror)
    claim = owners.claim([vbucket], OWNER_ID)
    try:
        # The store and executor a run uses, so the rollback is timed as a run pays it: with the
        # checkpoints of its last commit still queued, and batches above the recovered ones.
        executor = CommitExecutor(mirror, claim, owners, checkpoint_every=CHECKPOINT_EVERY)
        store = DeltaMirrorStore(executor, owners, claim)
        # Recovery reads the vbucket's newest checkpoint: the boundary to return to.
        boundary = store.recover((vbucket,)).positions[vbucket]
        if boundary.seqno == 0:
            raise RollbackBenchError(f"vbucket {vbucket} has nothing committed to roll back")
        vbucket_rows = mirror.read().where(f"vbucket = {vbucket}").count()
        later = _later_snapshot(mirror, boundary, changed_docs)
        prepare = CommitBatch(store.next_batch_id, (later,), CommitTrigger.FORCED)
        store.commit(prepare, replace=frozenset())
        failover_log = FailoverLog.of([(boundary.vbucket_uuid, 0)])
        # Between the two boundaries: the producer forgot part of the later snapshot.
        rollback_seqno = (boundary.seqno + later.position.seqno) // 2
        started = time.perf_counter()
        [outcome] = store.rollback(
            [RollbackRequest(vbucket, rollback_seqno, later.position, failover_log, "benchmark")]
        )
        seconds = time.perf_counter() - started
    finally:
        owners.release(claim)
    if outcome.table_version is None:
        raise RollbackBenchError(f"vbucket {vbucket} was not rewound: a full resync is needed")
    version = outcome.table_version
    entry = Path(mirror_path, "_delta_log", f"{version:020d}.json").read_text()
    actions = commit_file_actions(entry)
    held = mirror.read(version - 1).where(mirror.data_layout.predicate([vbucket]))
    # One scan of the partition for both checks: its row count and its newest seqno.
    after = (
        mirror.read().where(f"vbucket = {vbucket}")
        .agg(F.count("*").alias("rows"), F.max("seqno").alias("max_seqno")).first()
    )  # fmt: skip
    detail = mirror.delta().detail().select("numFiles").first()
    return RollbackResult(
        vbucket=vbucket,
        table_rows=mirror.read().count(),
        table_files=int(detail["numFiles"]) if detail is not None else 0,
        vbucket_rows=vbucket_rows,
        from_seqno=later.position.seqno,
        to_seqno=outcome.position.seqno,
        seconds=seconds,
        files_added=len(actions.added),
        files_removed=len(actions.removed),
        change_data_files=len(actions.change_data),
        files_only_holding_vbucket=actions.removed_only_from(held.inputFiles()),
        rows_copied=actions.rows_copied(),
        rows_restored=(
            after is not None
            and after["rows"] == vbucket_rows
            and after["max_seqno"] is not None
            and int(after["max_seqno"]) <= boundary.seqno
        ),
        operation_metrics=actions.operation_metrics,
    )


def _later_snapshot(
    mirror: MirrorTable, boundary: VbucketPosition, changed_docs: int
) -> VbucketCommit:
    """A snapshot after `boundary`: half updates of stored documents, half new documents."""
    vbucket = boundary.vbucket
    stored = (
        mirror.read().where(f"vbucket = {vbucket}").select(*DATA_COLUMNS)
        .limit(changed_docs).toArrow()
    )  # fmt: skip
    if stored.num_rows == 0:
        raise RollbackBenchError(f"vbucket {vbucket} holds no rows to update")
    updates = stored.slice(0, max(1, changed_docs // 2))
    inserts = stored.slice(0, changed_docs - updates.num_rows)
    inserts = inserts.set_column(
        inserts.schema.get_field_index("key"),
        inserts.schema.field("key"),
        pa.array([f"{key}::bench-new" for key in inserts.column("key").to_pylist()]),
    )
    rows = pa.concat_tables([updates, inserts])
    seqnos = pa.array(range(boundary.seqno + 1, boundary.seqno + 1 + rows.num_rows), pa.int64())
    rows = rows.set_column(rows.schema.get_field_index("seqno"), rows.schema.field("seqno"), seqnos)
    rows = rows.append_column("op", pa.array([UPSERT] * rows.num_rows))
    table = rows.select(CHANGE_SCHEMA.names).cast(CHANGE_SCHEMA)
    end = boundary.seqno + rows.num_rows
    return VbucketCommit(
        vbucket=vbucket,
        position=VbucketPosition.at_boundary(
            vbucket, boundary.vbucket_uuid, end,
            purge_seqno=boundary.purge_seqno, manifest_uid=boundary.manifest_uid,
        ),
        previous_seqno=boundary.seqno,
        first_load=False,
        snapshot_start=boundary.seqno + 1,
        snapshot_count=1,
        tables=(table,),
        spill_files=(),
        row_count=table.num_rows,
        byte_count=table.nbytes,
        staged_run_ids=(0,),
    )  # fmt: skip
