"""Bounded-memory staging of change rows per vbucket, spilling to Parquet files when over budget.

Over 500 lines on purpose: runs, claims and spilling share one budget and one set of runs;
the spill files themselves are in staging/spill.py, the stream side in staging/stream.py.

Rows wait here between the stream and the Delta commit. A vbucket's rows are either *pending*
(its open snapshot is not complete yet: never committed, dropped by a rollback) or *ready*
(they belong to complete snapshots). Consecutive ready snapshots of a vbucket are kept as one
run, so many small memory snapshots do not turn into many small files. When the rows held in
memory would go over the budget, the vbucket with the most rows in memory is written to spill
files, pending rows included: a first backfill is one snapshot of a whole vbucket, larger than
any memory. Rows are therefore staged as soon as they arrive and the stream can acknowledge
them (BUFFER_ACK) without waiting for a commit.

Spill files are Parquet with CHANGE_SCHEMA, mode 0600, in a directory of mode 0700 that the
caller chooses (beside the table, so executors can read it). The directory belongs to one
Stager at a time (its owner's claim guarantees it), so a new Stager deletes the spill files a
killed predecessor left there. Not thread-safe: one event loop owns a Stager.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import pyarrow as pa

from replicator.dcp.protocol.events import SnapshotFlags
from replicator.errors import ReplicatorError
from replicator.model.aliases import FaultHook
from replicator.model.positions import SeqnoRange, VbucketPosition
from replicator.staging.assembly import CompleteSnapshot
from replicator.staging.rows import CHANGE_SCHEMA
from replicator.staging.spill import (
    SPILL_FILE_NAME,
    SpillWriter,
    free_space,
    read_rows,
    remove_spill_file,
    write_spill_file,
)

_log = logging.getLogger(__name__)

DEFAULT_MEMORY_BUDGET_BYTES = 256 * 1024 * 1024
"""Rows held in memory across all vbuckets before the largest is spilled."""

_TABLES_BEFORE_COMBINING = 16
"""An open snapshot's latest staged slices are copied into one table once they are this many."""

class StagingError(ReplicatorError):
    """Rows could not be written to the staging directory (disk full, size limit, I/O error)."""


class ClaimedVbucket(Protocol):
    """One vbucket's part of a planned commit, as far as claiming its staged runs goes."""

    @property
    def vbucket(self) -> int: ...

    @property
    def position(self) -> VbucketPosition: ...

    @property
    def staged_run_ids(self) -> tuple[int, ...]: ...


class Claim(Protocol):
    """A planned commit batch (planning's CommitBatch), as the stager sees it: staging sits
    before planning in the pipeline, so it names only what it reads of a batch."""

    @property
    def batch_id(self) -> int: ...

    @property
    def commits(self) -> Sequence[ClaimedVbucket]: ...


def staged_size(rows: pa.Table | pa.RecordBatch) -> int:
    """What rows count against the staging budget: the size of their Arrow buffers.

    Not `nbytes`, which costs about 150 us a call (pyarrow 26) whatever the size: paid per
    staged chunk, that was a tenth of the replication thread's time at 1024 vbuckets.
    """
    return int(rows.get_total_buffer_size())


@dataclass(frozen=True, slots=True)
class StagedSnapshots:
    """A run of consecutive complete snapshots of one vbucket, staged and ready to commit.

    Its rows are the in-memory `tables` plus the `spill_files`, in arrival order (not
    deduplicated). `byte_count` is the Arrow size of all its rows, spilled ones included.
    `ready_since` is the stager clock's time when its first snapshot completed; `claimed_by`
    is the id of the commit batch that holds it, if any. `history_ranges` are the seqno ranges
    of its snapshots flagged HISTORY (change streams): their rows are every revision.
    """

    run_id: int
    vbucket: int
    start_seqno: int
    end_seqno: int
    snapshot_count: int
    flags: SnapshotFlags
    purge_seqno: int | None
    manifest_uid: int | None
    dropped_collection_ids: tuple[int, ...]
    tables: tuple[pa.Table, ...]
    spill_files: tuple[str, ...]
    row_count: int
    byte_count: int
    ready_since: float
    claimed_by: int | None = None
    history_ranges: tuple[SeqnoRange, ...] = ()

    def read_rows(self) -> pa.Table:
        """All rows of the run as one table (reads the spill files)."""
        return read_rows(self.tables, self.spill_files)


@dataclass(frozen=True, slots=True)
class _SpillFile:
    path: str
    file_bytes: int
    row_count: int
    arrow_bytes: int


@dataclass(slots=True)
class _Rows:
    """Rows of one run or of the open snapshot, in memory and in spill files (mutable)."""

    tables: list[pa.Table] = field(default_factory=list)
    files: list[_SpillFile] = field(default_factory=list)
    memory_bytes: int = 0
    row_count: int = 0
    loose_tables: int = 0
    """Tables at the end of `tables` staged as they came (slices), not yet combined."""

    @property
    def byte_count(self) -> int:
        return self.memory_bytes + sum(spill.arrow_bytes for spill in self.files)

    def absorb(self, other: _Rows) -> None:
        self.tables.extend(other.tables)
        self.files.extend(other.files)
        self.memory_bytes += other.memory_bytes
        self.row_count += other.row_count


@dataclass(slots=True)
class _Run:
    run_id: int
    start_seqno: int
    end_seqno: int
    snapshot_count: int
    flags: SnapshotFlags
    purge_seqno: int | None
    manifest_uid: int | None
    dropped_collection_ids: list[int]
    rows: _Rows
    ready_since: float
    claimed_by: int | None = None
    history_ranges: list[SeqnoRange] = field(default_factory=list)

    def view(self, vbucket: int) -> StagedSnapshots:
        return StagedSnapshots(
            run_id=self.run_id,
            vbucket=vbucket,
            start_seqno=self.start_seqno,
            end_seqno=self.end_seqno,
            snapshot_count=self.snapshot_count,
            flags=self.flags,
            purge_seqno=self.purge_seqno,
            manifest_uid=self.manifest_uid,
            dropped_collection_ids=tuple(self.dropped_collection_ids),
            tables=tuple(self.rows.tables),
            spill_files=tuple(spill.path for spill in self.rows.files),
            row_count=self.rows.row_count,
            byte_count=self.rows.byte_count,
            ready_since=self.ready_since,
            claimed_by=self.claimed_by,
            history_ranges=tuple(self.history_ranges),
        )


@dataclass(slots=True)
class _VbucketStage:
    pending: _Rows = field(default_factory=_Rows)
    runs: list[_Run] = field(default_factory=list)

    def spillable(self) -> list[_Rows]:
        """Row holders whose memory may go to disk: not claimed by a batch being committed."""
        holders = [run.rows for run in self.runs if run.claimed_by is None]
        holders.append(self.pending)
        return [rows for rows in holders if rows.tables]

    def spillable_bytes(self) -> int:
        return sum(rows.memory_bytes for rows in self.spillable())


class Stager:
    """Holds change rows per vbucket within a memory budget, spilling the largest to disk.

    >>> import tempfile
    >>> from replicator.dcp.protocol.events import SnapshotFlags
    >>> from replicator.staging.assembly import CompleteSnapshot
    >>> stager = Stager(tempfile.mkdtemp() + "/run-1", memory_budget_bytes=1 << 20)
    >>> stager.complete_snapshot(CompleteSnapshot(7, 1, 9, SnapshotFlags.MEMORY))
    >>> [run.end_seqno for run in stager.ready(7)]
    [9]

    The staging directory is made (mode 0700) if missing, and spill files left there by an
    earlier Stager of the same owner (a killed run) are deleted: their rows were never
    committed, and the new run reads them again from the stream. `stage_rows` either stages
    all its rows (in memory or in a new spill file) or, on StagingError, none of them.
    In-memory rows never exceed the budget: rows that cannot fit go straight to disk. Rows of
    a run claimed by a batch stay where they are until `release`.
    """

    def __init__(
        self,
        staging_dir: str | os.PathLike[str],
        *,
        memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET_BYTES,
        spill_writer: SpillWriter = write_spill_file,
        spill_limit_bytes: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        fault_hook: FaultHook | None = None,
    ) -> None:
        if memory_budget_bytes <= 0:
            raise ValueError(f"memory budget must be positive, got {memory_budget_bytes}")
        if spill_limit_bytes is not None and spill_limit_bytes <= 0:
            raise ValueError(f"spill limit must be positive, got {spill_limit_bytes}")
        self._dir = os.fspath(staging_dir)
        self._budget = memory_budget_bytes
        self._write = spill_writer
        self._spill_limit = spill_limit_bytes
        self._clock = clock
        self._fault_hook = fault_hook
        self._vbuckets: dict[int, _VbucketStage] = {}
        self._claims: dict[int, set[int]] = {}
        self._buffered = 0
        self._peak_buffered = 0
        self._spilled_file_bytes = 0
        self._spilled_total = 0
        self._next_run_id = 1
        self._next_file = 1
        try:
            os.makedirs(self._dir, mode=0o700, exist_ok=True)
            os.chmod(self._dir, 0o700)
        except OSError as exc:
            raise StagingError(
                f"cannot create staging directory {self._dir}: {exc.strerror}"
            ) from exc
        self._remove_leftover_spill_files()

    @property
    def staging_dir(self) -> str:
        """Directory of the spill files."""
        return self._dir

    @property
    def memory_budget_bytes(self) -> int:
        return self._budget

    @property
    def buffered_bytes(self) -> int:
        """Arrow bytes of the rows held in memory (never above the budget)."""
        return self._buffered

    @property
    def peak_buffered_bytes(self) -> int:
        """The most `buffered_bytes` has been since the stager was made."""
        return self._peak_buffered

    @property
    def spilled_bytes(self) -> int:
        """Bytes of the spill files on disk."""
        return self._spilled_file_bytes

    @property
    def spilled_bytes_total(self) -> int:
        """Bytes ever written to spill files (released ones included)."""
        return self._spilled_total

    @property
    def clock(self) -> Callable[[], float]:
        """The clock runs' `ready_since` is read from."""
        return self._clock

    @property
    def staged_bytes(self) -> int:
        """Everything staged and not yet released: bytes in memory plus bytes on disk."""
        return self._buffered + self._spilled_file_bytes

    def stage_rows(
        self, vbucket: int, rows: pa.RecordBatch | pa.Table, *, size_bytes: int | None = None
    ) -> None:
        """Add rows of the vbucket's open (not yet complete) snapshot.

        `size_bytes` is what the rows count against the budget, for a slice of a larger
        batch (its share of the shared buffers); by default, the size of the rows' buffers.
        """
        table = pa.Table.from_batches([rows]) if isinstance(rows, pa.RecordBatch) else rows
        if not table.schema.equals(CHANGE_SCHEMA):
            raise ValueError(
                f"vbucket {vbucket}: staged rows must have CHANGE_SCHEMA, got {table.schema}"
            )
        if table.num_rows == 0:
            return
        stage = self._stage(vbucket)
        incoming = staged_size(table) if size_bytes is None else size_bytes
        if incoming <= self._budget:
            self._make_room(incoming)
        if self._buffered + incoming > self._budget:
            # Too big for memory even after spilling what may be spilled: straight to disk.
            spill = self._write_spill(vbucket, table, already_written=0, arrow_bytes=incoming)
            stage.pending.files.append(spill)
            stage.pending.row_count += spill.row_count
            self._spilled_file_bytes += spill.file_bytes
            self._spilled_total += spill.file_bytes
            return
        pending = stage.pending
        pending.tables.append(table)
        pending.loose_tables += 1
        if pending.loose_tables >= _TABLES_BEFORE_COMBINING:
            # Copy the latest slices into buffers of their own (each row once), so that a long
            # open snapshot keeps no converted batch of other vbuckets alive.
            loose = pending.tables[-pending.loose_tables :]
            del pending.tables[-pending.loose_tables :]
            pending.tables.append(pa.concat_tables(loose).combine_chunks())
            pending.loose_tables = 0
        pending.memory_bytes += incoming
        pending.row_count += table.num_rows
        self._buffered += incoming
        self._peak_buffered = max(self._peak_buffered, self._buffered)

    def complete_snapshot(
        self, snapshot: CompleteSnapshot, *, completed_at: float | None = None
    ) -> None:
        """The vbucket's pending rows form the complete `snapshot`: they become ready.

        `completed_at` is when the snapshot's last item arrived, by the stager's `clock`
        (default: now); a run is ready since its first snapshot's.
        """
        stage = self._stage(snapshot.vbucket)
        last = stage.runs[-1] if stage.runs else None
        if last is not None and snapshot.end_seqno < last.end_seqno:
            raise ValueError(
                f"vbucket {snapshot.vbucket}: snapshot ending at {snapshot.end_seqno} completes "
                f"after one ending at {last.end_seqno}"
            )
        pending, stage.pending = stage.pending, _Rows()
        if last is not None and last.claimed_by is None:
            last.end_seqno = snapshot.end_seqno
            last.snapshot_count += 1
            last.flags |= snapshot.flags
            if snapshot.purge_seqno is not None:
                last.purge_seqno = snapshot.purge_seqno
            if snapshot.manifest_uid is not None:
                last.manifest_uid = snapshot.manifest_uid
            last.dropped_collection_ids.extend(snapshot.dropped_collection_ids)
            last.rows.absorb(pending)
            _note_history(last.history_ranges, snapshot)
            return
        stage.runs.append(
            _Run(
                run_id=self._next_run_id,
                start_seqno=snapshot.start_seqno,
                end_seqno=snapshot.end_seqno,
                snapshot_count=1,
                flags=snapshot.flags,
                purge_seqno=snapshot.purge_seqno,
                manifest_uid=snapshot.manifest_uid,
                dropped_collection_ids=list(snapshot.dropped_collection_ids),
                rows=pending,
                ready_since=self._clock() if completed_at is None else completed_at,
            )
        )
        _note_history(stage.runs[-1].history_ranges, snapshot)
        self._next_run_id += 1

    def ready(self, vbucket: int) -> tuple[StagedSnapshots, ...]:
        """The vbucket's ready runs, oldest first, claimed ones included."""
        stage = self._vbuckets.get(vbucket)
        if stage is None:
            return ()
        return tuple(run.view(vbucket) for run in stage.runs)

    def ready_snapshots(self) -> dict[int, tuple[StagedSnapshots, ...]]:
        """Ready runs of every vbucket that has some: the planner's input."""
        return {
            vbucket: tuple(run.view(vbucket) for run in stage.runs)
            for vbucket, stage in sorted(self._vbuckets.items())
            if stage.runs
        }

    def pending_rows(self, vbucket: int) -> int:
        """Rows staged for the vbucket's open snapshot (not committable yet)."""
        stage = self._vbuckets.get(vbucket)
        return 0 if stage is None else stage.pending.row_count

    def claim(self, batch: Claim) -> None:
        """Mark the runs a freshly planned batch commits: they stay as they are until release.

        Raises ValueError, claiming nothing, if the batch no longer matches what is staged.
        """
        if batch.batch_id in self._claims:
            raise ValueError(f"batch {batch.batch_id} is already claimed")
        claimed: list[_Run] = []
        for commit in batch.commits:
            runs = {run.run_id: run for run in self._stage(commit.vbucket).runs}
            for run_id in commit.staged_run_ids:
                run = runs.get(run_id)
                if run is None or run.claimed_by is not None:
                    raise ValueError(
                        f"batch {batch.batch_id}: vbucket {commit.vbucket}'s staged run "
                        f"{run_id} is gone or claimed; plan the batch again"
                    )
                if run.end_seqno > commit.position.seqno:
                    raise ValueError(
                        f"batch {batch.batch_id}: vbucket {commit.vbucket} staged up to "
                        f"{run.end_seqno} since the batch was planned for "
                        f"{commit.position.seqno}; plan the batch again"
                    )
                claimed.append(run)
        for run in claimed:
            run.claimed_by = batch.batch_id
        self._claims[batch.batch_id] = {commit.vbucket for commit in batch.commits}

    def release(self, batch: Claim) -> None:
        """The batch's commit landed: drop its rows and delete its spill files.

        Runs claimed by the batch for vbuckets taken out of it since (`without_vbucket`) are
        unclaimed, not dropped: they were not committed.
        """
        claimed_vbuckets = self._claims.pop(batch.batch_id, None)
        if claimed_vbuckets is None:
            raise ValueError(f"batch {batch.batch_id} was never claimed")
        committed = {commit.vbucket for commit in batch.commits}
        for vbucket in claimed_vbuckets:
            stage = self._vbuckets.get(vbucket)
            if stage is None:
                continue
            kept: list[_Run] = []
            for run in stage.runs:
                if run.claimed_by != batch.batch_id:
                    kept.append(run)
                elif vbucket in committed:
                    self._drop_rows(run.rows)
                else:
                    run.claimed_by = None
                    kept.append(run)
            stage.runs = kept

    def discard_pending(self, vbucket: int) -> None:
        """Drop the rows of the vbucket's open snapshot (its stream failed mid-snapshot)."""
        stage = self._vbuckets.get(vbucket)
        if stage is not None:
            self._drop_rows(stage.pending)
            stage.pending = _Rows()

    def discard(self, vbucket: int) -> None:
        """Drop everything staged for the vbucket, ready runs and claimed ones included."""
        stage = self._vbuckets.pop(vbucket, None)
        if stage is None:
            return
        self._drop_rows(stage.pending)
        for run in stage.runs:
            self._drop_rows(run.rows)

    def close(self) -> None:
        """Discard every vbucket and remove the staging directory if nothing else is in it."""
        for vbucket in list(self._vbuckets):
            self.discard(vbucket)
        self._claims.clear()
        with contextlib.suppress(OSError):  # not empty or already gone: leave it
            os.rmdir(self._dir)

    def _remove_leftover_spill_files(self) -> None:
        """Delete spill files a killed run left here; their names would collide with ours."""
        try:
            names = os.listdir(self._dir)
        except OSError as exc:
            raise StagingError(
                f"cannot list staging directory {self._dir}: {exc.strerror}"
            ) from exc
        leftovers = sorted(name for name in names if SPILL_FILE_NAME.fullmatch(name))
        if not leftovers:
            return
        for name in leftovers:
            path = os.path.join(self._dir, name)
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise StagingError(
                    f"cannot delete leftover spill file {path} of an earlier run: "
                    f"{exc.strerror}; delete it or set staging_dir to another directory"
                ) from exc
        _log.info(
            "removed %d leftover spill files of an earlier run from %s", len(leftovers), self._dir
        )

    def _stage(self, vbucket: int) -> _VbucketStage:
        stage = self._vbuckets.get(vbucket)
        if stage is None:
            stage = self._vbuckets[vbucket] = _VbucketStage()
        return stage

    def _make_room(self, incoming: int) -> None:
        if self._buffered + incoming <= self._budget:
            return
        # Sized once: spilling one vbucket leaves the others' sizes as they were, and sizing
        # 1024 vbuckets again for every spill showed up in profiles.
        sizes = [(stage.spillable_bytes(), vb) for vb, stage in self._vbuckets.items()]
        sizes.sort(key=lambda entry: entry[0], reverse=True)
        for size, vbucket in sizes:
            if size == 0 or self._buffered + incoming <= self._budget:
                return
            self._spill_vbucket(vbucket)

    def _spill_vbucket(self, vbucket: int) -> None:
        """Write all spillable in-memory rows of the vbucket to files, all or nothing."""
        written: list[tuple[_Rows, _SpillFile]] = []
        try:
            for rows in self._stage(vbucket).spillable():
                table = pa.concat_tables(rows.tables)
                already = sum(spill.file_bytes for _, spill in written)
                spill = self._write_spill(
                    vbucket, table, already_written=already, arrow_bytes=rows.memory_bytes
                )
                written.append((rows, spill))
        except StagingError:
            for _, spill in written:
                remove_spill_file(spill.path)
            raise
        for rows, spill in written:
            self._buffered -= rows.memory_bytes
            self._spilled_file_bytes += spill.file_bytes
            self._spilled_total += spill.file_bytes
            rows.tables.clear()
            rows.loose_tables = 0
            rows.memory_bytes = 0
            rows.files.append(spill)

    def _write_spill(
        self, vbucket: int, table: pa.Table, *, already_written: int, arrow_bytes: int
    ) -> _SpillFile:
        path = os.path.join(self._dir, f"vb{vbucket:04d}-{self._next_file:08d}.parquet")
        self._next_file += 1
        try:
            self._fault("before_spill_write")
            size = self._write(table, path)
            self._fault("after_spill_write")
        except OSError as exc:
            if not isinstance(exc, FileExistsError):  # an existing file is not ours to delete
                remove_spill_file(path)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StagingError(
                    f"cannot spill {table.num_rows} rows of vbucket {vbucket} to {path}: the "
                    f"disk is full ({free_space(self._dir)} in staging directory {self._dir}); "
                    "free space there, set staging_dir to a larger disk, or raise "
                    "memory_budget_mb"
                ) from exc
            raise StagingError(
                f"cannot spill {table.num_rows} rows of vbucket {vbucket} to {path} in staging "
                f"directory {self._dir}: {exc.strerror or exc}; fix the directory or set "
                "staging_dir to another one"
            ) from exc
        if (
            self._spill_limit is not None
            and self._spilled_file_bytes + already_written + size > self._spill_limit
        ):
            remove_spill_file(path)
            raise StagingError(
                f"cannot spill {table.num_rows} rows of vbucket {vbucket}: the staging directory "
                f"would exceed its limit of {self._spill_limit} bytes; commit more often or "
                "raise the limit"
            )
        return _SpillFile(path, size, table.num_rows, arrow_bytes)

    def _fault(self, step: str) -> None:
        if self._fault_hook is not None:
            self._fault_hook(step)

    def _drop_rows(self, rows: _Rows) -> None:
        self._buffered -= rows.memory_bytes
        for spill in rows.files:
            remove_spill_file(spill.path)
            self._spilled_file_bytes -= spill.file_bytes
        rows.tables.clear()
        rows.loose_tables = 0
        rows.files.clear()
        rows.memory_bytes = 0
        rows.row_count = 0


def _note_history(ranges: list[SeqnoRange], snapshot: CompleteSnapshot) -> None:
    """Add a HISTORY snapshot's seqno range, joined to the last range when they touch."""
    if not snapshot.flags & SnapshotFlags.HISTORY:
        return
    first = snapshot.start_seqno if snapshot.history_from is None else snapshot.history_from
    if first > snapshot.end_seqno:
        return
    if ranges and ranges[-1][1] + 1 >= first:
        ranges[-1] = (ranges[-1][0], max(ranges[-1][1], snapshot.end_seqno))
    else:
        ranges.append((first, snapshot.end_seqno))


