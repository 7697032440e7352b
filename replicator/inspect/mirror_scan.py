"""`replicator verify`'s mirror side: per vbucket, the digest of the mirror's unexpired rows, its
expired keys, and (only where digests differ) its documents.

Read through a TableReader and fingerprinted in Python (`MirrorScan`, delta-rs by default), or
computed by Spark where the rows are (`mirror_digests` and friends, for mirrors too big for one
process to read); `read_mirror_side` picks by the reader.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple, Protocol

from replicator.inspect.fingerprints import (
    SUM_SHIFT,
    ContentDigest,
    RowColumns,
    fingerprint_column,
)
from replicator.model.aliases import DocumentKey

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from replicator.delta.reader import TableReader


class MirrorDocument(NamedTuple):
    """A mirror row reduced to what the comparison needs."""

    seqno: int
    fingerprint: int
    scope: str
    collection: str


class MirrorSide(Protocol):
    """The mirror side as verify judges it, whichever engine computed it."""

    digests: dict[int, ContentDigest]
    expired: dict[int, set[DocumentKey]]

    def documents(self, vbucket: int) -> dict[DocumentKey, MirrorDocument]: ...


def read_mirror_side(reader: TableReader, path: str, now_s: int) -> MirrorSide:
    """The mirror at `path` as of `now_s`: by Spark on a Spark reader, else by `MirrorScan`."""
    from replicator.delta.reader import SparkReader

    if isinstance(reader, SparkReader):
        return _SparkMirror(reader.spark.read.format("delta").load(path), now_s)
    return MirrorScan(reader, path, now_s).scan()


def _unexpired(frame: DataFrame, now_s: int) -> DataFrame:
    from pyspark.sql import functions as F

    return frame.where(F.col("expiry").isNull() | (F.unix_seconds("expiry") > F.lit(now_s)))


def mirror_digests(frame: DataFrame, now_s: int) -> dict[int, ContentDigest]:
    """Per vbucket, the digest of the mirror's rows that have not expired at `now_s`."""
    from pyspark.sql import functions as F

    rows = (
        _unexpired(frame, now_s)
        .withColumn("fingerprint", fingerprint_column())
        .groupBy("vbucket")
        .agg(
            F.count(F.lit(1)).alias("n"),
            F.bit_xor("fingerprint").alias("x"),
            F.sum(F.shiftright("fingerprint", SUM_SHIFT)).alias("s"),
        )
        .collect()
    )
    return {
        int(row["vbucket"]): ContentDigest(int(row["n"]), int(row["x"]), int(row["s"]))
        for row in rows
    }


def mirror_expired_keys(frame: DataFrame, now_s: int) -> dict[int, set[DocumentKey]]:
    """Per vbucket, the mirror's documents whose expiry has passed at `now_s`."""
    from pyspark.sql import functions as F

    rows = (
        frame.where(F.col("expiry").isNotNull() & (F.unix_seconds("expiry") <= F.lit(now_s)))
        .select("vbucket", "collection_id", "key")
        .collect()
    )
    expired: dict[int, set[DocumentKey]] = {}
    for row in rows:
        expired.setdefault(int(row["vbucket"]), set()).add(
            (int(row["collection_id"]), str(row["key"]))
        )
    return expired


def mirror_documents(
    frame: DataFrame, vbucket: int, now_s: int
) -> dict[DocumentKey, MirrorDocument]:
    """The unexpired rows of one vbucket of the mirror."""
    from pyspark.sql import functions as F

    rows = (
        _unexpired(frame.where(F.col("vbucket") == vbucket), now_s)
        .select(
            "collection_id", "key", "seqno", "scope", "collection",
            fingerprint_column().alias("fingerprint"),
        )
        .collect()
    )
    return {
        (int(row["collection_id"]), str(row["key"])): MirrorDocument(
            int(row["seqno"]), int(row["fingerprint"]), str(row["scope"]), str(row["collection"])
        )
        for row in rows
    }


_MIRROR_COLUMNS = (
    "vbucket", "collection_id", "key", "seqno", "cas", "flags", "expiry", "is_json", "doc",
    "value", "xattrs", "scope", "collection",
)
"""What the mirror side reads of each row: `row_fingerprint`'s inputs, and names."""


@dataclass
class MirrorScan:
    """The mirror side read through a TableReader (delta-rs or Spark): the same digests and
    documents as `mirror_digests` and friends, fingerprinted in Python by `row_fingerprint`
    itself, a batch at a time."""

    reader: TableReader
    path: str
    now_s: int
    digests: dict[int, ContentDigest] = field(default_factory=dict)
    expired: dict[int, set[DocumentKey]] = field(default_factory=dict)

    def scan(self) -> MirrorScan:
        """Digest every vbucket's unexpired rows and collect its expired keys."""
        counts: dict[int, list[int]] = {}
        for batch in self.reader.batches(self.path, _MIRROR_COLUMNS):
            columns = RowColumns.of(batch)
            vbuckets = batch.column(batch.schema.get_field_index("vbucket")).to_pylist()
            for index, vb in enumerate(vbuckets):
                expiry = columns.expiry_s(index)
                if expiry is not None and expiry <= self.now_s:
                    self.expired.setdefault(vb, set()).add(
                        (int(columns.collection_id[index]), columns.key[index])
                    )
                    continue
                fingerprint = columns.fingerprint(index)
                sums = counts.setdefault(vb, [0, 0, 0])
                sums[0] += 1
                sums[1] ^= fingerprint
                sums[2] += fingerprint >> SUM_SHIFT
        self.digests = {vb: ContentDigest(*sums) for vb, sums in counts.items()}
        return self

    def documents(self, vbucket: int) -> dict[DocumentKey, MirrorDocument]:
        """The unexpired rows of one vbucket."""
        rows = RowColumns.of(
            self.reader.read(self.path, _MIRROR_COLUMNS, where=f"vbucket = {int(vbucket)}")
        )
        found = {}
        for index, key in enumerate(rows.key):
            expiry = rows.expiry_s(index)
            if expiry is not None and expiry <= self.now_s:
                continue
            found[(int(rows.collection_id[index]), key)] = MirrorDocument(
                int(rows.seqno[index]), rows.fingerprint(index), rows.scope[index],
                rows.collection[index],
            )
        return found


class _SparkMirror:
    """The mirror side computed by Spark, where the rows are."""

    def __init__(self, frame: DataFrame, now_s: int) -> None:
        self._frame = frame
        self._now_s = now_s
        self.digests = mirror_digests(frame, now_s)
        self.expired = mirror_expired_keys(frame, now_s)

    def documents(self, vbucket: int) -> dict[DocumentKey, MirrorDocument]:
        return mirror_documents(self._frame, vbucket, self._now_s)
