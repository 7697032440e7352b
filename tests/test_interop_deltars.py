"""Other engines read the mirror: delta-rs (`deltalake`) sees exactly what Spark sees.

The mirror is the audit scenario's (tests/test_audit.py, built once per run): MERGEs that left
deletion vectors, a rollback that rewrote a vbucket, and the replicator's own tables. The data
table has deletion vectors enabled, which delta-rs's pyarrow-dataset path
(`to_pyarrow_table`) refuses, so it is read with `DeltaTable.scan()` (delta-rs's own engine);
the metadata tables have no deletion vectors and are read with `to_pyarrow_table()`. delta-rs's
change data feed matches Spark's except on rollback commits (a strict xfail below records why).
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from replicator.audit import changes_between, rollbacks
from replicator.delta.schema import DATA_COLUMNS, MirrorLayout
from tests.test_audit import AuditScenario, audit_scenario

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def scenario(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> AuditScenario:
    return audit_scenario(spark, tmp_path_factory.mktemp("audit"))


def plain(value: Any) -> Any:
    """One cell as plain Python, the same whichever engine produced it."""
    if isinstance(value, datetime):
        # PySpark gives naive local time, delta-rs aware UTC.
        return value.astimezone(UTC)
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, dict):
        return tuple(sorted((k, plain(v)) for k, v in value.items()))
    if hasattr(value, "asDict"):
        return plain(value.asDict())
    if isinstance(value, list):
        return tuple(plain(v) for v in value)
    return value


def spark_rows(frame: Any, columns: list[str]) -> list[tuple[Any, ...]]:
    return sorted((tuple(plain(row[c]) for c in columns) for row in frame.collect()), key=repr)


def arrow_rows(table: pa.Table, columns: list[str]) -> list[tuple[Any, ...]]:
    records = table.select(columns).to_pylist()
    return sorted((tuple(plain(r[c]) for c in columns) for r in records), key=repr)


def scanned(table: DeltaTable) -> pa.Table:
    """All rows through delta-rs's own engine (applies deletion vectors)."""
    return pa.RecordBatchReader.from_stream(table.scan()).read_all()


def test_the_scenario_left_deletion_vectors_for_delta_rs_to_apply(
    scenario: AuditScenario,
) -> None:
    vectors = pa.RecordBatchReader.from_stream(DeltaTable(scenario.target).deletion_vectors())

    assert vectors.read_all().num_rows >= 1


def test_data_table_now_and_at_an_old_version_reads_the_same_in_both_engines(
    spark: Any, scenario: AuditScenario
) -> None:
    columns = list(DATA_COLUMNS)
    before_rollback = rollbacks(spark, scenario.target)[0].table_version - 1

    for version in (None, before_rollback):
        reader = spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        expected = spark_rows(reader.load(scenario.target), columns)

        actual = arrow_rows(scanned(DeltaTable(scenario.target, version=version)), columns)

        assert actual == expected, f"version {version}"
        if version is None:
            assert len(actual) == len(scenario.bucket.documents())


@pytest.mark.parametrize("table", ["checkpoints", "failover_logs", "owners"])
def test_metadata_tables_read_the_same_in_both_engines(
    spark: Any, scenario: AuditScenario, table: str
) -> None:
    path = getattr(MirrorLayout(scenario.target), table)
    frame = spark.read.format("delta").load(path)
    columns = frame.columns

    actual = arrow_rows(DeltaTable(path).to_pyarrow_table(), columns)

    assert actual == spark_rows(frame, columns)
    if table != "owners":  # the replication released its claim when it stopped
        assert actual, f"the scenario wrote no {table} rows"
    if table == "checkpoints":
        uuids = {row[columns.index("vbucket_uuid")] for row in actual}
        assert all(isinstance(uuid, Decimal) for uuid in uuids)


CDF_COLUMNS = [*DATA_COLUMNS, "_change_type", "_commit_version"]


def change_feeds(
    spark: Any, scenario: AuditScenario, *, rollback_commits: bool
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """(Spark's, delta-rs's) change data feed rows of versions 1..latest: those of rollback
    commits, or those of every other commit."""
    latest = DeltaTable(scenario.target).version()
    rewrites = {r.table_version for r in rollbacks(spark, scenario.target)}
    version = CDF_COLUMNS.index("_commit_version")
    expected = spark_rows(changes_between(spark, scenario.target, 1, latest), CDF_COLUMNS)
    feed = DeltaTable(scenario.target).load_cdf(starting_version=1, ending_version=latest)
    actual = arrow_rows(pa.RecordBatchReader.from_stream(feed).read_all(), CDF_COLUMNS)
    expected, actual = (
        [row for row in rows if (row[version] in rewrites) == rollback_commits]
        for rows in (expected, actual)
    )
    return expected, actual


def test_change_data_feed_reads_the_same_in_both_engines_outside_rollbacks(
    spark: Any, scenario: AuditScenario
) -> None:
    expected, actual = change_feeds(spark, scenario, rollback_commits=False)

    assert actual == expected
    assert {row[CDF_COLUMNS.index("_change_type")] for row in actual} >= {
        "insert", "update_preimage", "update_postimage", "delete"
    }


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,  # the known mismatch only: an error reading either feed still fails
    reason="deltalake 1.6.6 load_cdf inverts the deletion vector of a removed file: a rollback "
    "commit (replaceWhere over a partition whose file has a DV) reports the DV-deleted rows as "
    "deleted instead of the live ones. Read the change feed with Spark (changes_between).",
)
def test_change_data_feed_of_a_rollback_commit_reads_the_same_in_both_engines(
    spark: Any, scenario: AuditScenario
) -> None:
    expected, actual = change_feeds(spark, scenario, rollback_commits=True)

    assert expected, "the scenario has a rollback commit"
    assert actual == expected
