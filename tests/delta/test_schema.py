"""Layout, schemas and commit metadata of a mirror (pure: no Spark session)."""

from __future__ import annotations

from datetime import timedelta

import pyarrow as pa
import pytest
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    TimestampType,
)

from replicator.dcp.positions import VbucketPosition
from replicator.delta.ownership import stable_owner_id
from replicator.delta.schema import (
    CHANGE_SCHEMA,
    DATA_COLUMNS,
    CommitMetadata,
    MirrorConfig,
    MirrorLayout,
    txn_version,
)
from replicator.snapshots.rows import CHANGE_SCHEMA as ARROW_CHANGE_SCHEMA

_SPARK_TYPE_OF_ARROW = {
    pa.int32(): IntegerType(),
    pa.int64(): LongType(),
    pa.string(): StringType(),
    pa.bool_(): BooleanType(),
    pa.binary(): BinaryType(),
    pa.timestamp("us", tz="UTC"): TimestampType(),
}


def test_spark_change_schema_matches_the_staging_schema() -> None:
    assert CHANGE_SCHEMA.fieldNames() == ARROW_CHANGE_SCHEMA.names
    for spark_field, arrow_field in zip(CHANGE_SCHEMA.fields, ARROW_CHANGE_SCHEMA, strict=True):
        assert spark_field.dataType == _SPARK_TYPE_OF_ARROW[arrow_field.type], arrow_field.name


def test_data_columns_are_the_change_columns_without_op() -> None:
    assert list(DATA_COLUMNS) == [n for n in ARROW_CHANGE_SCHEMA.names if n != "op"]


def test_layout_keeps_metadata_under_an_underscore_directory() -> None:
    layout = MirrorLayout("s3a://lake/travel/")
    assert layout.data == "s3a://lake/travel"
    assert layout.checkpoints == "s3a://lake/travel/_replicator/checkpoints"
    assert layout.owners == "s3a://lake/travel/_replicator/owners"
    assert layout.staging == "s3a://lake/travel/_replicator/staging"


def test_config_properties_mark_the_mirror_and_set_retention() -> None:
    properties = MirrorConfig(
        "travel", deleted_file_retention=timedelta(hours=36)
    ).data_table_properties()
    assert properties["replicator.bucket"] == "travel"
    assert properties["replicator.format"] == "1"
    assert properties["delta.enableChangeDataFeed"] == "true"
    assert properties["delta.enableDeletionVectors"] == "true"
    assert properties["delta.deletedFileRetentionDuration"] == "interval 129600 seconds"
    assert properties["delta.logRetentionDuration"] == "interval 30 days"


@pytest.mark.parametrize(
    "kwargs", [{"bucket": " "}, {"bucket": "b", "log_retention": timedelta(0)}]
)
def test_config_rejects_nonsense(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        MirrorConfig(**kwargs)  # type: ignore[arg-type]


def test_commit_metadata_round_trips_u64_uuids_and_details() -> None:
    metadata = CommitMetadata(
        kind="rollback",
        batch_id=12,
        part=0,
        owner_id="vb0-3",
        strategy="replace",
        positions={3: VbucketPosition(3, 2**64 - 1, 40, 40, 40, 7, 9)},
        details={"from_seqno": 55, "failover_log": [[2**64 - 1, 30]]},
    )
    parsed = CommitMetadata.from_json(metadata.to_json())
    assert parsed == metadata
    assert parsed is not None and parsed.txn_version == 24


def test_foreign_user_metadata_is_not_ours() -> None:
    assert CommitMetadata.from_json(None) is None
    assert CommitMetadata.from_json("nightly compaction") is None
    assert CommitMetadata.from_json('{"replicator": 2, "kind": "commit"}') is None


def test_malformed_replicator_metadata_is_an_error() -> None:
    with pytest.raises(ValueError, match="malformed"):
        CommitMetadata.from_json('{"replicator": 1, "kind": "commit"}')


def test_txn_versions_grow_with_batches_and_parts() -> None:
    order = [txn_version(b, p) for b in range(4) for p in (0, 1)]
    assert order == sorted(set(order))
    with pytest.raises(ValueError):
        txn_version(3, 2)


def test_owner_ids_are_stable_and_bounded() -> None:
    assert stable_owner_id([7, 0, 1, 2, 3]) == stable_owner_id({0, 1, 2, 3, 7}) == "vb0-3,7"
    sparse = stable_owner_id(range(0, 1024, 2))
    assert sparse.startswith("vbset-") and len(sparse) < 30
    assert sparse != stable_owner_id(range(1, 1024, 2))
