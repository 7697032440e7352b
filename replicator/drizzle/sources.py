"""Where Drizzle Transaction messages come from: a transaction log file or a RabbitMQ queue.

Both give messages with a position (the entry's byte offset in the log, the delivery tag on
the queue) and are told, after each group commit, through which position everything is
settled (`settle`): the queue acknowledges through it; the log needs nothing, since the group
journal records the offset to resume from. `Settlement` works out that position: the longest
run of messages, in arrival order, whose transactions are all committed, rolled back or
redeliveries.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from google.protobuf.message import DecodeError

from replicator.drizzle.amqp.consumer import DEFAULT_PREFETCH, TransactionConsumer
from replicator.drizzle.amqp.source import AmqpSource
from replicator.drizzle.errors import MalformedTransactionError
from replicator.drizzle.log import LogEntry, TransactionLogReader, missing_required_fields
from replicator.drizzle.proto.transaction_pb2 import Transaction
from replicator.errors import ConfigError, ReplicatorError

LOG_SCHEME = "drizzle-log"
AMQP_SCHEME = "drizzle+amqp"


class UnreadableMessage(ReplicatorError):
    """A queued message that is not a Transaction; it stays unacknowledged on the queue."""


@dataclass(frozen=True, slots=True)
class SourceMessage:
    message: Transaction
    position: int
    size: int


class MessageSource(Protocol):
    """A stream of Transaction messages in the order the producer sent them."""

    name: str
    resumable_by_offset: bool
    """True: positions are offsets, and a restart resumes at one (the log). False: the source
    gives back everything not settled by itself (the queue)."""
    finite: bool
    """True: once `next` returned None, nothing more will come (a log not followed)."""

    def open(self, resume_from: int | None) -> None: ...

    def next(self, timeout_s: float) -> SourceMessage | None: ...

    def next_position(self) -> int | None:
        """Where the message after the last one read starts (the log), None for the queue."""
        ...

    def settle(self, through: int) -> None: ...

    def close(self) -> None: ...


class Settlement:
    """Which messages are settled: every message up to a position whose transaction is done.

    >>> settlement = Settlement()
    >>> for position, transaction in ((1, 7), (2, 8), (3, 7)):
    ...     settlement.arrived(position, transaction)
    >>> settlement.finish([8]); settlement.settle()
    >>> settlement.finish([7]); settlement.settle()
    3
    """

    def __init__(self) -> None:
        self._queue: deque[tuple[int, int | None]] = deque()
        self._waiting: dict[int, int] = {}
        """Messages in the queue per transaction."""
        self._finished: set[int] = set()

    def arrived(self, position: int, transaction_id: int | None) -> None:
        """A message at `position`; `transaction_id` None when it needs nothing (a redelivery)."""
        self._queue.append((position, transaction_id))
        if transaction_id is not None:
            self._waiting[transaction_id] = self._waiting.get(transaction_id, 0) + 1

    def finish(self, transaction_ids: Iterable[int]) -> None:
        self._finished.update(transaction_ids)

    def settle(self) -> int | None:
        """The last position of the settled run, popped; None when nothing more is settled."""
        last = None
        while self._queue:
            position, transaction_id = self._queue[0]
            if transaction_id is not None and transaction_id not in self._finished:
                break
            self._queue.popleft()
            last = position
            if transaction_id is not None:
                # Its last settled message: nothing refers to the id any more.
                self._waiting[transaction_id] -= 1
                if not self._waiting[transaction_id]:
                    del self._waiting[transaction_id]
                    self._finished.discard(transaction_id)
        return last

    @property
    def transactions_held(self) -> int:
        """Transactions the settlement still remembers (bounded by the unsettled messages)."""
        return len(self._waiting.keys() | self._finished)

    def oldest_unsettled(self) -> int | None:
        return self._queue[0][0] if self._queue else None


def parse_source(url: str) -> tuple[str, str]:
    """The kind ('log' or 'amqp') and location of a Drizzle source URL."""
    if url.startswith(f"{LOG_SCHEME}://"):
        path = url[len(f"{LOG_SCHEME}://"):]
        if not path.startswith("/"):
            raise ConfigError(
                f"a {LOG_SCHEME} source names an absolute path: {LOG_SCHEME}:///path/to/log "
                f"(three slashes), not {url!r}"
            )
        return "log", path
    if url.startswith(f"{AMQP_SCHEME}://"):
        return "amqp", url
    raise ConfigError(f"not a Drizzle source: expected {LOG_SCHEME}:///PATH or {AMQP_SCHEME}://")


def is_drizzle_source(url: str) -> bool:
    return url.startswith((f"{LOG_SCHEME}://", f"{AMQP_SCHEME}://"))


class LogFileSource:
    """A Drizzle transaction log, read from an offset; with `follow`, waits for more."""

    resumable_by_offset = True

    def __init__(self, path: Path | str, *, follow: bool = False, poll_s: float = 0.2) -> None:
        self.path = Path(path)
        self.name = f"{LOG_SCHEME}://{self.path}"
        self.follow = follow
        self.finite = not follow
        self.poll_s = poll_s
        self._reader: TransactionLogReader | None = None
        self._entries: Iterator[LogEntry] | None = None

    def open(self, resume_from: int | None) -> None:
        if not self.path.is_file():
            raise ConfigError(
                f"transaction log {self.path} does not exist or is not a file; check the path "
                f"in --source {LOG_SCHEME}:///PATH"
            )
        self._reader = TransactionLogReader(self.path, start_offset=resume_from or 0)
        self._entries = iter(self._reader)

    def next(self, timeout_s: float) -> SourceMessage | None:
        assert self._reader is not None and self._entries is not None
        deadline = time.monotonic() + timeout_s
        while True:
            entry = next(self._entries, None)
            if entry is not None:
                size = entry.end_offset - entry.offset
                return SourceMessage(entry.transaction, entry.offset, size)
            if not self.follow or time.monotonic() >= deadline:
                # Read again from where the reader stopped next time (the log may grow).
                self._entries = iter(self._reader)
                return None
            time.sleep(min(self.poll_s, max(0.0, deadline - time.monotonic())))
            self._entries = iter(self._reader)

    def next_position(self) -> int | None:
        return None if self._reader is None else self._reader.end_offset

    def settle(self, through: int) -> None:
        return None

    def close(self) -> None:
        self._reader = None
        self._entries = None


class QueueSource:
    """A RabbitMQ queue of serialized Transaction messages, acknowledged once settled."""

    resumable_by_offset = False
    finite = False

    def __init__(self, source: AmqpSource, *, prefetch: int = DEFAULT_PREFETCH) -> None:
        self.source = source
        self.name = str(source)
        self.consumer = TransactionConsumer(source, prefetch=prefetch)

    def open(self, resume_from: int | None) -> None:
        self.consumer.connect()

    def next(self, timeout_s: float) -> SourceMessage | None:
        delivery = self.consumer.next_delivery(timeout_s)
        if delivery is None:
            if self.consumer.window_full:
                raise ReplicatorError(
                    f"{self.source}: {self.consumer.prefetch} messages are unacknowledged and "
                    "none can be until an open transaction's last segment arrives; raise the "
                    "prefetch (drizzle_prefetch) above the segments of the largest transaction"
                )
            return None
        message = Transaction()
        try:
            message.ParseFromString(delivery.body)
        except DecodeError as error:
            raise MalformedTransactionError(
                0, None,
                f"message with delivery tag {delivery.delivery_tag} on {self.source} does not "
                f"parse as a Transaction ({error}); it stays on the queue unacknowledged",
            ) from None
        missing = missing_required_fields(message)
        if missing:
            raise MalformedTransactionError(
                message.transaction_context.transaction_id if message.HasField(
                    "transaction_context") else 0,
                None,
                f"message with delivery tag {delivery.delivery_tag} lacks required fields "
                f"{', '.join(missing)}; it stays on the queue unacknowledged",
            )
        return SourceMessage(message, delivery.delivery_tag, len(delivery.body))

    def next_position(self) -> int | None:
        return None

    def settle(self, through: int) -> None:
        self.consumer.ack_through(through)

    def close(self) -> None:
        self.consumer.close()
