"""Transaction assembly: Drizzle Transaction messages in, complete transactions out.

The Drizzle counterpart of the DCP snapshot assembler. A transaction arrives as one or more
messages (segments) with the same transaction id, `segment_id` 1, 2, ... and `end_segment` true
on the last; it is handed out only once that last segment arrived, and dropped whole when a
ROLLBACK arrives instead. Segments of different transactions may interleave (Drizzle sends a
bulk transaction's segments while other sessions commit), so several may be open at once.

Duplicates, as AMQP redelivers them, are recognised by ids alone:

- a segment of an open transaction whose segment id is at or below the last one accepted;
- any message of a transaction already completed or rolled back: `CompletedIdTracker` remembers
  the ids of the last `window` finished transactions exactly, and treats every id at or below
  its floor (the ids it forgot, or a checkpoint's) as finished.

Errors (each a `TransactionStreamError` naming the transaction; the assembler is left as it
was before the message): a segment past the next one due (a gap), a first message that is not
segment 1 (unless it is a ROLLBACK), a new transaction whose id lies between the floor and the
highest finished id without being one of them (an id going backwards: see
`allow_late_commits`), an unknown statement type, and malformed content.

Memory: every open transaction's segments are kept in a `SegmentStore` until it completes;
`buffered_bytes` and `open_transactions()` say how much, so that the layer above can supply a
store that spills (the assembler only appends, reads back in order once, and drops).
The assembler is pure state: no I/O, no clock.
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain
from typing import Protocol

from replicator.drizzle.changes import CompleteTransaction
from replicator.drizzle.decode import (
    SegmentCheck,
    SegmentChecker,
    decode_transaction,
    segment_numbers,
    unknown_statement_type,
)
from replicator.drizzle.errors import (
    MalformedTransactionError,
    SegmentGapError,
    TransactionOrderError,
    TransactionStreamError,
    UnknownStatementError,
)
from replicator.drizzle.log import missing_required_fields
from replicator.drizzle.proto.transaction_pb2 import Statement, Transaction

DEFAULT_DEDUP_WINDOW = 4096


class IdVerdict(enum.Enum):
    """What a transaction id not currently open is, to a CompletedIdTracker."""

    NEW = "new"
    FINISHED = "finished"
    """Completed or rolled back before (or at or below the floor): a redelivery."""
    BELOW_HIGH = "below_high"
    """Above the floor, below the highest finished id, and not finished: out of id order."""


@dataclass(frozen=True, slots=True)
class CompletedIds:
    """Which transaction ids are finished, as a checkpoint stores it.

    Every id at or below `floor` is finished, and so is every id in `recent` (all above the
    floor); `high` is the highest finished id. None everywhere: nothing finished yet.
    """

    high: int | None = None
    floor: int | None = None
    recent: tuple[int, ...] = ()

    @classmethod
    def up_to(cls, transaction_id: int) -> CompletedIds:
        """Every id up to `transaction_id` finished: a checkpoint of a producer whose ids grow."""
        return cls(high=transaction_id, floor=transaction_id)


class CompletedIdTracker:
    """The finished transaction ids, exact for the last `window` of them.

    When more than `window` ids are held, the lowest is forgotten and becomes the floor: from
    then on every id at or below it counts as finished.

    >>> tracker = CompletedIdTracker(window=2)
    >>> for transaction_id in (5, 7, 9):
    ...     tracker.add(transaction_id)
    >>> [tracker.classify(i).value for i in (4, 5, 6, 7, 10)]
    ['finished', 'finished', 'below_high', 'finished', 'new']
    """

    def __init__(
        self, start: CompletedIds | None = None, *, window: int = DEFAULT_DEDUP_WINDOW
    ) -> None:
        if window < 1:
            raise ValueError(f"dedup window {window} must be at least 1")
        start = start or CompletedIds()
        self._window = window
        self._high = start.high
        self._floor = start.floor
        self._recent = set(start.recent)
        self._heap = list(self._recent)
        heapq.heapify(self._heap)
        self._evict()

    def classify(self, transaction_id: int) -> IdVerdict:
        if transaction_id in self._recent:
            return IdVerdict.FINISHED
        if self._floor is not None and transaction_id <= self._floor:
            return IdVerdict.FINISHED
        if self._high is None or transaction_id > self._high:
            return IdVerdict.NEW
        return IdVerdict.BELOW_HIGH

    def add(self, transaction_id: int) -> None:
        """Mark a transaction finished (completed and handed out, or rolled back)."""
        if self._floor is not None and transaction_id <= self._floor:
            return
        if transaction_id not in self._recent:
            self._recent.add(transaction_id)
            heapq.heappush(self._heap, transaction_id)
        if self._high is None or transaction_id > self._high:
            self._high = transaction_id
        self._evict()

    def snapshot(self) -> CompletedIds:
        return CompletedIds(self._high, self._floor, tuple(sorted(self._recent)))

    def _evict(self) -> None:
        while len(self._recent) > self._window:
            oldest = heapq.heappop(self._heap)
            self._recent.discard(oldest)
            self._floor = oldest if self._floor is None else max(self._floor, oldest)


class SegmentStore(Protocol):
    """Where an open transaction's segments wait. The assembler appends each accepted segment,
    reads a transaction's segments back in order when it completes (again, should decoding
    them have failed), and then drops them; it drops them unread on a rollback or `discard`.
    A store that spills to disk keeps memory bounded while a very large transaction is open:
    `TransactionAssembler.buffered_bytes` says when to."""

    def append(self, transaction_id: int, segment: Transaction) -> None: ...

    def segments(self, transaction_id: int) -> Iterable[Transaction]: ...

    def drop(self, transaction_id: int) -> None: ...


class MemorySegmentStore:
    """Keeps segments in memory (the default store)."""

    def __init__(self) -> None:
        self._segments: dict[int, list[Transaction]] = {}

    def append(self, transaction_id: int, segment: Transaction) -> None:
        self._segments.setdefault(transaction_id, []).append(segment)

    def segments(self, transaction_id: int) -> Iterable[Transaction]:
        return tuple(self._segments.get(transaction_id, ()))

    def drop(self, transaction_id: int) -> None:
        self._segments.pop(transaction_id, None)


class SkipReason(enum.Enum):
    SEGMENT_ALREADY_SEEN = "segment already accepted (redelivery)"
    TRANSACTION_FINISHED = "transaction already completed or rolled back (redelivery)"
    TRANSACTION_DISCARDED = "transaction discarded after an error"


@dataclass(frozen=True, slots=True)
class SegmentBuffered:
    """A segment accepted; its transaction waits for more. `transaction_bytes` is the size of
    all its buffered segments so far."""

    transaction_id: int
    segment_id: int
    transaction_bytes: int
    position: int | None = None


@dataclass(frozen=True, slots=True)
class TransactionCompleted:
    """A transaction's last segment arrived: apply `transaction`. `positions` are the ones
    given with its segments, in order (a file's offsets, a queue's delivery tags)."""

    transaction: CompleteTransaction
    positions: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class TransactionRolledBack:
    """A ROLLBACK arrived: the transaction's `segments_dropped` buffered segments are gone."""

    transaction_id: int
    server_id: int
    segments_dropped: int
    positions: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class MessageSkipped:
    """A message not applied, for `reason`; it is safe to acknowledge."""

    transaction_id: int
    segment_id: int
    reason: SkipReason
    position: int | None = None


FeedResult = SegmentBuffered | TransactionCompleted | TransactionRolledBack | MessageSkipped


@dataclass(frozen=True, slots=True)
class OpenTransaction:
    """A transaction some of whose segments arrived, waiting for its last."""

    transaction_id: int
    segments: int
    byte_size: int
    first_position: int | None


@dataclass(slots=True)
class _Open:
    transaction_id: int
    server_id: int
    checker: SegmentChecker
    segment_ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    byte_size: int = 0
    first_position: int | None = None

    @property
    def last_segment(self) -> int:
        return self.segment_ids[-1]


class TransactionAssembler:
    """Assembles one server's Transaction messages, fed in the order they were sent.

    >>> from replicator.drizzle.encode import TransactionBuilder
    >>> builder = TransactionBuilder(server_id=1, transaction_id=7, timestamp=1_000)
    >>> builder.create_schema("shop")
    >>> assembler = TransactionAssembler()
    >>> [type(assembler.feed(message)).__name__ for message in builder.messages()]
    ['TransactionCompleted']

    `completed` restores the finished ids from a checkpoint (see `CompletedIds`).
    `allow_late_commits` accepts a new transaction whose id is below ones already finished:
    Drizzle numbers a transaction at its first change and sends it at commit, so with
    concurrent sessions a transaction may commit after one with a higher id. Off, such an id
    is a `TransactionOrderError`. On, a transaction committing more than `dedup_window`
    transactions late is taken for a redelivery: keep the window above the number of
    transactions that can commit while one stays open.
    """

    def __init__(
        self,
        *,
        completed: CompletedIds | None = None,
        store: SegmentStore | None = None,
        allow_late_commits: bool = False,
        dedup_window: int = DEFAULT_DEDUP_WINDOW,
        server_id: int | None = None,
    ) -> None:
        self._finished = CompletedIdTracker(completed, window=dedup_window)
        self._store: SegmentStore = store if store is not None else MemorySegmentStore()
        self._allow_late_commits = allow_late_commits
        self._server_id = server_id
        self._open: dict[int, _Open] = {}
        self._discarded: set[int] = set()
        self._buffered_bytes = 0

    @property
    def buffered_bytes(self) -> int:
        """Serialized size of every open transaction's buffered segments."""
        return self._buffered_bytes

    def open_transactions(self) -> tuple[OpenTransaction, ...]:
        """The open transactions, oldest first segment first."""
        return tuple(
            OpenTransaction(
                entry.transaction_id, len(entry.segment_ids), entry.byte_size, entry.first_position
            )
            for entry in self._open.values()
        )

    def oldest_open_position(self) -> int | None:
        """The position of the oldest open transaction's first segment (None: none open or
        no positions given): a source must resume at or before it to see that transaction
        again after a restart, and may acknowledge everything before it once committed."""
        positions = [
            entry.first_position
            for entry in self._open.values()
            if entry.first_position is not None
        ]
        return min(positions) if positions else None

    def completed_ids(self) -> CompletedIds:
        """The ids of every transaction handed out or rolled back so far."""
        return self._finished.snapshot()

    def feed(self, message: Transaction, *, position: int | None = None) -> FeedResult:
        """Take the next message; say what became of it. Raises TransactionStreamError."""
        self._check_complete(message)
        context = message.transaction_context
        self._check_server(context.transaction_id, context.server_id)
        result = self._feed(message, position)
        self._server_id = context.server_id
        return result

    def _feed(self, message: Transaction, position: int | None) -> FeedResult:
        context = message.transaction_context
        transaction_id = context.transaction_id
        entry = self._open.get(transaction_id)
        if entry is not None:
            return self._continue(entry, message, position)
        segment_id, is_last = segment_numbers(message, None)
        if transaction_id in self._discarded:
            return MessageSkipped(
                transaction_id, segment_id, SkipReason.TRANSACTION_DISCARDED, position
            )
        verdict = self._finished.classify(transaction_id)
        if verdict is IdVerdict.FINISHED:
            return MessageSkipped(
                transaction_id, segment_id, SkipReason.TRANSACTION_FINISHED, position
            )
        if verdict is IdVerdict.BELOW_HIGH and not self._allow_late_commits:
            snapshot = self._finished.snapshot()
            raise TransactionOrderError(
                transaction_id,
                segment_id,
                f"a new transaction whose id is below transaction {snapshot.high}, already "
                "finished, and not a redelivery of a finished one: the producer's ids went "
                "backwards (a producer with concurrent sessions commits out of id order: give it "
                "TransactionAssembler(allow_late_commits=True))",
            )
        if segment_id != 1 and not _rolls_back(message):
            raise SegmentGapError(
                transaction_id,
                segment_id,
                f"is the first message seen of the transaction: segments 1..{segment_id - 1} "
                "never arrived",
            )
        checker = SegmentChecker(transaction_id)
        check = checker.check(message, segment_id, is_last=is_last)
        if check.rolls_back:
            # Whatever segments it sent before are not here (nor wanted): nothing to drop.
            self._finished.add(transaction_id)
            return TransactionRolledBack(
                transaction_id, context.server_id, 0, _positions([], position)
            )
        entry = _Open(transaction_id, context.server_id, checker)
        if is_last:
            return self._complete(entry, message, segment_id, position)
        return self._buffer(entry, message, segment_id, check, position)

    def discard(self, transaction_id: int) -> None:
        """Drop a transaction (after an error in it): its buffered segments go, and its later
        messages are skipped (SkipReason.TRANSACTION_DISCARDED)."""
        entry = self._open.pop(transaction_id, None)
        if entry is not None:
            self._buffered_bytes -= entry.byte_size
            self._store.drop(transaction_id)
        self._discarded.add(transaction_id)

    def _continue(self, entry: _Open, message: Transaction, position: int | None) -> FeedResult:
        transaction_id = entry.transaction_id
        segment_id, is_last = segment_numbers(message, entry.last_segment)
        if segment_id <= entry.last_segment:
            return MessageSkipped(
                transaction_id, segment_id, SkipReason.SEGMENT_ALREADY_SEEN, position
            )
        if segment_id != entry.last_segment + 1:
            raise SegmentGapError(
                transaction_id,
                segment_id,
                f"arrived after segment {entry.last_segment}: segments "
                f"{entry.last_segment + 1}..{segment_id - 1} are missing",
            )
        check = entry.checker.check(message, segment_id, is_last=is_last)
        if check.rolls_back:
            self._forget(entry)
            self._finished.add(transaction_id)
            return TransactionRolledBack(
                transaction_id,
                entry.server_id,
                len(entry.segment_ids),
                _positions(entry.positions, position),
            )
        if is_last:
            return self._complete(entry, message, segment_id, position)
        return self._buffer(entry, message, segment_id, check, position)

    def _buffer(
        self,
        entry: _Open,
        message: Transaction,
        segment_id: int,
        check: SegmentCheck,
        position: int | None,
    ) -> SegmentBuffered:
        self._store.append(entry.transaction_id, message)
        size = message.ByteSize()
        entry.checker.accept(check)
        entry.segment_ids.append(segment_id)
        entry.byte_size += size
        if position is not None:
            entry.positions.append(position)
            if entry.first_position is None:
                entry.first_position = position
        self._buffered_bytes += size
        self._open[entry.transaction_id] = entry
        return SegmentBuffered(entry.transaction_id, segment_id, entry.byte_size, position)

    def _complete(
        self, entry: _Open, message: Transaction, segment_id: int, position: int | None
    ) -> TransactionCompleted:
        earlier: Iterator[Transaction] | tuple[Transaction, ...] = ()
        if entry.segment_ids:
            earlier = iter(self._store.segments(entry.transaction_id))
        # Decoded before anything changes, so that a bad value leaves the assembler as it was.
        transaction = decode_transaction(
            chain(earlier, (message,)), segment_ids=[*entry.segment_ids, segment_id]
        )
        self._forget(entry)
        self._finished.add(entry.transaction_id)
        return TransactionCompleted(transaction, _positions(entry.positions, position))

    def _forget(self, entry: _Open) -> None:
        if self._open.pop(entry.transaction_id, None) is not None:
            self._buffered_bytes -= entry.byte_size
            self._store.drop(entry.transaction_id)

    def _check_complete(self, message: Transaction) -> None:
        missing = missing_required_fields(message)
        if not missing:
            return
        transaction_id = message.transaction_context.transaction_id
        segment_id = message.segment_id if message.HasField("segment_id") else None
        for index, statement in enumerate(message.statement):
            number = unknown_statement_type(statement)
            if number is not None:
                raise UnknownStatementError(
                    transaction_id,
                    segment_id,
                    f"statement {index}: unknown statement type {number} (this replicator "
                    f"knows {', '.join(Statement.Type.keys())})",
                )
        raise MalformedTransactionError(
            transaction_id, segment_id, f"lacks required fields: {', '.join(missing)}"
        )

    def _check_server(self, transaction_id: int, server_id: int) -> None:
        if self._server_id is not None and server_id != self._server_id:
            raise TransactionStreamError(
                transaction_id,
                None,
                f"comes from server {server_id}, in a stream of server {self._server_id}'s "
                "transactions: transaction ids are per server, so assemble each server's "
                "stream with an assembler of its own",
            )


def _rolls_back(message: Transaction) -> bool:
    return any(
        statement.HasField("type") and statement.type == Statement.ROLLBACK
        for statement in message.statement
    )


def _positions(earlier: list[int], last: int | None) -> tuple[int, ...]:
    return (*earlier, last) if last is not None else tuple(earlier)
