"""Typed changes to Transaction messages, cut into segments as Drizzle cuts them (producer side).

`TransactionBuilder` follows drizzled/transaction_services.cc: each statement is added to the
transaction's current message; once that message reaches `segment_bytes` (Drizzle's
transaction_message_threshold) it is sent with `end_segment = false` and a new message with the
same transaction id and the next `segment_id` goes on; a statement cut that way repeats its
header in the new message and numbers its data segments. `messages()` commits (the last
message gets `end_segment = true`); `rollback_messages()` rolls back: a ROLLBACK message under
the next segment id when some segments were already sent, nothing otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import count

from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

from replicator.drizzle.decode import statement_data, statement_header
from replicator.drizzle.proto.schema_pb2 import Schema
from replicator.drizzle.proto.transaction_pb2 import (
    DeleteHeader,
    FieldMetadata,
    InsertHeader,
    Statement,
    TableMetadata,
    Transaction,
    UpdateHeader,
)
from replicator.drizzle.schema import (
    ColumnSpec,
    TableDefinition,
    TableName,
    Value,
    definition_to_message,
    format_value,
)

# Drizzle's default --transaction-message-threshold (drizzled/transaction_services.cc).
DEFAULT_SEGMENT_BYTES = 1024 * 1024


class TransactionBuilder:
    """Builds the messages of one transaction.

    `timestamp` is the transaction's start in microseconds since the epoch; each statement
    start, statement end and message end takes the next microsecond after it, so the same
    calls always build the same bytes.

    >>> from replicator.drizzle.schema import ColumnSpec, ColumnType, TableDefinition, TableName
    >>> column = ColumnSpec("id", ColumnType.INTEGER, nullable=False)
    >>> table = TableDefinition(TableName("shop", "item"), (column,), ("id",))
    >>> builder = TransactionBuilder(server_id=1, transaction_id=9, timestamp=0, segment_bytes=200)
    >>> builder.insert(table, [{"id": n} for n in range(40)])
    >>> [(m.segment_id, m.end_segment) for m in builder.messages()]
    [(1, False), (2, False), (3, True)]
    """

    def __init__(
        self,
        *,
        server_id: int,
        transaction_id: int,
        timestamp: int,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        clock: Callable[[], int] | None = None,
    ) -> None:
        if segment_bytes < 1:
            raise ValueError(f"segment size {segment_bytes} must be at least 1 byte")
        self.server_id = server_id
        self.transaction_id = transaction_id
        self.start_timestamp = timestamp
        self._clock = clock if clock is not None else count(timestamp + 1).__next__
        self._segment_bytes = segment_bytes
        self._sent: list[Transaction] = []
        self._current = self._new_message(1)
        self._current_bytes = self._current.ByteSize()
        self._finished = False
        # The statement being written and its header, repeated in each message it spans.
        self._statement: Statement | None = None

    @property
    def segments_sent(self) -> int:
        """Messages already cut off (sent, for a producer that publishes as it goes)."""
        return len(self._sent)

    def sent_messages(self) -> tuple[Transaction, ...]:
        return tuple(self._sent)

    def create_schema(self, name: str) -> None:
        statement = self._ddl(Statement.CREATE_SCHEMA)
        schema = statement.create_schema_statement.schema
        schema.CopyFrom(self._schema(name))

    def drop_schema(self, name: str) -> None:
        self._ddl(Statement.DROP_SCHEMA).drop_schema_statement.schema_name = name

    def create_table(self, definition: TableDefinition) -> None:
        statement = self._ddl(Statement.CREATE_TABLE)
        statement.create_table_statement.table.CopyFrom(
            definition_to_message(definition, created_at=self.start_timestamp)
        )

    def alter_table(self, before: TableDefinition, after: TableDefinition) -> None:
        statement = self._ddl(Statement.ALTER_TABLE)
        alter = statement.alter_table_statement
        alter.before.CopyFrom(definition_to_message(before, created_at=self.start_timestamp))
        alter.after.CopyFrom(
            definition_to_message(
                after, created_at=self.start_timestamp, updated_at=self.start_timestamp
            )
        )

    def drop_table(self, table: TableName, *, if_exists: bool = False) -> None:
        drop = self._ddl(Statement.DROP_TABLE).drop_table_statement
        drop.table_metadata.CopyFrom(_metadata(table))
        drop.if_exists_clause = if_exists

    def truncate(self, table: TableName) -> None:
        truncate = self._ddl(Statement.TRUNCATE_TABLE).truncate_table_statement
        truncate.table_metadata.CopyFrom(_metadata(table))

    def raw_sql(self, sql: str, schema: str | None = None) -> None:
        statement = self._ddl(Statement.RAW_SQL)
        statement.sql = sql
        if schema is not None:
            statement.raw_sql_schema = schema

    def insert(self, definition: TableDefinition, rows: Sequence[Mapping[str, Value]]) -> None:
        """One INSERT statement of full rows (every column named; None is NULL)."""
        columns = definition.columns
        header = self._start(Statement.INSERT, definition)
        assert isinstance(header, InsertHeader)
        _add_fields(header.field_metadata, columns)
        self._grew(header.ByteSize())
        for row in rows:
            unknown = set(row) - set(definition.column_names)
            if unknown:
                raise ValueError(f"table {definition.name} has no columns {sorted(unknown)}")
            record = self._next_record().insert_data.record.add()
            for spec in columns:
                value = row.get(spec.name)
                record.is_null.append(value is None)
                record.insert_value.append(b"" if value is None else format_value(spec.type, value))
            self._grew(record.ByteSize())
        self._end_statement()

    def update(
        self,
        definition: TableDefinition,
        rows: Sequence[tuple[Sequence[Value], Mapping[str, Value]]],
    ) -> None:
        """One UPDATE statement: each row is (old primary key, new values of changed columns).

        Every row must change the same columns (Drizzle's header names them once).
        """
        if not rows:
            raise ValueError("an UPDATE statement needs at least one row")
        changed = tuple(definition.column(name) for name in rows[0][1])
        keys = tuple(definition.column(name) for name in definition.primary_key)
        header = self._start(Statement.UPDATE, definition)
        assert isinstance(header, UpdateHeader)
        _add_fields(header.key_field_metadata, keys)
        _add_fields(header.set_field_metadata, changed)
        self._grew(header.ByteSize())
        for key, values in rows:
            if set(values) != {spec.name for spec in changed}:
                raise ValueError(
                    f"UPDATE of {definition.name}: rows change columns {sorted(values)} and "
                    f"{[spec.name for spec in changed]}; make them two statements"
                )
            record = self._next_record().update_data.record.add()
            record.key_value.extend(_key_bytes(keys, key))
            for spec in changed:
                value = values[spec.name]
                record.is_null.append(value is None)
                record.after_value.append(b"" if value is None else format_value(spec.type, value))
            self._grew(record.ByteSize())
        self._end_statement()

    def delete(self, definition: TableDefinition, keys: Sequence[Sequence[Value]]) -> None:
        """One DELETE statement of rows by primary key."""
        key_columns = tuple(definition.column(name) for name in definition.primary_key)
        header = self._start(Statement.DELETE, definition)
        assert isinstance(header, DeleteHeader)
        _add_fields(header.key_field_metadata, key_columns)
        self._grew(header.ByteSize())
        for key in keys:
            record = self._next_record().delete_data.record.add()
            record.key_value.extend(_key_bytes(key_columns, key))
            self._grew(record.ByteSize())
        self._end_statement()

    def cancel_statement(self) -> None:
        """The last statement failed: drop it, and if some of its data segments were already
        sent, cancel them with a ROLLBACK_STATEMENT (Drizzle's rollbackStatementMessage)."""
        statement = self._statement
        if statement is None or not self._current.statement:
            raise ValueError("no statement to cancel: call it after insert, update or delete")
        segmented = statement_data(statement).segment_id > 1
        del self._current.statement[-1]
        if segmented:
            self._add_statement(Statement.ROLLBACK_STATEMENT)
        self._statement = None

    def messages(self) -> tuple[Transaction, ...]:
        """Commit: every message of the transaction, the last with end_segment true."""
        self._finish()
        self._current.end_segment = True
        self._current.transaction_context.end_timestamp = self._clock()
        return (*self._sent, self._current)

    def rollback_messages(self) -> tuple[Transaction, ...]:
        """Roll back: the segments already sent and a ROLLBACK message after them, or nothing
        when none was sent (Drizzle's rollbackTransactionMessage)."""
        self._finish()
        if not self._sent:
            return ()
        rollback = self._new_message(self._current.segment_id)
        rollback.end_segment = True
        statement = rollback.statement.add(type=Statement.ROLLBACK)
        statement.start_timestamp = statement.end_timestamp = self._clock()
        rollback.transaction_context.end_timestamp = self._clock()
        return (*self._sent, rollback)

    def _finish(self) -> None:
        if self._finished:
            raise ValueError(
                f"transaction {self.transaction_id} is already committed or rolled back"
            )
        self._finished = True
        self._statement = None

    def _new_message(self, segment_id: int) -> Transaction:
        message = Transaction(segment_id=segment_id, end_segment=True)
        context = message.transaction_context
        context.server_id = self.server_id
        context.transaction_id = self.transaction_id
        context.start_timestamp = self.start_timestamp
        context.end_timestamp = 0
        return message

    def _schema(self, name: str) -> Schema:
        schema = Schema(name=name, collation="utf8_general_ci")
        schema.engine.name = "InnoDB"
        schema.creation_timestamp = schema.update_timestamp = self.start_timestamp
        return schema

    def _add_statement(self, kind: int) -> Statement:
        statement = self._current.statement.add(type=kind)
        statement.start_timestamp = self._clock()
        statement.end_timestamp = self._clock()
        return statement

    def _ddl(self, kind: int) -> Statement:
        self._check_open()
        self._statement = None
        statement = self._add_statement(kind)
        self._grew(statement.ByteSize())
        return statement

    def _start(self, kind: int, definition: TableDefinition) -> object:
        """Begin an INSERT / UPDATE / DELETE statement; return its header to fill in."""
        self._check_open()
        # Drizzle cuts before a new statement when the message is already over the threshold.
        if self._current_bytes >= self._segment_bytes:
            self._cut()
        self._statement = statement = self._add_statement(kind)
        data = statement_data(statement)
        data.segment_id = 1
        data.end_segment = True
        header = statement_header(statement)
        header.table_metadata.CopyFrom(_metadata(definition.name))
        return header

    def _next_record(self) -> Statement:
        """The statement to add the next record to, cutting a segment first if it is due."""
        assert self._statement is not None
        if self._current_bytes >= self._segment_bytes:
            previous = self._statement
            previous_data = statement_data(previous)
            previous_data.end_segment = False
            self._cut()
            statement = self._add_statement(previous.type)
            # The same header type on both sides: both statements are of previous.type.
            statement_header(statement).CopyFrom(statement_header(previous))  # type: ignore[arg-type]
            data = statement_data(statement)
            data.segment_id = previous_data.segment_id + 1
            data.end_segment = True
            self._statement = statement
            self._grew(statement.ByteSize())
        return self._statement

    def _cut(self) -> None:
        self._current.end_segment = False
        self._current.transaction_context.end_timestamp = self._clock()
        self._sent.append(self._current)
        self._current = self._new_message(self._current.segment_id + 1)
        self._current_bytes = self._current.ByteSize()

    def _end_statement(self) -> None:
        assert self._statement is not None
        self._statement.end_timestamp = self._clock()

    def _grew(self, size: int) -> None:
        # Drizzle compares the message's exact ByteSize with the threshold; a running sum of
        # the parts (plus a few bytes of framing each) is close and far cheaper.
        self._current_bytes += size + 4

    def _check_open(self) -> None:
        if self._finished:
            raise ValueError(
                f"transaction {self.transaction_id} is already committed or rolled back"
            )


def _metadata(table: TableName) -> TableMetadata:
    return TableMetadata(schema_name=table.schema, table_name=table.table)


def _add_fields(
    target: RepeatedCompositeFieldContainer[FieldMetadata], columns: Sequence[ColumnSpec]
) -> None:
    for spec in columns:
        target.add(name=spec.name, type=spec.type.value)


def _key_bytes(columns: Sequence[ColumnSpec], key: Sequence[Value]) -> list[bytes]:
    if len(key) != len(columns):
        raise ValueError(f"a key of {len(key)} values for {len(columns)} key columns")
    values = []
    for spec, value in zip(columns, key, strict=True):
        if value is None:
            raise ValueError(f"key column {spec.name} is NULL")
        values.append(format_value(spec.type, value))
    return values
