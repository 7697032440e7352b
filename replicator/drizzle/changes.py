"""What one complete Drizzle transaction changed, typed for the Delta side.

A `CompleteTransaction` holds its changes in statement order. Row changes come one batch per
statement (a statement cut into data segments is one batch), each naming its table and the
columns of its values, so that a batch becomes one Arrow table with no object per row; DDL
comes as events. Every table a transaction touched gets one Delta commit, so `by_table` groups
the changes per table, keeping their order.
"""

from __future__ import annotations

import datetime as dt
import enum
from dataclasses import dataclass

from replicator.drizzle.schema import Column, TableDefinition, TableName, Value

Row = tuple[Value, ...]
"""One row's values, in the order of its batch's columns."""


@dataclass(frozen=True, slots=True)
class InsertRows:
    """Rows inserted into `table`: every column of the table, in table order."""

    table: TableName
    columns: tuple[Column, ...]
    rows: tuple[Row, ...]


@dataclass(frozen=True, slots=True)
class UpdateRows:
    """Rows updated in `table`, each found by its primary key *before* the update.

    `keys[i]` holds row i's old primary key (in `key_columns` order) and `values[i]` its new
    values of `set_columns`, the columns the update changed. When a key column is among
    `set_columns` the row's key changes: see `new_key`.
    """

    table: TableName
    key_columns: tuple[Column, ...]
    set_columns: tuple[Column, ...]
    keys: tuple[Row, ...]
    values: tuple[Row, ...]

    def new_key(self, row: int) -> Row:
        """Row `row`'s primary key after the update."""
        changed = {
            column.name: value
            for column, value in zip(self.set_columns, self.values[row], strict=True)
        }
        return tuple(
            changed.get(column.name, old)
            for column, old in zip(self.key_columns, self.keys[row], strict=True)
        )


@dataclass(frozen=True, slots=True)
class DeleteRows:
    """Rows deleted from `table`, by primary key (in `key_columns` order)."""

    table: TableName
    key_columns: tuple[Column, ...]
    keys: tuple[Row, ...]


@dataclass(frozen=True, slots=True)
class CreateSchema:
    name: str


@dataclass(frozen=True, slots=True)
class AlterSchema:
    """A schema's options changed (its collation): nothing for the mirror's rows."""

    name: str


@dataclass(frozen=True, slots=True)
class DropSchema:
    name: str


@dataclass(frozen=True, slots=True)
class CreateTable:
    definition: TableDefinition


@dataclass(frozen=True, slots=True)
class AlterTable:
    """A table's definition changed. A rename shows as `before.name != after.name`."""

    before: TableDefinition
    after: TableDefinition

    @property
    def added_columns(self) -> tuple[str, ...]:
        old = set(self.before.column_names)
        return tuple(name for name in self.after.column_names if name not in old)

    @property
    def dropped_columns(self) -> tuple[str, ...]:
        new = set(self.after.column_names)
        return tuple(name for name in self.before.column_names if name not in new)

    @property
    def retyped_columns(self) -> tuple[str, ...]:
        """Columns in both whose type, nullability or type options changed."""
        new = {column.name: column for column in self.after.columns}
        return tuple(
            column.name
            for column in self.before.columns
            if column.name in new and column != new[column.name]
        )


@dataclass(frozen=True, slots=True)
class DropTable:
    """The table was dropped: the mirror retires its Delta table and keeps it."""

    table: TableName
    if_exists: bool = False


@dataclass(frozen=True, slots=True)
class TruncateTable:
    """Every row of the table was deleted."""

    table: TableName


@dataclass(frozen=True, slots=True)
class SetVariable:
    """A global server variable was set: no data change."""

    name: str
    value: bytes


@dataclass(frozen=True, slots=True)
class RawSql:
    """A statement Drizzle sent as SQL text only (some ALTER TABLE and RENAME forms).

    The mirror cannot know what it did to which rows; the Delta side should refuse it, naming
    the transaction and the SQL, rather than guess.
    """

    sql: str
    schema: str | None


RowChange = InsertRows | UpdateRows | DeleteRows
TableEvent = CreateTable | AlterTable | DropTable | TruncateTable
SchemaEvent = CreateSchema | AlterSchema | DropSchema
Change = RowChange | TableEvent | SchemaEvent | SetVariable | RawSql


class ServerEvent(enum.Enum):
    """A server event a Transaction message carried instead of statements."""

    STARTUP = 0
    SHUTDOWN = 1


def change_table(change: Change) -> TableName | None:
    """The table a change applies to (the new name for a rename), None for the others."""
    if isinstance(change, InsertRows | UpdateRows | DeleteRows | DropTable | TruncateTable):
        return change.table
    if isinstance(change, CreateTable):
        return change.definition.name
    if isinstance(change, AlterTable):
        return change.after.name
    return None


@dataclass(frozen=True, slots=True)
class CompleteTransaction:
    """A whole committed transaction: every segment arrived, and it was not rolled back.

    Timestamps are microseconds since the epoch, UTC (Drizzle's `getCurrentTimestamp`);
    `commit_timestamp` is the end timestamp of its last segment. `segment_count` counts its
    messages and `byte_size` their serialized size. A transaction carrying a server event
    (`event`) has no changes.
    """

    transaction_id: int
    server_id: int
    start_timestamp: int
    commit_timestamp: int
    changes: tuple[Change, ...]
    segment_count: int = 1
    byte_size: int = 0
    event: ServerEvent | None = None

    @property
    def commit_time(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.commit_timestamp / 1_000_000, dt.UTC)

    @property
    def row_count(self) -> int:
        """Rows inserted, updated or deleted."""
        total = 0
        for change in self.changes:
            if isinstance(change, InsertRows):
                total += len(change.rows)
            elif isinstance(change, UpdateRows | DeleteRows):
                total += len(change.keys)
        return total

    @property
    def tables(self) -> tuple[TableName, ...]:
        """Tables the transaction touched, in the order it first touched them."""
        seen: dict[TableName, None] = {}
        for change in self.changes:
            table = change_table(change)
            if table is not None:
                seen.setdefault(table, None)
        return tuple(seen)

    def by_table(self) -> dict[TableName, tuple[Change, ...]]:
        """Each touched table's changes, in order (schema events, SET and raw SQL left out)."""
        grouped: dict[TableName, list[Change]] = {}
        for change in self.changes:
            table = change_table(change)
            if table is not None:
                grouped.setdefault(table, []).append(change)
        return {table: tuple(changes) for table, changes in grouped.items()}
