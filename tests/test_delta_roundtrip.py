"""Foundation check: a real Delta round trip through the project's session builder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from chispa import assert_df_equality
from delta.tables import DeltaTable

pytestmark = pytest.mark.spark


def test_merge_time_travel_and_commit_metadata(spark: Any, tmp_path: Path) -> None:
    path = str(tmp_path / "docs")
    initial = spark.createDataFrame([("a", 1), ("b", 2), ("c", 3)], "key string, rev long")
    initial.write.format("delta").save(path)

    changes = spark.createDataFrame(
        [("a", 10, False), ("b", 0, True), ("d", 4, False)], "key string, rev long, deleted boolean"
    )
    (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(changes.alias("s"), "t.key = s.key")
        .whenMatchedDelete(condition="s.deleted")
        .whenMatchedUpdate(set={"rev": "s.rev"})
        .whenNotMatchedInsert(condition="NOT s.deleted", values={"key": "s.key", "rev": "s.rev"})
        .execute()
    )
    spark.conf.set("spark.databricks.delta.commitInfo.userMetadata", "batch=7")
    try:
        spark.createDataFrame([("e", 5)], "key string, rev long").write.format("delta").mode(
            "append"
        ).save(path)
    finally:
        spark.conf.unset("spark.databricks.delta.commitInfo.userMetadata")

    expected_now = spark.createDataFrame(
        [("a", 10), ("c", 3), ("d", 4), ("e", 5)], "key string, rev long"
    )
    assert_df_equality(
        spark.read.format("delta").load(path), expected_now, ignore_row_order=True
    )
    version_zero = spark.read.format("delta").option("versionAsOf", 0).load(path)
    assert_df_equality(version_zero, initial, ignore_row_order=True)

    history = DeltaTable.forPath(spark, path).history().select("version", "userMetadata")
    metadata = {row["version"]: row["userMetadata"] for row in history.collect()}
    assert metadata[2] == "batch=7"
    assert metadata[1] is None


def test_the_shared_session_has_delta_and_the_small_machine_defaults(spark: Any) -> None:
    from replicator.runtime.spark import DELTA_CONF, LOCAL_DEFAULTS

    for key, value in {**DELTA_CONF, **LOCAL_DEFAULTS}.items():
        assert spark.conf.get(key) == value, key
    assert spark.sparkContext.master.startswith("local")
    assert spark.sparkContext.uiWebUrl is None, "the UI is off on a local master"
    jars = spark.conf.get("spark.jars")
    assert "delta-spark_2.13-4.0.1.jar" in jars and "delta-storage-4.0.1.jar" in jars
