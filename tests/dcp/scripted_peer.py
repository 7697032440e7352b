"""A scripted DCP producer on 127.0.0.1 for connection and client tests.

It answers the handshake with the codec (HELLO, SASL PLAIN/SCRAM via scramp's server side,
SELECT_BUCKET, GET_CLUSTER_CONFIG, DCP_OPEN, DCP_CONTROL), records every message it receives,
and otherwise does what the test scripts: send good frames, malformed bytes, silence, or
scripted replies to stream requests. Exact control is the point: the embedded producer
(replicator.sim) behaves like a server, this peer behaves like whatever a test needs.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from scramp import ScramException, ScramMechanism

from replicator.dcp.protocol.codec import (
    ClientMessage,
    ClientRequest,
    ProducerMessage,
    decode_client_frame,
    encode_dcp_message,
    encode_request,
)
from replicator.dcp.protocol.dcp_messages import ConnectionFeatures, DcpNoop
from replicator.dcp.protocol.dcp_requests import (
    CloseStream,
    DcpControl,
    DcpOpen,
    GetFailoverLog,
    StreamRequest,
)
from replicator.dcp.protocol.events import StreamEnd, StreamEndReason
from replicator.dcp.protocol.frame import FrameReader
from replicator.dcp.protocol.opcodes import Status
from replicator.dcp.protocol.pushes import ClustermapChangeNotification, encode_server_request
from replicator.dcp.protocol.requests import (
    GetAllVbSeqnos,
    GetClusterConfig,
    GetCollectionsManifest,
    Hello,
    Noop,
    SaslAuth,
    SaslListMechs,
    SaslStep,
    SelectBucket,
    encode_hello_features,
)
from replicator.dcp.protocol.responses import (
    Response,
    VbucketSeqno,
    encode_failover_log,
    encode_response,
    encode_sasl_mechanisms,
    encode_vbucket_seqnos,
)
from replicator.errors import ProtocolError
from replicator.model.positions import FailoverLog

T = TypeVar("T")

ALL_MECHANISMS = ("SCRAM-SHA512", "SCRAM-SHA256", "SCRAM-SHA1", "PLAIN")
_SCRAMP = {
    "SCRAM-SHA512": "SCRAM-SHA-512",
    "SCRAM-SHA256": "SCRAM-SHA-256",
    "SCRAM-SHA1": "SCRAM-SHA-1",
}
DEFAULT_FAILOVER_LOG = FailoverLog.of([(0xABCDEF, 0)])

StreamHandler = Callable[["PeerSession", StreamRequest], None]


def cluster_config(
    ports: list[int],
    *,
    num_vbuckets: int = 4,
    owners: list[int] | None = None,
    rev: int = 1,
    rev_epoch: int = 1,
    host: str = "$HOST",
    bucket: str = "travel",
    tls_ports: list[int] | None = None,
) -> bytes:
    """A bucket config JSON in the server's shape; `owners[vb]` indexes `ports` (default 0)."""
    owners = owners if owners is not None else [vb % len(ports) for vb in range(num_vbuckets)]
    nodes_ext: list[dict[str, Any]] = []
    for i, port in enumerate(ports):
        services: dict[str, int] = {"kv": port, "mgmt": 8091}
        if tls_ports is not None:
            services["kvSSL"] = tls_ports[i]
        entry: dict[str, Any] = {"services": services}
        if host != "$HOST":
            entry["hostname"] = host
        nodes_ext.append(entry)
    document = {
        "rev": rev,
        "revEpoch": rev_epoch,
        "name": bucket,
        "nodeLocator": "vbucket",
        "nodesExt": nodes_ext,
        "vBucketServerMap": {
            "hashAlgorithm": "CRC",
            "numReplicas": 0,
            "serverList": [f"{host}:{port}" for port in ports],
            "vBucketMap": [[owner] for owner in owners],
        },
    }
    return json.dumps(document).encode()


@dataclass
class PeerBehaviour:
    """What the peer does during the handshake and with requests it auto-answers."""

    bucket: str = "travel"
    users: dict[str, str] = field(default_factory=lambda: {"dcp": "s3cret-pw"})
    mechanisms: tuple[str, ...] = ALL_MECHANISMS
    refuse_features: frozenset[int] = frozenset()
    control_status: dict[str, int] = field(default_factory=dict)
    """DCP_CONTROL key -> status to answer instead of SUCCESS."""
    select_bucket_status: int | None = None
    config: Callable[[], bytes] | None = None
    """GET_CLUSTER_CONFIG value; default: this peer owns every vbucket of 4."""
    on_stream_request: StreamHandler | None = None
    """Default: SUCCESS with DEFAULT_FAILOVER_LOG."""
    high_seqnos: dict[int, int] = field(default_factory=dict)
    failover_log: FailoverLog = DEFAULT_FAILOVER_LOG
    manifest: dict[str, Any] = field(
        default_factory=lambda: {
            "uid": "2",
            "scopes": [
                {"name": "_default", "uid": "0", "collections": [{"name": "_default", "uid": "0"}]}
            ],
        }
    )
    answer_close_with_stream_end: bool = True
    answer_noops: bool = True
    close_after_controls: int | None = None
    """Drop the connection right after answering this many DCP_CONTROLs (a node that breaks
    as soon as the handshake is done)."""


class PeerSession:
    """One accepted connection: what it received, and ways to send it anything."""

    def __init__(self, peer: ScriptedPeer, sock: socket.socket) -> None:
        self.peer = peer
        self.sock = sock
        self.received: list[ClientMessage] = []
        self.raw_received = bytearray()
        self.hello_agreed: tuple[int, ...] = ()
        self.open_flags = 0
        self.accepted_controls: set[str] = set()
        self.closed = threading.Event()
        self._cond = threading.Condition()
        self._send_lock = threading.Lock()
        self._scram: Any = None
        self._thread = threading.Thread(target=self._serve, daemon=True, name="scripted-peer")

    @property
    def features(self) -> ConnectionFeatures:
        return ConnectionFeatures.negotiated(self.hello_agreed, self.open_flags)

    # --- sending -------------------------------------------------------------------------

    def send_raw(self, data: bytes) -> None:
        with self._send_lock:
            self.sock.sendall(data)

    def send_event(
        self, event: ProducerMessage, *, opaque: int = 0, compress: bool = False
    ) -> None:
        self.send_raw(
            encode_dcp_message(event, opaque=opaque, features=self.features, compress=compress)
        )

    def send_noop(self, opaque: int = 0x5C5C) -> None:
        self.send_event(DcpNoop(opaque))

    def send_map_notification(self, config: bytes, *, revision: int, epoch: int = 1) -> None:
        self.send_raw(
            encode_server_request(
                ClustermapChangeNotification(self.peer.behaviour.bucket, revision, epoch, config)
            )
        )

    def reply(
        self, request: ClientRequest, status: int = Status.SUCCESS, value: bytes = b""
    ) -> None:
        self.send_raw(encode_response(Response(_opcode_of(request), status, request.opaque, value)))

    def close(self) -> None:
        """Drop the connection abruptly."""
        self.closed.set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.sock.close()

    # --- waiting on what was received ----------------------------------------------------

    def wait_for(self, kind: type[T], count: int = 1, timeout: float = 5.0) -> list[T]:
        """Wait until `count` messages of `kind` arrived; return all of that kind."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found: list[T] = [m for m in self.received if isinstance(m, kind)]
                if len(found) >= count:
                    return found
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    names = [type(m).__name__ for m in self.received]
                    raise AssertionError(
                        f"waited {timeout} s for {count} {kind.__name__}; received {names}"
                    )
                self._cond.wait(remaining)

    def of_kind(self, kind: type[T]) -> list[T]:
        with self._cond:
            return [m for m in self.received if isinstance(m, kind)]

    # --- serving -------------------------------------------------------------------------

    def _serve(self) -> None:
        reader = FrameReader()
        try:
            if self.peer.server_context is not None:
                self.sock = self.peer.server_context.wrap_socket(self.sock, server_side=True)
            while not self.closed.is_set():
                data = self.sock.recv(65536)
                if not data:
                    break
                self.raw_received += data
                for frame in reader.feed(data):
                    message = decode_client_frame(frame)
                    with self._cond:
                        self.received.append(message)
                        self._cond.notify_all()
                    self._answer(message)
        except (OSError, ProtocolError, ssl.SSLError):
            pass
        finally:
            self.closed.set()
            with self._cond:
                self._cond.notify_all()
            with contextlib.suppress(OSError):
                self.sock.close()

    def _answer(self, message: ClientMessage) -> None:
        b = self.peer.behaviour
        if isinstance(message, Hello):
            self.hello_agreed = tuple(f for f in message.features if f not in b.refuse_features)
            self.reply(message, value=encode_hello_features(self.hello_agreed))
        elif isinstance(message, SaslListMechs):
            self.reply(message, value=encode_sasl_mechanisms(b.mechanisms))
        elif isinstance(message, SaslAuth | SaslStep):
            self._sasl(message)
        elif isinstance(message, SelectBucket):
            status = b.select_bucket_status
            if status is None:
                status = Status.SUCCESS if message.bucket == b.bucket else Status.NO_BUCKET
            self.reply(message, status)
        elif isinstance(message, GetClusterConfig):
            self.reply(message, value=self.peer.config())
        elif isinstance(message, DcpOpen):
            self.open_flags = int(message.flags)
            self.reply(message)
        elif isinstance(message, DcpControl):
            status = b.control_status.get(message.key, Status.SUCCESS)
            if status == Status.SUCCESS:
                self.accepted_controls.add(message.key)
            self.reply(message, status)
            limit = b.close_after_controls
            if limit is not None and len(self.of_kind(DcpControl)) >= limit:
                self.close()
        elif isinstance(message, StreamRequest):
            if b.on_stream_request is not None:
                b.on_stream_request(self, message)
            else:
                self.reply(message, value=encode_failover_log(b.failover_log))
        elif isinstance(message, CloseStream):
            self.reply(message)
            if (
                b.answer_close_with_stream_end
                and "send_stream_end_on_client_close_stream" in self.accepted_controls
            ):
                opaque = self.stream_opaque(message.vbucket)
                self.send_event(StreamEnd(message.vbucket, StreamEndReason.CLOSED), opaque=opaque)
        elif isinstance(message, GetFailoverLog):
            self.reply(message, value=encode_failover_log(b.failover_log))
        elif isinstance(message, GetAllVbSeqnos):
            records = [VbucketSeqno(vb, s) for vb, s in sorted(b.high_seqnos.items())]
            self.reply(message, value=encode_vbucket_seqnos(records))
        elif isinstance(message, GetCollectionsManifest):
            self.reply(message, value=json.dumps(b.manifest).encode())
        elif isinstance(message, Noop) and b.answer_noops:
            self.reply(message)
        # BufferAck and responses (DCP_NOOP replies) are only recorded.

    def stream_opaque(self, vbucket: int) -> int:
        """The opaque of the latest stream request for `vbucket`."""
        for message in reversed(self.of_kind(StreamRequest)):
            if message.vbucket == vbucket:
                return message.opaque
        raise AssertionError(f"no stream request for vbucket {vbucket}")

    def _sasl(self, message: SaslAuth | SaslStep) -> None:
        b = self.peer.behaviour
        mechanism = message.mechanism
        if mechanism == "PLAIN":
            parts = message.payload.split(b"\x00")
            ok = len(parts) == 3 and b.users.get(parts[1].decode()) == parts[2].decode()
            self.reply(message, Status.SUCCESS if ok else Status.AUTH_ERROR)
            return
        try:
            if isinstance(message, SaslAuth):
                self._scram = self.peer.scram_server(mechanism)
                self._scram.set_client_first(message.payload.decode())
                self.reply(message, Status.AUTH_CONTINUE, self._scram.get_server_first().encode())
            else:
                self._scram.set_client_final(message.payload.decode())
                self.reply(message, Status.SUCCESS, self._scram.get_server_final().encode())
        except ScramException:
            self.reply(message, Status.AUTH_ERROR)


class ScriptedPeer:
    """A TCP (or TLS) server on 127.0.0.1 serving scripted DCP sessions."""

    def __init__(
        self,
        behaviour: PeerBehaviour | None = None,
        *,
        server_context: ssl.SSLContext | None = None,
    ) -> None:
        self.behaviour = behaviour or PeerBehaviour()
        self.server_context = server_context
        self.sessions: list[PeerSession] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._cond = threading.Condition()
        self._stopped = threading.Event()
        self._auth_info = self._make_auth_info()
        self._accept_thread = threading.Thread(target=self._accept, daemon=True, name="peer-accept")
        self._accept_thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def set_users(self, users: dict[str, str]) -> None:
        """Change the accepted users and passwords for later authentications."""
        self.behaviour.users = users
        self._auth_info = self._make_auth_info()

    def _make_auth_info(self) -> dict[tuple[str, str], tuple[bytes, bytes, bytes, int]]:
        return {
            (name, user): ScramMechanism(scramp_name).make_auth_info(password)
            for name, scramp_name in _SCRAMP.items()
            for user, password in self.behaviour.users.items()
        }

    def connection_string(self, bucket: str | None = None, *, tls: bool = False) -> str:
        scheme = "couchbases" if tls else "couchbase"
        return f"{scheme}://127.0.0.1:{self.port}/{bucket or self.behaviour.bucket}"

    def config(self) -> bytes:
        if self.behaviour.config is not None:
            return self.behaviour.config()
        return cluster_config([self.port])

    def scram_server(self, mechanism: str) -> Any:
        scramp_name = _SCRAMP[mechanism]

        def auth_fn(username: str) -> tuple[bytes, bytes, bytes, int]:
            info = self._auth_info.get((mechanism, username))
            if info is None:
                raise ScramException("unknown user")
            salt, stored_key, server_key, iterations = info
            return salt, stored_key, server_key, iterations

        return ScramMechanism(scramp_name).make_server(auth_fn)

    def session(self, index: int = 0, timeout: float = 5.0) -> PeerSession:
        """The index-th accepted connection, waiting for it to arrive."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self.sessions) <= index:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"no connection #{index} within {timeout} s")
                self._cond.wait(remaining)
            return self.sessions[index]

    def dcp_session(self, index: int = 0, timeout: float = 5.0) -> PeerSession:
        """Like `session`, once the session has finished its DCP controls."""
        session = self.session(index, timeout)
        session.wait_for(DcpControl, count=3, timeout=timeout)
        return session

    def stop(self) -> None:
        self._stopped.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes a blocked accept()
        with contextlib.suppress(OSError):
            self._listener.close()
        self._accept_thread.join(5)
        for session in list(self.sessions):
            session.close()

    def __enter__(self) -> ScriptedPeer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            if self._stopped.is_set():
                sock.close()
                return
            session = PeerSession(self, sock)
            with self._cond:
                self.sessions.append(session)
                self._cond.notify_all()
            session._thread.start()


def _opcode_of(request: ClientRequest) -> int:
    """The opcode a request goes out with (byte 1 of its encoding)."""
    return encode_request(request)[1]


# --- TLS material ------------------------------------------------------------------------


@dataclass(frozen=True)
class TlsFiles:
    """A throwaway CA and a server certificate for 127.0.0.1 / localhost signed by it."""

    ca_cert: Path
    server_cert: Path
    server_key: Path

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.server_cert, self.server_key)
        return context


def make_tls_files(directory: Path, name: str = "test") -> TlsFiles:
    """Generate a CA and a server certificate with the openssl CLI (EC keys: fast)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = directory / f"{name}-ca.key", directory / f"{name}-ca.pem"
    key, csr, cert = (
        directory / f"{name}-server.key",
        directory / f"{name}-server.csr",
        directory / f"{name}-server.pem",
    )
    ext = directory / f"{name}-server.ext"
    ext.write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
    )
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(
        [
            "openssl",
            "req",
            "-x509",
            *ec,
            "-keyout",
            ca_key,
            "-out",
            ca_cert,
            "-days",
            "2",
            "-subj",
            f"/CN={name} test CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]
    )
    _openssl(["openssl", "req", *ec, "-keyout", key, "-out", csr, "-subj", "/CN=localhost"])
    _openssl(
        [
            "openssl",
            "x509",
            "-req",
            "-in",
            csr,
            "-CA",
            ca_cert,
            "-CAkey",
            ca_key,
            "-CAcreateserial",
            "-out",
            cert,
            "-days",
            "2",
            "-extfile",
            ext,
        ]
    )
    return TlsFiles(ca_cert, cert, key)


def _openssl(args: list[Any]) -> None:
    subprocess.run([str(a) for a in args], check=True, capture_output=True, timeout=30)


@contextlib.contextmanager
def running_peer(behaviour: PeerBehaviour | None = None, **kwargs: Any) -> Iterator[ScriptedPeer]:
    """A started peer, stopped on exit."""
    peer = ScriptedPeer(behaviour, **kwargs)
    try:
        yield peer
    finally:
        peer.stop()
