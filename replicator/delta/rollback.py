"""Rollback on the Delta side (issue 6): rewind vbuckets' rows to committed boundaries.

When the producer answers a stream request with ROLLBACK to r, the vbucket goes back to the
newest committed boundary b <= r: its rows are made those of the table version at which it
stood at b (time travel), in one commit that MERGEs only the difference, touching only files
that hold the vbucket's rows (deletion vectors, no rows copied). The vbuckets of one failover
go back together, in one commit. When there is no such boundary (r == 0, nothing committed at
or below r, or the version is past the time-travel horizon) the answer is a full resync:
stream the vbucket from 0 and `replace_vbuckets`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import pyarrow as pa

from replicator.delta import changes
from replicator.delta.changes import union_frames
from replicator.delta.checkpoints import Checkpoint
from replicator.delta.commit_metadata import RESYNC, ROLLBACK, rollback_details
from replicator.delta.executor import CommitExecutor, CommitFailed, DataCommit
from replicator.delta.failover_logs import FailoverLogsTable
from replicator.delta.schema import DATA_COLUMNS, DATA_SCHEMA, MirrorConfig
from replicator.delta.table import (
    MirrorTable,
    engine_error_summary,
    is_unreadable_version,
    now_utc,
    path_exists,
)
from replicator.model.positions import FailoverLog, VbucketPosition
from replicator.planning.planner import VbucketCommit
from replicator.staging.rows import UPSERT

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


@dataclass(frozen=True, slots=True)
class RollbackPlan:
    """What to do about ROLLBACK to `rollback_seqno`: rewind to `boundary`, or full resync.

    `boundary` is the checkpoint of the newest live committed boundary <= the rollback seqno;
    its `table_version` is a version at which the vbucket's rows were exactly that boundary.
    `from_seqno` is where the vbucket stands before the rollback (its newest checkpoint), for
    the commit's audit details: the plan read the checkpoints already, a second read would cost
    the rollback another Spark job.
    """

    vbucket: int
    rollback_seqno: int
    boundary: Checkpoint | None
    reason: str
    from_seqno: int = 0

    @property
    def full_resync(self) -> bool:
        return self.boundary is None

    @property
    def to_seqno(self) -> int:
        return 0 if self.boundary is None else self.boundary.seqno


@dataclass(frozen=True, slots=True)
class RollbackOutcome:
    """What `rollback_vbucket` did: rewound (with its commit), or a full resync is needed."""

    vbucket: int
    position: VbucketPosition
    commit: DataCommit | None
    reason: str

    @property
    def full_resync_required(self) -> bool:
        return self.commit is None


def live_boundaries(checkpoints: Iterable[Checkpoint], vbucket: int) -> list[Checkpoint]:
    """The vbucket's committed boundaries still on its current history, oldest first.

    A rollback to b abandons every boundary above b committed before it; a full resync
    abandons everything before it. Older versions on an abandoned branch must never be
    rewound to.
    """
    chain: list[Checkpoint] = []
    ordered = sorted(
        (c for c in checkpoints if c.vbucket == vbucket),
        key=lambda c: (c.table_version, c.batch_id),
    )
    for checkpoint in ordered:
        if checkpoint.kind == RESYNC:
            chain = []
        elif checkpoint.kind == ROLLBACK:
            chain = [c for c in chain if c.seqno <= checkpoint.seqno]
        chain.append(checkpoint)
    return chain


def plan_rollback(
    checkpoints: Iterable[Checkpoint], vbucket: int, rollback_seqno: int, horizon: int
) -> RollbackPlan:
    """Decide how to roll `vbucket` back to `rollback_seqno` (pure).

    `horizon` is the oldest data table version time travel can still read.
    """
    if rollback_seqno < 0:
        raise ValueError(f"vbucket {vbucket}: rollback seqno {rollback_seqno} is negative")
    if rollback_seqno == 0:
        return RollbackPlan(vbucket, 0, None, "a rollback to 0: the vbucket streams again from 0")
    own = [c for c in checkpoints if c.vbucket == vbucket]
    newest = max(own, key=lambda c: (c.table_version, c.batch_id), default=None)
    from_seqno = newest.seqno if newest is not None else 0
    candidates = [c for c in live_boundaries(own, vbucket) if 0 < c.seqno <= rollback_seqno]
    if not candidates:
        return RollbackPlan(
            vbucket,
            rollback_seqno,
            None,
            f"no committed boundary of vbucket {vbucket} at or below seqno {rollback_seqno}",
        )
    boundary = candidates[-1]
    if boundary.table_version < horizon:
        return RollbackPlan(
            vbucket,
            rollback_seqno,
            None,
            f"boundary seqno {boundary.seqno} is at table version {boundary.table_version}, "
            f"older than the time-travel horizon (version {horizon})",
        )
    return RollbackPlan(
        vbucket,
        rollback_seqno,
        boundary,
        f"rewind to seqno {boundary.seqno} (table version {boundary.table_version})",
        from_seqno=from_seqno,
    )


def readable_horizon(
    commits: Sequence[tuple[int, datetime]], retention: timedelta, now: datetime
) -> int:
    """The oldest version whose files VACUUM may not have deleted yet (pure).

    Files a commit removed may go once the commit is older than the retention, and every
    version before that commit needs them: the horizon is the newest such commit (or the
    oldest version still in the log). `commits` are (version, timestamp), any order.
    """
    if not commits:
        return 0
    oldest = min(version for version, _ in commits)
    cutoff = now - retention
    expired = [version for version, timestamp in commits if timestamp < cutoff]
    return max([oldest, *expired])


def is_recent(committed_at: datetime, config: MirrorConfig, now: datetime) -> bool:
    """True when a version committed at `committed_at` is certainly still readable (pure).

    Files it needs are removed only by later commits, newer still, and VACUUM keeps what was
    removed within the retention; its log entry lasts the log retention.
    """
    return committed_at >= now - min(config.deleted_file_retention, config.log_retention)


def rewind_horizon(mirror: MirrorTable, boundary: Checkpoint, now: datetime | None = None) -> int:
    """The horizon to check `boundary` against (see plan_rollback), reading only what it needs.

    A recent boundary needs no history (0). An older one is checked against the commits from
    its version on, never the whole log: a long-running mirror keeps a month of commits, and
    DESCRIBE HISTORY reads one file per commit (1 to 2.8 s for 3,000 of them).
    """
    now = now or now_utc()
    if is_recent(boundary.committed_at, mirror.config, now):
        return 0
    commits = mirror.commit_timestamps(since_version=boundary.table_version)
    return readable_horizon(commits, mirror.config.deleted_file_retention, now)


def rollback_vbuckets(
    executor: CommitExecutor,
    plans: Sequence[RollbackPlan],
    *,
    batch_id: int,
    failover_logs: Mapping[int, FailoverLog],
    reasons: Mapping[int, str],
) -> list[RollbackOutcome]:
    """Carry out plans: rewrite each vbucket's rows as of its boundary's version, in one commit.

    A failover rolls back every vbucket the lost node was active for; one commit for them all
    pays a MERGE's fixed cost once (a commit per vbucket was 4 to 7 s each). The commit
    carries each vbucket's fresh failover log (fetched after the rollback answer), stored with
    the commit's checkpoints (`carried_failover_logs`), and its audit details. A vbucket whose
    plan says so, or whose old version can no longer be read (vacuumed files, cleaned log),
    gets a full-resync outcome and is left out of the commit. Outcomes in the order of `plans`.
    """
    outcomes: dict[int, RollbackOutcome] = {}
    by_version: dict[int, list[tuple[RollbackPlan, Checkpoint]]] = {}
    for plan in plans:
        if plan.boundary is None:
            outcomes[plan.vbucket] = RollbackOutcome(
                plan.vbucket, VbucketPosition.beginning(plan.vbucket), None, plan.reason
            )
        else:
            by_version.setdefault(plan.boundary.table_version, []).append((plan, plan.boundary))
    mirror = executor.mirror
    rewinds: list[tuple[RollbackPlan, Checkpoint]] = []
    tables: list[pa.Table] = []
    frames: list[DataFrame] = []
    room = changes.REPLACE_ON_DRIVER_ROWS
    for version, group in sorted(by_version.items()):
        try:
            old_rows = mirror.read(version).where(
                mirror.data_layout.predicate([plan.vbucket for plan, _ in group])
            )
            # Checked before reading: a failed read would put the engine's stack traces on the
            # operator's terminal.
            missing = [f for f in old_rows.inputFiles() if not path_exists(mirror.spark, f)]
            table = None
            if not missing and room > 0:
                table = changes.rows_on_driver(old_rows, DATA_COLUMNS, room)
        except Exception as exc:
            if not is_unreadable_version(exc):
                raise
            why = engine_error_summary(exc)
            outcomes.update(_resync_needed(plan, boundary, why) for plan, boundary in group)
            continue
        if missing:
            why = f"{len(missing)} of its data files were vacuumed"
            outcomes.update(_resync_needed(plan, boundary, why) for plan, boundary in group)
            continue
        if table is None:
            frames.append(old_rows.select(*DATA_COLUMNS))
        else:
            tables.append(table)
            room -= table.num_rows
        rewinds.extend(group)
    if rewinds:
        positions = {
            plan.vbucket: _rewound_position(plan.vbucket, boundary, failover_logs[plan.vbucket])
            for plan, boundary in rewinds
        }
        details = rollback_details([
            {
                "vbucket": plan.vbucket,
                "from_seqno": plan.from_seqno,
                "to_seqno": boundary.seqno,
                "rollback_seqno": plan.rollback_seqno,
                "from_table_version": boundary.table_version,
                "failover_log": [list(pair) for pair in failover_logs[plan.vbucket].as_pairs()],
                "reason": reasons[plan.vbucket],
            }
            for plan, boundary in rewinds
        ])
        try:
            commit = executor.replace_rows(
                positions, _old_rows(mirror, tables, frames), batch_id=batch_id, kind=ROLLBACK,
                rewound_to={plan.vbucket: boundary.seqno for plan, boundary in rewinds},
                details=details,
            )
        except CommitFailed as exc:
            if not is_unreadable_version(exc):
                raise
            outcomes.update(_resync_needed(plan, boundary, str(exc)) for plan, boundary in rewinds)
        else:
            for plan, _ in rewinds:
                outcomes[plan.vbucket] = RollbackOutcome(
                    plan.vbucket, positions[plan.vbucket], commit, plan.reason
                )
    return [outcomes[plan.vbucket] for plan in plans]


def rollback_vbucket(
    executor: CommitExecutor,
    plan: RollbackPlan,
    *,
    batch_id: int,
    failover_log: FailoverLog,
    reason: str,
) -> RollbackOutcome:
    """`rollback_vbuckets` for one vbucket."""
    [outcome] = rollback_vbuckets(
        executor, [plan], batch_id=batch_id, failover_logs={plan.vbucket: failover_log},
        reasons={plan.vbucket: reason},
    )
    return outcome


def _old_rows(
    mirror: MirrorTable, tables: Sequence[pa.Table], frames: Sequence[DataFrame]
) -> pa.Table | DataFrame:
    """The boundary versions' rows: on the driver when all fitted, else one Spark frame."""
    if not frames:
        return pa.concat_tables(tables)
    if tables:
        arrived = mirror.spark.createDataFrame(pa.concat_tables(tables), DATA_SCHEMA)
        frames = [*frames, arrived]
    return union_frames(frames)


def _rewound_position(
    vbucket: int, boundary: Checkpoint, failover_log: FailoverLog
) -> VbucketPosition:
    """Where `vbucket` stands once rewound: its boundary, on the producer's history."""
    return VbucketPosition.at_boundary(
        vbucket,
        failover_log.entry_at(boundary.seqno).vbucket_uuid,
        boundary.seqno,
        purge_seqno=boundary.position.purge_seqno,
        manifest_uid=boundary.position.manifest_uid,
    )


def replace_vbuckets(
    executor: CommitExecutor,
    commits: Sequence[VbucketCommit],
    *,
    batch_id: int,
    reasons: Mapping[int, str],
    failover_logs: Mapping[int, FailoverLog] | None = None,
) -> DataCommit:
    """REPLACE strategy for full resyncs: each complete stream from 0 becomes all its
    vbucket's rows, in one commit for all of them (a failover's resyncs stream together).

    Keys not re-streamed disappear (their tombstones may have been purged), in the same single
    commit that writes the re-streamed documents.
    """
    rows = executor.change_rows(commits).where(f"op = '{UPSERT}'").select(*DATA_COLUMNS)
    details = rollback_details([
        {"vbucket": c.vbucket, "to_seqno": c.position.seqno, "reason": reasons[c.vbucket]}
        for c in commits
    ])
    result = executor.replace_rows(
        {c.vbucket: c.position for c in commits}, rows, batch_id=batch_id, kind=RESYNC,
        rewound_to={c.vbucket: 0 for c in commits}, details=details, revised=commits,
    )
    if failover_logs:
        FailoverLogsTable.of(executor.mirror).save(failover_logs)
    return result


def replace_vbucket(
    executor: CommitExecutor,
    commit: VbucketCommit,
    *,
    batch_id: int,
    failover_log: FailoverLog | None = None,
    reason: str = "full resync",
) -> DataCommit:
    """`replace_vbuckets` for one vbucket."""
    return replace_vbuckets(
        executor, [commit], batch_id=batch_id, reasons={commit.vbucket: reason},
        failover_logs=None if failover_log is None else {commit.vbucket: failover_log},
    )


def _resync_needed(
    plan: RollbackPlan, boundary: Checkpoint, why: str
) -> tuple[int, RollbackOutcome]:
    reason = (
        f"table version {boundary.table_version} (vbucket {plan.vbucket} at seqno "
        f"{boundary.seqno}) can no longer be read: {why}; stream the vbucket again from 0"
    )
    return plan.vbucket, RollbackOutcome(
        plan.vbucket, VbucketPosition.beginning(plan.vbucket), None, reason
    )
