"""The driver's store of the Delta layer: the pipeline's MirrorStore, made of delta's parts.

It ties the executor, the owners table, the compactor, recovery and rollback together behind
the few calls the replication driver makes (`replicator.pipeline.replication.MirrorStore`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from replicator.errors import ConfigError
from replicator.model.mirror import RecoveredMirror, RollbackOutcome, RollbackRequest
from replicator.model.positions import FailoverLog, VbucketPosition
from replicator.planning.planner import CommitBatch, without_vbucket

if TYPE_CHECKING:
    from replicator.delta.compaction import Compactor
    from replicator.delta.executor import CommitExecutor, DataCommit
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
        from replicator.delta.rollback import replace_vbuckets

        resyncs = sorted(replace & set(batch.vbuckets))
        steady = batch
        for vbucket in resyncs:
            steady = without_vbucket(steady, vbucket)
        last: DataCommit | None = None
        if resyncs:
            # First: a vbucket awaiting a resync holds rows known to be wrong, and the steady
            # part's MERGE may take long enough for a crash to postpone the repair again.
            last = replace_vbuckets(
                self._executor, [batch.commit_for(vb) for vb in resyncs],
                batch_id=self.next_batch_id,
                reasons={vb: self._resync_reasons.get(vb, "full resync") for vb in resyncs},
            )
            for vbucket in resyncs:
                self._resync_reasons.pop(vbucket, None)
            self.next_batch_id += 1
        if not steady.is_empty:
            numbered = dataclasses.replace(steady, batch_id=self.next_batch_id)
            outcome = self._executor.execute(numbered)
            last = outcome.commits[-1] if outcome.commits else last
            self.next_batch_id += 1
        if self._compactor is not None:
            if all(commit.first_load for commit in batch.commits):
                # Appends write healthy files; the table's files as the last commit's writer
                # counted them, whatever its kind (recounted when it did not count them).
                self._compactor.note_appended(last.table_files if last else None)
            else:
                self._compactor.compact_if_due(last.table_files if last else None)
        # Checked only right after a flush (the table grows by flushes; the check reads its
        # snapshot), and not in a first load, whose few commits are the run's busiest.
        if self._pruner is not None and not self._executor.queued_commits and not all(
            commit.first_load for commit in batch.commits
        ):
            self._pruner.prune_if_due()
        return self.next_batch_id

    def rollback(self, requests: Sequence[RollbackRequest]) -> list[RollbackOutcome]:
        """Roll the requests' vbuckets back, those that rewind in one commit (a failover's).

        Outcomes in the order of `requests`.
        """
        from replicator.delta.checkpoints import with_queued
        from replicator.delta.rollback import plan_rollback, rewind_horizon, rollback_vbuckets

        outcomes: dict[int, RollbackOutcome] = {}
        to_plan: list[RollbackRequest] = []
        for request in requests:
            vbucket, committed, history = request.vbucket, request.committed, request.failover_log
            if history is None:
                raise ConfigError(
                    f"vbucket {vbucket}: a rollback needs the producer's failover log"
                )
            if committed.seqno <= request.rollback_seqno and request.rollback_seqno > 0:
                # Nothing committed above the rollback point: the mirror already stands there.
                position = VbucketPosition.at_boundary(
                    vbucket, history.entry_at(committed.seqno).vbucket_uuid, committed.seqno,
                    purge_seqno=committed.purge_seqno, manifest_uid=committed.manifest_uid,
                )
                outcomes[vbucket] = RollbackOutcome(vbucket, position, False, None)
            else:
                to_plan.append(request)
        rewinding = [r.vbucket for r in to_plan if r.rollback_seqno > 0]
        # The queued checkpoints count without a checkpoints commit first (0.5 s of a rollback).
        written = self._executor.checkpoints.for_vbuckets(rewinding)
        checkpoints = with_queued(
            (c for found in written.values() for c in found),
            self._executor.queued_commits,
            rewinding,
        )
        plans = [
            plan_rollback(checkpoints.get(r.vbucket, []), r.vbucket, r.rollback_seqno, horizon=0)
            for r in to_plan
        ]
        boundaries = [plan.boundary for plan in plans if plan.boundary is not None]
        if boundaries:  # are the boundaries chosen still readable? The oldest tells for all.
            oldest = min(boundaries, key=lambda boundary: boundary.table_version)
            horizon = rewind_horizon(self.mirror, oldest)
            plans = [
                plan_rollback(checkpoints[plan.vbucket], plan.vbucket, plan.rollback_seqno, horizon)
                if plan.boundary is not None else plan
                for plan in plans
            ]
        rewound = rollback_vbuckets(
            self._executor, plans, batch_id=self.next_batch_id,
            failover_logs={r.vbucket: r.failover_log for r in to_plan if r.failover_log},
            reasons={r.vbucket: r.reason for r in to_plan},
        )
        if any(outcome.commit is not None for outcome in rewound):
            self.next_batch_id += 1
        for request, outcome in zip(to_plan, rewound, strict=True):
            vbucket = request.vbucket
            if outcome.commit is not None:
                outcomes[vbucket] = RollbackOutcome(
                    vbucket, outcome.position, False, outcome.commit.table_version
                )
                continue
            self._resync_reasons[vbucket] = f"{request.reason}; {outcome.reason}"
            log.warning("vbucket %d: %s", vbucket, self._resync_reasons[vbucket])
            outcomes[vbucket] = RollbackOutcome(vbucket, outcome.position, True, None)
        return [outcomes[request.vbucket] for request in requests]

    def heartbeat(self) -> None:
        """Renew the claim, and write the checkpoints queued since the last flush."""
        self._executor.flush_checkpoints()
        self._owners.heartbeat(self._claim)

    def release(self) -> None:
        """Write the queued checkpoints and give the vbuckets up.

        Interrupted (a second SIGINT: stop at once), the claim is left to expire with its lease:
        releasing it would be one more Spark commit after the operator asked for none.
        """
        try:
            self._executor.flush_checkpoints()
        except Exception:
            self._owners.release(self._claim)
            raise
        self._owners.release(self._claim)
