"""Layout, schemas and commit metadata of a mirror (pure: no Spark session)."""

from __future__ import annotations

import json
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

from replicator.delta.commit_metadata import CommitMetadata, txn_version
from replicator.delta.ownership import stable_owner_id
from replicator.delta.schema import (
    CHANGE_SCHEMA,
    DATA_COLUMNS,
    DataLayout,
    MirrorConfig,
    MirrorLayout,
    vbucket_group_width,
)
from replicator.model.positions import VbucketPosition
from replicator.staging.rows import CHANGE_SCHEMA as ARROW_CHANGE_SCHEMA

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


@pytest.mark.parametrize(
    "position",
    [
        VbucketPosition(3, 2**64 - 1, 40, 40, 40, 0, 0),  # a plain boundary: two numbers
        VbucketPosition(3, 5, 40, 40, 40, 7, 0),  # purged: four
        VbucketPosition(3, 5, 40, 40, 40, 0, 9),  # a collections manifest: four
        VbucketPosition(3, 5, 40, 30, 45, 0, 0),  # inside a snapshot: all six
    ],
)
def test_positions_are_written_compactly_and_read_back_exactly(position: VbucketPosition) -> None:
    metadata = CommitMetadata("commit", 1, 1, "o", "merge", {3: position})
    written = metadata.to_json()
    assert CommitMetadata.from_json(written) == metadata
    plain = position.snapshot_start == position.snapshot_end == position.seqno
    extra = position.purge_seqno or position.manifest_uid
    expected = 2 if plain and not extra else 4 if plain else 6
    assert len(json.loads(written)["positions"]["3"]) == expected


def test_metadata_with_six_number_positions_from_older_commits_still_reads() -> None:
    older = '{"replicator":1,"kind":"commit","batch":2,"part":1,"owner":"o",' + (
        '"strategy":"merge","positions":{"4":[7,12,12,12,0,0]}}'
    )
    parsed = CommitMetadata.from_json(older)
    assert parsed is not None and parsed.positions == {4: VbucketPosition.at_boundary(4, 7, 12)}


def test_commit_metadata_of_1024_vbuckets_stays_small() -> None:
    positions = {vb: VbucketPosition.at_boundary(vb, 2**63 + vb, 10_000 + vb) for vb in range(1024)}
    text = CommitMetadata("commit", 9, 1, "vb0-1023", "merge", positions).to_json()
    assert len(text) < 40_000  # six numbers a position took about 60 KB


def test_grouped_layout_names_partitions_and_vbuckets_with_literals() -> None:
    layout = DataLayout(vbucket_group_width(1024))
    assert layout.group_width == 64 and layout.partition_column == "vbucket_group"
    assert layout.groups([0, 63, 64, 1023]) == [0, 1, 15]
    assert layout.predicate([700, 5], alias="t") == (
        "t.vbucket_group IN (0, 10) AND t.vbucket IN (5, 700)"
    )
    assert MirrorConfig("b", num_vbuckets=64).new_layout == DataLayout(4)
    legacy = DataLayout(None)
    assert legacy.partition_column == "vbucket" and legacy.groups([9, 2]) == [2, 9]
    assert legacy.predicate([9, 2]) == "vbucket IN (2, 9)"
    with pytest.raises(ValueError, match="at least one vbucket"):
        layout.predicate([])


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
