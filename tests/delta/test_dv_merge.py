"""Steady commits written as deletion vectors and new files: the same table, change data feed
and history as Spark's MERGE of the same batch, exactly once."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from chispa import assert_df_equality

from replicator.delta import dv_merge
from replicator.delta.bin_packing import ALL_FILES
from replicator.delta.changes import concat_changes
from replicator.delta.commit_metadata import COMMIT, CommitMetadata
from replicator.delta.deletion_vectors import read_positions
from replicator.delta.dv_merge import DeletionVectorMerger, rows_at, steady_changes
from replicator.delta.executor import CommitExecutor, WriteStrategy
from replicator.delta.file_reads import read_parts
from replicator.delta.log_checkpoints import wait_for_checkpoints
from replicator.delta.log_snapshot import read_snapshot
from replicator.delta.ownership import OwnersTable
from replicator.delta.schema import DATA_COLUMNS, MirrorConfig
from replicator.delta.table import checkpoint_delta_log, delta_snapshot, open_or_create
from replicator.planning.planner import VbucketCommit, deduplicate_changes
from tests.delta.helpers import batch, change_table, delete, upsert, vbucket_commit

pytestmark = pytest.mark.spark

VBUCKETS = (0, 1, 70, 71)  # two partitions of 64 vbuckets


def _loaded(spark: Any, path: Path) -> Any:
    """A mirror of 40 documents per vbucket, loaded and then changed once by Spark's MERGE
    (so some files carry Spark's deletion vectors already)."""
    mirror = open_or_create(spark, str(path), MirrorConfig("dv", num_vbuckets=128))
    owners = OwnersTable.of(mirror)
    claim = owners.claim(VBUCKETS)
    executor = CommitExecutor(mirror, claim, owners, steady_writer="spark")
    executor.execute(batch(1, *(
        vbucket_commit(vb, [upsert(vb, f"k{i}", i + 1) for i in range(40)], seqno=40,
                       first_load=True)
        for vb in VBUCKETS
    )))  # fmt: skip
    executor.execute(batch(2, *(
        vbucket_commit(vb, [upsert(vb, "k3", 41), delete(vb, "k4", 42)], seqno=42,
                       first_load=False, previous_seqno=40)
        for vb in VBUCKETS
    )))  # fmt: skip
    owners.release(claim)
    return mirror


def _claimed(spark: Any, path: Path) -> tuple[Any, OwnersTable, Any]:
    """The loaded mirror at `path`, its owners table and a claim of VBUCKETS."""
    mirror = _loaded(spark, path)
    owners = OwnersTable.of(mirror)
    return mirror, owners, owners.claim(VBUCKETS)


def _last_engine(mirror: Any) -> str:
    """Who committed the newest version ("" for Spark's commits, which name no engine here)."""
    return str(mirror.delta().history(1).collect()[0].asDict().get("engineInfo") or "")


def _steady_batch() -> list[VbucketCommit]:
    commits = []
    for vb in VBUCKETS:
        changes = [
            upsert(vb, "k1", 43), upsert(vb, "k1", 44, doc='{"v":"twice"}'),  # newest wins
            upsert(vb, "k3", 45),  # a row Spark's MERGE wrote
            delete(vb, "k5", 46), delete(vb, "k4", 47),  # live; deleted already
            upsert(vb, "k4", 48) if vb == 70 else delete(vb, "never", 48),  # back; never was
            upsert(vb, f"new{vb}", 49),
        ]
        commits.append(vbucket_commit(vb, changes, seqno=49, first_load=False, previous_seqno=42))
    return commits


def _changes(commits: list[VbucketCommit]) -> Any:
    return deduplicate_changes(concat_changes(t for c in commits for t in c.tables))


def _two_copies(spark: Any, tmp_path: Path, names: tuple[str, str]) -> tuple[Any, Any]:
    """The loaded mirror at `tmp_path / names[0]` and a copy of it at `tmp_path / names[1]`."""
    first = _loaded(spark, tmp_path / names[0])
    shutil.copytree(tmp_path / names[0], tmp_path / names[1])
    copy = open_or_create(spark, str(tmp_path / names[1]), MirrorConfig("dv", num_vbuckets=128))
    return first, copy


def _feed(spark: Any, mirror: Any, version: int) -> Any:
    """The change data feed of one version of `mirror` (its timestamp left out)."""
    return (
        spark.read.format("delta").option("readChangeFeed", "true")
        .option("startingVersion", version).option("endingVersion", version)
        .load(mirror.layout.data).drop("_commit_version", "_commit_timestamp")
    )  # fmt: skip


def test_a_steady_batch_by_deletion_vectors_equals_spark_s_merge(
    spark: Any, tmp_path: Path
) -> None:
    by_spark = _loaded(spark, tmp_path / "spark")
    shutil.copytree(tmp_path / "spark", tmp_path / "dv")
    by_hand = open_or_create(spark, str(tmp_path / "dv"), MirrorConfig("dv", num_vbuckets=128))
    commits = _steady_batch()
    owners = OwnersTable.of(by_spark)
    claim = owners.claim(VBUCKETS)
    CommitExecutor(by_spark, claim, owners, steady_writer="spark").execute(batch(3, *commits))
    metadata = CommitMetadata(
        kind=COMMIT, batch_id=3, part=1, owner_id=claim.owner_id,
        strategy=WriteStrategy.MERGE.value, positions={c.vbucket: c.position for c in commits},
    )  # fmt: skip
    # Preimages read a row at a time: each file's replaced rows come from several batches.
    merger = DeletionVectorMerger(str(tmp_path / "dv"), by_hand.data_layout, read_batch_bytes=1)

    landed = merger.merge(_changes(commits), metadata)

    assert landed is not None
    spark_version = by_spark.delta().history(1).collect()[0]["version"]
    assert landed.version == spark_version
    assert_df_equality(by_hand.read(), by_spark.read(), ignore_row_order=True)

    def feed(mirror: Any, version: int) -> Any:
        return (
            spark.read.format("delta").option("readChangeFeed", "true")
            .option("startingVersion", version).option("endingVersion", version)
            .load(mirror.layout.data).drop("_commit_version", "_commit_timestamp")
        )  # fmt: skip

    assert_df_equality(
        feed(by_hand, landed.version), feed(by_spark, spark_version), ignore_row_order=True
    )
    [entry] = by_hand.delta().history(1).collect()
    [spark_entry] = by_spark.delta().history(1).collect()
    assert entry["operation"] == spark_entry["operation"] == "MERGE"
    for metric in ("numTargetRowsInserted", "numTargetRowsUpdated", "numTargetRowsDeleted"):
        assert entry["operationMetrics"][metric] == spark_entry["operationMetrics"][metric]
    assert CommitMetadata.from_json(entry["userMetadata"]) == metadata
    found = by_hand.find_commit(claim.owner_id, 3, 1)
    assert found is not None and found.version == landed.version
    assert landed.table_files == len(by_hand.read().inputFiles())
    # Exactly once: the same txn version again commits nothing, here or in a new merger.
    assert merger.merge(_changes(commits), metadata) is None
    assert DeletionVectorMerger(str(tmp_path / "dv"), by_hand.data_layout).merge(
        _changes(commits), metadata
    ) is None
    assert by_hand.delta().history(1).collect()[0]["version"] == landed.version
    owners.release(claim)


def test_later_batches_build_on_the_vectors_written_before(spark: Any, tmp_path: Path) -> None:
    mirror, owners, claim = _claimed(spark, tmp_path / "t")
    merger = DeletionVectorMerger(str(tmp_path / "t"), mirror.data_layout)
    expected = {(vb, f"k{i}"): i + 1 for vb in VBUCKETS for i in range(40)}
    for vb in VBUCKETS:
        expected[(vb, "k3")] = 41
        del expected[(vb, "k4")]
    seqno, batch_id = 42, 3
    for round_ in range(3):
        commits = []
        for vb in VBUCKETS:
            changes = [upsert(vb, f"k{round_ + 10}", seqno + 1), delete(vb, f"k{round_ + 20}",
                       seqno + 2), upsert(vb, "k3", seqno + 3)]  # fmt: skip
            commits.append(vbucket_commit(vb, changes, seqno=seqno + 3, first_load=False,
                                          previous_seqno=seqno))  # fmt: skip
            expected[(vb, f"k{round_ + 10}")] = seqno + 1
            expected.pop((vb, f"k{round_ + 20}"))
            expected[(vb, "k3")] = seqno + 3
        metadata = CommitMetadata(
            kind=COMMIT, batch_id=batch_id, part=1, owner_id=claim.owner_id,
            strategy="merge", positions={c.vbucket: c.position for c in commits},
        )  # fmt: skip
        assert merger.merge(_changes(commits), metadata) is not None
        seqno, batch_id = seqno + 3, batch_id + 1
        # A MERGE by Spark in between: the index must follow another writer's vectors.
        if round_ == 1:
            # (Batch ids grow: one txn id per owner, so a lower one would be taken as done.)
            by_spark = CommitExecutor(mirror, claim, owners, steady_writer="spark")
            by_spark.execute(batch(batch_id, vbucket_commit(
                0, [upsert(0, "k30", seqno + 1)], seqno=seqno + 1, first_load=False,
                previous_seqno=seqno)))  # fmt: skip
            expected[(0, "k30")] = seqno + 1
            batch_id += 1

    rows = {(r["vbucket"], r["key"]): r["seqno"] for r in mirror.read().collect()}
    assert rows == expected
    _assert_index_points_at_live_rows(merger, str(tmp_path / "t"), rows)
    owners.release(claim)


def _assert_index_points_at_live_rows(
    merger: DeletionVectorMerger, path: str, rows: dict[tuple[int, str], int]
) -> None:
    """After a refresh, the index locates every live document at the one row holding it, and
    knows each located file's current vector."""
    merger.index.refresh(read_snapshot(path))
    keys = pa.table({
        "vbucket": pa.array([vb for vb, _ in rows], pa.int32()),
        "collection_id": pa.array([0] * len(rows), pa.int64()),
        "key": pa.array([key for _, key in rows]),
    })  # fmt: skip
    located = merger.index.locate(keys).to_pylist()
    assert sorted((r["vbucket"], r["key"]) for r in located) == sorted(rows)
    for number in {r["file"] for r in located}:
        data_file = merger.index.data_file(number)
        vector = data_file.deletion_vector
        hidden = set() if vector is None else set(read_positions(path, vector))
        assert set(merger.index.deleted(number)) == hidden
        content = pq.read_table(data_file.local_path(path), columns=["key", "seqno"]).to_pylist()
        for row in (r for r in located if r["file"] == number):
            assert row["position"] not in hidden
            assert content[row["position"]] == {
                "key": row["key"], "seqno": rows[(row["vbucket"], row["key"])]
            }


def _log_entry(table: Path, version: int) -> list[dict[str, Any]]:
    lines = (table / "_delta_log" / f"{version:020d}.json").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def test_a_version_taken_meanwhile_is_planned_again_and_nothing_is_lost(
    spark: Any, tmp_path: Path
) -> None:
    mirror, owners, claim = _claimed(spark, tmp_path / "t")
    executor = CommitExecutor(mirror, claim, owners, steady_writer="spark")

    class RacedMerger(DeletionVectorMerger):
        raced = False

        def _actions(self, *args: Any) -> Any:
            planned = super()._actions(*args)
            if not self.raced:  # Spark commits the version this plan was made for
                self.raced = True
                executor.execute(batch(60, vbucket_commit(
                    1, [upsert(1, "k2", 60)], seqno=60, first_load=False, previous_seqno=42,
                )))  # fmt: skip
            return planned

    merger = RacedMerger(str(tmp_path / "t"), mirror.data_layout)
    commits = [vbucket_commit(0, [upsert(0, "k2", 61), delete(0, "k6", 62)], seqno=62,
                              first_load=False, previous_seqno=42)]  # fmt: skip
    metadata = CommitMetadata(
        kind=COMMIT, batch_id=61, part=1, owner_id=claim.owner_id, strategy="merge",
        positions={0: commits[0].position},
    )  # fmt: skip
    group = tmp_path / "t" / "vbucket_group=0"
    before = set(os.listdir(group))
    version_before = read_snapshot(str(tmp_path / "t")).version

    landed = merger.merge(_changes(commits), metadata)

    assert merger.raced and landed is not None
    rows = {(r["vbucket"], r["key"]): r["seqno"] for r in mirror.read().collect()}
    assert rows[(0, "k2")] == 61 and (0, "k6") not in rows and rows[(1, "k2")] == 60
    assert len(rows) == 4 * 40 - 4 - 1  # k4 of each vbucket deleted at load, and k6 of 0
    # The first plan's file was removed: the partition's new files are exactly those Spark's
    # racing commit and the landed plan (one file) added.
    adds = {
        version: {
            os.path.basename(action["add"]["path"])
            for action in _log_entry(tmp_path / "t", version)
            if "add" in action and action["add"]["path"].startswith("vbucket_group=0/")
        } - before  # (a file given a new vector is added again under its path)
        for version in range(version_before + 1, landed.version + 1)
    }
    assert len(adds) == 2 and len(adds[landed.version]) == 1
    new_files = {name for name in set(os.listdir(group)) - before if name.endswith(".parquet")}
    assert new_files == set().union(*adds.values())
    # The first plan's row images went with its files: every image is of a live file.
    assert merger.images is not None
    images = {
        os.path.relpath(os.path.join(folder, name), merger.images.directory)
        for folder, _, names in os.walk(merger.images.directory) for name in names
    }  # fmt: skip
    live = read_snapshot(str(tmp_path / "t")).files
    assert images and images <= {f"{unquote(path)}.arrow" for path, _ in live}
    owners.release(claim)


def test_the_executor_commits_steady_batches_as_vectors_by_default(
    spark: Any, tmp_path: Path
) -> None:
    mirror, owners, claim = _claimed(spark, tmp_path / "t")
    executor = CommitExecutor(mirror, claim, owners)
    commits = _steady_batch()

    outcome = executor.execute(batch(3, *commits))

    [commit] = outcome.commits
    [entry] = mirror.delta().history(1).collect()
    assert entry["operation"] == "MERGE" and entry["engineInfo"].startswith("replicator")
    assert commit.table_version == entry["version"] and commit.table_files is not None
    assert {(vb, "new" + str(vb)) for vb in VBUCKETS} <= {
        (r["vbucket"], r["key"]) for r in mirror.read().collect()
    }
    # Re-running the batch (a restart before its checkpoint) commits nothing twice.
    again = CommitExecutor(mirror, claim, owners, steady_writer="deletion-vectors")
    assert again.execute(batch(3, *commits)).commits[0].table_version == commit.table_version
    assert mirror.delta().history(1).collect()[0]["version"] == commit.table_version
    # A batch that drops a collection goes to Spark's MERGE.
    dropping = vbucket_commit(0, [upsert(0, "k7", 50)], seqno=50, first_load=False,
                              previous_seqno=49, dropped_collection_ids=[8])  # fmt: skip
    executor.execute(batch(4, dropping))
    assert not _last_engine(mirror).startswith("replicator")
    owners.release(claim)


def test_versions_committed_without_spark_get_delta_s_checkpoints(
    spark: Any, tmp_path: Path
) -> None:
    # Spark checkpoints only after its own commits; a run of vector merges would otherwise
    # leave every reader replaying a growing log.
    mirror, owners, claim = _claimed(spark, tmp_path / "t")
    executor = CommitExecutor(mirror, claim, owners, steady_writer="deletion-vectors")
    log = tmp_path / "t" / "_delta_log"
    seqno, batch_id = 42, 3
    while not any(log.glob("*.checkpoint.parquet")) or mirror.version() % 10 == 0:
        commits = [vbucket_commit(vb, [upsert(vb, "k1", seqno + 1)], seqno=seqno + 1,
                                  first_load=False, previous_seqno=seqno) for vb in VBUCKETS]
        executor.execute(batch(batch_id, *commits))  # fmt: skip
        # Written on the table's checkpoint thread, while commits may go on.
        assert wait_for_checkpoints(str(tmp_path / "t"), timeout_s=120)
        seqno, batch_id = seqno + 1, batch_id + 1
        assert batch_id < 30, "no checkpoint after 27 merges"

    [checkpoint] = log.glob("*.checkpoint.parquet")
    version = int(checkpoint.name[:20])
    assert version % 10 == 0
    entry = mirror.delta().history().where(f"version = {version}").collect()[0]
    assert entry["engineInfo"].startswith("replicator")  # a version our writer committed
    live = {f.split("/")[-1] for f in mirror.read().inputFiles()}
    assert {os.path.basename(f.path) for f in read_snapshot(str(tmp_path / "t")).files.values()
            } == live  # fmt: skip
    assert {(r["vbucket"], r["seqno"]) for r in mirror.read().where("key = 'k1'").collect()} == {
        (vb, seqno) for vb in VBUCKETS
    }
    owners.release(claim)


def test_spilled_rows_are_read_back_newest_first(spark: Any, tmp_path: Path) -> None:
    mirror, owners, claim = _claimed(spark, tmp_path / "t")
    spill = tmp_path / "vb0000-00000002.parquet"
    pq.write_table(change_table([upsert(0, "k1", 43), upsert(0, "k9", 44)]), spill)
    commit = vbucket_commit(0, [upsert(0, "k1", 45), delete(0, "k9", 46)], seqno=46,
                            first_load=False, previous_seqno=42, spill_files=[str(spill)])
    executor = CommitExecutor(mirror, claim, owners, steady_writer="deletion-vectors")

    executor.execute(batch(3, commit))  # fmt: skip

    assert _last_engine(mirror).startswith("replicator")
    rows = {r["key"]: r["seqno"] for r in mirror.read().where("vbucket = 0").collect()}
    assert rows["k1"] == 45 and "k9" not in rows and len(rows) == 38
    owners.release(claim)


def test_a_batch_s_changes_keep_each_document_s_newest_row_in_two_chunks_at_most() -> None:
    """Thousands of staged chunks become one chunk per part (deduplicated, unique-key)."""
    repeating = [
        dataclasses.replace(
            vbucket_commit(vb, [], seqno=60, first_load=False, previous_seqno=1),
            tables=tuple(change_table([upsert(vb, f"k{i}", 10 * n + i) for i in range(5)])
                         for n in range(1, 5)),
        )
        for vb in range(0, 40, 2)
    ]  # fmt: skip
    unique = [
        dataclasses.replace(
            vbucket_commit(vb, [], seqno=60, first_load=False, previous_seqno=1),
            tables=tuple(change_table([upsert(vb, f"k{n}-{i}", 10 * n + i) for i in range(5)])
                         for n in range(1, 5)),
            unique_keys=True,
        )
        for vb in range(1, 40, 2)
    ]  # fmt: skip

    changes = steady_changes([*repeating, *unique])

    assert changes.column("key").num_chunks <= 2
    columns = changes.select(["vbucket", "key", "seqno"])
    rows = sorted(tuple(r.values()) for r in columns.to_pylist())
    expected = sorted(
        [(vb, f"k{i}", 40 + i) for vb in range(0, 40, 2) for i in range(5)]
        + [(vb, f"k{n}-{i}", 10 * n + i) for vb in range(1, 40, 2) for n in range(1, 5)
           for i in range(5)]
    )  # fmt: skip
    assert rows == expected


def test_a_batch_of_new_documents_only_adds_files(spark: Any, tmp_path: Path) -> None:
    mirror, owners, claim = _claimed(spark, tmp_path / "t")
    before = read_snapshot(str(tmp_path / "t"))
    commits = [vbucket_commit(vb, [upsert(vb, "fresh", 43), delete(vb, "never", 44)], seqno=44,
                              first_load=False, previous_seqno=42) for vb in (0, 70)]  # fmt: skip
    metadata = CommitMetadata(
        kind=COMMIT, batch_id=3, part=1, owner_id=claim.owner_id, strategy="merge",
        positions={c.vbucket: c.position for c in commits},
    )  # fmt: skip
    merger = DeletionVectorMerger(str(tmp_path / "t"), mirror.data_layout)

    landed = merger.merge(_changes(commits), metadata)

    assert landed is not None and merger.last_rows is not None
    assert (merger.last_rows.inserted, merger.last_rows.updated, merger.last_rows.deleted) == (
        2, 0, 0
    )
    after = read_snapshot(str(tmp_path / "t"))
    assert set(before.files) < set(after.files) and len(after.files) == len(before.files) + 2
    rows = {(r["vbucket"], r["key"]) for r in mirror.read().collect()}
    assert {(0, "fresh"), (70, "fresh")} <= rows and len(rows) == 4 * 39 + 2
    owners.release(claim)


def test_delta_s_snapshot_of_a_writer_s_version_is_read_from_a_thread_without_a_session(
    spark: Any, tmp_path: Path
) -> None:
    # The commit thread reads the table's file count and writes Delta's checkpoints through
    # Delta's JVM classes, which need a session on that thread; it may have none (make test
    # found the default session gone after another test's session stopped).
    mirror, owners, claim = _claimed(spark, tmp_path / "t")
    CommitExecutor(mirror, claim, owners).execute(batch(3, *_steady_batch()))
    assert _last_engine(mirror).startswith("replicator")
    jvm_session = spark.sparkContext._jvm.org.apache.spark.sql.SparkSession
    seen: dict[str, Any] = {}

    def on_a_bare_thread() -> None:
        jvm_session.clearActiveSession()
        jvm_session.clearDefaultSession()
        try:
            seen["files"] = int(delta_snapshot(spark, str(tmp_path / "t")).numOfFiles())
            checkpoint_delta_log(spark, str(tmp_path / "t"))
        except Exception as exc:  # reported below
            seen["error"] = exc
        finally:
            jvm_session.setDefaultSession(spark._jsparkSession)

    thread = threading.Thread(target=on_a_bare_thread)
    thread.start()
    thread.join(120)
    assert "error" not in seen, seen.get("error")
    snapshot = read_snapshot(str(tmp_path / "t"))
    assert seen["files"] == len(snapshot.files)
    assert (tmp_path / "t" / "_delta_log" / f"{snapshot.version:020d}.checkpoint.parquet").exists()
    owners.release(claim)


@pytest.mark.parametrize("batch_bytes", [1, 300, 700, 10**9])
def test_rows_at_positions_are_read_from_only_the_row_groups_that_hold_them(
    tmp_path: Path, batch_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = change_table([upsert(3, f"k{i}", i + 1) for i in range(50)]).select(list(DATA_COLUMNS))
    path = str(tmp_path / "f.parquet")
    pq.write_table(rows, path, row_group_size=10)  # five row groups
    positions = np.array([0, 9, 10, 11, 27, 49], dtype=np.int64)  # none in the fourth group
    read: list[int] = []

    def recorded(parquet: Any, columns: Any, size: int, groups: Any) -> Any:
        read.extend(groups)
        return read_parts(parquet, columns, size, groups)

    monkeypatch.setattr(dv_merge, "read_parts", recorded)

    taken = rows_at(path, positions, batch_bytes)

    assert read == [0, 1, 2, 4]
    assert taken.column("key").to_pylist() == [f"k{p}" for p in positions]
    assert taken.equals(rows.take(positions))
    assert rows_at(path, np.array([], dtype=np.int64), batch_bytes).num_rows == 0
    with pytest.raises(ValueError, match="has 50 rows; position 50 is not one"):
        rows_at(path, np.array([3, 50], dtype=np.int64), batch_bytes)


def test_preimages_taken_from_row_images_read_as_spark_s_merge(
    spark: Any, tmp_path: Path
) -> None:
    by_spark, by_hand = _two_copies(spark, tmp_path, ("spark", "dv"))
    owners = OwnersTable.of(by_spark)
    claim = owners.claim(VBUCKETS)
    spark_executor = CommitExecutor(by_spark, claim, owners, steady_writer="spark")
    merger = DeletionVectorMerger(str(tmp_path / "dv"), by_hand.data_layout)
    assert merger.images is not None
    # The second batch replaces rows the first one wrote (new files, their images written with
    # them) and rows of files the first one read back (their images written as they were read).
    later = [
        vbucket_commit(vb, [upsert(vb, "k1", 50), upsert(vb, f"new{vb}", 51),
                            delete(vb, "k7", 52), upsert(vb, "k3", 53, doc='{"v":"again"}')],
                       seqno=53, first_load=False, previous_seqno=49)
        for vb in VBUCKETS
    ]  # fmt: skip
    misses = []
    for batch_id, commits in ((3, _steady_batch()), (4, later)):
        spark_executor.execute(batch(batch_id, *commits))
        metadata = CommitMetadata(
            kind=COMMIT, batch_id=batch_id, part=1, owner_id=claim.owner_id,
            strategy=WriteStrategy.MERGE.value, positions={c.vbucket: c.position for c in commits},
        )  # fmt: skip
        landed = merger.merge(_changes(commits), metadata)
        assert landed is not None
        spark_version = by_spark.delta().history(1).collect()[0]["version"]
        assert_df_equality(
            _feed(spark, by_hand, landed.version), _feed(spark, by_spark, spark_version),
            ignore_row_order=True,
        )  # fmt: skip
        misses.append(merger.images.misses)

    assert misses[0] > 0 and misses[1] == misses[0]  # the second batch read no Parquet back
    assert merger.images.hits > 0
    assert_df_equality(by_hand.read(), by_spark.read(), ignore_row_order=True)
    # Every live file the writer wrote or read back has its image, and no other image is left.
    snapshot = read_snapshot(str(tmp_path / "dv"))
    imaged = {
        os.path.relpath(os.path.join(folder, name), merger.images.directory)
        for folder, _, names in os.walk(merger.images.directory) for name in names
    }  # fmt: skip
    live = {f"{unquote(path)}.arrow" for path, _ in snapshot.files}
    assert imaged and imaged <= live
    owners.release(claim)


def test_without_row_images_preimages_are_read_from_parquet_and_none_are_written(
    spark: Any, tmp_path: Path
) -> None:
    mirror, owners, claim = _claimed(spark, tmp_path / "t")
    merger = DeletionVectorMerger(str(tmp_path / "t"), mirror.data_layout, row_images=False)
    commits = _steady_batch()
    metadata = CommitMetadata(
        kind=COMMIT, batch_id=3, part=1, owner_id=claim.owner_id, strategy="merge",
        positions={c.vbucket: c.position for c in commits},
    )  # fmt: skip

    # Images an earlier run kept would go stale unseen: they are removed.
    stale = tmp_path / "t" / "_replicator" / "row_images" / "vbucket_group=0" / "old.arrow"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"an image of an earlier run")

    assert merger.merge(_changes(commits), metadata) is not None

    assert merger.images is None
    assert not (tmp_path / "t" / "_replicator" / "row_images").exists()
    owners.release(claim)


def test_a_writer_in_a_child_process_commits_what_the_writer_in_this_one_does(
    spark: Any, tmp_path: Path
) -> None:
    here, child = _two_copies(spark, tmp_path, ("here", "child"))
    results = {}
    for name, mirror, in_child in (("here", here, False), ("child", child, True)):
        owners = OwnersTable.of(mirror)
        claim = owners.claim(VBUCKETS)
        executor = CommitExecutor(mirror, claim, owners, writer_process=in_child)
        try:
            [commit] = executor.execute(batch(3, *_steady_batch())).commits
            # The same txn again commits nothing: the child read it from the table.
            [again] = executor.execute(batch(3, *_steady_batch())).commits
            assert again.table_version == commit.table_version
        finally:
            executor.close()
        owners.release(claim)
        assert _last_engine(mirror).startswith("replicator")
        results[name] = commit

    assert results["here"].table_version == results["child"].table_version
    assert results["here"].table_files == results["child"].table_files
    assert_df_equality(child.read(), here.read(), ignore_row_order=True)
    version = results["here"].table_version
    assert_df_equality(_feed(spark, child, version), _feed(spark, here, version),
                       ignore_row_order=True)  # fmt: skip
    [entry] = child.delta().history(1).collect()
    [expected] = here.delta().history(1).collect()
    assert entry["operationMetrics"] == expected["operationMetrics"]


def test_a_compaction_through_the_writer_s_child_process_keeps_every_row(
    spark: Any, tmp_path: Path
) -> None:
    mirror, owners, claim = _claimed(spark, tmp_path / "t")
    executor = CommitExecutor(mirror, claim, owners, writer_process=True)
    try:
        executor.execute(batch(3, *_steady_batch()))
        writer = executor.steady_writer_if_decided()
        assert writer is not None and not isinstance(writer, DeletionVectorMerger)
        expected = spark.createDataFrame(mirror.read().collect(), mirror.read().schema)
        before = read_snapshot(str(tmp_path / "t"))

        packed = writer.pack({0: ALL_FILES})

        assert packed is not None and packed.version == before.version + 1
        after = read_snapshot(str(tmp_path / "t"))
        in_0 = [f for f in after.files.values() if f.partition_values["vbucket_group"] == "0"]
        assert len(in_0) == 1 and in_0[0].deletion_vector is None
        assert_df_equality(mirror.read(), expected, ignore_row_order=True)
        # The next batch, through the same child, builds on the packed file.
        later = vbucket_commit(0, [upsert(0, "k9", 60)], seqno=60, first_load=False,
                               previous_seqno=49)  # fmt: skip
        executor.execute(batch(4, later))
        rows = {(r["vbucket"], r["key"]): r["seqno"] for r in mirror.read().collect()}
        assert rows[(0, "k9")] == 60 and len(rows) == expected.count()
    finally:
        executor.close()
    owners.release(claim)
