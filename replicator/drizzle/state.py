"""An in-memory model of a Drizzle database: schemas, tables with primary keys, and rows.

The embedded producer keeps its own state in one (applying what it decides to do, never what
it encoded), and `apply` replays complete transactions into another, so tests and `verify` can
compare a mirror with the producer's state table by table. It enforces what the source would:
a primary key is unique, an update or delete finds its row, a table exists before it is
written. A transaction applies whole or not at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

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


class StateError(ReplicatorError):
    """A change the database cannot take (a duplicate key, a missing row or table, ...)."""


@dataclass(slots=True)
class TableState:
    """One table: its definition and its rows by primary key (values by column name)."""

    definition: TableDefinition
    rows: dict[Key, dict[str, Value]] = field(default_factory=dict)

    def key_of(self, row: Mapping[str, Value]) -> Key:
        return tuple(row[name] for name in self.definition.primary_key)

    def copy(self) -> TableState:
        return TableState(self.definition, {key: dict(row) for key, row in self.rows.items()})


@dataclass(frozen=True, slots=True)
class RetiredTable:
    """A dropped table, as it was when dropped (the mirror keeps its Delta table)."""

    definition: TableDefinition
    row_count: int
    transaction_id: int | None


class SourceDatabase:
    """Schemas and tables of one Drizzle server, changed a statement at a time or by `apply`.

    >>> from replicator.drizzle.schema import ColumnSpec, ColumnType
    >>> db = SourceDatabase()
    >>> db.create_schema("shop")
    >>> item = TableDefinition(
    ...     TableName("shop", "item"), (ColumnSpec("id", ColumnType.INTEGER),), ("id",)
    ... )
    >>> db.create_table(item)
    >>> db.insert(item.name, {"id": 1})
    >>> db.table_rows(item.name)
    [{'id': 1}]
    """

    def __init__(self) -> None:
        self.schemas: set[str] = set()
        self.tables: dict[TableName, TableState] = {}
        self.retired: list[RetiredTable] = []
        self.last_transaction_id: int | None = None
        self.variables: dict[str, bytes] = {}
        # While `apply` runs: each table as it was before the transaction first touched it
        # (None: it did not exist), so that a failed transaction is undone in O(its tables).
        self._undo: dict[TableName, TableState | None] | None = None
        self._saved: tuple[set[str], list[RetiredTable], dict[str, bytes]] = (set(), [], {})

    def _touch(self, name: TableName) -> None:
        if self._undo is not None and name not in self._undo:
            state = self.tables.get(name)
            self._undo[name] = None if state is None else state.copy()

    def table(self, name: TableName) -> TableState:
        try:
            return self.tables[name]
        except KeyError:
            raise StateError(f"table {name} does not exist") from None

    def definition(self, name: TableName) -> TableDefinition:
        return self.table(name).definition

    def table_rows(self, name: TableName) -> list[dict[str, Value]]:
        """The table's rows ordered by primary key (NULLs first), as dicts."""
        state = self.table(name)
        return [dict(state.rows[key]) for key in sorted(state.rows, key=_sort_key)]

    def snapshot(self) -> dict[TableName, list[dict[str, Value]]]:
        """Every live table's rows, for comparing two databases."""
        return {name: self.table_rows(name) for name in sorted(self.tables)}

    def differences(self, other: SourceDatabase) -> list[str]:
        """What differs between this database and `other`, table by table ([] when equal)."""
        found = []
        for name in sorted(set(self.tables) | set(other.tables)):
            mine, theirs = self.tables.get(name), other.tables.get(name)
            if mine is None or theirs is None:
                found.append(f"{name}: only in {'the other' if mine is None else 'this'} database")
                continue
            if mine.definition != theirs.definition:
                found.append(
                    f"{name}: definitions differ: {mine.definition} != {theirs.definition}"
                )
            for key in sorted(set(mine.rows) | set(theirs.rows), key=_sort_key):
                row, other_row = mine.rows.get(key), theirs.rows.get(key)
                if row != other_row:
                    found.append(f"{name} key {key}: {row} != {other_row}")
        return found

    # Statements, as the producer executes them.

    def create_schema(self, name: str) -> None:
        if name in self.schemas:
            raise StateError(f"schema {name} already exists")
        self.schemas.add(name)

    def drop_schema(self, name: str, *, transaction_id: int | None = None) -> None:
        if name not in self.schemas:
            raise StateError(f"schema {name} does not exist")
        for table in [table for table in self.tables if table.schema == name]:
            self.drop_table(table, transaction_id=transaction_id)
        self.schemas.remove(name)

    def create_table(self, definition: TableDefinition) -> None:
        if definition.name.schema not in self.schemas:
            raise StateError(
                f"table {definition.name}: schema {definition.name.schema} does not exist"
            )
        if definition.name in self.tables:
            raise StateError(f"table {definition.name} already exists")
        self._touch(definition.name)
        self.tables[definition.name] = TableState(definition)

    def alter_table(self, before: TableDefinition, after: TableDefinition) -> None:
        """Change a table's definition. Added columns take their default in existing rows, as
        at the source; dropped columns go; a rename moves the rows; a column whose type changed
        keeps its values (the producer only changes types in ways that keep them)."""
        state = self.table(before.name)
        if state.definition.column_names != before.column_names:
            raise StateError(
                f"ALTER TABLE {before.name}: its 'before' columns {before.column_names} are not "
                f"the table's {state.definition.column_names}"
            )
        if after.name != before.name and after.name in self.tables:
            raise StateError(f"ALTER TABLE renames {before.name} to {after.name}, which exists")
        kept = set(before.column_names)
        added = [column for column in after.columns if column.name not in kept]
        names = after.column_names
        rows: dict[Key, dict[str, Value]] = {}
        for row in state.rows.values():
            new_row = {name: row[name] for name in names if name in row}
            for column in added:
                new_row[column.name] = column.default
            rows[tuple(new_row[name] for name in after.primary_key)] = new_row
        if len(rows) != len(state.rows):
            raise StateError(f"ALTER TABLE {after.name}: the new primary key is not unique")
        self._touch(before.name)
        self._touch(after.name)
        del self.tables[before.name]
        self.tables[after.name] = TableState(after, rows)

    def drop_table(self, name: TableName, *, transaction_id: int | None = None) -> None:
        state = self.table(name)
        self._touch(name)
        self.retired.append(RetiredTable(state.definition, len(state.rows), transaction_id))
        del self.tables[name]

    def truncate(self, name: TableName) -> None:
        state = self.table(name)
        self._touch(name)
        state.rows.clear()

    def insert(self, name: TableName, row: Mapping[str, Value]) -> None:
        state = self.table(name)
        full = self._full_row(state, row)
        key = state.key_of(full)
        if key in state.rows:
            raise StateError(f"INSERT into {name}: primary key {key} already exists")
        self._touch(name)
        state.rows[key] = full

    def update(self, name: TableName, key: Key, values: Mapping[str, Value]) -> None:
        state = self.table(name)
        row = state.rows.get(tuple(key))
        if row is None:
            raise StateError(f"UPDATE of {name}: no row with primary key {tuple(key)}")
        unknown = set(values) - set(state.definition.column_names)
        if unknown:
            raise StateError(f"UPDATE of {name}: no columns {sorted(unknown)}")
        new_row = {**row, **values}
        new_key = state.key_of(new_row)
        if new_key != tuple(key) and new_key in state.rows:
            raise StateError(f"UPDATE of {name}: new primary key {new_key} already exists")
        self._touch(name)
        if new_key != tuple(key):
            del state.rows[tuple(key)]
        state.rows[new_key] = new_row

    def delete(self, name: TableName, key: Key) -> None:
        state = self.table(name)
        if tuple(key) not in state.rows:
            raise StateError(f"DELETE from {name}: no row with primary key {tuple(key)}")
        self._touch(name)
        del state.rows[tuple(key)]

    # Complete transactions, as a replica receives them.

    def apply(self, transaction: CompleteTransaction) -> None:
        """Apply a complete transaction, whole: if a change fails, nothing of it stays."""
        self.begin()
        try:
            for change in transaction.changes:
                self._apply_change(change, transaction.transaction_id)
        except StateError as error:
            self.rollback()
            raise StateError(f"transaction {transaction.transaction_id}: {error}") from None
        self.commit()
        self.last_transaction_id = transaction.transaction_id

    def begin(self) -> None:
        """Start remembering changes, so that `rollback` can undo them (no nesting)."""
        if self._undo is not None:
            raise StateError("a transaction is already open on this database")
        self._undo = {}
        self._saved = (set(self.schemas), list(self.retired), dict(self.variables))

    def commit(self) -> None:
        self._undo = None

    def rollback(self) -> None:
        """Undo every change since `begin`, in time proportional to the tables it touched."""
        if self._undo is None:
            raise StateError("no transaction is open on this database")
        for name, state in self._undo.items():
            if state is None:
                self.tables.pop(name, None)
            else:
                self.tables[name] = state
        self.schemas, self.retired, self.variables = self._saved
        self._undo = None

    def apply_all(self, transactions: Iterable[CompleteTransaction]) -> None:
        for transaction in transactions:
            self.apply(transaction)

    def _apply_change(self, change: object, transaction_id: int) -> None:
        if isinstance(change, InsertRows):
            names = [column.name for column in change.columns]
            for values in change.rows:
                self.insert(change.table, dict(zip(names, values, strict=True)))
        elif isinstance(change, UpdateRows):
            names = [column.name for column in change.set_columns]
            for key, values in zip(change.keys, change.values, strict=True):
                self.update(change.table, key, dict(zip(names, values, strict=True)))
        elif isinstance(change, DeleteRows):
            for key in change.keys:
                self.delete(change.table, key)
        elif isinstance(change, CreateSchema):
            self.create_schema(change.name)
        elif isinstance(change, DropSchema):
            self.drop_schema(change.name, transaction_id=transaction_id)
        elif isinstance(change, CreateTable):
            self.create_table(change.definition)
        elif isinstance(change, AlterTable):
            self.alter_table(change.before, change.after)
        elif isinstance(change, DropTable):
            if change.table in self.tables or not change.if_exists:
                self.drop_table(change.table, transaction_id=transaction_id)
        elif isinstance(change, TruncateTable):
            self.truncate(change.table)
        elif isinstance(change, SetVariable):
            self.variables[change.name] = change.value
        elif isinstance(change, AlterSchema):
            if change.name not in self.schemas:
                raise StateError(f"ALTER SCHEMA {change.name}: no such schema")
        elif isinstance(change, RawSql):
            raise StateError(
                f"raw SQL {change.sql[:80]!r} cannot be applied to a model of the database: "
                "what it changed is not in the message"
            )
        else:
            raise TypeError(f"not a change: {type(change).__name__}")

    @staticmethod
    def _full_row(state: TableState, row: Mapping[str, Value]) -> dict[str, Value]:
        names = state.definition.column_names
        unknown = set(row) - set(names)
        if unknown:
            raise StateError(f"table {state.definition.name} has no columns {sorted(unknown)}")
        missing = [name for name in names if name not in row]
        if missing:
            raise StateError(f"a row of {state.definition.name} without columns {missing}")
        return {name: row[name] for name in names}


def _sort_key(key: Key) -> tuple[tuple[bool, str, object], ...]:
    # Keys of one table share types, but a NULL (or a type changed by ALTER) must not break
    # sorting: order by (is null, type name, value).
    return tuple((value is not None, type(value).__name__, value) for value in key)
