"""The DCP_* requests a consumer sends to open a DCP connection and drive its streams, one type
per message with its encoder and decoder side by side.

`codec.encode_request` / `codec.decode_request`, the entry points for every client request,
dispatch through the `ENCODERS` and `DECODERS` tables here and in `requests`.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from replicator.dcp.protocol.frame import Frame
from replicator.dcp.protocol.opcodes import DcpOpenFlags, Opcode, StreamRequestFlags
from replicator.dcp.protocol.wire import (
    JSON_BIT,
    U32,
    decode_text,
    expect_extras,
    expect_no_body,
    expect_no_key,
    expect_no_value,
    frame_stream_id,
    request_frame,
)
from replicator.model.positions import MAX_SEQNO, VbucketPosition

MAX_CONNECTION_NAME_BYTES = 200
"""kv_engine's limit on a DCP connection name."""

_DCP_OPEN_EXTRAS = struct.Struct(">II")
_STREAM_REQ_EXTRAS = struct.Struct(">IIQQQQQ")


# --- DCP_OPEN, DCP_CONTROL


@dataclass(frozen=True, slots=True)
class DcpOpen:
    """DCP_OPEN 0x50: connection name as key (at most 200 bytes), flags in the extras."""

    name: str
    flags: DcpOpenFlags
    opaque: int = 0

    def __post_init__(self) -> None:
        size = len(self.name.encode())
        if not 0 < size <= MAX_CONNECTION_NAME_BYTES:
            raise ValueError(
                f"DCP connection name must be 1..{MAX_CONNECTION_NAME_BYTES} bytes, got {size}"
            )


def _encode_dcp_open(r: DcpOpen) -> bytes:
    return request_frame(
        Opcode.DCP_OPEN,
        opaque=r.opaque,
        extras=_DCP_OPEN_EXTRAS.pack(0, r.flags),
        key=r.name.encode(),
    )


def _decode_dcp_open(frame: Frame) -> DcpOpen:
    expect_extras(frame, _DCP_OPEN_EXTRAS.size)
    if frame.value:
        raise ValueError("DCP_OPEN with a value (consumer_name JSON) is not supported")
    _reserved, flags = _DCP_OPEN_EXTRAS.unpack(frame.extras)
    return DcpOpen(decode_text(frame.key, "connection name"), DcpOpenFlags(flags), frame.opaque)


@dataclass(frozen=True, slots=True)
class DcpControl:
    """DCP_CONTROL 0x5e: one setting, key and value as text (e.g. enable_noop=true)."""

    key: str
    value: str
    opaque: int = 0


def _encode_dcp_control(r: DcpControl) -> bytes:
    return request_frame(
        Opcode.DCP_CONTROL, opaque=r.opaque, key=r.key.encode(), value=r.value.encode()
    )


def _decode_dcp_control(frame: Frame) -> DcpControl:
    expect_extras(frame, 0)
    if not frame.key:
        raise ValueError("control key is empty")
    return DcpControl(
        decode_text(frame.key, "control key"),
        decode_text(frame.value, "control value"),
        frame.opaque,
    )


# --- STREAM_REQ, CLOSE_STREAM, GET_FAILOVER_LOG


@dataclass(frozen=True, slots=True)
class StreamRequest:
    """STREAM_REQ 0x53 for one vbucket.

    The invariant snapshot_start <= start_seqno <= snapshot_end is the producer's to check
    (it answers ERANGE); the codec carries what it is given. `purge_seqno` and `stream_id`,
    when set, travel in the JSON value ({"purge_seqno": "N", "sid": n}).
    """

    vbucket: int
    start_seqno: int
    end_seqno: int
    vbucket_uuid: int
    snapshot_start: int
    snapshot_end: int
    flags: StreamRequestFlags = StreamRequestFlags.NONE
    purge_seqno: int | None = None
    stream_id: int | None = None
    opaque: int = 0

    @classmethod
    def from_position(
        cls,
        position: VbucketPosition,
        *,
        end_seqno: int = MAX_SEQNO,
        flags: StreamRequestFlags = StreamRequestFlags.NONE,
        send_purge_seqno: bool = False,
        opaque: int = 0,
    ) -> StreamRequest:
        """Resume a vbucket from a committed position.

        `send_purge_seqno` only on servers that accepted max_marker_version=2.2.
        """
        return cls(
            vbucket=position.vbucket,
            start_seqno=position.seqno,
            end_seqno=end_seqno,
            vbucket_uuid=position.vbucket_uuid,
            snapshot_start=position.snapshot_start,
            snapshot_end=position.snapshot_end,
            flags=flags,
            purge_seqno=position.purge_seqno if send_purge_seqno else None,
            opaque=opaque,
        )


def _encode_stream_request(r: StreamRequest) -> bytes:
    extras = _STREAM_REQ_EXTRAS.pack(
        r.flags,
        0,
        r.start_seqno,
        r.end_seqno,
        r.vbucket_uuid,
        r.snapshot_start,
        r.snapshot_end,
    )
    settings: dict[str, Any] = {}
    if r.stream_id is not None:
        if not 0 < r.stream_id <= 0xFFFF:
            raise ValueError(f"stream id {r.stream_id} must be 1..65535")
        settings["sid"] = r.stream_id
    if r.purge_seqno is not None:
        if not 0 <= r.purge_seqno <= MAX_SEQNO:
            raise ValueError(f"purge seqno {r.purge_seqno} is not a u64")
        settings["purge_seqno"] = str(r.purge_seqno)
    value = json.dumps(settings, separators=(",", ":")).encode() if settings else b""
    return request_frame(
        Opcode.DCP_STREAM_REQ,
        opaque=r.opaque,
        vbucket=r.vbucket,
        extras=extras,
        value=value,
        datatype=JSON_BIT if value else 0,
    )


def _decode_stream_request(frame: Frame) -> StreamRequest:
    expect_extras(frame, _STREAM_REQ_EXTRAS.size)
    expect_no_key(frame)
    flags, _reserved, start, end, uuid, snap_start, snap_end = _STREAM_REQ_EXTRAS.unpack(
        frame.extras
    )
    purge_seqno: int | None = None
    stream_id: int | None = None
    if frame.value:
        settings = json.loads(decode_text(frame.value, "stream-request value"))
        if not isinstance(settings, dict):
            raise ValueError("stream-request value is not a JSON object")
        unsupported = set(settings) - {"sid", "purge_seqno", "uid"}
        if unsupported:
            raise ValueError(f"stream-request value keys not supported: {sorted(unsupported)}")
        if "sid" in settings:
            sid = settings["sid"]
            if type(sid) is not int or not 0 < sid <= 0xFFFF:
                raise ValueError(f"stream-request sid {sid!r} is not an integer 1..65535")
            stream_id = sid
        if "purge_seqno" in settings:
            text = settings["purge_seqno"]
            if not isinstance(text, str) or not text.isascii() or not text.isdigit():
                raise ValueError(f"stream-request purge_seqno {text!r} is not a decimal string")
            purge_seqno = int(text)
            if purge_seqno > MAX_SEQNO:
                raise ValueError(f"stream-request purge_seqno {purge_seqno} exceeds u64")
    return StreamRequest(
        vbucket=frame.vbucket_or_status,
        start_seqno=start,
        end_seqno=end,
        vbucket_uuid=uuid,
        snapshot_start=snap_start,
        snapshot_end=snap_end,
        flags=StreamRequestFlags(flags),
        purge_seqno=purge_seqno,
        stream_id=stream_id,
        opaque=frame.opaque,
    )


@dataclass(frozen=True, slots=True)
class CloseStream:
    """CLOSE_STREAM 0x52 for one vbucket (and one stream id when streams are multiplexed)."""

    vbucket: int
    stream_id: int | None = None
    opaque: int = 0


def _encode_close_stream(r: CloseStream) -> bytes:
    return request_frame(
        Opcode.DCP_CLOSE_STREAM, opaque=r.opaque, vbucket=r.vbucket, stream_id=r.stream_id
    )


def _decode_close_stream(frame: Frame) -> CloseStream:
    expect_no_body(frame)
    return CloseStream(frame.vbucket_or_status, frame_stream_id(frame), frame.opaque)


@dataclass(frozen=True, slots=True)
class GetFailoverLog:
    """GET_FAILOVER_LOG 0x54: the reply carries (vb_uuid, seqno) pairs, newest first."""

    vbucket: int
    opaque: int = 0


def _encode_get_failover_log(r: GetFailoverLog) -> bytes:
    return request_frame(Opcode.DCP_GET_FAILOVER_LOG, opaque=r.opaque, vbucket=r.vbucket)


def _decode_get_failover_log(frame: Frame) -> GetFailoverLog:
    expect_no_body(frame)
    return GetFailoverLog(frame.vbucket_or_status, frame.opaque)


# --- BUFFER_ACK


@dataclass(frozen=True, slots=True)
class BufferAck:
    """BUFFER_ACK 0x5d: bytes consumed (header + body of every acked message). No reply."""

    acked_bytes: int
    opaque: int = 0


def _encode_buffer_ack(r: BufferAck) -> bytes:
    return request_frame(Opcode.DCP_BUFFER_ACK, opaque=r.opaque, extras=U32.pack(r.acked_bytes))


def _decode_buffer_ack(frame: Frame) -> BufferAck:
    expect_extras(frame, 4)
    expect_no_key(frame)
    expect_no_value(frame)
    return BufferAck(U32.unpack(frame.extras)[0], frame.opaque)


DcpRequest = DcpOpen | DcpControl | StreamRequest | CloseStream | GetFailoverLog | BufferAck
"""The client requests with a DCP_* opcode."""

ENCODERS: dict[type, Callable[[Any], bytes]] = {
    DcpOpen: _encode_dcp_open,
    DcpControl: _encode_dcp_control,
    StreamRequest: _encode_stream_request,
    CloseStream: _encode_close_stream,
    GetFailoverLog: _encode_get_failover_log,
    BufferAck: _encode_buffer_ack,
}
"""Encoder by request type, for `codec.encode_request`."""

DECODERS: dict[int, Callable[[Frame], DcpRequest]] = {
    Opcode.DCP_OPEN: _decode_dcp_open,
    Opcode.DCP_CONTROL: _decode_dcp_control,
    Opcode.DCP_STREAM_REQ: _decode_stream_request,
    Opcode.DCP_CLOSE_STREAM: _decode_close_stream,
    Opcode.DCP_GET_FAILOVER_LOG: _decode_get_failover_log,
    Opcode.DCP_BUFFER_ACK: _decode_buffer_ack,
}
"""Decoder by opcode, for `codec.decode_request`."""
