"""Drizzle's replication messages as a second source: messages, log files, RabbitMQ transport.

- `log`: Drizzle's transaction log file (read, follow, write), with its exact framing
- `assembly`: Transaction messages in, complete transactions out (segments, rollbacks,
  duplicates), like `replicator.staging.assembly` for DCP
- `changes` / `schema`: what a complete transaction changed, typed for the Delta side
- `decode` / `encode`: messages to typed changes and back (the producer's side)
- `state`: an in-memory model of the source database, for tests and `verify`
- `workload`: the embedded producer's deterministic transaction stream
- `proto`: the compiled message definitions
- `amqp`: publishing to and consuming from a RabbitMQ queue (acknowledged after the commit)
- `broker`: a private RabbitMQ node started by the project (tests, demo, benchmark)
- `spill`: a segment store that spills open transactions beyond the memory budget to files
- `planning`: pure; a group of complete transactions as one plan per table
- `sources` / `replication`: the log file and the queue as message sources, and the loop that
  mirrors them (its Delta side: `replicator.delta.relational` and `replicator.delta.journal`)
"""

from replicator.drizzle.assembly import (
    CompletedIds,
    CompletedIdTracker,
    FeedResult,
    MemorySegmentStore,
    MessageSkipped,
    OpenTransaction,
    SegmentBuffered,
    SegmentStore,
    SkipReason,
    TransactionAssembler,
    TransactionCompleted,
    TransactionRolledBack,
)
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
    ServerEvent,
    SetVariable,
    TruncateTable,
    UpdateRows,
)
from replicator.drizzle.decode import decode_transaction
from replicator.drizzle.encode import TransactionBuilder
from replicator.drizzle.errors import (
    CorruptLogEntry,
    IncompleteLogError,
    MalformedTransactionError,
    SegmentGapError,
    TransactionLogError,
    TransactionOrderError,
    TransactionStreamError,
    UnknownStatementError,
)
from replicator.drizzle.log import (
    Checksums,
    LogEntry,
    TransactionLogReader,
    TransactionLogWriter,
    TruncatedTail,
    encode_entry,
    read_transaction_log,
)
from replicator.drizzle.schema import (
    Column,
    ColumnSpec,
    ColumnType,
    ColumnValueError,
    TableDefinition,
    TableName,
    Value,
)
from replicator.drizzle.state import SourceDatabase, StateError
from replicator.drizzle.workload import Workload, WorkloadSettings

__all__ = [
    "AlterSchema",
    "AlterTable",
    "Change",
    "Checksums",
    "Column",
    "ColumnSpec",
    "ColumnType",
    "ColumnValueError",
    "CompleteTransaction",
    "CompletedIdTracker",
    "CompletedIds",
    "CorruptLogEntry",
    "CreateSchema",
    "CreateTable",
    "DeleteRows",
    "DropSchema",
    "DropTable",
    "FeedResult",
    "IncompleteLogError",
    "InsertRows",
    "LogEntry",
    "MalformedTransactionError",
    "MemorySegmentStore",
    "MessageSkipped",
    "OpenTransaction",
    "RawSql",
    "SegmentBuffered",
    "SegmentGapError",
    "SegmentStore",
    "ServerEvent",
    "SetVariable",
    "SkipReason",
    "SourceDatabase",
    "StateError",
    "TableDefinition",
    "TableName",
    "TransactionAssembler",
    "TransactionBuilder",
    "TransactionCompleted",
    "TransactionLogError",
    "TransactionLogReader",
    "TransactionLogWriter",
    "TransactionOrderError",
    "TransactionRolledBack",
    "TransactionStreamError",
    "TruncateTable",
    "TruncatedTail",
    "UnknownStatementError",
    "UpdateRows",
    "Value",
    "Workload",
    "WorkloadSettings",
    "decode_transaction",
    "encode_entry",
    "read_transaction_log",
]
