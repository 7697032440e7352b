"""The simulator's own frames against real frames from a real server (shared/vectors).

Each vector is decoded into the event a vbucket's history would hold, served through a
`ProducerStream` (the path every stream takes, mutations through its hand-packed hot path)
and the frame it encodes is compared field by field with the vector's bytes. The split-file
vectors use flexible framing with a stream id, which the simulator does not offer: for them
every field but the magic and the framing extras is compared (the body length without them).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TypeVar

import pytest

from replicator.dcp.protocol.codec import decode_dcp_message
from replicator.dcp.protocol.dcp_messages import ConnectionFeatures
from replicator.dcp.protocol.events import Mutation, SnapshotFlags, SnapshotMarker, SystemEvent
from replicator.dcp.protocol.frame import HEADER_SIZE, Frame, parse_frame
from replicator.dcp.protocol.opcodes import Magic
from replicator.sim.dcp_controls import MarkerVersion
from replicator.sim.history_items import HistoryItem
from replicator.sim.producer_stream import ProducerStream, StreamEncoding, StreamFilter
from replicator.sim.vbucket import ServedSnapshot
from tests.golden_vectors import GOMEMCACHED, gomemcached_event_wire, requires_vectors

pytestmark = requires_vectors

COLLECTION_AWARE = StreamEncoding(collections=True, json=True, marker_version=MarkerVersion.V1)
# The snappy vectors hold a value the server had stored compressed: it went out compressed
# although 72 bytes compress to no fewer. The simulator does that with force_value_compression.
COLLECTION_AWARE_SNAPPY = StreamEncoding(
    collections=True, json=True, snappy=True, force_compression=True
)
LEGACY_SNAPPY = StreamEncoding(json=True, snappy=True, force_compression=True)


class OneSnapshotCursor:
    """Stands in for a vbucket's StreamCursor: serves one snapshot, then nothing."""

    def __init__(self, part: ServedSnapshot) -> None:
        self._part: ServedSnapshot | None = part
        self.closed = False

    def next_snapshot(self, max_items: int = 0) -> ServedSnapshot | None:
        part, self._part = self._part, None
        return part

    def close(self) -> None:
        self.closed = True


def served_frames(
    vbucket: int,
    opaque: int,
    marker: SnapshotMarker,
    items: tuple[HistoryItem, ...],
    encoding: StreamEncoding,
    stream_filter: StreamFilter | None = None,
) -> list[Frame]:
    """The frames a ProducerStream queues for one snapshot (marker first)."""
    cursor = OneSnapshotCursor(ServedSnapshot(marker, items, is_last_part=True))
    stream = ProducerStream(
        vbucket,
        opaque,
        cursor,  # type: ignore[arg-type]
        encoding,
        stream_filter or StreamFilter(legacy=not encoding.collections),
    )
    assert stream.pull(100)
    return [parse_frame(wire) for wire in stream.pending]


def header_fields(frame: Frame, *, with_framing: bool = True) -> dict[str, int]:
    """The header's fields by name; without framing, the body length leaves the framing out."""
    fields = {
        "opcode": frame.opcode,
        "key length": len(frame.key),
        "extras length": len(frame.extras),
        "datatype": frame.datatype,
        "vbucket": frame.vbucket_or_status,
        "body length": len(frame.extras) + len(frame.key) + len(frame.value),
        "opaque": frame.opaque,
        "cas": frame.cas,
    }
    if with_framing:
        fields["magic"] = frame.magic
        fields["framing length"] = len(frame.framing_extras)
    return fields


def assert_same_message(produced: Frame, vector: Frame, *, with_framing: bool = True) -> None:
    """Header fields, then extras byte by byte, then key and value."""
    assert header_fields(produced, with_framing=with_framing) == header_fields(
        vector, with_framing=with_framing
    )
    extras_diff = [
        (offset, got, want)
        for offset, (got, want) in enumerate(zip(produced.extras, vector.extras, strict=True))
        if got != want
    ]
    # Offsets are of the whole classic frame (24-byte header first), as reviews quote them.
    assert [(HEADER_SIZE + o, got, want) for o, got, want in extras_diff] == []
    assert produced.key == vector.key
    assert produced.value == vector.value


def split_vector(name: str) -> Frame:
    header = (GOMEMCACHED / f"header.{name}.bin").read_bytes()
    body = (GOMEMCACHED / f"body.{name}.bin").read_bytes()
    frame = parse_frame(header + body)
    assert frame.magic == Magic.FLEX_REQUEST and frame.framing_extras == b"\x22\x00\x01"
    return frame


def json_vector(name: str) -> tuple[Frame, bytes]:
    """A classic frame rebuilt from gomemcached's JSON dump, and its wire bytes."""
    wire = gomemcached_event_wire(name)
    return parse_frame(wire), wire


Message = TypeVar("Message", Mutation, SystemEvent, SnapshotMarker)


def without_stream_id(message: Message) -> Message:
    """The event as a history holds it: stream ids belong to a connection, not to the data."""
    return replace(message, stream_id=None)


def test_disk_marker_and_mutation_as_a_real_server_sends_them() -> None:
    marker_vector, mutation_vector = split_vector("0x56"), split_vector("0x57")
    features = ConnectionFeatures(collections=True)
    marker = decode_dcp_message(marker_vector, features)
    mutation = decode_dcp_message(mutation_vector, features)
    assert isinstance(marker, SnapshotMarker) and isinstance(mutation, Mutation)
    assert marker.flags == SnapshotFlags.DISK | SnapshotFlags.CHECKPOINT
    produced = served_frames(
        marker.vbucket,
        mutation_vector.opaque,
        without_stream_id(marker),
        (without_stream_id(mutation),),
        COLLECTION_AWARE,
    )
    assert len(produced) == 2  # the marker, the mutation; its seqno ends the snapshot
    assert_same_message(produced[0], marker_vector, with_framing=False)
    # Byte 54 (the mutation extras' last, nru) is 2 in the vector: the simulator sends 2 too.
    assert_same_message(produced[1], mutation_vector, with_framing=False)
    assert produced[1].extras[-1] == 2


def test_system_event_as_a_real_server_sends_it() -> None:
    vector = split_vector("0x5f")
    event = decode_dcp_message(vector, ConnectionFeatures(collections=True))
    assert isinstance(event, SystemEvent)
    marker = SnapshotMarker(event.vbucket, event.by_seqno, event.by_seqno, SnapshotFlags.MEMORY)
    produced = served_frames(
        event.vbucket,
        vector.opaque,
        marker,
        (without_stream_id(event),),
        COLLECTION_AWARE,
    )
    assert len(produced) == 2
    assert_same_message(produced[1], vector, with_framing=False)


@pytest.mark.parametrize(
    ("name", "encoding"),
    [
        ("scope_and_collection_mutation.json", COLLECTION_AWARE),
        ("defaultScopeDefaultColMutation.json", COLLECTION_AWARE_SNAPPY),
        ("origNoCollectionMut.json", LEGACY_SNAPPY),
        ("collectionCreation.json", COLLECTION_AWARE),
        ("collectionDel.json", COLLECTION_AWARE),
        ("scopeCreation.json", COLLECTION_AWARE),
        ("scopeDel.json", COLLECTION_AWARE),
    ],
)
def test_classic_frames_are_byte_for_byte_the_vectors(
    name: str, encoding: StreamEncoding
) -> None:
    vector, wire = json_vector(name)
    event = decode_dcp_message(vector, encoding.features)
    assert isinstance(event, Mutation | SystemEvent)
    marker = SnapshotMarker(event.vbucket, event.by_seqno, event.by_seqno, SnapshotFlags.MEMORY)
    produced = served_frames(event.vbucket, vector.opaque, marker, (event,), encoding)
    assert len(produced) == 2
    assert_same_message(produced[1], vector)
    assert produced[1].encode() == wire
