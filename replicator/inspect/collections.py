"""One collection of the mirror as a plain table: its JSON fields as columns.

The mirror keeps each document as JSON text in the `doc` column, which every engine can read.
This module turns one collection into a typed table for analysts: the schema comes from a sample
of the documents (or from a DDL string you give, which is faster and stable), and the mirror's
own facts about each document (key, seqno, ...) come along as `_`-prefixed columns.

>>> orders = collection_frame(spark, "/data/mirror", "app.orders")  # doctest: +SKIP
>>> orders.groupBy("status").count().show()  # doctest: +SKIP
>>> register_collection_views(spark, "/data/mirror")  # doctest: +SKIP
{'app.orders': 'app_orders', 'app.users': 'app_users', ...}
>>> spark.sql("SELECT status, count(*) FROM app_orders GROUP BY status").show()  # doctest: +SKIP
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

from replicator.errors import ConfigError
from replicator.inspect.documents import split_collection
from replicator.inspect.mirror_history import MirrorHistory

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

DEFAULT_SAMPLE_SIZE = 1000
"""Documents read to infer a collection's schema when none is given."""

METADATA_COLUMNS: tuple[str, ...] = ("key", "vbucket", "seqno", "cas", "expiry")
"""Mirror columns kept beside the document fields (with the metadata prefix)."""

_DOCUMENT = "__document"


class EmptyCollectionError(ConfigError):
    """No JSON document of the collection to infer a schema from."""


def collection_names(
    spark: SparkSession, target: str, *, version: int | None = None
) -> list[str]:
    """The `scope.collection` names with documents in the mirror (at `version`), sorted.

    >>> collection_names(spark, "/data/mirror")  # doctest: +SKIP
    ['_default._default', 'app.orders', 'app.users', 'catalog.products']
    """
    rows = _documents(spark, target, version).select("scope", "collection").distinct().collect()
    return sorted(f"{row['scope']}.{row['collection']}" for row in rows)


def collection_frame(
    spark: SparkSession,
    target: str,
    collection: str,
    schema: str | StructType | None = None,
    *,
    version: int | None = None,
    sample_size: int = DEFAULT_SAMPLE_SIZE,
    metadata_prefix: str = "_",
) -> DataFrame:
    """The JSON documents of one collection (`scope.collection`) as a table.

    Columns: `_key`, `_vbucket`, `_seqno`, `_cas`, `_expiry` (with `metadata_prefix`), then
    one per top-level field of the documents. `schema` is a DDL string (`"id INT, status
    STRING, total DOUBLE"`) or a StructType; without it the schema is inferred from up to
    `sample_size` documents, so fields only rarer documents have may be missing. Binary
    (non-JSON) documents are left out; a field that does not parse as its type is null.
    `version` reads an older table version (time travel).

    >>> orders = collection_frame(spark, "/data/mirror", "app.orders",  # doctest: +SKIP
    ...                           schema="id INT, status STRING, total DOUBLE")
    >>> orders.where("status = 'paid'").agg({"total": "sum"}).show()  # doctest: +SKIP
    """
    from pyspark.sql import functions as F

    scope, name = split_collection(collection)
    if sample_size < 1:
        raise ConfigError(f"sample_size must be at least 1, got {sample_size}")
    documents = _documents(spark, target, version).where(
        (F.col("scope") == scope) & (F.col("collection") == name) & F.col("is_json")
        & F.col("doc").isNotNull()
    )
    if schema is None:
        document_schema = _infer_schema(spark, documents, collection, target, sample_size,
                                        version)
    else:
        document_schema = _parse_schema(schema)
    metadata = {f"{metadata_prefix}{column}": column for column in METADATA_COLUMNS}
    clashes = sorted(set(metadata) & set(document_schema.fieldNames()))
    if clashes:
        raise ConfigError(
            f"fields {clashes} of {collection} clash with the mirror's metadata columns; pass "
            "another metadata_prefix"
        )
    parsed = documents.select(
        *(F.col(column).alias(alias) for alias, column in metadata.items()),
        F.from_json("doc", document_schema).alias(_DOCUMENT),
    )
    return parsed.select(*metadata, f"{_DOCUMENT}.*")


def register_collection_views(
    spark: SparkSession,
    target: str,
    *,
    schemas: Mapping[str, str | StructType] | None = None,
    version: int | None = None,
    sample_size: int = DEFAULT_SAMPLE_SIZE,
) -> dict[str, str]:
    """Register a temporary view per collection (`app.orders` -> `app_orders`).

    Returns collection -> view name. `schemas` gives DDL strings per collection; the others are
    inferred. Collections without JSON documents get no view.

    >>> views = register_collection_views(spark, "/data/mirror")  # doctest: +SKIP
    >>> spark.sql(f"SELECT count(*) FROM {views['app.orders']}").show()  # doctest: +SKIP
    """
    given = dict(schemas or {})
    for collection in given:
        split_collection(collection)
    views: dict[str, str] = {}
    for collection in sorted(set(collection_names(spark, target, version=version)) | set(given)):
        try:
            frame = collection_frame(
                spark, target, collection, given.get(collection), version=version,
                sample_size=sample_size,
            )
        except EmptyCollectionError:
            continue
        view = view_name(collection)
        frame.createOrReplaceTempView(view)
        views[collection] = view
    return views


def view_name(collection: str) -> str:
    """The temporary view name of a collection: `app.orders` -> `app_orders`."""
    scope, name = split_collection(collection)
    return re.sub(r"[^0-9A-Za-z_]", "_", f"{scope}_{name}")


def _documents(spark: SparkSession, target: str, version: int | None) -> DataFrame:
    if version is None:
        from replicator.delta.schema import DATA_COLUMNS
        from replicator.inspect.mirror import open_mirror

        return open_mirror(spark, target).read().select(*DATA_COLUMNS)
    return MirrorHistory.read(spark, target).snapshot(version)


def _infer_schema(
    spark: SparkSession,
    documents: DataFrame,
    collection: str,
    target: str,
    sample_size: int,
    version: int | None,
) -> StructType:
    sample = documents.select("doc").limit(sample_size)
    # Spark's JSON reader infers one schema over all sampled documents (merging their fields).
    inferred = spark.read.json(sample.rdd.map(lambda row: row[0])).schema
    if not inferred.fields or inferred.fieldNames() == ["_corrupt_record"]:
        present = collection_names(spark, target, version=version)
        at = f" at version {version}" if version is not None else ""
        raise EmptyCollectionError(
            f"no JSON documents of {collection} in {target}{at} to infer its schema from "
            f"(collections with documents: {', '.join(present) or 'none'}); pass schema= "
            "to read it anyway"
        )
    return inferred


def _parse_schema(schema: str | StructType) -> StructType:
    from pyspark.sql.types import DataType, StructType

    from replicator.delta.table import engine_error_summary

    if isinstance(schema, StructType):
        return schema
    try:
        parsed = DataType.fromDDL(schema)
    except Exception as exc:
        raise ConfigError(
            f"invalid schema {schema!r}: {engine_error_summary(exc)}; use Spark DDL such as "
            "'id INT, status STRING, total DOUBLE'"
        ) from None
    if not isinstance(parsed, StructType):
        raise ConfigError(
            f"schema {schema!r} is a single {parsed.simpleString()}, not a list of fields; use "
            "Spark DDL such as 'id INT, status STRING, total DOUBLE'"
        )
    return parsed


__all__ = [
    "DEFAULT_SAMPLE_SIZE",
    "METADATA_COLUMNS",
    "EmptyCollectionError",
    "collection_frame",
    "collection_names",
    "register_collection_views",
    "view_name",
]
