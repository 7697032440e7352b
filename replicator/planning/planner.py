"""Group-commit planning: which staged snapshots the next Delta commit takes, at what positions.

Pure functions over the stager's ready runs and the committed positions: no I/O, no clock
(the caller passes `now`, read from the same clock the stager stamps runs with). The Delta
executor takes the resulting `CommitBatch`, and uses `deduplicate_changes` to keep one row per
document before it merges.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import pyarrow as pa
import pyarrow.compute as pc

from replicator.dcp.protocol.events import SnapshotFlags
from replicator.model.positions import FailoverLog, SeqnoRange, VbucketPosition
from replicator.staging.rows import CHANGE_SCHEMA, DOCUMENT
from replicator.staging.spill import read_rows
from replicator.staging.stager import StagedSnapshots

_DEDUP_COLUMNS = (*DOCUMENT, "seqno")

_MAY_REPEAT_KEYS = SnapshotFlags.MAY_CONTAIN_DUPLICATES | SnapshotFlags.HISTORY
"""Snapshots whose keys may repeat: flagged so, or history (every revision, kv_engine 7.2+)."""


@dataclass(frozen=True, slots=True)
class CommitThresholds:
    """When to commit: enough rows, enough bytes, or a ready snapshot waiting long enough.

    `max_rows` and `max_bytes` also cap a batch; a vbucket's ready rows are never split
    (positions exist only at snapshot boundaries), so a single vbucket may exceed them.
    The rows of first loads, which are appended rather than merged, count against
    `max_first_load_bytes` instead of `max_bytes`: an append costs more per commit than per
    row (a warm 1,000,000-document load over 1024 vbuckets took 37.3 and 30.4 s in 9 commits
    of 128 MB, 26.8 and 27.8 s in 3 of 512 MB), and rows beyond the memory budget are spill
    files that Spark reads, so a commit still holds in memory no more than the budget.
    """

    max_rows: int = 500_000
    max_bytes: int = 128 * 1024 * 1024
    max_delay_seconds: float = 10.0
    max_first_load_bytes: int = 512 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.max_rows <= 0:
            raise ValueError(f"max_rows must be positive, got {self.max_rows}")
        if self.max_bytes <= 0 or self.max_first_load_bytes <= 0:
            raise ValueError(
                f"max_bytes and max_first_load_bytes must be positive, got {self.max_bytes} "
                f"and {self.max_first_load_bytes}"
            )
        if self.max_delay_seconds < 0:
            raise ValueError(
                f"max_delay_seconds must not be negative, got {self.max_delay_seconds}"
            )


SLOW_COMMIT_S = 10.0
"""Commits longer than this stretch the delay threshold (see `stretched_for_slow_commits`)."""


def stretched_for_slow_commits(
    thresholds: CommitThresholds, last_commit_seconds: float
) -> CommitThresholds:
    """The thresholds for the next batch, given how long the last commit took (pure).

    A commit's cost is mostly per partition written, not per row: under a heavy load, a
    commit every `max_delay_seconds` would spend nearly all the time committing small batches
    and fall ever further behind. After a slow commit (over SLOW_COMMIT_S and over the delay),
    a batch waits as long as that commit took, so batches grow until the mirror keeps up.
    Quick commits (light load) keep the configured delay; rows and bytes still cap every
    batch.

    >>> base = CommitThresholds(max_delay_seconds=2.0)
    >>> stretched_for_slow_commits(base, 1.5).max_delay_seconds
    2.0
    >>> stretched_for_slow_commits(base, 20.0).max_delay_seconds
    20.0
    """
    if last_commit_seconds <= max(SLOW_COMMIT_S, thresholds.max_delay_seconds):
        return thresholds
    return replace(thresholds, max_delay_seconds=last_commit_seconds)


class CommitTrigger(enum.Enum):
    """Why a batch was planned."""

    ROWS = "row threshold reached"
    BYTES = "byte threshold reached"
    DELAY = "oldest ready snapshot waited long enough"
    TARGETS_STAGED = "everything up to the run's targets is staged"
    FORCED = "commit forced"


@dataclass(frozen=True, slots=True)
class VbucketCommit:
    """One vbucket's part of a commit: its rows and the position the commit moves it to.

    `first_load` means nothing of the vbucket is committed yet: the executor appends (after
    deduplicating, dropping deletes) instead of merging. A vbucket rolled back to 0 must have
    its old rows removed before such a load. Rows are `tables` plus `spill_files`, not yet
    deduplicated. `dropped_collection_ids` are collections dropped in these snapshots: DCP sends
    no deletions for their documents, so the executor removes the vbucket's rows of them.
    """

    vbucket: int
    position: VbucketPosition
    previous_seqno: int
    first_load: bool
    snapshot_start: int
    snapshot_count: int
    tables: tuple[pa.Table, ...]
    spill_files: tuple[str, ...]
    row_count: int
    byte_count: int
    staged_run_ids: tuple[int, ...]
    dropped_collection_ids: tuple[int, ...] = ()
    history_ranges: tuple[SeqnoRange, ...] = ()
    """Seqno ranges of HISTORY snapshots among the rows: every revision, for the history."""
    unique_keys: bool = False
    """The rows are one snapshot that DCP promises holds each key once: no deduplication."""


@dataclass(frozen=True, slots=True)
class CommitBatch:
    """A group commit: several vbuckets' complete snapshots, applied in one Delta commit.

    `batch_id` comes from a counter that only grows (use it as the txnVersion).
    """

    batch_id: int
    commits: tuple[VbucketCommit, ...]
    trigger: CommitTrigger

    @property
    def vbuckets(self) -> tuple[int, ...]:
        return tuple(commit.vbucket for commit in self.commits)

    @property
    def positions(self) -> dict[int, VbucketPosition]:
        """The position each vbucket is at once the batch is committed."""
        return {commit.vbucket: commit.position for commit in self.commits}

    @property
    def row_count(self) -> int:
        return sum(commit.row_count for commit in self.commits)

    @property
    def byte_count(self) -> int:
        return sum(commit.byte_count for commit in self.commits)

    @property
    def is_empty(self) -> bool:
        return not self.commits

    def commit_for(self, vbucket: int) -> VbucketCommit:
        """The vbucket's part of the batch; KeyError if it is not in the batch."""
        for commit in self.commits:
            if commit.vbucket == vbucket:
                return commit
        raise KeyError(f"vbucket {vbucket} is not in batch {self.batch_id}")


def plan_commit(
    ready: Mapping[int, Sequence[StagedSnapshots]],
    committed: Mapping[int, VbucketPosition],
    failover_logs: Mapping[int, FailoverLog],
    thresholds: CommitThresholds,
    *,
    batch_id: int,
    now: float,
    force: bool = False,
    targets_staged: bool = False,
) -> CommitBatch | None:
    """Plan the next commit, or None when no threshold is reached yet (or nothing is ready).

    `targets_staged` says a run that stops at targets has all it needs staged: waiting out
    the delay would only hold the end of the run back, so the commit is due now.

    `ready` is `Stager.ready_snapshots()`; vbuckets with a run claimed by an earlier batch wait
    until it is released (and `committed` updated), so positions always chain. The uuid of each
    new position comes from the vbucket's failover log entry for the new seqno. Vbuckets join
    the batch oldest-ready first while the batch stays within the thresholds (at least one).
    """
    if batch_id < 0:
        raise ValueError(f"batch id must not be negative, got {batch_id}")
    candidates = {
        vbucket: tuple(sorted(runs, key=lambda run: run.end_seqno))
        for vbucket, runs in ready.items()
        if runs and all(run.claimed_by is None for run in runs)
    }
    if not candidates:
        return None
    trigger = _trigger(
        candidates, thresholds, now=now, force=force, targets_staged=targets_staged
    )
    if trigger is None:
        return None

    by_age = sorted(candidates, key=lambda vb: (min(r.ready_since for r in candidates[vb]), vb))
    chosen: list[int] = []
    rows = 0
    size = {True: 0, False: 0}  # bytes of first loads (appended), of the others (merged)
    for vbucket in by_age:
        vb_rows = sum(run.row_count for run in candidates[vbucket])
        vb_bytes = sum(run.byte_count for run in candidates[vbucket])
        first = is_first_load(committed.get(vbucket))
        cap = thresholds.max_first_load_bytes if first else thresholds.max_bytes
        fits = rows + vb_rows <= thresholds.max_rows and size[first] + vb_bytes <= cap
        if chosen and not fits:
            continue
        chosen.append(vbucket)
        rows += vb_rows
        size[first] += vb_bytes
    commits = tuple(
        _vbucket_commit(vbucket, candidates[vbucket], committed.get(vbucket), failover_logs)
        for vbucket in sorted(chosen)
    )
    return CommitBatch(batch_id=batch_id, commits=commits, trigger=trigger)


def is_first_load(committed: VbucketPosition | None) -> bool:
    """Nothing of the vbucket is committed yet: its rows are appended, not merged."""
    return committed is None or committed.seqno == 0


def seconds_until_due(
    ready: Mapping[int, Sequence[StagedSnapshots]],
    thresholds: CommitThresholds,
    *,
    now: float,
) -> float | None:
    """How long until the delay threshold makes a commit due (0 if due now); None if nothing waits.

    Lets the caller sleep on its event loop until then instead of polling.
    """
    waiting = [
        run.ready_since
        for runs in ready.values()
        if all(run.claimed_by is None for run in runs)
        for run in runs
    ]
    if not waiting:
        return None
    return max(0.0, min(waiting) + thresholds.max_delay_seconds - now)


def without_vbucket(batch: CommitBatch, vbucket: int) -> CommitBatch:
    """The batch minus one vbucket (rolled back while the batch was being built)."""
    return replace(batch, commits=tuple(c for c in batch.commits if c.vbucket != vbucket))


def history_revisions(commits: Sequence[VbucketCommit]) -> pa.Table:
    """The rows of `commits` staged from HISTORY snapshots, in (vbucket, seqno) order.

    Not deduplicated: in a history snapshot every row is one revision of its document. Reads
    the spill files of commits that have history.
    """
    parts = []
    for commit in commits:
        if not commit.history_ranges:
            continue
        rows = read_rows(commit.tables, commit.spill_files)
        seqnos = rows["seqno"]
        keep = None
        for first, last in commit.history_ranges:
            inside = pc.and_(pc.greater_equal(seqnos, first), pc.less_equal(seqnos, last))
            keep = inside if keep is None else pc.or_(keep, inside)
        parts.append(rows.filter(keep))
    if not parts:
        return CHANGE_SCHEMA.empty_table()
    return pa.concat_tables(parts).sort_by([("vbucket", "ascending"), ("seqno", "ascending")])


def deduplicate_changes(table: pa.Table) -> pa.Table:
    """Keep only the highest-seqno row of each (vbucket, collection_id, key), sorted by them.

    Any batch of several snapshots, and any snapshot flagged may-contain-duplicates, repeats
    keys; MERGE fails when two source rows match one target row. Rows of many vbuckets are
    deduplicated in one pass (a pass per vbucket is a fixed cost paid 1024 times). Other
    columns ride along.
    """
    missing = [name for name in _DEDUP_COLUMNS if name not in table.column_names]
    if missing:
        raise ValueError(f"cannot deduplicate changes: columns {missing} are missing")
    if table.num_rows <= 1:
        return table
    # A batch arrives as thousands of small staged chunks; sorting and taking across them
    # costs 7x more than one copy into a single chunk first (150,000 rows of 1 KB: 0.47 s
    # against 0.07 s).
    table = table.combine_chunks()
    order = pc.sort_indices(
        table,
        sort_keys=[*((name, "ascending") for name in DOCUMENT), ("seqno", "descending")],
    )
    count = len(order)
    # A row is the first of its group when its document differs from the previous row's.
    starts_group = None
    for name in DOCUMENT:
        column = table[name].take(order).combine_chunks()
        differs = pc.not_equal(column.slice(1), column.slice(0, count - 1))
        starts_group = differs if starts_group is None else pc.or_(starts_group, differs)
    first_of_group = pa.concat_arrays([pa.array([True]), starts_group])
    return table.take(order.filter(first_of_group))


def _trigger(
    candidates: Mapping[int, Sequence[StagedSnapshots]],
    thresholds: CommitThresholds,
    *,
    now: float,
    force: bool,
    targets_staged: bool,
) -> CommitTrigger | None:
    if force:
        return CommitTrigger.FORCED
    runs = [run for vb_runs in candidates.values() for run in vb_runs]
    if sum(run.row_count for run in runs) >= thresholds.max_rows:
        return CommitTrigger.ROWS
    if sum(run.byte_count for run in runs) >= thresholds.max_bytes:
        return CommitTrigger.BYTES
    if now - min(run.ready_since for run in runs) >= thresholds.max_delay_seconds:
        return CommitTrigger.DELAY
    if targets_staged:
        return CommitTrigger.TARGETS_STAGED
    return None


def _vbucket_commit(
    vbucket: int,
    runs: Sequence[StagedSnapshots],
    committed: VbucketPosition | None,
    failover_logs: Mapping[int, FailoverLog],
) -> VbucketCommit:
    end = runs[-1].end_seqno
    previous = committed.seqno if committed is not None else 0
    if end < previous:
        raise ValueError(
            f"vbucket {vbucket}: staged snapshots end at {end}, below the committed seqno "
            f"{previous}; discard the vbucket's staging after a rollback"
        )
    failover_log = failover_logs.get(vbucket)
    if failover_log is None:
        raise ValueError(f"vbucket {vbucket}: no failover log to take the position's uuid from")
    purge_seqno = committed.purge_seqno if committed is not None else 0
    manifest_uid = committed.manifest_uid if committed is not None else 0
    for run in runs:
        if run.purge_seqno is not None:
            purge_seqno = run.purge_seqno
        if run.manifest_uid is not None:
            manifest_uid = run.manifest_uid
    position = VbucketPosition.at_boundary(
        vbucket,
        failover_log.entry_at(end).vbucket_uuid,
        end,
        purge_seqno=purge_seqno,
        manifest_uid=manifest_uid,
    )
    return VbucketCommit(
        vbucket=vbucket,
        position=position,
        previous_seqno=previous,
        first_load=is_first_load(committed),
        snapshot_start=runs[0].start_seqno,
        snapshot_count=sum(run.snapshot_count for run in runs),
        tables=tuple(table for run in runs for table in run.tables),
        spill_files=tuple(path for run in runs for path in run.spill_files),
        row_count=sum(run.row_count for run in runs),
        byte_count=sum(run.byte_count for run in runs),
        staged_run_ids=tuple(run.run_id for run in runs),
        dropped_collection_ids=tuple(cid for run in runs for cid in run.dropped_collection_ids),
        history_ranges=tuple(r for run in runs for r in run.history_ranges),
        unique_keys=(
            len(runs) == 1
            and runs[0].snapshot_count == 1
            and not runs[0].flags & _MAY_REPEAT_KEYS
        ),
    )
