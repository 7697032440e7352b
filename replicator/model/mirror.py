"""What the driver and the mirror store hand each other: the recovered state, rollbacks.

Here, in the shared vocabulary, because the driver (pipeline) declares the store it needs and
the Delta layer implements it, and the Delta layer may not import the pipeline.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from replicator.model.positions import FailoverLog, VbucketPosition


@dataclass(frozen=True, slots=True)
class RollbackOutcome:
    """Where the mirror's vbucket stands after the store handled a rollback request.

    `full_resync`: the vbucket must be streamed again from 0 and its rows replaced in one
    commit (rollback to 0, purge, or the old table version is beyond the time-travel horizon).
    """

    vbucket: int
    position: VbucketPosition
    full_resync: bool
    table_version: int | None


@dataclass(frozen=True, slots=True)
class RollbackRequest:
    """The producer asked `vbucket`, which stands at `committed`, to go back to `rollback_seqno`.

    `failover_log` is the producer's log fetched after the answer; `reason` is recorded with
    the rollback's commit.
    """

    vbucket: int
    rollback_seqno: int
    committed: VbucketPosition
    failover_log: FailoverLog | None
    reason: str


@dataclass(frozen=True, slots=True)
class RecoveredMirror:
    """The committed state a replication resumes from."""

    positions: Mapping[int, VbucketPosition]
    failover_logs: Mapping[int, FailoverLog]
    next_batch_id: int
