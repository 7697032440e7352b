"""What a simulated node's connections need to know about their node and cluster.

`ServerOptions` are the serving loop's knobs; `ClusterContext` is the cluster seen from one of
its nodes (ownership of vbuckets, the current map, credentials). `SimCluster` implements it;
keeping the protocol here lets the connection code be tested without a whole cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from replicator.sim.bucket import SimBucket
from replicator.sim.producer_stream import DEFAULT_SNAPPY_MIN_SIZE
from replicator.sim.sasl_server import MECHANISMS, CredentialStore, check_mechanisms

SERVER_VERSION = "7.6.2-3721-enterprise"
"""What VERSION (0x0b) answers; java-dcp-client reads the major.minor.patch from it."""


@dataclass(frozen=True, slots=True)
class ServerOptions:
    """Knobs of the simulated nodes' serving loop.

    `noop_time_scale` is the length in seconds of one unit of `set_noop_interval` (1.0 as on a
    real node; tests use a small value to see noops and dead-connection drops quickly).
    `batch_bytes` is how much stream data a loop turn queues for one write (each write lets
    the workload's thread take the interpreter, and the session waits up to a switch interval
    to get it back: 64 KiB turns made that most of the session's time at 20,000 writes/s);
    `items_per_pull` how many items it takes from a cursor at a time.
    `send_rate_bytes_per_second` caps every connection's sends from the start (a slow network).
    `sasl_mechanisms` is what the nodes offer (SASL_LIST_MECHS) and accept, as a node with some
    mechanisms disabled would.
    """

    noop_time_scale: float = 1.0
    snappy_min_size: int = DEFAULT_SNAPPY_MIN_SIZE
    batch_bytes: int = 2048 * 1024
    items_per_pull: int = 128
    server_version: str = SERVER_VERSION
    handshake_timeout_s: float = 10.0
    send_rate_bytes_per_second: int | None = None
    sasl_mechanisms: tuple[str, ...] = MECHANISMS

    def __post_init__(self) -> None:
        check_mechanisms(self.sasl_mechanisms)
        if self.noop_time_scale <= 0:
            raise ValueError(f"noop_time_scale must be positive, got {self.noop_time_scale}")
        if self.batch_bytes < 1024:
            raise ValueError(f"batch_bytes must be at least 1024, got {self.batch_bytes}")
        if self.items_per_pull < 1:
            raise ValueError(f"items_per_pull must be positive, got {self.items_per_pull}")
        rate = self.send_rate_bytes_per_second
        if rate is not None and rate < 1:
            raise ValueError(f"send_rate_bytes_per_second must be positive, got {rate}")


class ClusterContext(Protocol):
    """What a node needs from the cluster it belongs to (implemented by `SimCluster`)."""

    @property
    def bucket(self) -> SimBucket: ...

    @property
    def credentials(self) -> CredentialStore: ...

    @property
    def options(self) -> ServerOptions: ...

    def owns(self, node: int, vbucket: int) -> bool:
        """True if `node` is the active node of `vbucket` in the current map."""
        ...

    def config_revision(self) -> tuple[int, int]:
        """(revEpoch, rev) of the current cluster map."""
        ...

    def config_json(self, node: int) -> bytes:
        """The current cluster map as `node` hands it out (thisNode set)."""
        ...

    def node_vbuckets(self, node: int) -> tuple[int, ...]:
        """The vbuckets `node` is active for."""
        ...
