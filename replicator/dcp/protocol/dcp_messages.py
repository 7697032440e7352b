"""Messages a DCP producer sends that frame a stream rather than carry a document: snapshot
markers, system events, seqno advances, OSO brackets, stream ends, DCP_NOOP and
SET_VBUCKET_STATE. One type per message, its encoder and decoder side by side.

Also what every producer-message codec depends on: `ConnectionFeatures` (what the connection
negotiated) and `EncodeSettings`. The document messages live in `document_messages`;
`codec.encode_dcp_message` / `codec.decode_dcp_message` dispatch over both through the
`ENCODERS` and `DECODERS` tables.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from replicator.dcp.protocol.events import (
    OsoFlags,
    OsoSnapshot,
    SeqnoAdvanced,
    SnapshotFlags,
    SnapshotMarker,
    StreamEnd,
    StreamEndReason,
    SystemEvent,
    SystemEventType,
)
from replicator.dcp.protocol.frame import Frame
from replicator.dcp.protocol.opcodes import DcpOpenFlags, HelloFeature, Opcode, VbucketState
from replicator.dcp.protocol.values import DEFAULT_MAX_VALUE_SIZE
from replicator.dcp.protocol.wire import (
    U32,
    U64,
    decode_text,
    expect_extras,
    expect_no_body,
    expect_no_key,
    expect_no_value,
    frame_stream_id,
    request_frame,
)

_MARKER_V1_EXTRAS = struct.Struct(">QQI")
_MARKER_V2_0_VALUE = struct.Struct(">QQIQQ")
_MARKER_V2_2_VALUE = struct.Struct(">QQIQQQQ")
_SYSTEM_EVENT_EXTRAS = struct.Struct(">QIB")
_COLLECTION_EVENT_VALUE = struct.Struct(">QII")
_SCOPE_EVENT_VALUE = struct.Struct(">QI")

_MARKER_VERSION_2_0 = 0
_MARKER_VERSION_2_2 = 2
_COLLECTION_EVENTS = frozenset(
    {
        SystemEventType.COLLECTION_CREATED,
        SystemEventType.COLLECTION_DROPPED,
        SystemEventType.COLLECTION_FLUSHED,
        SystemEventType.COLLECTION_CHANGED,
    }
)


@dataclass(frozen=True, slots=True)
class ConnectionFeatures:
    """What a connection negotiated, as far as the wire encoding depends on it.

    `collections`: HELLO COLLECTIONS, so document keys carry a LEB128 collection-id prefix.
    `delete_times`: DCP_OPEN INCLUDE_DELETE_TIMES, so deletions are v2 (with delete_time).
    `max_value_size`: the largest decompressed value this side accepts.
    """

    collections: bool = False
    delete_times: bool = False
    max_value_size: int = DEFAULT_MAX_VALUE_SIZE

    @classmethod
    def negotiated(
        cls,
        hello_features: Iterable[int],
        open_flags: int = 0,
        *,
        max_value_size: int = DEFAULT_MAX_VALUE_SIZE,
    ) -> ConnectionFeatures:
        """Features from the HELLO reply and the DCP_OPEN flags that were sent."""
        return cls(
            collections=HelloFeature.COLLECTIONS in set(hello_features),
            delete_times=bool(open_flags & DcpOpenFlags.INCLUDE_DELETE_TIMES),
            max_value_size=max_value_size,
        )


NO_FEATURES = ConnectionFeatures()
"""A connection that negotiated nothing: the default of the encoder and decoders."""


@dataclass(frozen=True, slots=True)
class EncodeSettings:
    """What an encoder needs besides the message: the stream's opaque and the connection's
    features, value compression and whether xattrs go out."""

    opaque: int
    features: ConnectionFeatures
    compress: bool
    include_xattrs: bool


# --- SNAPSHOT_MARKER


def _encode_snapshot_marker(m: SnapshotMarker, s: EncodeSettings) -> bytes:
    v22_fields = (m.purge_seqno, m.high_prepared_seqno)
    if m.max_visible_seqno is None:
        if m.high_completed_seqno is not None or any(f is not None for f in v22_fields):
            raise ValueError("a v1 snapshot marker (no max_visible_seqno) has no v2 fields")
        extras = _MARKER_V1_EXTRAS.pack(m.start_seqno, m.end_seqno, m.flags)
        value = b""
    else:
        if m.high_completed_seqno is None:
            raise ValueError("a v2 snapshot marker needs high_completed_seqno")
        if all(f is None for f in v22_fields):
            extras = bytes((_MARKER_VERSION_2_0,))
            value = _MARKER_V2_0_VALUE.pack(
                m.start_seqno,
                m.end_seqno,
                m.flags,
                m.max_visible_seqno,
                m.high_completed_seqno,
            )
        elif m.purge_seqno is None or m.high_prepared_seqno is None:
            raise ValueError("a v2.2 snapshot marker needs purge_seqno and high_prepared_seqno")
        else:
            extras = bytes((_MARKER_VERSION_2_2,))
            value = _MARKER_V2_2_VALUE.pack(
                m.start_seqno,
                m.end_seqno,
                m.flags,
                m.max_visible_seqno,
                m.high_completed_seqno,
                m.purge_seqno,
                m.high_prepared_seqno,
            )
    return request_frame(
        Opcode.DCP_SNAPSHOT_MARKER,
        vbucket=m.vbucket,
        opaque=s.opaque,
        stream_id=m.stream_id,
        extras=extras,
        value=value,
    )


def _decode_snapshot_marker(frame: Frame, features: ConnectionFeatures) -> SnapshotMarker:
    extras = frame.extras
    value = frame.value
    if len(extras) not in (_MARKER_V1_EXTRAS.size, 1):
        raise ValueError(f"extras of {len(extras)} bytes, expected 20 (v1) or 1 (v2.x)")
    expect_no_key(frame)
    if len(extras) == _MARKER_V1_EXTRAS.size:
        expect_no_value(frame)
        start, end, flags = _MARKER_V1_EXTRAS.unpack(extras)
        return SnapshotMarker(
            frame.vbucket_or_status,
            start,
            end,
            SnapshotFlags(flags),
            stream_id=frame_stream_id(frame),
        )
    version = extras[0]
    if version == _MARKER_VERSION_2_0:
        if len(value) != _MARKER_V2_0_VALUE.size:
            raise ValueError(f"v2.0 marker value of {len(value)} bytes, expected 36")
        start, end, flags, max_visible, high_completed = _MARKER_V2_0_VALUE.unpack(value)
        return SnapshotMarker(
            frame.vbucket_or_status,
            start,
            end,
            SnapshotFlags(flags),
            max_visible_seqno=max_visible,
            high_completed_seqno=high_completed,
            stream_id=frame_stream_id(frame),
        )
    if version == _MARKER_VERSION_2_2:
        if len(value) != _MARKER_V2_2_VALUE.size:
            raise ValueError(f"v2.2 marker value of {len(value)} bytes, expected 52")
        start, end, flags, max_visible, high_completed, purge, high_prepared = (
            _MARKER_V2_2_VALUE.unpack(value)
        )
        return SnapshotMarker(
            frame.vbucket_or_status,
            start,
            end,
            SnapshotFlags(flags),
            max_visible_seqno=max_visible,
            high_completed_seqno=high_completed,
            purge_seqno=purge,
            high_prepared_seqno=high_prepared,
            stream_id=frame_stream_id(frame),
        )
    raise ValueError(f"unknown snapshot marker version byte {version}")


# --- SYSTEM_EVENT


def _encode_system_event(e: SystemEvent, s: EncodeSettings) -> bytes:
    if e.event in _COLLECTION_EVENTS:
        if e.collection_id is None:
            raise ValueError(f"{e.event.name} event needs a collection id")
        value = _COLLECTION_EVENT_VALUE.pack(e.manifest_uid, e.scope_id, e.collection_id)
    else:
        if e.collection_id is not None:
            raise ValueError(f"{e.event.name} event has no collection id")
        value = _SCOPE_EVENT_VALUE.pack(e.manifest_uid, e.scope_id)
    return request_frame(
        Opcode.DCP_SYSTEM_EVENT,
        vbucket=e.vbucket,
        opaque=s.opaque,
        stream_id=e.stream_id,
        extras=_SYSTEM_EVENT_EXTRAS.pack(e.by_seqno, e.event, e.version),
        key=e.name.encode(),
        value=value,
    )


def _decode_system_event(frame: Frame, features: ConnectionFeatures) -> SystemEvent:
    expect_extras(frame, _SYSTEM_EVENT_EXTRAS.size)
    by_seqno, event_code, version = _SYSTEM_EVENT_EXTRAS.unpack(frame.extras)
    try:
        event = SystemEventType(event_code)
    except ValueError:
        raise ValueError(f"unknown system event type {event_code}") from None
    if version > 1:
        raise ValueError(f"system event version {version} (FlatBuffers) is not supported")
    value = frame.value
    collection_id: int | None
    if event in _COLLECTION_EVENTS:
        if len(value) < _COLLECTION_EVENT_VALUE.size:
            raise ValueError(f"{event.name} value of {len(value)} bytes, expected at least 16")
        manifest_uid, scope_id, collection_id = _COLLECTION_EVENT_VALUE.unpack_from(value)
    else:
        if len(value) < _SCOPE_EVENT_VALUE.size:
            raise ValueError(f"{event.name} value of {len(value)} bytes, expected at least 12")
        manifest_uid, scope_id = _SCOPE_EVENT_VALUE.unpack_from(value)
        collection_id = None
    return SystemEvent(
        frame.vbucket_or_status,
        by_seqno,
        event,
        version,
        decode_text(frame.key, "system event name"),
        manifest_uid,
        scope_id,
        collection_id,
        frame_stream_id(frame),
    )


# --- SEQNO_ADVANCED, OSO_SNAPSHOT, STREAM_END


def _encode_seqno_advanced(e: SeqnoAdvanced, s: EncodeSettings) -> bytes:
    return request_frame(
        Opcode.DCP_SEQNO_ADVANCED,
        vbucket=e.vbucket,
        opaque=s.opaque,
        stream_id=e.stream_id,
        extras=U64.pack(e.by_seqno),
    )


def _decode_seqno_advanced(frame: Frame, features: ConnectionFeatures) -> SeqnoAdvanced:
    expect_extras(frame, 8)
    expect_no_key(frame)
    expect_no_value(frame)
    return SeqnoAdvanced(
        frame.vbucket_or_status, U64.unpack(frame.extras)[0], frame_stream_id(frame)
    )


def _encode_oso_snapshot(e: OsoSnapshot, s: EncodeSettings) -> bytes:
    return request_frame(
        Opcode.DCP_OSO_SNAPSHOT,
        vbucket=e.vbucket,
        opaque=s.opaque,
        stream_id=e.stream_id,
        extras=U32.pack(e.flags),
    )


def _decode_oso_snapshot(frame: Frame, features: ConnectionFeatures) -> OsoSnapshot:
    expect_extras(frame, 4)
    expect_no_key(frame)
    expect_no_value(frame)
    return OsoSnapshot(
        frame.vbucket_or_status, OsoFlags(U32.unpack(frame.extras)[0]), frame_stream_id(frame)
    )


def _encode_stream_end(e: StreamEnd, s: EncodeSettings) -> bytes:
    return request_frame(
        Opcode.DCP_STREAM_END,
        vbucket=e.vbucket,
        opaque=s.opaque,
        stream_id=e.stream_id,
        extras=U32.pack(e.reason),
    )


def _decode_stream_end(frame: Frame, features: ConnectionFeatures) -> StreamEnd:
    expect_extras(frame, 4)
    expect_no_key(frame)
    expect_no_value(frame)
    code = U32.unpack(frame.extras)[0]
    try:
        reason = StreamEndReason(code)
    except ValueError:
        raise ValueError(f"unknown stream end reason {code}") from None
    return StreamEnd(frame.vbucket_or_status, reason, frame_stream_id(frame))


# --- DCP_NOOP, SET_VBUCKET_STATE


@dataclass(frozen=True, slots=True)
class DcpNoop:
    """DCP_NOOP 0x5c from the producer; answer with `dcp_noop_reply(opaque)`."""

    opaque: int = 0


def _encode_dcp_noop(m: DcpNoop, s: EncodeSettings) -> bytes:
    return request_frame(Opcode.DCP_NOOP, vbucket=0, opaque=m.opaque, stream_id=None)


def _decode_dcp_noop(frame: Frame, features: ConnectionFeatures) -> DcpNoop:
    expect_no_body(frame)
    return DcpNoop(frame.opaque)


@dataclass(frozen=True, slots=True)
class SetVbucketState:
    """SET_VBUCKET_STATE 0x5b (takeover): the vbucket's new state on the consumer side."""

    vbucket: int
    state: VbucketState
    opaque: int = 0


def _encode_set_vbucket_state(m: SetVbucketState, s: EncodeSettings) -> bytes:
    return request_frame(
        Opcode.DCP_SET_VBUCKET_STATE,
        vbucket=m.vbucket,
        opaque=m.opaque,
        stream_id=None,
        extras=bytes((m.state,)),
    )


def _decode_set_vbucket_state(frame: Frame, features: ConnectionFeatures) -> SetVbucketState:
    expect_extras(frame, 1)
    expect_no_key(frame)
    expect_no_value(frame)
    state = VbucketState(frame.extras[0])
    if state == VbucketState.ALIVE:
        raise ValueError("vbucket state 0 is a filter, not a state")
    return SetVbucketState(frame.vbucket_or_status, state, frame.opaque)


StreamControlMessage = (
    SnapshotMarker
    | SystemEvent
    | SeqnoAdvanced
    | OsoSnapshot
    | StreamEnd
    | DcpNoop
    | SetVbucketState
)
"""The producer's messages that carry no document."""

ENCODERS: dict[type, Callable[[Any, EncodeSettings], bytes]] = {
    SnapshotMarker: _encode_snapshot_marker,
    SystemEvent: _encode_system_event,
    SeqnoAdvanced: _encode_seqno_advanced,
    OsoSnapshot: _encode_oso_snapshot,
    StreamEnd: _encode_stream_end,
    DcpNoop: _encode_dcp_noop,
    SetVbucketState: _encode_set_vbucket_state,
}
"""Encoder by message type, for `codec.encode_dcp_message`."""

DECODERS: dict[int, Callable[[Frame, ConnectionFeatures], StreamControlMessage]] = {
    Opcode.DCP_SNAPSHOT_MARKER: _decode_snapshot_marker,
    Opcode.DCP_SYSTEM_EVENT: _decode_system_event,
    Opcode.DCP_SEQNO_ADVANCED: _decode_seqno_advanced,
    Opcode.DCP_OSO_SNAPSHOT: _decode_oso_snapshot,
    Opcode.DCP_STREAM_END: _decode_stream_end,
    Opcode.DCP_NOOP: _decode_dcp_noop,
    Opcode.DCP_SET_VBUCKET_STATE: _decode_set_vbucket_state,
}
"""Decoder by opcode, for `codec.decode_dcp_message`."""
