"""The driver's store of the Delta layer: the pipeline's MirrorStore, made of delta's parts.

It ties the executor, the owners table, the compactor, recovery and rollback together behind
the few calls the replication driver makes (`replicator.pipeline.replication.MirrorStore`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from replicator.errors import ConfigError
from replicator.model.mirror import RecoveredMirror, RollbackOutcome
from replicator.model.positions import FailoverLog, VbucketPosition
from replicator.planning.planner import CommitBatch, without_vbucket

if TYPE_CHECKING:
    from replicator.delta.compaction import Compactor
    from replicator.delta.executor import CommitExecutor
    from replicator.delta.ownership import OwnerClaim, OwnersTable
    from replicator.delta.retention import MetadataPruner
    from replicator.delta.table import MirrorTable

log = logging.getLogger(__name__)


class DeltaMirrorStore:
    """The driver's view of the Delta layer: recover, commit, roll back, heartbeat.

    Owns the batch counter: group commits, rollbacks and resyncs each take the next id, which
    is the Delta txnVersion of their commits, so it only ever grows. After a group commit it
    compacts the owner's partitions when due (`compactor`), on the same thread, so compaction
    never races its own MERGEs; after a checkpoints flush it prunes the owner's vbuckets' rows
    of the checkpoints and failover logs tables when due (`pruner`), so they stay the size of
    their vbuckets.
    """

    def __init__(
        self,
        executor: CommitExecutor,
        owners: OwnersTable,
        claim: OwnerClaim,
        *,
        compactor: Compactor | None = None,
        pruner: MetadataPruner | None = None,
    ) -> None:
        self._executor = executor
        self._owners = owners
        self._claim = claim
        self._compactor = compactor
        self._pruner = pruner
        self.next_batch_id = 1
        self._resync_reasons: dict[int, str] = {}
        """Why each vbucket awaiting a full resync needs it: recorded with its REPLACE commit."""

    @property
    def mirror(self) -> MirrorTable:
        return self._executor.mirror

    def recover(self, vbuckets: tuple[int, ...]) -> RecoveredMirror:
        from replicator.delta.recovery import recover

        state = recover(self.mirror, owner_id=self._claim.owner_id, vbuckets=vbuckets)
        if state.repaired_versions:
            log.info("repaired checkpoints of table versions %s from the table history",
                     list(state.repaired_versions))
        self.next_batch_id = state.next_batch_id
        self._executor.new_batches_from = state.next_batch_id
        if self._executor.history is not None:
            # Rows of batches that never committed; their ids are used again from here.
            self._executor.history.forget_uncommitted(self._claim.owner_id, state.next_batch_id)
        return RecoveredMirror(state.positions, state.failover_logs, state.next_batch_id)

    def save_failover_logs(self, logs: Mapping[int, FailoverLog]) -> None:
        from replicator.delta.failover_logs import FailoverLogsTable

        FailoverLogsTable.of(self.mirror).save(logs)

    def commit(self, batch: CommitBatch, *, replace: frozenset[int]) -> int:
        """Commit a planned batch; vbuckets in `replace` (resyncs) replace all their rows."""
        from replicator.delta.rollback import replace_vbucket

        steady = batch
        for vbucket in sorted(replace & set(batch.vbuckets)):
            steady = without_vbucket(steady, vbucket)
        if not steady.is_empty:
            self._executor.execute(dataclasses.replace(steady, batch_id=self.next_batch_id))
            self.next_batch_id += 1
        for vbucket in sorted(replace & set(batch.vbuckets)):
            replace_vbucket(
                self._executor, batch.commit_for(vbucket), batch_id=self.next_batch_id,
                reason=self._resync_reasons.pop(vbucket, "full resync"),
            )
            self.next_batch_id += 1
        if self._compactor is not None:
            if all(commit.first_load for commit in batch.commits):
                self._compactor.note_appended()  # appends write healthy files
            else:
                self._compactor.compact_if_due()
        # Checked only right after a flush (the table grows by flushes; the check reads its
        # snapshot), and not in a first load, whose few commits are the run's busiest.
        if self._pruner is not None and not self._executor.queued_commits and not all(
            commit.first_load for commit in batch.commits
        ):
            self._pruner.prune_if_due()
        return self.next_batch_id

    def rollback(
        self,
        vbucket: int,
        rollback_seqno: int,
        *,
        committed: VbucketPosition,
        failover_log: FailoverLog | None,
        reason: str,
    ) -> RollbackOutcome:
        from replicator.delta.checkpoints import with_queued
        from replicator.delta.rollback import plan_rollback, rewind_horizon, rollback_vbucket

        if failover_log is None:
            raise ConfigError(f"vbucket {vbucket}: a rollback needs the producer's failover log")
        if committed.seqno <= rollback_seqno and rollback_seqno > 0:
            # Nothing committed above the rollback point: the mirror already stands there.
            position = VbucketPosition.at_boundary(
                vbucket, failover_log.entry_at(committed.seqno).vbucket_uuid, committed.seqno,
                purge_seqno=committed.purge_seqno, manifest_uid=committed.manifest_uid,
            )
            return RollbackOutcome(vbucket, position, full_resync=False, table_version=None)
        # The queued checkpoints count without a checkpoints commit first (0.5 s of a rollback).
        checkpoints = with_queued(
            self._executor.checkpoints.for_vbucket(vbucket), self._executor.queued_commits, vbucket
        )
        plan = plan_rollback(checkpoints, vbucket, rollback_seqno, horizon=0)
        if plan.boundary is not None:  # is the boundary it chose still readable?
            horizon = rewind_horizon(self.mirror, plan.boundary)
            plan = plan_rollback(checkpoints, vbucket, rollback_seqno, horizon)
        outcome = rollback_vbucket(
            self._executor, plan, batch_id=self.next_batch_id, failover_log=failover_log,
            reason=reason,
        )
        if outcome.commit is not None:
            self.next_batch_id += 1
            return RollbackOutcome(
                vbucket, outcome.position, full_resync=False,
                table_version=outcome.commit.table_version,
            )
        self._resync_reasons[vbucket] = f"{reason}; {outcome.reason}"
        log.warning("vbucket %d: %s", vbucket, self._resync_reasons[vbucket])
        return RollbackOutcome(vbucket, outcome.position, full_resync=True, table_version=None)

    def heartbeat(self) -> None:
        """Renew the claim, and write the checkpoints queued since the last flush."""
        self._executor.flush_checkpoints()
        self._owners.heartbeat(self._claim)

    def release(self) -> None:
        try:
            self._executor.flush_checkpoints()
        finally:
            self._owners.release(self._claim)
