"""A claim's lease renewed without Spark: the owners table's heartbeat committed by delta-rs.

A heartbeat sets one row's timestamp. As Spark's MERGE it runs six Spark jobs on the commit
thread, 2 to 4 s each time (every 15 s; measured in the README, "Heartbeats without Spark"); as
delta-rs's UPDATE, 10 to 25 ms. The commit is the same: the file holding the claim's row is
rewritten, with the heartbeat's userMetadata. Optimistic concurrency is delta-rs's: when a commit
that landed first removed the file this one read (a rival evicting the claim), the renewal is
refused (`DeltaRsConflict`, retried); a commit that touched other files (another shard's
heartbeat or claim) is rebased onto. Checkpoints and log clean-up follow the table's
properties, as Spark's post-commit hook does.

Only on the local filesystem, like first loads appended from Arrow (elsewhere the storage
credentials are Hadoop's, which delta-rs does not read): `lease_renewer_for` says None there,
and the heartbeat stays Spark's MERGE.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from replicator.delta.conflicts import DeltaRsConflict, delta_rs_conflicts
from replicator.delta.paths import local_path, newest_table, on_local_filesystem

if TYPE_CHECKING:
    from deltalake import DeltaTable


class LeaseRenewer:
    """Sets `heartbeat_at` of one claim's row of the owners table at `path`, by delta-rs."""

    def __init__(self, path: str) -> None:
        self.path = local_path(path)
        self._table: DeltaTable | None = None

    def renew(
        self,
        claim_id: str,
        moment: datetime,
        user_metadata: str,
        *,
        before_commit: Callable[[], None] | None = None,
    ) -> int:
        """Set the claim's heartbeat to `moment`; the number of rows updated (0: the claim is
        gone). `before_commit` runs between reading the table and committing (tests race there).
        """
        from deltalake.transaction import CommitProperties

        if not claim_id.isalnum():
            raise ValueError(f"a claim id is alphanumeric, got {claim_id!r}")
        table = self._table = newest_table(self._table, self.path)
        if before_commit is not None:
            before_commit()
        try:
            with delta_rs_conflicts("the lease renewal"):
                metrics = table.update(
                    new_values={"heartbeat_at": moment},
                    predicate=f"claim_id = '{claim_id}'",
                    commit_properties=CommitProperties(
                        custom_metadata={"userMetadata": user_metadata}
                    ),
                )
        except DeltaRsConflict:
            self._table = None  # read afresh at the next attempt
            raise
        return int(metrics["num_updated_rows"])


def lease_renewer_for(path: str) -> LeaseRenewer | None:
    """The delta-rs renewer of the owners table at `path`; None off the local filesystem."""
    if not on_local_filesystem(path):
        return None
    return LeaseRenewer(path)
