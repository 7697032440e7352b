"""Flow control and dead-connection detection on a simulated node."""

from __future__ import annotations

import time

from replicator.dcp.codec import ServerMessage
from replicator.dcp.events import Mutation, StreamEnd
from replicator.dcp.opcodes import Status
from replicator.sim.bucket import SimBucket, Upsert
from tests.sim.raw_client import RawClient, producer, serve

WINDOW = 4096


def loaded_bucket(docs: int = 200, size: int = 200) -> SimBucket:
    bucket = SimBucket("b", num_vbuckets=1, seed=1)
    bucket.apply_batch([Upsert(f"doc-{n:04}", "x" * size, is_json=False) for n in range(docs)])
    return bucket


def read_until_quiet(client: RawClient, quiet: float = 0.2) -> list[ServerMessage]:
    """Messages until none arrives for `quiet` seconds (the producer has paused)."""
    messages: list[ServerMessage] = []
    while True:
        try:
            messages.append(client.next_message(timeout=quiet))
        except TimeoutError:
            return messages


def test_a_consumer_that_never_acks_stalls_at_the_window_and_acks_resume_it() -> None:
    bucket = loaded_bucket()
    high = bucket.high_seqnos()[0]
    controls = [("connection_buffer_size", str(WINDOW))]
    with serve(bucket) as cluster, producer(cluster, controls=controls) as client:
        assert client.stream_request(0, end=high).status == Status.SUCCESS
        first = read_until_quiet(client)
        stalled_at = client.received_dcp_bytes
        # The producer sends while unacked bytes < window: at most one message beyond it.
        assert WINDOW <= stalled_at < WINDOW + 300
        assert not any(isinstance(m, StreamEnd) for m in first)
        assert client.nothing_within(0.2)  # it really waits

        received = list(first)
        while not isinstance(received[-1], StreamEnd):
            # Ack everything; the producer then sends about one more window.
            client.buffer_ack(client.received_dcp_bytes)
            target = client.received_dcp_bytes + WINDOW
            while client.received_dcp_bytes < target and not isinstance(received[-1], StreamEnd):
                received.append(client.next_message())
        seqnos = [m.by_seqno for m in received if isinstance(m, Mutation)]
        assert seqnos == list(range(1, high + 1))


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
        noop_arrived = time.monotonic()
        assert client.wait_closed(3.0)
        waited = time.monotonic() - noop_arrived
        assert waited >= 0.08  # not before the interval passed again
        assert all(session.wait_closed(1.0) for session in cluster.sessions())
