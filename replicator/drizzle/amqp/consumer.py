"""`TransactionConsumer`: the queue consumed with manual acknowledgements, as `Delivery`s whose
tags only grow over the consumer's life (see the package's docstring)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import pika  # type: ignore[import-untyped]

from replicator.drizzle.amqp.connection import (
    ConnectionSettings,
    channel_error,
    close_quietly,
    connection_lost,
    open_channel,
)
from replicator.drizzle.amqp.errors import QueueNotFoundError
from replicator.drizzle.amqp.source import AmqpSource

DEFAULT_PREFETCH = 8192
"""Unacknowledged deliveries the broker may have out to one consumer. Acknowledgements wait for
the Delta commit, so the window must hold every message from the oldest uncommitted one to the
last segment of the largest open transaction: a bulk transaction of more segments can never
complete (see `TransactionConsumer.window_full`). RabbitMQ's largest is 65535."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """One message from the queue.

    `delivery_tag` grows over the consumer's life, across reconnects (see the module's
    docstring): pass it to `ack_through`, and to the assembler as the message's position.
    `redelivered`: the broker sent it before, to this or another consumer, unacknowledged.
    """

    delivery_tag: int
    body: bytes
    redelivered: bool


class TransactionConsumer:
    """Consumes the queue with manual acknowledgements; acknowledges only through `ack_through`.

    At most `prefetch` deliveries are unacknowledged at a time: the broker sends no more until
    some are acknowledged. Use from one thread, and call `next_delivery` at least once per
    heartbeat interval (see `ConnectionSettings`).

    >>> with TransactionConsumer(source) as consumer:  # doctest: +SKIP
    ...     for delivery in consumer.deliveries(idle_timeout_s=1.0):
    ...         message = Transaction.FromString(delivery.body)
    ...         assembler.feed(message, position=delivery.delivery_tag)
    ...     # ... commit what completed, then:
    ...     oldest_open = assembler.oldest_open_position()
    ...     consumer.ack_through(delivery.delivery_tag if oldest_open is None else oldest_open - 1)
    """

    def __init__(
        self,
        source: AmqpSource,
        *,
        prefetch: int = DEFAULT_PREFETCH,
        settings: ConnectionSettings | None = None,
    ) -> None:
        if not 0 < prefetch <= 65535:
            raise ValueError(f"prefetch {prefetch} must be between 1 and 65535")
        self.source = source
        self.prefetch = prefetch
        self.settings = settings or ConnectionSettings()
        self._connection: Any = None
        self._channel: Any = None
        self._pending: deque[Delivery] = deque()
        self._cancelled = False
        # Tags handed out are the channel's tags plus _offset; _offset moves past every tag
        # handed out whenever a new channel starts numbering from 1 again.
        self._offset = 0
        self._last_tag = 0
        """The highest tag handed out (or taken in and pending)."""
        self._acked_channel_tag = 0
        """On the current channel: every delivery up to this channel tag is acknowledged."""
        self.connections = 0
        """Connections opened over the consumer's life (1 after the first `connect`)."""

    @property
    def connected(self) -> bool:
        return self._channel is not None

    @property
    def unacknowledged(self) -> int:
        """Deliveries received on the current connection and not acknowledged yet."""
        if self._channel is None:
            return 0
        return self._last_tag - self._offset - self._acked_channel_tag

    @property
    def window_full(self) -> bool:
        """The broker will send nothing more until something is acknowledged. If what is
        unacknowledged cannot be (an open transaction waits for later segments), the stream is
        stuck: the prefetch is too small for that transaction."""
        return self.unacknowledged >= self.prefetch

    def connect(self) -> TransactionConsumer:
        """(Re)connect and start consuming. Everything unacknowledged before is redelivered."""
        self.close()
        self._connection, self._channel = open_channel(self.source, self.settings, self._prepare)
        self._offset = self._last_tag
        self._acked_channel_tag = 0
        self._cancelled = False
        self.connections += 1
        return self

    def _prepare(self, channel: Any) -> None:
        try:
            # Passive: a replica never creates the queue, so a typo is an error, not an
            # empty queue waited on forever.
            channel.queue_declare(self.source.queue, passive=True)
        except pika.exceptions.ChannelClosedByBroker as error:
            channel_error(error, self.source, "consume from")
        channel.basic_qos(prefetch_count=self.prefetch)
        channel.add_on_cancel_callback(self._on_cancel)
        try:
            channel.basic_consume(self.source.queue, self._on_message, auto_ack=False)
        except pika.exceptions.ChannelClosedByBroker as error:
            channel_error(error, self.source, "consume from")

    def next_delivery(self, timeout_s: float = 0.0) -> Delivery | None:
        """The next message, waiting up to `timeout_s` for one; None if none came."""
        if self._channel is None:
            self.connect()
        deadline = time.monotonic() + timeout_s
        while not self._pending:
            self._check_cancelled()
            remaining = deadline - time.monotonic()
            try:
                self._connection.process_data_events(time_limit=max(remaining, 0.0))
            except pika.exceptions.ChannelClosedByBroker as error:
                self.close()  # the connection outlives its channel: do not leak it
                channel_error(error, self.source, "consume from")
            except (pika.exceptions.AMQPConnectionError, pika.exceptions.AMQPChannelError) as e:
                self.close()
                raise connection_lost(self.source, e) from None
            if remaining <= 0:
                break
        self._check_cancelled()
        return self._pending.popleft() if self._pending else None

    def deliveries(self, *, idle_timeout_s: float) -> Iterator[Delivery]:
        """Messages as they come, until none came for `idle_timeout_s`."""
        while (delivery := self.next_delivery(idle_timeout_s)) is not None:
            yield delivery

    def ack_through(self, delivery_tag: int) -> int:
        """Acknowledge every delivery up to and including `delivery_tag` (one cumulative ack);
        return how many that acknowledged.

        Acknowledging again through a tag already acknowledged, or through one handed out on a
        connection since closed (those messages were redelivered under new tags), does nothing.
        A tag not handed out yet is an error: it would acknowledge what nobody has seen.
        """
        if delivery_tag > self._last_tag - len(self._pending):
            raise ValueError(
                f"delivery tag {delivery_tag} was not handed out yet (the last one was "
                f"{self._last_tag - len(self._pending)}): acknowledge only what was received"
            )
        if self._channel is None:
            return 0
        channel_tag = delivery_tag - self._offset
        if channel_tag <= self._acked_channel_tag:
            return 0
        try:
            self._channel.basic_ack(delivery_tag=channel_tag, multiple=True)
        except (pika.exceptions.AMQPConnectionError, pika.exceptions.AMQPChannelError) as error:
            self.close()
            raise connection_lost(self.source, error) from None
        count = channel_tag - self._acked_channel_tag
        self._acked_channel_tag = channel_tag
        return count

    def close(self) -> None:
        """Close the connection; unacknowledged messages go back to the queue."""
        connection = self._connection
        self._drop()
        if connection is not None:
            close_quietly(connection)

    def _drop(self) -> None:
        # Deliveries taken in but not handed out are redelivered after a reconnect; forget
        # them so that no tag of theirs is ever handed out.
        self._last_tag -= len(self._pending)
        self._pending.clear()
        self._connection = self._channel = None

    def _on_message(self, channel: Any, method: Any, properties: Any, body: bytes) -> None:
        tag = self._offset + int(method.delivery_tag)
        self._last_tag = tag
        self._pending.append(Delivery(tag, body, bool(method.redelivered)))

    def _on_cancel(self, frame: Any) -> None:
        self._cancelled = True

    def _check_cancelled(self) -> None:
        if self._cancelled and not self._pending:
            self.close()
            raise QueueNotFoundError(
                self.source.node,
                f"the broker cancelled the consumer of {self.source.where()} (the queue was "
                "deleted?): recreate the queue and connect again; unacknowledged messages of a "
                "deleted queue are gone",
                queue=self.source.queue,
            )

    def __enter__(self) -> TransactionConsumer:
        return self.connect()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
