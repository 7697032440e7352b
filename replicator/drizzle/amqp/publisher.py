"""`TransactionPublisher`: serialized Transaction messages to a durable queue, persistent and
each confirmed by the broker."""

from __future__ import annotations

from collections.abc import Iterable
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
from replicator.drizzle.amqp.errors import PublishError
from replicator.drizzle.amqp.source import AmqpSource

CONTENT_TYPE = "application/x-protobuf"
MESSAGE_TYPE = "drizzle.message.Transaction"


class TransactionPublisher:
    """Publishes serialized Transaction messages to a durable queue, each confirmed by the broker.

    `publish` returns once the broker has confirmed the message: it is routed to the queue and,
    being persistent on a durable queue, written to disk. Use from one thread (pika's
    connections are not thread-safe).

    >>> with TransactionPublisher(source) as publisher:  # doctest: +SKIP
    ...     publisher.publish_all(Workload(WorkloadSettings(seed=1)).serialized(100))
    """

    def __init__(self, source: AmqpSource, *, settings: ConnectionSettings | None = None) -> None:
        self.source = source
        self.settings = settings or ConnectionSettings()
        self._connection: Any = None
        self._channel: Any = None
        self.published = 0
        """Messages confirmed over the publisher's life."""

    def connect(self) -> TransactionPublisher:
        """Connect, declare the queue durable (if it is not there yet), enter confirm mode."""
        self.close()
        self._connection, self._channel = open_channel(self.source, self.settings, self._prepare)
        return self

    def _prepare(self, channel: Any) -> None:
        try:
            channel.queue_declare(self.source.queue, durable=True)
        except pika.exceptions.ChannelClosedByBroker as error:
            channel_error(error, self.source, "declare")
        channel.confirm_delivery()

    def publish(self, body: bytes) -> None:
        """Publish one message, persistent; return once the broker confirmed it.

        After a BrokerConnectionLost the message may or may not be in the queue: publish it
        again (on the next call, which reconnects); the replica skips the duplicate.
        """
        if self._channel is None:
            self.connect()
        properties = pika.BasicProperties(
            delivery_mode=pika.DeliveryMode.Persistent,
            content_type=CONTENT_TYPE,
            type=MESSAGE_TYPE,
        )
        try:
            # mandatory: a message the broker cannot route (the queue was deleted) comes back
            # as an error instead of vanishing with a positive confirm.
            self._channel.basic_publish(
                "", self.source.queue, body, properties=properties, mandatory=True
            )
        except pika.exceptions.UnroutableError:
            raise PublishError(
                self.source.node,
                f"the broker could not route a message to {self.source.where()} (was the "
                "queue deleted?): nothing was published; reconnect to declare it again",
            ) from None
        except pika.exceptions.NackError:
            raise PublishError(
                self.source.node,
                f"the broker refused a message for {self.source.where()} (nack: a queue "
                "length limit, or an internal error; see the broker's log); publish it again",
            ) from None
        except pika.exceptions.ChannelClosedByBroker as error:
            self.close()  # the connection outlives its channel: do not leak it
            channel_error(error, self.source, "publish to")
        except (pika.exceptions.AMQPConnectionError, pika.exceptions.AMQPChannelError) as error:
            self.close()
            raise connection_lost(self.source, error) from None
        self.published += 1

    def publish_all(self, bodies: Iterable[bytes]) -> int:
        """Publish each body in order (each confirmed); return how many."""
        count = 0
        for body in bodies:
            self.publish(body)
            count += 1
        return count

    def close(self) -> None:
        connection = self._connection
        self._drop()
        if connection is not None:
            close_quietly(connection)

    def _drop(self) -> None:
        self._connection = self._channel = None

    def __enter__(self) -> TransactionPublisher:
        return self.connect()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
