"""Stream routing: each vbucket's stream request sent to the vbucket's active node, its reply
read and the stream opened, retried, reopened or ended; and the producer messages each stream
accepts.

A stream waits PENDING until its request is due (`service`, run by every poll and
`open_stream`, sends those from the caller's thread), then REQUESTED, OPEN, CLOSING. Replies
run on the connection's I/O thread; both take the client's lock. A stream that ends for a
reason that is not final, or whose connection breaks, becomes PENDING again once its
StreamEnd was handed up, and resumes from `committed_position(vb)`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from functools import partial
from typing import cast

from replicator.dcp.cluster.event_queue import EventQueue
from replicator.dcp.cluster.map_tracker import MapTracker
from replicator.dcp.cluster.nodes import NodePool
from replicator.dcp.cluster.options import ClientOptions
from replicator.dcp.cluster.state import ClientState
from replicator.dcp.cluster.stream_table import StreamTable
from replicator.dcp.cluster.streams import (
    EndAction,
    OutcomeKind,
    StreamState,
    VbucketStream,
    plan_stream_request,
    read_stream_response,
    stream_end_action,
)
from replicator.dcp.protocol.dcp_messages import DcpNoop, SetVbucketState
from replicator.dcp.protocol.dcp_requests import CloseStream
from replicator.dcp.protocol.events import (
    RollbackRequired,
    StreamEnd,
    StreamEndReason,
    StreamEvent,
    StreamOpened,
)
from replicator.dcp.protocol.opcodes import Opcode, Status, VbucketState
from replicator.dcp.protocol.requests import GetAllVbSeqnos
from replicator.dcp.protocol.responses import Response, vbucket_seqnos_of
from replicator.dcp.transport.connection import Delivered, NodeConnection
from replicator.dcp.transport.pending import next_opaque
from replicator.errors import ConfigError, ConnectionLostError, ProtocolError
from replicator.model.aliases import CommittedPosition
from replicator.model.positions import MAX_SEQNO, FailoverLog, VbucketPosition

log = logging.getLogger(__name__)


class StreamRouter:
    """Sends the streams of a `StreamTable` to their nodes and acts on what comes back."""

    def __init__(
        self,
        state: ClientState,
        maps: MapTracker,
        nodes: NodePool,
        queue: EventQueue,
        streams: StreamTable,
        *,
        options: ClientOptions,
        bucket: str,
        committed_position: CommittedPosition | None,
    ) -> None:
        self._state = state
        self._maps = maps
        self._nodes = nodes
        self._queue = queue
        self._streams = streams
        self._options = options
        self._bucket = bucket
        self._committed_position = committed_position

    # --- the client's calls --------------------------------------------------------------

    def resume_from(self, committed_position: CommittedPosition) -> None:
        with self._state.lock:
            self._committed_position = committed_position

    def open(
        self,
        vbucket: int,
        position: VbucketPosition,
        failover_log: FailoverLog | None,
        end: int = MAX_SEQNO,
    ) -> None:
        """See `DcpClient.open_stream`."""
        with self._state.lock:
            self._state.check_open()
            assert self._maps.current is not None
            self._maps.current.active_node(vbucket)  # range check
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
            self._streams.add(stream)
        self.service()

    def close(self, vbucket: int) -> bool:
        """See `DcpClient.close_stream`."""
        with self._state.lock:
            stream = self._streams.get(vbucket)
            if stream is None:
                return False
            if stream.state is StreamState.PENDING:
                self._streams.finish(stream)
            elif stream.state is StreamState.REQUESTED:
                stream.close_wanted = True
            elif stream.state is StreamState.OPEN:
                self._send_close(stream)
            return True

    # --- stream requests -----------------------------------------------------------------

    def service(self) -> None:
        """Send the stream requests that are due. Never called with the lock held."""
        now = time.monotonic()
        due: list[tuple[VbucketStream, NodeConnection]] = []
        with self._state.lock:
            cluster_map = self._maps.current
            if self._state.closed or cluster_map is None:
                return
            for vbucket in self._streams.pending_vbuckets():
                stream = self._streams.get(vbucket)
                if stream is None or stream.state is not StreamState.PENDING:
                    self._streams.not_pending(vbucket)
                    continue
                if not stream.ready_to_send(now):
                    continue
                if stream.position is None and self._committed_position is None:
                    self._streams.finish(stream)  # nowhere to resume from
                    continue
                node = cluster_map.active_node(stream.vbucket)
                if node is None:
                    self._retry_later(stream, now, "no active copy in the cluster map")
                    self._refresh_map()
                    continue
                connection = self._nodes.connections.get(node)
                if connection is None or not connection.is_open:
                    self._nodes.ensure_connecting(node)
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
                with self._state.lock:
                    if self._streams.get(vbucket) is stream:
                        self._streams.finish(stream)
                    self._state.errors.append(exc)
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
            with self._state.lock:
                if self._streams.get(vbucket) is stream:
                    self._streams.finish(stream)
                self._state.errors.append(exc)
            return
        with self._state.lock:
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
                self._streams.retry(stream)
                return
        log.debug("vbucket %d: stream requested from %s: %s", vbucket, connection.address, request)

    def _on_stream_response(
        self, vbucket: int, opaque: int, connection: NodeConnection, reply: Response
    ) -> None:
        outcome = read_stream_response(reply)
        now = time.monotonic()
        with self._state.cond:
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
                self._streams.finish(stream)  # closed before it opened: nothing to retry or report
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
                self._streams.finish(stream)
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
                    self._maps.adopt(outcome.cluster_config, connection.host)
                else:
                    self._refresh_map(connection)
                self._retry_later(stream, now, f"{connection.address} is not its active node")
            else:
                self._streams.finish(stream)
                self._state.errors.append(
                    ProtocolError(
                        f"vbucket {vbucket}: {connection.address} refused the stream request: "
                        f"{reply.status_name}",
                        opcode=Opcode.DCP_STREAM_REQ,
                    )
                )
            self._state.cond.notify_all()

    def _on_out_of_range(
        self, vbucket: int, opaque: int, connection: NodeConnection, reply: Response
    ) -> None:
        with self._state.cond:
            stream = self._streams.get(vbucket)
            if stream is None or stream.opaque != opaque or stream.request is None:
                return
            request = stream.request
            if stream.close_wanted:
                self._streams.finish(stream)
                return
            high = None
            if reply.status == Status.SUCCESS:
                high = {r.vbucket: r.seqno for r in vbucket_seqnos_of(reply)}.get(vbucket)
            if high is None:
                self._refresh_map(connection)
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
                self._streams.finish(stream)
                self._enqueue(RollbackRequired(vbucket, high), connection, 0)
            else:
                self._streams.finish(stream)
                self._state.errors.append(
                    ProtocolError(
                        f"vbucket {vbucket}: {connection.address} refused the stream request as "
                        f"out of range (ERANGE): start {request.start_seqno}, snapshot "
                        f"[{request.snapshot_start}, {request.snapshot_end}], end "
                        f"{request.end_seqno}, producer high seqno {high}",
                        opcode=Opcode.DCP_STREAM_REQ,
                    )
                )
            self._state.cond.notify_all()

    def _after_stale_close(self, vbucket: int, opaque: int, reply: Response) -> None:
        with self._state.cond:
            stream = self._streams.get(vbucket)
            if stream is None or stream.opaque != opaque:
                return
            self._retry_later(stream, time.monotonic(), "a stream already existed")
            self._state.cond.notify_all()

    def _retry_later(self, stream: VbucketStream, now: float, why: str) -> None:
        if stream.close_wanted:
            self._streams.finish(stream)
            return
        at = stream.failed_attempt(now, self._options.stream_retry)
        if at is None:
            self._streams.finish(stream)
            self._state.errors.append(
                ConnectionLostError(
                    self._bucket,
                    f"vbucket {stream.vbucket}: stream request kept failing for "
                    f"{self._options.stream_retry.deadline:g} s: {why}",
                )
            )
            return
        log.info("vbucket %d: stream request retried in %.2f s: %s", stream.vbucket, at - now, why)
        self._streams.retry(stream, not_before=at)

    def _send_close(self, stream: VbucketStream) -> None:
        connection = self._nodes.by_id.get(stream.connection_id or -1)
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
        with self._state.cond:
            stream = self._streams.get(vbucket)
            if stream is None or stream.opaque != opaque or stream.state is not StreamState.CLOSING:
                return
            if reply.status != Status.SUCCESS or not connection.stream_end_on_close:
                # No STREAM_END will come (old producer, or the stream was already gone).
                self._streams.finish(stream)
                self._enqueue(StreamEnd(vbucket, StreamEndReason.CLOSED), connection, 0)
                self._state.cond.notify_all()

    def _request_quietly(
        self,
        connection: NodeConnection,
        request: CloseStream | GetAllVbSeqnos,
        on_response: partial[None] | None = None,
    ) -> None:
        # On a lost connection, on_connection_lost takes care of the streams.
        with contextlib.suppress(ConnectionLostError):
            connection.request(request, on_response=on_response)

    def _refresh_map(self, via: NodeConnection | None = None) -> None:
        self._maps.refresh(self._nodes.live(via))

    def _enqueue(
        self,
        event: StreamEvent,
        connection: NodeConnection,
        size: int,
        *,
        releases_stream: bool = False,
    ) -> None:
        self._queue.add(event, connection.connection_id, size, releases_stream=releases_stream)

    # --- what connections hand up (on their I/O threads) ---------------------------------

    def take_messages(
        self, connection: NodeConnection, messages: Sequence[Delivered]
    ) -> list[Delivered]:
        """Queue the streams' messages; return those of no current stream (to acknowledge).

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
        with self._state.cond:
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
                    self._queue.add_read(events, sizes, connection_id)
                    events, sizes = [], []
                    assert stream is not None
                    self._on_stream_end(stream, cast(StreamEnd, event), connection, size)
                    last_vbucket = -1  # the stream's state changed: look it up again
                else:
                    events.append(event)
                    sizes.append(size)
            self._queue.add_read(events, sizes, connection_id)
            if queued:
                self._state.cond.notify_all()
        return dropped

    def _on_stream_end(
        self, stream: VbucketStream, end: StreamEnd, connection: NodeConnection, size: int
    ) -> None:
        action = stream_end_action(end.reason)
        if (
            stream.state is StreamState.CLOSING
            or action is EndAction.FINAL
            or self._committed_position is None
        ):
            self._streams.finish(stream)
            self._enqueue(end, connection, size)
            return
        log.info(
            "vbucket %d: stream ended (%s); reopening from the committed position",
            stream.vbucket,
            end.reason.name,
        )
        self._streams.resume_from_committed(stream)
        if action is EndAction.REFRESH_MAP_AND_REOPEN:
            self._refresh_map(connection)
        self._enqueue(end, connection, size, releases_stream=True)

    def connection_lost(self, connection: NodeConnection) -> None:
        """End or re-queue the streams of a broken connection (lock held): StreamEnd
        DISCONNECTED is handed up for those that reopen."""
        for stream in self._streams.streams():
            if stream.connection_id != connection.connection_id:
                continue
            if stream.state is StreamState.REQUESTED:
                self._streams.retry(stream)  # nothing was handed up: same position again
            elif stream.state is StreamState.CLOSING or self._committed_position is None:
                reason = (
                    StreamEndReason.CLOSED
                    if stream.state is StreamState.CLOSING
                    else StreamEndReason.DISCONNECTED
                )
                self._streams.finish(stream)
                self._enqueue(StreamEnd(stream.vbucket, reason), connection, 0)
            else:
                self._streams.resume_from_committed(stream)
                self._enqueue(
                    StreamEnd(stream.vbucket, StreamEndReason.DISCONNECTED),
                    connection,
                    0,
                    releases_stream=True,
                )
