"""Settings of a DcpClient: connections, reconnect and stream-retry pacing, batch size.

Apart from the client because each of its parts (node pool, failure streaks, stream routing)
reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from replicator.dcp.transport.options import ConnectionOptions
from replicator.errors import ConfigError
from replicator.model.backoff import Backoff


@dataclass(frozen=True, slots=True)
class ClientOptions:
    """Settings of a DcpClient. Times in seconds."""

    connection: ConnectionOptions = field(default_factory=ConnectionOptions)
    reconnect: Backoff = field(
        default_factory=lambda: Backoff(initial=0.5, maximum=30.0, deadline=300.0)
    )
    """Pacing of reconnects to a node; past the deadline `poll` raises ConnectionLostError."""
    stream_retry: Backoff = field(
        default_factory=lambda: Backoff(initial=0.1, maximum=5.0, deadline=120.0)
    )
    """Pacing of stream requests answered ETMPFAIL / NOT_MY_VBUCKET / stream exists."""
    max_batch_events: int = 10_000
    connection_stable_after: float = 60.0
    """A connection that stayed up this long, or was proven healthy by committed progress
    (`DcpClient.note_progress`), ends its node's streak of failures: its loss is reconnected
    after the initial delay again. One that breaks sooner counts towards the reconnect backoff
    and deadline. Acknowledged data proves nothing (a snapshot marker is acknowledged before
    the frame after it is refused), and a connection broken by a refused frame is healthy only
    if proven: a producer that sends a bad frame a minute after every reconnect must not be
    retried forever."""

    def __post_init__(self) -> None:
        if self.max_batch_events < 1:
            raise ConfigError("max_batch_events must be at least 1")
        if self.connection_stable_after <= 0:
            raise ConfigError("connection_stable_after must be positive")
