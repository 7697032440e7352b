"""The backfill_order control: round-robin shares the producer among backfills, sequential
serves each stream's disk snapshot whole, in the order the streams were requested."""

from __future__ import annotations

from replicator.dcp.protocol.dcp_requests import CloseStream
from replicator.dcp.protocol.events import Mutation, SnapshotFlags, SnapshotMarker, StreamEnd
from replicator.dcp.protocol.opcodes import Status
from replicator.sim.bucket import SimBucket, Upsert
from tests.sim.raw_client import RawClient, producer, serve

VBUCKETS = 4
WINDOW = 8192


def on_disk(docs: int = 1200) -> SimBucket:
    """About 300 documents per vbucket, all of them behind the in-memory checkpoints."""
    bucket = SimBucket("b", num_vbuckets=VBUCKETS, seed=1)
    bucket.apply_batch([Upsert(f"doc-{n:05}", "x" * 100, is_json=False) for n in range(docs)])
    bucket.evict_checkpoints()
    return bucket


def runs(vbuckets: list[int]) -> list[int]:
    """Consecutive repeats collapsed: [2, 2, 0, 0, 2] -> [2, 0, 2]."""
    return [vb for i, vb in enumerate(vbuckets) if i == 0 or vbuckets[i - 1] != vb]


def drain(client: RawClient, streams: int) -> list[object]:
    """Every message until `streams` STREAM_ENDs, acknowledging as it reads."""
    messages: list[object] = []
    ends = 0
    while ends < streams:
        received = client.next_received()
        client.buffer_ack(received.frame.size)
        messages.append(received.message)
        ends += isinstance(received.message, StreamEnd)
    return messages


def mutation_vbuckets(messages: list[object]) -> list[int]:
    return [m.vbucket for m in messages if isinstance(m, Mutation)]


def backfill_all(order: str | None, requested: list[int]) -> list[object]:
    bucket = on_disk()
    highs = bucket.high_seqnos()
    controls = [("connection_buffer_size", str(WINDOW))]
    if order is not None:
        controls.append(("backfill_order", order))
    with serve(bucket) as cluster, producer(cluster, controls=controls) as client:
        for vb in requested:
            assert client.stream_request(vb, end=highs[vb]).status == Status.SUCCESS
        return drain(client, len(requested))


def test_sequential_backfills_come_whole_in_request_order() -> None:
    messages = backfill_all("sequential", [2, 0, 3, 1])
    assert runs(mutation_vbuckets(messages)) == [2, 0, 3, 1]
    markers = [m for m in messages if isinstance(m, SnapshotMarker)]
    assert [m.vbucket for m in markers] == [2, 0, 3, 1]
    assert all(m.flags & SnapshotFlags.DISK for m in markers)


def test_round_robin_is_the_default_and_interleaves_backfills() -> None:
    for order in (None, "round-robin"):
        vbuckets = mutation_vbuckets(backfill_all(order, [2, 0, 3, 1]))
        assert len(vbuckets) > 4 * 128  # several pulls of each vbucket
        assert len(runs(vbuckets)) > VBUCKETS, order


def test_in_memory_streams_go_on_while_backfills_wait() -> None:
    bucket = on_disk()
    highs = bucket.high_seqnos()
    key = next(f"new-{n}" for n in range(1000) if bucket.vbucket_for(f"new-{n}") == 0)
    controls = [("connection_buffer_size", str(WINDOW)), ("backfill_order", "sequential")]
    with serve(bucket) as cluster, producer(cluster, controls=controls) as client:
        # vbucket 0 streams from its high seqno: in memory, nothing to backfill.
        uuid = bucket.failover_log(0).newest.vbucket_uuid
        opened = client.stream_request(0, start=highs[0], vbucket_uuid=uuid)
        assert opened.status == Status.SUCCESS
        for vb in (1, 2, 3):
            assert client.stream_request(vb, end=highs[vb]).status == Status.SUCCESS
        first = client.next_received()  # the first backfill has started, the window fills
        bucket.apply_batch([Upsert(key, "y", is_json=False)])
        client.buffer_ack(first.frame.size)
        messages = [first.message, *drain(client, 3)]
    new = next(i for i, m in enumerate(messages) if isinstance(m, Mutation) and m.vbucket == 0)
    last_backfill_end = max(i for i, m in enumerate(messages) if isinstance(m, StreamEnd))
    assert new < last_backfill_end
    assert runs([vb for vb in mutation_vbuckets(messages) if vb != 0]) == [1, 2, 3]


def test_a_closed_backfill_hands_its_turn_to_the_next() -> None:
    bucket = on_disk()
    highs = bucket.high_seqnos()
    controls = [
        ("connection_buffer_size", str(WINDOW)),
        ("backfill_order", "sequential"),
        ("send_stream_end_on_client_close_stream", "true"),
    ]
    with serve(bucket) as cluster, producer(cluster, controls=controls) as client:
        for vb in (1, 2):
            assert client.stream_request(vb, end=highs[vb]).status == Status.SUCCESS
        first = client.next_received()
        assert first.message.vbucket == 1
        client.send(CloseStream(1, opaque=client.next_opaque()))
        client.buffer_ack(first.frame.size)
        messages = drain(client, 2)
    vb2 = [m for m in messages if isinstance(m, Mutation) and m.vbucket == 2]
    assert [m.by_seqno for m in vb2] == list(range(1, highs[2] + 1))
