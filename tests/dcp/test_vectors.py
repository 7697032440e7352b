"""Real frames from a real server (shared/vectors) decode to the fields their README states."""

from __future__ import annotations

import json
import re

import pytest

from replicator.dcp.protocol.codec import decode_dcp_message
from replicator.dcp.protocol.dcp_messages import ConnectionFeatures
from replicator.dcp.protocol.events import Mutation, SnapshotFlags, SnapshotMarker, SystemEvent
from replicator.dcp.protocol.events import SystemEventType as Ev
from replicator.dcp.protocol.frame import Frame, FrameReader, parse_frame
from replicator.dcp.protocol.opcodes import Magic, Opcode, Status
from replicator.dcp.protocol.responses import (
    Response,
    decode_response,
    encode_response,
    not_my_vbucket_config_of,
    vbucket_seqnos_of,
)
from replicator.dcp.protocol.values import decode_xattrs, encode_xattrs
from replicator.errors import ProtocolError
from tests.golden_vectors import GOMEMCACHED, VECTORS, gomemcached_event_wire, requires_vectors

COLLECTIONS = ConnectionFeatures(collections=True)
NO_COLLECTIONS = ConnectionFeatures(collections=False)

pytestmark = requires_vectors


def _split_frame(name: str) -> Frame:
    header = (GOMEMCACHED / f"header.{name}.bin").read_bytes()
    body = (GOMEMCACHED / f"body.{name}.bin").read_bytes()
    return parse_frame(header + body)


def _json_event_frame(name: str) -> Frame:
    return parse_frame(gomemcached_event_wire(name))


def test_snapshot_marker_vector() -> None:
    frame = _split_frame("0x56")
    assert frame.magic == Magic.FLEX_REQUEST
    assert frame.opaque == 0x0001036A
    marker = decode_dcp_message(frame, COLLECTIONS)
    assert marker == SnapshotMarker(
        vbucket=874,
        start_seqno=0,
        end_seqno=24,
        flags=SnapshotFlags.DISK | SnapshotFlags.CHECKPOINT,
        stream_id=1,
    )
    assert marker.flags == 0x06


def test_mutation_vector() -> None:
    frame = _split_frame("0x57")
    assert len(frame.extras) == 31
    # nmeta (u16) and nru (u8) close the 31-byte extras; the event does not carry them.
    assert frame.extras[28:30] == b"\x00\x00"
    assert frame.extras[30] == 2
    assert frame.key[0] == 0x08
    mutation = decode_dcp_message(frame, COLLECTIONS)
    assert isinstance(mutation, Mutation)
    assert mutation.vbucket == 874
    assert mutation.cas == 0x15C7C2B955AB0000
    assert mutation.by_seqno == 24
    assert mutation.rev_seqno == 1
    assert (mutation.flags, mutation.expiration, mutation.lock_time) == (0, 0, 0)
    assert mutation.collection_id == 8
    assert mutation.key == b"xdcrProvCollections_C29854"
    assert mutation.is_json
    assert len(mutation.value) == 87
    assert json.loads(mutation.value)["name"] == "xdcrProvCollections_C29854"
    assert mutation.xattrs == ()
    assert mutation.stream_id == 1


def test_system_event_vector() -> None:
    event = decode_dcp_message(_split_frame("0x5f"), COLLECTIONS)
    assert event == SystemEvent(
        vbucket=874,
        by_seqno=4,
        event=Ev.COLLECTION_CREATED,
        version=0,
        name="col1",
        manifest_uid=0,
        scope_id=8,
        collection_id=8,
        stream_id=1,
    )


def test_lone_flex_header_vector_parses() -> None:
    header = (GOMEMCACHED / "flexSnapOpHdr.bin").read_bytes()
    reader = FrameReader()
    assert reader.feed(header) == []
    assert reader.buffered_bytes == 24
    # The header announced 3 framing bytes + 20 extras = 23: give it exactly those.
    body = b"\x22\x00\x05" + (1).to_bytes(8, "big") + (9).to_bytes(8, "big") + b"\x00\x00\x00\x01"
    (frame,) = reader.feed(body)
    assert (frame.magic, frame.opcode, frame.vbucket) == (0x08, Opcode.DCP_SNAPSHOT_MARKER, 925)
    assert len(frame.framing_extras) == 3 and len(frame.extras) == 20
    marker = decode_dcp_message(frame)
    assert isinstance(marker, SnapshotMarker)
    assert (marker.vbucket, marker.start_seqno, marker.end_seqno) == (925, 1, 9)
    assert marker.stream_id == 5


def test_lone_flex_header_is_a_truncated_frame() -> None:
    reader = FrameReader()
    reader.feed((GOMEMCACHED / "flexSnapOpHdr.bin").read_bytes())
    with pytest.raises(ProtocolError, match="truncated") as caught:
        reader.finish()
    assert caught.value.opcode == Opcode.DCP_SNAPSHOT_MARKER


def test_get_all_vb_seqnos_body() -> None:
    body = (GOMEMCACHED / "getSeqnoRespBody.bin").read_bytes()
    wire = encode_response(Response(Opcode.GET_ALL_VB_SEQNOS, Status.SUCCESS, 9, value=body))
    records = vbucket_seqnos_of(decode_response(parse_frame(wire)))
    assert len(records) == 1024
    assert [r.vbucket for r in records] == list(range(1024))
    assert [(r.vbucket, r.seqno) for r in records[:3]] == [(0, 11), (1, 7), (2, 16)]


_SNAPPY_BODY = {"click": "to edit", "with JSON": "there are no reserved field names"}


@pytest.mark.parametrize(
    ("name", "features", "collection_id", "key", "by_seqno", "flags", "body"),
    [
        (
            "defaultScopeDefaultColMutation.json",
            COLLECTIONS,
            0,
            b"d1",
            1,
            0x02000006,
            _SNAPPY_BODY,
        ),
        ("origNoCollectionMut.json", NO_COLLECTIONS, 0, b"d1", 1, 0x02000006, _SNAPPY_BODY),
        (
            "scope_and_collection_mutation.json",
            COLLECTIONS,
            9,
            b"d1",
            5,
            0x02000000,
            {"key": "a sentence"},
        ),
    ],
)
def test_json_described_mutations(
    name: str,
    features: ConnectionFeatures,
    collection_id: int,
    key: bytes,
    by_seqno: int,
    flags: int,
    body: dict[str, str],
) -> None:
    frame = _json_event_frame(name)
    mutation = decode_dcp_message(frame, features)
    assert isinstance(mutation, Mutation)
    assert mutation.vbucket == 406
    assert mutation.cas == json.loads((GOMEMCACHED / name).read_text())["Cas"]
    assert (mutation.by_seqno, mutation.rev_seqno, mutation.flags) == (by_seqno, 1, flags)
    assert (mutation.collection_id, mutation.key) == (collection_id, key)
    assert mutation.is_json
    assert json.loads(mutation.value) == body
    assert mutation.stream_id is None


def test_snappy_vector_is_decompressed() -> None:
    frame = _json_event_frame("defaultScopeDefaultColMutation.json")
    assert frame.datatype == 0x03
    mutation = decode_dcp_message(frame, COLLECTIONS)
    assert isinstance(mutation, Mutation)
    assert mutation.value != frame.value
    assert mutation.value.startswith(b"{") and mutation.value.endswith(b"}")


@pytest.mark.parametrize(
    ("name", "vbucket", "by_seqno", "event", "event_name", "uid", "scope", "collection"),
    [
        ("collectionCreation.json", 511, 4, Ev.COLLECTION_CREATED, "C1", 4, 8, 9),
        ("collectionDel.json", 1023, 5, Ev.COLLECTION_DROPPED, "", 5, 8, 9),
        ("scopeCreation.json", 511, 1, Ev.SCOPE_CREATED, "S1", 1, 8, None),
        ("scopeDel.json", 1023, 4, Ev.SCOPE_DROPPED, "", 4, 8, None),
    ],
)
def test_json_described_system_events(
    name: str,
    vbucket: int,
    by_seqno: int,
    event: Ev,
    event_name: str,
    uid: int,
    scope: int,
    collection: int | None,
) -> None:
    decoded = decode_dcp_message(_json_event_frame(name), COLLECTIONS)
    assert decoded == SystemEvent(
        vbucket=vbucket,
        by_seqno=by_seqno,
        event=event,
        version=0,
        name=event_name,
        manifest_uid=uid,
        scope_id=scope,
        collection_id=collection,
    )


def _hex_dump_bytes(text: str) -> bytes:
    data = bytearray()
    for line in text.splitlines():
        match = re.match(r"\|[0-9a-f]{8}\|((?: [0-9a-f]{2})+)", line)
        if match:
            data += bytes.fromhex(match.group(1))
    return bytes(data)


def test_xattr_vector() -> None:
    section = _hex_dump_bytes((VECTORS / "java-dcp-client" / "encoded-xattrs.txt").read_text())
    assert len(section) == 4 + 0x72
    xattrs, body = decode_xattrs(section + b'{"doc":1}')
    assert xattrs == (
        ("_sync", '{"cas":"deadbeefcafefeed"}'),
        ("meta", '{"author":"Trond Norbye","content-type":"application/octet-stream"}'),
    )
    assert body == b'{"doc":1}'
    assert encode_xattrs(xattrs) == section


def test_real_cluster_config_travels_in_a_not_my_vbucket_reply() -> None:
    config = (VECTORS / "java-dcp-client" / "config_magma_two_nodes.json").read_bytes()
    wire = encode_response(Response(Opcode.DCP_STREAM_REQ, Status.NOT_MY_VBUCKET, 3, value=config))
    carried = not_my_vbucket_config_of(decode_response(parse_frame(wire)))
    assert carried is not None
    assert "vBucketServerMap" in json.loads(carried)
