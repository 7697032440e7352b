"""The embedded producer's workload: a realistic Drizzle transaction stream, the same for a seed.

What it produces is what a Drizzle server with replication on would send:

- first CREATE SCHEMA and CREATE TABLE, each in a transaction of its own (Drizzle commits
  around DDL), tables with a primary key (some of two columns) and columns of every type;
- small transactions of a few INSERT / UPDATE / DELETE statements (NULLs, non-ASCII text,
  binary values, now and then an UPDATE that changes a primary key);
- bulk transactions over many rows, cut into segments; their first segments go out before
  some smaller transactions that commit while they run, so segments of different transactions
  interleave; some bulk statements fail part-way (ROLLBACK_STATEMENT) and the transaction goes
  on;
- rolled-back transactions: a small one sends nothing (it only leaves a gap in the ids), a bulk
  one sends its segments and then a ROLLBACK;
- ALTER TABLE ADD COLUMN (some with a default that existing rows take), TRUNCATE, DROP TABLE
  and new tables created later.

`Workload.database` is the producer's own state: the committed transactions applied as they
were decided, never decoded from the messages, so a mirror built from the messages can be
checked against it.
"""

from __future__ import annotations

import datetime as dt
import enum
import random
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from replicator.drizzle.encode import TransactionBuilder
from replicator.drizzle.log import TransactionLogWriter
from replicator.drizzle.proto.transaction_pb2 import Transaction
from replicator.drizzle.schema import ColumnSpec, ColumnType, TableDefinition, TableName, Value
from replicator.drizzle.state import SourceDatabase

# 2026-01-01T00:00:00Z in microseconds: a fixed start keeps the bytes the same for a seed.
DEFAULT_START_TIMESTAMP = 1_767_225_600_000_000
_WORDS = ("alpha", "beta", "gamma", "delta", "crème", "brûlée", "naïve", "straße", "東京", "ok")


class TransactionKind(enum.Enum):
    DDL = "ddl"
    SMALL = "small"
    BULK = "bulk"
    ROLLED_BACK = "rolled_back"
    BULK_ROLLED_BACK = "bulk_rolled_back"


@dataclass(frozen=True, slots=True)
class WorkloadSettings:
    """What to produce. Shares are the chances of each kind of transaction after set-up."""

    seed: int = 0
    server_id: int = 1
    first_transaction_id: int = 1
    start_timestamp: int = DEFAULT_START_TIMESTAMP
    schemas: int = 2
    tables_per_schema: int = 2
    segment_bytes: int = 8 * 1024
    bulk_rows: int = 300
    bulk_share: float = 0.08
    rollback_share: float = 0.05
    bulk_rollback_share: float = 0.03
    ddl_share: float = 0.04
    interleave: bool = True

    def __post_init__(self) -> None:
        shares = self.bulk_share + self.rollback_share + self.bulk_rollback_share + self.ddl_share
        if not 0 <= shares <= 1:
            raise ValueError(f"the transaction shares add up to {shares}, not within [0, 1]")
        if self.schemas < 1 or self.tables_per_schema < 1:
            raise ValueError("a workload needs at least one schema and one table per schema")


@dataclass(frozen=True, slots=True)
class ProducedTransaction:
    """One transaction as produced, in commit order, with the messages it sent."""

    transaction_id: int
    kind: TransactionKind
    messages: tuple[Transaction, ...]

    @property
    def committed(self) -> bool:
        return self.kind not in (TransactionKind.ROLLED_BACK, TransactionKind.BULK_ROLLED_BACK)


@dataclass(frozen=True, slots=True)
class LogWritten:
    """What `Workload.write_log` wrote."""

    path: Path
    entries: int
    bytes: int
    transactions: int


class Workload:
    """Produces transactions; `database` holds the producer's state after those produced.

    >>> workload = Workload(WorkloadSettings(seed=7))
    >>> produced = list(workload.transactions(30))
    >>> produced[0].kind.value, len(workload.database.tables)
    ('ddl', 4)
    """

    def __init__(self, settings: WorkloadSettings | None = None) -> None:
        self.settings = settings or WorkloadSettings()
        self.database = SourceDatabase()
        self._random = random.Random(self.settings.seed)
        self._next_id = self.settings.first_transaction_id
        self._timestamp = self.settings.start_timestamp
        self._next_key: dict[TableName, int] = {}
        self._table_count = 0
        self._setup = self._setup_steps()

    def transactions(self, count: int) -> Iterator[ProducedTransaction]:
        """The next `count` transactions, in commit order."""
        for _ in range(count):
            yield self._next_transaction()

    def messages(self, count: int) -> Iterator[Transaction]:
        """The messages of the next `count` transactions, in the order Drizzle sends them.

        With `interleave`, a bulk transaction's segments but the last go out before those of
        the (up to three) small transactions committed just before it, which committed while
        the bulk one ran.
        """
        held: deque[ProducedTransaction] = deque()
        for produced in self.transactions(count):
            if (
                self.settings.interleave
                and produced.kind in (TransactionKind.BULK, TransactionKind.BULK_ROLLED_BACK)
                and len(produced.messages) > 1
            ):
                yield from produced.messages[:-1]
                while held:
                    yield from held.popleft().messages
                yield produced.messages[-1]
                continue
            if produced.kind is TransactionKind.SMALL:
                held.append(produced)
                if len(held) > 3:
                    yield from held.popleft().messages
            else:
                while held:
                    yield from held.popleft().messages
                yield from produced.messages
        while held:
            yield from held.popleft().messages

    def serialized(self, count: int) -> Iterator[bytes]:
        """The messages of `messages(count)`, serialized: AMQP message bodies."""
        for message in self.messages(count):
            yield message.SerializeToString()

    def write_log(self, path: Path | str, count: int, *, with_checksum: bool = True) -> LogWritten:
        """Append the messages of the next `count` transactions to a Drizzle transaction log."""
        entries = 0
        with TransactionLogWriter(path, with_checksum=with_checksum) as writer:
            start = writer.offset
            for message in self.messages(count):
                writer.append(message)
                entries += 1
            size = writer.offset - start
        return LogWritten(Path(path), entries, size, count)

    # Producing one transaction.

    def _next_transaction(self) -> ProducedTransaction:
        step = next(self._setup, None)
        if step is not None:
            return step
        roll = self._random.random()
        settings = self.settings
        if roll < settings.ddl_share:
            return self._ddl()
        roll -= settings.ddl_share
        if roll < settings.bulk_share:
            return self._bulk(rolled_back=False)
        roll -= settings.bulk_share
        if roll < settings.bulk_rollback_share:
            return self._bulk(rolled_back=True)
        roll -= settings.bulk_rollback_share
        if roll < settings.rollback_share:
            return self._small(rolled_back=True)
        return self._small(rolled_back=False)

    def _builder(self) -> TransactionBuilder:
        self._timestamp += self._random.randint(100, 5000)
        builder = TransactionBuilder(
            server_id=self.settings.server_id,
            transaction_id=self._next_id,
            timestamp=self._timestamp,
            segment_bytes=self.settings.segment_bytes,
        )
        self._next_id += 1
        return builder

    def _setup_steps(self) -> Iterator[ProducedTransaction]:
        for number in range(self.settings.schemas):
            name = f"app{number}"
            builder = self._builder()
            builder.create_schema(name)
            self.database.create_schema(name)
            yield self._committed(builder, TransactionKind.DDL)
            for _ in range(self.settings.tables_per_schema):
                yield self._create_table(name)

    def _committed(self, builder: TransactionBuilder, kind: TransactionKind) -> ProducedTransaction:
        return ProducedTransaction(builder.transaction_id, kind, builder.messages())

    def _create_table(self, schema: str) -> ProducedTransaction:
        definition = self._new_definition(schema)
        builder = self._builder()
        builder.create_table(definition)
        self.database.create_table(definition)
        self._next_key[definition.name] = 1
        return self._committed(builder, TransactionKind.DDL)

    def _ddl(self) -> ProducedTransaction:
        tables = sorted(self.database.tables)
        choice = self._random.random()
        schema = self._random.choice(sorted(self.database.schemas))
        if not tables or choice < 0.25:
            return self._create_table(schema)
        table = self._random.choice(tables)
        builder = self._builder()
        if choice < 0.6:
            before = self.database.definition(table)
            after = before.with_columns([*before.columns, self._added_column(before)])
            builder.alter_table(before, after)
            self.database.alter_table(before, after)
        elif choice < 0.85 or len(tables) <= 2:
            builder.truncate(table)
            self.database.truncate(table)
        else:
            builder.drop_table(table)
            self.database.drop_table(table, transaction_id=builder.transaction_id)
            del self._next_key[table]
        return self._committed(builder, TransactionKind.DDL)

    def _small(self, *, rolled_back: bool) -> ProducedTransaction:
        builder = self._builder()
        database = self.database
        if rolled_back:
            # Done and undone: a rolled-back transaction that sent no segment sends nothing at
            # all; only its id is missing from the stream.
            database.begin()
            for _ in range(self._random.randint(1, 3)):
                self._statement(builder, rows=self._random.randint(1, 4))
            database.rollback()
            return ProducedTransaction(
                builder.transaction_id, TransactionKind.ROLLED_BACK, builder.rollback_messages()
            )
        for _ in range(self._random.randint(1, 3)):
            self._statement(builder, rows=self._random.randint(1, 4))
        return self._committed(builder, TransactionKind.SMALL)

    def _bulk(self, *, rolled_back: bool) -> ProducedTransaction:
        builder = self._builder()
        rows = self.settings.bulk_rows
        database = self.database
        if rolled_back:
            database.begin()
            self._statement(builder, rows=rows, kinds=("insert",))
            self._statement(builder, rows=rows // 2)
            database.rollback()
            messages = builder.rollback_messages()
            return ProducedTransaction(
                builder.transaction_id, TransactionKind.BULK_ROLLED_BACK, messages
            )
        self._statement(builder, rows=rows, kinds=("insert",))
        if self._random.random() < 0.3:
            # A bulk statement that fails part-way (a duplicate key, say): the rows it sent
            # are cancelled by ROLLBACK_STATEMENT and the transaction goes on.
            database.begin()
            self._statement(builder, rows=rows, kinds=("insert",))
            database.rollback()
            builder.cancel_statement()
        self._statement(builder, rows=rows // 3)
        return self._committed(builder, TransactionKind.BULK)

    def _statement(
        self,
        builder: TransactionBuilder,
        *,
        rows: int,
        kinds: tuple[str, ...] = ("insert", "insert", "update", "update", "delete"),
    ) -> None:
        """One statement on a random table, sent to `builder` and applied to the database."""
        database = self.database
        table = self._random.choice(sorted(database.tables))
        definition = database.definition(table)
        existing = list(database.tables[table].rows)
        kind = self._random.choice(kinds)
        if kind != "insert" and not existing:
            kind = "insert"
        if kind == "insert":
            new_rows = [self._new_row(definition) for _ in range(rows)]
            builder.insert(definition, new_rows)
            for row in new_rows:
                database.insert(table, row)
        elif kind == "update":
            keys = self._random.sample(existing, min(rows, len(existing)))
            changed = self._changed_columns(definition)
            updates = []
            for key in keys:
                values = {column.name: self._value(column) for column in changed}
                updates.append((key, values))
            if len(keys) == 1 and self._random.random() < 0.1:
                # Now and then an update moves a row to a new primary key.
                key_column = definition.column(definition.primary_key[-1])
                new_key = self._fresh_key_value(definition, key_column)
                updates = [(keys[0], {**updates[0][1], key_column.name: new_key})]
            builder.update(definition, updates)
            for key, values in updates:
                database.update(table, key, values)
        else:
            keys = self._random.sample(existing, min(rows, len(existing)))
            builder.delete(definition, keys)
            for key in keys:
                database.delete(table, key)

    # Tables and values.

    def _new_definition(self, schema: str) -> TableDefinition:
        self._table_count += 1
        name = TableName(schema, f"t{self._table_count}")
        key: list[ColumnSpec] = [ColumnSpec("id", ColumnType.INTEGER, nullable=False)]
        if self._random.random() < 0.3:
            key.insert(0, ColumnSpec("region", ColumnType.VARCHAR, nullable=False, length=16))
        optional = list(_OPTIONAL_COLUMNS)
        self._random.shuffle(optional)
        columns = key + optional[: self._random.randint(4, len(optional))]
        return TableDefinition(name, tuple(columns), tuple(column.name for column in key))

    def _added_column(self, definition: TableDefinition) -> ColumnSpec:
        number = sum(1 for column in definition.columns if column.name.startswith("extra"))
        name = f"extra{number}"
        if self._random.random() < 0.5:
            return ColumnSpec(name, ColumnType.BIGINT, has_default=True, default=42)
        return ColumnSpec(name, ColumnType.VARCHAR, length=32)

    def _changed_columns(self, definition: TableDefinition) -> list[ColumnSpec]:
        others = [c for c in definition.columns if c.name not in definition.primary_key]
        if not others:
            return [definition.column(definition.primary_key[-1])]
        return self._random.sample(others, self._random.randint(1, min(3, len(others))))

    def _new_row(self, definition: TableDefinition) -> dict[str, Value]:
        row: dict[str, Value] = {}
        for column in definition.columns:
            if column.name in definition.primary_key:
                row[column.name] = self._fresh_key_value(definition, column)
            else:
                row[column.name] = self._value(column)
        return row

    def _fresh_key_value(self, definition: TableDefinition, column: ColumnSpec) -> Value:
        if column.type is ColumnType.INTEGER:
            # Keys come from a counter: new rows never collide, even across rolled-back work.
            number = self._next_key.get(definition.name, 1)
            self._next_key[definition.name] = number + 1
            return number
        return self._random.choice(("eu", "us", "apac"))

    def _value(self, column: ColumnSpec) -> Value:
        if column.nullable and self._random.random() < 0.1:
            return None
        rng = self._random
        match column.type:
            case ColumnType.INTEGER:
                return rng.randint(-(2**31), 2**31 - 1)
            case ColumnType.BIGINT:
                return rng.randint(-(2**62), 2**62)
            case ColumnType.DOUBLE:
                return rng.uniform(-1e6, 1e6)
            case ColumnType.DECIMAL:
                return Decimal(rng.randint(-(10**8), 10**8)).scaleb(-(column.scale or 0))
            case ColumnType.VARCHAR:
                return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 4)))
            case ColumnType.ENUM:
                return rng.choice(column.enum_values)
            case ColumnType.BLOB if column.is_text:
                return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 8))).encode()
            case ColumnType.BLOB:
                return rng.randbytes(rng.randint(0, 64))
            case ColumnType.BOOLEAN:
                return rng.random() < 0.5
            case ColumnType.DATE:
                return dt.date(2000, 1, 1) + dt.timedelta(days=rng.randint(0, 12_000))
            case ColumnType.DATETIME:
                return dt.datetime(2000, 1, 1) + dt.timedelta(seconds=rng.randint(0, 10**9))
            case ColumnType.EPOCH:
                start = dt.datetime(2001, 1, 1, tzinfo=dt.UTC)
                return start + dt.timedelta(seconds=rng.randint(0, 10**9))
            case ColumnType.TIME:
                return dt.time(rng.randint(0, 23), rng.randint(0, 59), rng.randint(0, 59))
            case ColumnType.UUID:
                return str(uuid.UUID(int=rng.getrandbits(128)))
            case ColumnType.IPV6:
                return ":".join(f"{rng.getrandbits(16):x}" for _ in range(8))
        raise AssertionError(f"no values for {column.type}")


_OPTIONAL_COLUMNS: tuple[ColumnSpec, ...] = (
    ColumnSpec("name", ColumnType.VARCHAR, length=64),
    ColumnSpec("quantity", ColumnType.BIGINT, nullable=False, has_default=True, default=0),
    ColumnSpec("price", ColumnType.DECIMAL, precision=10, scale=2),
    ColumnSpec("ratio", ColumnType.DOUBLE),
    ColumnSpec("active", ColumnType.BOOLEAN),
    ColumnSpec("born", ColumnType.DATE),
    ColumnSpec("updated", ColumnType.DATETIME),
    ColumnSpec("seen", ColumnType.EPOCH),
    ColumnSpec("at", ColumnType.TIME),
    ColumnSpec("note", ColumnType.BLOB, is_text=True),
    ColumnSpec("payload", ColumnType.BLOB),
    ColumnSpec("status", ColumnType.ENUM, enum_values=("new", "paid", "shipped")),
    ColumnSpec("token", ColumnType.UUID),
    ColumnSpec("address", ColumnType.IPV6),
)
