"""The client's node pool: one connection per data node, opened at bootstrap, re-opened by a
reconnect thread per node after a loss, and waited for by whoever needs a node's connection.

Every reconnect waits `reconnect.delay(n)` first, n being the node's failure streak (see
streaks.py); past the reconnect deadline the client fails (`ClientState.set_fatal`) naming the
node and the last cause. Permanent failures (credentials, bucket, TLS, settings) are never
retried.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from replicator.dcp.cluster.cluster_map import KvNode, parse_cluster_map
from replicator.dcp.cluster.connstr import ConnectionString
from replicator.dcp.cluster.map_tracker import MapTracker
from replicator.dcp.cluster.options import ClientOptions
from replicator.dcp.cluster.state import ClientState
from replicator.dcp.cluster.streaks import FailureStreaks
from replicator.dcp.transport.auth import Credentials
from replicator.dcp.transport.connection import ConnectionListener, NodeConnection
from replicator.errors import (
    AuthenticationError,
    BucketNotFoundError,
    ConfigError,
    ConnectionLostError,
    NodeUnreachableError,
    ProtocolError,
    ReplicatorError,
    TlsError,
)

log = logging.getLogger(__name__)

PERMANENT_ERRORS = (AuthenticationError, BucketNotFoundError, TlsError, ConfigError)
"""Failures that retrying with the same settings cannot fix: raised, never retried."""


@dataclass(frozen=True, slots=True)
class _Missing:
    """What a wait for a connection lacks, to name if it times out."""

    subject: str
    what: str


class NodePool:
    """Connections by node and by id, reconnect threads, and failure streaks.

    `connections` and `by_id` are read by the other parts of the client under its lock.
    """

    def __init__(
        self,
        state: ClientState,
        maps: MapTracker,
        connstr: ConnectionString,
        credentials: Credentials,
        options: ClientOptions,
        listener: ConnectionListener,
    ) -> None:
        self._state = state
        self._maps = maps
        self._connstr = connstr
        self._credentials = credentials
        self._options = options
        self._listener = listener
        self.connections: dict[KvNode, NodeConnection] = {}
        self.by_id: dict[int, NodeConnection] = {}
        self._node_of: dict[int, KvNode] = {}
        self._connecting: dict[KvNode, threading.Thread] = {}
        self._streaks = FailureStreaks(options)
        self._proven: set[int] = set()
        """Live connections proven healthy by committed progress (see `prove`)."""
        self.last_error: ReplicatorError | None = None
        """Why a connection broke most recently."""
        self.reconnects = 0
        """Connections re-established after a loss since the client started (metrics)."""

    # --- bootstrap -----------------------------------------------------------------------

    def bootstrap(self) -> None:
        """Take the map from the first seed that completes the handshake, then connect to
        every node holding vbuckets (in the background for those that fail now)."""
        failures: list[str] = []
        for seed in self._connstr.seeds:
            connection = self._new_connection(seed.host, seed.port)
            try:
                connection.open()
            except PERMANENT_ERRORS:
                raise
            except ReplicatorError as exc:
                failures.append(str(exc))
                log.warning("bootstrap: %s", exc)
                continue
            try:
                cluster_map = parse_cluster_map(connection.cluster_config, connected_host=seed.host)
            except BaseException:
                connection.close()
                raise
            self._maps.current = cluster_map
            node = cluster_map.node_for(seed.host, seed.port)
            if node is None:
                connection.close()
            else:
                self._register(node, connection)
            break
        else:
            addresses = ",".join(seed.address for seed in self._connstr.seeds)
            raise NodeUnreachableError(
                addresses, "no seed node completed the handshake: " + "; ".join(failures)
            )
        for node in cluster_map.nodes:
            if node in self.connections or not cluster_map.vbuckets_of(node):
                continue
            connection = self._new_connection(node.host, node.port(tls=self._connstr.tls))
            try:
                connection.open()
            except PERMANENT_ERRORS:
                raise
            except ReplicatorError as exc:
                log.warning("bootstrap: %s; retrying in the background", exc)
                with self._state.lock:
                    self.ensure_connecting(node)
                continue
            self._register(node, connection)

    def _new_connection(self, host: str, port: int) -> NodeConnection:
        return NodeConnection(
            host,
            port,
            bucket=self._connstr.bucket,
            credentials=self._credentials,
            tls=self._connstr.tls,
            options=self._options.connection,
            listener=self._listener,
        )

    def _register(self, node: KvNode, connection: NodeConnection) -> bool:
        """Make `connection` the node's; False when the client closed or the connection broke
        already (then counted as a failure, its loss not yet known to be this node's, and the
        node reconnected)."""
        with self._state.cond:
            if self._state.closed:
                connection.close()
                return False
            if not connection.is_open:
                cause = connection.failure or ConnectionLostError(
                    connection.address, "the connection closed right after opening"
                )
                self._streaks.count(node, cause, fresh=False)
                self.ensure_connecting(node)  # a no-op inside the node's reconnect thread
                return False
            self.connections[node] = connection
            self.by_id[connection.connection_id] = connection
            self._node_of[connection.connection_id] = node
            if self._connecting.get(node) is threading.current_thread():
                # From now on a loss of this connection must be able to start a reconnect.
                del self._connecting[node]
            self._state.cond.notify_all()
            return True

    # --- reconnects ----------------------------------------------------------------------

    def ensure_connecting(self, node: KvNode) -> None:
        """Start a reconnect thread for `node` unless connected or connecting (lock held)."""
        if self._state.closed or node in self._connecting:
            return
        existing = self.connections.get(node)
        if existing is not None and existing.is_open:
            return
        thread = threading.Thread(
            target=self._reconnect, args=(node,), name=f"dcp-connect-{node}", daemon=True
        )
        self._connecting[node] = thread
        thread.start()

    def _reconnect(self, node: KvNode) -> None:
        """Connect to `node` again; each attempt after a failure waits out the backoff."""
        backoff = self._options.reconnect
        state = self._state
        try:
            while not state.stop.is_set():
                with state.lock:
                    cluster_map = self._maps.current
                    if cluster_map is not None and node not in cluster_map.nodes:
                        log.info("%s left the cluster map; not reconnecting", node)
                        self._streaks.forget(node)
                        return
                    streak = self._streaks.get(node)
                    failures = 0 if streak is None else streak.failures
                    fatal = None
                    if streak is not None and time.monotonic() - streak.first_at > backoff.deadline:
                        fatal = self._streaks.gave_up_on(node, streak)
                if fatal is not None:
                    state.set_fatal(fatal)
                    return
                if failures and state.stop.wait(backoff.delay(failures)):
                    return
                connection = self._new_connection(node.host, node.port(tls=self._connstr.tls))
                try:
                    connection.open()
                except PERMANENT_ERRORS as exc:
                    state.set_fatal(exc)
                    return
                except ReplicatorError as exc:
                    with state.lock:
                        failures = self._streaks.count(node, exc, fresh=False)
                    log.warning("reconnect to %s failed (attempt %d): %s", node, failures, exc)
                    self._maps.refresh(self.live())
                    continue
                if state.stop.is_set():
                    connection.close()
                    return
                self._maps.adopt(connection.cluster_config, connection.host)
                if self._register(node, connection):
                    self.reconnects += 1
                    log.info("reconnected to %s", node)
                    return
        finally:
            with state.cond:
                if self._connecting.get(node) is threading.current_thread():
                    del self._connecting[node]
                state.cond.notify_all()

    def prove(self, connection_id: int) -> None:
        """The layer above committed data this connection streamed: it is healthy (lock held)."""
        self._proven.add(connection_id)

    def lost(self, connection: NodeConnection, error: ReplicatorError) -> KvNode | None:
        """Forget a broken connection and count it in its node's streak (lock held); its node,
        None when it was not (or no longer) a node's connection."""
        self.last_error = error
        node = self._node_of.pop(connection.connection_id, None)
        proven = connection.connection_id in self._proven
        self._proven.discard(connection.connection_id)
        if node is not None:
            opened_at = connection.opened_at
            lived = 0.0 if opened_at is None else time.monotonic() - opened_at
            # A refused frame is the producer's doing: only progress proves such a link.
            stable = lived >= self._options.connection_stable_after
            healthy = proven or (stable and not isinstance(error, ProtocolError))
            self._streaks.count(node, error, fresh=healthy)
        self.by_id.pop(connection.connection_id, None)
        if node is not None and self.connections.get(node) is connection:
            del self.connections[node]
        return node

    def detach_all(self) -> tuple[list[NodeConnection], list[threading.Thread]]:
        """On close (lock held): every connection, now forgotten, and every reconnect thread."""
        connections = list(self.by_id.values())
        connectors = list(self._connecting.values())
        self.connections.clear()
        self.by_id.clear()
        self._proven.clear()
        return connections, connectors

    # --- finding connections -------------------------------------------------------------

    def connection(self, connection_id: int) -> NodeConnection | None:
        with self._state.lock:
            return self.by_id.get(connection_id)

    def open_connections(self) -> list[NodeConnection]:
        """The registered connections (some may have just broken)."""
        with self._state.lock:
            return list(self.by_id.values())

    def connected(self, node: KvNode) -> NodeConnection | None:
        """The node's connection if it is open now, without waiting or reconnecting."""
        with self._state.lock:
            current = self.connections.get(node)
        return current if current is not None and current.is_open else None

    def live(self, via: NodeConnection | None = None) -> list[NodeConnection]:
        """The open connections, `via` first when it is open (whom to ask for a map)."""
        with self._state.lock:
            candidates = [via] if via is not None and via.is_open else []
            candidates += [c for c in self.connections.values() if c.is_open]
        return candidates

    def connection_for(self, vbucket: int, timeout: float | None) -> NodeConnection:
        """The connection to the vbucket's active node, waiting for it up to `timeout`."""

        def pick() -> NodeConnection | _Missing:
            assert self._maps.current is not None
            node = self._maps.current.active_node(vbucket)
            if node is not None:
                connection = self._live_or_connect(node)
                if connection is not None:
                    return connection
            where = "no active node" if node is None else f"no connection to {node}"
            return _Missing(str(node or self._connstr.bucket), f"vbucket {vbucket}: {where}")

        return self._wait_for(pick, timeout)

    def connection_to(self, node: KvNode, timeout: float | None) -> NodeConnection:
        """The node's connection, waiting for it up to `timeout`."""
        return self._wait_for(
            lambda: self._live_or_connect(node) or _Missing(str(node), "no connection"), timeout
        )

    def any_connection(self, timeout: float | None) -> NodeConnection:
        """Some open connection, waiting for one up to `timeout`."""

        def pick() -> NodeConnection | _Missing:
            for connection in self.connections.values():
                if connection.is_open:
                    return connection
            return _Missing(self._connstr.bucket, "no live connection")

        return self._wait_for(pick, timeout)

    def _live_or_connect(self, node: KvNode) -> NodeConnection | None:
        """The node's open connection, or None after making sure a reconnect runs (lock held)."""
        connection = self.connections.get(node)
        if connection is not None and connection.is_open:
            return connection
        self.ensure_connecting(node)
        return None

    def _wait_for(
        self, pick: Callable[[], NodeConnection | _Missing], timeout: float | None
    ) -> NodeConnection:
        """Wait until `pick` (run under the lock at every change) finds a connection; past
        `timeout` (default: the request timeout) raise ConnectionLostError naming what lacks."""
        wait = self._options.connection.request_timeout if timeout is None else timeout
        deadline = time.monotonic() + wait
        with self._state.cond:
            while True:
                self._state.check_open()
                found = pick()
                if not isinstance(found, _Missing):
                    return found
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ConnectionLostError(found.subject, f"{found.what} after {wait:g} s")
                self._state.cond.wait(remaining)
