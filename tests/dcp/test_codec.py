"""Message-level behaviour: documented byte layouts, response readers, and rejections."""

from __future__ import annotations

import json
import struct

import pytest

from replicator.dcp.protocol.codec import (
    decode_client_frame,
    decode_dcp_message,
    decode_request,
    decode_server_frame,
    encode_dcp_message,
    encode_request,
)
from replicator.dcp.protocol.dcp_messages import ConnectionFeatures, DcpNoop, SetVbucketState
from replicator.dcp.protocol.dcp_requests import (
    BufferAck,
    CloseStream,
    DcpControl,
    DcpOpen,
    StreamRequest,
)
from replicator.dcp.protocol.document_messages import INITIAL_NRU
from replicator.dcp.protocol.events import (
    Deletion,
    Expiration,
    Mutation,
    SeqnoAdvanced,
    SnapshotFlags,
    SnapshotMarker,
    StreamEnd,
    StreamEndReason,
)
from replicator.dcp.protocol.frame import encode_frame, parse_frame
from replicator.dcp.protocol.opcodes import (
    Datatype,
    DcpOpenFlags,
    HelloFeature,
    Magic,
    Opcode,
    Status,
    StreamRequestFlags,
    VbucketState,
)
from replicator.dcp.protocol.pushes import (
    ClustermapChangeNotification,
    decode_server_request,
    encode_server_request,
)
from replicator.dcp.protocol.requests import (
    GetAllVbSeqnos,
    Hello,
    SaslAuth,
    SaslStep,
    encode_hello_features,
)
from replicator.dcp.protocol.responses import (
    Response,
    VbucketSeqno,
    dcp_noop_reply,
    decode_response,
    encode_failover_log,
    encode_response,
    encode_rollback_seqno,
    encode_vbucket_seqnos,
    failover_log_of,
    hello_features_of,
    not_my_vbucket_config_of,
    rollback_seqno_of,
    sasl_mechanisms_of,
    vbucket_seqnos_of,
)
from replicator.dcp.protocol.values import encode_xattrs
from replicator.errors import ProtocolError
from replicator.model.positions import MAX_SEQNO, FailoverLog, VbucketPosition

COLLECTIONS = ConnectionFeatures(collections=True)


def _mutation(**overrides: object) -> Mutation:
    fields: dict[str, object] = {
        "vbucket": 12,
        "by_seqno": 100,
        "rev_seqno": 3,
        "cas": 0xABC,
        "flags": 0x02000006,
        "expiration": 1_700_000_000,
        "lock_time": 0,
        "collection_id": 0,
        "key": b"doc-1",
        "value": b'{"a":1}',
        "is_json": True,
    }
    fields.update(overrides)
    return Mutation(**fields)  # type: ignore[arg-type]


def _response(opcode: int, status: int, value: bytes = b"", **kw: object) -> Response:
    wire = encode_response(Response(opcode, status, 5, value=value, **kw))  # type: ignore[arg-type]
    return decode_response(parse_frame(wire))


# --- documented layouts --------------------------------------------------------------------


def test_hello_matches_the_documented_example() -> None:
    # BinaryProtocol.md: agent "mchello v1.0", features 0x0001..0x0005, 46 bytes in all.
    wire = encode_request(Hello("mchello v1.0", (1, 2, 3, 4, 5)))
    assert wire[:12] == bytes.fromhex("801f000c 00000000 00000016".replace(" ", ""))
    assert wire[24:36] == b"mchello v1.0"
    assert wire[36:] == bytes.fromhex("00010002000300040005")
    assert decode_request(parse_frame(wire)) == Hello("mchello v1.0", (1, 2, 3, 4, 5))


def test_hello_reply_features_are_typed_where_known() -> None:
    reply = _response(Opcode.HELLO, Status.SUCCESS, bytes.fromhex("00030004 0012 7fff"))
    features = hello_features_of(reply)
    assert isinstance(features[2], HelloFeature)
    assert features[2].name == "COLLECTIONS"
    assert features == (3, 4, 0x12, 0x7FFF)
    with pytest.raises(ProtocolError, match="u16"):
        hello_features_of(_response(Opcode.HELLO, Status.SUCCESS, b"\x00"))


def test_stream_request_matches_the_documented_example() -> None:
    request = StreamRequest(
        vbucket=0,
        start_seqno=0xFFEEDD,
        end_seqno=MAX_SEQNO,
        vbucket_uuid=0xFEEDDECA,
        snapshot_start=0,
        snapshot_end=0xFFEEFF,
        opaque=0x1000,
    )
    wire = encode_request(request)
    assert wire[:8] == bytes.fromhex("8053000030000000")
    assert struct.unpack(">I", wire[8:12])[0] == 48
    assert wire[24:32] == b"\x00" * 8
    assert struct.unpack(">QQQQQ", wire[32:72]) == (0xFFEEDD, MAX_SEQNO, 0xFEEDDECA, 0, 0xFFEEFF)
    assert decode_request(parse_frame(wire)) == request


def test_stream_request_carries_purge_seqno_and_stream_id_as_json() -> None:
    request = StreamRequest(7, 50, MAX_SEQNO, 0xBEEF, 50, 50, purge_seqno=81021, stream_id=3)
    frame = parse_frame(encode_request(request))
    assert frame.datatype == Datatype.JSON
    assert json.loads(frame.value) == {"purge_seqno": "81021", "sid": 3}
    assert decode_request(frame) == request


def test_stream_request_from_a_committed_position() -> None:
    position = VbucketPosition.at_boundary(9, 0xCAFE, 120, purge_seqno=77)
    request = StreamRequest.from_position(position, opaque=4)
    assert (request.start_seqno, request.snapshot_start, request.snapshot_end) == (120, 120, 120)
    assert (request.vbucket, request.vbucket_uuid, request.end_seqno) == (9, 0xCAFE, MAX_SEQNO)
    assert request.purge_seqno is None
    assert not request.flags & StreamRequestFlags.IGNORE_PURGED_TOMBSTONES
    with_purge = StreamRequest.from_position(position, send_purge_seqno=True)
    assert with_purge.purge_seqno == 77


@pytest.mark.parametrize(
    "value",
    [b"[1]", b'{"collections":["8"]}', b'{"purge_seqno":12}', b'{"sid":0}', b"{", b"\xff"],
)
def test_stream_request_value_the_codec_cannot_honour_is_rejected(value: bytes) -> None:
    extras = struct.pack(">IIQQQQQ", 0, 0, 0, MAX_SEQNO, 0, 0, 0)
    frame = parse_frame(
        encode_frame(Magic.REQUEST, Opcode.DCP_STREAM_REQ, extras=extras, value=value)
    )
    with pytest.raises(ProtocolError, match="DCP_STREAM_REQ") as caught:
        decode_request(frame)
    assert caught.value.opcode == Opcode.DCP_STREAM_REQ


def test_dcp_open_layout_and_name_limit() -> None:
    flags = DcpOpenFlags.PRODUCER | DcpOpenFlags.INCLUDE_XATTRS | DcpOpenFlags.INCLUDE_DELETE_TIMES
    wire = encode_request(DcpOpen("replicator:1", flags, opaque=2))
    assert wire[4] == 8
    assert struct.unpack(">II", wire[24:32]) == (0, 0x25)
    assert wire[32:] == b"replicator:1"
    with pytest.raises(ValueError, match=r"1\.\.200 bytes"):
        DcpOpen("n" * 201, flags)


def test_close_stream_with_stream_id_uses_flexible_framing() -> None:
    frame = parse_frame(encode_request(CloseStream(44, stream_id=2)))
    assert frame.magic == Magic.FLEX_REQUEST
    assert frame.framing_extras == b"\x22\x00\x02"
    assert frame.vbucket == 44
    assert decode_request(frame) == CloseStream(44, 2)
    assert parse_frame(encode_request(CloseStream(44))).magic == Magic.REQUEST


def test_get_all_vb_seqnos_state_and_collection_filters() -> None:
    assert parse_frame(encode_request(GetAllVbSeqnos())).extras == b""
    assert parse_frame(encode_request(GetAllVbSeqnos(VbucketState.REPLICA))).extras == (
        b"\x00\x00\x00\x02"
    )
    both = parse_frame(encode_request(GetAllVbSeqnos(VbucketState.ACTIVE, 8)))
    assert both.extras == b"\x00\x00\x00\x01\x00\x00\x00\x08"
    with pytest.raises(ValueError, match="vbucket state"):
        GetAllVbSeqnos(collection_id=8)


def test_buffer_ack_is_a_u32_in_the_extras() -> None:
    frame = parse_frame(encode_request(BufferAck(123_456)))
    assert (frame.opcode, frame.extras) == (Opcode.DCP_BUFFER_ACK, struct.pack(">I", 123_456))
    with pytest.raises(ValueError, match="out of range"):
        encode_request(BufferAck(1 << 32))


def test_sasl_payload_never_appears_in_repr() -> None:
    secret = b"\x00user\x00hunter2"
    for message in (SaslAuth("PLAIN", secret), SaslStep("SCRAM-SHA512", secret)):
        assert "hunter2" not in repr(message)
        assert decode_request(parse_frame(encode_request(message))) == message


def test_dcp_control_is_key_and_value_text() -> None:
    frame = parse_frame(encode_request(DcpControl("enable_noop", "true")))
    assert (frame.key, frame.value, frame.extras) == (b"enable_noop", b"true", b"")


# --- responses -----------------------------------------------------------------------------


def test_failover_log_reply_is_read_newest_first() -> None:
    log = FailoverLog.of([(0xBEEF, 200), (0xCAFE, 0)])
    value = encode_failover_log(log)
    assert value == struct.pack(">QQQQ", 0xBEEF, 200, 0xCAFE, 0)
    assert failover_log_of(_response(Opcode.DCP_STREAM_REQ, Status.SUCCESS, value)) == log


@pytest.mark.parametrize("value", [b"", b"\x00" * 15, b"\x00" * 17])
def test_failover_log_of_wrong_size_raises(value: bytes) -> None:
    with pytest.raises(ProtocolError, match="failover log"):
        failover_log_of(_response(Opcode.DCP_GET_FAILOVER_LOG, Status.SUCCESS, value))


def test_rollback_seqno_comes_from_the_value_not_the_extras() -> None:
    # The documented rollback reply: status 0x23, extlen 0, 8-byte value.
    wire = bytes.fromhex("81530000000000230000000800001000" + "00" * 8) + struct.pack(">Q", 0)
    assert rollback_seqno_of(decode_response(parse_frame(wire))) == 0
    reply = _response(Opcode.DCP_STREAM_REQ, Status.ROLLBACK, encode_rollback_seqno(4242))
    assert rollback_seqno_of(reply) == 4242
    in_extras = _response(Opcode.DCP_STREAM_REQ, Status.ROLLBACK, extras=struct.pack(">Q", 9))
    with pytest.raises(ProtocolError, match="rollback value of 0 bytes"):
        rollback_seqno_of(in_extras)


def test_readers_check_the_status() -> None:
    with pytest.raises(ProtocolError, match="needs status ROLLBACK, got ERANGE"):
        rollback_seqno_of(_response(Opcode.DCP_STREAM_REQ, Status.ERANGE))
    with pytest.raises(ProtocolError, match="needs status SUCCESS, got 0x4242"):
        failover_log_of(_response(Opcode.DCP_STREAM_REQ, 0x4242))


def test_unknown_status_codes_are_kept_as_numbers() -> None:
    reply = _response(Opcode.DCP_STREAM_REQ, 0x4242)
    assert reply.status == 0x4242 and not isinstance(reply.status, Status)
    assert reply.status_name == "0x4242"
    assert _response(Opcode.DCP_STREAM_REQ, Status.KEY_EEXISTS).status is Status.KEY_EEXISTS


def test_vbucket_seqnos_round_trip_and_size_check() -> None:
    records = (VbucketSeqno(0, 5), VbucketSeqno(1023, MAX_SEQNO))
    reply = _response(Opcode.GET_ALL_VB_SEQNOS, Status.SUCCESS, encode_vbucket_seqnos(records))
    assert vbucket_seqnos_of(reply) == records
    with pytest.raises(ProtocolError, match="10-byte"):
        vbucket_seqnos_of(_response(Opcode.GET_ALL_VB_SEQNOS, Status.SUCCESS, b"\x00" * 11))


def test_not_my_vbucket_may_carry_a_cluster_map() -> None:
    config = b'{"rev":12}'
    with_map = _response(Opcode.DCP_STREAM_REQ, Status.NOT_MY_VBUCKET, config)
    assert not_my_vbucket_config_of(with_map) == config
    assert not_my_vbucket_config_of(_response(Opcode.DCP_STREAM_REQ, Status.NOT_MY_VBUCKET)) is None


def test_sasl_mechanisms_are_space_separated() -> None:
    reply = _response(Opcode.SASL_LIST_MECHS, Status.SUCCESS, b"SCRAM-SHA512 SCRAM-SHA256 PLAIN")
    assert sasl_mechanisms_of(reply) == ("SCRAM-SHA512", "SCRAM-SHA256", "PLAIN")


def test_snappy_reply_values_are_decompressed_by_readers() -> None:
    from replicator.dcp.protocol.values import compress_value

    value = encode_failover_log(FailoverLog.of([(1, 0)]))
    reply = _response(
        Opcode.DCP_GET_FAILOVER_LOG,
        Status.SUCCESS,
        compress_value(value),
        datatype=Datatype.SNAPPY,
    )
    assert failover_log_of(reply) == FailoverLog.of([(1, 0)])


def test_dcp_noop_reply_is_a_response_with_the_same_opaque() -> None:
    noop = decode_dcp_message(parse_frame(encode_dcp_message(DcpNoop(opaque=0x77))))
    assert noop == DcpNoop(0x77)
    reply = parse_frame(encode_response(dcp_noop_reply(noop.opaque)))
    assert (reply.magic, reply.opcode, reply.status, reply.opaque) == (0x81, 0x5C, 0, 0x77)
    assert decode_client_frame(reply) == Response(Opcode.DCP_NOOP, Status.SUCCESS, 0x77)


def test_hello_features_value_helper_matches_request_encoding() -> None:
    features = (HelloFeature.XERROR, HelloFeature.COLLECTIONS)
    frame = parse_frame(encode_request(Hello("r", features)))
    assert frame.value == encode_hello_features(features) == b"\x00\x07\x00\x12"


# --- producer messages ---------------------------------------------------------------------


def test_snapshot_marker_versions_follow_the_fields_present() -> None:
    v1 = SnapshotMarker(1, 0, 8, SnapshotFlags.MEMORY)
    v20 = SnapshotMarker(1, 1, 8, SnapshotFlags.DISK, max_visible_seqno=8, high_completed_seqno=7)
    v22 = SnapshotMarker(1, 1, 8, SnapshotFlags.DISK, 8, 7, purge_seqno=3, high_prepared_seqno=6)
    frames = [parse_frame(encode_dcp_message(m)) for m in (v1, v20, v22)]
    assert [(len(f.extras), len(f.value)) for f in frames] == [(20, 0), (1, 36), (1, 52)]
    assert [f.extras[0] for f in frames[1:]] == [0, 2]
    # The documented v2.0 example: start 1, end 8, disk, max visible 8, high completed 7.
    assert frames[1].value == bytes.fromhex(
        "000000000000000100000000000000080000000200000000000000080000000000000007"
    )
    assert [decode_dcp_message(f) for f in frames] == [v1, v20, v22]


def test_snapshot_marker_with_incomplete_v2_fields_is_not_encodable() -> None:
    with pytest.raises(ValueError, match="high_completed_seqno"):
        encode_dcp_message(SnapshotMarker(1, 0, 8, SnapshotFlags.DISK, max_visible_seqno=8))
    with pytest.raises(ValueError, match=r"v2\.2"):
        encode_dcp_message(SnapshotMarker(1, 0, 8, SnapshotFlags.DISK, 8, 7, purge_seqno=3))


def test_unknown_snapshot_marker_version_raises() -> None:
    wire = encode_frame(Magic.REQUEST, Opcode.DCP_SNAPSHOT_MARKER, extras=b"\x01", value=b"")
    with pytest.raises(ProtocolError, match="version byte 1"):
        decode_dcp_message(parse_frame(wire))


def test_mutation_layout() -> None:
    mutation = _mutation(collection_id=300, stream_id=9)
    frame = parse_frame(encode_dcp_message(mutation, opaque=0x55, features=COLLECTIONS))
    assert frame.magic == Magic.FLEX_REQUEST and frame.stream_id == 9
    assert (frame.opaque, frame.cas, frame.vbucket) == (0x55, 0xABC, 12)
    assert frame.extras == struct.pack(
        ">QQIIIHB", 100, 3, 0x02000006, 1_700_000_000, 0, 0, INITIAL_NRU
    )
    assert frame.key == b"\xac\x02doc-1"
    assert frame.datatype == Datatype.JSON
    assert decode_dcp_message(frame, COLLECTIONS) == mutation


def test_mutation_key_and_value_found_from_header_lengths_not_assumed_sizes() -> None:
    # Extras of a different size must be refused rather than misread as key bytes.
    wire = encode_frame(
        Magic.REQUEST, Opcode.DCP_MUTATION, extras=b"\x00" * 32, key=b"k", value=b"v"
    )
    with pytest.raises(ProtocolError, match="extras of 32 bytes, expected 31") as caught:
        decode_dcp_message(parse_frame(wire))
    assert caught.value.opcode == Opcode.DCP_MUTATION


def test_mutation_value_with_xattrs_and_snappy() -> None:
    mutation = _mutation(xattrs=(("_sync", '{"rev":"1-a"}'),))
    frame = parse_frame(encode_dcp_message(mutation, compress=True))
    assert frame.datatype == Datatype.JSON | Datatype.SNAPPY | Datatype.XATTR
    assert decode_dcp_message(frame) == mutation
    stripped = parse_frame(encode_dcp_message(mutation, include_xattrs=False))
    assert stripped.datatype == Datatype.JSON
    assert decode_dcp_message(stripped) == _mutation()


def test_collection_id_needs_a_collections_connection() -> None:
    with pytest.raises(ValueError, match="collections connection"):
        encode_dcp_message(_mutation(collection_id=8))


def test_collections_key_without_prefix_is_rejected() -> None:
    wire = encode_frame(Magic.REQUEST, Opcode.DCP_DELETION, extras=b"\x00" * 18, key=b"\x80")
    with pytest.raises(ProtocolError, match="truncated LEB128"):
        decode_dcp_message(parse_frame(wire), COLLECTIONS)


def test_deletion_version_follows_delete_times() -> None:
    deletion = Deletion(3, 9, 2, 0xF00, 0, b"gone", delete_time=1_700_000_123)
    v2 = parse_frame(encode_dcp_message(deletion, features=ConnectionFeatures(delete_times=True)))
    assert v2.extras == struct.pack(">QQIB", 9, 2, 1_700_000_123, 0)
    assert decode_dcp_message(v2) == deletion
    v1_deletion = Deletion(3, 9, 2, 0xF00, 0, b"gone")
    v1 = parse_frame(encode_dcp_message(v1_deletion))
    assert v1.extras == struct.pack(">QQH", 9, 2, 0)
    assert decode_dcp_message(v1) == v1_deletion
    with pytest.raises(ValueError, match="delete_time"):
        encode_dcp_message(deletion)


def test_deletion_carries_xattrs_from_its_value() -> None:
    section = encode_xattrs([("_sync", "{}")])
    wire = encode_frame(
        Magic.REQUEST,
        Opcode.DCP_DELETION,
        datatype=Datatype.XATTR,
        extras=struct.pack(">QQIB", 5, 1, 0, 0),
        key=b"d",
        value=section,
    )
    deletion = decode_dcp_message(parse_frame(wire))
    assert isinstance(deletion, Deletion)
    assert deletion.xattrs == (("_sync", "{}"),)


def test_expiration_layout() -> None:
    expiration = Expiration(4, 11, 6, 0x99, 8, b"old", 1_700_000_555)
    frame = parse_frame(encode_dcp_message(expiration, features=COLLECTIONS))
    assert frame.extras == struct.pack(">QQI", 11, 6, 1_700_000_555)
    assert decode_dcp_message(frame, COLLECTIONS) == expiration


def test_system_event_value_order_is_uid_scope_collection() -> None:
    wire = encode_frame(
        Magic.REQUEST,
        Opcode.DCP_SYSTEM_EVENT,
        extras=struct.pack(">QIB", 4, 0, 1),
        key=b"mycollection",
        value=struct.pack(">QIII", 2, 0, 8, 72000),  # version 1 adds max_ttl
    )
    event = decode_dcp_message(parse_frame(wire))
    assert (event.manifest_uid, event.scope_id, event.collection_id) == (2, 0, 8)  # type: ignore[union-attr]


def test_flatbuffers_system_events_are_refused() -> None:
    wire = encode_frame(
        Magic.REQUEST,
        Opcode.DCP_SYSTEM_EVENT,
        extras=struct.pack(">QIB", 4, 0, 2),
        value=b"\x00" * 16,
    )
    with pytest.raises(ProtocolError, match="FlatBuffers"):
        decode_dcp_message(parse_frame(wire))


def test_stream_end_reason_and_unknown_reason() -> None:
    end = StreamEnd(5, StreamEndReason.STATE_CHANGED, stream_id=2)
    assert decode_dcp_message(parse_frame(encode_dcp_message(end))) == end
    wire = encode_frame(Magic.REQUEST, Opcode.DCP_STREAM_END, extras=struct.pack(">I", 99))
    with pytest.raises(ProtocolError, match="unknown stream end reason 99"):
        decode_dcp_message(parse_frame(wire))


def test_seqno_advanced_and_set_vbucket_state() -> None:
    advanced = SeqnoAdvanced(6, 1234)
    assert parse_frame(encode_dcp_message(advanced)).extras == struct.pack(">Q", 1234)
    state = SetVbucketState(6, VbucketState.DEAD, opaque=3)
    frame = parse_frame(encode_dcp_message(state))
    assert frame.extras == b"\x04"
    assert decode_dcp_message(frame) == state


@pytest.mark.parametrize(
    "opcode",
    [0x01, Opcode.DCP_FLUSH, Opcode.DCP_PREPARE, Opcode.DCP_COMMIT, Opcode.DCP_STREAM_REQ],
)
def test_opcodes_a_producer_must_not_send_are_rejected(opcode: int) -> None:
    with pytest.raises(ProtocolError, match="may send") as caught:
        decode_dcp_message(parse_frame(encode_frame(Magic.REQUEST, opcode)))
    assert caught.value.opcode == opcode


@pytest.mark.parametrize(
    ("opcode", "extras"),
    [
        (Opcode.DCP_SNAPSHOT_MARKER, 19),
        (Opcode.DCP_DELETION, 20),
        (Opcode.DCP_EXPIRATION, 18),
        (Opcode.DCP_SYSTEM_EVENT, 12),
        (Opcode.DCP_SEQNO_ADVANCED, 4),
        (Opcode.DCP_OSO_SNAPSHOT, 8),
        (Opcode.DCP_STREAM_END, 0),
    ],
)
def test_extras_of_the_wrong_size_are_rejected(opcode: int, extras: int) -> None:
    wire = encode_frame(Magic.REQUEST, opcode, extras=b"\x00" * extras, key=b"\x00k")
    with pytest.raises(ProtocolError, match=f"extras of {extras} bytes") as caught:
        decode_dcp_message(parse_frame(wire), COLLECTIONS)
    assert caught.value.opcode == opcode


def test_requests_reject_bodies_they_must_not_have() -> None:
    wire = encode_frame(Magic.REQUEST, Opcode.NOOP, value=b"x")
    with pytest.raises(ProtocolError, match="NOOP: expected no body"):
        decode_request(parse_frame(wire))
    with pytest.raises(ProtocolError, match="not a request this codec supports"):
        decode_request(parse_frame(encode_frame(Magic.REQUEST, 0x01)))


# --- server pushes and dispatch ------------------------------------------------------------


def test_clustermap_notification_both_extras_forms() -> None:
    short = ClustermapChangeNotification("travel", 1200, None, b'{"rev":1200}')
    frame = parse_frame(encode_server_request(short))
    assert (frame.magic, frame.opcode, frame.extras) == (0x82, 0x01, struct.pack(">I", 1200))
    assert decode_server_request(frame) == short
    with_epoch = ClustermapChangeNotification("travel", 1201, -1)
    frame = parse_frame(encode_server_request(with_epoch))
    assert frame.extras == struct.pack(">qq", -1, 1201)
    assert decode_server_frame(frame) == with_epoch


def test_server_frame_dispatch_by_magic() -> None:
    mutation = _mutation()
    assert decode_server_frame(parse_frame(encode_dcp_message(mutation))) == mutation
    reply = Response(Opcode.DCP_OPEN, Status.SUCCESS, 1)
    assert decode_server_frame(parse_frame(encode_response(reply))) == reply
    with pytest.raises(ProtocolError, match="not sent by a server"):
        decode_server_frame(parse_frame(encode_frame(Magic.SERVER_RESPONSE, 0x01)))
    with pytest.raises(ProtocolError, match="not sent by a client"):
        decode_client_frame(
            parse_frame(encode_server_request(ClustermapChangeNotification("b", 1)))
        )


def test_negotiated_features() -> None:
    features = ConnectionFeatures.negotiated(
        [HelloFeature.XERROR, HelloFeature.COLLECTIONS],
        DcpOpenFlags.PRODUCER | DcpOpenFlags.INCLUDE_DELETE_TIMES,
    )
    assert features.collections and features.delete_times
    assert not ConnectionFeatures.negotiated([HelloFeature.JSON]).collections
