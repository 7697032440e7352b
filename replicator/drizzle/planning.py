"""A group of complete transactions, planned as one commit per table it touched (pure).

The mirror holds each source table's rows as of the last group; a group's net effect on a
table is a set of row entries keyed by primary key, in the table's definition at the group's
end:

- `Upsert`: the whole row is known (inserted in the group, or updated after that);
- `Patch`: the mirror's existing row with some columns changed (an UPDATE sends only the columns
  it set, so the rest stays as the mirror has it);
- `Move`: the mirror's row at another key, changed and stored under this key (an UPDATE of a
  primary key column of a row the group did not insert); the executor reads those few rows
  first and `resolve_moves` turns them into upserts;
- `Delete`.

TRUNCATE drops the mirror's old rows (`keep_base` False), ALTER TABLE changes the definition
(added columns take their default in existing rows: `fills`), DROP TABLE ends the table's plan
(`dropped_by`): a table dropped and created again in one group has two plans, in order.
Statements the mirror cannot follow (raw SQL, a rename, a column whose type changed) raise
`UnsupportedChange` naming the transaction: the driver commits the transactions before it
and stops, so nothing of that transaction is applied and nothing before it is lost.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from replicator.drizzle.changes import (
    AlterSchema,
    AlterTable,
    CompleteTransaction,
    CreateSchema,
    CreateTable,
    DeleteRows,
    DropSchema,
    DropTable,
    InsertRows,
    RawSql,
    SetVariable,
    TruncateTable,
    UpdateRows,
)
from replicator.drizzle.schema import TableDefinition, TableName, Value
from replicator.errors import ReplicatorError

Key = tuple[Value, ...]
"""A row's primary key values, in the definition's key order."""


class UnsupportedChange(ReplicatorError):
    """A transaction the mirror cannot apply; nothing of it is committed."""

    def __init__(self, transaction_id: int, message: str) -> None:
        super().__init__(f"transaction {transaction_id}: {message}")
        self.transaction_id = transaction_id
        self.detail = message


@dataclass(frozen=True, slots=True)
class Upsert:
    row: Mapping[str, Value]


@dataclass(frozen=True, slots=True)
class Patch:
    values: Mapping[str, Value]


@dataclass(frozen=True, slots=True)
class Move:
    source_key: Key
    values: Mapping[str, Value]


@dataclass(frozen=True, slots=True)
class Delete:
    pass


RowEntry = Upsert | Patch | Move | Delete
DELETE = Delete()


@dataclass(frozen=True, slots=True)
class TablePlan:
    """One table's commit for a group.

    `base_definition` is the table as the mirror holds it before the group (None: no table
    yet, or a plan after a DROP in the same group); `definition` is the table at the end of
    the plan. `transaction_ids` are the group's transactions that touched the table.
    """

    table: TableName
    definition: TableDefinition
    base_definition: TableDefinition | None
    entries: Mapping[Key, RowEntry]
    keep_base: bool
    fills: Mapping[str, Value]
    transaction_ids: tuple[int, ...]
    dropped_by: int | None = None
    truncated: bool = False

    @property
    def creates(self) -> bool:
        """The mirror has no table for this plan yet: the commit creates it."""
        return self.base_definition is None

    @property
    def schema_changed(self) -> bool:
        return self.base_definition is not None and self.base_definition != self.definition

    @property
    def moved_from(self) -> tuple[Key, ...]:
        """Keys of the mirror's rows that `Move` entries need read first."""
        return tuple(e.source_key for e in self.entries.values() if isinstance(e, Move))

    def counts(self) -> dict[str, int]:
        """Entries by kind: upsert, patch, move, delete."""
        totals = {"upsert": 0, "patch": 0, "move": 0, "delete": 0}
        for entry in self.entries.values():
            totals[type(entry).__name__.lower()] += 1
        return totals

    def resolve_moves(self, base_rows: Mapping[Key, Mapping[str, Value]]) -> TablePlan:
        """This plan with every Move an Upsert, from the mirror's rows at their source keys
        (rows as the base definition has them; fills and dropped columns applied here)."""
        if not self.moved_from:
            return self
        names = self.definition.column_names
        entries = dict(self.entries)
        for key, entry in self.entries.items():
            if not isinstance(entry, Move):
                continue
            base = base_rows.get(entry.source_key)
            if base is None:
                raise ReplicatorError(
                    f"table {self.table}: an UPDATE moved the row with primary key "
                    f"{entry.source_key} to {key}, but the mirror has no such row; the mirror "
                    "does not match its source (run `replicator verify`)"
                )
            merged = {**self.fills, **base, **entry.values}
            entries[key] = Upsert({name: merged.get(name) for name in names})
        return replace(self, entries=entries)


@dataclass
class _TableWork:
    table: TableName
    definition: TableDefinition
    base_definition: TableDefinition | None
    keep_base: bool
    entries: dict[Key, RowEntry] = field(default_factory=dict)
    fills: dict[str, Value] = field(default_factory=dict)
    transaction_ids: list[int] = field(default_factory=list)
    truncated: bool = False

    def touched_by(self, transaction_id: int) -> None:
        if not self.transaction_ids or self.transaction_ids[-1] != transaction_id:
            self.transaction_ids.append(transaction_id)

    def plan(self, dropped_by: int | None = None) -> TablePlan:
        return TablePlan(
            table=self.table,
            definition=self.definition,
            base_definition=self.base_definition,
            entries=dict(self.entries),
            keep_base=self.keep_base,
            fills=dict(self.fills),
            transaction_ids=tuple(self.transaction_ids),
            dropped_by=dropped_by,
            truncated=self.truncated,
        )


@dataclass(frozen=True, slots=True)
class GroupPlan:
    """The group's table plans, in the order they must be committed, and what it ends with."""

    tables: tuple[TablePlan, ...]
    transaction_ids: tuple[int, ...]
    definitions: Mapping[TableName, TableDefinition]
    """Every live table's definition after the group."""

    @property
    def row_changes(self) -> int:
        return sum(len(plan.entries) for plan in self.tables)


def plan_group(
    transactions: Sequence[CompleteTransaction],
    definitions: Mapping[TableName, TableDefinition],
) -> GroupPlan:
    """Plan `transactions` (in commit order) against the mirror's live tables `definitions`.

    >>> from replicator.drizzle.schema import ColumnSpec, ColumnType, Column
    >>> name = TableName("app", "t")
    >>> table = TableDefinition(name, (ColumnSpec("id", ColumnType.INTEGER),
    ...     ColumnSpec("v", ColumnType.VARCHAR)), ("id",))
    >>> id_, v = Column("id", ColumnType.INTEGER), Column("v", ColumnType.VARCHAR)
    >>> insert = InsertRows(name, (id_, v), ((1, "a"), (2, "b")))
    >>> update = UpdateRows(name, (id_,), (v,), ((1,),), (("A",),))
    >>> delete = DeleteRows(name, (id_,), ((2,), (3,)))
    >>> plans = plan_group([CompleteTransaction(7, 1, 0, 0, (insert, update, delete))],
    ...                    {name: table}).tables
    >>> {key: type(entry).__name__ for key, entry in plans[0].entries.items()}
    {(1,): 'Upsert', (2,): 'Delete', (3,): 'Delete'}
    """
    live: dict[TableName, TableDefinition] = dict(definitions)
    work: dict[TableName, _TableWork] = {}
    done: list[TablePlan] = []
    order: list[TableName] = []

    def table_work(name: TableName, transaction_id: int, what: str) -> _TableWork:
        current = work.get(name)
        if current is None:
            definition = live.get(name)
            if definition is None:
                raise UnsupportedChange(
                    transaction_id, f"{what} on table {name}, which the mirror does not have"
                )
            current = _TableWork(name, definition, definition, keep_base=True)
            work[name] = current
            order.append(name)
        current.touched_by(transaction_id)
        return current

    def drop(name: TableName, transaction_id: int) -> None:
        current = table_work(name, transaction_id, "DROP TABLE")
        done.append(current.plan(dropped_by=transaction_id))
        del work[name]
        order.remove(name)
        del live[name]

    for transaction in transactions:
        tid = transaction.transaction_id
        for change in transaction.changes:
            if isinstance(change, InsertRows):
                _insert(table_work(change.table, tid, "INSERT"), change, tid)
            elif isinstance(change, UpdateRows):
                _update(table_work(change.table, tid, "UPDATE"), change, tid)
            elif isinstance(change, DeleteRows):
                current = table_work(change.table, tid, "DELETE")
                for key in change.keys:
                    current.entries[tuple(key)] = DELETE
            elif isinstance(change, TruncateTable):
                current = table_work(change.table, tid, "TRUNCATE")
                current.entries.clear()
                current.fills.clear()
                current.keep_base = False
                current.truncated = True
            elif isinstance(change, CreateTable):
                name = change.definition.name
                if name in live:
                    raise UnsupportedChange(tid, f"CREATE TABLE {name}: the table exists")
                _check_types(change.definition, tid)
                # A table of this name dropped earlier in the group was retired by its own
                # plan: this one starts a new Delta table.
                current = _TableWork(name, change.definition, None, keep_base=False)
                current.touched_by(tid)
                work[name] = current
                order.append(name)
                live[name] = change.definition
            elif isinstance(change, AlterTable):
                current = table_work(change.before.name, tid, "ALTER TABLE")
                _alter(current, change, tid)
                live[change.after.name] = change.after
            elif isinstance(change, DropTable):
                if change.table not in live:
                    if change.if_exists:
                        continue
                    raise UnsupportedChange(
                        tid, f"DROP TABLE {change.table}: the mirror has no such table"
                    )
                drop(change.table, tid)
            elif isinstance(change, DropSchema):
                for name in sorted(t for t in live if t.schema == change.name):
                    drop(name, tid)
            elif isinstance(change, RawSql):
                raise UnsupportedChange(
                    tid,
                    f"a statement sent as SQL text only ({change.sql[:120]!r}): the message "
                    "does not say which rows it changed, so the mirror cannot follow it; "
                    "resynchronise the affected tables from a fresh copy",
                )
            elif isinstance(change, CreateSchema | AlterSchema | SetVariable):
                continue
            else:  # pragma: no cover - Change is a closed union
                raise TypeError(f"not a change: {type(change).__name__}")
    plans = [*done, *(work[name].plan() for name in order)]
    return GroupPlan(
        tables=tuple(plans),
        transaction_ids=tuple(t.transaction_id for t in transactions),
        definitions=live,
    )


def _check_types(definition: TableDefinition, transaction_id: int) -> None:
    for column in definition.columns:
        try:
            column.delta_type()
        except ValueError as error:
            raise UnsupportedChange(transaction_id, f"table {definition.name}: {error}") from None


def _key_of(definition: TableDefinition, row: Mapping[str, Value]) -> Key:
    return tuple(row[name] for name in definition.primary_key)


def _insert(work: _TableWork, change: InsertRows, transaction_id: int) -> None:
    definition = work.definition
    names = [column.name for column in change.columns]
    unknown = set(names) - set(definition.column_names)
    if unknown:
        raise UnsupportedChange(
            transaction_id, f"INSERT into {work.table}: no columns {sorted(unknown)} in the table"
        )
    if not definition.primary_key:
        raise UnsupportedChange(
            transaction_id,
            f"INSERT into {work.table}, a table without a primary key: the mirror keys rows by "
            "their primary key (Drizzle refuses such writes while replicating)",
        )
    for values in change.rows:
        given = dict(zip(names, values, strict=True))
        row = {
            column.name: given.get(column.name, column.default)
            for column in definition.columns
        }
        work.entries[_key_of(definition, row)] = Upsert(row)


def _update(work: _TableWork, change: UpdateRows, transaction_id: int) -> None:
    names = [column.name for column in change.set_columns]
    unknown = set(names) - set(work.definition.column_names)
    if unknown:
        raise UnsupportedChange(
            transaction_id, f"UPDATE of {work.table}: no columns {sorted(unknown)} in the table"
        )
    for index, (old_key, values) in enumerate(zip(change.keys, change.values, strict=True)):
        old_key = tuple(old_key)
        new_key = tuple(change.new_key(index))
        changed = dict(zip(names, values, strict=True))
        entry = work.entries.get(old_key)
        new_entry: RowEntry
        if isinstance(entry, Delete) or (entry is None and not work.keep_base):
            raise UnsupportedChange(
                transaction_id,
                f"UPDATE of {work.table}: no row with primary key {old_key} (deleted or "
                "truncated earlier); the messages are not from one consistent source",
            )
        if isinstance(entry, Upsert):
            new_entry = Upsert({**entry.row, **changed})
        elif isinstance(entry, Move):
            new_entry = Move(entry.source_key, {**entry.values, **changed})
        elif new_key == old_key:
            previous = entry.values if isinstance(entry, Patch) else {}
            new_entry = Patch({**previous, **changed})
        else:
            previous = entry.values if isinstance(entry, Patch) else {}
            new_entry = Move(old_key, {**previous, **changed})
        if new_key != old_key:
            work.entries[old_key] = DELETE
        work.entries[new_key] = new_entry


def _alter(work: _TableWork, change: AlterTable, transaction_id: int) -> None:
    before, after = change.before, change.after
    if after.name != before.name:
        raise UnsupportedChange(
            transaction_id,
            f"ALTER TABLE renames {before.name} to {after.name}: the mirror keeps one Delta "
            "table per name and does not follow renames; mirror the new name from a fresh copy",
        )
    if before.column_names != work.definition.column_names:
        raise UnsupportedChange(
            transaction_id,
            f"ALTER TABLE {before.name}: its 'before' columns {before.column_names} are not the "
            f"mirror's {work.definition.column_names}",
        )
    retyped = [
        name for name in change.retyped_columns
        if before.column(name).delta_type() != after.column(name).delta_type()
    ]
    if retyped:
        raise UnsupportedChange(
            transaction_id,
            f"ALTER TABLE {before.name} changes the type of {retyped}: Delta cannot change a "
            "column's type in place and the mirror does not guess a conversion; mirror the "
            "table again from a fresh copy",
        )
    if tuple(after.primary_key) != tuple(before.primary_key):
        raise UnsupportedChange(
            transaction_id,
            f"ALTER TABLE {before.name} changes the primary key from {before.primary_key} to "
            f"{after.primary_key}: the mirror keys its rows by it; mirror the table again",
        )
    _check_types(after, transaction_id)
    dropped = set(change.dropped_columns)
    added = [after.column(name) for name in change.added_columns]
    for key, entry in list(work.entries.items()):
        if isinstance(entry, Upsert):
            row = {k: v for k, v in entry.row.items() if k not in dropped}
            row.update({column.name: column.default for column in added})
            work.entries[key] = Upsert({name: row[name] for name in after.column_names})
        elif isinstance(entry, Patch | Move):
            values = {k: v for k, v in entry.values.items() if k not in dropped}
            work.entries[key] = (
                Patch(values) if isinstance(entry, Patch) else Move(entry.source_key, values)
            )
    for name in dropped:
        work.fills.pop(name, None)
    if work.keep_base:
        work.fills.update({column.name: column.default for column in added})
    work.definition = after
