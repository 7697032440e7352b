"""Group-commit planning: thresholds, positions, first loads, batch caps, deduplication."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicator.dcp.protocol.events import (
    Deletion,
    Mutation,
    SnapshotFlags,
    SystemEvent,
    SystemEventType,
)
from replicator.model.positions import FailoverLog, VbucketPosition
from replicator.planning.planner import (
    SLOW_COMMIT_S,
    CommitThresholds,
    CommitTrigger,
    deduplicate_changes,
    plan_commit,
    seconds_until_due,
    stretched_for_slow_commits,
    without_vbucket,
)
from replicator.staging.assembly import CompleteSnapshot
from replicator.staging.collections import CollectionRegistry
from replicator.staging.rows import CHANGE_SCHEMA, ChangeRowConverter
from replicator.staging.spill import read_rows
from replicator.staging.stager import StagedSnapshots, Stager

THRESHOLDS = CommitThresholds(max_rows=100, max_bytes=1_000_000, max_delay_seconds=5.0)
LOGS = {vb: FailoverLog.of([(0xB0B, 50), (0xA1A, 0)]) for vb in range(8)}


def run(
    vbucket: int,
    start: int,
    end: int,
    *,
    rows: int = 1,
    ready_since: float = 0.0,
    run_id: int | None = None,
    claimed_by: int | None = None,
    purge_seqno: int | None = None,
    manifest_uid: int | None = None,
    byte_count: int | None = None,
) -> StagedSnapshots:
    return StagedSnapshots(
        run_id=run_id if run_id is not None else vbucket * 1000 + end,
        vbucket=vbucket,
        start_seqno=start,
        end_seqno=end,
        snapshot_count=1,
        flags=SnapshotFlags.MEMORY,
        purge_seqno=purge_seqno,
        manifest_uid=manifest_uid,
        dropped_collection_ids=(),
        tables=(),
        spill_files=(f"/staging/vb{vbucket}-{end}.parquet",),
        row_count=rows,
        byte_count=byte_count if byte_count is not None else rows * 100,
        ready_since=ready_since,
        claimed_by=claimed_by,
    )


def test_nothing_is_planned_below_every_threshold() -> None:
    ready = {1: (run(1, 1, 5, rows=99, ready_since=10.0),)}
    assert plan_commit(ready, {}, LOGS, THRESHOLDS, batch_id=1, now=14.9) is None
    assert plan_commit({}, {}, LOGS, THRESHOLDS, batch_id=1, now=1e9, force=True) is None


@pytest.mark.parametrize(
    ("ready", "now", "trigger"),
    [
        ({1: (run(1, 1, 5, rows=60),), 2: (run(2, 1, 5, rows=40),)}, 0.0, CommitTrigger.ROWS),
        ({1: (run(1, 1, 5, rows=1, byte_count=1_000_000),)}, 0.0, CommitTrigger.BYTES),
        ({1: (run(1, 1, 5, rows=0, ready_since=10.0),)}, 15.0, CommitTrigger.DELAY),
    ],
    ids=["rows", "bytes", "delay"],
)
def test_each_threshold_triggers_a_commit(
    ready: dict[int, tuple[StagedSnapshots, ...]], now: float, trigger: CommitTrigger
) -> None:
    batch = plan_commit(ready, {}, LOGS, THRESHOLDS, batch_id=7, now=now)
    assert batch is not None
    assert batch.trigger is trigger
    assert batch.batch_id == 7
    assert set(batch.vbuckets) == set(ready)


def test_a_run_with_its_targets_staged_commits_without_waiting_for_the_delay() -> None:
    ready = {1: (run(1, 1, 5, rows=10, ready_since=10.0),)}
    waiting = plan_commit(ready, {}, LOGS, THRESHOLDS, batch_id=1, now=10.0)
    staged = plan_commit(ready, {}, LOGS, THRESHOLDS, batch_id=1, now=10.0, targets_staged=True)
    assert waiting is None
    assert staged is not None and staged.trigger is CommitTrigger.TARGETS_STAGED
    # A threshold that is reached anyway still names the commit.
    full = {1: (run(1, 1, 5, rows=100),)}
    by_rows = plan_commit(full, {}, LOGS, THRESHOLDS, batch_id=1, now=0.0, targets_staged=True)
    assert by_rows is not None and by_rows.trigger is CommitTrigger.ROWS


def test_force_commits_whatever_is_ready() -> None:
    ready = {3: (run(3, 1, 2, ready_since=10.0),)}
    batch = plan_commit(ready, {}, LOGS, THRESHOLDS, batch_id=2, now=10.0, force=True)
    assert batch is not None and batch.trigger is CommitTrigger.FORCED


def test_positions_take_the_uuid_of_the_failover_entry_for_the_new_seqno() -> None:
    ready = {
        1: (run(1, 1, 30), run(1, 31, 40, purge_seqno=12, manifest_uid=4)),
        2: (run(2, 51, 60),),
    }
    committed = {2: VbucketPosition.at_boundary(2, 0xB0B, 50, purge_seqno=3, manifest_uid=2)}
    batch = plan_commit(ready, committed, LOGS, THRESHOLDS, batch_id=1, now=0, force=True)
    assert batch is not None
    one, two = batch.commits
    assert one.position == VbucketPosition.at_boundary(1, 0xA1A, 40, purge_seqno=12, manifest_uid=4)
    assert two.position == VbucketPosition.at_boundary(2, 0xB0B, 60, purge_seqno=3, manifest_uid=2)
    assert (one.snapshot_start, one.snapshot_count, one.row_count) == (1, 2, 2)
    assert one.spill_files == ("/staging/vb1-30.parquet", "/staging/vb1-40.parquet")
    assert one.staged_run_ids == (1030, 1040)
    assert batch.positions == {1: one.position, 2: two.position}


def test_only_one_snapshot_that_promises_unique_keys_skips_deduplication() -> None:
    import dataclasses

    history = SnapshotFlags.DISK | SnapshotFlags.HISTORY
    duplicates = SnapshotFlags.MEMORY | SnapshotFlags.MAY_CONTAIN_DUPLICATES
    ready = {
        1: (run(1, 1, 30),),
        2: (run(2, 1, 30), run(2, 31, 40)),  # two runs
        3: (dataclasses.replace(run(3, 1, 30), snapshot_count=2),),  # two snapshots in one run
        4: (dataclasses.replace(run(4, 1, 30), flags=history),),
        5: (dataclasses.replace(run(5, 1, 30), flags=duplicates),),
    }
    logs = {vb: FailoverLog.of([(0xA1A, 0)]) for vb in ready}
    batch = plan_commit(ready, {}, logs, THRESHOLDS, batch_id=1, now=0, force=True)
    assert batch is not None
    assert {c.vbucket: c.unique_keys for c in batch.commits} == {
        1: True, 2: False, 3: False, 4: False, 5: False
    }


def test_first_load_is_a_vbucket_with_nothing_committed() -> None:
    ready = {1: (run(1, 0, 9),), 2: (run(2, 0, 9),), 3: (run(3, 21, 29),)}
    committed = {
        2: VbucketPosition.beginning(2),
        3: VbucketPosition.at_boundary(3, 0xA1A, 20),
    }
    batch = plan_commit(ready, committed, LOGS, THRESHOLDS, batch_id=1, now=0, force=True)
    assert batch is not None
    assert {c.vbucket: (c.first_load, c.previous_seqno) for c in batch.commits} == {
        1: (True, 0),
        2: (True, 0),
        3: (False, 20),
    }


def test_vbuckets_with_a_claimed_run_wait_for_its_release() -> None:
    ready = {
        1: (run(1, 1, 5, claimed_by=4), run(1, 6, 9)),
        2: (run(2, 1, 5),),
    }
    batch = plan_commit(ready, {}, LOGS, THRESHOLDS, batch_id=5, now=0, force=True)
    assert batch is not None and batch.vbuckets == (2,)
    only_claimed = {1: (run(1, 1, 5, claimed_by=4),)}
    assert plan_commit(only_claimed, {}, LOGS, THRESHOLDS, batch_id=5, now=0, force=True) is None


def test_batch_takes_oldest_vbuckets_first_within_the_caps() -> None:
    ready = {
        1: (run(1, 1, 5, rows=70, ready_since=3.0),),
        2: (run(2, 1, 5, rows=60, ready_since=1.0),),
        3: (run(3, 1, 5, rows=40, ready_since=2.0),),
        4: (run(4, 1, 5, rows=10, ready_since=4.0),),
    }
    batch = plan_commit(ready, {}, LOGS, THRESHOLDS, batch_id=1, now=0)
    assert batch is not None
    # 2 (oldest, 60) + 3 (40) fill the 100-row cap; 1 does not fit, 4 would exceed it.
    assert batch.vbuckets == (2, 3)
    assert batch.row_count == 100


def test_first_loads_fill_their_own_byte_cap_beside_the_merged_vbuckets() -> None:
    thresholds = CommitThresholds(max_rows=100, max_bytes=1_000, max_first_load_bytes=3_000)
    ready = {
        vb: (run(vb, 1, 5, rows=10, byte_count=1_000, ready_since=float(vb)),)
        for vb in range(1, 7)
    }
    # 1, 3 and 5 were loaded already: their rows are merged; 2, 4 and 6 are first loads.
    committed = {vb: VbucketPosition.at_boundary(vb, 0xA1A, vb % 2) for vb in ready}
    batch = plan_commit(ready, committed, LOGS, thresholds, batch_id=1, now=0, force=True)
    assert batch is not None
    # One merged vbucket fills max_bytes; the three first loads fit max_first_load_bytes.
    assert batch.vbuckets == (1, 2, 4, 6)
    assert [c.first_load for c in batch.commits] == [False, True, True, True]
    same_cap = CommitThresholds(max_rows=100, max_bytes=1_000, max_first_load_bytes=1_000)
    batch = plan_commit(ready, committed, LOGS, same_cap, batch_id=1, now=0, force=True)
    assert batch is not None and batch.vbuckets == (1, 2)


def test_one_vbucket_larger_than_the_caps_still_commits_alone() -> None:
    ready = {1: (run(1, 1, 5, rows=500),), 2: (run(2, 1, 5, rows=5, ready_since=1.0),)}
    batch = plan_commit(ready, {}, LOGS, THRESHOLDS, batch_id=1, now=0)
    assert batch is not None and batch.vbuckets == (1,) and batch.row_count == 500


def test_staged_end_below_the_committed_seqno_is_refused() -> None:
    committed = {1: VbucketPosition.at_boundary(1, 0xB0B, 90)}
    with pytest.raises(ValueError, match="vbucket 1: staged snapshots end at 80, below"):
        plan_commit(
            {1: (run(1, 70, 80),)}, committed, LOGS, THRESHOLDS, batch_id=1, now=0, force=True
        )


def test_missing_failover_log_is_refused() -> None:
    with pytest.raises(ValueError, match="vbucket 1: no failover log"):
        plan_commit({1: (run(1, 1, 2),)}, {}, {}, THRESHOLDS, batch_id=1, now=0, force=True)


@pytest.mark.parametrize(
    "arguments",
    [
        {"max_rows": 0},
        {"max_bytes": -1},
        {"max_delay_seconds": -0.5},
        {"max_first_load_bytes": 0},
    ],
)
def test_invalid_thresholds_are_refused(arguments: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(arguments))):
        CommitThresholds(**arguments)  # type: ignore[arg-type]


def test_without_vbucket_removes_only_that_vbucket() -> None:
    ready = {1: (run(1, 1, 5),), 2: (run(2, 1, 5),)}
    batch = plan_commit(ready, {}, LOGS, THRESHOLDS, batch_id=9, now=0, force=True)
    assert batch is not None
    smaller = without_vbucket(batch, 1)
    assert smaller.vbuckets == (2,) and smaller.batch_id == 9
    assert without_vbucket(smaller, 2).is_empty
    with pytest.raises(KeyError):
        smaller.commit_for(1)


def test_seconds_until_due_counts_from_the_oldest_unclaimed_run() -> None:
    ready = {
        1: (run(1, 1, 5, ready_since=10.0),),
        2: (run(2, 1, 5, ready_since=8.0, claimed_by=1),),
    }
    assert seconds_until_due(ready, THRESHOLDS, now=12.0) == pytest.approx(3.0)
    assert seconds_until_due(ready, THRESHOLDS, now=20.0) == 0.0
    assert seconds_until_due({}, THRESHOLDS, now=0.0) is None


@pytest.mark.parametrize("last_commit_s", [0.0, 9.9, SLOW_COMMIT_S])
def test_quick_commits_keep_the_configured_delay(last_commit_s: float) -> None:
    assert stretched_for_slow_commits(THRESHOLDS, last_commit_s) == THRESHOLDS


def test_after_a_slow_commit_a_batch_waits_as_long_as_it_took_but_rows_still_cap_it() -> None:
    stretched = stretched_for_slow_commits(THRESHOLDS, 20.0)
    assert stretched.max_delay_seconds == 20.0
    assert (stretched.max_rows, stretched.max_bytes) == (THRESHOLDS.max_rows, THRESHOLDS.max_bytes)
    waiting = {1: (run(1, 1, 5, rows=10, ready_since=10.0),)}
    # Due after the configured 5 s before, after 20 s now.
    assert plan_commit(waiting, {}, LOGS, THRESHOLDS, batch_id=1, now=15.0) is not None
    assert plan_commit(waiting, {}, LOGS, stretched, batch_id=1, now=15.0) is None
    assert seconds_until_due(waiting, stretched, now=15.0) == pytest.approx(15.0)
    late = plan_commit(waiting, {}, LOGS, stretched, batch_id=1, now=30.0)
    assert late is not None and late.trigger is CommitTrigger.DELAY
    full = {1: (run(1, 1, 5, rows=100, ready_since=10.0),)}
    early = plan_commit(full, {}, LOGS, stretched, batch_id=1, now=11.0)
    assert early is not None and early.trigger is CommitTrigger.ROWS
    # A configured delay longer than the commit is left alone.
    patient = CommitThresholds(max_delay_seconds=60.0)
    assert stretched_for_slow_commits(patient, 20.0) == patient


def test_partial_snapshots_wait_while_complete_ones_commit(tmp_path: Path) -> None:
    converter = ChangeRowConverter(now=lambda: 0.0)
    stager = Stager(tmp_path, clock=lambda: 0.0)
    for vbucket in (1, 2):
        items = [Mutation(vbucket, s, 1, s, 0, 0, 0, 0, b"k%d" % s, b"{}", True) for s in (1, 2)]
        stager.stage_rows(vbucket, converter.convert(items))
    stager.complete_snapshot(CompleteSnapshot(1, 1, 2, SnapshotFlags.MEMORY))
    batch = plan_commit(stager.ready_snapshots(), {}, LOGS, THRESHOLDS, batch_id=1, now=60.0)
    assert batch is not None and batch.vbuckets == (1,)
    stager.claim(batch)
    commit = batch.commit_for(1)
    assert read_rows(commit.tables, commit.spill_files)["seqno"].to_pylist() == [1, 2]
    stager.release(batch)
    assert stager.ready_snapshots() == {}
    assert stager.pending_rows(2) == 2


# Deduplication.


def change_table(changes: list[tuple[int, str, int]]) -> pa.Table:
    """Rows for (collection_id, key, seqno) changes, through the real converter."""
    registry = CollectionRegistry()
    for collection_id in {cid for cid, _, _ in changes}:
        created = SystemEventType.COLLECTION_CREATED
        registry.learn(SystemEvent(0, 0, created, 0, f"c{collection_id}", 1, 0, collection_id))
    items = [
        Deletion(0, seqno, 1, seqno, cid, key.encode())
        if seqno % 5 == 0
        else Mutation(0, seqno, 1, seqno, 0, 0, 0, cid, key.encode(), b'{"s": %d}' % seqno, True)
        for cid, key, seqno in changes
    ]
    return pa.Table.from_batches([ChangeRowConverter(registry).convert(items)], CHANGE_SCHEMA)


def test_dedup_keeps_the_highest_seqno_per_collection_and_key() -> None:
    table = change_table(
        [(0, "a", 3), (0, "b", 4), (0, "a", 9), (8, "a", 2), (0, "a", 6), (8, "a", 1)]
    )
    result = deduplicate_changes(table)
    assert result.schema.equals(CHANGE_SCHEMA)
    assert [
        (row["collection_id"], row["key"], row["seqno"], row["doc"]) for row in result.to_pylist()
    ] == [(0, "a", 9, '{"s": 9}'), (0, "b", 4, '{"s": 4}'), (8, "a", 2, '{"s": 2}')]


def test_dedup_keeps_a_later_delete_over_an_earlier_upsert() -> None:
    result = deduplicate_changes(change_table([(0, "a", 4), (0, "a", 5)]))
    assert [(row["seqno"], row["op"]) for row in result.to_pylist()] == [(5, "delete")]


def test_dedup_handles_chunked_tables_and_trivial_sizes() -> None:
    first = change_table([(0, "a", 1), (0, "b", 2)])
    second = change_table([(0, "a", 3)])
    combined = pa.concat_tables([first, second])
    assert combined["key"].num_chunks == 2
    assert deduplicate_changes(combined)["seqno"].to_pylist() == [3, 2]
    assert deduplicate_changes(CHANGE_SCHEMA.empty_table()).num_rows == 0
    assert deduplicate_changes(second)["seqno"].to_pylist() == [3]


def test_dedup_keeps_each_vbuckets_row_of_a_key_in_one_pass() -> None:
    table = change_table([(0, "a", 3), (0, "a", 4), (0, "b", 1), (0, "a", 2), (0, "a", 1)])
    vbuckets = pa.array([7, 7, 7, 2, 2], pa.int32())
    table = table.set_column(0, CHANGE_SCHEMA.field("vbucket"), vbuckets)
    result = deduplicate_changes(table)
    assert [(row["vbucket"], row["key"], row["seqno"]) for row in result.to_pylist()] == [
        (2, "a", 2), (7, "a", 4), (7, "b", 1)
    ]


def test_dedup_names_missing_columns() -> None:
    with pytest.raises(ValueError, match="'key'"):
        deduplicate_changes(pa.table({"collection_id": [1], "seqno": [1]}))


@st.composite
def interleaved_snapshots(draw: st.DrawFn) -> list[list[tuple[int, str, int]]]:
    """Snapshots of keys with increasing seqnos, in a shuffled order of arrival."""
    keys = st.tuples(st.sampled_from([0, 8, 9]), st.sampled_from(["a", "b", "c", "ä", "d1"]))
    snapshots: list[list[tuple[int, str, int]]] = []
    seqno = 0
    for _ in range(draw(st.integers(1, 6))):
        changes = []
        for collection_id, key in draw(st.lists(keys, max_size=8)):
            seqno += draw(st.integers(1, 3))
            changes.append((collection_id, key, seqno))
        snapshots.append(changes)
    return draw(st.permutations(snapshots))


@settings(max_examples=60, deadline=None)
@given(interleaved_snapshots())
def test_dedup_matches_a_dict_reference(snapshots: list[list[tuple[int, str, int]]]) -> None:
    changes = [change for snapshot in snapshots for change in snapshot]
    reference: dict[tuple[int, str], int] = {}
    for collection_id, key, seqno in changes:
        if seqno > reference.get((collection_id, key), -1):
            reference[(collection_id, key)] = seqno
    tables = [change_table(snapshot) for snapshot in snapshots if snapshot]
    table = pa.concat_tables(tables) if tables else CHANGE_SCHEMA.empty_table()
    result = deduplicate_changes(table)
    got = {(row["collection_id"], row["key"]): row["seqno"] for row in result.to_pylist()}
    assert result.num_rows == len(got)  # one row per (collection_id, key)
    assert got == reference
