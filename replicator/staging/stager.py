"""Bounded-memory staging of change rows per vbucket, spilling to Parquet files when over budget.

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
import re
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from replicator.dcp.protocol.events import (
    Deletion,
    DocumentChanges,
    Expiration,
    ItemEvent,
    Mutation,
    RollbackRequired,
    SnapshotFlags,
    StreamEnd,
    StreamEndReason,
    StreamEvent,
    StreamOpened,
    SystemEvent,
)
from replicator.errors import ReplicatorError
from replicator.model.positions import SeqnoRange
from replicator.staging.assembly import CompleteSnapshot, SnapshotAssembler
from replicator.staging.rows import CHANGE_SCHEMA, ChangeRowConverter

if TYPE_CHECKING:
    from replicator.planning.planner import CommitBatch

_log = logging.getLogger(__name__)

DEFAULT_MEMORY_BUDGET_BYTES = 256 * 1024 * 1024
"""Rows held in memory across all vbuckets before the largest is spilled."""

_TABLES_BEFORE_COMBINING = 16
"""An open snapshot's latest staged slices are copied into one table once they are this many."""

SpillWriter = Callable[[pa.Table, str], int]
"""Writes a table to a new file at a path (owner-only mode) and returns the file's size."""

SpillFaultHook = Callable[[str], None]
"""Called with each name of SPILL_FAULT_STEPS as a spill file is written (fault injection)."""

SPILL_FILE_NAME = re.compile(r"vb\d{4,}-\d{8,}\.parquet")
"""Names the Stager gives its spill files (vb0007-00000001.parquet); nothing else is removed."""

SPILL_FAULT_STEPS = ("before_spill_write", "after_spill_write")
"""Where a spill-file write calls the fault hook: an OSError raised at the first is handled
exactly like a failed write (ENOSPC reads as a full disk); at the second the file exists."""


class StagingError(ReplicatorError):
    """Rows could not be written to the staging directory (disk full, size limit, I/O error)."""


def write_spill_file(table: pa.Table, path: str) -> int:
    """Write `table` as a new Parquet file at `path`, mode 0600; return its size in bytes.

    Fails if `path` exists: a spill file is never overwritten.
    """
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(descriptor, "wb") as sink:
        # The umask can only narrow 0600; set it anyway so the mode never depends on it.
        os.fchmod(descriptor, 0o600)
        pq.write_table(table, sink)
        sink.flush()
        return sink.tell()


def staged_size(rows: pa.Table | pa.RecordBatch) -> int:
    """What rows count against the staging budget: the size of their Arrow buffers.

    Not `nbytes`, which costs about 150 us a call (pyarrow 26) whatever the size: paid per
    staged chunk, that was a tenth of the replication thread's time at 1024 vbuckets.
    """
    return int(rows.get_total_buffer_size())


def read_spill_file(path: str) -> pa.Table:
    """The rows of one spill file, with CHANGE_SCHEMA."""
    return pq.read_table(path, schema=CHANGE_SCHEMA)


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


def read_rows(tables: Iterable[pa.Table], spill_files: Iterable[str]) -> pa.Table:
    """Concatenate in-memory tables and spill files into one CHANGE_SCHEMA table."""
    parts = [*tables, *(read_spill_file(path) for path in spill_files)]
    if not parts:
        return CHANGE_SCHEMA.empty_table()
    return pa.concat_tables(parts)


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
        fault_hook: SpillFaultHook | None = None,
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

    def complete_snapshot(self, snapshot: CompleteSnapshot) -> None:
        """The vbucket's pending rows form the complete `snapshot`: they become ready."""
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
                ready_since=self._clock(),
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

    def claim(self, batch: CommitBatch) -> None:
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

    def release(self, batch: CommitBatch) -> None:
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
                _remove(spill.path)
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
                _remove(path)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StagingError(
                    f"cannot spill {table.num_rows} rows of vbucket {vbucket} to {path}: the "
                    f"disk is full ({_free_space(self._dir)} in staging directory {self._dir}); "
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
            _remove(path)
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
            _remove(spill.path)
            self._spilled_file_bytes -= spill.file_bytes
        rows.tables.clear()
        rows.loose_tables = 0
        rows.files.clear()
        rows.memory_bytes = 0
        rows.row_count = 0


class StreamStager:
    """Stages a DCP stream's events: snapshot assembly, row conversion in chunks, staging.

    Items wait in per-vbucket chunks of bounded size; `flush` converts the chunks of every
    vbucket in one conversion and stages each vbucket's rows, completing the snapshots that
    ended meanwhile in order. Once `feed` returns, the event is staged (in a chunk or in the
    stager), so the stream may count it towards BUFFER_ACK. `feed` returns the snapshot the
    event completed; its rows are ready in the stager after the next `flush` (the caller
    flushes once per polled batch). A failed stream's half-sent snapshot is dropped here and
    in the stager. After a ProtocolError or StagingError the vbucket's state is unreliable:
    `discard` it and reopen its stream.
    """

    def __init__(
        self,
        stager: Stager,
        converter: ChangeRowConverter | None = None,
        *,
        chunk_rows: int = 4096,
        chunk_bytes: int = 4 * 1024 * 1024,
    ) -> None:
        if chunk_rows <= 0 or chunk_bytes <= 0:
            raise ValueError("chunk_rows and chunk_bytes must be positive")
        self._stager = stager
        self._converter = converter if converter is not None else ChangeRowConverter()
        self._assembler = SnapshotAssembler(keep_items=False)
        self._chunk_rows = chunk_rows
        self._chunk_bytes = chunk_bytes
        self._chunks: dict[int, _Chunk] = {}
        self._chunked_bytes = 0

    @property
    def assembler(self) -> SnapshotAssembler:
        return self._assembler

    @property
    def stager(self) -> Stager:
        return self._stager

    @property
    def chunked_bytes(self) -> int:
        """Approximate bytes of items waiting in chunks for conversion."""
        return self._chunked_bytes

    def feed(self, event: StreamEvent) -> CompleteSnapshot | None:
        """Assemble one event into its vbucket's chunk; return the snapshot it completed."""
        completed = self._assembler.feed(event)
        vbucket = event.vbucket
        if type(event) is DocumentChanges:
            chunk = self._chunk(vbucket)
            chunk.items.append(event)
            chunk.rows += len(event)
            size = _RUN_ROW_OVERHEAD * len(event) + event.summary.data_bytes
            chunk.bytes += size
            self._chunked_bytes += size
        elif isinstance(event, Mutation | Deletion | Expiration | SystemEvent):
            # System events ride along so the converter learns collection names in order.
            chunk = self._chunk(vbucket)
            chunk.items.append(event)
            if not isinstance(event, SystemEvent):
                chunk.rows += 1
            size = _approximate_size(event)
            chunk.bytes += size
            self._chunked_bytes += size
        if completed is not None:
            chunk = self._chunk(vbucket)
            chunk.completions.append((chunk.rows, completed))
        elif _voids_partial(event):
            if vbucket in self._chunks and self._chunks[vbucket].completions:
                self.flush()  # the snapshots completed before the failure are kept
            self._drop_chunk(vbucket)
            self._stager.discard_pending(vbucket)
        elif vbucket in self._chunks and self._chunks[vbucket].rows >= self._chunk_rows:
            self.flush()
        if self._chunked_bytes >= self._chunk_bytes:
            self.flush()
        return completed

    def flush(self) -> None:
        """Convert every waiting chunk at once, stage the rows and complete the snapshots.

        One conversion for all vbuckets: converting per vbucket costs a fixed ~0.5 ms, which at
        1024 vbuckets of one-item snapshots was most of the replication thread's time.
        """
        if not self._chunks:
            return
        chunks = sorted(self._chunks.items())
        items = [item for _, chunk in chunks for item in chunk.items]
        rows = self._converter.convert(items)
        total_bytes = rows.get_total_buffer_size()
        self._chunks.clear()
        self._chunked_bytes = 0
        offset = 0
        for vbucket, chunk in chunks:
            staged = 0
            for boundary, snapshot in (*chunk.completions, (chunk.rows, None)):
                if boundary > staged:
                    part = rows.slice(offset + staged, boundary - staged)
                    # A slice shares the converted batch's buffers: charge its share of them.
                    share = total_bytes * part.num_rows // max(rows.num_rows, 1)
                    self._stager.stage_rows(vbucket, part, size_bytes=share)
                    staged = boundary
                if snapshot is not None:
                    self._stager.complete_snapshot(snapshot)
            offset += chunk.rows

    def discard(self, vbucket: int, *, resume_seqno: int | None = None) -> None:
        """Drop all the vbucket's staged and half-assembled rows (rollback or reconnect)."""
        self._assembler.discard(vbucket, resume_seqno=resume_seqno)
        self._drop_chunk(vbucket)
        self._stager.discard(vbucket)

    def _chunk(self, vbucket: int) -> _Chunk:
        chunk = self._chunks.get(vbucket)
        if chunk is None:
            chunk = self._chunks[vbucket] = _Chunk()
        return chunk

    def _drop_chunk(self, vbucket: int) -> None:
        chunk = self._chunks.pop(vbucket, None)
        if chunk is not None:
            self._chunked_bytes -= chunk.bytes


@dataclass(slots=True)
class _Chunk:
    """A vbucket's items waiting for conversion, and the snapshots they complete.

    `completions` are (rows of this chunk before the snapshot's end, snapshot), in order.
    """

    items: list[ItemEvent | DocumentChanges] = field(default_factory=list)
    rows: int = 0
    bytes: int = 0
    completions: list[tuple[int, CompleteSnapshot]] = field(default_factory=list)


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


def _voids_partial(event: StreamEvent) -> bool:
    """Whether the event makes the assembler drop the vbucket's half-received snapshot."""
    if isinstance(event, StreamEnd):
        return event.reason is not StreamEndReason.OK
    return isinstance(event, StreamOpened | RollbackRequired)


_RUN_ROW_OVERHEAD = 64
"""Bytes per row of a columnar run besides its keys and values: the numeric columns, roughly."""


def _approximate_size(item: Mutation | Deletion | Expiration | SystemEvent) -> int:
    # Fixed part: the numeric columns and Python object overhead, roughly.
    if isinstance(item, Mutation):
        return 96 + len(item.key) + len(item.value)
    if isinstance(item, SystemEvent):
        return 96 + len(item.name)
    return 96 + len(item.key)


def _free_space(directory: str) -> str:
    """The free space of the directory's filesystem for an operator: "12.5 MiB free"."""
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        return "free space unknown"
    return f"{free / 2**20:.1f} MiB free"


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        # A leftover spill file wastes space but loses nothing; the run's directory is temporary.
        _log.warning("could not delete spill file %s: %s", path, exc.strerror)
