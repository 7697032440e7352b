"""The codec's entry points: which encoder a message type goes to, which decoder an opcode or a
magic goes to, for each direction.

The messages themselves live one family per module, each type with its encoder and decoder
side by side; this module only dispatches over them:

- `requests` and `dcp_requests`: what a client (the consumer) sends; `encode_request` /
  `decode_request` here.
- `responses`: the replies (`encode_response`, `decode_response`) and their readers such as
  `failover_log_of`.
- `dcp_messages` and `document_messages`: what a DCP producer sends on its connection;
  `encode_dcp_message` / `decode_dcp_message` here.
- `pushes`: cluster-map change notifications (`encode_server_request`, `decode_server_request`).
- `decode_server_frame` / `decode_client_frame` here: dispatch on magic for a read loop.

Every decoder raises only `ProtocolError` on malformed input, naming the opcode.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from replicator.dcp.protocol import dcp_messages, dcp_requests, document_messages, requests
from replicator.dcp.protocol.dcp_messages import (
    NO_FEATURES,
    ConnectionFeatures,
    DcpNoop,
    EncodeSettings,
    SetVbucketState,
)
from replicator.dcp.protocol.dcp_requests import (
    BufferAck,
    CloseStream,
    DcpControl,
    DcpOpen,
    GetFailoverLog,
    StreamRequest,
)
from replicator.dcp.protocol.events import (
    Deletion,
    Expiration,
    Mutation,
    OsoSnapshot,
    SeqnoAdvanced,
    SnapshotMarker,
    StreamEnd,
    SystemEvent,
)
from replicator.dcp.protocol.frame import Frame
from replicator.dcp.protocol.opcodes import Magic, Opcode
from replicator.dcp.protocol.pushes import ClustermapChangeNotification, decode_server_request
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
)
from replicator.dcp.protocol.responses import Response, decode_response
from replicator.dcp.protocol.wire import DECODE_FAILURES
from replicator.errors import ProtocolError

ClientRequest = (
    Hello
    | SaslListMechs
    | SaslAuth
    | SaslStep
    | SelectBucket
    | GetClusterConfig
    | GetCollectionsManifest
    | DcpOpen
    | DcpControl
    | StreamRequest
    | CloseStream
    | GetFailoverLog
    | GetAllVbSeqnos
    | BufferAck
    | Noop
)
"""Every request this codec encodes for the consumer and decodes for the producer."""

ProducerMessage = (
    SnapshotMarker
    | Mutation
    | Deletion
    | Expiration
    | SystemEvent
    | SeqnoAdvanced
    | OsoSnapshot
    | StreamEnd
    | DcpNoop
    | SetVbucketState
)
"""Everything a DCP producer may send on a consumer's connection, besides responses."""

ServerMessage = Response | ProducerMessage | ClustermapChangeNotification
"""Anything a consumer's connection can receive."""

ClientMessage = ClientRequest | Response
"""Anything a producer's connection can receive (replies such as the DCP_NOOP reply)."""

_REQUEST_ENCODERS: dict[type, Callable[[Any], bytes]] = {
    **requests.ENCODERS,
    **dcp_requests.ENCODERS,
}
_REQUEST_DECODERS: dict[int, Callable[[Frame], ClientRequest]] = {
    **requests.DECODERS,
    **dcp_requests.DECODERS,
}
_DCP_ENCODERS: dict[type, Callable[[Any, EncodeSettings], bytes]] = {
    **dcp_messages.ENCODERS,
    **document_messages.ENCODERS,
}
_DCP_DECODERS: dict[int, Callable[[Frame, ConnectionFeatures], ProducerMessage]] = {
    **dcp_messages.DECODERS,
    **document_messages.DECODERS,
}
_REQUEST_MAGICS = frozenset({int(Magic.REQUEST), int(Magic.FLEX_REQUEST)})


def encode_request(request: ClientRequest) -> bytes:
    """Wire bytes of a client request.

    >>> encode_request(Noop(opaque=1)).hex()[:4]
    '800a'
    """
    encoder = _REQUEST_ENCODERS.get(type(request))
    if encoder is None:
        raise TypeError(f"not a client request: {type(request).__name__}")
    try:
        return encoder(request)
    except struct.error as exc:
        raise ValueError(f"{type(request).__name__}: field out of range ({exc})") from None


def decode_request(frame: Frame) -> ClientRequest:
    """Decode a client's request (what the embedded producer receives)."""
    if not frame.is_request:
        raise ProtocolError(f"magic 0x{frame.magic:02x} is not a request", opcode=frame.opcode)
    decoder = _REQUEST_DECODERS.get(frame.opcode)
    if decoder is None:
        raise ProtocolError("not a request this codec supports", opcode=frame.opcode)
    try:
        return decoder(frame)
    except DECODE_FAILURES as exc:
        raise ProtocolError(
            f"malformed {_opcode_name(frame.opcode)}: {exc}", opcode=frame.opcode
        ) from None


def encode_dcp_message(
    message: ProducerMessage,
    *,
    opaque: int = 0,
    features: ConnectionFeatures = NO_FEATURES,
    compress: bool = False,
    include_xattrs: bool = True,
) -> bytes:
    """Wire bytes of a producer's message (the embedded producer's side).

    `opaque` is the stream's (its STREAM_REQ's) for events; DcpNoop and SetVbucketState carry
    their own. An event with a `stream_id` goes out with flexible framing. `compress` snappy-
    compresses values, `include_xattrs` False drops xattrs (a connection opened without
    INCLUDE_XATTRS).
    """
    encoder = _DCP_ENCODERS.get(type(message))
    if encoder is None:
        raise TypeError(f"not a DCP producer message: {type(message).__name__}")
    settings = EncodeSettings(opaque, features, compress, include_xattrs)
    try:
        return encoder(message, settings)
    except struct.error as exc:
        raise ValueError(f"{type(message).__name__}: field out of range ({exc})") from None


def decode_dcp_message(
    frame: Frame, features: ConnectionFeatures = NO_FEATURES
) -> ProducerMessage:
    """Decode a producer's request-magic message into an event, DcpNoop or SetVbucketState."""
    if frame.magic not in _REQUEST_MAGICS:
        raise ProtocolError(
            f"magic 0x{frame.magic:02x} is not a producer message", opcode=frame.opcode
        )
    decoder = _DCP_DECODERS.get(frame.opcode)
    if decoder is None:
        raise ProtocolError(
            "not a message a DCP producer may send on this connection", opcode=frame.opcode
        )
    try:
        return decoder(frame, features)
    except DECODE_FAILURES as exc:
        raise ProtocolError(
            f"malformed {_opcode_name(frame.opcode)}: {exc}", opcode=frame.opcode
        ) from None


def decode_server_frame(frame: Frame, features: ConnectionFeatures = NO_FEATURES) -> ServerMessage:
    """Decode a frame a consumer received: response, producer message or server push."""
    magic = frame.magic
    if magic in _REQUEST_MAGICS:
        return decode_dcp_message(frame, features)
    if magic == Magic.RESPONSE or magic == Magic.FLEX_RESPONSE:
        return decode_response(frame)
    if magic == Magic.SERVER_REQUEST:
        return decode_server_request(frame)
    raise ProtocolError(f"magic 0x{magic:02x} is not sent by a server", opcode=frame.opcode)


def decode_client_frame(frame: Frame) -> ClientMessage:
    """Decode a frame a producer received: a client request or a reply (DCP_NOOP reply)."""
    magic = frame.magic
    if magic in _REQUEST_MAGICS:
        return decode_request(frame)
    if magic == Magic.RESPONSE or magic == Magic.FLEX_RESPONSE:
        return decode_response(frame)
    raise ProtocolError(f"magic 0x{magic:02x} is not sent by a client", opcode=frame.opcode)


def _opcode_name(opcode: int) -> str:
    try:
        return Opcode(opcode).name
    except ValueError:
        return f"opcode 0x{opcode:02x}"
