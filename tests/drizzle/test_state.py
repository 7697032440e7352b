"""The source database model: statements, whole transactions, comparison."""

from __future__ import annotations

import pytest

from replicator.drizzle.changes import (
    AlterTable,
    CompleteTransaction,
    DeleteRows,
    DropTable,
    InsertRows,
    RawSql,
    TruncateTable,
    UpdateRows,
)
from replicator.drizzle.schema import Column, ColumnSpec, ColumnType
from replicator.drizzle.state import SourceDatabase, StateError
from tests.drizzle.messages import ITEMS

ID = (Column("id", ColumnType.INTEGER),)
ALL = tuple(spec.column for spec in ITEMS.columns)


def database_with_items(*ids: int) -> SourceDatabase:
    database = SourceDatabase()
    database.create_schema("shop")
    database.create_table(ITEMS)
    for number in ids:
        database.insert(ITEMS.name, {"id": number, "name": f"n{number}", "qty": number})
    return database


def transaction(transaction_id: int, *changes: object) -> CompleteTransaction:
    return CompleteTransaction(transaction_id, 1, 0, 0, changes)  # type: ignore[arg-type]


def test_a_transaction_applies_whole_or_not_at_all() -> None:
    database = database_with_items(1, 2)
    before = database.snapshot()
    bad = transaction(
        9,
        InsertRows(ITEMS.name, ALL, ((3, "n3", 3),)),
        DeleteRows(ITEMS.name, ID, ((2,),)),
        InsertRows(ITEMS.name, ALL, ((1, "again", 0),)),  # duplicate key: the source refuses
    )
    with pytest.raises(StateError, match=r"transaction 9: INSERT into shop\.items: primary key"):
        database.apply(bad)
    assert database.snapshot() == before
    assert database.last_transaction_id is None
    good = transaction(10, *bad.changes[:2])
    database.apply(good)
    assert [row["id"] for row in database.table_rows(ITEMS.name)] == [1, 3]
    assert database.last_transaction_id == 10


def test_updates_find_rows_by_old_key_and_may_move_them() -> None:
    database = database_with_items(1, 2)
    database.apply(
        transaction(
            3,
            UpdateRows(
                ITEMS.name,
                ID,
                (Column("id", ColumnType.INTEGER), Column("name", ColumnType.VARCHAR)),
                ((1,),),
                ((7, None),),
            ),
        )
    )
    assert database.table_rows(ITEMS.name) == [
        {"id": 2, "name": "n2", "qty": 2},
        {"id": 7, "name": None, "qty": 1},
    ]
    with pytest.raises(StateError, match=r"no row with primary key \(1,\)"):
        database.update(ITEMS.name, (1,), {"qty": 0})
    with pytest.raises(StateError, match=r"new primary key \(2,\) already exists"):
        database.update(ITEMS.name, (7,), {"id": 2})


def test_added_columns_take_their_default_in_existing_rows() -> None:
    database = database_with_items(1)
    after = ITEMS.with_columns(
        [
            *ITEMS.columns,
            ColumnSpec("level", ColumnType.BIGINT, has_default=True, default=42),
            ColumnSpec("tag", ColumnType.VARCHAR),
        ]
    )
    database.apply(transaction(2, AlterTable(ITEMS, after)))
    assert database.table_rows(ITEMS.name) == [
        {"id": 1, "name": "n1", "qty": 1, "level": 42, "tag": None}
    ]
    assert database.definition(ITEMS.name) == after


def test_truncate_drop_and_retire() -> None:
    database = database_with_items(1, 2, 3)
    database.apply(transaction(2, TruncateTable(ITEMS.name)))
    assert database.table_rows(ITEMS.name) == []
    database.insert(ITEMS.name, {"id": 5, "name": None, "qty": 0})
    database.apply(transaction(3, DropTable(ITEMS.name)))
    assert ITEMS.name not in database.tables
    assert [(r.definition, r.row_count, r.transaction_id) for r in database.retired] == [
        (ITEMS, 1, 3)
    ]
    database.apply(transaction(4, DropTable(ITEMS.name, if_exists=True)))
    with pytest.raises(StateError, match=r"table shop\.items does not exist"):
        database.apply(transaction(5, DropTable(ITEMS.name)))


def test_raw_sql_cannot_be_modelled() -> None:
    with pytest.raises(StateError, match="raw SQL 'RENAME TABLE a TO b'"):
        database_with_items().apply(transaction(2, RawSql("RENAME TABLE a TO b", "shop")))


def test_differences_name_table_and_key() -> None:
    left, right = database_with_items(1, 2), database_with_items(1, 2)
    assert left.differences(right) == []
    right.update(ITEMS.name, (2,), {"qty": 99})
    (difference,) = left.differences(right)
    assert difference.startswith("shop.items key (2,): {'id': 2, 'name': 'n2', 'qty': 2} != ")
    right.drop_table(ITEMS.name)
    assert left.differences(right) == ["shop.items: only in this database"]


def test_begin_and_rollback_undo_statements() -> None:
    database = database_with_items(1)
    before = database.snapshot()
    database.begin()
    database.insert(ITEMS.name, {"id": 2, "name": None, "qty": 0})
    database.delete(ITEMS.name, (1,))
    database.rollback()
    assert database.snapshot() == before
