"""Applying batches: APPEND for first loads, MERGE for steady state, exactly once, fenced."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from chispa import assert_df_equality

from replicator.delta.checkpoints import CheckpointsTable
from replicator.delta.commit_metadata import txn_version
from replicator.delta.executor import CommitExecutor, CommitFailed, WriteStrategy
from replicator.delta.ownership import OwnerClaim, OwnersTable
from replicator.delta.schema import MirrorConfig
from replicator.delta.table import MirrorTable, open_or_create
from replicator.errors import OwnershipConflict
from replicator.model.positions import VbucketPosition
from tests.delta.conftest import BUCKET
from tests.delta.helpers import (
    UUID,
    batch,
    change_table,
    commits_of_batch,
    delete,
    documents,
    upsert,
    vbucket_commit,
)

pytestmark = pytest.mark.spark

EXPIRED = datetime(2020, 1, 1, tzinfo=UTC)


@pytest.fixture
def mirror_path(tmp_path: Path) -> Path:
    """Each test writes its own table: Delta's txn ids (owner, batch) and the checkpoints would
    otherwise tie a test to the batches the tests before it committed."""
    return tmp_path / "travel"


@pytest.fixture
def mirror(spark: Any, mirror_path: Path) -> MirrorTable:
    """A bucket of 64 vbuckets: 16 partitions of 4 vbuckets each."""
    return open_or_create(spark, str(mirror_path), MirrorConfig(BUCKET, num_vbuckets=64))


@pytest.fixture
def owners(mirror: MirrorTable) -> OwnersTable:
    return OwnersTable.of(mirror)


@pytest.fixture
def claim(owners: OwnersTable) -> OwnerClaim:
    """The test's writer owns vbuckets 0-63 (no release: the table goes with the test)."""
    return owners.claim(range(64), "test-writer")


@pytest.fixture
def executor(mirror: MirrorTable, claim: OwnerClaim, owners: OwnersTable) -> CommitExecutor:
    return CommitExecutor(mirror, claim, owners)


def expected_rows(spark: Any, rows: list[tuple[int, str, int, str | None]]) -> Any:
    return spark.createDataFrame(rows, "vbucket int, key string, seqno long, doc string")


def actual_rows(mirror: MirrorTable, vbuckets: list[int], version: int | None = None) -> Any:
    where = f"vbucket IN ({', '.join(map(str, vbuckets))})"
    return mirror.read(version).where(where).select("vbucket", "key", "seqno", "doc")


def test_first_load_appends_then_merge_updates_deletes_and_expires(
    spark: Any, mirror: MirrorTable, executor: CommitExecutor
) -> None:
    load = [
        upsert(1, "a", 1),
        upsert(1, "b", 2),
        upsert(1, "c", 3),
        delete(1, "d", 4),  # never existed: a first load drops deletes
        upsert(1, "a", 5, '{"v":"a2"}'),  # same key again in the batch: the newest wins
        upsert(1, "e", 6),
        delete(1, "e", 7),  # created and deleted within the batch: absent
    ]
    first = executor.execute(batch(1, vbucket_commit(1, load, seqno=7, first_load=True)))
    (append,) = first.commits
    assert append.strategy is WriteStrategy.APPEND and not append.already_committed
    assert_df_equality(
        actual_rows(mirror, [1]),
        expected_rows(
            spark, [(1, "a", 5, '{"v":"a2"}'), (1, "b", 2, '{"v":2}'), (1, "c", 3, '{"v":3}')]
        ),
        ignore_row_order=True,
        ignore_nullable=True,
    )

    steady = [
        upsert(1, "a", 8, '{"v":"a3"}'),
        delete(1, "b", 9),
        delete(1, "c", 10, expiry=EXPIRED),  # an expiry arrives as a delete with its expiry
        upsert(1, "f", 11),
        delete(1, "zz", 12),  # deleting an unknown key changes nothing
    ]
    second = executor.execute(
        batch(2, vbucket_commit(1, steady, seqno=12, first_load=False, previous_seqno=7))
    )
    (merge,) = second.commits
    assert merge.strategy is WriteStrategy.MERGE
    assert merge.table_version > append.table_version
    assert_df_equality(
        actual_rows(mirror, [1]),
        expected_rows(spark, [(1, "a", 8, '{"v":"a3"}'), (1, "f", 11, '{"v":11}')]),
        ignore_row_order=True,
        ignore_nullable=True,
    )
    # The previous version still shows the first load: each commit is a whole boundary.
    assert documents(mirror, [1], append.table_version) == {
        (1, "a", 5, '{"v":"a2"}'),
        (1, "b", 2, '{"v":2}'),
        (1, "c", 3, '{"v":3}'),
    }

    checkpoint = CheckpointsTable.of(mirror).latest([1])[1]
    assert checkpoint.position == VbucketPosition.at_boundary(1, UUID, 12)
    assert (checkpoint.table_version, checkpoint.batch_id) == (merge.table_version, 2)
    history = {r["version"]: r for r in mirror.delta().history().collect()}
    assert history[append.table_version]["operation"] == "WRITE"
    assert history[merge.table_version]["operation"] == "MERGE"
    metadata = json.loads(history[merge.table_version]["userMetadata"])
    assert metadata["kind"] == "commit" and metadata["batch"] == 2
    assert metadata["owner"] == executor.claim.owner_id
    assert metadata["positions"] == {"1": [UUID, 12]}  # a plain boundary: uuid and seqno


def _commit_file_paths(mirror_path: Path, version: int) -> list[str]:
    log = mirror_path / "_delta_log" / f"{version:020d}.json"
    paths = []
    for line in log.read_text().splitlines():
        action = json.loads(line)
        for kind in ("add", "remove", "cdc"):
            if kind in action:
                paths.append(action[kind]["path"])
    return paths


def test_group_commit_rewrites_only_its_vbuckets_partitions(
    mirror: MirrorTable, mirror_path: Path, executor: CommitExecutor
) -> None:
    # Partitions of 4 vbuckets: 3 is in group 0, 4 in group 1, 12 in group 3.
    load = [upsert(vb, k, s) for vb in (3, 4, 12) for s, k in enumerate("pqr", start=1)]
    executor.execute(
        batch(10, *(vbucket_commit(vb, load, seqno=3, first_load=True) for vb in (3, 4, 12)))
    )
    untouched_files = sorted(actual_rows(mirror, [12]).inputFiles())

    changes = [upsert(3, "p", 4, '{"new":1}'), delete(4, "q", 4), upsert(4, "s", 5)]
    outcome = executor.execute(
        batch(
            11,
            vbucket_commit(3, changes, seqno=4, first_load=False, previous_seqno=3),
            vbucket_commit(4, changes, seqno=5, first_load=False, previous_seqno=3),
        )
    )
    (merge,) = outcome.commits
    assert merge.vbuckets == (3, 4)
    touched = _commit_file_paths(mirror_path, merge.table_version)
    assert touched, "the merge changed files"
    assert {path.split("/")[0] for path in touched if not path.startswith("_")} <= {
        "vbucket_group=0",
        "vbucket_group=1",
    }
    metrics = mirror.delta().history().where(f"version = {merge.table_version}").first()
    assert metrics is not None
    # Delta can only prune files by literals on target columns: without `t.vbucket_group IN
    # (0, 1)` and `t.vbucket IN (3, 4)` the join condition alone would scan every partition.
    predicate = metrics["operationParameters"]["predicate"]
    for column, expected in (("vbucket_group", {0, 1}), ("vbucket", {3, 4})):
        literal = re.search(rf"\b{column}(?:#\d+)? IN \(([\d, ]+)\)", predicate)
        assert literal is not None, f"no literal {column} IN (...) in the MERGE: {predicate}"
        assert {int(vb) for vb in literal.group(1).split(",")} == expected
    operation_metrics = metrics["operationMetrics"]
    assert int(operation_metrics["numTargetRowsUpdated"]) == 1
    assert int(operation_metrics["numTargetRowsDeleted"]) == 1
    assert int(operation_metrics["numTargetRowsInserted"]) == 1
    assert sorted(actual_rows(mirror, [12]).inputFiles()) == untouched_files
    assert documents(mirror, [3, 4]) == {
        (3, "p", 4, '{"new":1}'),
        (3, "q", 2, '{"v":2}'),
        (3, "r", 3, '{"v":3}'),
        (4, "p", 1, '{"v":1}'),
        (4, "r", 3, '{"v":3}'),
        (4, "s", 5, '{"v":5}'),
    }


def test_mixed_batch_becomes_an_append_and_a_merge_commit(
    mirror: MirrorTable, executor: CommitExecutor
) -> None:
    executor.execute(batch(20, vbucket_commit(6, [upsert(6, "x", 1)], seqno=1, first_load=True)))
    changes = [upsert(6, "x", 2, '"x2"'), upsert(7, "y", 1)]
    outcome = executor.execute(
        batch(
            21,
            vbucket_commit(6, changes, seqno=2, first_load=False, previous_seqno=1),
            vbucket_commit(7, changes, seqno=1, first_load=True),
        )
    )
    append, merge = outcome.commits
    assert (append.strategy, append.part, append.vbuckets) == (WriteStrategy.APPEND, 0, (7,))
    assert (merge.strategy, merge.part, merge.vbuckets) == (WriteStrategy.MERGE, 1, (6,))
    assert outcome.positions == {
        6: VbucketPosition.at_boundary(6, UUID, 2),
        7: VbucketPosition.at_boundary(7, UUID, 1),
    }
    latest = CheckpointsTable.of(mirror).latest([6, 7])
    assert latest[7].table_version == append.table_version
    assert latest[6].table_version == merge.table_version
    txns = {
        r["version"]: r["userMetadata"]
        for r in mirror.delta().history().collect()
        if r["version"] in (append.table_version, merge.table_version)
    }
    assert {json.loads(m)["part"] for m in txns.values()} == {0, 1}
    assert txn_version(21, 0) < txn_version(21, 1) < txn_version(22, 0)
    assert documents(mirror, [6, 7]) == {(6, "x", 2, '"x2"'), (7, "y", 1, '{"v":1}')}


def test_the_same_batch_twice_commits_once(
    mirror: MirrorTable, executor: CommitExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    executor.execute(batch(30, vbucket_commit(8, [upsert(8, "k", 1)], seqno=1, first_load=True)))
    again = batch(31, vbucket_commit(8, [upsert(8, "k", 2, '"k2"')], seqno=2, first_load=False))
    first = executor.execute(again)
    second = executor.execute(again)
    assert second.commits[0].already_committed
    assert second.commits[0].table_version == first.commits[0].table_version

    # Even when the history lookup misses it, Delta's txn ids skip the write.
    found = MirrorTable.find_commit
    misses = iter([True])
    monkeypatch.setattr(
        MirrorTable,
        "find_commit",
        lambda self, *a, **k: None if next(misses, False) else found(self, *a, **k),
    )
    third = executor.execute(again)
    assert third.commits[0].table_version == first.commits[0].table_version
    assert commits_of_batch(mirror, executor.claim.owner_id, 31) == [first.commits[0].table_version]
    assert documents(mirror, [8]) == {(8, "k", 2, '"k2"')}
    assert len(CheckpointsTable.of(mirror).for_vbucket(8)) == 2


def test_spilled_and_in_memory_duplicates_keep_the_newest(
    mirror: MirrorTable, executor: CommitExecutor, tmp_path: Path
) -> None:
    spill = tmp_path / "vb9-0001.parquet"
    pq.write_table(change_table([upsert(9, "a", 1), upsert(9, "b", 2), upsert(9, "a", 4)]), spill)
    in_memory = [upsert(9, "b", 3, '"b3"'), upsert(9, "c", 5)]
    commit = vbucket_commit(9, in_memory, seqno=5, first_load=True, spill_files=[str(spill)])
    executor.execute(batch(40, commit))
    assert documents(mirror, [9]) == {
        (9, "a", 4, '{"v":4}'),
        (9, "b", 3, '"b3"'),
        (9, "c", 5, '{"v":5}'),
    }
    # The same duplicates in a steady-state MERGE (two matches for one row would fail it).
    more = [upsert(9, "a", 6), upsert(9, "a", 7, '"a7"'), delete(9, "c", 8)]
    executor.execute(batch(41, vbucket_commit(9, more, seqno=8, first_load=False)))
    assert documents(mirror, [9]) == {(9, "a", 7, '"a7"'), (9, "b", 3, '"b3"')}


def test_a_dropped_collection_loses_all_its_rows(
    mirror: MirrorTable, executor: CommitExecutor
) -> None:
    load = [
        upsert(10, "h1", 1, collection_id=8),
        upsert(10, "h2", 2, collection_id=8),
        upsert(10, "d", 3),
    ]
    executor.execute(batch(50, vbucket_commit(10, load, seqno=3, first_load=True)))
    # h3 was written and then the collection dropped, all in this batch.
    changes = [upsert(10, "h3", 4, collection_id=8), upsert(10, "d", 6, '"d6"')]
    executor.execute(
        batch(
            51, vbucket_commit(10, changes, seqno=6, first_load=False, dropped_collection_ids=[8])
        )
    )
    assert documents(mirror, [10]) == {(10, "d", 6, '"d6"')}


def test_first_load_into_a_vbucket_that_has_rows_is_refused(
    mirror: MirrorTable, executor: CommitExecutor
) -> None:
    executor.execute(batch(60, vbucket_commit(1, [upsert(1, "p", 1)], seqno=1, first_load=True)))
    with pytest.raises(CommitFailed, match=r"vbuckets \[1\] are marked first load but hold rows"):
        executor.execute(
            batch(61, vbucket_commit(1, [upsert(1, "q", 30)], seqno=30, first_load=True))
        )
    assert commits_of_batch(mirror, executor.claim.owner_id, 61) == []
    assert documents(mirror, [1]) == {(1, "p", 1, '{"v":1}')}


def test_a_later_run_finds_the_rows_an_earlier_one_loaded(
    mirror: MirrorTable, executor: CommitExecutor, claim: OwnerClaim, owners: OwnersTable
) -> None:
    executor.execute(batch(62, vbucket_commit(2, [upsert(2, "p", 1)], seqno=1, first_load=True)))
    later_run = CommitExecutor(mirror, claim, owners)
    with pytest.raises(CommitFailed, match=r"vbuckets \[2\] are marked first load but hold rows"):
        later_run.execute(
            batch(63, vbucket_commit(2, [upsert(2, "q", 30)], seqno=30, first_load=True))
        )
    later_run.execute(batch(63, vbucket_commit(3, [upsert(3, "r", 4)], seqno=4, first_load=True)))
    assert documents(mirror, [2, 3]) == {(2, "p", 1, '{"v":1}'), (3, "r", 4, '{"v":4}')}


def test_an_initial_load_scans_the_table_once_not_per_append(
    executor: CommitExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each append of a first load asks which of its vbuckets hold rows; the table is read
    for that once per run, and again only for vbuckets this run has written since."""
    executor.execute(batch(80, vbucket_commit(5, [upsert(5, "a", 1)], seqno=1, first_load=True)))
    scanned: list[list[int]] = []
    scan = CommitExecutor._scan_vbuckets_with_rows

    def counted(self: CommitExecutor, vbuckets: Sequence[int]) -> list[int]:
        scanned.append(list(vbuckets))
        return scan(self, vbuckets)

    monkeypatch.setattr(CommitExecutor, "_scan_vbuckets_with_rows", counted)
    executor.execute(batch(81, vbucket_commit(6, [upsert(6, "b", 1)], seqno=1, first_load=True)))
    executor.execute(batch(82, vbucket_commit(7, [upsert(7, "c", 1)], seqno=1, first_load=True)))
    assert scanned == []  # the table was new at the first append: nothing to read since
    with pytest.raises(CommitFailed, match=r"vbuckets \[6\] are marked first load"):
        executor.execute(
            batch(83, vbucket_commit(6, [upsert(6, "d", 9)], seqno=9, first_load=True))
        )
    assert scanned == [[6]]


def test_batches_for_unclaimed_vbuckets_are_refused(executor: CommitExecutor) -> None:
    with pytest.raises(OwnershipConflict, match=r"vbuckets \[64\] that owner 'test-writer'"):
        executor.execute(batch(70, vbucket_commit(64, [], seqno=1, first_load=True)))


def test_an_owner_whose_claim_was_taken_over_cannot_commit(mirror: MirrorTable) -> None:
    now = [datetime(2026, 5, 1, tzinfo=UTC)]
    owners = OwnersTable.of(mirror, clock=lambda: now[0])
    old = owners.claim([200], lease=timedelta(seconds=30), host="old", pid=1)
    now[0] += timedelta(seconds=31)
    owners.claim([200], lease=timedelta(seconds=30), host="new", pid=2)
    zombie = CommitExecutor(mirror, old, owners)
    with pytest.raises(OwnershipConflict, match="taken over by owner 'vb200' on host new pid 2"):
        zombie.execute(
            batch(1, vbucket_commit(200, [upsert(200, "z", 1)], seqno=1, first_load=True))
        )
    assert documents(mirror, [200]) == set()
