"""Transaction messages (the segments of one transaction) to typed changes.

Slightly over 500 lines on purpose: checking a segment as it arrives and decoding the complete
transaction are one walk over the statements (`_Walker`, in two modes), which a split would
scatter.

Statements follow Drizzle's rules (drizzled/transaction_services.cc and the slave's applier,
plugin/slave/queue_consumer.cc):

- INSERT / UPDATE / DELETE carry a header and a data segment. A statement cut across messages
  repeats its header in each, numbers its data segments 1, 2, ... and sets end_segment only on
  the last; its rows count only once that last segment arrives.
- ROLLBACK_STATEMENT cancels the unfinished segmented statement before it (its rows are
  dropped; the transaction goes on).
- ROLLBACK, the last statement of its message, drops the whole transaction.
- A message with an Event carries a server event and no statements.

`SegmentChecker` checks each segment's structure as it arrives, keeping only what the next
segment is checked against, so that a transaction's buffered segments may be spilled;
`decode_transaction` turns all of them into typed changes once the transaction is complete.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from google.protobuf import unknown_fields

from replicator.drizzle.changes import (
    AlterSchema,
    AlterTable,
    Change,
    CompleteTransaction,
    CreateSchema,
    CreateTable,
    DeleteRows,
    DropSchema,
    DropTable,
    InsertRows,
    RawSql,
    Row,
    ServerEvent,
    SetVariable,
    TruncateTable,
    UpdateRows,
)
from replicator.drizzle.errors import MalformedTransactionError, UnknownStatementError
from replicator.drizzle.proto.transaction_pb2 import (
    DeleteData,
    DeleteHeader,
    FieldMetadata,
    InsertData,
    InsertHeader,
    Statement,
    TableMetadata,
    Transaction,
    UpdateData,
    UpdateHeader,
)
from replicator.drizzle.schema import (
    Column,
    ColumnType,
    ColumnValueError,
    TableName,
    Value,
    definition_from_message,
    parse_value,
)

_DML = (Statement.INSERT, Statement.UPDATE, Statement.DELETE)
_STATEMENT_PARTS: dict[int, str] = {
    Statement.TRUNCATE_TABLE: "truncate_table_statement",
    Statement.CREATE_SCHEMA: "create_schema_statement",
    Statement.ALTER_SCHEMA: "alter_schema_statement",
    Statement.DROP_SCHEMA: "drop_schema_statement",
    Statement.CREATE_TABLE: "create_table_statement",
    Statement.ALTER_TABLE: "alter_table_statement",
    Statement.DROP_TABLE: "drop_table_statement",
    Statement.SET_VARIABLE: "set_variable_statement",
}


def segment_numbers(message: Transaction, previous: int | None) -> tuple[int, bool]:
    """(segment_id, end_segment) of a message; `previous` is the transaction's last segment.

    Messages from before Drizzle numbered Transaction segments (2011; RabbitReplication's
    format) have neither field: their segment is the one after `previous`, and the last is the
    one that does not end inside a segmented statement.
    """
    segment_id = message.segment_id if message.HasField("segment_id") else (previous or 0) + 1
    if message.HasField("end_segment"):
        return segment_id, message.end_segment
    return segment_id, not _ends_inside_statement(message)


def _ends_inside_statement(message: Transaction) -> bool:
    if not message.statement:
        return False
    last = message.statement[-1]
    if last.type not in _DML or not last.HasField("type"):
        return False
    return not statement_data(last).end_segment


def unknown_statement_type(statement: Statement) -> int | None:
    """The number of a statement type this replicator does not know, if that is the type.

    proto2 keeps an enum number it does not know as an unknown field (a newer Drizzle's
    statement, or corruption), and `type` then reads as unset, whose default is ROLLBACK: read
    without this check, such a statement would drop its transaction.
    """
    if statement.HasField("type"):
        return None
    unknown = unknown_fields.UnknownFieldSet(statement)
    for index in range(len(unknown)):
        if unknown[index].field_number == Statement.TYPE_FIELD_NUMBER:
            data = unknown[index].data
            return data if isinstance(data, int) else None
    return None


def statement_type_name(statement: Statement) -> str:
    return Statement.Type.Name(statement.type)


_Header = InsertHeader | UpdateHeader | DeleteHeader
_Data = InsertData | UpdateData | DeleteData


def statement_data(statement: Statement) -> _Data:
    """The data segment of an INSERT, UPDATE or DELETE statement."""
    if statement.type == Statement.INSERT:
        return statement.insert_data
    if statement.type == Statement.UPDATE:
        return statement.update_data
    return statement.delete_data


def statement_header(statement: Statement) -> _Header:
    """The header of an INSERT, UPDATE or DELETE statement."""
    if statement.type == Statement.INSERT:
        return statement.insert_header
    if statement.type == Statement.UPDATE:
        return statement.update_header
    return statement.delete_header


@dataclass(frozen=True, slots=True)
class Unfinished:
    """A segmented statement still waiting for data segments: what the next must continue."""

    statement_type: int
    table: TableName
    next_data_segment: int


@dataclass(frozen=True, slots=True)
class SegmentCheck:
    """What checking one segment found: whether it rolls the transaction back, and what
    unfinished statement the next segment must continue (None: none)."""

    rolls_back: bool
    unfinished: Unfinished | None


class SegmentChecker:
    """Checks segments' structure in arrival order, without decoding values (cheap)."""

    def __init__(self, transaction_id: int) -> None:
        self.transaction_id = transaction_id
        self.unfinished: Unfinished | None = None

    def check(self, message: Transaction, segment_id: int, *, is_last: bool) -> SegmentCheck:
        """Check `message`; raise a TransactionStreamError naming what is wrong.

        Does not change the checker: call `accept` with the result once the caller took it.
        """
        walker = _Walker(self.transaction_id, segment_id, self.unfinished, decode=False)
        rolls_back = walker.walk(message)
        if not rolls_back and is_last:
            walker.require_finished()
        return SegmentCheck(rolls_back, walker.unfinished)

    def accept(self, result: SegmentCheck) -> None:
        self.unfinished = result.unfinished


def decode_transaction(
    segments: Iterable[Transaction], *, segment_ids: Sequence[int] | None = None
) -> CompleteTransaction:
    """The typed changes of a complete, committed transaction from all its segments, in order.

    Raises MalformedTransactionError / UnknownStatementError naming the transaction, the
    segment and the statement; ValueError if the segments roll the transaction back (the
    assembler never asks for those).
    """
    changes: list[Change] = []
    first: Transaction | None = None
    last: Transaction | None = None
    count = 0
    size = 0
    unfinished: Unfinished | None = None
    walker: _Walker | None = None
    for index, message in enumerate(segments):
        if first is None:
            first = message
        last = message
        count += 1
        size += message.ByteSize()
        segment_id = segment_ids[index] if segment_ids is not None else index + 1
        transaction_id = message.transaction_context.transaction_id
        walker = _Walker(transaction_id, segment_id, unfinished, decode=True, carried=walker)
        if walker.walk(message):
            raise ValueError(f"transaction {transaction_id} is rolled back: nothing to decode")
        unfinished = walker.unfinished
        changes.extend(walker.changes)
    if first is None or last is None or walker is None:
        raise ValueError("a transaction has at least one segment")
    walker.require_finished()
    context = first.transaction_context
    event = ServerEvent(first.event.type) if first.HasField("event") else None
    return CompleteTransaction(
        transaction_id=context.transaction_id,
        server_id=context.server_id,
        start_timestamp=context.start_timestamp,
        commit_timestamp=last.transaction_context.end_timestamp,
        changes=tuple(changes),
        segment_count=count,
        byte_size=size,
        event=event,
    )


@dataclass
class _Batch:
    """Rows of the unfinished segmented statement gathered so far (decode mode)."""

    statement_type: int
    table: TableName
    key_columns: tuple[Column, ...] = ()
    columns: tuple[Column, ...] = ()
    keys: list[Row] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)


class _Walker:
    """Walks one message's statements against the unfinished statement before it."""

    def __init__(
        self,
        transaction_id: int,
        segment_id: int,
        unfinished: Unfinished | None,
        *,
        decode: bool,
        carried: _Walker | None = None,
    ) -> None:
        self.transaction_id = transaction_id
        self.segment_id = segment_id
        self.unfinished = unfinished
        self.decode = decode
        self.changes: list[Change] = []
        # The unfinished statement's rows so far, carried from the previous segment's walker.
        self.batch: _Batch | None = carried.batch if carried is not None else None
        self.index = 0

    def walk(self, message: Transaction) -> bool:
        """Check (and decode) the message; True if it rolls the transaction back."""
        if message.HasField("event") and len(message.statement):
            raise self._malformed("carries both a server event and statements")
        count = len(message.statement)
        for self.index, statement in enumerate(message.statement):
            kind = self._statement_type(statement)
            if kind == Statement.ROLLBACK:
                if self.index != count - 1:
                    raise self._malformed(
                        f"has {count - 1 - self.index} statements after its ROLLBACK"
                    )
                return True
            if kind == Statement.ROLLBACK_STATEMENT:
                if self.unfinished is None:
                    raise self._malformed(
                        "ROLLBACK_STATEMENT with no unfinished segmented statement to cancel"
                    )
                self.unfinished = None
                self.batch = None
            elif kind in _DML:
                self._dml(statement)
            else:
                if self.unfinished is not None:
                    raise self._interrupted(statement)
                if self.decode:
                    self.changes.append(self._other(statement))
                else:
                    self._check_other(statement)
        return False

    def require_finished(self) -> None:
        if self.unfinished is not None:
            raise self._malformed(
                f"ends the transaction inside a segmented "
                f"{Statement.Type.Name(self.unfinished.statement_type)} on "
                f"{self.unfinished.table} (its last data segment had end_segment false)",
                statement=False,
            )

    def _statement_type(self, statement: Statement) -> int:
        if statement.HasField("type"):
            return statement.type
        number = unknown_statement_type(statement)
        if number is not None:
            raise UnknownStatementError(
                self.transaction_id,
                self.segment_id,
                f"statement {self.index}: unknown statement type {number}",
            )
        raise self._malformed("has no type")

    def _dml(self, statement: Statement) -> None:
        kind = statement.type
        name = Statement.Type.Name(kind)
        header_field = name.lower() + "_header"
        data_field = name.lower() + "_data"
        if not statement.HasField(header_field) or not statement.HasField(data_field):
            raise self._malformed(f"{name} without its {header_field} and {data_field}")
        header = statement_header(statement)
        data = statement_data(statement)
        table = _table_name(header.table_metadata)
        if self.unfinished is not None:
            if self.unfinished.statement_type != kind or self.unfinished.table != table:
                raise self._interrupted(statement)
            if data.segment_id != self.unfinished.next_data_segment:
                raise self._malformed(
                    f"{name} on {table}: data segment {data.segment_id} where segment "
                    f"{self.unfinished.next_data_segment} of the unfinished statement was due"
                )
        elif data.segment_id != 1:
            raise self._malformed(
                f"{name} on {table} starts at data segment {data.segment_id}: segments "
                f"1..{data.segment_id - 1} of the statement never arrived"
            )
        self._check_records(table, header, data)
        if self.decode:
            self._gather(kind, table, header, data)
        if data.end_segment:
            self.unfinished = None
            if self.decode:
                self._flush()
        else:
            self.unfinished = Unfinished(kind, table, data.segment_id + 1)

    def _check_records(self, table: TableName, header: _Header, data: _Data) -> None:
        if isinstance(header, InsertHeader) and isinstance(data, InsertData):
            fields = len(header.field_metadata)
            for number, insert in enumerate(data.record):
                self._count(table, number, "insert_value", len(insert.insert_value), fields)
                if len(insert.is_null) not in (0, fields):
                    self._count(table, number, "is_null", len(insert.is_null), fields)
        elif isinstance(header, UpdateHeader) and isinstance(data, UpdateData):
            keys = len(header.key_field_metadata)
            sets = len(header.set_field_metadata)
            for number, update in enumerate(data.record):
                self._count(table, number, "key_value", len(update.key_value), keys)
                self._count(table, number, "after_value", len(update.after_value), sets)
                if len(update.is_null) not in (0, sets):
                    self._count(table, number, "is_null", len(update.is_null), sets)
        elif isinstance(header, DeleteHeader) and isinstance(data, DeleteData):
            keys = len(header.key_field_metadata)
            for number, delete in enumerate(data.record):
                self._count(table, number, "key_value", len(delete.key_value), keys)

    def _count(self, table: TableName, record: int, part: str, got: int, wanted: int) -> None:
        if got != wanted:
            raise self._malformed(
                f"record {record} on {table} has {got} {part} entries for {wanted} columns"
            )

    def _gather(self, kind: int, table: TableName, header: _Header, data: _Data) -> None:
        if isinstance(header, InsertHeader) and isinstance(data, InsertData):
            columns = _columns(header.field_metadata)
            batch = self._batch(kind, table, (), columns)
            for insert in data.record:
                batch.rows.append(self._values(table, columns, insert.insert_value, insert.is_null))
        elif isinstance(header, UpdateHeader) and isinstance(data, UpdateData):
            keys = _columns(header.key_field_metadata)
            sets = _columns(header.set_field_metadata)
            batch = self._batch(kind, table, keys, sets)
            for update in data.record:
                batch.keys.append(self._values(table, keys, update.key_value, ()))
                batch.rows.append(self._values(table, sets, update.after_value, update.is_null))
        elif isinstance(header, DeleteHeader) and isinstance(data, DeleteData):
            keys = _columns(header.key_field_metadata)
            batch = self._batch(kind, table, keys, ())
            for delete in data.record:
                batch.keys.append(self._values(table, keys, delete.key_value, ()))

    def _batch(
        self,
        kind: int,
        table: TableName,
        key_columns: tuple[Column, ...],
        columns: tuple[Column, ...],
    ) -> _Batch:
        batch = self.batch
        # Each segment of an UPDATE has its own header, made from its first row: the changed
        # columns may differ between segments, and then so do the batches.
        if batch is not None and (batch.key_columns != key_columns or batch.columns != columns):
            self._flush()
            batch = None
        if batch is None:
            batch = self.batch = _Batch(kind, table, key_columns, columns)
        return batch

    def _flush(self) -> None:
        batch, self.batch = self.batch, None
        if batch is None:
            return
        if batch.statement_type == Statement.INSERT:
            self.changes.append(InsertRows(batch.table, batch.columns, tuple(batch.rows)))
        elif batch.statement_type == Statement.UPDATE:
            self.changes.append(
                UpdateRows(
                    batch.table,
                    batch.key_columns,
                    batch.columns,
                    tuple(batch.keys),
                    tuple(batch.rows),
                )
            )
        else:
            self.changes.append(DeleteRows(batch.table, batch.key_columns, tuple(batch.keys)))

    def _values(
        self,
        table: TableName,
        columns: tuple[Column, ...],
        raw: Sequence[bytes],
        is_null: Sequence[bool],
    ) -> Row:
        values: list[Value] = []
        for number, column in enumerate(columns):
            if is_null and is_null[number]:
                values.append(None)
                continue
            try:
                values.append(parse_value(column.type, raw[number]))
            except ColumnValueError as error:
                raise self._malformed(f"{table} column {column.name}: {error}") from None
        return tuple(values)

    def _check_other(self, statement: Statement) -> None:
        part = _STATEMENT_PARTS.get(statement.type)
        if part is not None and not statement.HasField(part):
            raise self._malformed(f"{statement_type_name(statement)} without its {part}")
        if statement.type == Statement.RAW_SQL and not statement.HasField("sql"):
            raise self._malformed("RAW_SQL without its sql")

    def _other(self, statement: Statement) -> Change:
        self._check_other(statement)
        kind = statement.type
        try:
            if kind == Statement.TRUNCATE_TABLE:
                return TruncateTable(_table_name(statement.truncate_table_statement.table_metadata))
            if kind == Statement.CREATE_SCHEMA:
                return CreateSchema(statement.create_schema_statement.schema.name)
            if kind == Statement.ALTER_SCHEMA:
                return AlterSchema(statement.alter_schema_statement.after.name)
            if kind == Statement.DROP_SCHEMA:
                return DropSchema(statement.drop_schema_statement.schema_name)
            if kind == Statement.CREATE_TABLE:
                return CreateTable(definition_from_message(statement.create_table_statement.table))
            if kind == Statement.ALTER_TABLE:
                alter = statement.alter_table_statement
                return AlterTable(
                    definition_from_message(alter.before), definition_from_message(alter.after)
                )
            if kind == Statement.DROP_TABLE:
                drop = statement.drop_table_statement
                return DropTable(_table_name(drop.table_metadata), drop.if_exists_clause)
            if kind == Statement.SET_VARIABLE:
                variable = statement.set_variable_statement
                return SetVariable(variable.variable_metadata.name, variable.variable_value)
            if kind == Statement.RAW_SQL:
                schema = statement.raw_sql_schema if statement.HasField("raw_sql_schema") else None
                return RawSql(statement.sql, schema)
        except ValueError as error:
            raise self._malformed(f"{statement_type_name(statement)}: {error}") from None
        raise UnknownStatementError(
            self.transaction_id,
            self.segment_id,
            f"statement {self.index}: statement type {statement_type_name(statement)} "
            "is not handled",
        )

    def _interrupted(self, statement: Statement) -> MalformedTransactionError:
        assert self.unfinished is not None
        return self._malformed(
            f"{statement_type_name(statement)} interrupts the unfinished segmented "
            f"{Statement.Type.Name(self.unfinished.statement_type)} on {self.unfinished.table} "
            f"(data segment {self.unfinished.next_data_segment} was due)"
        )

    def _malformed(self, message: str, *, statement: bool = True) -> MalformedTransactionError:
        where = f"statement {self.index}: " if statement else ""
        return MalformedTransactionError(self.transaction_id, self.segment_id, where + message)


def _table_name(metadata: TableMetadata) -> TableName:
    return TableName(metadata.schema_name, metadata.table_name)


def _columns(fields: Iterable[FieldMetadata]) -> tuple[Column, ...]:
    return tuple(Column(field.name, ColumnType.from_wire(field.type)) for field in fields)
