"""Round trips: every message type encodes, crosses a FrameReader in arbitrary pieces, and
decodes to itself, with classic and with flexible framing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicator.dcp.protocol.codec import (
    ClientRequest,
    ProducerMessage,
    decode_client_frame,
    decode_dcp_message,
    decode_request,
    decode_server_frame,
    encode_dcp_message,
    encode_request,
)
from replicator.dcp.protocol.dcp_messages import ConnectionFeatures, DcpNoop, SetVbucketState
from replicator.dcp.protocol.frame import Frame, FrameReader
from replicator.dcp.protocol.opcodes import Datatype, Magic, Opcode, Status
from replicator.dcp.protocol.pushes import (
    ClustermapChangeNotification,
    decode_server_request,
    encode_server_request,
)
from replicator.dcp.protocol.requests import encode_hello_features
from replicator.dcp.protocol.responses import (
    Response,
    VbucketSeqno,
    decode_response,
    encode_failover_log,
    encode_response,
    encode_rollback_seqno,
    encode_sasl_mechanisms,
    encode_vbucket_seqnos,
    failover_log_of,
    hello_features_of,
    rollback_seqno_of,
    sasl_mechanisms_of,
    vbucket_seqnos_of,
)
from replicator.dcp.protocol.values import compress_value
from replicator.model.positions import MAX_FAILOVER_ENTRIES, FailoverLog
from tests.dcp import strategies as gen

ROUND_TRIP = settings(max_examples=150, deadline=None)
REPLY_ROUND_TRIP = settings(max_examples=50, deadline=None)
"""Reply values are flat lists of integers or names: fewer examples cover them."""


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


# --- typed reply values: encoder and reader are inverse, across the wire ---------------------

failover_logs = st.lists(
    st.tuples(gen.u64, gen.u64), min_size=1, max_size=MAX_FAILOVER_ENTRIES
).map(FailoverLog.of)
vbucket_seqnos = st.lists(st.builds(VbucketSeqno, gen.u16, gen.u64), max_size=40)
mechanism_names = st.text(
    st.characters(blacklist_categories=["Cs", "Zs", "Zl", "Zp", "Cc"]), min_size=1, max_size=20
)


def _reply_across_the_wire(
    opcode: int, status: int, value: bytes, data: st.DataObject, *, may_compress: bool
) -> Response:
    """A reply carrying `value` (snappy-compressed when drawn so), encoded and read back."""
    datatype = 0
    if may_compress and data.draw(st.booleans(), label="compress"):
        value, datatype = compress_value(value), int(Datatype.SNAPPY)
    opaque = data.draw(gen.opaques, label="opaque")
    sent = Response(opcode, status, opaque, value, datatype=datatype)
    received = decode_response(_read_in_pieces(encode_response(sent), data))
    assert received == sent
    return received


@REPLY_ROUND_TRIP
@given(
    failover_logs, st.sampled_from([Opcode.DCP_STREAM_REQ, Opcode.DCP_GET_FAILOVER_LOG]), st.data()
)
def test_failover_log_round_trip(log: FailoverLog, opcode: Opcode, data: st.DataObject) -> None:
    reply = _reply_across_the_wire(
        opcode, Status.SUCCESS, encode_failover_log(log), data, may_compress=True
    )
    assert failover_log_of(reply) == log


@REPLY_ROUND_TRIP
@given(gen.u64, st.data())
def test_rollback_seqno_round_trip(seqno: int, data: st.DataObject) -> None:
    reply = _reply_across_the_wire(
        Opcode.DCP_STREAM_REQ,
        Status.ROLLBACK,
        encode_rollback_seqno(seqno),
        data,
        may_compress=True,
    )
    assert rollback_seqno_of(reply) == seqno


@REPLY_ROUND_TRIP
@given(vbucket_seqnos, st.data())
def test_vbucket_seqnos_round_trip(records: list[VbucketSeqno], data: st.DataObject) -> None:
    reply = _reply_across_the_wire(
        Opcode.GET_ALL_VB_SEQNOS,
        Status.SUCCESS,
        encode_vbucket_seqnos(records),
        data,
        may_compress=True,
    )
    assert vbucket_seqnos_of(reply) == tuple(records)


@REPLY_ROUND_TRIP
@given(st.lists(gen.u16, max_size=20), st.data())
def test_hello_features_round_trip(features: list[int], data: st.DataObject) -> None:
    reply = _reply_across_the_wire(
        Opcode.HELLO, Status.SUCCESS, encode_hello_features(features), data, may_compress=False
    )
    assert hello_features_of(reply) == tuple(features)


@REPLY_ROUND_TRIP
@given(st.lists(mechanism_names, max_size=6), st.data())
def test_sasl_mechanisms_round_trip(names: list[str], data: st.DataObject) -> None:
    reply = _reply_across_the_wire(
        Opcode.SASL_LIST_MECHS,
        Status.SUCCESS,
        encode_sasl_mechanisms(names),
        data,
        may_compress=False,
    )
    assert sasl_mechanisms_of(reply) == tuple(names)


@pytest.mark.parametrize("names", [["SCRAM-SHA512", "PL AIN"], [""], ["PLAIN\n"]])
def test_sasl_mechanism_names_that_would_not_read_back_are_refused(names: list[str]) -> None:
    with pytest.raises(ValueError, match="SASL mechanism name"):
        encode_sasl_mechanisms(names)
