"""One DCP connection to one data node: connect, handshake, then a selector-driven I/O thread.

The handshake (handshake.py) runs synchronously in the caller's thread. Then one thread per
connection owns the socket (socket_io.py) for reads and writes (so a TLS socket is never used
from two threads at once): it decodes frames with the codec, matches responses to requests by
opaque (pending.py), answers DCP_NOOP, counts flow-control bytes, and hands stream messages and
cluster-map notifications to a listener in wire order. Other threads send by queueing bytes and
waking the loop.

Failure handling: a malformed frame raises ProtocolError inside the loop; the connection is
closed at once, so nothing decoded after the bad frame reaches the listener, which gets
`on_connection_lost(error)` exactly once. Silence for the dead-connection timeout (two noop
intervals) is a ConnectionLostError; with no stream open the producer sends no noops, so we
probe with a client NOOP (0x0a) when idle.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import selectors
import threading
import time
import uuid
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Protocol, cast

from replicator.dcp.protocol.codec import (
    ClientRequest,
    ProducerMessage,
    decode_dcp_message,
    encode_request,
)
from replicator.dcp.protocol.columnar import DocumentColumns, DocumentRun
from replicator.dcp.protocol.dcp_messages import ConnectionFeatures, DcpNoop
from replicator.dcp.protocol.dcp_requests import BufferAck as BufferAckRequest
from replicator.dcp.protocol.dcp_requests import CloseStream, StreamRequest
from replicator.dcp.protocol.events import DocumentChanges, StreamEnd
from replicator.dcp.protocol.frame import HEADER_SIZE, Frame, FrameReader
from replicator.dcp.protocol.opcodes import Magic, Status
from replicator.dcp.protocol.pushes import ClustermapChangeNotification, decode_server_request
from replicator.dcp.protocol.requests import Noop
from replicator.dcp.protocol.responses import (
    Response,
    dcp_noop_reply,
    decode_response,
    encode_response,
)
from replicator.dcp.transport.auth import Credentials, SaslMechanism
from replicator.dcp.transport.flow_control import FlowControl
from replicator.dcp.transport.handshake import Handshake
from replicator.dcp.transport.options import ConnectionOptions
from replicator.dcp.transport.pending import (
    PendingRequest,
    PendingRequests,
    ResponseHandler,
    next_opaque,
)
from replicator.dcp.transport.socket_io import NodeSocket, format_address
from replicator.errors import ConnectionLostError, ReplicatorError

log = logging.getLogger(__name__)

_READS_PER_TURN = 16
"""Reads before the loop flushes its sends (noop replies, acks) again."""
_MAX_TICK = 1.0

_connection_ids = itertools.count(1)

Delivered = tuple[ProducerMessage | DocumentChanges, int, int]
"""A producer message as handed up: (message, the frame's opaque, its size on the wire). Data
messages come as DocumentChanges runs: the run's opaque, the wire bytes of all its messages."""


class ConnectionListener(Protocol):
    """What a connection hands up, always from its I/O thread, in wire order."""

    def on_messages(self, connection: NodeConnection, messages: Sequence[Delivered]) -> None:
        """Producer messages other than DCP_NOOP, already counted for flow control: those of
        one socket read (up to a response or server request, which come in between)."""
        ...

    def on_cluster_map_notification(
        self, connection: NodeConnection, notification: ClustermapChangeNotification
    ) -> None:
        """The node pushed a cluster-map change (with the map, or just its revision)."""
        ...

    def on_connection_lost(self, connection: NodeConnection, error: ReplicatorError) -> None:
        """The connection broke (called once; not called after `close()`)."""
        ...


class NodeConnection:
    """A DCP consumer connection to one node. `open()` connects and runs the handshake.

    Thread-safe: `request`, `acknowledge` and `close` may be called from any thread. Response
    handlers and listener callbacks run on the connection's I/O thread and must not block on
    a reply of this same connection.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        bucket: str,
        credentials: Credentials,
        tls: bool = False,
        options: ConnectionOptions | None = None,
        listener: ConnectionListener | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.address = format_address(host, port)
        self.bucket = bucket
        self.tls = tls
        self.options = options or ConnectionOptions()
        self.connection_id = next(_connection_ids)
        self.name = f"{self.options.service_name}:{uuid.uuid4().hex}"
        self.flow_control = FlowControl(window_bytes=self.options.flow_control_window)
        self.hello_features: frozenset[int] = frozenset()
        self.sasl_mechanism: SaslMechanism | None = None
        """The mechanism the handshake authenticated with; None before."""
        self.features = ConnectionFeatures()
        self.accepted_controls: frozenset[str] = frozenset()
        self.cluster_config = b""
        self._credentials = credentials
        self._listener = listener
        self._reader = FrameReader(max_body_size=self.options.max_body_size)
        self._columns = DocumentColumns(self.features)
        self._lock = threading.Lock()
        self._socket = NodeSocket(
            host, port, self.address, tls=tls, options=self.options, lock=self._lock
        )
        self._pending = PendingRequests()
        self._early_frames: deque[Frame] = deque()
        self._undelivered: list[Delivered] = []
        self._undelivered_bytes = 0
        self._open_streams: set[int] = set()
        self._closed = threading.Event()
        self._lost: ReplicatorError | None = None
        self._thread: threading.Thread | None = None
        self._last_received = time.monotonic()
        self._probe_opaque: int | None = None
        self.opened_at: float | None = None
        """time.monotonic() when `open()` completed the handshake; None before."""

    def __repr__(self) -> str:
        return f"NodeConnection({self.address}, id={self.connection_id}, name={self.name!r})"

    # --- negotiated facts ----------------------------------------------------------------

    @property
    def collections(self) -> bool:
        """The node agreed to collections: keys carry collection ids, manifests are available."""
        return self.features.collections

    @property
    def purge_seqno_supported(self) -> bool:
        """The producer accepted max_marker_version=2.2, so stream requests may carry it."""
        return "max_marker_version" in self.accepted_controls

    @property
    def change_streams(self) -> bool:
        """The producer accepted change_streams: snapshots flagged HISTORY hold every revision."""
        return "change_streams" in self.accepted_controls

    @property
    def stream_end_on_close(self) -> bool:
        """The producer sends STREAM_END (CLOSED) after our CLOSE_STREAM."""
        return "send_stream_end_on_client_close_stream" in self.accepted_controls

    @property
    def is_open(self) -> bool:
        return self._thread is not None and not self._closed.is_set()

    @property
    def failure(self) -> ReplicatorError | None:
        """Why the connection broke, None while it is fine or after a deliberate close."""
        return self._lost

    # --- life cycle ----------------------------------------------------------------------

    def open(self) -> NodeConnection:
        """Connect, authenticate, open the DCP connection and start the I/O thread.

        Raises NodeUnreachableError, TlsError, AuthenticationError, BucketNotFoundError,
        ProtocolError or ConnectionLostError; the socket is closed on failure.
        """
        if self._thread is not None or self._closed.is_set():
            raise RuntimeError(f"{self!r} was already opened")
        try:
            sock = self._socket.connect()
            negotiated = Handshake(
                sock,
                self._reader,
                self._early_frames,
                address=self.address,
                name=self.name,
                bucket=self.bucket,
                credentials=self._credentials,
                tls=self.tls,
                options=self.options,
            ).run()
        except BaseException as exc:
            log.debug("%s: opening failed: %s", self.address, exc)
            self._socket.close()
            self._closed.set()
            raise
        self.hello_features = negotiated.hello_features
        self.sasl_mechanism = negotiated.sasl_mechanism
        self.cluster_config = negotiated.cluster_config
        self.features = negotiated.features
        self.accepted_controls = negotiated.accepted_controls
        log.info(
            "%s: DCP connection %s open (sasl=%s, collections=%s, controls=%s)",
            self.address,
            self.name,
            self.sasl_mechanism.value if self.sasl_mechanism else None,
            self.features.collections,
            ",".join(sorted(self.accepted_controls)),
        )
        sock.setblocking(False)
        self._last_received = self.opened_at = time.monotonic()
        self._thread = threading.Thread(
            target=self._run, name=f"dcp-io-{self.address}", daemon=True
        )
        self._thread.start()
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Close the connection and stop its thread; pending requests fail. No listener call."""
        with self._lock:
            already = self._closed.is_set()
            self._closed.set()
            pending = self._pending.take_all()
        if not already:
            self._wake()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        if thread is None or not thread.is_alive():
            self._socket.close()
        error = ConnectionLostError(self.address, "connection closed by the client")
        for entry in pending:
            entry.fail(error)

    # --- requests ------------------------------------------------------------------------

    def request(
        self, request: ClientRequest, *, on_response: ResponseHandler | None = None
    ) -> Future[Response]:
        """Send a request; its reply resolves the future (and runs `on_response` first, on
        the I/O thread, before any later frame is handled). Assigns an opaque when it is 0.

        Raises ConnectionLostError when the connection is already closed.
        """
        if request.opaque == 0:
            request = dataclasses.replace(request, opaque=next_opaque())
        future: Future[Response] = Future()
        data = encode_request(request)
        with self._lock:
            self._check_usable()
            self._pending.add(PendingRequest(request, future, on_response))
            self._socket.queue(data)
        self._wake()
        return future

    def call(self, request: ClientRequest, timeout: float | None = None) -> Response:
        """Send a request and wait for its reply (never from the I/O thread)."""
        if self._thread is threading.current_thread():
            raise RuntimeError("call() on the connection's own I/O thread would deadlock")
        wait = self.options.request_timeout if timeout is None else timeout
        future = self.request(request)
        try:
            return future.result(wait)
        except FutureTimeout:
            raise ConnectionLostError(
                self.address, f"no reply to {type(request).__name__} within {wait:g} s"
            ) from None

    def acknowledge(self, size: int) -> int:
        """The layer above staged `size` bytes; sends BUFFER_ACK when due. Returns bytes acked.

        Ignored (returns 0) once the connection is closed: the producer forgot its window.
        """
        if self._closed.is_set():
            return 0
        ack = self.flow_control.staged(size)
        if ack:
            self._send_unanswered(encode_request(BufferAckRequest(ack)))
        return ack

    def _send_unanswered(self, data: bytes) -> None:
        """Queue bytes no reply is expected for (BUFFER_ACK, DCP_NOOP reply)."""
        with self._lock:
            if self._closed.is_set():
                return
            self._socket.queue(data)
        self._wake()

    def _check_usable(self) -> None:
        if self._lost is not None:
            raise ConnectionLostError(self.address, f"connection is broken: {self._lost}")
        if self._closed.is_set():
            raise ConnectionLostError(self.address, "connection is closed")
        if self._thread is None:
            raise RuntimeError(f"{self!r} is not open yet")

    def _wake(self) -> None:
        if self._thread is threading.current_thread():
            return  # the loop flushes before it selects again
        self._socket.wake()

    # --- the I/O thread ------------------------------------------------------------------

    def _run(self) -> None:
        sock = self._socket.sock
        assert sock is not None
        wake_reader = self._socket.wake_reader
        # From here on data messages go into columns (the features are final now).
        self._columns = DocumentColumns(self.features)
        self._reader.sink = self._columns
        selector = selectors.DefaultSelector()
        try:
            selector.register(wake_reader, selectors.EVENT_READ)
            selector.register(sock, selectors.EVENT_READ)
            writing = False
            more_to_read = bool(self._early_frames)
            while not self._closed.is_set():
                timeout = 0.0 if more_to_read else self._next_timer()
                for key, _ in selector.select(timeout):
                    if key.fileobj is wake_reader:
                        self._socket.drain_wake()
                while self._early_frames and not self._closed.is_set():
                    self._dispatch(self._early_frames.popleft())
                self._deliver()
                more_to_read = self._read_available()
                self._check_liveness()  # may queue a probe: before the flush
                blocked = self._socket.flush()
                if blocked != writing:
                    events = selectors.EVENT_READ | (selectors.EVENT_WRITE if blocked else 0)
                    selector.modify(sock, events)
                    writing = blocked
        except ReplicatorError as exc:
            self._fail(exc)
        except Exception as exc:  # a bug must not leave a silent half-dead connection
            log.exception("%s: I/O thread failed", self.address)
            self._fail(ConnectionLostError(self.address, f"internal error: {exc!r}"))
        finally:
            selector.close()
            if self._closed.is_set():
                self._socket.close()

    def _next_timer(self) -> float:
        idle = time.monotonic() - self._last_received
        dead_after = self.options.dead_after
        until = dead_after - idle
        if self._probe_opaque is None and not self._open_streams:
            until = min(until, dead_after / 2 - idle)
        return max(0.0, min(until, _MAX_TICK))

    def _read_available(self) -> bool:
        """Read and dispatch what is there; True when more may be waiting (stopped early)."""
        for _ in range(_READS_PER_TURN):
            if self._closed.is_set():
                return False
            data = self._socket.receive()
            if data is None:
                return False
            self._last_received = time.monotonic()
            # A ProtocolError stops the connection: the frames after a bad one are never
            # dispatched, those before it are delivered first (as they would be one by one).
            entries: list[object] = self._reader.feed(data)  # type: ignore[assignment]
            self._columns.finish()
            try:
                for entry in entries:
                    if self._closed.is_set():
                        return False
                    if type(entry) is DocumentRun:
                        self._take_run(entry)
                    else:
                        self._dispatch(cast(Frame, entry))
            finally:
                if not self._closed.is_set():
                    self._deliver()
            if self._reader.failure is not None:
                raise self._reader.failure
        return True

    def _take_run(self, run: DocumentRun) -> None:
        assert run.changes is not None
        self._undelivered.append((run.changes, run.opaque, run.size))
        self._undelivered_bytes += run.size

    def _check_liveness(self) -> None:
        idle = time.monotonic() - self._last_received
        dead_after = self.options.dead_after
        if idle >= dead_after:
            raise ConnectionLostError(
                self.address,
                f"nothing received for {idle:.1f} s (dead-connection timeout {dead_after:g} s, "
                "two noop intervals): connection presumed dead",
            )
        if idle >= dead_after / 2 and self._probe_opaque is None and not self._open_streams:
            probe = Noop(opaque=next_opaque())
            self._probe_opaque = probe.opaque
            with self._lock:
                self._pending.add(PendingRequest(probe, Future(), self._probe_answered))
                self._socket.queue(encode_request(probe))

    def _probe_answered(self, response: Response) -> None:
        self._probe_opaque = None

    def _dispatch(self, frame: Frame) -> None:
        """Handle one frame; producer messages wait in a list that `_deliver` hands up at once
        (one lock and one wake-up of the consumer per read, not per message)."""
        magic = frame.magic
        if magic == Magic.REQUEST or magic == Magic.FLEX_REQUEST:
            message = decode_dcp_message(frame, self.features)
            kind = type(message)
            if kind is DcpNoop:
                self._send_unanswered(encode_response(dcp_noop_reply(frame.opaque)))
                return
            if kind is StreamEnd:
                self._open_streams.discard(cast(StreamEnd, message).vbucket)
            # Frame.size inlined: two property calls per message were a twentieth of the drain.
            size = (
                HEADER_SIZE
                + len(frame.framing_extras)
                + len(frame.extras)
                + len(frame.key)
                + len(frame.value)
            )
            self._undelivered.append((message, frame.opaque, size))
            self._undelivered_bytes += size
            return
        # Anything else may change what the listener accepts: what came before goes up first.
        self._deliver()
        if magic == Magic.RESPONSE or magic == Magic.FLEX_RESPONSE:
            self._on_response(decode_response(frame))
        elif magic == Magic.SERVER_REQUEST:
            notification = decode_server_request(frame)
            if self._listener is not None:
                self._listener.on_cluster_map_notification(self, notification)
        # SERVER_RESPONSE: we never send server requests' replies' counterparts; ignore.

    def _deliver(self) -> None:
        """Count the waiting producer messages for flow control and hand them up, in order."""
        if not self._undelivered:
            return
        messages, self._undelivered = self._undelivered, []
        size, self._undelivered_bytes = self._undelivered_bytes, 0
        self.flow_control.received(size)
        if self._listener is not None:
            self._listener.on_messages(self, messages)

    def _on_response(self, response: Response) -> None:
        with self._lock:
            entry = self._pending.match(response)
        if entry is None:
            log.debug("%s: reply with unknown opaque %d ignored", self.address, response.opaque)
            return
        request = entry.request
        if isinstance(request, StreamRequest) and response.status == Status.SUCCESS:
            self._open_streams.add(request.vbucket)
        elif isinstance(request, CloseStream):
            self._open_streams.discard(request.vbucket)
        entry.complete(response)

    def _fail(self, error: ReplicatorError) -> None:
        with self._lock:
            deliberate = self._closed.is_set()
            self._closed.set()
            if not deliberate:
                self._lost = error
            pending = self._pending.take_all()
        self._socket.close()
        for entry in pending:
            entry.fail(error)
        if deliberate:
            return
        log.warning("%s: connection lost: %s", self.address, error)
        if self._listener is not None:
            self._listener.on_connection_lost(self, error)
