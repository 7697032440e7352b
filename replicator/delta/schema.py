"""What a mirror looks like on storage: its layout, table schemas, properties and commit metadata.

Pure definitions (no Spark session needed): the data table at the target path, partitioned by
vbucket, and the replicator's own tables under `<target>/_replicator/` (Delta ignores
underscore directories for data and VACUUM). Every data commit carries a `CommitMetadata`
as its userMetadata: the commit itself says which positions it reached, so the checkpoints table
can always be repaired from the data table's history.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DecimalType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from replicator.dcp.positions import VbucketPosition

FORMAT_VERSION = 1
"""Bumped when the layout or the metadata format changes incompatibly."""

BUCKET_PROPERTY = "replicator.bucket"
FORMAT_PROPERTY = "replicator.format"
ROLE_PROPERTY = "replicator.role"

METADATA_DIR = "_replicator"

UPSERT = "upsert"
DELETE = "delete"

U64 = DecimalType(20, 0)
"""vbucket uuids are unsigned 64-bit: no Spark integer type holds them."""

DATA_SCHEMA = StructType(
    [
        StructField("vbucket", IntegerType(), nullable=False),
        StructField("scope", StringType(), nullable=False),
        StructField("collection", StringType(), nullable=False),
        StructField("collection_id", LongType(), nullable=False),
        StructField("key", StringType(), nullable=False),
        StructField("seqno", LongType(), nullable=False),
        StructField("rev_seqno", LongType(), nullable=False),
        StructField("cas", LongType(), nullable=False),
        StructField("flags", LongType()),
        StructField("expiry", TimestampType()),
        StructField("is_json", BooleanType(), nullable=False),
        StructField("doc", StringType()),
        StructField("value", BinaryType()),
        StructField("xattrs", StringType()),
    ]
)
"""The mirrored documents: one row per live document, partitioned by `vbucket`."""

DATA_COLUMNS: tuple[str, ...] = tuple(f.name for f in DATA_SCHEMA.fields)

CHANGE_SCHEMA = StructType(
    [
        *DATA_SCHEMA.fields[:10],
        StructField("op", StringType(), nullable=False),
        *DATA_SCHEMA.fields[10:],
    ]
)
"""Spark twin of `replicator.snapshots.rows.CHANGE_SCHEMA` (staged change rows, spill files)."""

CHECKPOINT_SCHEMA = StructType(
    [
        StructField("owner_id", StringType(), nullable=False),
        StructField("batch_id", LongType(), nullable=False),
        StructField("table_version", LongType(), nullable=False),
        StructField("kind", StringType(), nullable=False),
        StructField("vbucket", IntegerType(), nullable=False),
        StructField("vbucket_uuid", U64, nullable=False),
        StructField("seqno", LongType(), nullable=False),
        StructField("snapshot_start", LongType(), nullable=False),
        StructField("snapshot_end", LongType(), nullable=False),
        StructField("purge_seqno", LongType(), nullable=False),
        StructField("manifest_uid", LongType(), nullable=False),
        StructField("committed_at", TimestampType(), nullable=False),
    ]
)
"""One row per vbucket per data commit: where that commit left the vbucket."""

# Delta refuses NOT NULL inside arrays: the nested fields stay nullable.
FAILOVER_ENTRY_TYPE = StructType(
    [StructField("vbucket_uuid", U64), StructField("seqno", LongType())]
)

FAILOVER_LOG_SCHEMA = StructType(
    [
        StructField("vbucket", IntegerType(), nullable=False),
        StructField("entries", ArrayType(FAILOVER_ENTRY_TYPE), False),
        StructField("updated_at", TimestampType(), nullable=False),
    ]
)
"""One row per vbucket: its whole failover log, newest entry first."""

OWNER_SCHEMA = StructType(
    [
        StructField("owner_id", StringType(), nullable=False),
        StructField("claim_id", StringType(), nullable=False),
        StructField("vbuckets", ArrayType(IntegerType()), False),
        StructField("host", StringType(), nullable=False),
        StructField("pid", LongType(), nullable=False),
        StructField("lease_seconds", LongType(), nullable=False),
        StructField("claimed_at", TimestampType(), nullable=False),
        StructField("heartbeat_at", TimestampType(), nullable=False),
    ]
)
"""One row per live claim: which replicator process writes which vbuckets."""


def _interval(duration: timedelta) -> str:
    seconds = int(duration.total_seconds())
    if seconds % 86400 == 0:
        return f"interval {seconds // 86400} days"
    return f"interval {seconds} seconds"


@dataclass(frozen=True, slots=True)
class MirrorConfig:
    """How a mirror of `bucket` is kept: retention of old files and of the commit log.

    Time travel (rollback to an earlier version) reaches back only as far as both allow.
    """

    bucket: str
    deleted_file_retention: timedelta = timedelta(days=7)
    log_retention: timedelta = timedelta(days=30)

    def __post_init__(self) -> None:
        if not self.bucket or not self.bucket.strip():
            raise ValueError("a mirror needs the name of the bucket it mirrors")
        for name in ("deleted_file_retention", "log_retention"):
            value: timedelta = getattr(self, name)
            if value.total_seconds() < 1:
                raise ValueError(f"{name} must be at least one second, got {value}")

    def data_table_properties(self) -> dict[str, str]:
        """Delta properties of the data table; the replicator.* ones mark it as our mirror."""
        return {
            "delta.enableChangeDataFeed": "true",
            "delta.enableDeletionVectors": "true",
            "delta.deletedFileRetentionDuration": _interval(self.deleted_file_retention),
            "delta.logRetentionDuration": _interval(self.log_retention),
            BUCKET_PROPERTY: self.bucket,
            FORMAT_PROPERTY: str(FORMAT_VERSION),
        }

    def metadata_table_properties(self, role: str) -> dict[str, str]:
        """Delta properties of one of the replicator's own tables (`role`: checkpoints, ...)."""
        return {
            "delta.logRetentionDuration": _interval(self.log_retention),
            BUCKET_PROPERTY: self.bucket,
            FORMAT_PROPERTY: str(FORMAT_VERSION),
            ROLE_PROPERTY: role,
        }


@dataclass(frozen=True, slots=True)
class MirrorLayout:
    """Where the tables of the mirror at `root` live (a local path or any Hadoop URI)."""

    root: str

    def __post_init__(self) -> None:
        if not self.root or not self.root.strip():
            raise ValueError("the mirror's target path is empty")

    def _child(self, name: str) -> str:
        return f"{self.root.rstrip('/')}/{METADATA_DIR}/{name}"

    @property
    def data(self) -> str:
        return self.root.rstrip("/") or "/"

    @property
    def checkpoints(self) -> str:
        return self._child("checkpoints")

    @property
    def failover_logs(self) -> str:
        return self._child("failover_logs")

    @property
    def owners(self) -> str:
        return self._child("owners")

    @property
    def staging(self) -> str:
        """Spill files of the snapshots layer (not a Delta table)."""
        return self._child("staging")


COMMIT = "commit"
ROLLBACK = "rollback"
RESYNC = "resync"
COMMIT_KINDS = (COMMIT, ROLLBACK, RESYNC)


def txn_version(batch_id: int, part: int) -> int:
    """The Delta txnVersion of part `part` (0 or 1) of batch `batch_id`.

    A batch may become two commits (append part, merge part); each needs its own version,
    and versions must only grow with batch ids.
    """
    if batch_id < 0 or part not in (0, 1):
        raise ValueError(f"no txn version for batch {batch_id} part {part}")
    return batch_id * 2 + part


def txn_app_id(owner_id: str) -> str:
    """The Delta txnAppId of every commit an owner makes (data and checkpoints alike)."""
    return f"replicator-{owner_id}"


def _position_array(position: VbucketPosition) -> list[int]:
    return [
        position.vbucket_uuid,
        position.seqno,
        position.snapshot_start,
        position.snapshot_end,
        position.purge_seqno,
        position.manifest_uid,
    ]


@dataclass(frozen=True, slots=True)
class CommitMetadata:
    """The userMetadata of one data commit: who made it, for which batch, reaching which positions.

    `details` holds kind-specific facts (a rollback's from/to seqnos, failover log, reason).
    """

    kind: str
    batch_id: int
    part: int
    owner_id: str
    strategy: str
    positions: Mapping[int, VbucketPosition]
    details: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in COMMIT_KINDS:
            raise ValueError(f"unknown commit kind {self.kind!r}; expected one of {COMMIT_KINDS}")

    @property
    def txn_version(self) -> int:
        return txn_version(self.batch_id, self.part)

    def to_json(self) -> str:
        """Compact JSON for `spark.databricks.delta.commitInfo.userMetadata`."""
        document: dict[str, Any] = {
            "replicator": FORMAT_VERSION,
            "kind": self.kind,
            "batch": self.batch_id,
            "part": self.part,
            "owner": self.owner_id,
            "strategy": self.strategy,
            "positions": {str(vb): _position_array(p) for vb, p in sorted(self.positions.items())},
        }
        for key, value in self.details.items():
            document.setdefault(key, value)
        return json.dumps(document, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | None) -> CommitMetadata | None:
        """Parse a commit's userMetadata; None when the commit was not made by the replicator."""
        if not text:
            return None
        try:
            document = json.loads(text)
        except ValueError:
            return None
        if not isinstance(document, dict) or document.get("replicator") != FORMAT_VERSION:
            return None
        try:
            positions = {
                int(vb): VbucketPosition(int(vb), *(int(n) for n in values))
                for vb, values in document["positions"].items()
            }
            known = {"replicator", "kind", "batch", "part", "owner", "strategy", "positions"}
            return cls(
                kind=str(document["kind"]),
                batch_id=int(document["batch"]),
                part=int(document["part"]),
                owner_id=str(document["owner"]),
                strategy=str(document["strategy"]),
                positions=positions,
                details={k: v for k, v in document.items() if k not in known},
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed replicator commit metadata: {exc}") from exc
