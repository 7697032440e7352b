"""What went wrong with an AMQP broker: each error names the broker (host:port), and the vhost,
queue or user at fault."""

from __future__ import annotations

from replicator.errors import (
    AuthenticationError,
    ConnectionLostError,
    NodeError,
    NodeUnreachableError,
)


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
