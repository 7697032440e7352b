"""Flow control and dead-connection detection on a simulated node."""

from __future__ import annotations

import time

from replicator.dcp.protocol.events import Mutation, StreamEnd
from replicator.dcp.protocol.opcodes import Status
from replicator.sim.bucket import SimBucket, Upsert
from tests.sim.raw_client import RawClient, Received, producer, serve

WINDOW = 4096


def loaded_bucket(docs: int = 200, size: int = 200) -> SimBucket:
    bucket = SimBucket("b", num_vbuckets=1, seed=1)
    bucket.apply_batch([Upsert(f"doc-{n:04}", "x" * size, is_json=False) for n in range(docs)])
    return bucket


def take(client: RawClient, room: int, *, timeout: float = 5.0) -> list[Received]:
    """DCP messages until their bytes (header and body) reach `room`.

    A producer sends while its unacked bytes are below the window, so the message that fills
    the free room is the last it sends: after `take`, nothing more may arrive.
    """
    taken: list[Received] = []
    size = 0
    while size < room:
        taken.append(client.next_received(timeout=timeout))
        size += taken[-1].frame.size
    return taken


def size_of(messages: list[Received]) -> int:
    return sum(r.frame.size for r in messages)


def test_a_consumer_that_never_acks_stalls_at_the_window_and_acks_resume_it() -> None:
    bucket = loaded_bucket()
    high = bucket.high_seqnos()[0]
    controls = [("connection_buffer_size", str(WINDOW))]
    with serve(bucket) as cluster, producer(cluster, controls=controls) as client:
        assert client.stream_request(0, end=high).status == Status.SUCCESS
        received = take(client, WINDOW)
        assert client.nothing_within(0.2)  # it really waits, right at the window
        consumed = size_of(received)
        acked = 0
        while not isinstance(received[-1].message, StreamEnd):
            # BUFFER_ACK counts the bytes consumed since the previous ack: ack only those.
            client.buffer_ack(consumed - acked)
            acked = consumed
            while consumed - acked < WINDOW and not isinstance(received[-1].message, StreamEnd):
                received.append(client.next_received())
                consumed += received[-1].frame.size
        seqnos = [r.message.by_seqno for r in received if isinstance(r.message, Mutation)]
        assert seqnos == list(range(1, high + 1))


def test_a_partial_ack_frees_only_that_much_of_the_window() -> None:
    bucket = loaded_bucket()
    controls = [("connection_buffer_size", str(WINDOW))]
    with serve(bucket) as cluster, producer(cluster, controls=controls) as client:
        client.stream_request(0)
        unacked = size_of(take(client, WINDOW))
        assert client.nothing_within(0.15)
        # Leave exactly 500 bytes of room: the producer sends until they are used, then stops.
        client.buffer_ack(unacked - WINDOW + 500)
        more = take(client, 500)
        assert size_of(more) - more[-1].frame.size < 500  # whole messages, none beyond
        assert client.nothing_within(0.2)
        assert all(isinstance(r.message, Mutation) for r in more)


def test_noops_are_not_counted_against_the_window() -> None:
    # Small mutations (80 bytes each): four 24-byte noops outweigh one of them, so a producer
    # that counted noops would stop a whole message short of the window.
    bucket = loaded_bucket(docs=100, size=16)
    window = 1000
    controls = [
        ("connection_buffer_size", str(window)),
        ("enable_noop", "true"),
        ("set_noop_interval", "1"),  # 50 ms in tests
    ]
    with serve(bucket) as cluster, producer(cluster, controls=controls) as client:
        client.stream_request(0)
        stalled_at = size_of(take(client, window))
        noops_before = client.noops_seen
        # Stalled by flow control, the connection is idle: the producer sends noops (answered).
        while client.noops_seen < noops_before + 4:
            assert client.nothing_within(0.05)
        # As NOTES.md section 4 says consumers do, ack every message's bytes but the noops'.
        client.buffer_ack(stalled_at)
        more = take(client, window, timeout=1.0)  # a noop-counting producer never gets there
        assert {r.frame.size for r in more} == {80}
        assert client.nothing_within(0.1)


def test_without_a_window_everything_flows() -> None:
    bucket = loaded_bucket(docs=300)
    with serve(bucket) as cluster, producer(cluster) as client:
        client.stream_request(0, end=300)
        messages = client.stream_until_end(0)
        assert sum(isinstance(m, Mutation) for m in messages) == 300


def test_noops_start_after_a_stream_opens_and_keep_an_answering_client() -> None:
    bucket = SimBucket("b", num_vbuckets=1, seed=1)
    controls = [("enable_noop", "true"), ("set_noop_interval", "1")]  # 50 ms in tests
    with serve(bucket) as cluster, producer(cluster, controls=controls) as client:
        assert client.nothing_within(0.3)
        assert client.noops_seen == 0  # no stream yet: no noops
        client.stream_request(0)
        started = time.monotonic()
        while client.noops_seen < 4:
            assert time.monotonic() - started < 3.0, "noops did not come every interval"
            client.nothing_within(0.05)
        assert client.stream_request(0).status == Status.KEY_EEXISTS  # still connected


def test_a_noop_left_unanswered_drops_the_connection_after_another_interval() -> None:
    bucket = SimBucket("b", num_vbuckets=1, seed=1)
    controls = [("enable_noop", "true"), ("set_noop_interval", "2")]  # 100 ms in tests
    with serve(bucket) as cluster, producer(cluster, controls=controls, auto_noop=False) as client:
        client.stream_request(0)
        client.next_received(timeout=2.0)  # the first noop, left unanswered
        assert client.wait_closed(3.0)
        assert all(session.wait_closed(1.0) for session in cluster.sessions())
