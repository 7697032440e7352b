"""The failover logs table: appended saves, newest per vbucket on load, older tables too."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from replicator.delta.failover_logs import FailoverLogsTable
from replicator.delta.schema import FAILOVER_LOG_SCHEMA
from replicator.model.positions import FailoverLog


def test_the_newest_save_of_each_vbucket_wins_and_one_append_is_one_commit(
    spark: Any, tmp_path: Path
) -> None:
    from delta.tables import DeltaTable

    path = str(tmp_path / "failover_logs")
    spark.createDataFrame([], FAILOVER_LOG_SCHEMA).write.format("delta").save(path)
    table = FailoverLogsTable(spark, path)
    first = {0: FailoverLog.of([(11, 0)]), 1: FailoverLog.of([(21, 0)])}
    table.save(first, at=datetime(2026, 1, 1, tzinfo=UTC))
    later = FailoverLog.of([(12, 500), (11, 0)])
    table.save({0: later}, at=datetime(2026, 1, 2, tzinfo=UTC))
    assert table.load() == {0: later, 1: first[1]}
    assert table.load([0]) == {0: later}
    operations = [r["operation"] for r in DeltaTable.forPath(spark, path).history().collect()]
    assert operations[:2] == ["WRITE", "WRITE"], "a save is a blind append, not a MERGE"


def test_a_table_written_one_row_per_vbucket_reads_the_same(
    spark: Any, tmp_path: Path
) -> None:
    path = str(tmp_path / "failover_logs")
    rows = [(vb, [(Decimal(100 + vb), 0)], datetime(2025, 6, 1, tzinfo=UTC)) for vb in range(3)]
    spark.createDataFrame(rows, FAILOVER_LOG_SCHEMA).write.format("delta").save(path)
    assert FailoverLogsTable(spark, path).load() == {
        vb: FailoverLog.of([(100 + vb, 0)]) for vb in range(3)
    }
