"""The data table's layouts: mirrors made partitioned by vbucket keep working; compaction."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from chispa import assert_df_equality
from delta.tables import DeltaTable

from replicator.delta.commit_metadata import CommitMetadata
from replicator.delta.compaction import CompactionPolicy, Compactor
from replicator.delta.executor import CommitExecutor, WriteStrategy
from replicator.delta.log_checkpoints import wait_for_checkpoints
from replicator.delta.ownership import OwnersTable
from replicator.delta.rollback import plan_rollback, rollback_vbucket
from replicator.delta.schema import DATA_SCHEMA, DataLayout, MirrorConfig
from replicator.delta.store import DeltaMirrorStore
from replicator.delta.table import open_or_create
from replicator.model.positions import FailoverLog
from tests.delta.helpers import UUID, batch, delete, documents, upsert, vbucket_commit

pytestmark = pytest.mark.spark


def _create_per_vbucket_mirror(spark: Any, path: Path, config: MirrorConfig) -> None:
    """A data table as replicators before the grouped layout created it."""
    builder = (
        DeltaTable.createIfNotExists(spark)
        .location(str(path))
        .addColumns(DATA_SCHEMA)
        .partitionedBy("vbucket")
    )
    for key, value in config.data_table_properties().items():
        builder = builder.property(key, value)
    builder.execute()


def _data_paths(path: Path, version: int) -> list[str]:
    log = path / "_delta_log" / f"{version:020d}.json"
    actions = [json.loads(line) for line in log.read_text().splitlines()]
    return [a[k]["path"] for a in actions for k in ("add", "remove") if k in a]


def test_a_mirror_partitioned_by_vbucket_keeps_working(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "older"
    config = MirrorConfig("travel")
    _create_per_vbucket_mirror(spark, path, config)
    mirror = open_or_create(spark, str(path), config)
    assert mirror.data_layout == DataLayout(None)
    owners = OwnersTable.of(mirror)
    claim = owners.claim([1, 2])
    executor = CommitExecutor(mirror, claim, owners)

    executor.execute(
        batch(
            1,
            vbucket_commit(1, [upsert(1, "a", 1), upsert(1, "b", 2)], seqno=2, first_load=True),
            vbucket_commit(2, [upsert(2, "z", 1)], seqno=1, first_load=True),
        )
    )
    changes = [upsert(1, "a", 3, '"a3"'), delete(1, "b", 4), upsert(1, "c", 5)]
    (merge,) = executor.execute(
        batch(2, vbucket_commit(1, changes, seqno=5, first_load=False, previous_seqno=2))
    ).commits
    assert merge.strategy is WriteStrategy.MERGE
    assert documents(mirror, [1]) == {(1, "a", 3, '"a3"'), (1, "c", 5, '{"v":5}')}
    assert all(p.startswith("vbucket=1/") for p in _data_paths(path, merge.table_version))

    checkpoints = executor.checkpoints.for_vbucket(1)
    plan = plan_rollback(checkpoints, 1, 3, horizon=0)
    outcome = rollback_vbucket(
        executor, plan, batch_id=3, failover_log=FailoverLog.of([(UUID, 0)]), reason="test"
    )
    assert outcome.commit is not None and outcome.position.seqno == 2
    assert documents(mirror, [1]) == {(1, "a", 1, '{"v":1}'), (1, "b", 2, '{"v":2}')}
    assert documents(mirror, [2]) == {(2, "z", 1, '{"v":1}')}
    paths = _data_paths(path, outcome.commit.table_version)
    assert paths and all(p.startswith("vbucket=1/") for p in paths)
    owners.release(claim)


@pytest.mark.parametrize("writer", ["arrow", "spark"])
def test_compaction_packs_small_files_of_owned_partitions_and_changes_no_row(
    spark: Any, tmp_path: Path, writer: str
) -> None:
    path = tmp_path / "compacted"
    mirror = open_or_create(spark, str(path), MirrorConfig("travel", num_vbuckets=8))
    owners = OwnersTable.of(mirror)
    vbuckets = (0, 1)
    claim = owners.claim(vbuckets)
    executor = CommitExecutor(mirror, claim, owners)
    compactor = Compactor(
        mirror, claim.vbuckets, CompactionPolicy(files_per_partition=2), writer=writer
    )
    assert compactor.writer == writer
    assert compactor.partitions == [0, 1]  # width 1: every vbucket its own partition
    executor.execute(
        batch(1, *(vbucket_commit(vb, [upsert(vb, "k0", 1)], seqno=1, first_load=True)
                   for vb in vbuckets))
    )
    assert not compactor.due()  # the first look only notes where the table stands
    for n in range(2, 6):
        changes = [upsert(vb, f"k{n}", n) for vb in vbuckets]
        executor.execute(
            batch(n, *(vbucket_commit(vb, changes, seqno=n, first_load=False,
                                      previous_seqno=n - 1) for vb in vbuckets))
        )
    before = mirror.read()
    expected = spark.createDataFrame(before.collect(), before.schema)
    files_before = compactor.table_files()
    assert compactor.due()

    outcome = compactor.compact()

    assert outcome is not None and outcome.files_before == files_before
    assert outcome.files_after == len(vbuckets)  # one file per partition that has rows
    assert_df_equality(mirror.read(), expected, ignore_row_order=True)
    assert not compactor.due()
    newest = mirror.delta().history(1).first()
    assert newest is not None and newest["operation"] == "OPTIMIZE"
    assert str(newest["engineInfo"]).startswith("replicator") == (writer == "arrow")
    assert newest["operationMetrics"]["numAddedFiles"] == str(len(vbuckets))
    # Not a replicator commit: recovery and audits skip it.
    assert newest["userMetadata"] and CommitMetadata.from_json(newest["userMetadata"]) is None
    owners.release(claim)


def _large_doc(n: int) -> str:
    return json.dumps({"n": n, "pad": os.urandom(400).hex()})


@pytest.mark.parametrize("writer", ["arrow", "spark"])
def test_compactions_pack_recent_files_and_stagger_the_partitions_packed_whole(
    spark: Any, tmp_path: Path, writer: str
) -> None:
    mirror = open_or_create(spark, str(tmp_path / "tiers"), MirrorConfig("travel", num_vbuckets=8))
    owners = OwnersTable.of(mirror)
    vbuckets = (0, 1)
    claim = owners.claim(vbuckets)
    executor = CommitExecutor(mirror, claim, owners)
    compactor = Compactor(
        mirror, claim.vbuckets, CompactionPolicy(small_file_bytes=1, max_files_per_partition=2),
        writer=writer,
    )  # fmt: skip
    stricter = Compactor(
        mirror, claim.vbuckets, CompactionPolicy(small_file_bytes=1, max_files_per_partition=1),
        writer=writer,
    )  # fmt: skip
    base = [[upsert(vb, f"k{i}", i + 1, _large_doc(i)) for i in range(200)] for vb in vbuckets]
    executor.execute(batch(1, *(vbucket_commit(vb, base[vb], seqno=200, first_load=True)
                                for vb in vbuckets)))
    large = set(mirror.read().inputFiles())
    assert len(large) == len(vbuckets)
    seqno = 200

    def small_commits(count: int) -> None:
        nonlocal seqno
        for _ in range(count):
            seqno += 1
            executor.execute(batch(seqno, *(
                vbucket_commit(vb, [upsert(vb, f"k{seqno % 50}", seqno)], seqno=seqno,
                               first_load=False, previous_seqno=seqno - 1)
                for vb in vbuckets
            )))

    small_commits(3)
    expected = spark.createDataFrame(mirror.read().collect(), mirror.read().schema)

    minor = compactor.compact()

    # Each partition: its large file, untouched, and one file packed from the three small ones
    # (under a quarter of the large one).
    assert minor is not None and not minor.full and minor.waiting == ()
    assert minor.files_after == 2 * len(vbuckets)
    assert large <= set(mirror.read().inputFiles())
    assert_df_equality(mirror.read(), expected, ignore_row_order=True)

    small_commits(1)
    before = spark.createDataFrame(mirror.read().collect(), mirror.read().schema)
    first = stricter.compact()
    # A minor pass would leave two files a partition, above that policy's one: both are due to
    # be packed whole, and one compaction packs one of them (an eighth of two, at least one).
    assert first is not None and len(first.whole) == 1 and len(first.waiting) == 1
    assert sorted(first.whole + first.waiting) == compactor.partitions
    assert first.files_after == 1 + 2  # the other partition had its minor pass
    second = stricter.compact()
    assert second is not None and second.whole == first.waiting and second.waiting == ()
    assert second.files_after == len(vbuckets) and stricter.full_compactions == 2
    assert_df_equality(mirror.read(), before, ignore_row_order=True)
    owners.release(claim)


def test_files_appends_add_do_not_make_a_compaction_due(spark: Any, tmp_path: Path) -> None:
    mirror = open_or_create(spark, str(tmp_path / "due"), MirrorConfig("travel", num_vbuckets=8))
    owners = OwnersTable.of(mirror)
    claim = owners.claim((0, 1))
    executor = CommitExecutor(mirror, claim, owners)
    compactor = Compactor(mirror, claim.vbuckets, CompactionPolicy(files_per_partition=1))
    assert not compactor.due()  # the baseline: the empty table
    executor.execute(batch(1, *(
        vbucket_commit(vb, [upsert(vb, f"k{i}", i + 1) for i in range(20)], seqno=20,
                       first_load=True)
        for vb in (0, 1)
    )))  # fmt: skip
    assert compactor.due()  # two files more than the baseline
    compactor.note_appended()
    assert not compactor.due()
    executor.execute(batch(2, *(
        vbucket_commit(vb, [upsert(vb, "k1", 21)], seqno=21, first_load=False, previous_seqno=20)
        for vb in (0, 1)
    )))  # fmt: skip
    assert compactor.due()  # the MERGE's small files
    owners.release(claim)


def test_a_batch_s_resync_and_first_loads_append_both_count_in_the_compaction_baseline(
    spark: Any, tmp_path: Path
) -> None:
    # A resync commits first, then the append, whose writer counts the table's files, the
    # resync's included: neither may make a compaction due at once (vbuckets 0 and 1 share
    # partition 0, allowed one file more).
    mirror = open_or_create(spark, str(tmp_path / "both"), MirrorConfig("travel", num_vbuckets=64))
    owners = OwnersTable.of(mirror)
    claim = owners.claim((0, 1))
    executor = CommitExecutor(mirror, claim, owners)
    compactor = Compactor(mirror, claim.vbuckets, CompactionPolicy(files_per_partition=1))
    store = DeltaMirrorStore(executor, owners, claim, compactor=compactor)
    store.commit(batch(1, *(
        vbucket_commit(vb, [upsert(vb, f"k{i}", i + 1) for i in range(20)], seqno=20,
                       first_load=True)
        for vb in (0, 1)
    )), replace=frozenset({1}))  # fmt: skip
    history = mirror.delta().history().orderBy("version").collect()
    assert [CommitMetadata.from_json(h["userMetadata"]).strategy
            for h in history if h["userMetadata"]] == ["replace", "append"]  # fmt: skip
    assert not compactor.due()
    assert documents(mirror, [0, 1]) == {
        (vb, f"k{i}", i + 1, f'{{"v":{i + 1}}}') for vb in (0, 1) for i in range(20)
    }
    owners.release(claim)


class _CountingCompactor(Compactor):
    """A compactor that counts its reads of Delta's snapshot."""

    looks = 0

    def table_files(self) -> int:
        self.looks += 1
        return super().table_files()


def test_a_steady_batch_s_compaction_check_takes_the_writer_s_file_count(
    spark: Any, tmp_path: Path
) -> None:
    # After a version committed without Spark, Delta's snapshot counts files with Spark jobs
    # (about 2 s a batch on the 1M mirror); the writer has counted them already.
    mirror = open_or_create(spark, str(tmp_path / "n"), MirrorConfig("travel", num_vbuckets=64))
    owners = OwnersTable.of(mirror)
    claim = owners.claim((0, 1))  # both in partition 0: one file per commit
    compactor = _CountingCompactor(mirror, claim.vbuckets, CompactionPolicy(files_per_partition=3))
    store = DeltaMirrorStore(CommitExecutor(mirror, claim, owners), owners, claim,
                             compactor=compactor)  # fmt: skip
    store.commit(batch(1, *(
        vbucket_commit(vb, [upsert(vb, f"k{i}", i + 1) for i in range(20)], seqno=20,
                       first_load=True)
        for vb in (0, 1)
    )), replace=frozenset())  # fmt: skip
    looks = compactor.looks
    for n in range(2, 5):  # new documents each time: a new file, no file emptied
        store.commit(batch(n, *(
            vbucket_commit(vb, [upsert(vb, f"new{n}", 19 + n)], seqno=19 + n, first_load=False,
                           previous_seqno=18 + n)
            for vb in (0, 1)
        )), replace=frozenset())  # fmt: skip
        if n < 4:
            newest = mirror.delta().history(1).collect()[0]
            assert newest["engineInfo"].startswith("replicator")  # the writer's commit
            assert compactor.looks == looks and compactor.compactions == 0
    # The third new file made it due: compacted back to one file.
    assert compactor.compactions == 1 and len(mirror.read().inputFiles()) == 1
    owners.release(claim)


def test_compaction_counts_files_from_the_log_as_delta_does_without_a_spark_job(
    spark: Any, tmp_path: Path
) -> None:
    path = tmp_path / "counted"
    mirror = open_or_create(spark, str(path), MirrorConfig("travel", num_vbuckets=8))
    owners = OwnersTable.of(mirror)
    claim = owners.claim((0, 1, 2, 3))
    executor = CommitExecutor(mirror, claim, owners)
    compactor = Compactor(mirror, (1, 3), CompactionPolicy(files_per_partition=1))
    stale = Compactor(mirror, (1, 3))  # looks once now, then only after log retention ran

    def counted_alike(compactor: Compactor = compactor) -> None:
        spark.sparkContext.setJobGroup("compaction-counts", "the compactor's counts")
        try:
            counts = (compactor.table_files(), compactor.owned_files())
            jobs = spark.sparkContext.statusTracker().getJobIdsForGroup("compaction-counts")
        finally:
            spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
        assert jobs == []
        owned = mirror.read().where(compactor.partition_filter).inputFiles()
        assert counts == (len(mirror.read().inputFiles()), len(owned))

    executor.execute(batch(1, *(
        vbucket_commit(vb, [upsert(vb, "k0", 1)], seqno=1, first_load=True) for vb in range(4)
    )))  # fmt: skip
    counted_alike()
    counted_alike(stale)
    for n in range(2, 14):  # the writer's versions, Spark's checkpoint at 10, a compaction
        executor.execute(batch(n, *(
            vbucket_commit(vb, [upsert(vb, f"k{n}", n), delete(vb, f"k{n - 1}", n)], seqno=n,
                           first_load=False, previous_seqno=n - 1)
            for vb in range(4)
        )))  # fmt: skip
        if n == 6:
            counted_alike()
            assert compactor.compact() is not None
            counted_alike()
    counted_alike()
    # The commits after a look gone, as log retention removes them: read from the checkpoint.
    assert wait_for_checkpoints(str(path), timeout_s=120)
    assert (path / "_delta_log" / f"{10:020d}.checkpoint.parquet").exists()
    for version in range(2, 10):
        (path / "_delta_log" / f"{version:020d}.json").unlink()
    counted_alike(stale)
    owners.release(claim)


class _SteadyCommitFails(CommitExecutor):
    """An executor whose group commits fail: what a crash during a batch's MERGE leaves."""

    def execute(self, batch: Any) -> Any:
        raise RuntimeError("the steady part's commit failed")


def test_a_batch_s_resync_lands_before_its_steady_part(spark: Any, tmp_path: Path) -> None:
    # A vbucket awaiting a resync holds rows known to be wrong: its repair must not wait on
    # the batch's other vbuckets, whose MERGE a crash may interrupt.
    mirror = open_or_create(spark, str(tmp_path / "first"), MirrorConfig("travel", num_vbuckets=8))
    owners = OwnersTable.of(mirror)
    claim = owners.claim((0, 1))
    store = DeltaMirrorStore(_SteadyCommitFails(mirror, claim, owners), owners, claim)
    with pytest.raises(RuntimeError, match="steady part"):
        store.commit(batch(1, *(
            vbucket_commit(vb, [upsert(vb, f"k{i}", i + 1) for i in range(5)], seqno=5,
                           first_load=True)
            for vb in (0, 1)
        )), replace=frozenset({1}))  # fmt: skip
    assert documents(mirror, [0, 1]) == {(1, f"k{i}", i + 1, f'{{"v":{i + 1}}}') for i in range(5)}
    owners.release(claim)


class _InterruptedFlush(CommitExecutor):
    """An executor interrupted (a second SIGINT) while it writes the queued checkpoints."""

    def flush_checkpoints(self) -> None:
        raise KeyboardInterrupt


class _FailingFlush(CommitExecutor):
    def flush_checkpoints(self) -> None:
        raise RuntimeError("the checkpoints commit failed")


def test_an_interrupted_release_stays_interrupted_and_a_failed_one_still_releases(
    spark: Any, tmp_path: Path
) -> None:
    mirror = open_or_create(spark, str(tmp_path / "r"), MirrorConfig("travel", num_vbuckets=8))
    owners = OwnersTable.of(mirror)
    claim = owners.claim((0, 1))
    with pytest.raises(KeyboardInterrupt):
        DeltaMirrorStore(_InterruptedFlush(mirror, claim, owners), owners, claim).release()
    assert [r.claim_id for r in owners.records()] == [claim.claim_id]  # left to expire
    with pytest.raises(RuntimeError, match="checkpoints commit"):
        DeltaMirrorStore(_FailingFlush(mirror, claim, owners), owners, claim).release()
    assert owners.records() == []  # released all the same


class _FirstReplaceFails(CommitExecutor):
    """An executor whose first REPLACE fails before committing anything."""

    failed = False

    def replace_rows(self, *args: Any, **kwargs: Any) -> Any:
        if not self.failed:
            self.failed = True
            raise RuntimeError("the resync's commit failed")
        return super().replace_rows(*args, **kwargs)


def test_a_resync_that_failed_keeps_its_reason_for_the_next_attempt(
    spark: Any, tmp_path: Path
) -> None:
    mirror = open_or_create(spark, str(tmp_path / "again"), MirrorConfig("travel", num_vbuckets=8))
    owners = OwnersTable.of(mirror)
    claim = owners.claim((1,))
    store = DeltaMirrorStore(_FirstReplaceFails(mirror, claim, owners), owners, claim)
    store._resync_reasons[1] = "history purged past seqno 7"
    resync = batch(1, vbucket_commit(1, [upsert(1, "k", 3)], seqno=3, first_load=True))
    with pytest.raises(RuntimeError, match="resync"):
        store.commit(resync, replace=frozenset({1}))
    store.commit(resync, replace=frozenset({1}))
    [replace] = [
        CommitMetadata.from_json(h["userMetadata"])
        for h in mirror.delta().history().collect()
        if h["userMetadata"]
    ]
    assert replace is not None and replace.details["reason"] == "history purged past seqno 7"
    owners.release(claim)
