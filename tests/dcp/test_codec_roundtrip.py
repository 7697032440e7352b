"""Round trips: every message type encodes, crosses a FrameReader in arbitrary pieces, and
decodes to itself, with classic and with flexible framing."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from replicator.dcp.codec import (
    ClientRequest,
    ClustermapChangeNotification,
    ConnectionFeatures,
    DcpNoop,
    ProducerMessage,
    Response,
    SetVbucketState,
    decode_client_frame,
    decode_dcp_message,
    decode_request,
    decode_response,
    decode_server_frame,
    decode_server_request,
    encode_dcp_message,
    encode_request,
    encode_response,
    encode_server_request,
)
from replicator.dcp.frame import Frame, FrameReader
from replicator.dcp.opcodes import Magic
from tests.dcp import strategies as gen

ROUND_TRIP = settings(max_examples=150, deadline=None)


def _read_in_pieces(wire: bytes, data: st.DataObject) -> Frame:
    """Feed `wire` to a FrameReader cut at random points; exactly one frame must come out."""
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=4), label="cuts"))
    reader = FrameReader()
    frames: list[Frame] = []
    start = 0
    for cut in [*cuts, len(wire)]:
        frames += reader.feed(wire[start:cut])
        start = cut
    reader.finish()
    assert len(frames) == 1
    assert frames[0].encode() == wire
    return frames[0]


def _with_barrier(frame: Frame) -> Frame:
    """The same frame with flexible framing: a barrier frame info ahead of any others."""
    magic = Magic.FLEX_RESPONSE if frame.is_response else Magic.FLEX_REQUEST
    return frame._replace(magic=magic, framing_extras=b"\x00" + frame.framing_extras)


@ROUND_TRIP
@given(gen.client_requests, st.data())
def test_client_requests_round_trip(request: ClientRequest, data: st.DataObject) -> None:
    frame = _read_in_pieces(encode_request(request), data)
    assert decode_request(frame) == request
    assert decode_client_frame(frame) == request


@ROUND_TRIP
@given(gen.client_requests)
def test_client_requests_decode_with_flexible_framing(request: ClientRequest) -> None:
    frame = _read_in_pieces_plain(encode_request(request))
    flexible = _read_in_pieces_plain(_with_barrier(frame).encode())
    assert flexible.is_flexible
    assert decode_request(flexible) == request


@ROUND_TRIP
@given(gen.responses, st.data())
def test_responses_round_trip(response: Response, data: st.DataObject) -> None:
    frame = _read_in_pieces(encode_response(response), data)
    assert frame.is_flexible == bool(response.framing_extras)
    assert decode_response(frame) == response
    assert decode_server_frame(frame) == response


@ROUND_TRIP
@given(gen.clustermap_notifications, st.data())
def test_clustermap_notifications_round_trip(
    notification: ClustermapChangeNotification, data: st.DataObject
) -> None:
    frame = _read_in_pieces(encode_server_request(notification), data)
    assert decode_server_request(frame) == notification
    assert decode_server_frame(frame) == notification


@st.composite
def _producer_case(
    draw: st.DrawFn,
) -> tuple[ConnectionFeatures, ProducerMessage, bool, int]:
    negotiated = draw(gen.features)
    message = draw(gen.producer_messages(negotiated))
    return negotiated, message, draw(st.booleans()), draw(gen.opaques)


@ROUND_TRIP
@given(_producer_case(), st.data())
def test_producer_messages_round_trip(
    case: tuple[ConnectionFeatures, ProducerMessage, bool, int], data: st.DataObject
) -> None:
    negotiated, message, compress, opaque = case
    wire = encode_dcp_message(message, opaque=opaque, features=negotiated, compress=compress)
    frame = _read_in_pieces(wire, data)
    assert decode_dcp_message(frame, negotiated) == message
    assert decode_server_frame(frame, negotiated) == message
    if not isinstance(message, DcpNoop | SetVbucketState):
        assert frame.opaque == opaque
        assert frame.is_flexible == (message.stream_id is not None)


@ROUND_TRIP
@given(_producer_case())
def test_producer_messages_decode_with_extra_frame_infos(
    case: tuple[ConnectionFeatures, ProducerMessage, bool, int],
) -> None:
    negotiated, message, compress, opaque = case
    frame = _read_in_pieces_plain(
        encode_dcp_message(message, opaque=opaque, features=negotiated, compress=compress)
    )
    flexible = _read_in_pieces_plain(_with_barrier(frame).encode())
    assert decode_dcp_message(flexible, negotiated) == message


def _read_in_pieces_plain(wire: bytes) -> Frame:
    (frame,) = FrameReader().feed(wire)
    return frame
