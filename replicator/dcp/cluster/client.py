"""The DCP cluster client: one connection per data node, vbucket streams routed by the map.

Usage::

    client = DcpClient("couchbase://db1,db2/travel", Credentials("dcp", secret),
                       committed_position=store.committed_position)
    for vb in range(client.cluster_map.num_vbuckets):
        client.open_stream(vb, VbucketPosition.beginning(vb), None)
    while running:
        batch = client.poll(timeout=1.0)
        for event in batch:          # per-vbucket order preserved
            stage(event)
        client.acknowledge(batch)    # once staged: frees the producer's flow-control window
    client.close()

What the layer above sees: the events of replicator.dcp.protocol.events, including `StreamOpened`
(persist its failover log) and `RollbackRequired` (roll back, then `open_stream` again). When a
stream ends for a reason that is not final (STATE_CHANGED, DISCONNECTED, TOO_SLOW,
BACKFILL_FAILED, ROLLBACK) or its connection breaks, a `StreamEnd` is handed up first (a broken
connection yields `StreamEnd(vb, DISCONNECTED)`), so the layer above drops that vbucket's
partial snapshot; only after that batch was returned by `poll` and `poll` is called again does
the client ask `committed_position(vb)` where to resume, and reopen the stream there.

Threads: each connection has an I/O thread; reconnects run in their own threads. Every
reconnect waits `reconnect.delay(n)` first, n counting the node's connections in a row that
failed to open or broke before proving healthy (the layer above committed data it streamed,
see `note_progress`, or it stayed up `connection_stable_after` seconds and did not end on a
refused frame). Past the reconnect deadline, counted from the streak's first
failure, `poll` raises ConnectionLostError naming the node and the last cause: a node that
breaks right after every handshake is not reconnected forever.
Stream requests, retries and reopens are sent from the caller's thread inside `poll` and
`open_stream`. All waits have timeouts.

Memory: the producer sends at most one flow-control window of unacknowledged bytes per
connection, and bytes are acknowledged only once the layer above staged them, so events queued
for `poll` stay within about one window (plus one message) per connection (`queued_bytes`).

The client is composed of parts sharing one lock (state.py): the node pool and its reconnects
(nodes.py, streaks.py), the cluster map (map_tracker.py), the streams (stream_table.py) and
their routing (routing.py), the event queue (event_queue.py) with the batches and receipts it
hands out (batch.py), and one-shot requests (queries.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence

from replicator.dcp.cluster.batch import AckReceipt, EventBatch
from replicator.dcp.cluster.cluster_map import ClusterMap
from replicator.dcp.cluster.connstr import ConnectionString
from replicator.dcp.cluster.event_queue import EventQueue
from replicator.dcp.cluster.map_tracker import MapTracker
from replicator.dcp.cluster.nodes import NodePool
from replicator.dcp.cluster.options import ClientOptions
from replicator.dcp.cluster.queries import ClusterQueries
from replicator.dcp.cluster.routing import StreamRouter
from replicator.dcp.cluster.state import ClientState
from replicator.dcp.cluster.stream_table import StreamTable
from replicator.dcp.cluster.streams import StreamState
from replicator.dcp.protocol.pushes import ClustermapChangeNotification
from replicator.dcp.transport.auth import Credentials
from replicator.dcp.transport.connection import Delivered, NodeConnection
from replicator.errors import ConfigError, ReplicatorError
from replicator.model.aliases import CommittedPosition
from replicator.model.positions import MAX_SEQNO, FailoverLog, VbucketPosition

log = logging.getLogger(__name__)


class DcpClient:
    """A DCP consumer of one bucket across the cluster. Connects (bootstraps) on construction.

    Bootstrap tries the seed nodes in order and takes the cluster map from the first that
    completes the handshake, then connects to every node holding active vbuckets. Wrong
    credentials, an unknown bucket, TLS failures and bad settings raise at once
    (AuthenticationError, BucketNotFoundError, TlsError, ConfigError); no seed reachable
    raises NodeUnreachableError.

    `committed_position(vb)` says where a stream resumes after a non-final end or a broken
    connection; without it such streams simply end (the StreamEnd is still handed up).
    Thread-safe.
    """

    def __init__(
        self,
        connection_string: str | ConnectionString,
        credentials: Credentials,
        *,
        options: ClientOptions | None = None,
        committed_position: CommittedPosition | None = None,
    ) -> None:
        if isinstance(connection_string, str):
            connection_string = ConnectionString.parse(connection_string)
        self._connstr = connection_string
        self._options = options or ClientOptions()
        self._state = ClientState()
        self._maps = MapTracker(self._state)
        self._nodes = NodePool(
            self._state, self._maps, connection_string, credentials, self._options, self
        )
        self._queue = EventQueue()
        self._streams = StreamTable()
        self._router = StreamRouter(
            self._state,
            self._maps,
            self._nodes,
            self._queue,
            self._streams,
            options=self._options,
            bucket=connection_string.bucket,
            committed_position=committed_position,
        )
        self._queries = ClusterQueries(self._nodes, self._maps)
        try:
            self._nodes.bootstrap()
        except BaseException:
            self.close()
            raise

    # --- public API ----------------------------------------------------------------------

    @property
    def bucket(self) -> str:
        return self._connstr.bucket

    @property
    def cluster_map(self) -> ClusterMap:
        """The newest cluster map seen."""
        return self._maps.newest()

    @property
    def reconnects(self) -> int:
        """Connections re-established after a loss since the client started (metrics)."""
        return self._nodes.reconnects

    @property
    def last_connection_error(self) -> ReplicatorError | None:
        """Why a connection broke most recently (for diagnostics; reconnects are automatic)."""
        with self._state.lock:
            return self._nodes.last_error

    def change_streams(self, *, timeout: float | None = None) -> bool:
        """Whether a live connection's producer accepted change streams (history snapshots)."""
        return self._nodes.any_connection(timeout).change_streams

    @property
    def acknowledged_bytes(self) -> int:
        """Bytes acknowledged to the producers on the live connections (flow-control metric)."""
        connections = self._nodes.open_connections()
        return sum(c.flow_control.acknowledged_total for c in connections)

    @property
    def queued_bytes(self) -> int:
        """Bytes of producer messages received and not yet handed up by `poll`.

        Flow control bounds it: about one window plus one message per connection, however
        long the layer above leaves `poll` uncalled.
        """
        with self._state.lock:
            return self._queue.size

    def stream_state(self, vbucket: int) -> StreamState | None:
        """The client-side state of a vbucket's stream, None when it has none."""
        with self._state.lock:
            return self._streams.state_of(vbucket)

    def resume_from(self, committed_position: CommittedPosition) -> None:
        """Say from now on where streams resume (as the constructor's `committed_position`):
        the layer that knows is often built after the client it reads from."""
        self._router.resume_from(committed_position)

    def open_stream(
        self,
        vbucket: int,
        position: VbucketPosition,
        failover_log: FailoverLog | None,
        end: int = MAX_SEQNO,
    ) -> None:
        """Ask for `vbucket`'s changes after `position` (up to `end`); the outcome arrives
        through `poll` as StreamOpened or RollbackRequired.

        `failover_log` is the one persisted with the position (None only when starting at
        0). ConfigError when the request would be invalid or the vbucket already streams.
        """
        self._router.open(vbucket, position, failover_log, end)

    def close_stream(self, vbucket: int) -> bool:
        """Close `vbucket`'s stream. Returns False when the vbucket had no stream.

        An open stream ends with StreamEnd (CLOSED) through `poll`. A stream whose request is
        still unanswered is closed as soon as it opens (StreamOpened, then StreamEnd CLOSED),
        or silently dropped if the request fails; a pending one is dropped at once.
        """
        return self._router.close(vbucket)

    def poll(self, timeout: float = 1.0, *, max_events: int | None = None) -> EventBatch:
        """Wait up to `timeout` s for events; return those queued (possibly none).

        Raises a stream's failure (e.g. a stream request refused for good) or the client's
        fatal error (reconnect deadline passed, credentials no longer accepted).
        """
        limit = max_events or self._options.max_batch_events
        deadline = time.monotonic() + max(0.0, timeout)
        state = self._state
        while True:
            self._router.service()
            with state.cond:
                if state.errors:
                    raise state.errors.popleft()
                if state.fatal is not None:
                    raise state.fatal
                if self._queue:
                    return self._queue.take(limit, self._streams.release)
                if state.closed:
                    raise ConfigError("the client is closed")
                now = time.monotonic()
                remaining = deadline - now
                if remaining <= 0:
                    return EventBatch((), AckReceipt({}))
                due = self._streams.due_times(now)
                wait = min([remaining, *(d - now for d in due)])
                state.cond.wait(wait)

    def acknowledge(self, batch: EventBatch) -> None:
        """The layer above staged every event of `batch`: release its flow-control bytes."""
        counts = batch.receipt.take()
        for connection_id, size in counts.items():
            connection = self._nodes.connection(connection_id)
            if connection is not None:
                connection.acknowledge(size)

    def note_progress(self, vbuckets: Iterable[int]) -> None:
        """The layer above committed changes of these vbuckets: the connections streaming them
        are proven healthy (ClientOptions.connection_stable_after)."""
        with self._state.lock:
            for vb in vbuckets:
                connection_id = self._streams.connection_of(vb)
                if connection_id is not None:
                    self._nodes.prove(connection_id)

    def failover_log(self, vbucket: int, *, timeout: float | None = None) -> FailoverLog:
        """The vbucket's current failover log from its active node (GET_FAILOVER_LOG)."""
        return self._queries.failover_log(vbucket, timeout=timeout)

    def high_seqnos(
        self, *, timeout: float | None = None, connected_only: bool = False
    ) -> dict[int, int]:
        """Every active vbucket's high seqno (GET_ALL_VB_SEQNOS on each node).

        `connected_only`: ask only the nodes connected now, without waiting for the others
        (their vbuckets are missing from the answer): a periodic check must not stall its
        caller while a node is down.
        """
        return self._queries.high_seqnos(timeout=timeout, connected_only=connected_only)

    def collections_manifest(self, *, timeout: float | None = None) -> dict[str, object]:
        """The bucket's collections manifest JSON (GET_COLLECTIONS_MANIFEST)."""
        return self._queries.collections_manifest(timeout=timeout)

    def close(self) -> None:
        """Close every connection and stop reconnecting. Idempotent."""
        state = self._state
        with state.cond:
            state.closed = True
            state.stop.set()
            connections, connectors = self._nodes.detach_all()
            state.cond.notify_all()
        for connection in connections:
            connection.close()
        for thread in connectors:
            if thread is not threading.current_thread():
                thread.join(self._options.connection.connect_timeout + 1.0)

    def __enter__(self) -> DcpClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- ConnectionListener (called on connection I/O threads) ---------------------------

    def on_messages(self, connection: NodeConnection, messages: Sequence[Delivered]) -> None:
        """Queue streams' messages; drop (and acknowledge) those of no current stream."""
        dropped = self._router.take_messages(connection, messages)
        for message, opaque, size in dropped:
            log.debug("dropped %s of no current stream (opaque %d)", type(message).__name__, opaque)
            connection.acknowledge(size)

    def on_cluster_map_notification(
        self, connection: NodeConnection, notification: ClustermapChangeNotification
    ) -> None:
        """Adopt a pushed map, or fetch it when the push carried only its revision."""
        if notification.config:
            self._maps.adopt(notification.config, connection.host)
            return
        if self._maps.is_behind(notification):
            self._maps.refresh(self._nodes.live(connection))

    def on_connection_lost(self, connection: NodeConnection, error: ReplicatorError) -> None:
        """End the connection's streams (StreamEnd DISCONNECTED handed up) and reconnect."""
        state = self._state
        with state.cond:
            if state.closed:
                return
            node = self._nodes.lost(connection, error)
            self._router.connection_lost(connection)
            cluster_map = self._maps.current
            if node is not None and cluster_map is not None and node in cluster_map.nodes:
                self._nodes.ensure_connecting(node)
            state.cond.notify_all()
