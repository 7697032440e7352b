"""Connections to the broker: opening one (and a channel on it), checking a source, and what
the broker's refusals and pika's errors mean, as errors that never carry the password."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import pika  # type: ignore[import-untyped]
from pika.adapters.utils import connection_workflow  # type: ignore[import-untyped]

from replicator.drizzle.amqp.errors import (
    AmqpError,
    BrokerAccessRefusedError,
    BrokerAuthenticationError,
    BrokerConnectionLost,
    BrokerUnreachableError,
    QueueMismatchError,
    QueueNotFoundError,
)
from replicator.drizzle.amqp.source import AmqpSource

_ACCESS_REFUSED = 403
_NOT_FOUND = 404
_PRECONDITION_FAILED = 406


@dataclass(frozen=True, slots=True)
class ConnectionSettings:
    """How to talk to the broker.

    `heartbeat_s`: pika answers heartbeats only while it is called, so a consumer must be
    called (`next_delivery`, even with timeout 0) at least that often, or the broker drops the
    connection and redelivers what was not acknowledged.
    """

    connect_timeout_s: float = 10.0
    heartbeat_s: int = 60
    blocked_timeout_s: float = 300.0
    """How long a publish may wait while the broker blocks publishers (memory or disk alarm)."""

    def __post_init__(self) -> None:
        if self.connect_timeout_s <= 0:
            raise ValueError(f"connect timeout {self.connect_timeout_s}s must be positive")
        if self.heartbeat_s < 0:
            raise ValueError(f"heartbeat {self.heartbeat_s}s must be 0 (off) or positive")


def _parameters(source: AmqpSource, settings: ConnectionSettings) -> Any:
    return pika.ConnectionParameters(
        host=source.host,
        port=source.port,
        virtual_host=source.vhost,
        credentials=pika.PlainCredentials(source.username, source.password),
        heartbeat=settings.heartbeat_s,
        blocked_connection_timeout=settings.blocked_timeout_s,
        socket_timeout=settings.connect_timeout_s,
        stack_timeout=settings.connect_timeout_s,
        connection_attempts=1,
        client_properties={"connection_name": f"replicator drizzle {source.queue}"},
    )


def open_connection(source: AmqpSource, settings: ConnectionSettings) -> Any:
    """A BlockingConnection, or the error that says why not."""
    try:
        return pika.BlockingConnection(_parameters(source, settings))
    except pika.exceptions.ProbableAuthenticationError:
        raise BrokerAuthenticationError(
            source.node,
            f"the broker refused user {source.username!r} (wrong password, or no such user): "
            f"check the credentials given for {source}",
        ) from None
    except pika.exceptions.ProbableAccessDeniedError as error:
        raise BrokerAccessRefusedError(
            source.node,
            f"the broker refused user {source.username!r} the vhost {source.vhost!r} "
            f"({_broker_reason(error, source)}): create the vhost or grant the user "
            f"permissions on it (rabbitmqctl add_vhost / set_permissions -p {source.vhost})",
        ) from None
    except (
        pika.exceptions.AMQPConnectionError,
        # A handshake timeout comes out of pika unwrapped, and so does a name lookup's error.
        connection_workflow.AMQPConnectorException,
        OSError,
    ) as error:
        raise BrokerUnreachableError(
            source.node,
            f"no AMQP connection to the broker for {source.where()} "
            f"({_connect_reason(error, source)}): is RabbitMQ running and listening there? "
            "Check the source's host and port",
        ) from None


def open_channel(
    source: AmqpSource, settings: ConnectionSettings, prepare: Callable[[Any], None]
) -> tuple[Any, Any]:
    """A connection and a channel on it, made ready by `prepare` (which declares the queue and
    sets the channel up); the connection is closed again if `prepare` fails."""
    connection = open_connection(source, settings)
    try:
        channel = connection.channel()
        prepare(channel)
    except BaseException:
        close_quietly(connection)
        raise
    return connection, channel


def _connect_reason(error: BaseException, source: AmqpSource) -> str:
    """What went wrong with the connection, from pika's nested errors (never their repr, which
    could carry anything)."""
    pending: list[object] = [error]
    seen = 0
    while pending and seen < 20:
        item = pending.pop(0)
        seen += 1
        if isinstance(item, TimeoutError):
            return f"timed out: {source.node} gave no answer"
        if isinstance(item, connection_workflow.AMQPConnectorStackTimeout):
            return "no AMQP handshake in time: something else listens there, or it is overloaded"
        if isinstance(item, OSError) and item.strerror:
            return item.strerror.lower()
        if isinstance(item, pika.exceptions.ConnectionClosedByBroker):
            return _broker_reason(item, source)
        if isinstance(item, pika.exceptions.IncompatibleProtocolError):
            return "the peer does not speak AMQP 0-9-1"
        if isinstance(item, BaseException):
            pending.extend(item.args)
            # pika's connection workflow wraps the socket's error in `exception`, and a
            # failed workflow lists its attempts' errors in `exceptions`.
            pending.append(getattr(item, "exception", None))
            pending.extend(getattr(item, "exceptions", ()))
            if item.__cause__ is not None:
                pending.append(item.__cause__)
    return type(error).__name__


def _broker_reason(error: BaseException, source: AmqpSource) -> str:
    """The broker's reply code and text, which name the queue or vhost; scrubbed of the
    password all the same, since a broker echoes what it was sent."""
    code = getattr(error, "reply_code", None)
    text = getattr(error, "reply_text", None)
    if code is None:
        for arg in error.args:
            if isinstance(arg, BaseException):
                return _broker_reason(arg, source)
        return type(error).__name__
    reason = f"{code} {text}"
    if source.password:
        reason = reason.replace(source.password, "***")
    return reason


def channel_error(error: Any, source: AmqpSource, action: str) -> NoReturn:
    """Raise what a channel closed by the broker means, for `action` on the source's queue."""
    code = getattr(error, "reply_code", None)
    reason = _broker_reason(error, source)
    if code == _NOT_FOUND:
        raise QueueNotFoundError(
            source.node,
            f"no {source.where()} ({reason}): start the producer first (it declares the "
            "queue), or declare the queue durable",
            queue=source.queue,
        ) from None
    if code == _ACCESS_REFUSED:
        raise BrokerAccessRefusedError(
            source.node,
            f"user {source.username!r} may not {action} {source.where()} ({reason}): grant "
            "it configure, write and read permissions (rabbitmqctl set_permissions -p "
            f"{source.vhost})",
        ) from None
    if code == _PRECONDITION_FAILED:
        raise QueueMismatchError(
            source.node,
            f"cannot {action} {source.where()} ({reason}): the queue exists with other "
            "properties; it must be a durable classic queue without arguments",
        ) from None
    raise AmqpError(source.node, f"cannot {action} {source.where()} ({reason})") from None


def connection_lost(source: AmqpSource, error: BaseException) -> BrokerConnectionLost:
    """The error for a connection that broke while in use (raise it `from None`)."""
    return BrokerConnectionLost(
        source.node,
        f"the connection for {source.where()} was lost ({_connect_reason(error, source)}); "
        "unacknowledged messages go back to the queue: connect again",
    )


def check_source(
    source: AmqpSource, *, settings: ConnectionSettings | None = None, queue: bool = True
) -> int | None:
    """Connect, and with `queue` look the queue up; raise the error that says what is wrong.

    Returns the number of messages ready in the queue (None without `queue`). For checks
    before a run starts, and for waiting until a broker accepts connections.
    """
    connection = open_connection(source, settings or ConnectionSettings())
    try:
        if not queue:
            return None
        channel = connection.channel()
        try:
            result = channel.queue_declare(source.queue, passive=True)
        except pika.exceptions.ChannelClosedByBroker as error:
            channel_error(error, source, "consume from")
        return int(result.method.message_count)
    except pika.exceptions.AMQPConnectionError as error:
        raise connection_lost(source, error) from None
    finally:
        close_quietly(connection)


def close_quietly(connection: Any) -> None:
    # Closing a connection that already broke raises; there is nothing left to release then.
    try:
        if connection.is_open:
            connection.close()
    except pika.exceptions.AMQPError:
        pass
    except OSError:
        pass
