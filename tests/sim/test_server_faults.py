"""Faults a SimCluster injects, seen from a client on the wire."""

from __future__ import annotations

import json
import time

import pytest

from replicator.dcp.protocol.codec import (
    decode_dcp_message,
    decode_server_frame,
    encode_dcp_message,
)
from replicator.dcp.protocol.dcp_messages import ConnectionFeatures
from replicator.dcp.protocol.events import Mutation, StreamEnd, StreamEndReason
from replicator.dcp.protocol.frame import FrameReader
from replicator.dcp.protocol.opcodes import HelloFeature, Status
from replicator.dcp.protocol.responses import failover_log_of, rollback_seqno_of
from replicator.errors import ProtocolError
from replicator.sim.bucket import SimBucket, Upsert
from replicator.sim.faults import MalformedFrame
from tests.sim.raw_client import DEFAULT_FEATURES, producer, serve

NOTIFY_FEATURES = (
    *DEFAULT_FEATURES,
    HelloFeature.DUPLEX,
    HelloFeature.CLUSTERMAP_CHANGE_NOTIFICATION,
)


def test_rebalance_ends_streams_moves_ownership_and_notifies() -> None:
    bucket = SimBucket("b", num_vbuckets=4, seed=1)
    with serve(bucket, nodes=2) as cluster:
        moving = cluster.topology.vbuckets_of(0)[0]
        staying = cluster.topology.vbuckets_of(0)[1]
        with producer(cluster, node=0, features=NOTIFY_FEATURES) as client:
            for vb in (moving, staying):
                assert client.stream_request(vb).status == Status.SUCCESS
            old_rev = cluster.config_revision()[1]
            new_map = cluster.rebalance({moving: 1})
            assert new_map.rev == old_rev + 1
            assert client.next_message() == StreamEnd(moving, StreamEndReason.STATE_CHANGED)
            client.nothing_within(0.1)  # let the notification arrive
            (notification,) = client.notifications
            assert notification.revision == new_map.rev and notification.bucket == "b"
            assert json.loads(notification.config)["vBucketServerMap"]["vBucketMap"][moving] == [1]
            refused = client.stream_request(moving)
            assert refused.status == Status.NOT_MY_VBUCKET
            assert json.loads(refused.value)["rev"] == new_map.rev
            bucket.upsert(_key_in(bucket, staying), {"v": 1})
            assert isinstance(
                client.messages_until(lambda m: isinstance(m, Mutation))[-1], Mutation
            )
        with producer(cluster, node=1) as other:
            assert other.stream_request(moving).status == Status.SUCCESS


def _key_in(bucket: SimBucket, vbucket: int) -> str:
    return next(f"k{n}" for n in range(10_000) if bucket.vbucket_for(f"k{n}") == vbucket)


def test_add_node_and_spread_rebalance() -> None:
    bucket = SimBucket("b", num_vbuckets=8, seed=1)
    with serve(bucket, nodes=1) as cluster:
        index = cluster.add_node()
        assert cluster.topology.vbuckets_of(index) == ()
        spread = cluster.rebalance("spread")
        assert spread.vbuckets_of(0) == (0, 1, 2, 3) and spread.vbuckets_of(1) == (4, 5, 6, 7)
        rotated = cluster.rebalance("rotate")
        assert rotated.vbuckets_of(1) == (0, 1, 2, 3)
        with pytest.raises(ValueError, match="unknown rebalance plan"):
            cluster.rebalance("shuffle")
        assert cluster.connection_string.count(",") == 1


def test_drop_connections_closes_every_client() -> None:
    bucket = SimBucket("b", num_vbuckets=2, seed=1)
    with serve(bucket, nodes=2) as cluster:
        with producer(cluster, node=0) as first, producer(cluster, node=1) as second:
            cluster.drop_connections(node=1)
            assert second.wait_closed(2.0)
            assert first.control("enable_noop", "true").status == Status.SUCCESS
            cluster.drop_connections()
            assert first.wait_closed(2.0)
        with producer(cluster, node=1) as again:  # the node still accepts
            assert again.stream_request(cluster.topology.vbuckets_of(1)[0]).status == Status.SUCCESS


def test_stall_sends_nothing_not_even_noops_until_released() -> None:
    bucket = SimBucket("b", num_vbuckets=1, seed=1)
    controls = [("enable_noop", "true"), ("set_noop_interval", "1")]
    with serve(bucket) as cluster, producer(cluster, controls=controls) as client:
        client.stream_request(0)
        cluster.stall()
        client.nothing_within(0.05)
        noops_before = client.noops_seen
        bucket.upsert("during-stall", {"v": 1})
        assert client.nothing_within(0.4)
        assert client.noops_seen == noops_before
        cluster.release()
        received = client.messages_until(lambda m: isinstance(m, Mutation))
        assert received[-1].key == b"during-stall"  # type: ignore[union-attr]


def test_slow_sending_caps_the_rate() -> None:
    bucket = SimBucket("b", num_vbuckets=1, seed=1)
    bucket.apply_batch([Upsert(f"d{n:03}", "y" * 1000, is_json=False) for n in range(40)])
    rate = 40_000
    with serve(bucket) as cluster, producer(cluster) as client:
        cluster.slow_sending(rate)
        started = time.monotonic()
        client.stream_request(0, end=40)
        client.stream_until_end(0, timeout=10.0)
        elapsed = time.monotonic() - started
        burst = max(4096, rate // 10)
        # About 42 KB went out; all but one burst of it at the capped rate.
        assert elapsed >= (client.received_dcp_bytes - burst) / rate * 0.8
        cluster.slow_sending(None)


@pytest.mark.parametrize("kind", list(MalformedFrame))
def test_malformed_frame_breaks_the_next_dcp_message(kind: MalformedFrame) -> None:
    bucket = SimBucket("b", num_vbuckets=1, seed=1)
    with serve(bucket) as cluster, producer(cluster) as client:
        client.stream_request(0)
        assert cluster.send_malformed_frame(kind) == 1
        bucket.upsert("victim", {"v": 1})
        with pytest.raises(ProtocolError) as failure:
            client.messages_until(lambda m: isinstance(m, Mutation))
        expected = {
            MalformedFrame.BAD_MAGIC: "bad magic",
            MalformedFrame.BAD_LENGTHS: "lengths do not add up",
            MalformedFrame.BAD_LEB128: "LEB128",
            MalformedFrame.BAD_EXTRAS: "extras of 3 bytes",
        }[kind]
        assert expected in str(failure.value)


def test_malformed_frame_corruptions_are_exact() -> None:
    features = ConnectionFeatures(collections=True, delete_times=True)
    mutation = Mutation(3, 7, 1, 99, 0, 0, 0, 8, b"key", b"{}", True)
    frame = encode_dcp_message(mutation, opaque=5, features=features)
    (parsed,) = FrameReader().feed(frame)
    assert decode_dcp_message(parsed, features) == mutation

    assert MalformedFrame.BAD_MAGIC.corrupt(frame)[0] == 0x42

    short = MalformedFrame.BAD_LENGTHS.corrupt(frame)
    body_len = int.from_bytes(short[8:12], "big")
    assert body_len < short[4] + int.from_bytes(short[2:4], "big")
    with pytest.raises(ProtocolError, match="lengths do not add up"):
        FrameReader().feed(short)

    assert MalformedFrame.BAD_LEB128.applies_to(frame, collections=True)
    assert not MalformedFrame.BAD_LEB128.applies_to(frame, collections=False)
    (bad_key,) = FrameReader().feed(MalformedFrame.BAD_LEB128.corrupt(frame))
    assert bad_key.key == b"\xff" * 6 and bad_key.value == b"{}"
    with pytest.raises(ProtocolError, match="LEB128"):
        decode_dcp_message(bad_key, features)

    (bad_extras,) = FrameReader().feed(MalformedFrame.BAD_EXTRAS.corrupt(frame))
    assert len(bad_extras.extras) == 3 and bad_extras.key == b"\x08key"
    with pytest.raises(ProtocolError, match="extras of 3 bytes"):
        decode_dcp_message(bad_extras, features)


def test_failover_fault_ends_streams_and_forces_rollback() -> None:
    bucket = SimBucket("b", num_vbuckets=1, seed=1)
    for n in range(5):
        bucket.upsert(f"k{n}", {"n": n})
    with serve(bucket) as cluster:
        with producer(cluster) as client:
            uuid = failover_log_of(client.stream_request(0)).newest.vbucket_uuid
            client.messages_until(lambda m: getattr(m, "by_seqno", 0) == 5)
            cluster.failover(0, lose_last=3)
            assert client.next_message() == StreamEnd(0, StreamEndReason.STATE_CHANGED)
        with producer(cluster) as client:
            assert rollback_seqno_of(client.stream_request(0, start=5, vbucket_uuid=uuid)) == 2


def test_restart_keeps_data_and_ports_unless_told_to_lose_it() -> None:
    bucket = SimBucket("b", num_vbuckets=1, seed=1)
    for n in range(4):
        bucket.upsert(f"k{n}", {"n": n})
    with serve(bucket) as cluster:
        port = cluster.node(0).port
        log_before = bucket.failover_log(0)
        uuid = log_before.newest.vbucket_uuid
        with producer(cluster) as client:
            cluster.restart_node(0)
            assert client.wait_closed(2.0)
        assert cluster.node(0).port == port
        assert bucket.failover_log(0) == log_before
        with producer(cluster) as client:
            assert client.stream_request(0, start=4, vbucket_uuid=uuid).status == Status.SUCCESS

        cluster.restart_node(0, lose_last=1)  # unclean: the last item was not persisted
        with producer(cluster) as client:
            assert rollback_seqno_of(client.stream_request(0, start=4, vbucket_uuid=uuid)) == 3

        cluster.restart_node(0, wipe=True)
        assert bucket.failover_log(0).newest.seqno == 0
        with producer(cluster) as client:
            assert rollback_seqno_of(client.stream_request(0, start=3, vbucket_uuid=uuid)) == 0


def test_every_frame_of_a_busy_stream_decodes_with_the_codec() -> None:
    """A mixed workload over one connection; the raw client decodes every frame it gets."""
    bucket = SimBucket("b", num_vbuckets=4, seed=9)
    bucket.create_scope("s")
    bucket.create_collection("s", "c")
    with serve(bucket) as cluster, producer(cluster) as client:
        for vb in range(4):
            client.stream_request(vb)
        ops = [
            Upsert(f"k{n}", {"n": n}, collection="s.c" if n % 2 else "_default") for n in range(50)
        ]
        bucket.apply_batch(ops)
        bucket.delete("k3", collection="s.c")
        bucket.drop_collection("s", "c")
        highs = bucket.high_seqnos()
        seen: dict[int, int] = {}
        while seen != highs:
            received = client.next_received()
            assert decode_server_frame(received.frame, client.codec_features) == received.message
            seqno = getattr(received.message, "by_seqno", None)
            if seqno is not None:
                vb = received.message.vbucket  # type: ignore[union-attr]
                assert seqno > seen.get(vb, 0)  # per-vbucket order holds
                seen[vb] = seqno
