"""Staging: memory budget, spill files, ready runs, claim/release, discard, disk-full faults."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from replicator.dcp.protocol.events import (
    Mutation,
    SnapshotFlags,
    SnapshotMarker,
    StreamEnd,
    StreamEndReason,
    StreamEvent,
)
from replicator.errors import ProtocolError, ReplicatorError
from replicator.model.positions import FailoverLog
from replicator.planning.planner import (
    CommitThresholds,
    history_revisions,
    plan_commit,
    without_vbucket,
)
from replicator.staging.assembly import CompleteSnapshot
from replicator.staging.rows import CHANGE_SCHEMA, ChangeRowConverter
from replicator.staging.spill import read_spill_file, write_spill_file
from replicator.staging.stager import Stager, StagingError, staged_size
from replicator.staging.stream import StreamStager
from tests.clocks import ManualClock

CONVERTER = ChangeRowConverter(now=lambda: 0.0)


def mutation(vbucket: int, seqno: int, value_size: int = 200) -> Mutation:
    value = b'"' + b"x" * value_size + b'"'
    return Mutation(vbucket, seqno, 1, seqno, 0, 0, 0, 0, b"doc-%d" % seqno, value, True)


def rows(vbucket: int, seqnos: range, value_size: int = 200) -> pa.RecordBatch:
    return CONVERTER.convert([mutation(vbucket, s, value_size) for s in seqnos])


def snapshot(vbucket: int, start: int, end: int, **extra: object) -> CompleteSnapshot:
    return CompleteSnapshot(vbucket, start, end, SnapshotFlags.MEMORY, **extra)  # type: ignore[arg-type]


class FailingWriter:
    """Writes normally until call number `fail_on`, which fails like a full disk mid-write."""

    def __init__(self, fail_on: int) -> None:
        self.calls = 0
        self.fail_on = fail_on

    def __call__(self, table: pa.Table, path: str) -> int:
        self.calls += 1
        if self.calls == self.fail_on:
            Path(path).write_bytes(b"partial")  # a half-written file must not survive
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return write_spill_file(table, path)


def spill_paths(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.parquet"))


def seqnos_of(table: pa.Table) -> list[int]:
    return sorted(table["seqno"].to_pylist())


def test_snapshot_four_times_the_budget_spills_and_stays_within_budget(tmp_path: Path) -> None:
    chunk = rows(1, range(1, 21))
    budget = 4 * staged_size(chunk) + staged_size(chunk) // 2
    stager = Stager(tmp_path / "run", memory_budget_bytes=budget)
    total = 0
    seqno = 1
    while total < 4 * budget:
        batch = rows(1, range(seqno, seqno + 20))
        stager.stage_rows(1, batch)
        seqno += 20
        total += staged_size(batch)
        assert stager.buffered_bytes <= budget
    assert stager.peak_buffered_bytes <= budget + staged_size(chunk)
    assert stager.spilled_bytes > 0
    assert len(spill_paths(tmp_path / "run")) >= 3
    # Pending rows of an incomplete snapshot are not ready.
    assert stager.pending_rows(1) == seqno - 1
    assert stager.ready(1) == ()

    stager.complete_snapshot(snapshot(1, 1, seqno - 1))
    [run] = stager.ready(1)
    assert (run.start_seqno, run.end_seqno, run.row_count) == (1, seqno - 1, seqno - 1)
    assert run.spill_files and all(Path(path).exists() for path in run.spill_files)
    assert seqnos_of(run.read_rows()) == list(range(1, seqno))
    assert stager.pending_rows(1) == 0


def test_spill_files_are_owner_only_in_an_owner_only_directory(tmp_path: Path) -> None:
    directory = tmp_path / "table" / "_replicator_staging" / "run-7"
    stager = Stager(directory, memory_budget_bytes=1)
    stager.stage_rows(3, rows(3, range(1, 5)))
    [path] = spill_paths(directory)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    table = read_spill_file(str(path))
    assert table.schema.equals(CHANGE_SCHEMA)
    assert seqnos_of(table) == [1, 2, 3, 4]


def test_spill_files_carry_no_dictionary_and_no_statistics(tmp_path: Path) -> None:
    # They are read back whole: a dictionary and statistics would only cost the write.
    stager = Stager(tmp_path / "staging", memory_budget_bytes=1)
    stager.stage_rows(3, rows(3, range(1, 50)))
    [path] = spill_paths(tmp_path / "staging")
    group = pq.ParquetFile(path).metadata.row_group(0)
    chunks = [group.column(index) for index in range(group.num_columns)]
    assert not [c.path_in_schema for c in chunks if "RLE_DICTIONARY" in c.encodings]
    assert not [c.path_in_schema for c in chunks if c.is_stats_set]
    assert seqnos_of(read_spill_file(str(path))) == list(range(1, 50))


def test_a_restart_removes_the_killed_runs_spill_files_and_spills_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "staging" / "vb0-1"
    killed = Stager(directory, memory_budget_bytes=1)
    killed.stage_rows(3, rows(3, range(1, 5)))
    killed.stage_rows(4, rows(4, range(1, 5)))
    # The run is killed here: no close(), its two spill files stay behind.
    left_behind = spill_paths(directory)
    assert [path.name for path in left_behind] == [
        "vb0003-00000001.parquet",
        "vb0004-00000002.parquet",
    ]
    unrelated = directory / "notes.txt"
    unrelated.write_text("not a spill file")
    os.chmod(directory, 0o755)

    with caplog.at_level("INFO", logger="replicator.staging.stager"):
        restarted = Stager(directory, memory_budget_bytes=1)
    assert spill_paths(directory) == []
    assert "removed 2 leftover spill files" in caplog.text
    assert unrelated.read_text() == "not a spill file"
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700

    # The same file names as the killed run's come again and are written without a clash.
    restarted.stage_rows(3, rows(3, range(1, 5)))
    restarted.stage_rows(4, rows(4, range(1, 3)))
    assert [path.name for path in spill_paths(directory)] == [
        path.name for path in left_behind
    ]
    assert all(stat.S_IMODE(path.stat().st_mode) == 0o600 for path in spill_paths(directory))
    restarted.complete_snapshot(snapshot(4, 1, 2))
    [run] = restarted.ready(4)
    assert seqnos_of(run.read_rows()) == [1, 2]


def test_a_spill_file_that_exists_is_refused_and_left_alone(tmp_path: Path) -> None:
    stager = Stager(tmp_path, memory_budget_bytes=1)
    # Appears after the start (cannot happen while the owner holds its claim): never clobbered.
    squatter = tmp_path / "vb0001-00000001.parquet"
    squatter.write_bytes(b"someone else's")
    with pytest.raises(StagingError, match="File exists"):
        stager.stage_rows(1, rows(1, range(1, 3)))
    assert squatter.read_bytes() == b"someone else's"
    assert stager.pending_rows(1) == 0


def test_rows_larger_than_the_budget_go_straight_to_disk(tmp_path: Path) -> None:
    stager = Stager(tmp_path, memory_budget_bytes=1024)
    stager.stage_rows(2, rows(2, range(1, 51)))
    assert stager.buffered_bytes == 0 and stager.peak_buffered_bytes == 0
    assert stager.pending_rows(2) == 50
    assert len(spill_paths(tmp_path)) == 1


def test_the_largest_vbucket_is_spilled_first(tmp_path: Path) -> None:
    small = rows(1, range(1, 3))
    large = rows(2, range(1, 31))
    stager = Stager(tmp_path, memory_budget_bytes=staged_size(small) + staged_size(large) + 10)
    stager.stage_rows(1, small)
    stager.stage_rows(2, large)
    stager.complete_snapshot(snapshot(2, 1, 30))
    assert stager.spilled_bytes == 0
    stager.stage_rows(1, rows(1, range(3, 5)))
    [run] = stager.ready(2)
    assert run.tables == () and len(run.spill_files) == 1
    assert stager.buffered_bytes == staged_size(small) + staged_size(rows(1, range(3, 5)))
    assert all(path.name.startswith("vb0002-") for path in spill_paths(tmp_path))


def test_consecutive_snapshots_form_one_run(tmp_path: Path) -> None:
    clock = ManualClock(100.0)
    stager = Stager(tmp_path, clock=clock)
    stager.stage_rows(4, rows(4, range(1, 3)))
    stager.complete_snapshot(snapshot(4, 1, 2, purge_seqno=1))
    clock.now = 105.0
    stager.complete_snapshot(snapshot(4, 3, 5))  # no rows: only moves the position
    stager.stage_rows(4, rows(4, range(6, 8)))
    stager.complete_snapshot(snapshot(4, 6, 7, manifest_uid=9, dropped_collection_ids=(8,)))
    [run] = stager.ready(4)
    assert (run.start_seqno, run.end_seqno, run.snapshot_count, run.row_count) == (1, 7, 3, 4)
    assert (run.purge_seqno, run.manifest_uid, run.dropped_collection_ids) == (1, 9, (8,))
    assert run.ready_since == 100.0


def test_completing_a_snapshot_below_the_last_ready_end_is_refused(tmp_path: Path) -> None:
    stager = Stager(tmp_path)
    stager.complete_snapshot(snapshot(4, 1, 10))
    with pytest.raises(ValueError, match="ending at 5 completes after one ending at 10"):
        stager.complete_snapshot(snapshot(4, 1, 5))


def test_rows_of_another_schema_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="CHANGE_SCHEMA"):
        Stager(tmp_path).stage_rows(1, pa.table({"seqno": [1]}))


def test_discard_drops_pending_and_ready_rows_and_their_files(tmp_path: Path) -> None:
    stager = Stager(tmp_path, memory_budget_bytes=staged_size(rows(5, range(1, 11))))
    stager.stage_rows(5, rows(5, range(1, 11)))
    stager.complete_snapshot(snapshot(5, 1, 10))
    stager.stage_rows(5, rows(5, range(11, 21)))  # spills the ready run
    stager.stage_rows(6, rows(6, range(1, 3)))
    assert spill_paths(tmp_path)
    stager.discard(5)
    assert stager.ready(5) == () and stager.pending_rows(5) == 0
    assert spill_paths(tmp_path) == []
    assert stager.spilled_bytes == 0
    assert stager.buffered_bytes == staged_size(rows(6, range(1, 3)))
    assert stager.pending_rows(6) == 2


def test_discard_pending_keeps_ready_runs(tmp_path: Path) -> None:
    stager = Stager(tmp_path, memory_budget_bytes=1)
    stager.stage_rows(5, rows(5, range(1, 4)))
    stager.complete_snapshot(snapshot(5, 1, 3))
    stager.stage_rows(5, rows(5, range(4, 6)))
    stager.discard_pending(5)
    assert stager.pending_rows(5) == 0
    [run] = stager.ready(5)
    assert seqnos_of(run.read_rows()) == [1, 2, 3]
    assert len(spill_paths(tmp_path)) == 1


def plan(stager: Stager, batch_id: int) -> object:
    logs = {vb: FailoverLog.of([(0xFEED, 0)]) for vb in range(16)}
    batch = plan_commit(
        stager.ready_snapshots(), {}, logs, CommitThresholds(), batch_id=batch_id, now=0, force=True
    )
    assert batch is not None
    return batch


def test_release_deletes_the_committed_rows_only(tmp_path: Path) -> None:
    stager = Stager(tmp_path, memory_budget_bytes=1)
    stager.stage_rows(7, rows(7, range(1, 5)))
    stager.complete_snapshot(snapshot(7, 1, 4))
    batch = plan(stager, 1)
    stager.claim(batch)  # type: ignore[arg-type]
    # Snapshots completing after the claim do not join the claimed run.
    stager.stage_rows(7, rows(7, range(5, 7)))
    stager.complete_snapshot(snapshot(7, 5, 6))
    assert [run.end_seqno for run in stager.ready(7)] == [4, 6]
    assert len(spill_paths(tmp_path)) == 2
    stager.release(batch)  # type: ignore[arg-type]
    [left] = stager.ready(7)
    assert (left.end_seqno, left.claimed_by) == (6, None)
    assert len(spill_paths(tmp_path)) == 1
    assert seqnos_of(left.read_rows()) == [5, 6]
    with pytest.raises(ValueError, match="never claimed"):
        stager.release(batch)  # type: ignore[arg-type]


def test_claimed_rows_are_not_spilled(tmp_path: Path) -> None:
    first = rows(7, range(1, 5))
    stager = Stager(tmp_path, memory_budget_bytes=staged_size(first) + 1)
    stager.stage_rows(7, first)
    stager.complete_snapshot(snapshot(7, 1, 4))
    batch = plan(stager, 1)
    stager.claim(batch)  # type: ignore[arg-type]
    stager.stage_rows(8, rows(8, range(1, 3)))  # no room: goes to disk, the claimed run stays
    [claimed] = stager.ready(7)
    assert claimed.spill_files == () and claimed.claimed_by == 1
    assert stager.pending_rows(8) == 2 and stager.buffered_bytes == staged_size(first)


def test_release_of_a_batch_without_a_vbucket_unclaims_that_vbucket(tmp_path: Path) -> None:
    stager = Stager(tmp_path)
    for vbucket in (1, 2):
        stager.stage_rows(vbucket, rows(vbucket, range(1, 3)))
        stager.complete_snapshot(snapshot(vbucket, 1, 2))
    batch = plan(stager, 3)
    stager.claim(batch)  # type: ignore[arg-type]
    smaller = without_vbucket(batch, 2)  # type: ignore[arg-type]
    stager.release(smaller)
    assert stager.ready(1) == ()
    [kept] = stager.ready(2)
    assert kept.claimed_by is None and kept.row_count == 2


def test_claim_refuses_a_stale_batch(tmp_path: Path) -> None:
    stager = Stager(tmp_path)
    stager.complete_snapshot(snapshot(1, 1, 2))
    batch = plan(stager, 1)
    stager.complete_snapshot(snapshot(1, 3, 4))  # joins the run the batch was planned from
    with pytest.raises(ValueError, match="plan the batch again"):
        stager.claim(batch)  # type: ignore[arg-type]
    assert stager.ready(1)[0].claimed_by is None


def test_disk_full_while_spilling_raises_and_registers_nothing(tmp_path: Path) -> None:
    ready, pending = rows(9, range(1, 11)), rows(9, range(11, 21))
    writer = FailingWriter(fail_on=2)
    budget = staged_size(ready) + staged_size(pending) + 1
    stager = Stager(tmp_path, memory_budget_bytes=budget, spill_writer=writer)
    stager.stage_rows(9, ready)
    stager.complete_snapshot(snapshot(9, 1, 10))
    stager.stage_rows(9, pending)
    assert stager.spilled_bytes == 0
    before = (stager.buffered_bytes, stager.spilled_bytes, stager.pending_rows(9))
    # Needs room: vbucket 9's ready run (file 1) and pending rows (file 2) are spilled together.
    with pytest.raises(StagingError, match=r"vbucket 9 .*the disk is full") as caught:
        stager.stage_rows(9, rows(9, range(21, 31)))
    assert writer.calls == 2  # the first file was written, then removed again
    assert isinstance(caught.value, ReplicatorError)
    assert "free space" in str(caught.value)
    assert spill_paths(tmp_path) == []
    assert (stager.buffered_bytes, stager.spilled_bytes, stager.pending_rows(9)) == before
    [run] = stager.ready(9)
    assert run.spill_files == () and seqnos_of(run.read_rows()) == list(range(1, 11))
    # Once there is space again, staging goes on.
    writer.fail_on = 0
    stager.stage_rows(9, rows(9, range(21, 31)))
    assert stager.pending_rows(9) == 20


def test_disk_full_on_a_direct_spill_stages_nothing(tmp_path: Path) -> None:
    stager = Stager(tmp_path, memory_budget_bytes=10, spill_writer=FailingWriter(fail_on=1))
    with pytest.raises(StagingError, match="disk is full"):
        stager.stage_rows(1, rows(1, range(1, 4)))
    assert stager.pending_rows(1) == 0 and spill_paths(tmp_path) == []


def test_spill_size_limit_raises_a_staging_error(tmp_path: Path) -> None:
    stager = Stager(tmp_path, memory_budget_bytes=10, spill_limit_bytes=200)
    with pytest.raises(StagingError, match="limit of 200 bytes"):
        stager.stage_rows(1, rows(1, range(1, 4)))
    assert spill_paths(tmp_path) == [] and stager.spilled_bytes == 0


def test_close_removes_files_and_the_directory(tmp_path: Path) -> None:
    directory = tmp_path / "run"
    stager = Stager(directory, memory_budget_bytes=1)
    stager.stage_rows(1, rows(1, range(1, 4)))
    stager.close()
    assert not directory.exists()


def test_invalid_budget_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="memory budget"):
        Stager(tmp_path, memory_budget_bytes=0)


def test_unusable_staging_directory_raises_a_staging_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(StagingError, match="cannot create staging directory"):
        Stager(blocker / "run")


# StreamStager: events in, rows staged.


def test_stream_stager_stages_a_backfill_larger_than_memory(tmp_path: Path) -> None:
    one_chunk = staged_size(rows(0, range(1, 65), value_size=300))
    stager = Stager(tmp_path, memory_budget_bytes=one_chunk * 2)
    stream = StreamStager(stager, CONVERTER, chunk_rows=64, chunk_bytes=1 << 30)
    last = 64 * 8  # eight chunks: four times the budget
    assert stream.feed(SnapshotMarker(0, 0, last, SnapshotFlags.DISK)) is None
    for seqno in range(1, last):
        assert stream.feed(mutation(0, seqno, 300)) is None
        assert stager.buffered_bytes <= stager.memory_budget_bytes
    assert stager.pending_rows(0) == last - 64  # the last chunk is still waiting
    done = stream.feed(mutation(0, last, 300))
    assert done is not None and done.end_seqno == last and done.items == ()
    assert stager.peak_buffered_bytes <= stager.memory_budget_bytes + one_chunk
    assert stager.spilled_bytes > 0
    assert stager.ready(0) == ()  # ready once flushed: the caller flushes per polled batch
    stream.flush()
    [run] = stager.ready(0)
    assert seqnos_of(run.read_rows()) == list(range(1, last + 1))


def test_stream_stager_flushes_when_chunks_hold_too_many_bytes(tmp_path: Path) -> None:
    stager = Stager(tmp_path)
    stream = StreamStager(stager, CONVERTER, chunk_rows=10_000, chunk_bytes=2_000)
    stream.feed(SnapshotMarker(0, 1, 100, SnapshotFlags.MEMORY))
    for seqno in range(1, 11):
        stream.feed(mutation(0, seqno, 300))
        assert stream.chunked_bytes < 2_000
    assert stager.pending_rows(0) > 0


def test_stream_stager_drops_the_partial_of_a_failed_stream(tmp_path: Path) -> None:
    stager = Stager(tmp_path, memory_budget_bytes=1)
    stream = StreamStager(stager, CONVERTER, chunk_rows=2)
    events: list[StreamEvent] = [
        SnapshotMarker(0, 1, 2, SnapshotFlags.MEMORY),
        mutation(0, 1),
        mutation(0, 2),
        SnapshotMarker(0, 3, 9, SnapshotFlags.MEMORY),
        mutation(0, 3),
        mutation(0, 4),
        mutation(0, 5),
    ]
    for event in events:
        stream.feed(event)
    assert stager.pending_rows(0) == 2 and stream.chunked_bytes > 0
    stream.feed(StreamEnd(0, StreamEndReason.TOO_SLOW))
    assert stager.pending_rows(0) == 0 and stream.chunked_bytes == 0
    [run] = stager.ready(0)
    assert seqnos_of(run.read_rows()) == [1, 2]
    assert len(spill_paths(tmp_path)) == 1


def test_stream_stager_converts_all_vbuckets_at_once_and_splits_them_by_snapshot(
    tmp_path: Path,
) -> None:
    stager = Stager(tmp_path)
    stream = StreamStager(stager, CONVERTER)
    events: list[StreamEvent] = [
        SnapshotMarker(5, 1, 2, SnapshotFlags.MEMORY),
        SnapshotMarker(3, 1, 1, SnapshotFlags.MEMORY),
        mutation(5, 1),
        mutation(3, 1),  # completes vbucket 3's first snapshot
        SnapshotMarker(3, 2, 3, SnapshotFlags.MEMORY),
        mutation(5, 2),  # completes vbucket 5's
        mutation(3, 2),
        mutation(3, 3),  # completes vbucket 3's second
        SnapshotMarker(3, 4, 9, SnapshotFlags.MEMORY),
        mutation(3, 4),  # open
    ]
    completed = [done for event in events if (done := stream.feed(event)) is not None]
    assert [(c.vbucket, c.end_seqno) for c in completed] == [(3, 1), (5, 2), (3, 3)]
    assert stager.ready_snapshots() == {} and stream.chunked_bytes > 0
    assert stream.staged_up_to() == {3: 3, 5: 2}  # complete, waiting in chunks
    stream.flush()
    assert stream.staged_up_to() == {3: 3, 5: 2}
    assert stream.chunked_bytes == 0
    [run3] = stager.ready(3)  # consecutive snapshots of a vbucket are one run
    assert (run3.start_seqno, run3.end_seqno, run3.snapshot_count) == (1, 3, 2)
    assert seqnos_of(run3.read_rows()) == [1, 2, 3]
    assert len(run3.tables) == 1  # the snapshots a flush completes are staged as one slice
    assert set(run3.read_rows()["vbucket"].to_pylist()) == {3}
    [run5] = stager.ready(5)
    assert seqnos_of(run5.read_rows()) == [1, 2]
    assert stager.pending_rows(3) == 1 and stager.pending_rows(5) == 0


def test_snapshots_completing_after_a_claim_start_a_run_of_their_own_rows(
    tmp_path: Path,
) -> None:
    stager = Stager(tmp_path)
    stream = StreamStager(stager, CONVERTER)
    for event in (SnapshotMarker(3, 1, 1, SnapshotFlags.MEMORY), mutation(3, 1)):
        stream.feed(event)
    stream.flush()
    batch = plan(stager, 1)
    stager.claim(batch)  # type: ignore[arg-type]
    for seqno in (2, 3, 4):
        stream.feed(SnapshotMarker(3, seqno, seqno, SnapshotFlags.MEMORY))
        stream.feed(mutation(3, seqno))
    stream.feed(SnapshotMarker(3, 5, 9, SnapshotFlags.MEMORY))
    stream.feed(mutation(3, 5))  # open
    stream.flush()
    claimed, fresh = stager.ready(3)
    assert (claimed.end_seqno, claimed.claimed_by) == (1, 1)
    assert seqnos_of(claimed.read_rows()) == [1]
    assert (fresh.start_seqno, fresh.end_seqno, fresh.snapshot_count) == (2, 4, 3)
    assert seqnos_of(fresh.read_rows()) == [2, 3, 4] and len(fresh.tables) == 1
    assert stager.pending_rows(3) == 1


def test_a_snapshot_waiting_in_a_chunk_is_ready_since_it_arrived(tmp_path: Path) -> None:
    clock = ManualClock(100.0)
    stager = Stager(tmp_path, clock=clock)
    stream = StreamStager(stager, CONVERTER)
    stream.feed(SnapshotMarker(3, 1, 1, SnapshotFlags.MEMORY))
    stream.feed(mutation(3, 1))
    clock.now = 107.5  # flushed later, when a commit may be planned
    stream.flush()
    [run] = stager.ready(3)
    assert run.ready_since == 100.0


def test_stream_stager_keeps_a_snapshot_completed_before_its_stream_failed(
    tmp_path: Path,
) -> None:
    stager = Stager(tmp_path)
    stream = StreamStager(stager, CONVERTER)
    for event in (
        SnapshotMarker(0, 1, 1, SnapshotFlags.MEMORY),
        mutation(0, 1),
        SnapshotMarker(0, 2, 5, SnapshotFlags.MEMORY),
        mutation(0, 2),
        StreamEnd(0, StreamEndReason.TOO_SLOW),
    ):
        stream.feed(event)
    assert stager.pending_rows(0) == 0 and stream.chunked_bytes == 0
    [run] = stager.ready(0)
    assert run.end_seqno == 1 and seqnos_of(run.read_rows()) == [1]


def test_stream_stager_copies_many_small_slices_of_an_open_snapshot_into_one(
    tmp_path: Path,
) -> None:
    stager = Stager(tmp_path)
    stream = StreamStager(stager, CONVERTER)
    stream.feed(SnapshotMarker(0, 1, 100, SnapshotFlags.DISK))
    stream.feed(SnapshotMarker(1, 1, 100, SnapshotFlags.DISK))
    for seqno in range(1, 41):  # one row of each vbucket per flush, as in a polled batch
        stream.feed(mutation(0, seqno))
        stream.feed(mutation(1, seqno))
        stream.flush()
    for seqno in range(41, 101):  # the rest of vbucket 0's snapshot, in one chunk
        stream.feed(mutation(0, seqno))
    stream.flush()
    [run] = stager.ready(0)
    assert seqnos_of(run.read_rows()) == list(range(1, 101))
    # 40 one-row slices became two copies of 16 and 8 slices; the rest came as one slice.
    assert len(run.tables) == 11
    assert stager.pending_rows(1) == 40


def test_stream_stager_discard_drops_everything_of_the_vbucket(tmp_path: Path) -> None:
    stager = Stager(tmp_path)
    stream = StreamStager(stager, CONVERTER)
    stream.feed(SnapshotMarker(0, 1, 1, SnapshotFlags.MEMORY))
    stream.feed(mutation(0, 1))
    stream.feed(SnapshotMarker(0, 2, 5, SnapshotFlags.MEMORY))
    stream.feed(mutation(0, 2))
    stream.discard(0, resume_seqno=0)
    assert stager.ready(0) == () and stream.chunked_bytes == 0
    assert stream.assembler.high_completed_end(0) == 0


def test_stream_stager_rejects_bad_items_before_staging(tmp_path: Path) -> None:
    stager = Stager(tmp_path)
    stream = StreamStager(stager, CONVERTER)
    with pytest.raises(ProtocolError):
        stream.feed(mutation(0, 1))
    assert stream.chunked_bytes == 0


def test_stream_stager_names_rows_from_system_events(tmp_path: Path) -> None:
    from replicator.dcp.protocol.events import SystemEvent, SystemEventType
    from replicator.staging.collections import CollectionRegistry

    stager = Stager(tmp_path)
    stream = StreamStager(stager, ChangeRowConverter(CollectionRegistry()))
    stream.feed(SnapshotMarker(0, 1, 2, SnapshotFlags.MEMORY))
    stream.feed(SystemEvent(0, 1, SystemEventType.COLLECTION_CREATED, 0, "orders", 3, 0, 9))
    item = Mutation(0, 2, 1, 1, 0, 0, 0, 9, b"o-1", b"{}", True)
    done = stream.feed(item)
    assert done is not None and done.manifest_uid == 3
    stream.flush()
    table = stager.ready(0)[0].read_rows()
    assert table["collection"].to_pylist() == ["orders"]
    assert pc.all(pc.equal(table["collection_id"], 9)).as_py()


HISTORY = SnapshotFlags.MEMORY | SnapshotFlags.HISTORY | SnapshotFlags.MAY_CONTAIN_DUPLICATES


def history_snapshot(vbucket: int, start: int, end: int) -> CompleteSnapshot:
    return CompleteSnapshot(vbucket, start, end, HISTORY)


def test_history_snapshots_are_noted_as_seqno_ranges_joined_when_they_touch(
    tmp_path: Path,
) -> None:
    stager = Stager(tmp_path)
    stager.stage_rows(3, rows(3, range(1, 3)))
    stager.complete_snapshot(snapshot(3, 1, 2))  # deduplicated: not history
    stager.stage_rows(3, rows(3, range(3, 6)))
    stager.complete_snapshot(history_snapshot(3, 3, 5))
    stager.stage_rows(3, rows(3, range(6, 8)))
    stager.complete_snapshot(history_snapshot(3, 6, 7))
    stager.complete_snapshot(snapshot(3, 8, 9))
    stager.stage_rows(3, rows(3, range(10, 11)))
    stager.complete_snapshot(history_snapshot(3, 10, 10))
    [run] = stager.ready(3)
    assert run.history_ranges == ((3, 7), (10, 10))


def test_history_revisions_are_the_rows_of_history_ranges_spilled_or_not(tmp_path: Path) -> None:
    stager = Stager(tmp_path, memory_budget_bytes=4096)
    stager.stage_rows(2, rows(2, range(1, 4)))
    stager.complete_snapshot(snapshot(2, 1, 3))
    stager.stage_rows(2, rows(2, range(4, 40), value_size=400))  # spills: over the budget
    stager.complete_snapshot(history_snapshot(2, 4, 39))
    stager.stage_rows(5, rows(5, range(1, 3)))
    stager.complete_snapshot(history_snapshot(5, 1, 2))
    stager.stage_rows(6, rows(6, range(1, 3)))
    stager.complete_snapshot(snapshot(6, 1, 2))
    assert spill_paths(tmp_path)
    batch = plan(stager, 1)
    revisions = history_revisions(batch.commits)  # type: ignore[attr-defined]
    vbuckets, seqnos = revisions["vbucket"].to_pylist(), revisions["seqno"].to_pylist()
    assert list(zip(vbuckets, seqnos, strict=True)) == [
        *((2, s) for s in range(4, 40)), (5, 1), (5, 2)
    ]
    assert revisions.schema.equals(CHANGE_SCHEMA)


def test_only_the_history_part_of_a_backfill_is_noted(tmp_path: Path) -> None:
    stager = Stager(tmp_path)
    stager.stage_rows(3, rows(3, range(1, 9)))
    stager.complete_snapshot(CompleteSnapshot(3, 1, 8, HISTORY, history_from=6))
    [run] = stager.ready(3)
    assert run.history_ranges == ((6, 8),)
