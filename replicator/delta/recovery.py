"""Where to resume after a start or a crash: positions, failover logs, the next batch id.

The data table's commits are the point of truth. A process that died between a data commit and
its checkpoint commit left the checkpoints table one commit behind; the missing rows are
rebuilt from the commits' userMetadata before positions are read, so a restart neither re-applies
nor skips anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from replicator.delta.checkpoints import CheckpointsTable
from replicator.delta.failover_logs import FailoverLogsTable, carried_failover_logs
from replicator.delta.table import MirrorTable
from replicator.model.positions import FailoverLog, VbucketPosition

FIRST_BATCH_ID = 1


@dataclass(frozen=True, slots=True)
class RecoveredState:
    """Everything an owner needs to resume its vbuckets.

    `positions` has every requested vbucket (`VbucketPosition.beginning` when nothing is
    committed); `repaired_versions` lists data table versions whose checkpoints were missing.
    """

    positions: Mapping[int, VbucketPosition]
    failover_logs: Mapping[int, FailoverLog]
    next_batch_id: int
    repaired_versions: tuple[int, ...] = ()

    @property
    def first_loads(self) -> frozenset[int]:
        """Vbuckets with nothing committed yet."""
        return frozenset(vb for vb, p in self.positions.items() if p.seqno == 0)


def repair_checkpoints(
    mirror: MirrorTable, newest_versions: Mapping[str, int] | None = None
) -> tuple[int, ...]:
    """Write the checkpoint rows of data commits that have none; return those commits' versions.

    Each owner checkpoints its commits in order, so a commit is missing exactly when it is newer
    than its owner's newest checkpointed version (`newest_versions`, read here when not given).
    The rows carry the commit's own txn ids: if the owner is alive and writes them too, one of
    the two appends is skipped. A repaired rollback also restores the failover log it carried.
    """
    checkpoints = CheckpointsTable.of(mirror)
    if newest_versions is None:
        newest_versions = checkpoints.newest_versions_by_owner()
    missing = mirror.commits_after(newest_versions)
    # Logs first: once a commit has checkpoint rows it is no longer missing, so a crash
    # between the two writes would leave its failover log unrestored for good.
    FailoverLogsTable.of(mirror).save_timed(carried_failover_logs(missing))
    checkpoints.record(missing)
    return tuple(record.version for record in missing)


def recover(mirror: MirrorTable, *, owner_id: str, vbuckets: Iterable[int]) -> RecoveredState:
    """Repair the checkpoints, then read where each of `vbuckets` stands and the next batch id.

    >>> state = recover(mirror, owner_id=claim.owner_id, vbuckets=claim.vbuckets)  # doctest: +SKIP
    >>> state.positions[7].seqno, state.next_batch_id  # doctest: +SKIP
    (1520, 43)
    """
    wanted = sorted(set(vbuckets))
    checkpoints = CheckpointsTable.of(mirror)
    overview = checkpoints.overview(wanted)
    repaired = repair_checkpoints(mirror, overview.newest_versions)
    if repaired:
        overview = checkpoints.overview(wanted)  # the repair appended rows it predates
    latest = overview.latest
    newest_batch = overview.newest_batches.get(owner_id)
    positions = {
        vb: latest[vb].position if vb in latest else VbucketPosition.beginning(vb) for vb in wanted
    }
    return RecoveredState(
        positions=positions,
        failover_logs=FailoverLogsTable.of(mirror).load(wanted),
        next_batch_id=FIRST_BATCH_ID if newest_batch is None else newest_batch + 1,
        repaired_versions=repaired,
    )
