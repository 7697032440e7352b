"""A small synchronous memcached/DCP client for driving the simulated server in tests.

Built only from the wire codec, so the server's tests do not depend on the real consumer:
every frame the server sends is decoded with `decode_server_frame` (a frame the codec cannot
decode fails the test), responses are matched by opaque, and DCP messages queue up in order.
"""

from __future__ import annotations

import json
import socket
import ssl
import struct
import subprocess
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from scramp import ScramClient

from replicator.dcp.protocol.codec import (
    ClientRequest,
    ServerMessage,
    decode_server_frame,
    encode_request,
)
from replicator.dcp.protocol.dcp_messages import ConnectionFeatures, DcpNoop
from replicator.dcp.protocol.dcp_requests import BufferAck, DcpControl, DcpOpen, StreamRequest
from replicator.dcp.protocol.events import StreamEnd
from replicator.dcp.protocol.frame import Frame, FrameReader, encode_frame
from replicator.dcp.protocol.opcodes import (
    Datatype,
    DcpOpenFlags,
    HelloFeature,
    Magic,
    Opcode,
    Status,
    StreamRequestFlags,
)
from replicator.dcp.protocol.pushes import ClustermapChangeNotification
from replicator.dcp.protocol.requests import (
    GetClusterConfig,
    Hello,
    SaslAuth,
    SaslListMechs,
    SaslStep,
    SelectBucket,
)
from replicator.dcp.protocol.responses import (
    Response,
    dcp_noop_reply,
    encode_response,
    hello_features_of,
)
from replicator.model.positions import MAX_SEQNO
from replicator.sim.bucket import SimBucket
from replicator.sim.cluster import SimCluster
from replicator.sim.server import ServerOptions

DEFAULT_FEATURES = (
    HelloFeature.XERROR,
    HelloFeature.SELECT_BUCKET,
    HelloFeature.JSON,
    HelloFeature.XATTR,
    HelloFeature.COLLECTIONS,
)
PRODUCER_FLAGS = (
    DcpOpenFlags.PRODUCER | DcpOpenFlags.INCLUDE_XATTRS | DcpOpenFlags.INCLUDE_DELETE_TIMES
)
_SCRAMP = {
    "SCRAM-SHA512": "SCRAM-SHA-512",
    "SCRAM-SHA256": "SCRAM-SHA-256",
    "SCRAM-SHA1": "SCRAM-SHA-1",
}


class ConnectionClosedError(Exception):
    """The server closed the connection."""


@dataclass(frozen=True, slots=True)
class Received:
    """One frame from the server: the raw frame and what the codec decoded it into."""

    frame: Frame
    message: ServerMessage


class RawClient:
    """One TCP (or TLS) connection to a simulated node."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        timeout: float = 5.0,
        tls_context: ssl.SSLContext | None = None,
        auto_noop: bool = True,
    ) -> None:
        sock = socket.create_connection((host, port), timeout=timeout)
        if tls_context is not None:
            sock = tls_context.wrap_socket(sock, server_hostname=host)
        self.sock = sock
        self.timeout = timeout
        self.auto_noop = auto_noop
        self.features: tuple[int, ...] = ()
        self.codec_features = ConnectionFeatures()
        self.received_dcp_bytes = 0
        self.noops_seen = 0
        self.notifications: list[ClustermapChangeNotification] = []
        self._reader = FrameReader()
        self._frames: deque[Frame] = deque()
        self._messages: deque[Received] = deque()
        self._responses: dict[int, Response] = {}
        self._opaque = 0
        self._closed = False

    # -- plumbing ---------------------------------------------------------------------

    def close(self) -> None:
        with suppress(OSError):
            self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def next_opaque(self) -> int:
        self._opaque += 1
        return self._opaque

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, request: ClientRequest) -> None:
        self.sock.sendall(encode_request(request))

    def request(self, request: ClientRequest, *, timeout: float | None = None) -> Response:
        """Send `request` and wait for the response with its opaque."""
        self.send(request)
        return self.response(request.opaque, timeout=timeout)

    def response(self, opaque: int, *, timeout: float | None = None) -> Response:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while opaque not in self._responses:
            self._pump(deadline)
        return self._responses.pop(opaque)

    def raw_request(self, data: bytes, opaque: int, *, timeout: float | None = None) -> Response:
        """Send hand-built request bytes and wait for the response with `opaque`."""
        self.send_bytes(data)
        return self.response(opaque, timeout=timeout)

    def _pump(self, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no frame from the server in time")
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(256 * 1024)
        except TimeoutError:
            raise TimeoutError("no frame from the server in time") from None
        except (ConnectionResetError, ssl.SSLEOFError):
            data = b""
        if not data:
            self._closed = True
            raise ConnectionClosedError("the server closed the connection")
        for frame in self._reader.feed(data):
            self._dispatch(frame)

    def _dispatch(self, frame: Frame) -> None:
        message = decode_server_frame(frame, self.codec_features)
        if isinstance(message, Response):
            self._responses[message.opaque] = message
            return
        if isinstance(message, ClustermapChangeNotification):
            self.notifications.append(message)
            return
        if isinstance(message, DcpNoop):
            self.noops_seen += 1
            if self.auto_noop:
                self.sock.sendall(encode_response(dcp_noop_reply(message.opaque)))
                return
        else:
            self.received_dcp_bytes += frame.size
        self._messages.append(Received(frame, message))

    def next_received(self, *, timeout: float | None = None) -> Received:
        """The next DCP message (or unanswered noop) from the server."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while not self._messages:
            self._pump(deadline)
        return self._messages.popleft()

    def next_message(self, *, timeout: float | None = None) -> ServerMessage:
        return self.next_received(timeout=timeout).message

    def messages_until(
        self, done: Callable[[ServerMessage], bool], *, timeout: float | None = None
    ) -> list[ServerMessage]:
        """Messages up to and including the first for which `done` is true."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        collected: list[ServerMessage] = []
        while True:
            message = self.next_message(timeout=max(0.0, deadline - time.monotonic()))
            collected.append(message)
            if done(message):
                return collected

    def stream_until_end(
        self, vbucket: int, *, timeout: float | None = None
    ) -> list[ServerMessage]:
        """Messages until the STREAM_END of `vbucket` (included)."""
        return self.messages_until(
            lambda m: isinstance(m, StreamEnd) and m.vbucket == vbucket, timeout=timeout
        )

    def nothing_within(self, seconds: float) -> bool:
        """True if no DCP message (other than answered noops) arrives within `seconds`."""
        try:
            self.next_received(timeout=seconds)
        except TimeoutError:
            return True
        return False

    def wait_closed(self, timeout: float) -> bool:
        """Read until the server closes the connection; True if it did within `timeout`."""
        deadline = time.monotonic() + timeout
        try:
            while True:
                self._pump(deadline)
        except ConnectionClosedError:
            return True
        except TimeoutError:
            return False

    # -- handshake and DCP --------------------------------------------------------------

    def hello(self, features: Iterable[int] = DEFAULT_FEATURES, agent: str = "raw") -> Response:
        response = self.request(Hello(agent, tuple(features), self.next_opaque()))
        if response.status == Status.SUCCESS:
            self.features = hello_features_of(response)
            self.codec_features = ConnectionFeatures(
                collections=HelloFeature.COLLECTIONS in self.features,
                delete_times=self.codec_features.delete_times,
            )
        return response

    def list_mechanisms(self) -> Response:
        return self.request(SaslListMechs(self.next_opaque()))

    def auth_plain(self, username: str, password: str) -> Response:
        payload = b"\x00" + username.encode() + b"\x00" + password.encode()
        return self.request(SaslAuth("PLAIN", payload, self.next_opaque()))

    def auth_scram(self, username: str, password: str, mechanism: str = "SCRAM-SHA512") -> Response:
        client = ScramClient([_SCRAMP[mechanism]], username, password)
        first = self.request(
            SaslAuth(mechanism, client.get_client_first().encode(), self.next_opaque())
        )
        if first.status != Status.AUTH_CONTINUE:
            return first
        client.set_server_first(first.value.decode())
        final = self.request(
            SaslStep(mechanism, client.get_client_final().encode(), self.next_opaque())
        )
        if final.status == Status.SUCCESS:
            client.set_server_final(final.value.decode())  # verifies the server's signature
        return final

    def select_bucket(self, bucket: str) -> Response:
        return self.request(SelectBucket(bucket, self.next_opaque()))

    def cluster_config(self) -> Response:
        return self.request(GetClusterConfig(self.next_opaque()))

    def connect(
        self,
        bucket: str,
        *,
        username: str = "Administrator",
        password: str = "password",
        features: Iterable[int] = DEFAULT_FEATURES,
    ) -> None:
        """HELLO, SCRAM-SHA512 and SELECT_BUCKET; fails the test on any refusal."""
        assert self.hello(features).status == Status.SUCCESS
        assert self.auth_scram(username, password).status == Status.SUCCESS
        response = self.select_bucket(bucket)
        assert response.status == Status.SUCCESS, response

    def dcp_open(self, name: str = "test:raw", flags: DcpOpenFlags = PRODUCER_FLAGS) -> Response:
        response = self.request(DcpOpen(name, flags, self.next_opaque()))
        if response.status == Status.SUCCESS:
            self.codec_features = ConnectionFeatures(
                collections=self.codec_features.collections,
                delete_times=bool(flags & DcpOpenFlags.INCLUDE_DELETE_TIMES),
            )
        return response

    def control(self, key: str, value: str) -> Response:
        return self.request(DcpControl(key, value, self.next_opaque()))

    def open_producer(
        self,
        bucket: str,
        *,
        flags: DcpOpenFlags = PRODUCER_FLAGS,
        controls: Iterable[tuple[str, str]] = (),
        features: Iterable[int] = DEFAULT_FEATURES,
    ) -> None:
        """Connect, DCP_OPEN and apply controls, asserting each succeeds."""
        self.connect(bucket, features=features)
        assert self.dcp_open(flags=flags).status == Status.SUCCESS
        for key, value in controls:
            response = self.control(key, value)
            assert response.status == Status.SUCCESS, (key, value, response)

    def stream_request(
        self,
        vbucket: int,
        *,
        start: int = 0,
        end: int = MAX_SEQNO,
        vbucket_uuid: int = 0,
        snap_start: int | None = None,
        snap_end: int | None = None,
        flags: StreamRequestFlags = StreamRequestFlags.NONE,
        purge_seqno: int | None = None,
    ) -> Response:
        request = StreamRequest(
            vbucket=vbucket,
            start_seqno=start,
            end_seqno=end,
            vbucket_uuid=vbucket_uuid,
            snapshot_start=start if snap_start is None else snap_start,
            snapshot_end=start if snap_end is None else snap_end,
            flags=flags,
            purge_seqno=purge_seqno,
            opaque=self.next_opaque(),
        )
        return self.request(request)

    def filtered_stream_request(
        self,
        vbucket: int,
        stream_value: Mapping[str, object],
        *,
        start: int = 0,
        end: int = MAX_SEQNO,
    ) -> Response:
        """STREAM_REQ from `start` with a JSON value (collections or scope filter, ...)."""
        opaque = self.next_opaque()
        extras = struct.pack(">IIQQQQQ", 0, 0, start, end, 0, start, start)
        frame = encode_frame(
            Magic.REQUEST,
            Opcode.DCP_STREAM_REQ,
            vbucket_or_status=vbucket,
            opaque=opaque,
            extras=extras,
            value=json.dumps(stream_value).encode(),
            datatype=Datatype.JSON,
        )
        return self.raw_request(frame, opaque)

    def buffer_ack(self, acked_bytes: int) -> None:
        self.send(BufferAck(acked_bytes, self.next_opaque()))


# -- helpers shared by the server tests ---------------------------------------------------


def fast_options(**overrides: object) -> ServerOptions:
    """Server options for tests: one noop-interval unit is 50 ms instead of a second."""
    values: dict[str, object] = {"noop_time_scale": 0.05}
    values.update(overrides)
    return ServerOptions(**values)  # type: ignore[arg-type]


@contextmanager
def serve(bucket: SimBucket, nodes: int = 1, **kwargs: object) -> Iterator[SimCluster]:
    """A started SimCluster on ephemeral ports, closed afterwards."""
    kwargs.setdefault("options", fast_options())
    cluster = SimCluster(bucket, nodes, **kwargs)  # type: ignore[arg-type]
    with cluster:
        yield cluster


@contextmanager
def producer(
    cluster: SimCluster,
    node: int = 0,
    *,
    flags: DcpOpenFlags = PRODUCER_FLAGS,
    controls: Iterable[tuple[str, str]] = (),
    features: Iterable[int] = DEFAULT_FEATURES,
    auto_noop: bool = True,
) -> Iterator[RawClient]:
    """A RawClient with DCP_OPEN done and `controls` applied."""
    client = RawClient("127.0.0.1", cluster.node(node).port, auto_noop=auto_noop)
    try:
        client.open_producer(cluster.bucket.name, flags=flags, controls=controls, features=features)
        yield client
    finally:
        client.close()


def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Poll a condition that has no event to wait on (e.g. a server-side counter)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)
    return True


def self_signed_certificate(directory: Path, host: str = "127.0.0.1") -> tuple[Path, Path]:
    """A self-signed certificate for `host` and its key, made with the openssl CLI."""
    cert, key = directory / "server.pem", directory / "server.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-subj",
            "/CN=sim",
            "-addext",
            f"subjectAltName=IP:{host}",
        ],
        check=True,
        capture_output=True,
    )
    return cert, key
