"""The candidate layouts, and the rows they are built from and changed with: documents
generated in Spark, the MERGE batches' change sources and the one-vbucket rollback's."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from replicator.bench.layouts.report import ChangeMix
from replicator.delta.schema import DATA_SCHEMA, VBUCKET_GROUP, DataLayout, vbucket_group_width
from replicator.staging.rows import DELETE, UPSERT

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

NUM_VBUCKETS = 1024
GROUP_LAYOUT = DataLayout(vbucket_group_width(NUM_VBUCKETS))
GROUP_WIDTH = vbucket_group_width(NUM_VBUCKETS)
"""Vbuckets per `vbucket_group` partition, as the mirror has them: 16 partitions at 1024."""
GROUP_COLUMN = VBUCKET_GROUP
GROUP_EXPRESSION = GROUP_LAYOUT.generation_expression()
ROLLBACK_VBUCKET = 341
TABLE_PROPERTIES = {
    "delta.enableDeletionVectors": "true",
    "delta.enableChangeDataFeed": "true",
}

DOC_FIELDS = 13
"""Fields of 64 hex characters in a generated JSON document: about 1 KB of text."""


@dataclass(frozen=True, slots=True)
class Layout:
    """How one candidate table is created and how a MERGE names its vbuckets."""

    name: str
    partition_column: str | None = None
    generated_group: bool = False
    clustered: bool = False
    change_data_feed: bool = True

    def create(self, spark: SparkSession, path: str) -> None:
        from delta.tables import DeltaTable

        builder = DeltaTable.create(spark).location(path).addColumns(DATA_SCHEMA)
        if self.generated_group:
            builder = builder.addColumn(GROUP_COLUMN, "INT", generatedAlwaysAs=GROUP_EXPRESSION)
        for key, value in TABLE_PROPERTIES.items():
            builder = builder.property(key, value)
        if not self.change_data_feed:
            builder = builder.property("delta.enableChangeDataFeed", "false")
        if self.partition_column is not None:
            builder = builder.partitionedBy(self.partition_column)
        if self.clustered:
            builder = builder.clusterBy("vbucket")
        builder.execute()

    def prune(self, vbuckets: Sequence[int]) -> str:
        """The literal predicate on the target naming `vbuckets` (partition column first).

        >>> LAYOUTS["groups16"].prune([341])
        't.vbucket_group = 5 AND t.vbucket = 341'
        >>> LAYOUTS["vbucket"].prune([1, 2])
        't.vbucket IN (1, 2)'
        """
        wanted = sorted(set(vbuckets))
        by_vbucket = _literal_in("t.vbucket", wanted)
        if not self.generated_group:
            return by_vbucket
        groups = sorted({vb // GROUP_WIDTH for vb in wanted})
        return f"{_literal_in(f't.{GROUP_COLUMN}', groups)} AND {by_vbucket}"

    def merge_condition(self, vbuckets: Sequence[int]) -> str:
        return (
            f"{self.prune(vbuckets)} AND t.vbucket = s.vbucket "
            "AND t.collection_id = s.collection_id AND t.key = s.key"
        )


def _literal_in(column: str, values: Sequence[int]) -> str:
    if len(values) == 1:
        return f"{column} = {values[0]}"
    return f"{column} IN ({', '.join(str(v) for v in values)})"


LAYOUTS: dict[str, Layout] = {
    "vbucket": Layout("vbucket", partition_column="vbucket"),
    "groups16": Layout("groups16", partition_column=GROUP_COLUMN, generated_group=True),
    "unpartitioned": Layout("unpartitioned"),
    "clustered": Layout("clustered", clustered=True),
}
SCALING_LAYOUTS = ("groups16", "unpartitioned")


def _doc(version: int) -> Column:
    """About 1 KB of JSON text for document `n` at `version` (different text per version)."""
    from pyspark.sql import functions as F

    n = F.col("n").cast("string")
    fields = [
        F.concat(
            F.lit(f'"field_{i:02d}":"'),
            F.sha2(F.concat_ws("-", n, F.lit(str(i)), F.lit(str(version))), 256),
            F.lit('"'),
        )
        for i in range(DOC_FIELDS)
    ]
    return F.concat(
        F.lit('{"n":'), n, F.lit(f',"version":{version},'), F.concat_ws(",", *fields), F.lit("}")
    )


def data_rows(frame: DataFrame, version: int, *, with_op: bool = False) -> DataFrame:
    """The mirror's columns for a frame of document numbers `n` (and `op` when `with_op`).

    Document `n` lives in vbucket `n % 1024` under key `doc-<n>`; a delete carries no body.
    """
    from pyspark.sql import functions as F

    n = F.col("n")
    deleted = F.col("op") == F.lit(DELETE) if with_op else F.lit(False)
    columns = [
        (n % NUM_VBUCKETS).cast("int").alias("vbucket"),
        F.lit("_default").alias("scope"),
        F.lit("_default").alias("collection"),
        F.lit(0).cast("long").alias("collection_id"),
        F.concat(F.lit("doc-"), n.cast("string")).alias("key"),
        (F.lit(version * 10_000_000) + F.floor(n / NUM_VBUCKETS) + 1).cast("long").alias("seqno"),
        F.lit(version + 1).cast("long").alias("rev_seqno"),
        (F.lit(1_700_000_000_000_000_000) + n * 16 + version).cast("long").alias("cas"),
        F.lit(33554438).cast("long").alias("flags"),
        F.lit(None).cast("timestamp").alias("expiry"),
        F.lit(True).alias("is_json"),
        F.when(deleted, F.lit(None).cast("string")).otherwise(_doc(version)).alias("doc"),
        F.lit(None).cast("binary").alias("value"),
        F.lit(None).cast("string").alias("xattrs"),
    ]
    if with_op:
        columns.append(F.col("op"))
    return frame.select(*columns)


def change_source(
    spark: SparkSession, *, docs: int, changes: int, batch: int, batches: int
) -> tuple[DataFrame, ChangeMix]:
    """Batch `batch` of `batches`: 80% updates, 10% inserts, 10% deletes, one row per key.

    The existing documents a batch touches are every `stride`-th one (an odd stride, so they
    cover all 1024 vbuckets), disjoint between batches: no batch touches a deleted document.
    The inserts are fresh numbers above `docs`.
    """
    from pyspark.sql import functions as F

    inserts = changes // 10
    existing = changes - inserts
    stride = docs // (existing * batches)
    if stride < 1:
        raise ValueError(
            f"{batches} batches of {changes} changes need {existing * batches} documents; "
            f"the table has {docs}"
        )
    if stride % 2 == 0:
        stride -= 1
    index = F.col("id")
    touched = spark.range(batch * existing, (batch + 1) * existing).select(
        (index * stride).alias("n"),
        F.when(index % 9 == 0, F.lit(DELETE)).otherwise(F.lit(UPSERT)).alias("op"),
    )
    first_new = docs + batch * inserts
    fresh = spark.range(first_new, first_new + inserts).select(
        index.alias("n"), F.lit(UPSERT).alias("op")
    )
    first = batch * existing
    deletes = len(range(first + (-first) % 9, first + existing, 9))
    source = data_rows(touched.unionByName(fresh), batch + 1, with_op=True)
    return source, ChangeMix(existing - deletes, inserts, deletes)


def rollback_source(
    spark: SparkSession, path: str, *, rows: int = 300, vbucket: int = ROLLBACK_VBUCKET
) -> tuple[DataFrame, ChangeMix]:
    """`rows` changes of one vbucket: half updates, a quarter deletes, the rest inserts.

    When the vbucket holds fewer documents than the updates and deletes need, the shortfall
    becomes inserts (the source keeps `rows` rows).
    """
    present = sorted(
        int(row["key"].removeprefix("doc-"))
        for row in spark.read.format("delta").load(path)
        .where(f"vbucket = {vbucket}").select("key").collect()
    )
    updates = present[: rows // 2]
    deletes = present[rows // 2 : rows // 2 + rows // 4]
    start = max(present, default=0) + NUM_VBUCKETS
    start += (vbucket - start) % NUM_VBUCKETS
    fresh = [start + NUM_VBUCKETS * i for i in range(rows - len(updates) - len(deletes))]
    numbered = (
        [(n, UPSERT) for n in updates] + [(n, DELETE) for n in deletes]
        + [(n, UPSERT) for n in fresh]
    )
    frame = spark.createDataFrame(numbered, "n long, op string")
    return data_rows(frame, 9, with_op=True), ChangeMix(len(updates), len(fresh), len(deletes))
