"""Stream ids (DCP_CONTROL enable_stream_id): several filtered streams per vbucket, each
message framed with its stream's id, as a 6.5+ server does."""

from __future__ import annotations

from replicator.dcp.protocol.codec import ServerMessage
from replicator.dcp.protocol.dcp_requests import CloseStream
from replicator.dcp.protocol.events import Mutation, SnapshotMarker, StreamEnd, StreamEndReason
from replicator.dcp.protocol.frame import Frame, parse_frame, stream_id_of, with_stream_id
from replicator.dcp.protocol.opcodes import Magic, Status
from replicator.sim.bucket import SimBucket
from tests.sim.raw_client import RawClient, producer, serve

STREAM_IDS = (("enable_stream_id", "true"),)


def two_collection_bucket() -> tuple[SimBucket, int, int]:
    bucket = SimBucket("b", num_vbuckets=1, seed=1)
    bucket.create_scope("app")
    users = bucket.create_collection("app", "users")
    orders = bucket.create_collection("app", "orders")
    bucket.upsert("u1", {"v": 1}, collection="app.users")
    bucket.upsert("o1", {"v": 1}, collection="app.orders")
    bucket.upsert("u2", {"v": 2}, collection="app.users")
    return bucket, users, orders


def until_ends(client: RawClient, count: int) -> list[tuple[Frame, ServerMessage]]:
    """Messages until `count` STREAM_ENDs arrived."""
    received: list[tuple[Frame, ServerMessage]] = []
    ends = 0
    while ends < count:
        item = client.next_received()
        received.append((item.frame, item.message))
        ends += isinstance(item.message, StreamEnd)
    return received


def test_two_streams_of_one_vbucket_each_get_their_own_messages_framed_with_their_id() -> None:
    bucket, users, orders = two_collection_bucket()
    high = bucket.vbucket(0).high_seqno
    with serve(bucket) as cluster, producer(cluster, controls=STREAM_IDS) as client:
        for sid, collection in ((7, users), (9, orders)):
            value = {"sid": sid, "collections": [f"{collection:x}"]}
            assert client.filtered_stream_request(0, value, end=high).status == Status.SUCCESS
        received = until_ends(client, 2)
    by_stream: dict[int | None, list[ServerMessage]] = {}
    for frame, message in received:
        assert frame.magic == Magic.FLEX_REQUEST
        sid = stream_id_of(frame.framing_extras)
        assert getattr(message, "stream_id", None) == sid
        by_stream.setdefault(sid, []).append(message)
    assert set(by_stream) == {7, 9}
    keys = {
        sid: [m.key for m in messages if isinstance(m, Mutation)]
        for sid, messages in by_stream.items()
    }
    assert keys == {7: [b"u1", b"u2"], 9: [b"o1"]}
    for sid, messages in by_stream.items():
        assert isinstance(messages[0], SnapshotMarker)
        assert messages[-1] == StreamEnd(0, StreamEndReason.OK, sid)


def test_stream_requests_must_name_a_stream_id_once_enabled_and_only_then() -> None:
    bucket, users, _ = two_collection_bucket()
    with serve(bucket) as cluster:
        with producer(cluster, controls=STREAM_IDS) as client:
            missing = client.filtered_stream_request(0, {"collections": [f"{users:x}"]})
            assert missing.status == Status.DCP_STREAM_ID_INVALID
            assert client.filtered_stream_request(0, {"sid": 3}).status == Status.SUCCESS
            again = client.filtered_stream_request(0, {"sid": 3})
            assert again.status == Status.KEY_EEXISTS
            assert client.filtered_stream_request(0, {"sid": 4}).status == Status.SUCCESS
        with producer(cluster) as client:
            refused = client.filtered_stream_request(0, {"sid": 3})
            assert refused.status == Status.DCP_STREAM_ID_INVALID


def test_closing_one_stream_id_ends_only_that_stream() -> None:
    bucket, _, _ = two_collection_bucket()
    controls = (*STREAM_IDS, ("send_stream_end_on_client_close_stream", "true"))
    with serve(bucket) as cluster, producer(cluster, controls=controls) as client:
        for sid in (1, 2):
            assert client.filtered_stream_request(0, {"sid": sid}).status == Status.SUCCESS
        no_id = client.request(CloseStream(0, None, client.next_opaque()))
        assert no_id.status == Status.DCP_STREAM_ID_INVALID
        closed = client.request(CloseStream(0, 2, client.next_opaque()))
        assert closed.status == Status.SUCCESS
        ends = [m for _, m in until_ends(client, 1) if isinstance(m, StreamEnd)]
        assert ends == [StreamEnd(0, StreamEndReason.CLOSED, 2)]
        # Stream 1 is still open: new writes reach it, framed with its id.
        bucket.upsert("late", {"v": 1})
        while True:
            item = client.next_received()
            if isinstance(item.message, Mutation):
                break
        assert item.message.key == b"late" and item.message.stream_id == 1
        unknown = client.request(CloseStream(0, 2, client.next_opaque()))
        assert unknown.status == Status.KEY_ENOENT


def test_with_stream_id_reframes_a_classic_request_flexibly() -> None:
    classic = Frame(Magic.REQUEST, 0x57, 1, 5, 9, 3, b"", b"e" * 31, b"key", b"value")
    framed = parse_frame(with_stream_id(classic.encode(), 513))
    assert framed.magic == Magic.FLEX_REQUEST
    assert stream_id_of(framed.framing_extras) == 513
    assert (framed.opcode, framed.extras, framed.key, framed.value) == (
        0x57,
        classic.extras,
        b"key",
        b"value",
    )
    assert (framed.vbucket_or_status, framed.opaque, framed.cas) == (5, 9, 3)
