"""One collection as a typed table, and the SQL examples of notebooks/README.md.

The mirror here is written directly (a replicator mirror's data table holding known rows, and a
second version without one order): the view reads only data columns, so no producer is needed.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from replicator.delta.checkpoints import CheckpointsTable
from replicator.delta.commit_metadata import CommitMetadata
from replicator.delta.schema import DATA_SCHEMA, MirrorConfig
from replicator.delta.table import CommitRecord, open_or_create
from replicator.errors import ConfigError
from replicator.inspect.collections import (
    EmptyCollectionError,
    collection_frame,
    collection_names,
    register_collection_views,
    view_name,
)
from replicator.model.positions import VbucketPosition

pytestmark = pytest.mark.spark

README = Path(__file__).resolve().parents[2] / "notebooks" / "README.md"
README_MIRROR = "demo-output/mirror"
"""The path the README's SQL examples use; the test points them at its own mirror."""

ORDERS = {
    "order::1": {"type": "order", "id": 1, "user": "user::1", "status": "paid", "total": 12.5},
    "order::2": {"type": "order", "id": 2, "user": "user::2", "status": "paid", "total": 7.5},
    "order::3": {"type": "order", "id": 3, "user": "user::1", "status": "new", "total": 3,
                 "coupon": "SPRING"},
}
USERS = {
    "user::1": {"type": "user", "id": 1, "name": "Ada", "city": "Oslo",
                "address": {"street": "Main", "zip": "0150"}},
    "user::2": {"type": "user", "id": 2, "name": "Bo", "city": "Lyon",
                "address": {"street": "Rue", "zip": "69001"}},
}
PRODUCTS = {
    "product::1": {"type": "product", "sku": "SKU-1", "price": 9.99, "tags": ["eco", "sale"]},
}
COLLECTION_IDS = {"app.orders": 9, "app.users": 8, "catalog.products": 10, "_default._default": 0}


def data_row(vbucket: int, collection: str, key: str, seqno: int, doc: Any) -> tuple[Any, ...]:
    scope, name = collection.split(".")
    if isinstance(doc, bytes):
        return (vbucket, scope, name, COLLECTION_IDS[collection], key, seqno, 1, seqno * 7, 0,
                None, False, None, doc, None)
    return (vbucket, scope, name, COLLECTION_IDS[collection], key, seqno, 1, seqno * 7, 0,
            None, True, json.dumps(doc), None, None)


@pytest.fixture(scope="module")
def mirror(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Version 1: every document below; version 2: order::2 deleted."""
    target = str(tmp_path_factory.mktemp("collections") / "mirror")
    mirror_table = open_or_create(spark, target, MirrorConfig("shop"))
    rows = [
        *(data_row(1, "app.orders", k, 10 + i, d) for i, (k, d) in enumerate(ORDERS.items())),
        *(data_row(2, "app.users", k, 20 + i, d) for i, (k, d) in enumerate(USERS.items())),
        *(data_row(3, "catalog.products", k, 30, d) for k, d in PRODUCTS.items()),
        data_row(3, "app.orders", "order::blob", 31, b"\x00\x01binary"),
        data_row(0, "_default._default", "event::1", 40, {"type": "event", "kind": "view"}),
    ]
    spark.createDataFrame(rows, DATA_SCHEMA).write.format("delta").mode("append").save(target)
    spark.sql(f"DELETE FROM delta.`{target}` WHERE key = 'order::2'")
    positions = {vb: VbucketPosition.at_boundary(vb, 7, 40) for vb in range(4)}
    CheckpointsTable.of(mirror_table).record([
        CommitRecord(1, datetime.now(UTC),
                     CommitMetadata("commit", 1, 0, "vb0-3", "append", positions))
    ])  # fmt: skip
    return target


def test_inferred_schema_makes_every_json_field_a_column(spark: Any, mirror: str) -> None:
    orders = collection_frame(spark, mirror, "app.orders")

    assert orders.columns == ["_key", "_vbucket", "_seqno", "_cas", "_expiry",
                              "coupon", "id", "status", "total", "type", "user"]
    rows = {row["_key"]: row.asDict() for row in orders.collect()}
    assert set(rows) == {"order::1", "order::3"}  # order::2 deleted, the binary one skipped
    assert rows["order::1"]["total"] == 12.5 and rows["order::1"]["_seqno"] == 10
    assert rows["order::1"]["coupon"] is None and rows["order::3"]["coupon"] == "SPRING"


def test_nested_objects_and_arrays_stay_structured(spark: Any, mirror: str) -> None:
    users = collection_frame(spark, mirror, "app.users")
    products = collection_frame(spark, mirror, "catalog.products")

    assert {r["address"]["zip"] for r in users.collect()} == {"0150", "69001"}
    assert [r["tags"] for r in products.collect()] == [["eco", "sale"]]


def test_a_given_ddl_schema_picks_and_types_the_columns(spark: Any, mirror: str) -> None:
    orders = collection_frame(spark, mirror, "app.orders", "id INT, status STRING, total INT")

    assert orders.columns == ["_key", "_vbucket", "_seqno", "_cas", "_expiry", "id", "status",
                              "total"]
    assert dict(orders.dtypes)["id"] == "int"
    # 12.5 does not parse as INT: null, not an error.
    assert {(r["id"], r["total"]) for r in orders.collect()} == {(1, None), (3, 3)}


def test_time_travel_reads_the_collection_at_an_older_version(spark: Any, mirror: str) -> None:
    then = collection_frame(spark, mirror, "app.orders", version=1)

    assert {r["_key"] for r in then.collect()} == {"order::1", "order::2", "order::3"}


def test_bad_input_is_named(spark: Any, mirror: str) -> None:
    with pytest.raises(ConfigError, match=r"scope\.collection"):
        collection_frame(spark, mirror, "orders")
    with pytest.raises(ConfigError, match="invalid schema"):
        collection_frame(spark, mirror, "app.orders", "id INTEGRAL")
    with pytest.raises(ConfigError, match="not a list of fields"):
        collection_frame(spark, mirror, "app.orders", "INT")
    with pytest.raises(EmptyCollectionError, match=r"app\.orders, app\.users"):
        collection_frame(spark, mirror, "app.missing")
    with pytest.raises(EmptyCollectionError, match="at version 1 "):
        collection_frame(spark, mirror, "app.missing", version=1)
    assert collection_frame(spark, mirror, "app.missing", "id INT").count() == 0
    with pytest.raises(ConfigError, match="metadata_prefix"):
        collection_frame(spark, mirror, "app.orders", "_key STRING, id INT")
    renamed = collection_frame(spark, mirror, "app.orders", "_key STRING", metadata_prefix="m_")
    assert "m_key" in renamed.columns


def test_views_are_registered_per_collection(spark: Any, mirror: str) -> None:
    views = register_collection_views(spark, mirror, schemas={"app.users": "name STRING"})

    assert collection_names(spark, mirror) == [
        "_default._default", "app.orders", "app.users", "catalog.products"
    ]
    assert views == {c: view_name(c) for c in collection_names(spark, mirror)}
    assert view_name("_default._default") == "_default__default"
    assert spark.sql("SELECT * FROM app_users").columns[-1] == "name"
    paid = spark.sql("SELECT count(*) AS n FROM app_orders WHERE status = 'paid'").first()
    assert paid is not None and paid["n"] == 1


def readme_sql() -> list[str]:
    text = README.read_text()
    blocks = re.findall(r"```sql\n(.*?)```", text, flags=re.DOTALL)
    statements = [s.strip() for block in blocks for s in block.split(";")]
    return [s for s in statements if s and not all(
        line.strip().startswith("--") for line in s.splitlines())]


def test_readme_sql_examples_run(spark: Any, mirror: str) -> None:
    statements = readme_sql()
    assert len(statements) >= 5, "notebooks/README.md lost its SQL examples"
    register_collection_views(spark, mirror)
    spark.read.format("delta").load(mirror).createOrReplaceTempView("mirror")

    # Each example must run (analysis and execution) against a real mirror.
    results = [spark.sql(s.replace(README_MIRROR, mirror)).collect() for s in statements]

    assert all(results), "a README example came back empty on a mirror that has data for it"
