"""Data messages read into columns agree with the codec's decoding, message for message."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replicator.dcp.protocol.codec import ProducerMessage, decode_dcp_message, encode_dcp_message
from replicator.dcp.protocol.columnar import DocumentColumns, DocumentRun
from replicator.dcp.protocol.dcp_messages import ConnectionFeatures, DcpNoop
from replicator.dcp.protocol.events import (
    Deletion,
    Expiration,
    Mutation,
    SnapshotFlags,
    SnapshotMarker,
)
from replicator.dcp.protocol.frame import Frame, FrameReader, encode_frame
from replicator.dcp.protocol.opcodes import Opcode, Status
from replicator.dcp.protocol.responses import Response, encode_response
from replicator.errors import ProtocolError
from tests.dcp.runs import summarised_alone
from tests.dcp.strategies import features as feature_sets
from tests.dcp.strategies import producer_messages
from tests.golden_vectors import GOMEMCACHED, gomemcached_event_wire, requires_vectors

COLLECTIONS = ConnectionFeatures(collections=True, delete_times=True)


def read(data: bytes, features: ConnectionFeatures, cuts: list[int] | None = None) -> list[object]:
    """Feed `data` to a columnar reader (in pieces at `cuts`); runs and frames in order."""
    columns = DocumentColumns(features)
    reader = FrameReader(sink=columns)
    entries: list[object] = []
    bounds = [0, *sorted(cuts or []), len(data)]
    for start, end in itertools.pairwise(bounds):
        got = reader.feed(data[start:end])
        columns.finish()
        entries.extend(got)
        if reader.failure is not None:
            break
    return entries


def expand(entries: list[object], features: ConnectionFeatures) -> list[object]:
    """Runs taken apart into typed events, frames decoded by the codec."""
    events: list[object] = []
    for entry in entries:
        if isinstance(entry, DocumentRun):
            assert entry.changes is not None
            events.extend(entry.changes.events())
        else:
            assert isinstance(entry, Frame)
            events.append(decode_dcp_message(entry, features))
    return events


def one_by_one(data: bytes, features: ConnectionFeatures) -> list[ProducerMessage]:
    return [decode_dcp_message(frame, features) for frame in FrameReader().feed(data)]


def by_vbucket(events: Sequence[object]) -> dict[object, list[object]]:
    grouped: dict[object, list[object]] = defaultdict(list)
    for event in events:
        grouped[getattr(event, "vbucket", None)].append(event)
    return dict(grouped)


def mutation(vbucket: int, seqno: int, **fields: object) -> Mutation:
    values: dict[str, object] = {
        "rev_seqno": 1,
        "cas": 1_700_000_000_000_000_000 + seqno,
        "flags": 0,
        "expiration": 0,
        "lock_time": 0,
        "collection_id": 0,
        "key": b"doc-%d" % seqno,
        "value": b'{"n": %d}' % seqno,
        "is_json": True,
    }
    values.update(fields)
    return Mutation(vbucket, seqno, **values)  # type: ignore[arg-type]


def wire(messages: list[ProducerMessage], features: ConnectionFeatures, **options: bool) -> bytes:
    return b"".join(encode_dcp_message(m, opaque=7, features=features, **options) for m in messages)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), features=feature_sets, compress=st.booleans())
def test_any_producer_messages_read_into_columns_equal_the_codec_per_vbucket(
    data: st.DataObject, features: ConnectionFeatures, compress: bool
) -> None:
    """Whatever the mix (flexible framing, xattrs, snappy, collection ids of any length,
    deletions, expirations, control messages) and wherever the reads split the bytes, each
    vbucket's messages come out in the same order with the same fields."""
    messages = data.draw(st.lists(producer_messages(features), max_size=25))
    raw = wire(messages, features, compress=compress)
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=4))
    expected = one_by_one(raw, features)
    got = expand(read(raw, features, cuts), features)
    assert by_vbucket(got) == by_vbucket(expected)


def test_a_read_of_many_vbuckets_gives_one_run_per_vbucket_in_wire_order_within_each() -> None:
    messages: list[ProducerMessage] = [
        mutation(vb, seqno) for seqno in range(1, 5) for vb in (3, 9)
    ]
    entries = read(wire(messages, COLLECTIONS, compress=True), COLLECTIONS)
    assert [type(e) for e in entries] == [DocumentRun, DocumentRun]
    runs = [e.changes for e in entries if isinstance(e, DocumentRun)]
    summaries = [
        (r.vbucket, len(r), r.summary.first_seqno, r.summary.last_seqno) for r in runs if r
    ]
    assert summaries == [
        (3, 4, 1, 4),
        (9, 4, 1, 4),
    ]
    first = runs[0]
    assert first is not None and first.summary.mutations == 4
    assert list(first.events()) == [m for m in messages if getattr(m, "vbucket", None) == 3]


def test_a_control_message_of_the_vbucket_ends_its_run_and_keeps_its_place() -> None:
    marker = SnapshotMarker(3, 5, 6, SnapshotFlags.MEMORY)
    messages: list[ProducerMessage] = [
        mutation(3, 1),
        mutation(4, 1),
        marker,
        mutation(3, 5),
        mutation(4, 2),  # vbucket 4's run goes on: the marker was vbucket 3's
    ]
    entries = read(wire(messages, COLLECTIONS), COLLECTIONS)
    shape = [(e.vbucket, len(e.keys)) if isinstance(e, DocumentRun) else "marker" for e in entries]
    assert shape == [(3, 1), (4, 2), "marker", (3, 1)]


def test_a_reply_between_data_messages_ends_every_run() -> None:
    """A reply may change which stream the layer above accepts (a stream request's answer):
    nothing after it may be handed up before it."""
    reply = encode_response(Response(Opcode.DCP_STREAM_REQ, Status.SUCCESS, 99))
    raw = wire([mutation(3, 1)], COLLECTIONS) + reply + wire([mutation(3, 2)], COLLECTIONS)
    entries = read(raw, COLLECTIONS)
    assert [type(e).__name__ for e in entries] == ["DocumentRun", "Frame", "DocumentRun"]


def test_deletions_expirations_and_xattrs_ride_in_the_same_run() -> None:
    messages: list[ProducerMessage] = [
        mutation(1, 1, xattrs=(("_sync", '{"rev":"1-a"}'),)),
        Deletion(1, 2, 2, 5, 0, b"doc-1", delete_time=1_700_000_000),
        Expiration(1, 3, 2, 6, 0, b"doc-3", 1_700_000_001),
        mutation(1, 4, value=b"\x00\x01binary", is_json=False, expiration=1_900_000_000),
    ]
    entries = read(wire(messages, COLLECTIONS, compress=True), COLLECTIONS)
    assert len(entries) == 1 and isinstance(entries[0], DocumentRun)
    changes = entries[0].changes
    assert changes is not None
    assert list(changes.events()) == messages
    assert changes.summary.mutations == 2
    columns = changes.columns.to_pydict()
    assert columns["delete_time"] == [0, 1_700_000_000, 1_700_000_001, 0]
    assert columns["expiration"] == [0, 0, 0, 1_900_000_000]
    assert columns["is_json"] == [True, False, False, False]


@requires_vectors
@pytest.mark.parametrize(
    ("name", "features"),
    [
        ("defaultScopeDefaultColMutation.json", ConnectionFeatures(collections=True)),
        ("origNoCollectionMut.json", ConnectionFeatures(collections=False)),
        ("scope_and_collection_mutation.json", ConnectionFeatures(collections=True)),
    ],
)
def test_real_server_mutations_read_into_columns_as_the_codec_decodes_them(
    name: str, features: ConnectionFeatures
) -> None:
    raw = gomemcached_event_wire(name)
    assert expand(read(raw, features), features) == one_by_one(raw, features)


@requires_vectors
def test_the_real_flexible_framed_mutation_keeps_its_stream_id_in_the_run() -> None:
    raw = (GOMEMCACHED / "header.0x57.bin").read_bytes() + (
        GOMEMCACHED / "body.0x57.bin"
    ).read_bytes()
    features = ConnectionFeatures(collections=True)
    entries = read(raw, features)
    assert len(entries) == 1 and isinstance(entries[0], DocumentRun)
    assert entries[0].stream_id == 1
    assert expand(entries, features) == one_by_one(raw, features)


def test_a_malformed_message_hands_up_those_before_it_then_fails_the_reader() -> None:
    good = wire([mutation(0, 1), SnapshotMarker(0, 2, 2, SnapshotFlags.MEMORY)], COLLECTIONS)
    bad = encode_frame(0x80, Opcode.DCP_MUTATION, opaque=7, extras=b"\0" * 28, key=b"\0x")
    later = wire([mutation(0, 2)], COLLECTIONS)
    columns = DocumentColumns(COLLECTIONS)
    reader = FrameReader(sink=columns)
    entries = reader.feed(good + bad + later)
    columns.finish()
    assert [type(e).__name__ for e in entries] == ["DocumentRun", "Frame"]
    assert expand(list(entries), COLLECTIONS) == one_by_one(good, COLLECTIONS)
    failure = reader.failure
    assert isinstance(failure, ProtocolError)
    assert failure.opcode == Opcode.DCP_MUTATION
    assert "extras of 28 bytes" in str(failure)
    with pytest.raises(ProtocolError) as again:
        reader.feed(b"")
    assert again.value is failure


@pytest.mark.parametrize(
    ("value", "limit", "problem"),
    [
        (b"\xff\xff\xff\xff\x0f", 1 << 20, "inflates to"),  # claims more than the limit
        (b"\x80\x10", 1024, "inflates to"),  # a two-byte length over a small limit
        (b"\x05\x00", 1 << 20, "bad snappy value"),  # claims 5 bytes, holds none
    ],
)
def test_bad_snappy_values_are_refused_as_the_codec_refuses_them(
    value: bytes, limit: int, problem: str
) -> None:
    extras = bytes(31)
    frame = encode_frame(
        0x80, Opcode.DCP_MUTATION, datatype=0x02, opaque=7, extras=extras, key=b"k", value=value
    )
    columns = DocumentColumns(ConnectionFeatures(max_value_size=limit))
    reader = FrameReader(sink=columns)
    with pytest.raises(ProtocolError, match=problem):
        reader.feed(frame)


def test_a_noop_between_data_messages_does_not_split_the_run() -> None:
    raw = (
        wire([mutation(2, 1)], COLLECTIONS)
        + encode_dcp_message(DcpNoop(5))
        + wire([mutation(2, 2)], COLLECTIONS)
    )
    entries = read(raw, COLLECTIONS)
    assert [type(e).__name__ for e in entries] == ["DocumentRun", "Frame"]
    run = entries[0]
    assert isinstance(run, DocumentRun) and len(run.keys) == 2


def test_the_summaries_of_a_whole_read_equal_each_run_summarised_alone() -> None:
    """`finish` summarises all runs of a read at once, with numpy over the whole read."""
    messages: list[ProducerMessage] = [
        mutation(1, 5),
        mutation(2, 9, key=b"a-longer-key"),
        Deletion(1, 7, 1, 1, 0, b"k"),
        mutation(2, 8),  # not ascending: the assembler will refuse it, the summary says so
        Expiration(1, 6, 1, 1, 0, b"kk", 3),
        mutation(3, 1, value=b"v" * 300),
    ]
    entries = read(wire(messages, COLLECTIONS, compress=True), COLLECTIONS)
    runs = [e.changes for e in entries if isinstance(e, DocumentRun) and e.changes]
    assert [r.vbucket for r in runs] == [1, 2, 3]
    for run in runs:
        assert run.summary == summarised_alone(run)
    assert [(r.summary.low_seqno, r.summary.high_seqno, r.summary.ascending) for r in runs] == [
        (5, 7, False),
        (8, 9, False),
        (1, 1, True),
    ]
    assert [r.summary.mutations for r in runs] == [1, 2, 1]
    assert runs[2].summary.data_bytes == len(b"doc-1") + 300
