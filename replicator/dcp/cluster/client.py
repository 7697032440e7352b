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
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import cast

from replicator.dcp.cluster.cluster_map import ClusterMap, KvNode, parse_cluster_map
from replicator.dcp.cluster.connstr import ConnectionString
from replicator.dcp.cluster.streams import (
    Backoff,
    CommittedPosition,
    EndAction,
    OutcomeKind,
    StreamState,
    VbucketStream,
    plan_stream_request,
    read_stream_response,
    stream_end_action,
)
from replicator.dcp.protocol.codec import (
    CloseStream,
    ClustermapChangeNotification,
    DcpNoop,
    GetAllVbSeqnos,
    GetClusterConfig,
    GetCollectionsManifest,
    GetFailoverLog,
    Response,
    SetVbucketState,
    failover_log_of,
    vbucket_seqnos_of,
)
from replicator.dcp.protocol.events import (
    DocumentChanges,
    RollbackRequired,
    StreamEnd,
    StreamEndReason,
    StreamEvent,
    StreamOpened,
)
from replicator.dcp.protocol.opcodes import Opcode, Status, VbucketState
from replicator.dcp.transport.auth import Credentials
from replicator.dcp.transport.connection import (
    ConnectionOptions,
    Delivered,
    NodeConnection,
    next_opaque,
    response_value,
)
from replicator.errors import (
    AuthenticationError,
    BucketNotFoundError,
    ConfigError,
    ConnectionLostError,
    NodeUnreachableError,
    ProtocolError,
    ReplicatorError,
    TlsError,
    UnsupportedCommandError,
)
from replicator.model.positions import MAX_SEQNO, FailoverLog, VbucketPosition

log = logging.getLogger(__name__)

SAME_FRAME_REPORTED_AFTER = 3
"""Connections in a row broken by the same refused frame before an error line says so."""

PERMANENT_ERRORS = (AuthenticationError, BucketNotFoundError, TlsError, ConfigError)
"""Failures that retrying with the same settings cannot fix: raised, never retried."""


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


class AckReceipt:
    """Bytes per connection that a batch's events occupied in the producers' windows.

    Redeemable once (by `DcpClient.acknowledge`): acknowledging twice would over-open a window.
    """

    __slots__ = ("_byte_counts", "_taken")

    def __init__(self, byte_counts: Mapping[int, int]) -> None:
        self._byte_counts = dict(byte_counts)
        self._taken = False

    @property
    def total_bytes(self) -> int:
        return sum(self._byte_counts.values())

    @property
    def redeemed(self) -> bool:
        return self._taken

    def take(self) -> dict[int, int]:
        """The byte counts, once; ValueError on a second call."""
        if self._taken:
            raise ValueError("this batch was already acknowledged")
        self._taken = True
        return dict(self._byte_counts)


@dataclass(frozen=True, slots=True)
class EventBatch:
    """What one `poll` returns: events in per-vbucket order and the receipt to acknowledge.

    `events` is what the connections handed up: data messages as `DocumentChanges` runs (one
    per vbucket and socket read, column by column), everything else as typed events. Iterating
    the batch gives every message as a typed event instead, runs expanded into Mutation,
    Deletion and Expiration events: simpler to read, slower for a bulk consumer.
    """

    events: tuple[StreamEvent, ...]
    receipt: AckReceipt

    def __iter__(self) -> Iterator[StreamEvent]:
        for event in self.events:
            if type(event) is DocumentChanges:
                yield from event.events()
            else:
                yield event

    def __len__(self) -> int:
        """Messages in the batch (a run counts each of its rows)."""
        return sum(_message_count(event) for event in self.events)

    def __bool__(self) -> bool:
        return bool(self.events)


def _message_count(event: StreamEvent) -> int:
    return len(event) if type(event) is DocumentChanges else 1


def _refused(
    connection: NodeConnection, reply: Response, opcode: Opcode, what: str
) -> UnsupportedCommandError:
    """A node answered a request the caller needs with an error: name it and the command."""
    return UnsupportedCommandError(
        connection.address,
        f"{opcode.name} (0x{int(opcode):02x}) refused ({reply.status_name}): the node cannot "
        f"tell {what}",
        command=opcode.name,
    )


@dataclass(slots=True)
class _FailureStreak:
    """A node's connections in a row that could not be opened or broke before being stable."""

    first_at: float
    """time.monotonic() of the streak's first failure: the reconnect deadline counts from it."""
    failures: int = 0
    last_cause: ReplicatorError | None = None
    same_cause: int = 0
    """How many failures in a row ended with the same error text as `last_cause`."""


@dataclass(slots=True)
class _Queued:
    """Events of one connection waiting for `poll`, in order: a single lifecycle event, or
    the accepted messages of one socket read (one queue entry per read, not per message)."""

    events: list[StreamEvent]
    sizes: list[int]
    """Each event's bytes in the producer's flow-control window (0 for lifecycle events)."""
    connection_id: int
    size: int
    """sum(sizes), kept so the whole entry is counted without a pass over it."""
    messages: int = 1
    """Messages in `events` (a DocumentChanges run counts its rows)."""
    releases_stream: bool = False
    """Handing this (single) StreamEnd up lets the vbucket's stream be reopened."""


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
        self._credentials = credentials
        self._options = options or ClientOptions()
        self._committed_position = committed_position
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._closed = False
        self._map: ClusterMap | None = None
        self._connections: dict[KvNode, NodeConnection] = {}
        self._by_id: dict[int, NodeConnection] = {}
        self._node_of: dict[int, KvNode] = {}
        self._connecting: dict[KvNode, threading.Thread] = {}
        self._streams: dict[int, VbucketStream] = {}
        self._pending: set[int] = set()
        """Vbuckets whose stream may be PENDING: `_service`, run by every poll, looks at these
        only (scanning all 1024 streams per poll cost about a tenth of the consumer thread)."""
        self._queue: collections.deque[_Queued] = collections.deque()
        self._failure_streaks: dict[KvNode, _FailureStreak] = {}
        self._proven: set[int] = set()
        """Live connections proven healthy by committed progress (see `note_progress`)."""
        self._errors: collections.deque[BaseException] = collections.deque()
        self._fatal: ReplicatorError | None = None
        self._last_connection_error: ReplicatorError | None = None
        self.reconnects = 0
        """Connections re-established after a loss since the client started (metrics)."""
        try:
            self._bootstrap()
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
        with self._lock:
            assert self._map is not None
            return self._map

    @property
    def last_connection_error(self) -> ReplicatorError | None:
        """Why a connection broke most recently (for diagnostics; reconnects are automatic)."""
        with self._lock:
            return self._last_connection_error

    def change_streams(self, *, timeout: float | None = None) -> bool:
        """Whether a live connection's producer accepted change streams (history snapshots)."""
        return self._any_connection(timeout).change_streams

    @property
    def acknowledged_bytes(self) -> int:
        """Bytes acknowledged to the producers on the live connections (flow-control metric)."""
        with self._lock:
            connections = list(self._by_id.values())
        return sum(c.flow_control.acknowledged_total for c in connections)

    @property
    def queued_bytes(self) -> int:
        """Bytes of producer messages received and not yet handed up by `poll`.

        Flow control bounds it: about one window plus one message per connection, however
        long the layer above leaves `poll` uncalled.
        """
        with self._lock:
            return sum(queued.size for queued in self._queue)

    def stream_state(self, vbucket: int) -> StreamState | None:
        """The client-side state of a vbucket's stream, None when it has none."""
        with self._lock:
            stream = self._streams.get(vbucket)
            return None if stream is None else stream.state

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
        with self._lock:
            self._check_open()
            assert self._map is not None
            self._map.active_node(vbucket)  # range check
            if position.vbucket != vbucket:
                raise ConfigError(
                    f"open_stream({vbucket}) got the position of vbucket {position.vbucket}"
                )
            plan_stream_request(position, failover_log, end_seqno=end)  # validate now
            existing = self._streams.get(vbucket)
            if existing is not None and existing.state is not StreamState.PENDING:
                raise ConfigError(
                    f"vbucket {vbucket} already has a stream ({existing.state.value}); "
                    "close it first"
                )
            stream = VbucketStream(
                vbucket, end_seqno=end, position=position, failover_log=failover_log
            )
            self._streams[vbucket] = stream
            self._pending.add(vbucket)
        self._service()

    def close_stream(self, vbucket: int) -> bool:
        """Close `vbucket`'s stream. Returns False when the vbucket had no stream.

        An open stream ends with StreamEnd (CLOSED) through `poll`. A stream whose request is
        still unanswered is closed as soon as it opens (StreamOpened, then StreamEnd CLOSED),
        or silently dropped if the request fails; a pending one is dropped at once.
        """
        with self._lock:
            stream = self._streams.get(vbucket)
            if stream is None:
                return False
            if stream.state is StreamState.PENDING:
                self._finish(stream)
            elif stream.state is StreamState.REQUESTED:
                stream.close_wanted = True
            elif stream.state is StreamState.OPEN:
                self._send_close(stream)
            return True

    def poll(self, timeout: float = 1.0, *, max_events: int | None = None) -> EventBatch:
        """Wait up to `timeout` s for events; return those queued (possibly none).

        Raises a stream's failure (e.g. a stream request refused for good) or the client's
        fatal error (reconnect deadline passed, credentials no longer accepted).
        """
        limit = max_events or self._options.max_batch_events
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            self._service()
            with self._cond:
                if self._errors:
                    raise self._errors.popleft()
                if self._fatal is not None:
                    raise self._fatal
                if self._queue:
                    return self._take_batch(limit)
                if self._closed:
                    raise ConfigError("the client is closed")
                now = time.monotonic()
                remaining = deadline - now
                if remaining <= 0:
                    return EventBatch((), AckReceipt({}))
                due = [
                    s.not_before
                    for s in map(self._streams.get, self._pending)
                    if s is not None and s.state is StreamState.PENDING and s.not_before > now
                ]
                wait = min([remaining, *(d - now for d in due)])
                self._cond.wait(wait)

    def acknowledge(self, batch: EventBatch) -> None:
        """The layer above staged every event of `batch`: release its flow-control bytes."""
        counts = batch.receipt.take()
        for connection_id, size in counts.items():
            with self._lock:
                connection = self._by_id.get(connection_id)
            if connection is not None:
                connection.acknowledge(size)

    def note_progress(self, vbuckets: Iterable[int]) -> None:
        """The layer above committed changes of these vbuckets: the connections streaming them
        are proven healthy (ClientOptions.connection_stable_after)."""
        with self._lock:
            for vb in vbuckets:
                stream = self._streams.get(vb)
                if stream is not None and stream.connection_id is not None:
                    self._proven.add(stream.connection_id)

    def failover_log(self, vbucket: int, *, timeout: float | None = None) -> FailoverLog:
        """The vbucket's current failover log from its active node (GET_FAILOVER_LOG)."""
        for _ in range(3):
            connection = self._connection_for(vbucket, timeout)
            reply = connection.call(GetFailoverLog(vbucket), timeout)
            if reply.status == Status.NOT_MY_VBUCKET:
                self._refresh_map_now(connection, reply, timeout)
                continue
            if reply.status != Status.SUCCESS:
                raise ProtocolError(
                    f"vbucket {vbucket}: GET_FAILOVER_LOG failed on {connection.address}: "
                    f"{reply.status_name}",
                    opcode=Opcode.DCP_GET_FAILOVER_LOG,
                )
            return failover_log_of(reply)
        raise ProtocolError(
            f"vbucket {vbucket}: nodes keep answering NOT_MY_VBUCKET",
            opcode=Opcode.DCP_GET_FAILOVER_LOG,
        )

    def high_seqnos(
        self, *, timeout: float | None = None, connected_only: bool = False
    ) -> dict[int, int]:
        """Every active vbucket's high seqno (GET_ALL_VB_SEQNOS on each node).

        `connected_only`: ask only the nodes connected now, without waiting for the others
        (their vbuckets are missing from the answer): a periodic check must not stall its
        caller while a node is down.
        """
        cluster_map = self.cluster_map
        seqnos: dict[int, int] = {}
        for node in cluster_map.nodes:
            owned = set(cluster_map.vbuckets_of(node))
            if not owned:
                continue
            if connected_only:
                with self._lock:
                    current = self._connections.get(node)
                if current is None or not current.is_open:
                    continue
            connection = self._connection_to(node, timeout)
            reply = connection.call(GetAllVbSeqnos(VbucketState.ACTIVE), timeout)
            if reply.status != Status.SUCCESS:
                raise _refused(
                    connection, reply, Opcode.GET_ALL_VB_SEQNOS, "its vbuckets' high seqnos"
                )
            for record in vbucket_seqnos_of(reply):
                if record.vbucket in owned:
                    seqnos[record.vbucket] = record.seqno
        return seqnos

    def collections_manifest(self, *, timeout: float | None = None) -> dict[str, object]:
        """The bucket's collections manifest JSON (GET_COLLECTIONS_MANIFEST)."""
        connection = self._any_connection(timeout)
        if not connection.collections:
            raise ConfigError(
                f"{connection.address} did not negotiate collections: no manifest to fetch"
            )
        reply = connection.call(GetCollectionsManifest(), timeout)
        if reply.status != Status.SUCCESS:
            raise _refused(
                connection, reply, Opcode.GET_COLLECTIONS_MANIFEST, "the bucket's collections"
            )
        try:
            manifest = json.loads(response_value(reply))
        except ValueError as exc:
            raise ProtocolError(
                f"collections manifest is not JSON: {exc}", opcode=Opcode.GET_COLLECTIONS_MANIFEST
            ) from None
        if not isinstance(manifest, dict):
            raise ProtocolError(
                "collections manifest is not a JSON object", opcode=Opcode.GET_COLLECTIONS_MANIFEST
            )
        return manifest

    def close(self) -> None:
        """Close every connection and stop reconnecting. Idempotent."""
        with self._cond:
            self._closed = True
            self._stop.set()
            connections = list(self._by_id.values())
            connectors = list(self._connecting.values())
            self._connections.clear()
            self._by_id.clear()
            self._proven.clear()
            self._cond.notify_all()
        for connection in connections:
            connection.close()
        for thread in connectors:
            if thread is not threading.current_thread():
                thread.join(self._options.connection.connect_timeout + 1.0)

    def __enter__(self) -> DcpClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- bootstrap and connections -------------------------------------------------------

    def _bootstrap(self) -> None:
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
            self._map = cluster_map
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
            if node in self._connections or not cluster_map.vbuckets_of(node):
                continue
            connection = self._new_connection(node.host, node.port(tls=self._connstr.tls))
            try:
                connection.open()
            except PERMANENT_ERRORS:
                raise
            except ReplicatorError as exc:
                log.warning("bootstrap: %s; retrying in the background", exc)
                with self._lock:
                    self._ensure_connecting(node)
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
            listener=self,
        )

    def _register(self, node: KvNode, connection: NodeConnection) -> bool:
        """Make `connection` the node's; False when the client closed or the connection broke
        already (then counted as a failure, its loss not yet known to be this node's, and the
        node reconnected)."""
        with self._cond:
            if self._closed:
                connection.close()
                return False
            if not connection.is_open:
                cause = connection.failure or ConnectionLostError(
                    connection.address, "the connection closed right after opening"
                )
                self._count_failure(node, cause, fresh=False)
                self._ensure_connecting(node)  # a no-op inside the node's reconnect thread
                return False
            self._connections[node] = connection
            self._by_id[connection.connection_id] = connection
            self._node_of[connection.connection_id] = node
            if self._connecting.get(node) is threading.current_thread():
                # From now on a loss of this connection must be able to start a reconnect.
                del self._connecting[node]
            self._cond.notify_all()
            return True

    def _ensure_connecting(self, node: KvNode) -> None:
        """Start a reconnect thread for `node` unless connected or connecting (lock held)."""
        if self._closed or node in self._connecting:
            return
        existing = self._connections.get(node)
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
        try:
            while not self._stop.is_set():
                with self._lock:
                    if self._map is not None and node not in self._map.nodes:
                        log.info("%s left the cluster map; not reconnecting", node)
                        self._failure_streaks.pop(node, None)
                        return
                    streak = self._failure_streaks.get(node)
                    failures = 0 if streak is None else streak.failures
                    fatal = None
                    if streak is not None and time.monotonic() - streak.first_at > backoff.deadline:
                        fatal = self._gave_up_on(node, streak)
                if fatal is not None:
                    self._set_fatal(fatal)
                    return
                if failures and self._stop.wait(backoff.delay(failures)):
                    return
                connection = self._new_connection(node.host, node.port(tls=self._connstr.tls))
                try:
                    connection.open()
                except PERMANENT_ERRORS as exc:
                    self._set_fatal(exc)
                    return
                except ReplicatorError as exc:
                    with self._lock:
                        failures = self._count_failure(node, exc, fresh=False)
                    log.warning("reconnect to %s failed (attempt %d): %s", node, failures, exc)
                    self._refresh_map_async()
                    continue
                if self._stop.is_set():
                    connection.close()
                    return
                self._adopt_config(connection.cluster_config, connection.host)
                if self._register(node, connection):
                    self.reconnects += 1
                    log.info("reconnected to %s", node)
                    return
        finally:
            with self._cond:
                if self._connecting.get(node) is threading.current_thread():
                    del self._connecting[node]
                self._cond.notify_all()

    def _count_failure(self, node: KvNode, cause: ReplicatorError, *, fresh: bool) -> int:
        """Count a failed or broken connection to `node` (lock held); the streak's length.

        `fresh`: the broken connection had been stable, so a new streak starts.
        """
        streak = self._failure_streaks.get(node)
        if streak is None or fresh:
            streak = _FailureStreak(first_at=time.monotonic())
            self._failure_streaks[node] = streak
        streak.failures += 1
        same = streak.last_cause is not None and str(streak.last_cause) == str(cause)
        streak.same_cause = streak.same_cause + 1 if same else 1
        streak.last_cause = cause
        if isinstance(cause, ProtocolError) and streak.same_cause == SAME_FRAME_REPORTED_AFTER:
            left = self._options.reconnect.deadline - (time.monotonic() - streak.first_at)
            log.error(
                "%s: the same frame was refused %d times in a row, on every new connection: %s; "
                "reconnecting with backoff until the deadline (%.0f s left), then the run fails",
                node, streak.same_cause, cause, max(0.0, left),
            )
        return streak.failures

    def _gave_up_on(self, node: KvNode, streak: _FailureStreak) -> ConnectionLostError:
        """The fatal error of a node whose streak outlasted the reconnect deadline."""
        cause = streak.last_cause
        if isinstance(cause, ProtocolError) and streak.same_cause > 1:
            what = (
                f"the same frame was refused {streak.same_cause} times in a row ({cause}); the "
                "producer sends something this consumer cannot apply: check the server's version "
                "and DCP settings, or report the frame; the mirror stays at its committed "
                "position and a new run resumes from there"
            )
        elif isinstance(cause, ProtocolError):
            what = (
                f"{streak.failures} connections in a row broke before committing anything; "
                f"last cause: {cause}; check the server's version and DCP settings"
            )
        else:
            what = (
                f"{streak.failures} connections in a row failed, or broke within "
                f"{self._options.connection_stable_after:g} s before committing anything; last "
                f"cause: {cause}; check that the node is up and reachable from this host"
            )
        return ConnectionLostError(
            str(node), f"could not reconnect within {self._options.reconnect.deadline:g} s: {what}"
        )

    def _set_fatal(self, error: ReplicatorError) -> None:
        log.error("DCP client failed: %s", error)
        with self._cond:
            if self._fatal is None:
                self._fatal = error
            self._cond.notify_all()

    def _connection_for(self, vbucket: int, timeout: float | None) -> NodeConnection:
        wait = self._options.connection.request_timeout if timeout is None else timeout
        deadline = time.monotonic() + wait
        with self._cond:
            while True:
                self._check_open()
                assert self._map is not None
                node = self._map.active_node(vbucket)
                if node is not None:
                    connection = self._connections.get(node)
                    if connection is not None and connection.is_open:
                        return connection
                    self._ensure_connecting(node)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    where = "no active node" if node is None else f"no connection to {node}"
                    raise ConnectionLostError(
                        str(node or self.bucket), f"vbucket {vbucket}: {where} after {wait:g} s"
                    )
                self._cond.wait(remaining)

    def _connection_to(self, node: KvNode, timeout: float | None) -> NodeConnection:
        wait = self._options.connection.request_timeout if timeout is None else timeout
        deadline = time.monotonic() + wait
        with self._cond:
            while True:
                self._check_open()
                connection = self._connections.get(node)
                if connection is not None and connection.is_open:
                    return connection
                self._ensure_connecting(node)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ConnectionLostError(str(node), f"no connection after {wait:g} s")
                self._cond.wait(remaining)

    def _any_connection(self, timeout: float | None) -> NodeConnection:
        wait = self._options.connection.request_timeout if timeout is None else timeout
        deadline = time.monotonic() + wait
        with self._cond:
            while True:
                self._check_open()
                for connection in self._connections.values():
                    if connection.is_open:
                        return connection
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ConnectionLostError(self.bucket, f"no live connection after {wait:g} s")
                self._cond.wait(remaining)

    def _check_open(self) -> None:
        if self._fatal is not None:
            raise self._fatal
        if self._closed:
            raise ConfigError("the client is closed")

    # --- cluster map ---------------------------------------------------------------------

    def _adopt_config(self, raw: bytes, connected_host: str) -> None:
        try:
            candidate = parse_cluster_map(raw, connected_host=connected_host)
        except ReplicatorError as exc:
            log.warning("ignoring a cluster map that does not parse: %s", exc)
            return
        with self._cond:
            if not candidate.is_newer_than(self._map):
                return
            log.info(
                "cluster map rev %s replaces %s",
                candidate.version,
                None if self._map is None else self._map.version,
            )
            self._map = candidate
            self._cond.notify_all()

    def _refresh_map_async(self, via: NodeConnection | None = None) -> None:
        """Ask a node (any live one by default) for its cluster map; adopt it if newer."""
        with self._lock:
            candidates = [via] if via is not None and via.is_open else []
            candidates += [c for c in self._connections.values() if c.is_open]
        for connection in candidates:
            try:
                connection.request(
                    GetClusterConfig(), on_response=partial(self._on_config_reply, connection)
                )
                return
            except ConnectionLostError:
                continue

    def _refresh_map_now(
        self, connection: NodeConnection, reply: Response, timeout: float | None
    ) -> None:
        config = response_value(reply) if reply.status == Status.NOT_MY_VBUCKET else b""
        if not config:
            fetched = connection.call(GetClusterConfig(), timeout)
            if fetched.status != Status.SUCCESS:
                return
            config = response_value(fetched)
        self._adopt_config(config, connection.host)

    def _on_config_reply(self, connection: NodeConnection, reply: Response) -> None:
        if reply.status == Status.SUCCESS:
            self._adopt_config(response_value(reply), connection.host)

    # --- stream requests -----------------------------------------------------------------

    def _service(self) -> None:
        """Send the stream requests that are due. Never called with the lock held."""
        now = time.monotonic()
        due: list[tuple[VbucketStream, NodeConnection]] = []
        with self._lock:
            if self._closed or self._map is None:
                return
            for vbucket in list(self._pending):
                stream = self._streams.get(vbucket)
                if stream is None or stream.state is not StreamState.PENDING:
                    self._pending.discard(vbucket)
                    continue
                if not stream.ready_to_send(now):
                    continue
                if stream.position is None and self._committed_position is None:
                    self._finish(stream)  # nowhere to resume from
                    continue
                node = self._map.active_node(stream.vbucket)
                if node is None:
                    self._retry_later(stream, now, "no active copy in the cluster map")
                    self._refresh_map_async()
                    continue
                connection = self._connections.get(node)
                if connection is None or not connection.is_open:
                    self._ensure_connecting(node)
                    continue
                due.append((stream, connection))
        for stream, connection in due:
            self._send_stream_request(stream, connection)

    def _send_stream_request(self, stream: VbucketStream, connection: NodeConnection) -> None:
        vbucket = stream.vbucket
        position, failover_log = stream.position, stream.failover_log
        if position is None:
            assert self._committed_position is not None
            try:
                position, failover_log = self._committed_position(vbucket)
            except Exception as exc:  # the layer above's callback: surface its failure
                with self._lock:
                    if self._streams.get(vbucket) is stream:
                        self._finish(stream)
                    self._errors.append(exc)
                return
        try:
            if position.vbucket != vbucket:
                raise ConfigError(
                    f"committed_position({vbucket}) returned vbucket {position.vbucket}"
                )
            request = plan_stream_request(
                position,
                failover_log,
                end_seqno=stream.end_seqno,
                send_purge_seqno=connection.purge_seqno_supported,
                opaque=next_opaque(),
            )
        except ConfigError as exc:
            with self._lock:
                if self._streams.get(vbucket) is stream:
                    self._finish(stream)
                self._errors.append(exc)
            return
        with self._lock:
            if self._streams.get(vbucket) is not stream or not stream.ready_to_send(
                time.monotonic()
            ):
                return  # closed or changed meanwhile
            stream.position, stream.failover_log = position, failover_log
            stream.requested(request, request.opaque, connection.connection_id)
            try:
                connection.request(
                    request,
                    on_response=partial(
                        self._on_stream_response, vbucket, request.opaque, connection
                    ),
                )
            except ConnectionLostError:
                stream.pending()
                self._pending.add(vbucket)
                return
        log.debug("vbucket %d: stream requested from %s: %s", vbucket, connection.address, request)

    def _on_stream_response(
        self, vbucket: int, opaque: int, connection: NodeConnection, reply: Response
    ) -> None:
        outcome = read_stream_response(reply)
        now = time.monotonic()
        with self._cond:
            stream = self._streams.get(vbucket)
            if (
                stream is None
                or stream.opaque != opaque
                or stream.state is not StreamState.REQUESTED
            ):
                if outcome.kind is OutcomeKind.OPENED:
                    self._request_quietly(connection, CloseStream(vbucket))
                return
            kind = outcome.kind
            if stream.close_wanted and kind is not OutcomeKind.OPENED:
                self._finish(stream)  # closed before it opened: nothing to retry or report
            elif kind is OutcomeKind.OPENED:
                assert outcome.failover_log is not None
                stream.opened()
                self._enqueue(StreamOpened(vbucket, outcome.failover_log), connection, 0)
                if stream.close_wanted:
                    self._send_close(stream)
            elif kind is OutcomeKind.ROLLBACK:
                assert outcome.rollback_seqno is not None
                log.info(
                    "vbucket %d: producer asks to roll back to seqno %d",
                    vbucket,
                    outcome.rollback_seqno,
                )
                self._finish(stream)
                self._enqueue(RollbackRequired(vbucket, outcome.rollback_seqno), connection, 0)
            elif kind is OutcomeKind.OUT_OF_RANGE:
                # Stays REQUESTED while we learn the producer's high seqno.
                self._request_quietly(
                    connection,
                    GetAllVbSeqnos(VbucketState.ACTIVE),
                    partial(self._on_out_of_range, vbucket, opaque, connection),
                )
            elif kind is OutcomeKind.RETRY_LATER:
                self._retry_later(stream, now, f"producer busy ({reply.status_name})")
            elif kind is OutcomeKind.ALREADY_EXISTS:
                # Close the producer's stale stream, then ask again (stays REQUESTED meanwhile).
                self._request_quietly(
                    connection,
                    CloseStream(vbucket),
                    partial(self._after_stale_close, vbucket, opaque),
                )
            elif kind is OutcomeKind.NOT_MY_VBUCKET:
                if outcome.cluster_config:
                    self._adopt_config(outcome.cluster_config, connection.host)
                else:
                    self._refresh_map_async(connection)
                self._retry_later(stream, now, f"{connection.address} is not its active node")
            else:
                self._finish(stream)
                self._errors.append(
                    ProtocolError(
                        f"vbucket {vbucket}: {connection.address} refused the stream request: "
                        f"{reply.status_name}",
                        opcode=Opcode.DCP_STREAM_REQ,
                    )
                )
            self._cond.notify_all()

    def _on_out_of_range(
        self, vbucket: int, opaque: int, connection: NodeConnection, reply: Response
    ) -> None:
        with self._cond:
            stream = self._streams.get(vbucket)
            if stream is None or stream.opaque != opaque or stream.request is None:
                return
            request = stream.request
            if stream.close_wanted:
                self._finish(stream)
                return
            high = None
            if reply.status == Status.SUCCESS:
                high = {r.vbucket: r.seqno for r in vbucket_seqnos_of(reply)}.get(vbucket)
            if high is None:
                self._refresh_map_async(connection)
                self._retry_later(stream, time.monotonic(), "ERANGE and no high seqno known")
            elif request.start_seqno > high:
                log.warning(
                    "vbucket %d: resume seqno %d is beyond the producer's high seqno %d: the "
                    "producer lost data the mirror has (failover without a new history?); "
                    "asking the layer above to roll back to %d",
                    vbucket,
                    request.start_seqno,
                    high,
                    high,
                )
                self._finish(stream)
                self._enqueue(RollbackRequired(vbucket, high), connection, 0)
            else:
                self._finish(stream)
                self._errors.append(
                    ProtocolError(
                        f"vbucket {vbucket}: {connection.address} refused the stream request as "
                        f"out of range (ERANGE): start {request.start_seqno}, snapshot "
                        f"[{request.snapshot_start}, {request.snapshot_end}], end "
                        f"{request.end_seqno}, producer high seqno {high}",
                        opcode=Opcode.DCP_STREAM_REQ,
                    )
                )
            self._cond.notify_all()

    def _after_stale_close(self, vbucket: int, opaque: int, reply: Response) -> None:
        with self._cond:
            stream = self._streams.get(vbucket)
            if stream is None or stream.opaque != opaque:
                return
            self._retry_later(stream, time.monotonic(), "a stream already existed")
            self._cond.notify_all()

    def _retry_later(self, stream: VbucketStream, now: float, why: str) -> None:
        if stream.close_wanted:
            self._finish(stream)
            return
        at = stream.failed_attempt(now, self._options.stream_retry)
        if at is None:
            self._finish(stream)
            self._errors.append(
                ConnectionLostError(
                    self.bucket,
                    f"vbucket {stream.vbucket}: stream request kept failing for "
                    f"{self._options.stream_retry.deadline:g} s: {why}",
                )
            )
            return
        log.info("vbucket %d: stream request retried in %.2f s: %s", stream.vbucket, at - now, why)
        stream.pending(not_before=at)
        self._pending.add(stream.vbucket)

    def _send_close(self, stream: VbucketStream) -> None:
        connection = self._by_id.get(stream.connection_id or -1)
        stream.closing()
        if connection is None:
            return
        self._request_quietly(
            connection,
            CloseStream(stream.vbucket),
            partial(self._on_close_reply, stream.vbucket, stream.opaque, connection),
        )

    def _on_close_reply(
        self, vbucket: int, opaque: int | None, connection: NodeConnection, reply: Response
    ) -> None:
        with self._cond:
            stream = self._streams.get(vbucket)
            if stream is None or stream.opaque != opaque or stream.state is not StreamState.CLOSING:
                return
            if reply.status != Status.SUCCESS or not connection.stream_end_on_close:
                # No STREAM_END will come (old producer, or the stream was already gone).
                self._finish(stream)
                self._enqueue(StreamEnd(vbucket, StreamEndReason.CLOSED), connection, 0)
                self._cond.notify_all()

    def _request_quietly(
        self,
        connection: NodeConnection,
        request: CloseStream | GetAllVbSeqnos,
        on_response: partial[None] | None = None,
    ) -> None:
        # On a lost connection, on_connection_lost takes care of the streams.
        with contextlib.suppress(ConnectionLostError):
            connection.request(request, on_response=on_response)

    def _finish(self, stream: VbucketStream) -> None:
        stream.closed()
        if self._streams.get(stream.vbucket) is stream:
            del self._streams[stream.vbucket]

    # --- events --------------------------------------------------------------------------

    def _enqueue(
        self,
        event: StreamEvent,
        connection: NodeConnection,
        size: int,
        *,
        releases_stream: bool = False,
    ) -> None:
        self._queue.append(
            _Queued([event], [size], connection.connection_id, size, 1, releases_stream)
        )

    def _take_batch(self, limit: int) -> EventBatch:
        """Up to `limit` messages, or one run of more (runs are never split)."""
        events: list[StreamEvent] = []
        counts: dict[int, int] = collections.defaultdict(int)
        taken_messages = 0
        while self._queue and taken_messages < limit:
            queued = self._queue[0]
            room = limit - taken_messages
            if queued.messages > room:
                # Split the entry between events (a run stays whole: it goes past the limit
                # only when it is the batch's first event); the rest stays queued, with the
                # bytes it still holds.
                split = 0
                while split < len(queued.events) and room > 0:
                    weight = _message_count(queued.events[split])
                    if weight > room and (split or events):
                        break
                    room -= weight
                    split += 1
                if split == 0:
                    break
                part = queued.events[:split]
                events.extend(part)
                taken = sum(queued.sizes[:split])
                del queued.events[:split], queued.sizes[:split]
                queued.size -= taken
                queued.messages -= sum(_message_count(event) for event in part)
                if taken:
                    counts[queued.connection_id] += taken
                break
            self._queue.popleft()
            taken_messages += queued.messages
            events.extend(queued.events)
            if queued.size:
                counts[queued.connection_id] += queued.size
            if queued.releases_stream:
                stream = self._streams.get(queued.events[0].vbucket)
                if stream is not None and stream.state is StreamState.PENDING:
                    stream.awaiting_delivery = False
        return EventBatch(tuple(events), AckReceipt(counts))

    # --- ConnectionListener (called on connection I/O threads) ---------------------------

    def on_messages(self, connection: NodeConnection, messages: Sequence[Delivered]) -> None:
        """Queue streams' messages; drop (and acknowledge) those of no current stream.

        The per-message work is kept to a minimum (this runs for every DCP message): a
        stream is looked up once per run of messages with the same vbucket and opaque, and
        the accepted messages of the read go into the queue as one entry.
        """
        dropped: list[Delivered] = []
        queued = False
        connection_id = connection.connection_id
        events: list[StreamEvent] = []
        sizes: list[int] = []
        last_vbucket = last_opaque = -1
        accepted = False
        with self._cond:
            for delivered in messages:
                message, opaque, size = delivered
                kind = type(message)
                if kind is SetVbucketState or kind is DcpNoop:
                    dropped.append(delivered)
                    continue
                # Not a noop or a vbucket state: a stream event. Typed by assignment, since
                # typing.cast is a call, and this loop runs for every message.
                event: StreamEvent = message  # type: ignore[assignment]
                vbucket = event.vbucket
                if vbucket != last_vbucket or opaque != last_opaque:
                    stream = self._streams.get(vbucket)
                    accepted = stream is not None and stream.accepts(opaque, connection_id)
                    last_vbucket, last_opaque = vbucket, opaque
                if not accepted:
                    dropped.append(delivered)
                    continue
                queued = True
                if kind is StreamEnd:
                    self._queue_read(events, sizes, connection_id)
                    events, sizes = [], []
                    assert stream is not None
                    self._on_stream_end(stream, cast(StreamEnd, event), connection, size)
                    last_vbucket = -1  # the stream's state changed: look it up again
                else:
                    events.append(event)
                    sizes.append(size)
            self._queue_read(events, sizes, connection_id)
            if queued:
                self._cond.notify_all()
        for message, opaque, size in dropped:
            log.debug("dropped %s of no current stream (opaque %d)", type(message).__name__, opaque)
            connection.acknowledge(size)

    def _queue_read(self, events: list[StreamEvent], sizes: list[int], connection_id: int) -> None:
        if events:
            messages = sum(_message_count(event) for event in events)
            self._queue.append(_Queued(events, sizes, connection_id, sum(sizes), messages))

    def _on_stream_end(
        self, stream: VbucketStream, end: StreamEnd, connection: NodeConnection, size: int
    ) -> None:
        action = stream_end_action(end.reason)
        if (
            stream.state is StreamState.CLOSING
            or action is EndAction.FINAL
            or self._committed_position is None
        ):
            self._finish(stream)
            self._enqueue(end, connection, size)
            return
        log.info(
            "vbucket %d: stream ended (%s); reopening from the committed position",
            stream.vbucket,
            end.reason.name,
        )
        stream.pending(awaiting_delivery=True)
        self._pending.add(stream.vbucket)
        stream.position = None
        stream.failover_log = None
        if action is EndAction.REFRESH_MAP_AND_REOPEN:
            self._refresh_map_async(connection)
        self._enqueue(end, connection, size, releases_stream=True)

    def on_cluster_map_notification(
        self, connection: NodeConnection, notification: ClustermapChangeNotification
    ) -> None:
        """Adopt a pushed map, or fetch it when the push carried only its revision."""
        if notification.config:
            self._adopt_config(notification.config, connection.host)
            return
        with self._lock:
            current = (0, 0) if self._map is None else self._map.version
        if (notification.epoch or 0, notification.revision) > current:
            self._refresh_map_async(connection)

    def on_connection_lost(self, connection: NodeConnection, error: ReplicatorError) -> None:
        """End the connection's streams (StreamEnd DISCONNECTED handed up) and reconnect."""
        with self._cond:
            if self._closed:
                return
            self._last_connection_error = error
            node = self._node_of.pop(connection.connection_id, None)
            proven = connection.connection_id in self._proven
            self._proven.discard(connection.connection_id)
            if node is not None:
                opened_at = connection.opened_at
                lived = 0.0 if opened_at is None else time.monotonic() - opened_at
                # A refused frame is the producer's doing: only progress proves such a link.
                stable = lived >= self._options.connection_stable_after
                healthy = proven or (stable and not isinstance(error, ProtocolError))
                self._count_failure(node, error, fresh=healthy)
            self._by_id.pop(connection.connection_id, None)
            if node is not None and self._connections.get(node) is connection:
                del self._connections[node]
            for stream in list(self._streams.values()):
                if stream.connection_id != connection.connection_id:
                    continue
                if stream.state is StreamState.REQUESTED:
                    stream.pending()  # nothing was handed up: retry with the same position
                    self._pending.add(stream.vbucket)
                elif stream.state is StreamState.CLOSING or self._committed_position is None:
                    reason = (
                        StreamEndReason.CLOSED
                        if stream.state is StreamState.CLOSING
                        else StreamEndReason.DISCONNECTED
                    )
                    self._finish(stream)
                    self._enqueue(StreamEnd(stream.vbucket, reason), connection, 0)
                else:
                    stream.pending(awaiting_delivery=True)
                    self._pending.add(stream.vbucket)
                    stream.position = None
                    stream.failover_log = None
                    self._enqueue(
                        StreamEnd(stream.vbucket, StreamEndReason.DISCONNECTED),
                        connection,
                        0,
                        releases_stream=True,
                    )
            if node is not None and self._map is not None and node in self._map.nodes:
                self._ensure_connecting(node)
            self._cond.notify_all()
