"""Typed events a DCP stream hands to the layer above, one frozen type per message.

The wire codec decodes producer messages into these types; the stream layer adds the
lifecycle events (`StreamOpened`, `RollbackRequired`). A connection hands data messages up in
bulk, as `DocumentChanges`: the same fields column by column, many messages per object. Values
arrive already decompressed and with xattrs split off, and keys without their collection-id
prefix: the layers above never see wire encodings.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from replicator.dcp.protocol.opcodes import Opcode
from replicator.model.positions import FailoverLog


class SnapshotFlags(enum.IntFlag):
    """SNAPSHOT_MARKER flags (0x01 is memory, 0x02 disk, whatever the doc's drawing says)."""

    MEMORY = 0x01
    DISK = 0x02
    CHECKPOINT = 0x04
    ACK = 0x08
    HISTORY = 0x10
    MAY_CONTAIN_DUPLICATES = 0x20


class StreamEndReason(enum.IntEnum):
    """STREAM_END reasons; all but OK and CLOSED mean: reopen from the committed boundary."""

    OK = 0
    CLOSED = 1
    STATE_CHANGED = 2
    DISCONNECTED = 3
    TOO_SLOW = 4
    BACKFILL_FAILED = 5
    ROLLBACK = 6
    FILTER_EMPTY = 7
    LOST_PRIVILEGES = 8


class SystemEventType(enum.IntEnum):
    COLLECTION_CREATED = 0
    COLLECTION_DROPPED = 1
    COLLECTION_FLUSHED = 2
    SCOPE_CREATED = 3
    SCOPE_DROPPED = 4
    COLLECTION_CHANGED = 5


class OsoFlags(enum.IntFlag):
    START = 0x01
    END = 0x02


@dataclass(frozen=True, slots=True)
class SnapshotMarker:
    """Opens a snapshot [start_seqno, end_seqno] of one vbucket.

    The v2.x fields are None when the producer sent a v1 marker.
    """

    vbucket: int
    start_seqno: int
    end_seqno: int
    flags: SnapshotFlags
    max_visible_seqno: int | None = None
    high_completed_seqno: int | None = None
    purge_seqno: int | None = None
    high_prepared_seqno: int | None = None
    stream_id: int | None = None

    @property
    def is_disk(self) -> bool:
        return bool(self.flags & SnapshotFlags.DISK)

    @property
    def may_contain_duplicates(self) -> bool:
        return bool(self.flags & SnapshotFlags.MAY_CONTAIN_DUPLICATES)


@dataclass(frozen=True, slots=True)
class Mutation:
    """A document written (created or updated) at `by_seqno`.

    `expiration` is absolute unix seconds (0: never expires). `is_json` comes from the datatype
    bit; `value` is the document body without xattrs, already decompressed.
    """

    vbucket: int
    by_seqno: int
    rev_seqno: int
    cas: int
    flags: int
    expiration: int
    lock_time: int
    collection_id: int
    key: bytes
    value: bytes
    is_json: bool
    xattrs: tuple[tuple[str, str], ...] = ()
    stream_id: int | None = None


@dataclass(frozen=True, slots=True)
class Deletion:
    """A document deleted at `by_seqno` (`delete_time` is 0 for a v1 deletion)."""

    vbucket: int
    by_seqno: int
    rev_seqno: int
    cas: int
    collection_id: int
    key: bytes
    delete_time: int = 0
    xattrs: tuple[tuple[str, str], ...] = ()
    stream_id: int | None = None


@dataclass(frozen=True, slots=True)
class Expiration:
    """A document expired at `by_seqno` (only with the expiry opcode enabled)."""

    vbucket: int
    by_seqno: int
    rev_seqno: int
    cas: int
    collection_id: int
    key: bytes
    delete_time: int
    stream_id: int | None = None


@dataclass(frozen=True, slots=True)
class SystemEvent:
    """A collection or scope created, dropped, flushed or changed, at `by_seqno`.

    `name` is the collection or scope name (empty for drops). `collection_id` is None for scope
    events.
    """

    vbucket: int
    by_seqno: int
    event: SystemEventType
    version: int
    name: str
    manifest_uid: int
    scope_id: int
    collection_id: int | None
    stream_id: int | None = None


@dataclass(frozen=True, slots=True)
class SeqnoAdvanced:
    """The stream moved to `by_seqno` with no item the consumer sees (filtered collections)."""

    vbucket: int
    by_seqno: int
    stream_id: int | None = None


@dataclass(frozen=True, slots=True)
class OsoSnapshot:
    """Start or end of an out-of-sequence-order backfill snapshot."""

    vbucket: int
    flags: OsoFlags
    stream_id: int | None = None


@dataclass(frozen=True, slots=True)
class StreamEnd:
    """The producer closed the vbucket's stream."""

    vbucket: int
    reason: StreamEndReason
    stream_id: int | None = None


@dataclass(frozen=True, slots=True)
class StreamOpened:
    """A stream request succeeded; `failover_log` is the producer's log for the vbucket."""

    vbucket: int
    failover_log: FailoverLog


@dataclass(frozen=True, slots=True)
class RollbackRequired:
    """The producer answered a stream request with ROLLBACK to `rollback_seqno` (from the value)."""

    vbucket: int
    rollback_seqno: int


XATTRS_TYPE = pa.list_(
    pa.struct([pa.field("name", pa.string(), nullable=False), pa.field("value", pa.string())])
)

DOCUMENT_CHANGE_SCHEMA = pa.schema(
    [
        pa.field("opcode", pa.uint8(), nullable=False),
        pa.field("by_seqno", pa.uint64(), nullable=False),
        pa.field("rev_seqno", pa.uint64(), nullable=False),
        pa.field("cas", pa.uint64(), nullable=False),
        pa.field("flags", pa.uint32(), nullable=False),
        pa.field("expiration", pa.uint32(), nullable=False),
        pa.field("lock_time", pa.uint32(), nullable=False),
        pa.field("delete_time", pa.uint32(), nullable=False),
        pa.field("collection_id", pa.uint32(), nullable=False),
        pa.field("key", pa.binary(), nullable=False),
        pa.field("value", pa.binary(), nullable=False),
        pa.field("is_json", pa.bool_(), nullable=False),
        pa.field("xattrs", XATTRS_TYPE),
    ]
)
"""One row per data message, the fields of Mutation / Deletion / Expiration side by side.

`opcode` tells which (0x57 mutation, 0x58 deletion, 0x59 expiration). Fields a kind lacks are
0 (or empty, or false); `xattrs` is null when the document has none.
"""

MUTATION_OPCODE = int(Opcode.DCP_MUTATION)
DELETION_OPCODE = int(Opcode.DCP_DELETION)
EXPIRATION_OPCODE = int(Opcode.DCP_EXPIRATION)


@dataclass(frozen=True, slots=True)
class RunSummary:
    """What the layers above ask of a run before they look at its rows.

    Seqnos first and last in stream order, lowest and highest; whether they strictly ascend;
    how many rows are mutations; the bytes of the keys and values.
    """

    first_seqno: int
    last_seqno: int
    low_seqno: int
    high_seqno: int
    ascending: bool
    mutations: int
    data_bytes: int


@dataclass(frozen=True, slots=True)
class DocumentChanges:
    """Consecutive data messages of one vbucket's stream, column by column.

    The connection hands mutations, deletions and expirations up this way (one Arrow batch per
    socket read, sliced per vbucket) instead of one object per message: see
    `replicator.dcp.protocol.columnar`. `columns` has DOCUMENT_CHANGE_SCHEMA, one row per message in
    stream order (the snapshot assembler checks their seqnos), at least one row: rows
    `offset` .. `offset + length` of `batch`, the batch of the whole socket read, which bulk
    readers take rows from for many runs at once. `summary` is computed for all runs of a read
    at once. `events()` gives the same messages as typed events, for readers that want them one
    by one.
    """

    vbucket: int
    batch: pa.RecordBatch
    offset: int
    length: int
    summary: RunSummary
    stream_id: int | None = None

    @property
    def columns(self) -> pa.RecordBatch:
        """The run's own rows."""
        return self.batch.slice(self.offset, self.length)

    def __len__(self) -> int:
        return self.length

    def events(self) -> Iterator[Mutation | Deletion | Expiration]:
        """The messages as typed events, in stream order."""
        vbucket, stream_id = self.vbucket, self.stream_id
        for row in self.columns.to_pylist():
            opcode = row["opcode"]
            xattrs = tuple((x["name"], x["value"]) for x in row["xattrs"] or ())
            if opcode == MUTATION_OPCODE:
                yield Mutation(
                    vbucket,
                    row["by_seqno"],
                    row["rev_seqno"],
                    row["cas"],
                    row["flags"],
                    row["expiration"],
                    row["lock_time"],
                    row["collection_id"],
                    row["key"],
                    row["value"],
                    row["is_json"],
                    xattrs,
                    stream_id,
                )
            else:
                removal = (vbucket, row["by_seqno"], row["rev_seqno"], row["cas"],
                           row["collection_id"], row["key"], row["delete_time"])  # fmt: skip
                if opcode == DELETION_OPCODE:
                    yield Deletion(*removal, xattrs, stream_id)
                else:
                    yield Expiration(*removal, stream_id)


ItemEvent = Mutation | Deletion | Expiration | SystemEvent | SeqnoAdvanced
"""Events that carry a seqno and so can complete a snapshot."""

StreamEvent = (
    SnapshotMarker
    | DocumentChanges
    | Mutation
    | Deletion
    | Expiration
    | SystemEvent
    | SeqnoAdvanced
    | OsoSnapshot
    | StreamEnd
    | StreamOpened
    | RollbackRequired
)
"""Everything a vbucket stream can hand up, in per-vbucket order."""
