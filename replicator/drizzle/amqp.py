"""Drizzle Transaction messages over AMQP 0-9-1 (RabbitMQ), as RabbitReplication carried them.

One message body is one serialized `Transaction` (a whole transaction, or one segment of a bulk
one). The producer side publishes them to a durable queue, persistent and confirmed; the replica
side consumes with manual acknowledgements and acknowledges only what it has committed:

- `AmqpSource`: where the queue is, parsed from `drizzle+amqp://[USER[:PASSWORD]@]HOST[:PORT]/QUEUE`
  with the vhost as an optional query parameter (`?vhost=NAME`, default `/`).
- `TransactionPublisher`: declares the queue durable and publishes bodies with publisher
  confirms, each confirmed before `publish` returns (the broker has it on disk).
- `TransactionConsumer`: hands out `Delivery`s (a tag and a body) and acknowledges nothing until
  told, through `ack_through(tag)` (one cumulative ack). Whatever is unacknowledged when the
  connection goes comes back after `connect()` with `redelivered` set; the assembler recognises
  those by transaction and segment id (`MessageSkipped`).

Delivery tags only grow over a consumer's life, across reconnects: the broker numbers each
channel's deliveries from 1 again, so a tag handed out before a reconnect would name a different
message on the new channel. The consumer adds an offset instead, and a tag from a closed
connection acknowledges nothing (its message was redelivered under a new tag). That makes a tag a
position the assembler can keep (`feed(message, position=delivery.delivery_tag)`): acknowledge
through `oldest_open_position() - 1` (or the last tag, when nothing is open) once everything
completed before it is committed.

After a reconnect, restart assembly from what was finished,
`TransactionAssembler(completed=assembler.completed_ids())`: every segment of a transaction
that was open comes back under a new tag, while its old first position would acknowledge
nothing, and a window full of unacknowledgeable redeliveries would stall the stream.

The password never appears in a log line, an error, `repr` or `str` of these objects: errors name
the host, port, vhost, queue and user.

>>> source = AmqpSource.parse("drizzle+amqp://app:secret@mq.example:5673/orders?vhost=shop")
>>> str(source), source.queue, source.vhost
('drizzle+amqp://app@mq.example:5673/orders?vhost=shop', 'orders', 'shop')
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, NoReturn
from urllib.parse import parse_qs, quote, unquote, urlsplit

import pika  # type: ignore[import-untyped]
from pika.adapters.utils import connection_workflow  # type: ignore[import-untyped]

from replicator.errors import (
    AuthenticationError,
    ConfigError,
    ConnectionLostError,
    NodeError,
    NodeUnreachableError,
)

SCHEME = "drizzle+amqp"
DEFAULT_PORT = 5672
DEFAULT_VHOST = "/"
DEFAULT_USER = "guest"
DEFAULT_PASSWORD = "guest"
"""RabbitMQ's built-in account; the broker accepts it from localhost only."""

DEFAULT_PREFETCH = 8192
"""Unacknowledged deliveries the broker may have out to one consumer. Acknowledgements wait for
the Delta commit, so the window must hold every message from the oldest uncommitted one to the
last segment of the largest open transaction: a bulk transaction of more segments can never
complete (see `TransactionConsumer.window_full`). RabbitMQ's largest is 65535."""

CONTENT_TYPE = "application/x-protobuf"
MESSAGE_TYPE = "drizzle.message.Transaction"

_ACCESS_REFUSED = 403
_NOT_FOUND = 404
_PRECONDITION_FAILED = 406


# Errors: each names the broker (host:port), and the vhost, queue or user at fault.


class AmqpError(NodeError):
    """Something went wrong with the broker at `node` (host:port)."""


class BrokerUnreachableError(AmqpError, NodeUnreachableError):
    """No AMQP connection could be made: nothing listens there, or not AMQP, or too slowly."""


class BrokerAuthenticationError(AmqpError, AuthenticationError):
    """The broker refused the user or its password. Not retried: they would fail again."""


class BrokerAccessRefusedError(AmqpError):
    """The broker knows the user but refuses it the vhost or the queue (or the vhost is missing)."""


class QueueNotFoundError(AmqpError):
    """The vhost has no queue of that name."""

    def __init__(self, node: str, message: str, *, queue: str) -> None:
        super().__init__(node, message)
        self.queue = queue


class QueueMismatchError(AmqpError):
    """The queue exists with properties other than those asked for (not durable, other args)."""


class BrokerConnectionLost(AmqpError, ConnectionLostError):
    """An established connection broke (closed by the broker, network, missed heartbeats).

    Unacknowledged deliveries go back to the queue: `connect()` again and they are redelivered.
    """


class PublishError(AmqpError):
    """The broker did not take a message (nacked it, or could not route it to the queue)."""


@dataclass(frozen=True, slots=True)
class AmqpSource:
    """Where Drizzle's Transaction messages wait: a queue on a RabbitMQ broker.

    `str()` is the connection string without the password; `repr()` hides it too.
    """

    host: str
    queue: str
    port: int = DEFAULT_PORT
    vhost: str = DEFAULT_VHOST
    username: str = DEFAULT_USER
    password: str = field(default=DEFAULT_PASSWORD, repr=False)

    def __post_init__(self) -> None:
        if not self.host:
            raise ConfigError("an AMQP source needs a host")
        if not self.queue:
            raise ConfigError(f"an AMQP source on {self.node} needs a queue name")
        if not 0 < self.port < 65536:
            raise ConfigError(f"AMQP port {self.port} is not between 1 and 65535")

    @classmethod
    def parse(
        cls, url: str, *, username: str | None = None, password: str | None = None
    ) -> AmqpSource:
        """Read `drizzle+amqp://[USER[:PASSWORD]@]HOST[:PORT]/QUEUE[?vhost=VHOST]`.

        User, password, queue and vhost are percent-decoded (a vhost `/` is `%2F` or `/`; a
        queue name may contain `/`). Without a user: `guest`/`guest`, which RabbitMQ accepts
        from localhost only. `password` supplies the password from elsewhere (a file, the
        environment) so that it need not be in the string, which shows in process lists, and
        `username` the user (a setting of its own); giving either in both places is an error.

        >>> AmqpSource.parse("drizzle+amqp://localhost/tx").vhost
        '/'
        """
        # Errors below name components, never the string itself: a password with a raw '/',
        # '?' or '#' in it would spill into the path, query or fragment.
        parts = urlsplit(url)
        if parts.scheme != SCHEME:
            shown = parts.scheme or "none"
            raise ConfigError(
                f"an AMQP source starts {SCHEME}://, not with scheme {shown!r} "
                f"(expected {SCHEME}://[USER[:PASSWORD]@]HOST[:PORT]/QUEUE[?vhost=VHOST])"
            )
        host = parts.hostname
        if not host:
            raise ConfigError(f"the {SCHEME} source names no host")
        try:
            port = parts.port or DEFAULT_PORT
        except ValueError:
            raise ConfigError(
                f"the {SCHEME} source for host {host!r} has a port that is not a number between "
                "0 and 65535 (a password with ':', '/', '?', '#' or '@' must be percent-encoded)"
            ) from None
        queue = unquote(parts.path[1:]) if parts.path.startswith("/") else ""
        if not queue:
            raise ConfigError(
                f"the {SCHEME} source for host {host!r} names no queue: add /QUEUE after the host"
            )
        if parts.fragment:
            raise ConfigError(
                f"the {SCHEME} source for host {host!r} has a '#' part, which means nothing "
                "here (a password with '#' must be percent-encoded as %23)"
            )
        vhost = _vhost(parts.query, host)
        url_username = unquote(parts.username) if parts.username is not None else None
        if url_username is not None and username is not None:
            raise ConfigError(
                f"the {SCHEME} source for host {host!r} names a user, and a user was given "
                "separately as well: give it once"
            )
        username = username if username is not None else url_username
        url_password = unquote(parts.password) if parts.password is not None else None
        if url_password is not None and password is not None:
            raise ConfigError(
                f"the {SCHEME} source for host {host!r} carries a password, and a password was "
                "given separately as well: give it once"
            )
        chosen = password if password is not None else url_password
        if username is None:
            if chosen is not None:
                raise ConfigError(
                    f"the {SCHEME} source for host {host!r} has a password but no user"
                )
            username, chosen = DEFAULT_USER, DEFAULT_PASSWORD
        if not username:
            raise ConfigError(f"the {SCHEME} source for host {host!r} has an empty user name")
        return cls(
            host=host,
            queue=queue,
            port=port,
            vhost=vhost,
            username=username,
            password=chosen if chosen is not None else "",
        )

    @property
    def node(self) -> str:
        """host:port, as errors name the broker."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def url(self, *, with_password: bool = False) -> str:
        """The connection string; the password only when asked (to hand to a child process
        through a channel that is not a command line or a log)."""
        userinfo = quote(self.username, safe="")
        if with_password:
            userinfo += ":" + quote(self.password, safe="")
        query = "" if self.vhost == DEFAULT_VHOST else "?vhost=" + quote(self.vhost, safe="")
        return f"{SCHEME}://{userinfo}@{self.node}/{quote(self.queue, safe='')}{query}"

    def __str__(self) -> str:
        return self.url()

    def with_queue(self, queue: str) -> AmqpSource:
        """The same broker, vhost and user; another queue."""
        return AmqpSource(self.host, queue, self.port, self.vhost, self.username, self.password)

    def _where(self) -> str:
        return f"queue {self.queue!r} in vhost {self.vhost!r}"


def _vhost(query: str, host: str) -> str:
    if not query:
        return DEFAULT_VHOST
    try:
        values = parse_qs(query, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        raise ConfigError(
            f"the {SCHEME} source for host {host!r} has a query that is not NAME=VALUE pairs; "
            "the only one understood is vhost=VHOST"
        ) from None
    unknown = sorted(set(values) - {"vhost"})
    if unknown:
        raise ConfigError(
            f"the {SCHEME} source for host {host!r} has {len(unknown)} unknown query "
            "parameter(s); the only one understood is vhost=VHOST"
        )
    vhosts = values["vhost"]
    if len(vhosts) != 1 or not vhosts[0]:
        raise ConfigError(
            f"the {SCHEME} source for host {host!r} must give vhost= once, with a name "
            "(%2F for the default vhost '/')"
        )
    return vhosts[0]


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


def _open(source: AmqpSource, settings: ConnectionSettings) -> Any:
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
            f"no AMQP connection to the broker for {source._where()} "
            f"({_connect_reason(error, source)}): is RabbitMQ running and listening there? "
            "Check the source's host and port",
        ) from None


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


def _channel_error(error: Any, source: AmqpSource, action: str) -> NoReturn:
    """Raise what a channel closed by the broker means, for `action` on the source's queue."""
    code = getattr(error, "reply_code", None)
    reason = _broker_reason(error, source)
    if code == _NOT_FOUND:
        raise QueueNotFoundError(
            source.node,
            f"no {source._where()} ({reason}): start the producer first (it declares the "
            "queue), or declare the queue durable",
            queue=source.queue,
        ) from None
    if code == _ACCESS_REFUSED:
        raise BrokerAccessRefusedError(
            source.node,
            f"user {source.username!r} may not {action} {source._where()} ({reason}): grant "
            "it configure, write and read permissions (rabbitmqctl set_permissions -p "
            f"{source.vhost})",
        ) from None
    if code == _PRECONDITION_FAILED:
        raise QueueMismatchError(
            source.node,
            f"cannot {action} {source._where()} ({reason}): the queue exists with other "
            "properties; it must be a durable classic queue without arguments",
        ) from None
    raise AmqpError(source.node, f"cannot {action} {source._where()} ({reason})") from None


def _lost(source: AmqpSource, error: BaseException) -> BrokerConnectionLost:
    return BrokerConnectionLost(
        source.node,
        f"the connection for {source._where()} was lost ({_connect_reason(error, source)}); "
        "unacknowledged messages go back to the queue: connect again",
    )


def check_source(
    source: AmqpSource, *, settings: ConnectionSettings | None = None, queue: bool = True
) -> int | None:
    """Connect, and with `queue` look the queue up; raise the error that says what is wrong.

    Returns the number of messages ready in the queue (None without `queue`). For checks
    before a run starts, and for waiting until a broker accepts connections.
    """
    connection = _open(source, settings or ConnectionSettings())
    try:
        if not queue:
            return None
        channel = connection.channel()
        try:
            result = channel.queue_declare(source.queue, passive=True)
        except pika.exceptions.ChannelClosedByBroker as error:
            _channel_error(error, source, "consume from")
        return int(result.method.message_count)
    except pika.exceptions.AMQPConnectionError as error:
        raise _lost(source, error) from None
    finally:
        _close_quietly(connection)


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
        connection = _open(self.source, self.settings)
        try:
            channel = connection.channel()
            try:
                channel.queue_declare(self.source.queue, durable=True)
            except pika.exceptions.ChannelClosedByBroker as error:
                _channel_error(error, self.source, "declare")
            channel.confirm_delivery()
        except BaseException:
            _close_quietly(connection)
            raise
        self._connection, self._channel = connection, channel
        return self

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
                f"the broker could not route a message to {self.source._where()} (was the "
                "queue deleted?): nothing was published; reconnect to declare it again",
            ) from None
        except pika.exceptions.NackError:
            raise PublishError(
                self.source.node,
                f"the broker refused a message for {self.source._where()} (nack: a queue "
                "length limit, or an internal error; see the broker's log); publish it again",
            ) from None
        except pika.exceptions.ChannelClosedByBroker as error:
            self.close()  # the connection outlives its channel: do not leak it
            _channel_error(error, self.source, "publish to")
        except (pika.exceptions.AMQPConnectionError, pika.exceptions.AMQPChannelError) as error:
            self.close()
            raise _lost(self.source, error) from None
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
            _close_quietly(connection)

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
        connection = _open(self.source, self.settings)
        try:
            channel = connection.channel()
            try:
                # Passive: a replica never creates the queue, so a typo is an error, not an
                # empty queue waited on forever.
                channel.queue_declare(self.source.queue, passive=True)
            except pika.exceptions.ChannelClosedByBroker as error:
                _channel_error(error, self.source, "consume from")
            channel.basic_qos(prefetch_count=self.prefetch)
            channel.add_on_cancel_callback(self._on_cancel)
            try:
                channel.basic_consume(self.source.queue, self._on_message, auto_ack=False)
            except pika.exceptions.ChannelClosedByBroker as error:
                _channel_error(error, self.source, "consume from")
        except BaseException:
            _close_quietly(connection)
            raise
        self._connection, self._channel = connection, channel
        self._offset = self._last_tag
        self._acked_channel_tag = 0
        self._cancelled = False
        self.connections += 1
        return self

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
                _channel_error(error, self.source, "consume from")
            except (pika.exceptions.AMQPConnectionError, pika.exceptions.AMQPChannelError) as e:
                self.close()
                raise _lost(self.source, e) from None
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
            raise _lost(self.source, error) from None
        count = channel_tag - self._acked_channel_tag
        self._acked_channel_tag = channel_tag
        return count

    def close(self) -> None:
        """Close the connection; unacknowledged messages go back to the queue."""
        connection = self._connection
        self._drop()
        if connection is not None:
            _close_quietly(connection)

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
                f"the broker cancelled the consumer of {self.source._where()} (the queue was "
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


def _close_quietly(connection: Any) -> None:
    # Closing a connection that already broke raises; there is nothing left to release then.
    try:
        if connection.is_open:
            connection.close()
    except pika.exceptions.AMQPError:
        pass
    except OSError:
        pass


__all__ = [
    "CONTENT_TYPE",
    "DEFAULT_PORT",
    "DEFAULT_PREFETCH",
    "DEFAULT_VHOST",
    "MESSAGE_TYPE",
    "SCHEME",
    "AmqpError",
    "AmqpSource",
    "BrokerAccessRefusedError",
    "BrokerAuthenticationError",
    "BrokerConnectionLost",
    "BrokerUnreachableError",
    "ConnectionSettings",
    "Delivery",
    "PublishError",
    "QueueMismatchError",
    "QueueNotFoundError",
    "TransactionConsumer",
    "TransactionPublisher",
    "check_source",
]
