"""One DCP connection to one data node: connect, handshake, then a selector-driven I/O thread.

Handshake (spec/NOTES.md section 4), synchronous in the caller's thread: HELLO, SASL, SELECT_BUCKET,
GET_CLUSTER_CONFIG, DCP_OPEN, one DCP_CONTROL per setting. Then one thread per connection owns
the socket for reads and writes (so a TLS socket is never used from two threads at once): it
decodes frames with the codec, matches responses to requests by opaque, answers DCP_NOOP,
counts flow-control bytes, and hands stream messages and cluster-map notifications to a
listener in wire order. Other threads send by queueing bytes and waking the loop.

Failure handling: a malformed frame raises ProtocolError inside the loop; the connection is
closed at once, so nothing decoded after the bad frame reaches the listener, which gets
`on_connection_lost(error)` exactly once. Silence for the dead-connection timeout (two noop
intervals) is a ConnectionLostError; with no stream open the producer sends no noops, so we
probe with a client NOOP (0x0a) when idle.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import logging
import selectors
import socket
import ssl
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Protocol, cast

from replicator.dcp.cluster.connstr import format_address
from replicator.dcp.protocol.codec import (
    MAX_CONNECTION_NAME_BYTES,
    ClientRequest,
    CloseStream,
    ClustermapChangeNotification,
    ConnectionFeatures,
    DcpControl,
    DcpNoop,
    DcpOpen,
    GetClusterConfig,
    Hello,
    Noop,
    ProducerMessage,
    Response,
    SaslAuth,
    SaslListMechs,
    SaslStep,
    SelectBucket,
    StreamRequest,
    dcp_noop_reply,
    decode_dcp_message,
    decode_response,
    decode_server_request,
    encode_request,
    encode_response,
    hello_features_of,
    sasl_mechanisms_of,
)
from replicator.dcp.protocol.codec import BufferAck as BufferAckRequest
from replicator.dcp.protocol.columnar import DocumentColumns, DocumentRun
from replicator.dcp.protocol.events import DocumentChanges, StreamEnd
from replicator.dcp.protocol.frame import DEFAULT_MAX_BODY_SIZE, HEADER_SIZE, Frame, FrameReader
from replicator.dcp.protocol.opcodes import (
    Datatype,
    DcpOpenFlags,
    HelloFeature,
    Magic,
    Opcode,
    Status,
)
from replicator.dcp.protocol.values import decompress_value
from replicator.dcp.transport.auth import Credentials, SaslMechanism, authenticate
from replicator.dcp.transport.flow_control import DEFAULT_WINDOW_BYTES, FlowControl
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

REQUESTED_FEATURES = (
    HelloFeature.XERROR,
    HelloFeature.SELECT_BUCKET,
    HelloFeature.JSON,
    HelloFeature.SNAPPY,
    HelloFeature.XATTR,
    HelloFeature.COLLECTIONS,
    HelloFeature.DUPLEX,
    HelloFeature.CLUSTERMAP_CHANGE_NOTIFICATION,
)
"""HELLO features asked for; DUPLEX + CLUSTERMAP_CHANGE_NOTIFICATION make the node push maps."""

OPTIONAL_CONTROL_REFUSALS = frozenset({Status.EINVAL, Status.NOT_SUPPORTED, Status.UNKNOWN_COMMAND})
"""How an older producer refuses a DCP_CONTROL key it does not know."""

_READ_CHUNK = 256 * 1024
_READS_PER_TURN = 16
"""Reads before the loop flushes its sends (noop replies, acks) again."""
_MAX_TICK = 1.0

_opaques = itertools.count(1)
_opaque_lock = threading.Lock()
_connection_ids = itertools.count(1)


def next_opaque() -> int:
    """A process-wide unique request opaque (non-zero u32)."""
    with _opaque_lock:
        while True:
            value = next(_opaques) & 0xFFFFFFFF
            if value:
                return value


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


ResponseHandler = Callable[[Response], None]


@dataclass(slots=True)
class _Pending:
    request: ClientRequest
    future: Future[Response]
    on_response: ResponseHandler | None


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
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self._outbound: deque[bytes] = deque()
        self._send_buffer = bytearray()
        self._early_frames: deque[Frame] = deque()
        self._undelivered: list[Delivered] = []
        self._undelivered_bytes = 0
        self._open_streams: set[int] = set()
        self._closed = threading.Event()
        self._lost: ReplicatorError | None = None
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
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
            self._sock = self._connect()
            self._handshake()
        except BaseException as exc:
            log.debug("%s: opening failed: %s", self.address, exc)
            self._close_sockets()
            self._closed.set()
            raise
        log.info(
            "%s: DCP connection %s open (sasl=%s, collections=%s, controls=%s)",
            self.address,
            self.name,
            self.sasl_mechanism.value if self.sasl_mechanism else None,
            self.features.collections,
            ",".join(sorted(self.accepted_controls)),
        )
        self._sock.setblocking(False)
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
            pending = list(self._pending.values())
            self._pending.clear()
        if not already:
            self._wake()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        if thread is None or not thread.is_alive():
            self._close_sockets()
        error = ConnectionLostError(self.address, "connection closed by the client")
        for entry in pending:
            if not entry.future.done():
                entry.future.set_exception(error)

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
            self._pending[request.opaque] = _Pending(request, future, on_response)
            self._outbound.append(data)
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
            self._outbound.append(data)
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
        with contextlib.suppress(OSError):  # a full wake pipe already wakes the loop
            self._wake_w.send(b"\x00")

    # --- connect and handshake -----------------------------------------------------------

    def _connect(self) -> socket.socket:
        timeout = self.options.connect_timeout
        try:
            sock = socket.create_connection((self.host, self.port), timeout=timeout)
        except OSError as exc:
            raise NodeUnreachableError(
                self.address, f"cannot connect within {timeout:g} s: {_os_reason(exc)}"
            ) from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if not self.tls:
            return sock
        context = self.options.tls.context()
        try:
            return context.wrap_socket(sock, server_hostname=self.host)
        except ssl.SSLCertVerificationError as exc:
            sock.close()
            raise TlsError(
                self.address, f"certificate not trusted: {exc.verify_message or exc.reason}"
            ) from None
        except (ssl.SSLError, OSError) as exc:
            sock.close()
            raise TlsError(self.address, f"TLS handshake failed: {_os_reason(exc)}") from None

    def _handshake(self) -> None:
        opts = self.options
        hello = self._call_sync(Hello(self.name, tuple(int(f) for f in REQUESTED_FEATURES)))
        self._expect_success(hello, "HELLO")
        self.hello_features = frozenset(hello_features_of(hello))
        if HelloFeature.SELECT_BUCKET not in self.hello_features:
            raise ProtocolError(
                f"{self.address}: the node did not agree to SELECT_BUCKET", opcode=Opcode.HELLO
            )
        mechanisms = self._call_sync(SaslListMechs())
        self._expect_success(mechanisms, "SASL_LIST_MECHS")
        self.sasl_mechanism = authenticate(
            self._sasl_roundtrip,
            self._credentials,
            sasl_mechanisms_of(mechanisms),
            node=self.address,
            tls=self.tls,
            allow_plain_over_tcp=opts.allow_plain_over_tcp,
            requested=opts.sasl_mechanism,
        )
        selected = self._call_sync(SelectBucket(self.bucket))
        if selected.status in (Status.NO_BUCKET, Status.EACCESS, Status.KEY_ENOENT):
            raise BucketNotFoundError(
                self.address,
                f"bucket {self.bucket!r} does not exist or user "
                f"{self._credentials.username!r} may not access it ({selected.status_name})",
            )
        self._expect_success(selected, "SELECT_BUCKET")
        config = self._call_sync(GetClusterConfig())
        self._expect_success(config, "GET_CLUSTER_CONFIG")
        self.cluster_config = response_value(config)
        flags = DcpOpenFlags.PRODUCER | DcpOpenFlags.INCLUDE_DELETE_TIMES
        if opts.include_xattrs and HelloFeature.XATTR in self.hello_features:
            flags |= DcpOpenFlags.INCLUDE_XATTRS
        opened = self._call_sync(DcpOpen(self.name, flags))
        if opened.status == Status.EACCESS:
            raise AuthenticationError(
                self.address,
                f"user {self._credentials.username!r} may not open DCP on bucket "
                f"{self.bucket!r}: it needs the Data DCP Reader role",
            )
        self._expect_success(opened, "DCP_OPEN")
        self.features = ConnectionFeatures.negotiated(self.hello_features, int(flags))
        self.accepted_controls = frozenset(self._send_controls())

    def _send_controls(self) -> list[str]:
        opts = self.options
        required = [
            ("connection_buffer_size", str(opts.flow_control_window)),
            ("enable_noop", "true"),
            ("set_noop_interval", str(opts.noop_interval)),
        ]
        optional = []
        if opts.enable_expiry_opcode:
            optional.append(("enable_expiry_opcode", "true"))
        optional.append(("send_stream_end_on_client_close_stream", "true"))
        if opts.request_marker_v2_2 and self.features.collections:
            optional.append(("max_marker_version", "2.2"))
        if opts.change_streams and self.features.collections:
            optional.append(("change_streams", "true"))
        accepted = []
        for key, value in required + optional:
            reply = self._call_sync(DcpControl(key, value))
            if reply.status == Status.SUCCESS:
                accepted.append(key)
            elif (key, value) in optional and reply.status in OPTIONAL_CONTROL_REFUSALS:
                log.info(
                    "%s: producer refused optional control %s (%s)",
                    self.address,
                    key,
                    reply.status_name,
                )
            else:
                raise ProtocolError(
                    f"{self.address}: DCP_CONTROL {key}={value} refused: {_describe(reply)}",
                    opcode=Opcode.DCP_CONTROL,
                )
        return accepted

    def _sasl_roundtrip(self, opcode: int, mechanism: bytes, payload: bytes) -> tuple[int, bytes]:
        request: ClientRequest
        if opcode == Opcode.SASL_AUTH:
            request = SaslAuth(mechanism.decode(), payload)
        else:
            request = SaslStep(mechanism.decode(), payload)
        reply = self._call_sync(request)
        return int(reply.status), reply.value

    def _expect_success(self, reply: Response, what: str) -> None:
        if reply.status != Status.SUCCESS:
            raise ProtocolError(
                f"{self.address}: {what} failed: {_describe(reply)}", opcode=reply.opcode
            )

    def _call_sync(self, request: ClientRequest) -> Response:
        """Handshake round trip on the still-blocking socket."""
        sock = self._sock
        assert sock is not None
        request = dataclasses.replace(request, opaque=next_opaque())
        what = type(request).__name__
        deadline = time.monotonic() + self.options.request_timeout
        try:
            sock.settimeout(self.options.request_timeout)
            sock.sendall(encode_request(request))
            while True:
                while self._early_frames:
                    frame = self._early_frames.popleft()
                    if frame.magic in (Magic.RESPONSE, Magic.FLEX_RESPONSE):
                        if frame.opaque == request.opaque:
                            return decode_response(frame)
                        continue  # a reply nobody waits for any more
                    if frame.magic == Magic.SERVER_REQUEST:
                        continue  # map pushes before the map is even fetched
                    raise ProtocolError(
                        f"{self.address}: unexpected frame during the handshake",
                        opcode=frame.opcode,
                    )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError
                sock.settimeout(remaining)
                data = sock.recv(_READ_CHUNK)
                if not data:
                    raise ConnectionLostError(
                        self.address, f"the node closed the connection during {what}"
                    )
                self._early_frames.extend(self._reader.feed(data))
        except TimeoutError:
            raise ConnectionLostError(
                self.address, f"no reply to {what} within {self.options.request_timeout:g} s"
            ) from None
        except ssl.SSLError as exc:
            raise TlsError(self.address, f"TLS error during {what}: {exc}") from None
        except OSError as exc:
            raise ConnectionLostError(
                self.address, f"connection broke during {what}: {_os_reason(exc)}"
            ) from None

    # --- the I/O thread ------------------------------------------------------------------

    def _run(self) -> None:
        sock = self._sock
        assert sock is not None
        # From here on data messages go into columns (the features are final now).
        self._columns = DocumentColumns(self.features)
        self._reader.sink = self._columns
        selector = selectors.DefaultSelector()
        try:
            selector.register(self._wake_r, selectors.EVENT_READ)
            selector.register(sock, selectors.EVENT_READ)
            writing = False
            more_to_read = bool(self._early_frames)
            while not self._closed.is_set():
                timeout = 0.0 if more_to_read else self._next_timer()
                for key, _ in selector.select(timeout):
                    if key.fileobj is self._wake_r:
                        self._drain_wake()
                while self._early_frames and not self._closed.is_set():
                    self._dispatch(self._early_frames.popleft())
                self._deliver()
                more_to_read = self._read_available(sock)
                self._check_liveness()  # may queue a probe: before the flush
                blocked = self._flush(sock)
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
                self._close_sockets()

    def _next_timer(self) -> float:
        idle = time.monotonic() - self._last_received
        dead_after = self.options.dead_after
        until = dead_after - idle
        if self._probe_opaque is None and not self._open_streams:
            until = min(until, dead_after / 2 - idle)
        return max(0.0, min(until, _MAX_TICK))

    def _drain_wake(self) -> None:
        with contextlib.suppress(OSError):
            while self._wake_r.recv(4096):
                pass

    def _read_available(self, sock: socket.socket) -> bool:
        """Read and dispatch what is there; True when more may be waiting (stopped early)."""
        for _ in range(_READS_PER_TURN):
            if self._closed.is_set():
                return False
            try:
                data = sock.recv(_READ_CHUNK)
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return False
            except InterruptedError:
                continue
            except OSError as exc:
                raise ConnectionLostError(self.address, f"read failed: {_os_reason(exc)}") from None
            if not data:
                raise ConnectionLostError(self.address, "the node closed the connection")
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

    def _flush(self, sock: socket.socket) -> bool:
        """Send queued bytes; True when the socket would block (wait for writability)."""
        with self._lock:
            while self._outbound:
                self._send_buffer += self._outbound.popleft()
        while self._send_buffer:
            try:
                sent = sock.send(self._send_buffer)
            except (BlockingIOError, ssl.SSLWantWriteError):
                return True
            except ssl.SSLWantReadError:
                return False
            except InterruptedError:
                continue
            except OSError as exc:
                raise ConnectionLostError(
                    self.address, f"write failed: {_os_reason(exc)}"
                ) from None
            del self._send_buffer[:sent]
        return False

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
                self._pending[probe.opaque] = _Pending(probe, Future(), self._probe_answered)
                self._outbound.append(encode_request(probe))

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
            entry = self._pending.pop(response.opaque, None)
        if entry is None:
            log.debug("%s: reply with unknown opaque %d ignored", self.address, response.opaque)
            return
        request = entry.request
        if isinstance(request, StreamRequest) and response.status == Status.SUCCESS:
            self._open_streams.add(request.vbucket)
        elif isinstance(request, CloseStream):
            self._open_streams.discard(request.vbucket)
        if entry.on_response is not None:
            entry.on_response(response)
        if not entry.future.done():
            entry.future.set_result(response)

    def _fail(self, error: ReplicatorError) -> None:
        with self._lock:
            deliberate = self._closed.is_set()
            self._closed.set()
            if not deliberate:
                self._lost = error
            pending = list(self._pending.values())
            self._pending.clear()
        self._close_sockets()
        for entry in pending:
            if not entry.future.done():
                entry.future.set_exception(error)
        if deliberate:
            return
        log.warning("%s: connection lost: %s", self.address, error)
        if self._listener is not None:
            self._listener.on_connection_lost(self, error)

    def _close_sockets(self) -> None:
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()
        for end in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                end.close()


def response_value(response: Response) -> bytes:
    """A reply's value, decompressed when the node sent it snappy-compressed."""
    if response.datatype & Datatype.SNAPPY:
        return decompress_value(response.value, opcode=response.opcode)
    return response.value


def _describe(reply: Response) -> str:
    """Status name plus the node's XERROR context, when it sent one."""
    text = reply.status_name
    if reply.value and reply.datatype & Datatype.JSON:
        try:
            context = json.loads(response_value(reply)).get("error", {}).get("context")
        except (ValueError, AttributeError, ProtocolError):
            context = None
        if context:
            text += f" ({str(context)[:200]})"
    return text


def _os_reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__
