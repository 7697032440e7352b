"""Drizzle's transaction log file: entries framed as Drizzle's transaction_log plugin writes them.

The layout, from Drizzle's plugin/transaction_log/transaction_log.cc
(`TransactionLog::packTransactionIntoLogEntry`, last in the tree before commit 70fad3737
"Remove dead plugins") and its reader, plugin/transaction_log/utilities/transaction_file_reader.cc
(`TransactionFileReader::getNextTransaction`)::

    offset  size  field
    0       4     entry type, uint32 little-endian: 1 = Transaction message
                  (ReplicationServices::TRANSACTION, drizzled/replication_services.h; 2 = BLOB
                  is declared there but never written)
    4       4     length N of the message, uint32 little-endian
    8       N     the serialized drizzled.message.Transaction
    8+N     4     checksum, uint32 little-endian: CRC-32 of the N message bytes only
                  (drizzled/algorithm/crc32.h: reflected polynomial 0xEDB88320, initial value
                  and final xor 0xFFFFFFFF, the same as zlib's crc32), or 0 when the server ran
                  without --transaction-log.enable-checksum (the default)

All integers are little-endian (protobuf's WriteLittleEndian32ToArray; the source's comment
"network byte order" is wrong). Entries follow one another with nothing between them; the file
has no header. Drizzle writes each entry with one pwrite, so a server killed mid-write leaves a
prefix of the entry at the end of the file: that is a truncated tail, not corruption.
"""

from __future__ import annotations

import enum
import os
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from google.protobuf.message import DecodeError, Message

from replicator.drizzle.errors import CorruptLogEntry, IncompleteLogError
from replicator.drizzle.proto.transaction_pb2 import Transaction

ENTRY_TYPE_TRANSACTION = 1
ENTRY_TYPE_BLOB = 2
HEADER_BYTES = 8
CHECKSUM_BYTES = 4
FRAMING_BYTES = HEADER_BYTES + CHECKSUM_BYTES
# Drizzle's reader refuses longer messages (transaction_file_reader.cc: "bigger than INT_MAX").
MAX_MESSAGE_BYTES = 2**31 - 1

_HEADER = struct.Struct("<II")
_CHECKSUM = struct.Struct("<I")


class Checksums(enum.Enum):
    """How a reader treats each entry's checksum trailer."""

    REQUIRED = "required"
    """Every trailer must be the CRC-32 of its message: for logs written with checksums on."""

    WHEN_PRESENT = "when_present"
    """A trailer of 0 means "written without checksums" (Drizzle's default); any other value
    must match. A message whose real CRC-32 is 0 (one in 2**32) is then not verified."""

    IGNORED = "ignored"
    """Trailers are not looked at."""


def missing_required_fields(message: Message) -> list[str]:
    """Paths of the required fields `message` lacks (protobuf's parser does not check them)."""
    if message.IsInitialized():
        return []
    # Present at run time, missing from protobuf's type stubs.
    find: Callable[[], list[str]] = getattr(message, "FindInitializationErrors")  # noqa: B009
    return find()


def checksum(message_bytes: bytes) -> int:
    """Drizzle's entry checksum: CRC-32 (zlib's) of the serialized message."""
    return zlib.crc32(message_bytes) & 0xFFFFFFFF


def encode_entry(message_bytes: bytes, *, with_checksum: bool = True) -> bytes:
    """Frame one serialized Transaction as a log entry, byte for byte as Drizzle writes it.

    >>> encode_entry(b"\\x0a\\x00", with_checksum=False).hex()
    '01000000020000000a0000000000'
    """
    if len(message_bytes) > MAX_MESSAGE_BYTES:
        raise ValueError(
            f"a {len(message_bytes)}-byte message is longer than a log entry can hold "
            f"({MAX_MESSAGE_BYTES} bytes)"
        )
    trailer = checksum(message_bytes) if with_checksum else 0
    return (
        _HEADER.pack(ENTRY_TYPE_TRANSACTION, len(message_bytes))
        + message_bytes
        + _CHECKSUM.pack(trailer)
    )


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One Transaction read from a log: it occupies bytes [offset, end_offset) of the file."""

    offset: int
    end_offset: int
    transaction: Transaction


@dataclass(frozen=True, slots=True)
class TruncatedTail:
    """The log ends inside an entry that starts at `offset`: a write still under way, or cut
    short by a crash. `present` bytes of it are in the file; `expected` is its full size when
    its header was complete (None when even the header is cut)."""

    offset: int
    present: int
    expected: int | None


class TransactionLogReader:
    """Reads a Drizzle transaction log entry by entry, from `start_offset` (an entry boundary).

    Iterating yields `LogEntry`s and raises `CorruptLogEntry` (naming the offset) for an entry
    with a bad type, length or checksum, or a message that does not parse. A log that ends
    inside an entry ends the iteration quietly: `truncated_tail` then describes it, and
    `end_offset` is where it starts, the offset to read from again once the writer has finished
    it. With `require_complete=True` it raises `IncompleteLogError` instead (for a log that no
    one writes any more). Iterating again resumes at `end_offset`: that is how to follow a
    log that is still being written.

    >>> import io
    >>> reader = TransactionLogReader(io.BytesIO(b"\\x01\\x00"), name="demo")
    >>> list(reader), reader.end_offset, reader.truncated_tail
    ([], 0, TruncatedTail(offset=0, present=2, expected=None))
    """

    def __init__(
        self,
        source: Path | str | BinaryIO,
        *,
        start_offset: int = 0,
        checksums: Checksums = Checksums.WHEN_PRESENT,
        require_complete: bool = False,
        name: str | None = None,
    ) -> None:
        if start_offset < 0:
            raise ValueError(f"start offset {start_offset} is negative")
        self._source = source
        self._name = name or (str(source) if isinstance(source, Path | str) else "<stream>")
        self._checksums = checksums
        self._require_complete = require_complete
        self.end_offset = start_offset
        """Offset just past the last complete entry read (where reading would resume)."""
        self.truncated_tail: TruncatedTail | None = None

    def __iter__(self) -> Iterator[LogEntry]:
        if isinstance(self._source, Path | str):
            with open(self._source, "rb") as stream:
                yield from self._entries(stream)
        else:
            yield from self._entries(self._source)

    def _entries(self, stream: BinaryIO) -> Iterator[LogEntry]:
        stream.seek(self.end_offset)
        self.truncated_tail = None
        while True:
            offset = self.end_offset
            header = _read_up_to(stream, HEADER_BYTES)
            if len(header) < HEADER_BYTES:
                if header:
                    self._tail(offset, header, None)
                return
            entry_type, length = _HEADER.unpack(header)
            self._check_header(offset, entry_type, length)
            body = _read_up_to(stream, length + CHECKSUM_BYTES)
            if len(body) < length + CHECKSUM_BYTES:
                self._tail(offset, header + body, length + FRAMING_BYTES)
                return
            message_bytes = body[:length]
            (trailer,) = _CHECKSUM.unpack_from(body, length)
            self._check_checksum(offset, message_bytes, trailer)
            transaction = self._parse(offset, message_bytes)
            self.end_offset = offset + FRAMING_BYTES + length
            yield LogEntry(offset, self.end_offset, transaction)

    def _check_header(self, offset: int, entry_type: int, length: int) -> None:
        if entry_type == ENTRY_TYPE_TRANSACTION:
            if length > MAX_MESSAGE_BYTES:
                raise CorruptLogEntry(
                    self._name,
                    offset,
                    f"length {length} is more than a log entry can hold ({MAX_MESSAGE_BYTES})",
                )
            return
        if entry_type == ENTRY_TYPE_BLOB:
            detail = "type 2 (BLOB): Drizzle declares it but never writes it; not supported"
        elif entry_type == 0 and length == 0:
            detail = (
                "type 0 and length 0: zeros where an entry should start (a write that never "
                "completed, before a later one did?)"
            )
        else:
            detail = f"unknown entry type {entry_type} (expected 1, a Transaction)"
        raise CorruptLogEntry(self._name, offset, detail)

    def _check_checksum(self, offset: int, message_bytes: bytes, trailer: int) -> None:
        if self._checksums is Checksums.IGNORED:
            return
        if trailer == 0 and self._checksums is Checksums.WHEN_PRESENT:
            return
        computed = checksum(message_bytes)
        if computed != trailer:
            raise CorruptLogEntry(
                self._name,
                offset,
                f"checksum 0x{trailer:08x} is not the CRC-32 0x{computed:08x} of its "
                f"{len(message_bytes)}-byte message; every entry before this offset was intact",
            )

    def _parse(self, offset: int, message_bytes: bytes) -> Transaction:
        transaction = Transaction()
        try:
            transaction.ParseFromString(message_bytes)
        except DecodeError as error:
            raise CorruptLogEntry(
                self._name, offset, f"the {len(message_bytes)}-byte message does not parse: {error}"
            ) from error
        missing = missing_required_fields(transaction)
        if missing:
            raise CorruptLogEntry(
                self._name, offset, f"the message lacks required fields: {', '.join(missing)}"
            )
        return transaction

    def _tail(self, offset: int, present: bytes, expected: int | None) -> None:
        # A cut entry still starts with type 1: anything else there was never an entry.
        if len(present) >= 4:
            (entry_type,) = struct.unpack_from("<I", present)
            if entry_type != ENTRY_TYPE_TRANSACTION:
                self._check_header(offset, entry_type, 0)
        self.truncated_tail = TruncatedTail(offset, len(present), expected)
        if self._require_complete:
            wanted = "an 8-byte header" if expected is None else f"{expected} bytes"
            raise IncompleteLogError(
                self._name,
                offset,
                f"the log ends after {len(present)} bytes of an entry of {wanted} "
                "(a writer killed mid-entry; truncate the file at this offset to repair it)",
            )


def _read_up_to(stream: BinaryIO, size: int) -> bytes:
    """`size` bytes, or fewer only at the end of the stream (raw streams may return less)."""
    data = stream.read(size)
    while len(data) < size:
        more = stream.read(size - len(data))
        if not more:
            break
        data += more
    return data


def read_transaction_log(
    source: Path | str | BinaryIO,
    *,
    start_offset: int = 0,
    checksums: Checksums = Checksums.WHEN_PRESENT,
) -> Iterator[LogEntry]:
    """Every complete entry from `start_offset`; raises `IncompleteLogError` on a cut tail.

    For a log that is still being written, use `TransactionLogReader` and its `truncated_tail`.
    """
    reader = TransactionLogReader(
        source, start_offset=start_offset, checksums=checksums, require_complete=True
    )
    yield from reader


class TransactionLogWriter:
    """Appends Transaction messages to a log file with Drizzle's framing.

    Each entry goes to the file in one write, as Drizzle's does, so a writer killed mid-entry
    leaves a prefix of it: a `TruncatedTail` for readers, never a corrupt entry. With `fsync`
    each append is durable before it returns (Drizzle's flush-frequency=1).

    >>> import io
    >>> from replicator.drizzle.proto.transaction_pb2 import Transaction
    >>> stream = io.BytesIO()
    >>> message = Transaction()
    >>> message.transaction_context.server_id = 1
    >>> TransactionLogWriter(stream).append_bytes(message.SerializePartialToString())
    0
    """

    def __init__(
        self, target: Path | str | BinaryIO, *, with_checksum: bool = True, fsync: bool = False
    ) -> None:
        self._owned = isinstance(target, Path | str)
        # Held open for the writer's life and closed by close() / the with block.
        self._stream: BinaryIO = (
            open(target, "ab")  # noqa: SIM115
            if isinstance(target, Path | str)
            else target
        )
        self._with_checksum = with_checksum
        self._fsync = fsync
        self._stream.seek(0, os.SEEK_END)
        self.offset = self._stream.tell()
        """Where the next entry will start."""

    def append(self, transaction: Transaction) -> int:
        """Write one entry; return the offset it starts at. The message must be complete."""
        missing = missing_required_fields(transaction)
        if missing:
            raise ValueError(f"the Transaction lacks required fields: {', '.join(missing)}")
        return self.append_bytes(transaction.SerializeToString())

    def append_bytes(self, message_bytes: bytes) -> int:
        """Write one entry holding an already serialized Transaction; return its offset."""
        entry = encode_entry(message_bytes, with_checksum=self._with_checksum)
        offset = self.offset
        self._stream.write(entry)
        self._stream.flush()
        if self._fsync:
            os.fsync(self._stream.fileno())
        self.offset += len(entry)
        return offset

    def close(self) -> None:
        if self._owned:
            self._stream.close()

    def __enter__(self) -> TransactionLogWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
