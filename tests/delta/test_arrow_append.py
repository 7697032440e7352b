"""First loads appended from Arrow by delta-rs: the same rows and commit as Spark's append,
exactly once, and Spark's append wherever delta-rs cannot write the table."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from chispa import assert_df_equality

from replicator.delta.arrow_append import (
    ArrowAppender,
    arrow_append_refusal,
    arrow_appender_for,
    first_load_batches,
    streamable,
)
from replicator.delta.commit_metadata import CommitMetadata
from replicator.delta.executor import CommitExecutor
from replicator.delta.ownership import OwnersTable
from replicator.delta.schema import DataLayout, MirrorConfig
from replicator.delta.table import MirrorTable, delta_snapshot, open_or_create
from replicator.planning.planner import VbucketCommit
from tests.delta.helpers import batch, change_table, delete, upsert, vbucket_commit

EXPIRY = datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
DATA = ["vbucket", "vbucket_group", "collection_id", "key", "seqno", "cas", "expiry", "doc"]


def unique(commit: VbucketCommit) -> VbucketCommit:
    return dataclasses.replace(commit, unique_keys=True)


def spill(tmp_path: Path, vbucket: int, changes: list[Any]) -> str:
    path = tmp_path / f"vb{vbucket:04d}-00000001.parquet"
    pq.write_table(change_table(changes), path)
    return str(path)


def first_load_commits(tmp_path: Path) -> list[VbucketCommit]:
    """Rows of every kind a first load holds: a unique snapshot in memory, one spilled, a
    vbucket with repeated keys and deletes (in memory), and one with a dropped collection."""
    return [
        unique(vbucket_commit(1, [upsert(1, f"m{i}", i + 1, expiry=EXPIRY if i == 7 else None)
                                  for i in range(50)], seqno=50, first_load=True)),
        unique(vbucket_commit(
            6, [upsert(6, "last", 41)], seqno=41, first_load=True,
            spill_files=[spill(tmp_path, 6, [upsert(6, f"s{i}", i + 1) for i in range(40)])],
        )),
        vbucket_commit(9, [upsert(9, "a", 1), upsert(9, "b", 2), upsert(9, "a", 3),
                           delete(9, "b", 4), delete(9, "gone", 5)], seqno=5, first_load=True),
        vbucket_commit(12, [upsert(12, "kept", 1), upsert(12, "dropped", 2, collection_id=8)],
                       seqno=2, first_load=True, dropped_collection_ids=[8]),
    ]  # fmt: skip


def append_metadata(claim: Any, batch_id: int, commits: list[VbucketCommit]) -> CommitMetadata:
    """The metadata of an APPEND of `commits` as the executor would make it."""
    return CommitMetadata(
        kind="commit", batch_id=batch_id, part=0, owner_id=claim.owner_id, strategy="append",
        positions={c.vbucket: c.position for c in commits},
    )  # fmt: skip


# -- the rows (no Spark) -------------------------------------------------------------------


def test_the_batches_hold_each_documents_newest_upsert_in_vbucket_order(
    tmp_path: Path,
) -> None:
    commits = first_load_commits(tmp_path)
    rows = pa.Table.from_batches(list(first_load_batches(list(reversed(commits)))))
    assert "op" not in rows.column_names
    keys = list(zip(rows["vbucket"].to_pylist(), rows["key"].to_pylist(), strict=True))
    assert [vb for vb, _ in keys] == sorted(vb for vb, _ in keys)
    assert {k for k in keys if k[0] == 9} == {(9, "a")}  # b deleted, gone never existed
    assert rows.filter(pc.equal(rows["key"], "a"))["seqno"].to_pylist() == [3]
    assert {k for k in keys if k[0] == 12} == {(12, "kept")}
    assert len([k for k in keys if k[0] == 6]) == 41 and len(keys) == 50 + 41 + 1 + 1


def test_spilled_rows_that_may_repeat_keys_cannot_be_streamed(tmp_path: Path) -> None:
    repeating = vbucket_commit(
        3, [], seqno=2, first_load=True,
        spill_files=[spill(tmp_path, 3, [upsert(3, "a", 1), upsert(3, "a", 2)])],
    )  # fmt: skip
    assert not streamable([repeating])
    assert streamable([unique(repeating)])
    with pytest.raises(ValueError, match="deduplication"):
        next(first_load_batches([repeating]))


def test_rows_of_a_batch_go_to_their_own_partitions_files_in_any_order(tmp_path: Path) -> None:
    from replicator.delta.arrow_append import ARROW_DATA_SCHEMA, PartitionFiles

    changes = [upsert(vb, f"k{vb}", 1) for vb in (4, 9, 1, 5)]  # groups 1, 2, 0, 1 of width 4
    rows = change_table(changes).select(ARROW_DATA_SCHEMA.names).to_batches()[0]
    files = PartitionFiles(str(tmp_path), DataLayout(4), 1 << 20, 1 << 20)
    files.write(rows)
    actions = files.close()
    found = {}
    for action in actions:
        vbuckets = pq.read_table(tmp_path / action.path)["vbucket"].to_pylist()
        found.setdefault(action.partition_values["vbucket_group"], []).extend(vbuckets)
        assert json.loads(action.stats)["numRecords"] == len(vbuckets)
    assert {group: sorted(vbs) for group, vbs in found.items()} == {
        "0": [1], "1": [4, 5], "2": [9]
    }
    assert files.rows == 4


# -- through Delta ------------------------------------------------------------------------

@pytest.fixture
def new_mirror(spark: Any, tmp_path: Path) -> Iterator[tuple[MirrorTable, OwnersTable, Any]]:
    mirror = open_or_create(spark, str(tmp_path / "m"), MirrorConfig("travel", num_vbuckets=64))
    owners = OwnersTable.of(mirror)
    claim = owners.claim(range(64), "loader")
    yield mirror, owners, claim
    owners.release(claim)


def engine_of(mirror: MirrorTable, version: int) -> str:
    log = Path(mirror.layout.data) / "_delta_log" / f"{version:020d}.json"
    infos = [json.loads(line) for line in log.read_text().splitlines()]
    return next(str(a["commitInfo"]["engineInfo"]) for a in infos if "commitInfo" in a)


@pytest.mark.spark
def test_a_first_load_through_delta_rs_equals_sparks_append(
    spark: Any, tmp_path: Path, new_mirror: Any
) -> None:
    mirror, owners, claim = new_mirror
    by_rust = CommitExecutor(mirror, claim, owners)
    landed = by_rust.execute(batch(1, *first_load_commits(tmp_path))).commits[0]
    assert engine_of(mirror, landed.table_version).startswith("delta-rs")
    assert landed.table_files == int(delta_snapshot(spark, mirror.layout.data).numOfFiles())

    other = open_or_create(spark, str(tmp_path / "s"), MirrorConfig("travel", num_vbuckets=64))
    other_owners = OwnersTable.of(other)
    other_claim = other_owners.claim(range(64), "loader")
    by_spark = CommitExecutor(other, other_claim, other_owners, first_load_writer="spark")
    spark_version = by_spark.execute(batch(1, *first_load_commits(tmp_path))).commits[0]
    assert engine_of(other, spark_version.table_version).startswith("Apache-Spark")
    other_owners.release(other_claim)

    assert_df_equality(mirror.read().select(*DATA), other.read().select(*DATA),
                       ignore_row_order=True)  # fmt: skip
    expiring = mirror.read().where("expiry IS NOT NULL").select("key", "expiry").collect()
    assert [(r["key"], r["expiry"].replace(tzinfo=UTC)) for r in expiring] == [("m7", EXPIRY)]
    # Spark's append's metrics, which status and audits count rows by.
    [history] = mirror.delta().history().where(f"version = {landed.table_version}").collect()
    assert history["operation"] == "WRITE"
    assert history["operationMetrics"]["numOutputRows"] == "93"
    assert history["operationMetrics"]["numFiles"] == str(landed.table_files)
    # The commit is the replicator's, found by recovery as any other.
    record = mirror.find_commit(claim.owner_id, 1, 0)
    assert record is not None and record.version == landed.table_version
    assert record.metadata.positions[6].seqno == 41
    # The change data feed sees the rows inserted, as audits and the lag read them.
    changes = (
        spark.read.format("delta").option("readChangeFeed", "true")
        .option("startingVersion", landed.table_version).load(mirror.layout.data)
    )  # fmt: skip
    assert changes.where("_change_type = 'insert'").count() == mirror.read().count() == 93
    # A MERGE after it works on its files.
    by_rust.execute(batch(2, vbucket_commit(
        9, [upsert(9, "a", 6, doc='{"v":"new"}')], seqno=6, first_load=False, previous_seqno=5
    )))  # fmt: skip
    assert mirror.read().where("vbucket = 9").select("doc").collect()[0][0] == '{"v":"new"}'


@pytest.mark.spark
def test_an_append_whose_txn_version_is_recorded_commits_nothing(
    spark: Any, tmp_path: Path, new_mirror: Any
) -> None:
    mirror, _owners, claim = new_mirror
    commits = first_load_commits(tmp_path)[:1]
    metadata = append_metadata(claim, 7, commits)
    appender = ArrowAppender(mirror.layout.data, mirror.data_layout)
    landed = appender.append(first_load_batches(commits), metadata)
    assert landed is not None
    again = ArrowAppender(mirror.layout.data, mirror.data_layout)  # as after a restart
    assert again.append(first_load_batches(commits), metadata) is None
    assert appender.append(first_load_batches(commits), metadata) is None
    assert delta_snapshot(spark, mirror.layout.data).version() == landed.version
    assert mirror.read().count() == 50
    txn = {t.appId(): t.version() for t in _list(delta_snapshot(spark, mirror.layout.data))}
    assert txn[next(iter(txn))] == metadata.txn_version


@pytest.mark.spark
def test_an_appender_decided_early_sees_commits_made_before_its_first_append(
    spark: Any, tmp_path: Path, new_mirror: Any
) -> None:
    mirror, _owners, claim = new_mirror
    decided = arrow_appender_for(mirror.layout.data, mirror.data_layout, "auto")
    assert decided is not None
    commits = first_load_commits(tmp_path)[:1]
    metadata = append_metadata(claim, 8, commits)
    # Another process of the same owner commits this batch after the decision.
    landed = ArrowAppender(mirror.layout.data, mirror.data_layout).append(
        first_load_batches(commits), metadata
    )
    assert landed is not None
    assert decided.append(first_load_batches(commits), metadata) is None
    assert delta_snapshot(spark, mirror.layout.data).version() == landed.version
    assert mirror.read().count() == 50


@pytest.mark.spark
def test_files_roll_by_partition_and_size_and_their_statistics_bound_their_rows(
    spark: Any, tmp_path: Path, new_mirror: Any
) -> None:
    from deltalake import DeltaTable

    mirror, _owners, claim = new_mirror
    commits = [
        unique(vbucket_commit(vb, [upsert(vb, f"k{i}", i + 1, expiry=EXPIRY if i % 7 else None)
                                   for i in range(60)], seqno=60, first_load=True))
        for vb in range(2, 19)
    ]  # fmt: skip
    metadata = append_metadata(claim, 3, commits)
    appender = ArrowAppender(
        mirror.layout.data, mirror.data_layout, file_bytes=12_000, row_group_bytes=5_000
    )
    landed = appender.append(first_load_batches(commits), metadata)
    assert landed is not None
    actions = pa.table(DeltaTable(mirror.layout.data).get_add_actions(flatten=True)).to_pylist()
    width = mirror.data_layout.group_width
    assert width == 4 and landed.table_files == len(actions) > len({vb // 4 for vb in range(2, 19)})
    for action in actions:
        rows = pq.read_table(Path(mirror.layout.data) / action["path"])
        vbuckets = rows["vbucket"].to_pylist()
        assert {vb // width for vb in vbuckets} == {int(action["partition.vbucket_group"])}
        assert action["num_records"] == rows.num_rows
        assert (action["min.vbucket"], action["max.vbucket"]) == (min(vbuckets), max(vbuckets))
        assert (action["min.seqno"], action["max.seqno"]) == (
            min(rows["seqno"].to_pylist()), max(rows["seqno"].to_pylist())
        )
        assert action["null_count.expiry"] == rows["expiry"].null_count
    # Spark skips files by those statistics and still finds every row of each vbucket.
    for vb in range(0, 20):
        assert mirror.read().where(f"vbucket = {vb}").count() == (60 if 2 <= vb <= 18 else 0)
        assert mirror.read().where(f"vbucket = {vb} AND seqno = 60").count() == (
            1 if 2 <= vb <= 18 else 0
        )


@pytest.mark.spark
def test_a_failed_append_leaves_no_file_and_no_commit(
    spark: Any, tmp_path: Path, new_mirror: Any
) -> None:
    mirror, _owners, claim = new_mirror
    before = delta_snapshot(spark, mirror.layout.data).version()
    commits = first_load_commits(tmp_path)

    def failing() -> Iterator[pa.RecordBatch]:
        yield from first_load_batches(commits[:2])
        raise OSError("the disk is full")

    metadata = append_metadata(claim, 4, commits)
    appender = ArrowAppender(mirror.layout.data, mirror.data_layout, row_group_bytes=1)
    with pytest.raises(OSError, match="disk is full"):
        appender.append(failing(), metadata)
    assert delta_snapshot(spark, mirror.layout.data).version() == before
    assert not list(Path(mirror.layout.data).glob("*/*.parquet"))


CommitStep = Callable[[Callable[..., None]], None]


@pytest.fixture
def after_each_delta_rs_commit(monkeypatch: pytest.MonkeyPatch) -> Callable[[CommitStep], None]:
    """Installs a step run right after each delta-rs commit lands; the step is given the
    original commit function (to commit as another writer would)."""
    from deltalake import DeltaTable

    original = DeltaTable.create_write_transaction

    def install(step: CommitStep) -> None:
        def commit_then_step(table: Any, *args: Any, **kwargs: Any) -> None:
            original(table, *args, **kwargs)
            step(original)

        monkeypatch.setattr(DeltaTable, "create_write_transaction", commit_then_step)

    return install


@pytest.mark.spark
def test_the_version_reported_is_the_appends_own_when_another_writer_follows_at_once(
    spark: Any, tmp_path: Path, new_mirror: Any, after_each_delta_rs_commit: Any
) -> None:
    from deltalake import DeltaTable
    from deltalake.transaction import CommitProperties, Transaction

    mirror, _owners, claim = new_mirror

    def another_writer(commit: Callable[..., None]) -> None:
        other = DeltaTable(mirror.layout.data)
        commit(other, [], "append", other.schema(), commit_properties=CommitProperties(
            app_transactions=[Transaction(app_id="another-writer", version=1)]))

    after_each_delta_rs_commit(another_writer)
    commits = first_load_commits(tmp_path)[:1]
    metadata = append_metadata(claim, 5, commits)
    landed = ArrowAppender(mirror.layout.data, mirror.data_layout).append(
        first_load_batches(commits), metadata
    )
    latest = int(delta_snapshot(spark, mirror.layout.data).version())
    assert landed is not None and landed.version == latest - 1
    [ours] = mirror.delta().history().where(f"version = {landed.version}").collect()
    assert CommitMetadata.from_json(ours["userMetadata"]) == metadata


@pytest.mark.spark
def test_an_error_after_the_commit_landed_keeps_its_files(
    tmp_path: Path, new_mirror: Any, after_each_delta_rs_commit: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mirror, _owners, claim = new_mirror

    def fail(_commit: Callable[..., None]) -> None:
        raise OSError("a post-commit step failed")

    after_each_delta_rs_commit(fail)
    commits = first_load_commits(tmp_path)[:1]
    metadata = append_metadata(claim, 6, commits)
    with pytest.raises(OSError, match="post-commit"):
        ArrowAppender(mirror.layout.data, mirror.data_layout).append(
            first_load_batches(commits), metadata
        )
    monkeypatch.undo()
    assert mirror.read().count() == 50  # its files are still there, and read
    assert mirror.find_commit(claim.owner_id, 6, 0) is not None


def _list(snapshot: Any) -> list[Any]:
    transactions = snapshot.setTransactions()
    return [transactions.apply(i) for i in range(transactions.size())]


@pytest.mark.spark
def test_spilled_rows_that_repeat_keys_are_appended_by_spark(
    tmp_path: Path, new_mirror: Any
) -> None:
    mirror, owners, claim = new_mirror
    repeating = vbucket_commit(
        3, [], seqno=2, first_load=True,
        spill_files=[spill(tmp_path, 3, [upsert(3, "a", 1), upsert(3, "a", 2)])],
    )  # fmt: skip
    landed = CommitExecutor(mirror, claim, owners).execute(batch(1, repeating)).commits[0]
    assert engine_of(mirror, landed.table_version).startswith("Apache-Spark")
    assert [r["seqno"] for r in mirror.read().collect()] == [2]


@pytest.mark.spark
def test_a_table_whose_partition_the_arrow_path_does_not_compute_keeps_sparks_append(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def foreign_expression(layout: DataLayout) -> str:
        return f"CAST(pmod(vbucket, {layout.group_width}) AS INT)"

    monkeypatch.setattr(DataLayout, "generation_expression", foreign_expression)
    mirror = open_or_create(spark, str(tmp_path / "odd"), MirrorConfig("travel", num_vbuckets=64))
    monkeypatch.undo()
    refusal = arrow_append_refusal(mirror.layout.data, [mirror.data_layout])
    assert refusal == "column vbucket_group is generated as CAST(pmod(vbucket, 4) AS INT)"
    owners = OwnersTable.of(mirror)
    claim = owners.claim(range(64), "loader")
    executor = CommitExecutor(mirror, claim, owners)
    landed = executor.execute(batch(1, *first_load_commits(tmp_path))).commits[0]
    owners.release(claim)
    assert executor.arrow_appender() is None
    assert engine_of(mirror, landed.table_version).startswith("Apache-Spark")
    assert mirror.read().count() == 93


def test_only_local_tables_are_written_by_delta_rs() -> None:
    refusal = arrow_append_refusal("s3a://bucket/mirror", [DataLayout(64)])
    assert refusal == "the table is not on the local filesystem"
