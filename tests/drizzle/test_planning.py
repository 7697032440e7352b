"""Group planning, without Spark: plans applied to an in-memory mirror equal the producer."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from replicator.drizzle.assembly import TransactionAssembler, TransactionCompleted
from replicator.drizzle.changes import (
    AlterTable,
    CompleteTransaction,
    DeleteRows,
    InsertRows,
    RawSql,
    TruncateTable,
    UpdateRows,
)
from replicator.drizzle.planning import (
    Delete,
    Key,
    Move,
    Patch,
    TablePlan,
    UnsupportedChange,
    Upsert,
    plan_group,
)
from replicator.drizzle.schema import (
    Column,
    ColumnSpec,
    ColumnType,
    TableDefinition,
    TableName,
    Value,
)
from replicator.drizzle.workload import Workload, WorkloadSettings
from tests.drizzle.messages import ITEMS

Rows = dict[Key, dict[str, Value]]
ID = Column("id", ColumnType.INTEGER)
NAME = Column("name", ColumnType.VARCHAR)
QTY = Column("qty", ColumnType.BIGINT)


class MirrorModel:
    """What the Delta side does with plans, on dicts: the reference the planner is held to."""

    def __init__(self) -> None:
        self.tables: dict[TableName, Rows] = {}
        self.definitions: dict[TableName, TableDefinition] = {}
        self.retired: list[tuple[TableName, int]] = []

    def apply(self, plan: TablePlan) -> None:
        if plan.creates:
            base: Rows = {}
        elif not plan.keep_base:
            base = {}
        else:
            names = plan.definition.column_names
            base = {
                key: {n: row[n] if n in row else plan.fills.get(n) for n in names}
                for key, row in self.tables[plan.table].items()
            }
        old_rows = self.tables.get(plan.table, {})
        plan = plan.resolve_moves({key: old_rows[key] for key in plan.moved_from})
        for key, entry in plan.entries.items():
            if isinstance(entry, Delete):
                base.pop(key, None)
            elif isinstance(entry, Upsert):
                base[key] = dict(entry.row)
            elif isinstance(entry, Patch):
                base[key] = {**base[key], **entry.values}
            else:
                raise AssertionError(f"unresolved {entry}")
        if plan.dropped_by is not None:
            self.tables.pop(plan.table, None)
            self.definitions.pop(plan.table, None)
            self.retired.append((plan.table, plan.dropped_by))
        else:
            self.tables[plan.table] = base
            self.definitions[plan.table] = plan.definition


def complete_transactions(workload: Workload, count: int) -> list[CompleteTransaction]:
    assembler = TransactionAssembler()
    done = []
    for message in workload.messages(count):
        result = assembler.feed(message)
        if isinstance(result, TransactionCompleted):
            done.append(result.transaction)
    return done


def groups(
    transactions: list[CompleteTransaction], rng: random.Random
) -> Iterator[list[CompleteTransaction]]:
    index = 0
    while index < len(transactions):
        size = rng.choice((1, 2, 5, 17, 60))
        yield transactions[index:index + size]
        index += size


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_plans_applied_in_any_grouping_equal_the_producer(seed: int) -> None:
    workload = Workload(WorkloadSettings(seed=seed, bulk_rows=40))
    transactions = complete_transactions(workload, 400)
    model = MirrorModel()
    for group in groups(transactions, random.Random(seed)):
        plan = plan_group(group, model.definitions)
        for table_plan in plan.tables:
            model.apply(table_plan)
        assert model.definitions == dict(plan.definitions)
    expected = {
        name: {state.key_of(row): row for row in state.rows.values()}
        for name, state in workload.database.tables.items()
    }
    assert model.tables == expected
    assert [(r.definition.name, r.transaction_id) for r in workload.database.retired] == [
        (name, tid) for name, tid in model.retired
    ]


def _transaction(tid: int, *changes: object) -> CompleteTransaction:
    return CompleteTransaction(tid, 1, 0, 0, tuple(changes))  # type: ignore[arg-type]


def test_insert_then_update_is_one_upsert_and_an_update_of_an_old_row_a_patch() -> None:
    plan = plan_group(
        [
            _transaction(1, InsertRows(ITEMS.name, (ID, NAME, QTY), ((1, "a", 1),))),
            _transaction(2, UpdateRows(ITEMS.name, (ID,), (QTY,), ((1,), (9,)), ((5,), (6,)))),
        ],
        {ITEMS.name: ITEMS},
    ).tables[0]
    assert plan.entries == {
        (1,): Upsert({"id": 1, "name": "a", "qty": 5}),
        (9,): Patch({"qty": 6}),
    }
    assert plan.transaction_ids == (1, 2)
    assert plan.keep_base and not plan.creates and not plan.schema_changed


def test_a_primary_key_update_of_an_old_row_is_a_move_resolved_from_the_mirror() -> None:
    plan = plan_group(
        [
            _transaction(3, UpdateRows(ITEMS.name, (ID,), (NAME,), ((4,),), (("x",),))),
            _transaction(4, UpdateRows(ITEMS.name, (ID,), (ID, QTY), ((4,),), ((40, 2),))),
        ],
        {ITEMS.name: ITEMS},
    ).tables[0]
    assert plan.entries == {(4,): Delete(), (40,): Move((4,), {"name": "x", "id": 40, "qty": 2})}
    assert plan.moved_from == ((4,),)
    resolved = plan.resolve_moves({(4,): {"id": 4, "name": "old", "qty": 0}})
    assert resolved.entries[(40,)] == Upsert({"id": 40, "name": "x", "qty": 2})


def test_truncate_drops_the_base_and_what_came_before_it() -> None:
    plan = plan_group(
        [
            _transaction(5, DeleteRows(ITEMS.name, (ID,), ((1,),))),
            _transaction(6, TruncateTable(ITEMS.name)),
            _transaction(7, InsertRows(ITEMS.name, (ID, NAME, QTY), ((2, "b", 0),))),
        ],
        {ITEMS.name: ITEMS},
    ).tables[0]
    assert not plan.keep_base and plan.truncated
    assert plan.entries == {(2,): Upsert({"id": 2, "name": "b", "qty": 0})}


def test_an_added_column_fills_old_rows_with_its_default_and_new_ones_in_the_group() -> None:
    wider = ITEMS.with_columns(
        [*ITEMS.columns, ColumnSpec("extra", ColumnType.BIGINT, has_default=True, default=42)]
    )
    plan = plan_group(
        [
            _transaction(8, InsertRows(ITEMS.name, (ID, NAME, QTY), ((3, "c", 1),))),
            _transaction(9, AlterTable(ITEMS, wider)),
        ],
        {ITEMS.name: ITEMS},
    ).tables[0]
    assert plan.schema_changed and plan.fills == {"extra": 42}
    assert plan.entries == {(3,): Upsert({"id": 3, "name": "c", "qty": 1, "extra": 42})}


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (RawSql("ALTER TABLE shop.items ENGINE=x", "shop"), "SQL text only"),
        (
            AlterTable(
                ITEMS, TableDefinition(TableName("shop", "renamed"), ITEMS.columns, ("id",))
            ),
            "does not follow renames",
        ),
        (
            AlterTable(ITEMS, ITEMS.with_columns(
                [ITEMS.columns[0], ColumnSpec("name", ColumnType.BIGINT), ITEMS.columns[2]]
            )),
            "changes the type of ['name']",
        ),
        (InsertRows(TableName("shop", "nope"), (ID,), ((1,),)), "does not have"),
    ],
)
def test_what_the_mirror_cannot_follow_is_an_error_naming_the_transaction(
    change: object, words: str
) -> None:
    with pytest.raises(UnsupportedChange) as caught:
        plan_group([_transaction(11, change)], {ITEMS.name: ITEMS})
    assert caught.value.transaction_id == 11
    assert str(caught.value).startswith("transaction 11: ")
    assert words in str(caught.value)


def test_a_table_dropped_and_created_again_in_one_group_has_two_plans_in_order() -> None:
    from replicator.drizzle.changes import CreateTable, DropTable

    plans = plan_group(
        [
            _transaction(20, InsertRows(ITEMS.name, (ID, NAME, QTY), ((1, "a", 0),))),
            _transaction(21, DropTable(ITEMS.name)),
            _transaction(22, CreateTable(ITEMS)),
        ],
        {ITEMS.name: ITEMS},
    ).tables
    assert [(p.table, p.dropped_by, p.creates) for p in plans] == [
        (ITEMS.name, 21, False),
        (ITEMS.name, None, True),
    ]
    assert plans[0].entries == {(1,): Upsert({"id": 1, "name": "a", "qty": 0})}
    assert plans[1].entries == {}
