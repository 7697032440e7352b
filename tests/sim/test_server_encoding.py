"""What a simulated node's stream messages look like for what the connection negotiated."""

from __future__ import annotations

import json
import time

from replicator.dcp.protocol.codec import ServerMessage
from replicator.dcp.protocol.events import (
    Deletion,
    Expiration,
    Mutation,
    SeqnoAdvanced,
    SnapshotMarker,
    StreamEnd,
    SystemEvent,
    SystemEventType,
)
from replicator.dcp.protocol.opcodes import (
    Datatype,
    DcpOpenFlags,
    HelloFeature,
    Status,
)
from replicator.dcp.protocol.values import encode_leb128
from replicator.sim.bucket import SimBucket
from tests.sim.raw_client import DEFAULT_FEATURES, PRODUCER_FLAGS, RawClient, producer, serve

LEGACY_FEATURES = (HelloFeature.XERROR, HelloFeature.SELECT_BUCKET, HelloFeature.JSON)


def drain(client: RawClient, until_seqno: int) -> list[tuple[bytes, ServerMessage]]:
    """(raw frame bytes, decoded message) pairs until an item with `until_seqno` arrives."""
    received: list[tuple[bytes, ServerMessage]] = []
    while True:
        item = client.next_received()
        received.append((item.frame.encode(), item.message))
        if getattr(item.message, "by_seqno", None) == until_seqno:
            return received


def expired_bucket() -> SimBucket:
    bucket = SimBucket("b", num_vbuckets=1, seed=1)
    bucket.upsert("doomed", {"v": 1}, expiry=int(time.time()) - 10)
    assert bucket.run_expiry_pager() == 1
    return bucket


def test_expiry_opcode_needs_the_control_and_delete_times() -> None:
    bucket = expired_bucket()
    with serve(bucket) as cluster:
        with producer(cluster, controls=[("enable_expiry_opcode", "true")]) as client:
            client.stream_request(0)
            ((_raw, message),) = drain(client, 2)[-1:]
            assert isinstance(message, Expiration) and message.delete_time > 0
        with producer(cluster) as client:  # delete times, but no expiry control
            client.stream_request(0)
            raw, message = drain(client, 2)[-1]
            assert isinstance(message, Deletion) and message.delete_time > 0
            assert raw[4] == 21  # a v2 deletion's extras
        no_times = DcpOpenFlags.PRODUCER | DcpOpenFlags.INCLUDE_XATTRS
        with producer(
            cluster, flags=no_times, controls=[("enable_expiry_opcode", "true")]
        ) as client:
            # Accepted, but without delete times it has no effect (kv_engine).
            client.stream_request(0)
            raw, message = drain(client, 2)[-1]
            assert isinstance(message, Deletion) and message.delete_time == 0
            assert raw[4] == 18  # a v1 deletion's extras


def test_marker_versions_as_negotiated() -> None:
    bucket = SimBucket("b", num_vbuckets=1, seed=1)
    bucket.upsert("a", {"v": 1})
    bucket.delete("a")
    bucket.upsert("b", {"v": 1})
    bucket.purge_tombstones(0)
    bucket.evict_checkpoints()
    with serve(bucket) as cluster:
        with producer(cluster) as client:
            client.stream_request(0)
            raw, marker = client.next_received().frame.encode(), None
            assert raw[4] == 20  # v1: 20 bytes of extras, no value
        with producer(cluster, controls=[("enable_sync_writes", "true")]) as client:
            client.stream_request(0)
            received = client.next_received()
            assert received.frame.extras == b"\x00" and len(received.frame.value) == 36
            marker = received.message
            assert isinstance(marker, SnapshotMarker)
            assert marker.max_visible_seqno == 3 and marker.purge_seqno is None
        with producer(cluster, controls=[("max_marker_version", "2.2")]) as client:
            client.stream_request(0)
            received = client.next_received()
            assert received.frame.extras == b"\x02" and len(received.frame.value) == 52
            marker = received.message
            assert isinstance(marker, SnapshotMarker)
            assert marker.purge_seqno == 3 and marker.is_disk
        with producer(cluster, features=LEGACY_FEATURES) as legacy:
            refused = legacy.control("max_marker_version", "2.2")
            assert refused.status == Status.EINVAL  # 2.2 needs a collections connection


def test_collections_only_on_collection_aware_connections() -> None:
    bucket = SimBucket("b", num_vbuckets=1, seed=1)
    bucket.create_scope("app")
    users = bucket.create_collection("app", "users")
    bucket.upsert("u1", {"v": 1}, collection="app.users")
    bucket.upsert("d1", {"v": 1})
    high = bucket.high_seqnos()[0]
    with serve(bucket) as cluster:
        with producer(cluster) as client:
            client.stream_request(0)
            received = drain(client, high)
            events = [m for _raw, m in received if isinstance(m, SystemEvent)]
            assert [(e.event, e.name) for e in events] == [
                (SystemEventType.SCOPE_CREATED, "app"),
                (SystemEventType.COLLECTION_CREATED, "users"),
            ]
            documents = [(raw, m) for raw, m in received if isinstance(m, Mutation)]
            assert [(m.collection_id, m.key) for _raw, m in documents] == [
                (users, b"u1"),
                (0, b"d1"),
            ]
            raw_u1 = documents[0][0]
            key_start = 24 + raw_u1[4]
            assert raw_u1[key_start : key_start + 3] == encode_leb128(users) + b"u1"
        with producer(cluster, features=LEGACY_FEATURES) as legacy:
            legacy.stream_request(0)
            received = drain(legacy, high)
            kinds = [type(m).__name__ for _raw, m in received]
            assert "SystemEvent" not in kinds and "SeqnoAdvanced" not in kinds
            ((raw_d1, d1),) = [(raw, m) for raw, m in received if isinstance(m, Mutation)]
            assert d1.key == b"d1"
            assert raw_d1[24 + raw_d1[4] :].startswith(b"d1")  # no prefix on the wire


def test_filtered_stream_gets_seqno_advanced_for_what_it_does_not_see() -> None:
    bucket = SimBucket("b", num_vbuckets=1, seed=1)
    bucket.create_scope("app")  # seqno 1, a snapshot of its own
    users = bucket.create_collection("app", "users")  # seqno 2
    bucket.upsert("u1", {"v": 1}, collection="app.users")  # seqno 3
    with serve(bucket) as cluster, producer(cluster) as client:
        only_users = {"collections": [f"{users:x}"]}
        assert client.filtered_stream_request(0, only_users).status == Status.SUCCESS
        received = [m for _raw, m in drain(client, 3)]
        # The scope's creation is not for this stream: its snapshot says only where it ended.
        assert [type(m).__name__ for m in received] == [
            "SnapshotMarker",
            "SeqnoAdvanced",
            "SnapshotMarker",
            "SystemEvent",
            "SnapshotMarker",
            "Mutation",
        ]
        assert received[1] == SeqnoAdvanced(0, 1)
        bucket.upsert("d1", {"v": 1})  # the default collection: filtered out
        marker = client.next_message()
        assert isinstance(marker, SnapshotMarker) and marker.end_seqno == 4
        assert client.next_message() == SeqnoAdvanced(0, 4)


def test_unknown_collection_in_a_filter_is_refused() -> None:
    bucket = SimBucket("b", num_vbuckets=1, seed=1)
    with serve(bucket) as cluster, producer(cluster) as client:
        refused = client.filtered_stream_request(0, {"collections": ["ff"]})
        assert refused.status == Status.UNKNOWN_COLLECTION


def test_snappy_xattrs_and_json_bits_follow_the_negotiation() -> None:
    bucket = SimBucket("b", num_vbuckets=1, seed=1)
    big = {"text": "abc" * 400}
    bucket.upsert("big", big, xattrs={"_sync": '{"rev":1}', "meta": "x"})
    bucket.upsert("small", {"v": 1})
    with serve(bucket) as cluster:
        snappy_features = (*DEFAULT_FEATURES, HelloFeature.SNAPPY)
        with producer(cluster, features=snappy_features) as client:
            client.stream_request(0)
            received = drain(client, 2)
            (raw_big, big_m), (raw_small, _small_m) = [
                (raw, m) for raw, m in received if isinstance(m, Mutation)
            ]
            assert raw_big[5] == Datatype.JSON | Datatype.SNAPPY | Datatype.XATTR
            assert json.loads(big_m.value) == big
            assert big_m.xattrs == (("_sync", '{"rev":1}'), ("meta", "x"))
            assert raw_small[5] == Datatype.JSON  # too small to compress
        no_xattrs = DcpOpenFlags.PRODUCER | DcpOpenFlags.INCLUDE_DELETE_TIMES
        with producer(cluster, flags=no_xattrs) as client:
            client.stream_request(0)
            raw_big, big_m = next((r, m) for r, m in drain(client, 2) if isinstance(m, Mutation))
            assert raw_big[5] == Datatype.JSON
            assert big_m.xattrs == () and json.loads(big_m.value) == big
        no_json = (HelloFeature.XERROR, HelloFeature.SELECT_BUCKET)
        with producer(cluster, features=no_json) as client:
            client.stream_request(0)
            raw_plain, plain_m = drain(client, 2)[-1]
            assert raw_plain[5] == 0 and isinstance(plain_m, Mutation)
        with producer(cluster, flags=PRODUCER_FLAGS | DcpOpenFlags.NO_VALUE) as client:
            client.stream_request(0)
            _raw, no_value_m = drain(client, 2)[-1]
            assert isinstance(no_value_m, Mutation) and no_value_m.value == b""


def test_controls_refuse_unknown_keys_and_values() -> None:
    bucket = SimBucket("b", num_vbuckets=1, seed=1)
    with serve(bucket) as cluster, producer(cluster) as client:
        assert client.control("no_such_control", "true").status == Status.EINVAL
        assert client.control("enable_noop", "maybe").status == Status.EINVAL
        assert client.control("connection_buffer_size", "-1").status == Status.EINVAL
        assert client.control("set_noop_interval", "0").status == Status.EINVAL
        assert client.control("change_streams", "true").status == Status.NOT_SUPPORTED
        assert client.control("force_value_compression", "true").status == Status.EINVAL
        assert client.control("set_priority", "high").status == Status.SUCCESS
        assert client.control("connection_buffer_size", "1048576").status == Status.SUCCESS


def test_stream_end_is_decodable_and_control_before_open_is_einval() -> None:
    bucket = SimBucket("b", num_vbuckets=1, seed=1)
    bucket.upsert("a", {"v": 1})
    with serve(bucket) as cluster:
        with RawClient("127.0.0.1", cluster.node(0).port) as client:
            client.connect("b")
            assert client.control("enable_noop", "true").status == Status.EINVAL
            assert client.stream_request(0).status == Status.EINVAL
        with producer(cluster) as client:
            assert client.stream_request(0, end=1).status == Status.SUCCESS
            assert isinstance(client.stream_until_end(0)[-1], StreamEnd)
