"""The change rows of a REPLACE, planned on the driver (pure, no Spark)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from replicator.planning.replacement import DATA_FIELDS, METADATA_COLUMNS, replacement_rows
from replicator.staging.rows import CHANGE_SCHEMA, DELETE, UPSERT

DATA_SCHEMA = pa.schema(DATA_FIELDS)


def row(vbucket: int, key: str, seqno: int, *, cas: int = 0, collection_id: int = 0,
        body: str | None = None) -> dict[str, Any]:  # fmt: skip
    return {
        "vbucket": vbucket, "scope": "_default", "collection": "_default",
        "collection_id": collection_id, "key": key, "seqno": seqno, "rev_seqno": 1,
        "cas": cas or seqno * 10, "flags": 7, "expiry": datetime(2030, 1, 1, tzinfo=UTC),
        "is_json": True, "doc": body or f'"{key}{seqno}"', "value": None, "xattrs": None,
    }  # fmt: skip


def table(*rows: dict[str, Any]) -> pa.Table:
    return pa.Table.from_pylist(list(rows), schema=DATA_SCHEMA)


def changes_of(stored: pa.Table, wanted: pa.Table) -> list[tuple[str, int, int, str, int]]:
    changes = replacement_rows(stored.select(list(METADATA_COLUMNS)), wanted)
    assert changes.schema == CHANGE_SCHEMA
    return sorted(
        (r["op"], r["vbucket"], r["collection_id"], r["key"], r["seqno"])
        for r in changes.to_pylist()
    )


def test_only_the_documents_that_differ_become_changes() -> None:
    stored = table(row(3, "same", 1), row(3, "newer", 5), row(3, "gone", 6), row(3, "recas", 2))
    wanted = table(
        row(3, "same", 1), row(3, "newer", 2), row(3, "back", 3), row(3, "recas", 2, cas=99)
    )

    assert changes_of(stored, wanted) == [
        (DELETE, 3, 0, "gone", 6),
        (UPSERT, 3, 0, "back", 3),
        (UPSERT, 3, 0, "newer", 2),
        (UPSERT, 3, 0, "recas", 2),
    ]


def test_a_document_is_its_vbucket_collection_and_key() -> None:
    # The same key in another collection or vbucket is another document.
    stored = table(row(3, "k", 1), row(4, "k", 1), row(3, "k", 1, collection_id=8))
    wanted = table(row(3, "k", 1), row(5, "k", 1), row(3, "k", 2, collection_id=9))

    assert changes_of(stored, wanted) == [
        (DELETE, 3, 8, "k", 1),
        (DELETE, 4, 0, "k", 1),
        (UPSERT, 3, 9, "k", 2),
        (UPSERT, 5, 0, "k", 1),
    ]


def test_upserts_carry_whole_rows_and_deletes_their_stored_metadata() -> None:
    old = row(3, "a", 2, body='{"v": "old"}')
    stored = table(row(3, "a", 4), row(3, "b", 9))
    changes = replacement_rows(stored.select(list(METADATA_COLUMNS)), table(old))

    by_key = {r["key"]: r for r in changes.to_pylist()}
    assert by_key["a"] == {**old, "op": UPSERT}
    assert by_key["b"] == {**row(3, "b", 9), "op": DELETE, "doc": None}


def test_nothing_differs_nothing_changes() -> None:
    rows = table(row(3, "a", 1), row(3, "b", 2))
    assert changes_of(rows, rows) == []
    assert changes_of(table(), table()) == []
