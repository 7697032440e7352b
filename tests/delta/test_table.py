"""Creating and reopening a mirror, and refusing paths that hold something else."""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from delta.tables import DeltaTable
from pyspark.sql.types import IntegerType

from replicator.delta.schema import DATA_SCHEMA, DataLayout, MirrorConfig
from replicator.delta.table import open_or_create
from replicator.errors import ConfigError, NotAMirrorError

pytestmark = pytest.mark.spark


def test_creates_partitioned_data_table_with_properties_and_metadata_tables(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "travel"
    mirror = open_or_create(spark, str(path), MirrorConfig("travel"))

    detail = DeltaTable.forPath(spark, str(path)).detail().first()
    assert detail is not None
    assert detail["partitionColumns"] == ["vbucket_group"]
    properties = detail["properties"]
    assert properties["replicator.vbucketGroupWidth"] == "64"  # 1024 vbuckets, 16 partitions
    assert properties["replicator.bucket"] == "travel"
    assert properties["replicator.format"] == "1"
    assert properties["delta.enableChangeDataFeed"] == "true"
    assert properties["delta.enableDeletionVectors"] == "true"
    assert properties["delta.deletedFileRetentionDuration"] == "interval 7 days"
    assert properties["delta.logRetentionDuration"] == "interval 30 days"
    assert [(f.name, f.dataType) for f in mirror.read().schema.fields] == [
        *((f.name, f.dataType) for f in DATA_SCHEMA.fields), ("vbucket_group", IntegerType())
    ]
    assert mirror.data_layout == DataLayout(64)
    for table in ("checkpoints", "failover_logs", "owners"):
        assert (path / "_replicator" / table / "_delta_log").is_dir(), table
        assert spark.read.format("delta").load(str(path / "_replicator" / table)).count() == 0

    # Reopening the same mirror creates nothing new.
    again = open_or_create(spark, str(path), MirrorConfig("travel"))
    assert again.version() == mirror.version() == 0

    # Reopening with other retention settings applies them (rollback's horizon follows them).
    shorter = MirrorConfig(
        "travel", deleted_file_retention=timedelta(days=2), log_retention=timedelta(hours=36)
    )
    with caplog.at_level(logging.INFO, logger="replicator.delta.table"):
        reopened = open_or_create(spark, str(path), shorter)
    detail = DeltaTable.forPath(spark, str(path)).detail().first()
    assert detail is not None
    assert detail["properties"]["delta.deletedFileRetentionDuration"] == "interval 2 days"
    assert detail["properties"]["delta.logRetentionDuration"] == "interval 129600 seconds"
    assert detail["properties"]["replicator.bucket"] == "travel"
    assert reopened.version() == 1
    assert "delta.deletedFileRetentionDuration 'interval 7 days' -> 'interval 2 days'" in (
        caplog.text
    )
    # Unchanged settings write nothing.
    assert open_or_create(spark, str(path), shorter).version() == 1


def test_refuses_a_directory_of_other_files(spark: Any, tmp_path: Path) -> None:
    (tmp_path / "export.csv").write_text("id,name\n1,x\n")
    with pytest.raises(
        NotAMirrorError, match=r"not a Delta table but holds other files \(export.csv\)"
    ):
        open_or_create(spark, str(tmp_path), MirrorConfig("travel"))
    assert not (tmp_path / "_delta_log").exists()


def test_reopens_a_mirror_whose_path_has_glob_characters(spark: Any, tmp_path: Path) -> None:
    # Hadoop globs treat [1] and {a} as patterns: the table check must take the path literally.
    path = str(tmp_path / "mirror[1]{a}")
    created = open_or_create(spark, path, MirrorConfig("travel"))
    reopened = open_or_create(spark, path, MirrorConfig("travel"))
    assert reopened.version() == created.version() == 0


def test_refuses_a_delta_table_that_is_not_a_mirror(spark: Any, tmp_path: Path) -> None:
    spark.range(3).write.format("delta").save(str(tmp_path / "numbers"))
    with pytest.raises(NotAMirrorError, match="not a replicator mirror"):
        open_or_create(spark, str(tmp_path / "numbers"), MirrorConfig("travel"))


def test_refuses_the_mirror_of_another_bucket(spark: Any, tmp_path: Path) -> None:
    open_or_create(spark, str(tmp_path / "m"), MirrorConfig("beer-sample"))
    with pytest.raises(NotAMirrorError, match="mirror of bucket 'beer-sample', not of 'travel'"):
        open_or_create(spark, str(tmp_path / "m"), MirrorConfig("travel"))


def test_unwritable_target_is_a_config_error_without_a_stack_trace(
    spark: Any, tmp_path: Path
) -> None:
    blocker = tmp_path / "plain-file"
    blocker.write_text("not a directory")
    with pytest.raises(ConfigError) as caught:
        open_or_create(spark, str(blocker / "mirror"), MirrorConfig("travel"))
    message = str(caught.value)
    assert message.startswith(f"cannot open or create the mirror at {blocker / 'mirror'}: ")
    assert "\n" not in message and "\tat " not in message
