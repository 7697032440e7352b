"""Small tables and hand-built messages shared by the Drizzle tests."""

from __future__ import annotations

from replicator.drizzle.encode import TransactionBuilder
from replicator.drizzle.proto.transaction_pb2 import Statement, Transaction
from replicator.drizzle.schema import ColumnSpec, ColumnType, TableDefinition, TableName

ITEMS = TableDefinition(
    TableName("shop", "items"),
    (
        ColumnSpec("id", ColumnType.INTEGER, nullable=False),
        ColumnSpec("name", ColumnType.VARCHAR, length=40),
        ColumnSpec("qty", ColumnType.BIGINT, nullable=False, has_default=True, default=0),
    ),
    ("id",),
)


def builder(transaction_id: int, *, segment_bytes: int = 1 << 20) -> TransactionBuilder:
    return TransactionBuilder(
        server_id=1,
        transaction_id=transaction_id,
        timestamp=1_000_000 * transaction_id,
        segment_bytes=segment_bytes,
    )


def setup_messages(first_id: int = 1) -> list[Transaction]:
    """CREATE SCHEMA shop and CREATE TABLE shop.items, as transactions first_id, first_id + 1."""
    schema = builder(first_id)
    schema.create_schema("shop")
    table = builder(first_id + 1)
    table.create_table(ITEMS)
    return [*schema.messages(), *table.messages()]


def insert_messages(
    transaction_id: int, ids: range, *, segment_bytes: int = 1 << 20
) -> tuple[Transaction, ...]:
    """One INSERT of rows (id, "item <id>", id * 10), cut into segments of segment_bytes."""
    build = builder(transaction_id, segment_bytes=segment_bytes)
    build.insert(ITEMS, [{"id": n, "name": f"item {n}", "qty": n * 10} for n in ids])
    return build.messages()


def rollback_message(transaction_id: int, segment_id: int) -> Transaction:
    """A ROLLBACK message as Drizzle sends it for a bulk transaction already partly sent."""
    message = Transaction(segment_id=segment_id, end_segment=True)
    context = message.transaction_context
    context.server_id = 1
    context.transaction_id = transaction_id
    context.start_timestamp = context.end_timestamp = 5
    message.statement.add(type=Statement.ROLLBACK, start_timestamp=5, end_timestamp=5)
    return message
