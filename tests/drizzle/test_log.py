"""Drizzle's transaction log framing: golden bytes, round trips, corruption and cut tails."""

from __future__ import annotations

import io
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicator.drizzle.errors import CorruptLogEntry, IncompleteLogError
from replicator.drizzle.log import (
    Checksums,
    TransactionLogReader,
    TransactionLogWriter,
    TruncatedTail,
    checksum,
    encode_entry,
    read_transaction_log,
)
from replicator.drizzle.proto.transaction_pb2 import Transaction
from tests.drizzle.messages import insert_messages, setup_messages

# TransactionContext{server_id 1, transaction_id 2, start 3, end 4}, segment_id 1, end_segment
# true, encoded by hand: field 1 length-delimited (0x0a, 8 bytes: 08 01 10 02 18 03 20 04),
# field 4 varint (0x20 01), field 5 varint (0x28 01).
MESSAGE = bytes.fromhex("0a08080110021803200420012801")
# type 1 (LE) | length 14 (LE) | message | CRC-32 0x7065b8a1 (LE)
ENTRY = bytes.fromhex("010000000e000000") + MESSAGE + bytes.fromhex("a1b86570")


def crc_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0xEDB88320 if crc & 1 else crc >> 1
        table.append(crc)
    return table


def drizzle_crc32(data: bytes) -> int:
    """Drizzle's drizzled/algorithm/crc32.h loop, written out independently of zlib."""
    table = crc_table()
    crc = 0xFFFFFFFF
    for byte in data:
        crc = (crc >> 8) ^ table[(crc ^ byte) & 0xFF]
    return ~crc & 0xFFFFFFFF


def test_the_crc_is_drizzles() -> None:
    table = crc_table()
    # Entries 1, 2, 3, 128 and 255 of crc32tab in drizzled/algorithm/crc32.h.
    assert [table[i] for i in (1, 2, 3, 128, 255)] == [
        0x77073096,
        0xEE0E612C,
        0x990951BA,
        0xEDB88320,
        0x2D02EF8D,
    ]
    assert drizzle_crc32(b"123456789") == checksum(b"123456789") == 0xCBF43926


def test_message_bytes_are_the_hand_encoded_ones() -> None:
    message = Transaction(segment_id=1, end_segment=True)
    context = message.transaction_context
    context.server_id, context.transaction_id = 1, 2
    context.start_timestamp, context.end_timestamp = 3, 4
    assert message.SerializeToString() == MESSAGE


def test_entry_golden_bytes() -> None:
    assert checksum(MESSAGE) == drizzle_crc32(MESSAGE) == 0x7065B8A1
    assert encode_entry(MESSAGE) == ENTRY
    # Without checksums Drizzle writes a zero trailer.
    assert encode_entry(MESSAGE, with_checksum=False) == ENTRY[:-4] + b"\x00\x00\x00\x00"


def test_writer_writes_the_golden_entry_and_reader_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "transaction.log"
    with TransactionLogWriter(path) as writer:
        assert writer.append(Transaction.FromString(MESSAGE)) == 0
        assert writer.offset == len(ENTRY)
    assert path.read_bytes() == ENTRY
    (entry,) = read_transaction_log(path)
    assert (entry.offset, entry.end_offset) == (0, len(ENTRY))
    assert entry.transaction.transaction_context.transaction_id == 2


@settings(max_examples=40, deadline=None)
@given(st.lists(st.binary(max_size=300), min_size=1, max_size=8), st.booleans())
def test_round_trip_any_messages(payloads: list[bytes], with_checksum: bool) -> None:
    messages = []
    for number, payload in enumerate(payloads):
        message = Transaction(segment_id=number + 1, end_segment=True)
        context = message.transaction_context
        context.server_id, context.transaction_id = 7, 100 + number
        context.start_timestamp = context.end_timestamp = len(payload)
        message.statement.add(type=99, start_timestamp=1, end_timestamp=2, sql=payload.hex())
        messages.append(message)
    stream = io.BytesIO()
    writer = TransactionLogWriter(stream, with_checksum=with_checksum)
    offsets = [writer.append(message) for message in messages]
    policy = Checksums.REQUIRED if with_checksum else Checksums.WHEN_PRESENT
    entries = list(read_transaction_log(io.BytesIO(stream.getvalue()), checksums=policy))
    assert [entry.transaction for entry in entries] == messages
    assert [entry.offset for entry in entries] == offsets
    assert entries[-1].end_offset == len(stream.getvalue())


def _log(*messages: Transaction) -> bytes:
    return b"".join(encode_entry(message.SerializeToString()) for message in messages)


def test_reading_resumes_at_an_offset_and_follows_a_growing_log(tmp_path: Path) -> None:
    path = tmp_path / "transaction.log"
    first, second = setup_messages()
    third = insert_messages(3, range(3))[0]
    path.write_bytes(_log(first))
    reader = TransactionLogReader(path)
    assert [entry.transaction for entry in reader] == [first]
    resume = reader.end_offset
    # The writer appends the next entry in two writes; the reader sees the cut tail first.
    entry = encode_entry(second.SerializeToString())
    with open(path, "ab") as log:
        log.write(entry[:10])
    reader = TransactionLogReader(path, start_offset=resume)
    assert list(reader) == []
    assert reader.truncated_tail == TruncatedTail(resume, 10, len(entry))
    assert reader.end_offset == resume
    with open(path, "ab") as log:
        log.write(entry[10:] + encode_entry(third.SerializeToString()))
    reader = TransactionLogReader(path, start_offset=resume)
    assert [e.transaction for e in reader] == [second, third]
    assert reader.truncated_tail is None
    # The same reader, iterated again, follows the log from where it stopped.
    fourth = insert_messages(4, range(2))[0]
    with open(path, "ab") as log:
        log.write(encode_entry(fourth.SerializeToString()))
    assert [e.transaction for e in reader] == [fourth]
    assert reader.end_offset == path.stat().st_size


def test_every_cut_of_the_last_entry_is_a_truncated_tail_not_corruption() -> None:
    first, second = setup_messages()
    whole = _log(first, second)
    boundary = len(_log(first))
    for cut in range(boundary + 1, len(whole)):
        reader = TransactionLogReader(io.BytesIO(whole[:cut]), checksums=Checksums.REQUIRED)
        assert [entry.transaction for entry in reader] == [first], cut
        tail = reader.truncated_tail
        assert tail is not None and tail.offset == boundary and tail.present == cut - boundary
        assert tail.expected == (None if cut - boundary < 8 else len(whole) - boundary)
        with pytest.raises(IncompleteLogError, match=f"offset {boundary}"):
            list(read_transaction_log(io.BytesIO(whole[:cut])))


def test_a_flipped_byte_in_a_message_is_a_checksum_error_naming_the_offset() -> None:
    first, second = setup_messages()
    data = bytearray(_log(first, second))
    offset = len(_log(first))
    data[offset + 8 + 3] ^= 0x01
    reader = TransactionLogReader(io.BytesIO(bytes(data)), name="t.log")
    entries = iter(reader)
    assert next(entries).transaction == first  # the intact entry before it still comes out
    with pytest.raises(CorruptLogEntry, match=f"t.log: entry at offset {offset}: checksum") as info:
        next(entries)
    assert info.value.offset == offset


def test_checksum_policies() -> None:
    message = setup_messages()[0].SerializeToString()
    unchecked = encode_entry(message, with_checksum=False)
    wrong = unchecked[:-4] + (checksum(message) ^ 1).to_bytes(4, "little")
    assert len(list(read_transaction_log(io.BytesIO(unchecked)))) == 1  # WHEN_PRESENT
    with pytest.raises(CorruptLogEntry, match="checksum 0x00000000"):
        list(read_transaction_log(io.BytesIO(unchecked), checksums=Checksums.REQUIRED))
    with pytest.raises(CorruptLogEntry, match="checksum"):
        list(read_transaction_log(io.BytesIO(wrong)))
    assert len(list(read_transaction_log(io.BytesIO(wrong), checksums=Checksums.IGNORED))) == 1


@pytest.mark.parametrize(
    ("header", "match"),
    [
        (b"\x02\x00\x00\x00\x00\x00\x00\x00", "type 2 \\(BLOB\\)"),
        (b"\x07\x00\x00\x00\x01\x00\x00\x00", "unknown entry type 7"),
        (b"\x00" * 8, "zeros where an entry should start"),
        (b"\x01\x00\x00\x00\xff\xff\xff\xff", "more than a log entry can hold"),
    ],
)
def test_bad_headers_are_corruption(header: bytes, match: str) -> None:
    first = setup_messages()[0]
    data = _log(first) + header + b"\x00" * 64
    with pytest.raises(CorruptLogEntry, match=match) as info:
        list(read_transaction_log(io.BytesIO(data)))
    assert info.value.offset == len(_log(first))


def test_a_cut_tail_that_does_not_start_like_an_entry_is_corruption() -> None:
    first = setup_messages()[0]
    with pytest.raises(CorruptLogEntry, match="unknown entry type 9"):
        list(TransactionLogReader(io.BytesIO(_log(first) + b"\x09\x00\x00\x00\x05")))


def test_unparseable_and_incomplete_messages_are_corruption() -> None:
    garbage = b"\xff\xff\xff"
    with pytest.raises(CorruptLogEntry, match="does not parse"):
        list(read_transaction_log(io.BytesIO(encode_entry(garbage))))
    # Parses, but lacks Drizzle's required fields (protobuf's parser does not check them).
    partial = Transaction()
    partial.transaction_context.server_id = 1
    data = encode_entry(partial.SerializePartialToString())
    with pytest.raises(CorruptLogEntry, match=r"transaction_context\.transaction_id"):
        list(read_transaction_log(io.BytesIO(data)))


def test_writer_refuses_an_incomplete_message() -> None:
    partial = Transaction()
    with pytest.raises(ValueError, match="lacks required fields"):
        TransactionLogWriter(io.BytesIO()).append(partial)


def test_writer_appends_after_existing_entries(tmp_path: Path) -> None:
    path = tmp_path / "transaction.log"
    first, second = setup_messages()
    with TransactionLogWriter(path) as writer:
        writer.append(first)
    with TransactionLogWriter(path, fsync=True) as writer:
        assert writer.offset == len(_log(first))
        writer.append(second)
    assert [e.transaction for e in read_transaction_log(path)] == [first, second]
    assert zlib.crc32(path.read_bytes()) == zlib.crc32(_log(first, second))
