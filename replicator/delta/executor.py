"""Applying a CommitBatch to the data table: the named write strategies and exactly-once commits.

- APPEND: vbuckets with nothing committed (first load): deduplicated upserts, appended.
- MERGE: steady state: deduplicated changes merged on (vbucket, collection_id, key), the
  condition led by literal partition and vbucket predicates (`DataLayout.predicate`), the only
  predicates Delta's MERGE prunes files by.
- REPLACE: some vbuckets' rows made equal to a given set (rollback to a version, a failover's
  vbuckets in one commit; full resync): the difference (changed rows, deletes of rows not in
  the set) is MERGEd, so deletion vectors mark the old rows and no other row is copied.

A batch mixing first-load and steady vbuckets becomes two commits (append part 0, merge part 1),
each with its own positions and txnVersion. Every commit carries the Delta txn ids of its owner
and batch, so a batch applied twice commits once, and `CommitMetadata` as userMetadata, so the
data commit is the point of truth the checkpoints table is repaired from. Checkpoint rows are
queued for several commits (`checkpoint_every`): one Delta commit per batch on the hot path.

Shards (replicators owning disjoint vbuckets) write one table at once. Every write names its
partitions with literals, so shards owning whole partitions touch disjoint files and Delta's
conflict check (WriteSerializable) lets them all through. A conflict that does happen (shards
sharing a partition, a racing table-creation or metadata change) is retried with backoff,
re-checking the claim first: the write is rebuilt against the new table version, and its txn
ids make an attempt that did land count once.

Over 500 lines on purpose: the three strategies share one exactly-once path (`_commit`,
`_write`, `_retrying`), the first-load guard and the checkpoint queue; the rows they write are
built elsewhere (`changes`, `arrow_append`, `rollback`).
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from replicator.config import FIRST_LOAD_WRITERS, STEADY_WRITERS
from replicator.delta.arrow_append import (
    AppendedCommit,
    ArrowAppender,
    arrow_appender_for,
    first_load_batches,
    streamable,
)
from replicator.delta.changes import (
    change_rows,
    dropped_collection_rows,
    replacement_source,
    union_frames,
)
from replicator.delta.checkpoints import CheckpointsTable
from replicator.delta.commit_metadata import COMMIT, CommitMetadata, txn_app_id
from replicator.delta.conflicts import (
    FENCING_CONFLICTS,
    RETRIED_CONFLICTS,
    ConflictRetry,
    delta_conflict_name,
    retry_on_conflict,
)
from replicator.delta.dv_merge import (
    DeletionVectorMerger,
    dv_merge_refusal,
    dv_mergeable,
    steady_changes,
)
from replicator.delta.failover_logs import FailoverLogsTable, carried_failover_logs
from replicator.delta.log_checkpoints import checkpoint_if_due, wait_for_checkpoints
from replicator.delta.ownership import OwnerClaim, OwnersTable
from replicator.delta.schema import DATA_COLUMNS
from replicator.delta.table import (
    SESSION_WRITE_LOCK,
    CommitRecord,
    MirrorTable,
    delta_snapshot,
    delta_write_confs,
    engine_error_summary,
    last_commit_version,
    now_utc,
    only_created,
    reset_last_commit_version,
)
from replicator.delta.writer_process import WriterProcess
from replicator.errors import OwnershipConflict, ReplicatorError
from replicator.model.aliases import FaultHook
from replicator.model.positions import VbucketPosition
from replicator.planning.planner import CommitBatch, VbucketCommit, history_revisions
from replicator.staging.rows import DELETE, UPSERT

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession

    from replicator.delta.history import HistoryTable


FAULT_STEPS = ("before_data_commit", "after_data_commit", "after_checkpoint")
"""Steps at which the fault hook is called, in order, for each data commit. `after_checkpoint`
comes once the commit's checkpoint rows are written or queued for the next flush."""

class WriteStrategy(enum.Enum):
    """How a commit writes its rows (named as dbt-spark names its incremental strategies)."""

    APPEND = "append"
    MERGE = "merge"
    REPLACE = "replace"


class CommitFailed(ReplicatorError):
    """A data commit could not be made; the message names the batch and the engine's reason."""


@dataclass(frozen=True, slots=True)
class DataCommit:
    """One data table commit of a batch: its version, strategy, and the positions it reached.

    `already_committed` is True when the commit was found made by an earlier attempt (a re-run
    of the same batch), so nothing was written this time.
    """

    batch_id: int
    part: int
    kind: str
    strategy: WriteStrategy
    table_version: int
    positions: Mapping[int, VbucketPosition]
    already_committed: bool = False
    table_files: int | None = None
    """Files in the table at `table_version`, when the writer said (Arrow appends)."""

    @property
    def vbuckets(self) -> tuple[int, ...]:
        return tuple(sorted(self.positions))


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """What applying a CommitBatch did: one or two data commits."""

    batch_id: int
    commits: tuple[DataCommit, ...] = field(default_factory=tuple)

    @property
    def positions(self) -> dict[int, VbucketPosition]:
        """Each vbucket's committed position after the batch."""
        return {vb: p for commit in self.commits for vb, p in commit.positions.items()}


class CommitExecutor:
    """Commits batches for one owner of a set of vbuckets into one mirror.

    `fault_hook`, when given, is called with each name of FAULT_STEPS as a commit passes it;
    tests raise from it to simulate a crash at that point. `checkpoint_every` data commits
    share one checkpoints commit (1: each writes its own at once); `flush_checkpoints` writes
    what is queued (read the table `with_queued` before then). Batches numbered
    `new_batches_from` or above are known never to have been committed (recovery says so), so
    they skip the look-up of an earlier attempt in the table history. With a `history` table,
    the revisions of HISTORY snapshots are appended to it before the data commit that applies
    them (see replicator.delta.history).
    """

    def __init__(
        self,
        mirror: MirrorTable,
        claim: OwnerClaim,
        owners: OwnersTable,
        *,
        fault_hook: FaultHook | None = None,
        conflict_retry: ConflictRetry | None = None,
        pause: Callable[[float], None] = time.sleep,
        checkpoint_every: int = 1,
        history: HistoryTable | None = None,
        first_load_writer: str = "auto",
        steady_writer: str = "deletion-vectors",
        row_images: bool = True,
        writer_process: bool = False,
    ) -> None:
        if checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be at least 1, got {checkpoint_every}")
        if first_load_writer not in FIRST_LOAD_WRITERS:
            raise ValueError(f"first_load_writer must be one of {FIRST_LOAD_WRITERS}")
        if steady_writer not in STEADY_WRITERS:
            raise ValueError(f"steady_writer must be one of {STEADY_WRITERS}")
        self.mirror = mirror
        self.claim = claim
        self.owners = owners
        self.checkpoints = CheckpointsTable.of(mirror)
        self._fault_hook = fault_hook
        self.conflict_retry = conflict_retry or ConflictRetry()
        self._pause = pause
        self.checkpoint_every = checkpoint_every
        self.history = history
        self.new_batches_from: int | None = None
        self._queued_checkpoints: list[CommitRecord] = []
        self._landed_commit: CommitRecord | None = None
        self._landed_files: int | None = None
        self.first_load_writer = first_load_writer
        self._appender: ArrowAppender | None = None
        self._appender_decided = False
        self.steady_writer = steady_writer
        self.row_images = row_images
        self.writer_process = writer_process
        self._merger: DeletionVectorMerger | WriterProcess | None = None
        self._empty_vbuckets: set[int] | None = None
        """Claimed vbuckets known to hold no rows (None until a first load asks): only this
        owner writes them, and every write of ours takes its vbuckets out."""
        self.conflicts_retried = 0
        """Commits (data or checkpoints) Delta refused for a concurrent commit and retried."""

    @property
    def spark(self) -> SparkSession:
        return self.mirror.spark

    def execute(self, batch: CommitBatch) -> BatchOutcome:
        """Apply a batch: APPEND its first-load vbuckets, MERGE the others; checkpoint each.

        Re-running a batch that was (partly) committed commits nothing twice and completes the
        missing part and checkpoints.
        """
        if batch.is_empty:
            return BatchOutcome(batch.batch_id)
        self._check_claimed(batch.vbuckets, f"batch {batch.batch_id}")
        first_loads = [c for c in batch.commits if c.first_load]
        steady = [c for c in batch.commits if not c.first_load]
        commits = []
        if first_loads:
            commits.append(
                self._commit(
                    batch.batch_id,
                    0,
                    COMMIT,
                    WriteStrategy.APPEND,
                    {c.vbucket: c.position for c in first_loads},
                    lambda metadata: self._append(first_loads, metadata),
                    details={"trigger": batch.trigger.name.lower()},
                    before_write=self._history_of(first_loads),
                )
            )
        if steady:
            commits.append(
                self._commit(
                    batch.batch_id,
                    1,
                    COMMIT,
                    WriteStrategy.MERGE,
                    {c.vbucket: c.position for c in steady},
                    lambda metadata: self._merge(steady, metadata),
                    details={"trigger": batch.trigger.name.lower()},
                    before_write=self._history_of(steady),
                )
            )
        return BatchOutcome(batch.batch_id, tuple(commits))

    def replace_rows(
        self,
        positions: Mapping[int, VbucketPosition],
        rows: DataFrame | pa.Table,
        *,
        batch_id: int,
        kind: str,
        rewound_to: Mapping[int, int],
        details: Mapping[str, Any] | None = None,
        revised: Sequence[VbucketCommit] = (),
    ) -> DataCommit:
        """REPLACE strategy: make `rows` (data columns) all the rows of `positions`' vbuckets.

        One commit, for rollbacks (rows of older versions, already on the driver when few; a
        failover's vbuckets together) and a full resync (a complete stream from 0: keys not in
        `rows` disappear). Only the difference is MERGEd (`replacement_source`). With a history
        table, rollback markers (each vbucket of `rewound_to` goes back to its seqno) and the
        history revisions of `revised` are appended first.
        """
        vbuckets = sorted(positions)
        if not vbuckets or any(p.vbucket != vb for vb, p in positions.items()):
            raise ValueError(f"positions must name their own vbuckets, got {positions}")
        self._check_claimed(vbuckets, f"{kind} of vbuckets {vbuckets}")

        def write(metadata: CommitMetadata) -> None:
            self._merge_source(replacement_source(self.mirror, rows, vbuckets), vbuckets, metadata)

        return self._commit(
            batch_id, 0, kind, WriteStrategy.REPLACE, positions, write, details=details,
            before_write=self._history_of(revised, rewound_to=rewound_to),
        )

    def change_rows(self, commits: Sequence[VbucketCommit]) -> DataFrame:
        """The staged changes of `commits`, one row per document (see changes.change_rows)."""
        return change_rows(self.spark, commits)

    def _history_of(
        self, commits: Sequence[VbucketCommit], *, rewound_to: Mapping[int, int] | None = None
    ) -> Callable[[CommitMetadata], None] | None:
        """What appends to the history table before a commit: rollback markers (vbucket -> the
        seqno it goes back to), then `commits`' history revisions. None: nothing to append."""
        history = self.history
        if history is None or (
            not rewound_to and not any(commit.history_ranges for commit in commits)
        ):
            return None

        def append(metadata: CommitMetadata) -> None:
            owner_id, batch_id = metadata.owner_id, metadata.batch_id
            if rewound_to:
                history.record_rollbacks(rewound_to, owner_id=owner_id, batch_id=batch_id)
            history.append(
                history_revisions(commits), owner_id=owner_id, batch_id=batch_id,
                part=metadata.part,
            )

        return append

    # -- strategies -------------------------------------------------------------------------

    def _append(
        self, commits: Sequence[VbucketCommit], metadata: CommitMetadata
    ) -> AppendedCommit | None:
        vbuckets = [c.vbucket for c in commits]
        holding = self._vbuckets_with_rows(vbuckets)
        if holding:
            raise CommitFailed(
                f"batch {metadata.batch_id}: vbuckets {holding} are marked first load but hold "
                "rows; a vbucket rolled back to 0 must be reloaded with replace_vbucket"
            )
        appender = self.arrow_appender()
        if appender is not None and streamable(commits):
            return appender.append(first_load_batches(commits), metadata)
        frame = self.change_rows(commits).where(f"op = '{UPSERT}'").select(*DATA_COLUMNS)
        with SESSION_WRITE_LOCK:
            (
                frame.write.format("delta")
                .mode("append")
                .option("txnAppId", txn_app_id(metadata.owner_id))
                .option("txnVersion", metadata.txn_version)
                .option("userMetadata", metadata.to_json())
                .save(self.mirror.layout.data)
            )
        return None

    def arrow_appender(self) -> ArrowAppender | None:
        """The Arrow appender of first loads, or None when they go through Spark (decided
        once, at the first append)."""
        if not self._appender_decided:
            self._appender = arrow_appender_for(
                self.mirror.layout.data, self.mirror.data_layout, self.first_load_writer
            )
            self._appender_decided = True
        return self._appender

    def _merge(
        self, commits: Sequence[VbucketCommit], metadata: CommitMetadata
    ) -> AppendedCommit | None:
        merger = self._deletion_vector_merger()
        if merger is not None and dv_mergeable(commits):
            before = merger.conflicts
            try:
                return merger.merge(steady_changes(commits), metadata)
            finally:
                self.conflicts_retried += merger.conflicts - before
        source = union_frames(
            [self.change_rows(commits), *dropped_collection_rows(self.mirror, commits)]
        )
        self._merge_source(source, [c.vbucket for c in commits], metadata)
        return None

    def steady_writer_if_decided(self) -> DeletionVectorMerger | WriterProcess | None:
        """The replicator's own steady writer once a steady batch has chosen it (None before,
        or when Spark MERGEs): compactions go through it, in its process."""
        return self._merger

    def close(self) -> None:
        """End the steady writer's child process, if it has one, and wait for the Delta
        checkpoint being written (between commits)."""
        merger, self._merger = self._merger, None
        if isinstance(merger, WriterProcess):
            merger.close()
        if not wait_for_checkpoints(self.mirror.layout.data):
            log.warning("the Delta checkpoint of %s is still being written",
                        self.mirror.layout.data)  # fmt: skip

    def _deletion_vector_merger(self) -> DeletionVectorMerger | WriterProcess | None:
        """The writer of steady batches as deletion vectors, or None when Spark MERGEs them
        (decided once, at the first steady batch)."""
        if self.steady_writer == "spark":
            return None
        if self._merger is None:
            path, layout = self.mirror.layout.data, self.mirror.data_layout
            refusal = dv_merge_refusal(path, layout)
            if refusal is not None:
                log.info("steady batches are MERGEd by Spark: %s", refusal)
                self.steady_writer = "spark"
                return None
            log.info("steady batches are committed as deletion vectors and new files%s",
                     " (in a process of its own)" if self.writer_process else "")  # fmt: skip
            self._merger = (
                WriterProcess(path, layout, row_images=self.row_images) if self.writer_process
                else DeletionVectorMerger(path, layout, row_images=self.row_images)
            )  # fmt: skip
        return self._merger

    def _merge_source(
        self, source: DataFrame, vbuckets: Sequence[int], metadata: CommitMetadata
    ) -> None:
        """MERGE change rows (CHANGE_SCHEMA, one per document) into `vbuckets`' rows."""
        condition = (
            f"{self.mirror.data_layout.predicate(vbuckets, alias='t')} "
            "AND t.vbucket = s.vbucket AND t.collection_id = s.collection_id AND t.key = s.key"
        )
        columns: dict[str, str | Column] = {name: f"s.{name}" for name in DATA_COLUMNS}
        with delta_write_confs(
            self.spark,
            user_metadata=metadata.to_json(),
            app_id=txn_app_id(metadata.owner_id),
            version=metadata.txn_version,
        ):
            (
                self.mirror.delta()
                .alias("t")
                .merge(source.alias("s"), condition)
                .whenMatchedDelete(condition=f"s.op = '{DELETE}'")
                .whenMatchedUpdate(condition=f"s.op = '{UPSERT}'", set=columns)
                .whenNotMatchedInsert(condition=f"s.op = '{UPSERT}'", values=columns)
                .execute()
            )

    # -- the commit protocol ----------------------------------------------------------------

    def _commit(
        self,
        batch_id: int,
        part: int,
        kind: str,
        strategy: WriteStrategy,
        positions: Mapping[int, VbucketPosition],
        write: Callable[[CommitMetadata], AppendedCommit | None],
        *,
        details: Mapping[str, Any] | None = None,
        before_write: Callable[[CommitMetadata], None] | None = None,
    ) -> DataCommit:
        metadata = CommitMetadata(
            kind=kind,
            batch_id=batch_id,
            part=part,
            owner_id=self.claim.owner_id,
            strategy=strategy.value,
            positions=dict(positions),
            details=dict(details or {}),
        )
        what = f"batch {batch_id} part {part} ({strategy.value} of vbuckets {sorted(positions)})"
        record = table_files = None
        if self.new_batches_from is None or batch_id < self.new_batches_from:
            record = self.mirror.find_commit(metadata.owner_id, batch_id, part, recent_only=True)
        already_committed = record is not None
        if record is None:
            self.owners.verify(self.claim)
            if before_write is not None:
                before_write(metadata)
            self._step("before_data_commit")
            try:
                self._retrying(what, lambda: self._write(write, metadata), fence=True)
            except ReplicatorError:
                raise
            except Exception as exc:
                raise CommitFailed(f"{what} failed: {engine_error_summary(exc)}") from exc
            finally:
                if self._empty_vbuckets is not None:  # written, or perhaps written
                    self._empty_vbuckets.difference_update(positions)
            record = self._landed_commit or self.mirror.find_commit(
                metadata.owner_id, batch_id, part
            )
            if record is self._landed_commit:
                table_files = self._landed_files
            if record is None:
                raise CommitFailed(
                    f"batch {batch_id} part {part}: Delta accepted the write but its commit is "
                    "not in the table history (was the txn id committed by another writer?)"
                )
        self._step("after_data_commit")
        self._queued_checkpoints.append(record)
        if len(self._queued_checkpoints) >= self.checkpoint_every:
            self.flush_checkpoints()
        self._step("after_checkpoint")
        return _data_commit(record, strategy, already_committed, table_files)

    def _write(
        self, write: Callable[[CommitMetadata], AppendedCommit | None], metadata: CommitMetadata
    ) -> None:
        """Run `write`, noting the commit it made (None when Delta skipped it as a duplicate).

        `write` returns what it committed when it did not commit through Spark."""
        self._landed_commit = None
        self._landed_files = None
        with SESSION_WRITE_LOCK:
            reset_last_commit_version(self.spark)
            appended = write(metadata)
            version = last_commit_version(self.spark)
        if appended is not None:
            self._landed_commit = CommitRecord(appended.version, appended.committed_at, metadata)
            self._landed_files = appended.table_files
            checkpoint_if_due(self.spark, self.mirror.layout.data, appended.version)
        elif version is not None:
            self._landed_commit = CommitRecord(version, self._commit_time(version), metadata)

    def _commit_time(self, version: int) -> datetime:
        """When version `version` was committed, from Delta's snapshot (no Spark job); the
        clock when another writer's commit already followed it."""
        snapshot = delta_snapshot(self.spark, self.mirror.layout.data)
        if int(snapshot.version()) != version:
            return now_utc()
        return datetime.fromtimestamp(int(snapshot.timestamp()) / 1000, tz=UTC)

    def flush_checkpoints(self) -> None:
        """Write the queued commits' checkpoint rows (their rollbacks' failover logs first)."""
        queued = list(self._queued_checkpoints)
        if not queued:
            return
        FailoverLogsTable.of(self.mirror).save_timed(carried_failover_logs(queued))
        self._retrying(
            f"checkpoints of batches {queued[0].metadata.batch_id}-{queued[-1].metadata.batch_id}",
            lambda: self.checkpoints.record(queued),
            fence=False,
        )
        del self._queued_checkpoints[: len(queued)]

    @property
    def queued_commits(self) -> tuple[CommitRecord, ...]:
        """Data commits whose checkpoint rows are not written yet (see `with_queued`)."""
        return tuple(self._queued_checkpoints)

    def _retrying(self, what: str, action: Callable[[], None], *, fence: bool) -> None:
        """Run a commit through retry_on_conflict, counting retries.

        With `fence`, the claim is verified before each retry: a conflict may mean a rival
        writes our vbuckets, and then we must stop, not overwrite it.
        """

        def before_retry() -> None:
            self.conflicts_retried += 1
            if fence:
                self.owners.verify(self.claim)

        try:
            retry_on_conflict(
                action, what=what, policy=self.conflict_retry, before_retry=before_retry,
                pause=self._pause,
            )
        except FENCING_CONFLICTS as exc:
            raise OwnershipConflict(
                f"{what}: another process committed with owner id "
                f"{self.claim.owner_id!r} at the same time ({delta_conflict_name(exc)}); two "
                "replicators own the same vbuckets. Stop one of them"
            ) from exc
        except RETRIED_CONFLICTS as exc:
            raise CommitFailed(
                f"{what}: still conflicting with concurrent commits after "
                f"{self.conflict_retry.attempts} attempts ({delta_conflict_name(exc)}); is "
                "something else (OPTIMIZE, another writer) rewriting these vbuckets' partitions?"
            ) from exc

    def _step(self, name: str) -> None:
        if self._fault_hook is not None:
            self._fault_hook(name)

    def _check_claimed(self, vbuckets: Iterable[int], what: str) -> None:
        foreign = sorted(set(vbuckets) - self.claim.vbuckets)
        if foreign:
            raise OwnershipConflict(
                f"{what} touches vbuckets {foreign} that owner {self.claim.owner_id!r} "
                "has not claimed"
            )

    def _vbuckets_with_rows(self, vbuckets: Sequence[int]) -> list[int]:
        """Which of `vbuckets` hold rows in the table.

        One scan of every claimed vbucket at the first ask (none on a new mirror), then only of
        vbuckets written since: a scan per append would read the table again for each batch of
        an initial load, its cost growing with what was loaded before.
        """
        if self._empty_vbuckets is None:
            claimed = sorted(self.claim.vbuckets)
            with_rows = (
                set() if only_created(self.spark, self.mirror.layout.data)
                else set(self._scan_vbuckets_with_rows(claimed))
            )
            self._empty_vbuckets = set(claimed) - with_rows
        unknown = [vb for vb in vbuckets if vb not in self._empty_vbuckets]
        return self._scan_vbuckets_with_rows(unknown) if unknown else []

    def _scan_vbuckets_with_rows(self, vbuckets: Sequence[int]) -> list[int]:
        rows = (
            self.mirror.read()
            .where(self.mirror.data_layout.predicate(vbuckets))
            .select("vbucket")
            .distinct()
            .collect()
        )
        return sorted(int(row["vbucket"]) for row in rows)


def _data_commit(
    record: CommitRecord, strategy: WriteStrategy, already: bool, table_files: int | None = None
) -> DataCommit:
    metadata = record.metadata
    return DataCommit(
        batch_id=metadata.batch_id,
        part=metadata.part,
        kind=metadata.kind,
        strategy=strategy,
        table_version=record.version,
        positions=dict(metadata.positions),
        already_committed=already,
        table_files=table_files,
    )
