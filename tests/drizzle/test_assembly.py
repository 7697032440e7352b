"""Transaction assembly: segments, rollbacks, duplicates, gaps, order, bad statements."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from replicator.drizzle.assembly import (
    CompletedIds,
    CompletedIdTracker,
    IdVerdict,
    MessageSkipped,
    SegmentBuffered,
    SkipReason,
    TransactionAssembler,
    TransactionCompleted,
    TransactionRolledBack,
)
from replicator.drizzle.changes import (
    CreateSchema,
    CreateTable,
    DeleteRows,
    InsertRows,
    ServerEvent,
    UpdateRows,
)
from replicator.drizzle.errors import (
    MalformedTransactionError,
    SegmentGapError,
    TransactionOrderError,
    TransactionStreamError,
    UnknownStatementError,
)
from replicator.drizzle.proto.event_pb2 import Event
from replicator.drizzle.proto.transaction_pb2 import Statement, Transaction
from replicator.drizzle.schema import Column, ColumnType
from tests.drizzle.messages import (
    ITEMS,
    builder,
    insert_messages,
    rollback_message,
    setup_messages,
)


def completed(result: object) -> TransactionCompleted:
    assert isinstance(result, TransactionCompleted), result
    return result


def feed_all(assembler: TransactionAssembler, messages: Iterable[Transaction]) -> list[object]:
    return [assembler.feed(message) for message in messages]


def inserted_ids(result: TransactionCompleted) -> list[object]:
    return [
        row[0]
        for change in result.transaction.changes
        if isinstance(change, InsertRows)
        for row in change.rows
    ]


def test_a_one_message_transaction_completes_with_typed_changes() -> None:
    assembler = TransactionAssembler()
    schema, table = (completed(r) for r in feed_all(assembler, setup_messages()))
    assert schema.transaction.changes == (CreateSchema("shop"),)
    assert table.transaction.changes == (CreateTable(ITEMS),)
    (message,) = insert_messages(3, range(1, 3))
    result = completed(assembler.feed(message, position=40))
    transaction = result.transaction
    assert (transaction.transaction_id, transaction.server_id, transaction.segment_count) == (
        3,
        1,
        1,
    )
    assert transaction.commit_timestamp == message.transaction_context.end_timestamp
    assert transaction.changes == (
        InsertRows(
            ITEMS.name,
            tuple(spec.column for spec in ITEMS.columns),
            ((1, "item 1", 10), (2, "item 2", 20)),
        ),
    )
    assert result.positions == (40,)
    assert assembler.completed_ids() == CompletedIds(high=3, recent=(1, 2, 3))


def test_a_bulk_transaction_is_held_until_its_last_segment() -> None:
    messages = insert_messages(5, range(200), segment_bytes=512)
    assert len(messages) > 3
    assembler = TransactionAssembler()
    for position, message in enumerate(messages[:-1]):
        result = assembler.feed(message, position=100 + position)
        assert isinstance(result, SegmentBuffered)
        assert result.segment_id == position + 1
    held = sum(message.ByteSize() for message in messages[:-1])
    assert assembler.buffered_bytes == held
    (open_transaction,) = assembler.open_transactions()
    assert (open_transaction.transaction_id, open_transaction.segments) == (5, len(messages) - 1)
    assert assembler.oldest_open_position() == 100
    result = completed(assembler.feed(messages[-1], position=999))
    assert inserted_ids(result) == list(range(200))
    (change,) = result.transaction.changes  # one statement in many data segments: one batch
    assert isinstance(change, InsertRows)
    assert result.transaction.segment_count == len(messages)
    assert result.transaction.byte_size == held + messages[-1].ByteSize()
    assert result.positions == (*range(100, 100 + len(messages) - 1), 999)
    assert assembler.buffered_bytes == 0
    assert assembler.oldest_open_position() is None


def test_a_rollback_drops_a_bulk_transaction_whole_and_its_redelivery_is_skipped() -> None:
    messages = insert_messages(5, range(200), segment_bytes=512)[:-1]
    assembler = TransactionAssembler()
    feed_all(assembler, messages)
    rollback = rollback_message(5, len(messages) + 1)
    result = assembler.feed(rollback, position=7)
    assert result == TransactionRolledBack(5, 1, len(messages), (7,))
    assert assembler.buffered_bytes == 0 and assembler.open_transactions() == ()
    for message in (*messages, rollback):
        skipped = assembler.feed(message)
        assert isinstance(skipped, MessageSkipped)
        assert skipped.reason is SkipReason.TRANSACTION_FINISHED


def test_drizzles_own_rollback_messages_from_the_builder() -> None:
    build = builder(8, segment_bytes=400)
    build.insert(ITEMS, [{"id": n, "name": "x", "qty": n} for n in range(100)])
    messages = build.rollback_messages()
    assert messages[-1].statement[0].type == Statement.ROLLBACK
    assert messages[-1].segment_id == len(messages)
    results = feed_all(TransactionAssembler(), messages)
    assert all(isinstance(result, SegmentBuffered) for result in results[:-1])
    assert results[-1] == TransactionRolledBack(8, 1, len(messages) - 1)
    # A rolled-back transaction that never sent a segment sends nothing at all.
    small = builder(9)
    small.insert(ITEMS, [{"id": 1, "name": "x", "qty": 1}])
    assert small.rollback_messages() == ()


def test_a_cancelled_segmented_statement_drops_only_its_rows() -> None:
    build = builder(4, segment_bytes=400)
    build.insert(ITEMS, [{"id": n, "name": "kept", "qty": n} for n in range(50)])
    build.insert(ITEMS, [{"id": 1000 + n, "name": "failed", "qty": n} for n in range(50)])
    build.cancel_statement()
    build.delete(ITEMS, [(3,), (4,)])
    messages = build.messages()
    types = [statement.type for message in messages for statement in message.statement]
    assert Statement.ROLLBACK_STATEMENT in types
    result = completed(feed_all(TransactionAssembler(), messages)[-1])
    assert inserted_ids(result) == list(range(50))
    assert result.transaction.changes[-1] == DeleteRows(
        ITEMS.name, (Column("id", ColumnType.INTEGER),), ((3,), (4,))
    )


def test_redelivered_segments_of_an_open_transaction_are_skipped() -> None:
    messages = insert_messages(5, range(120), segment_bytes=512)
    assert len(messages) >= 3
    assembler = TransactionAssembler()
    # An AMQP consumer lost its channel after two segments: the broker redelivers both.
    feed_all(assembler, messages[:2])
    for message in messages[:2]:
        skipped = assembler.feed(message)
        assert skipped == MessageSkipped(5, message.segment_id, SkipReason.SEGMENT_ALREADY_SEEN)
    results = feed_all(assembler, messages[2:])
    assert inserted_ids(completed(results[-1])) == list(range(120))


def test_a_whole_transaction_redelivered_is_applied_once() -> None:
    assembler = TransactionAssembler()
    first = feed_all(assembler, setup_messages())
    again = feed_all(assembler, setup_messages())
    assert all(isinstance(result, TransactionCompleted) for result in first)
    assert [result.reason for result in again] == [SkipReason.TRANSACTION_FINISHED] * 2  # type: ignore[attr-defined]


def test_transactions_at_or_below_a_checkpoint_are_skipped() -> None:
    assembler = TransactionAssembler(completed=CompletedIds.up_to(10))
    (old,) = insert_messages(10, range(1))
    (new,) = insert_messages(11, range(1))
    skipped = assembler.feed(old)
    assert isinstance(skipped, MessageSkipped)
    assert skipped.reason is SkipReason.TRANSACTION_FINISHED
    assert isinstance(assembler.feed(new), TransactionCompleted)


def test_a_segment_gap_is_an_error_and_changes_nothing() -> None:
    messages = insert_messages(6, range(120), segment_bytes=512)
    assembler = TransactionAssembler()
    assembler.feed(messages[0])
    with pytest.raises(
        SegmentGapError, match=r"transaction 6 segment 3: .*segments 2\.\.2 are"
    ) as info:
        assembler.feed(messages[2])
    assert (info.value.transaction_id, info.value.segment_id) == (6, 3)
    results = feed_all(assembler, messages[1:])
    assert inserted_ids(completed(results[-1])) == list(range(120))


def test_a_transaction_first_seen_at_segment_two_is_a_gap() -> None:
    messages = insert_messages(6, range(120), segment_bytes=512)
    with pytest.raises(SegmentGapError, match=r"segments 1\.\.1 never arrived"):
        TransactionAssembler().feed(messages[1])


def test_an_id_going_backwards_is_an_error_unless_late_commits_are_allowed() -> None:
    strict = TransactionAssembler()
    feed_all(strict, [*insert_messages(5, range(1)), *insert_messages(7, range(1, 2))])
    (late,) = insert_messages(6, range(2, 3))
    with pytest.raises(
        TransactionOrderError, match=r"transaction 6 segment 1: .*below transaction 7"
    ):
        strict.feed(late)
    assert strict.completed_ids().high == 7
    relaxed = TransactionAssembler(allow_late_commits=True)
    feed_all(relaxed, [*insert_messages(5, range(1)), *insert_messages(7, range(1, 2))])
    assert isinstance(relaxed.feed(late), TransactionCompleted)
    skipped = relaxed.feed(late)
    assert isinstance(skipped, MessageSkipped)


def test_interleaved_transactions_complete_independently() -> None:
    first = insert_messages(10, range(0, 80), segment_bytes=512)
    second = insert_messages(11, range(100, 180), segment_bytes=512)
    stream = [first[0], second[0], *first[1:-1], *second[1:], first[-1]]
    assembler = TransactionAssembler()
    results = [assembler.feed(message, position=p) for p, message in enumerate(stream)]
    done = [result for result in results if isinstance(result, TransactionCompleted)]
    assert [result.transaction.transaction_id for result in done] == [11, 10]
    assert inserted_ids(done[0]) == list(range(100, 180))
    assert inserted_ids(done[1]) == list(range(80))
    assert done[1].positions[0] == 0


def test_an_unknown_statement_type_is_an_error_not_a_rollback() -> None:
    (message,) = insert_messages(3, range(1))
    message.statement[0].type = Statement.RAW_SQL
    message.statement[0].sql = "x"
    raw = bytearray(message.SerializeToString())
    # Statement.type is field 1 of the statement: patch RAW_SQL (99) to 50.
    raw[raw.index(bytes([0x08, 99])) + 1] = 50
    unknown = Transaction.FromString(bytes(raw))
    assembler = TransactionAssembler()
    with pytest.raises(
        UnknownStatementError,
        match="transaction 3 segment 1: statement 0: unknown statement type 50",
    ):
        assembler.feed(unknown)
    assert assembler.completed_ids() == CompletedIds()


def test_mismatched_records_are_malformed() -> None:
    (message,) = insert_messages(3, range(2))
    del message.statement[0].insert_data.record[1].insert_value[-1]
    with pytest.raises(
        MalformedTransactionError, match=r"record 1 on shop\.items has 2 insert_value"
    ):
        TransactionAssembler().feed(message)


def test_a_bad_value_leaves_the_transaction_open_until_discarded() -> None:
    messages = list(insert_messages(3, range(100), segment_bytes=512))
    messages[-1].statement[0].insert_data.record[0].insert_value[0] = b"not a number"
    assembler = TransactionAssembler()
    feed_all(assembler, messages[:-1])
    with pytest.raises(
        MalformedTransactionError, match=r"shop\.items column id: INTEGER value 'not a number'"
    ):
        assembler.feed(messages[-1])
    assert [entry.transaction_id for entry in assembler.open_transactions()] == [3]
    assembler.discard(3)
    assert assembler.buffered_bytes == 0
    skipped = assembler.feed(messages[0])
    assert isinstance(skipped, MessageSkipped)
    assert skipped.reason is SkipReason.TRANSACTION_DISCARDED
    assert isinstance(assembler.feed(insert_messages(4, range(1))[0]), TransactionCompleted)


def test_a_transaction_may_not_end_inside_a_segmented_statement() -> None:
    messages = insert_messages(3, range(100), segment_bytes=512)
    cut = Transaction()
    cut.CopyFrom(messages[0])
    cut.end_segment = True
    with pytest.raises(
        MalformedTransactionError, match=r"inside a segmented INSERT on shop\.items"
    ):
        TransactionAssembler().feed(cut)


def test_messages_of_another_server_are_refused() -> None:
    assembler = TransactionAssembler()
    (first,) = insert_messages(3, range(1))
    (other,) = insert_messages(4, range(1))
    other.transaction_context.server_id = 2
    assembler.feed(first)
    with pytest.raises(TransactionStreamError, match="comes from server 2"):
        assembler.feed(other)


def test_updates_name_old_and_new_keys() -> None:
    build = builder(3)
    build.update(ITEMS, [((1,), {"id": 5, "name": None})])
    change = completed(TransactionAssembler().feed(build.messages()[0])).transaction.changes[0]
    assert isinstance(change, UpdateRows)
    assert change.keys == ((1,),) and change.values == ((5, None),)
    assert change.new_key(0) == (5,)


def test_messages_without_transaction_segment_fields_rabbitreplications_format() -> None:
    messages = insert_messages(3, range(100), segment_bytes=512)
    for message in messages:
        message.ClearField("segment_id")
        message.ClearField("end_segment")
    assembler = TransactionAssembler()
    results = feed_all(assembler, messages)
    assert all(isinstance(result, SegmentBuffered) for result in results[:-1])
    assert inserted_ids(completed(results[-1])) == list(range(100))


def test_a_server_event_is_a_transaction_without_changes() -> None:
    message = Transaction(segment_id=1, end_segment=True)
    context = message.transaction_context
    context.server_id, context.transaction_id = 1, 3
    context.start_timestamp = context.end_timestamp = 1
    message.event.type = Event.STARTUP
    transaction = completed(TransactionAssembler().feed(message)).transaction
    assert transaction.event is ServerEvent.STARTUP and transaction.changes == ()


class RecordingStore:
    """A store that keeps segments serialized, as one spilling to disk would."""

    def __init__(self) -> None:
        self.spilled: dict[int, list[bytes]] = {}
        self.calls: list[str] = []

    def append(self, transaction_id: int, segment: Transaction) -> None:
        self.calls.append(f"append {transaction_id}")
        self.spilled.setdefault(transaction_id, []).append(segment.SerializeToString())

    def segments(self, transaction_id: int) -> Iterable[Transaction]:
        self.calls.append(f"read {transaction_id}")
        return (Transaction.FromString(data) for data in self.spilled[transaction_id])

    def drop(self, transaction_id: int) -> None:
        self.calls.append(f"drop {transaction_id}")
        self.spilled.pop(transaction_id, None)


def test_segments_wait_in_the_given_store() -> None:
    store = RecordingStore()
    assembler = TransactionAssembler(store=store)
    messages = insert_messages(3, range(100), segment_bytes=512)
    results = feed_all(assembler, messages)
    assert inserted_ids(completed(results[-1])) == list(range(100))
    appends = len(messages) - 1
    assert store.calls == [*["append 3"] * appends, "read 3", "drop 3"]
    assert store.spilled == {}


def test_the_tracker_forgets_into_its_floor() -> None:
    tracker = CompletedIdTracker(window=3)
    for transaction_id in (2, 4, 6, 8):
        tracker.add(transaction_id)
    assert tracker.snapshot() == CompletedIds(high=8, floor=2, recent=(4, 6, 8))
    assert tracker.classify(1) is IdVerdict.FINISHED
    assert tracker.classify(5) is IdVerdict.BELOW_HIGH
    assert tracker.classify(9) is IdVerdict.NEW
    restored = CompletedIdTracker(tracker.snapshot(), window=3)
    assert restored.snapshot() == tracker.snapshot()
