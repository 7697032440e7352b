"""The handshake of a DCP consumer connection (spec/NOTES.md section 4), synchronous in the
caller's thread on the still-blocking socket: HELLO, SASL, SELECT_BUCKET, GET_CLUSTER_CONFIG,
DCP_OPEN, then one DCP_CONTROL per setting.

Frames read past a reply (a producer may push a map early) wait in `early_frames` for the
I/O thread, which starts after the handshake with the same frame reader.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import socket
import ssl
import time
from collections import deque
from dataclasses import dataclass

from replicator.dcp.protocol.codec import ClientRequest, encode_request
from replicator.dcp.protocol.dcp_messages import ConnectionFeatures
from replicator.dcp.protocol.dcp_requests import DcpControl, DcpOpen
from replicator.dcp.protocol.frame import Frame, FrameReader
from replicator.dcp.protocol.opcodes import (
    Datatype,
    DcpOpenFlags,
    HelloFeature,
    Magic,
    Opcode,
    Status,
)
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
    decode_response,
    hello_features_of,
    sasl_mechanisms_of,
)
from replicator.dcp.transport.auth import Credentials, SaslMechanism, authenticate
from replicator.dcp.transport.options import ConnectionOptions
from replicator.dcp.transport.pending import next_opaque, response_value
from replicator.dcp.transport.socket_io import READ_CHUNK, os_reason
from replicator.errors import (
    AuthenticationError,
    BucketNotFoundError,
    ConnectionLostError,
    ProtocolError,
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


@dataclass(frozen=True, slots=True)
class Negotiated:
    """What the handshake agreed with the node."""

    hello_features: frozenset[int]
    sasl_mechanism: SaslMechanism
    cluster_config: bytes
    features: ConnectionFeatures
    accepted_controls: frozenset[str]


class Handshake:
    """One handshake on a connected, still-blocking socket: `run()` once."""

    def __init__(
        self,
        sock: socket.socket,
        reader: FrameReader,
        early_frames: deque[Frame],
        *,
        address: str,
        name: str,
        bucket: str,
        credentials: Credentials,
        tls: bool,
        options: ConnectionOptions,
    ) -> None:
        self._sock = sock
        self._reader = reader
        self._early_frames = early_frames
        self.address = address
        self.name = name
        self.bucket = bucket
        self.tls = tls
        self.options = options
        self._credentials = credentials

    def run(self) -> Negotiated:
        """Raises AuthenticationError, BucketNotFoundError, TlsError, ProtocolError or
        ConnectionLostError."""
        opts = self.options
        hello = self._call_sync(Hello(self.name, tuple(int(f) for f in REQUESTED_FEATURES)))
        self._expect_success(hello, "HELLO")
        hello_features = frozenset(hello_features_of(hello))
        if HelloFeature.SELECT_BUCKET not in hello_features:
            raise ProtocolError(
                f"{self.address}: the node did not agree to SELECT_BUCKET", opcode=Opcode.HELLO
            )
        mechanisms = self._call_sync(SaslListMechs())
        self._expect_success(mechanisms, "SASL_LIST_MECHS")
        sasl_mechanism = authenticate(
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
        cluster_config = response_value(config)
        flags = DcpOpenFlags.PRODUCER | DcpOpenFlags.INCLUDE_DELETE_TIMES
        if opts.include_xattrs and HelloFeature.XATTR in hello_features:
            flags |= DcpOpenFlags.INCLUDE_XATTRS
        opened = self._call_sync(DcpOpen(self.name, flags))
        if opened.status == Status.EACCESS:
            raise AuthenticationError(
                self.address,
                f"user {self._credentials.username!r} may not open DCP on bucket "
                f"{self.bucket!r}: it needs the Data DCP Reader role",
            )
        self._expect_success(opened, "DCP_OPEN")
        features = ConnectionFeatures.negotiated(hello_features, int(flags))
        return Negotiated(
            hello_features=hello_features,
            sasl_mechanism=sasl_mechanism,
            cluster_config=cluster_config,
            features=features,
            accepted_controls=frozenset(self._send_controls(features)),
        )

    def _send_controls(self, features: ConnectionFeatures) -> list[str]:
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
        if opts.request_marker_v2_2 and features.collections:
            optional.append(("max_marker_version", "2.2"))
        if opts.change_streams and features.collections:
            optional.append(("change_streams", "true"))
        if opts.backfill_order is not None:
            optional.append(("backfill_order", opts.backfill_order))
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
                data = sock.recv(READ_CHUNK)
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
                self.address, f"connection broke during {what}: {os_reason(exc)}"
            ) from None


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
