"""Settings of a node connection: what the socket, the handshake and the I/O loop each read.

Apart from the connection so that the socket and handshake modules can take them without
importing the connection that composes them.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field

from replicator.dcp.protocol.dcp_requests import MAX_CONNECTION_NAME_BYTES
from replicator.dcp.protocol.frame import DEFAULT_MAX_BODY_SIZE
from replicator.dcp.transport.auth import SaslMechanism
from replicator.dcp.transport.flow_control import DEFAULT_WINDOW_BYTES
from replicator.errors import ConfigError

BACKFILL_ORDERS = ("round-robin", "sequential")
"""The values of the backfill_order control."""


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """How to verify the node's certificate. `ca_file` None: the system's trusted CAs."""

    ca_file: str | None = None
    check_hostname: bool = True

    def context(self) -> ssl.SSLContext:
        """A client context that verifies the server certificate (never CERT_NONE)."""
        try:
            ctx = ssl.create_default_context(cafile=self.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cannot load CA bundle {self.ca_file!r}: {exc}") from None
        ctx.check_hostname = self.check_hostname
        ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx


@dataclass(frozen=True, slots=True)
class ConnectionOptions:
    """Settings of every node connection. Times in seconds."""

    service_name: str = "replicator"
    """First part of the connection name `<service>:<unique>` the node logs and shows."""
    connect_timeout: float = 10.0
    request_timeout: float = 30.0
    flow_control_window: int = DEFAULT_WINDOW_BYTES
    """connection_buffer_size: bytes the producer may send before we acknowledge."""
    noop_interval: int = 120
    """set_noop_interval sent to the producer (kv_engine accepts 1..10800)."""
    dead_connection_timeout: float | None = None
    """Silence after which the connection is declared dead; None: two noop intervals."""
    enable_expiry_opcode: bool = True
    request_marker_v2_2: bool = True
    """Ask for max_marker_version=2.2 (purge seqno in markers) when collections are on."""
    change_streams: bool = False
    """Ask for change streams (history snapshots: every revision of collections with history
    retention, Couchbase 7.2+); a producer without them refuses, and streams stay deduplicated."""
    backfill_order: str | None = None
    """Ask for this backfill order (`round-robin` or `sequential`, Couchbase 6.6+); None: the
    producer's default (round-robin). Sequential completes each vbucket's disk snapshot before
    the next one starts, so a consumer that acts on whole snapshots can start early."""
    include_xattrs: bool = True
    allow_plain_over_tcp: bool = False
    sasl_mechanism: SaslMechanism | None = None
    """The one SASL mechanism to use; None: the strongest SCRAM the node offers (see auth)."""
    tls: TlsSettings = field(default_factory=TlsSettings)
    max_body_size: int = DEFAULT_MAX_BODY_SIZE

    def __post_init__(self) -> None:
        if not self.service_name or ":" in self.service_name:
            raise ConfigError(
                f"service name {self.service_name!r} must be non-empty and contain no ':'"
            )
        if len(self.service_name.encode()) > MAX_CONNECTION_NAME_BYTES - 33:
            raise ConfigError(
                f"service name is too long: the connection name `<service>:<32 hex>` must fit "
                f"{MAX_CONNECTION_NAME_BYTES} bytes"
            )
        if self.backfill_order not in (None, *BACKFILL_ORDERS):
            raise ConfigError(
                f"backfill order must be one of {', '.join(BACKFILL_ORDERS)}, "
                f"not {self.backfill_order!r}"
            )
        if not 1 <= self.noop_interval <= 10800:
            raise ConfigError(f"noop interval must be 1..10800 s, not {self.noop_interval}")
        if self.dead_connection_timeout is not None and self.dead_connection_timeout <= 0:
            raise ConfigError("dead_connection_timeout must be positive")
        if self.connect_timeout <= 0 or self.request_timeout <= 0:
            raise ConfigError("connect_timeout and request_timeout must be positive")
        if not 1 <= self.flow_control_window <= 0xFFFFFFFF:
            raise ConfigError(
                f"flow_control_window must be 1..2^32-1 bytes, not {self.flow_control_window}"
            )

    @property
    def dead_after(self) -> float:
        """Seconds of silence that mean the connection is dead."""
        if self.dead_connection_timeout is not None:
            return self.dead_connection_timeout
        return 2.0 * self.noop_interval
