"""DcpClient against the embedded producer (replicator.sim): whole copies, faults, moves.

A small in-test mirror applies the events the way the layers above do (whole snapshots only,
partial snapshots dropped on StreamEnd, rollback handled by resyncing the vbucket from 0) and
tells the client its committed positions; every test ends by comparing it with the bucket.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from replicator.dcp.cluster.client import DcpClient
from replicator.dcp.cluster.options import ClientOptions
from replicator.dcp.protocol.events import (
    Deletion,
    Expiration,
    Mutation,
    RollbackRequired,
    SnapshotMarker,
    StreamEnd,
    StreamEndReason,
    StreamEvent,
    StreamOpened,
)
from replicator.dcp.transport.auth import Credentials
from replicator.dcp.transport.options import ConnectionOptions, TlsSettings
from replicator.errors import AuthenticationError, ConnectionLostError
from replicator.model.backoff import Backoff
from replicator.model.positions import FailoverLog, VbucketPosition
from replicator.sim.bucket import Delete, SimBucket, Upsert
from replicator.sim.cluster import (
    DEFAULT_PASSWORD,
    DEFAULT_USERNAME,
    SimCluster,
    server_tls_context,
)
from replicator.sim.faults import MalformedFrame
from replicator.sim.server import ServerOptions
from tests.dcp.scripted_peer import make_tls_files
from tests.sim.raw_client import wait_until

CREDENTIALS = Credentials(DEFAULT_USERNAME, DEFAULT_PASSWORD)
NUM_VBUCKETS = 8


def options(**connection: object) -> ClientOptions:
    settings: dict[str, object] = {"connect_timeout": 2.0, "request_timeout": 2.0}
    settings.update(connection)
    return ClientOptions(
        connection=ConnectionOptions(**settings),  # type: ignore[arg-type]
        reconnect=Backoff(initial=0.05, maximum=0.2, deadline=10.0),
        stream_retry=Backoff(initial=0.02, maximum=0.2, deadline=10.0),
    )


class Mirror:
    """The layer above in miniature: whole snapshots applied, positions remembered."""

    def __init__(self, num_vbuckets: int) -> None:
        self.docs: dict[int, dict[bytes, bytes]] = {vb: {} for vb in range(num_vbuckets)}
        self.committed: dict[int, int] = dict.fromkeys(range(num_vbuckets), 0)
        self.logs: dict[int, FailoverLog | None] = dict.fromkeys(range(num_vbuckets))
        self.ends: list[StreamEnd] = []
        self.rollbacks: list[RollbackRequired] = []
        self._pending: dict[int, dict[bytes, bytes | None]] = {vb: {} for vb in self.docs}
        self._marker_end: dict[int, int | None] = dict.fromkeys(self.docs)

    def committed_position(self, vb: int) -> tuple[VbucketPosition, FailoverLog | None]:
        seqno, log = self.committed[vb], self.logs[vb]
        if seqno == 0 or log is None:
            return VbucketPosition.beginning(vb), log
        return VbucketPosition.at_boundary(vb, log.entry_at(seqno).vbucket_uuid, seqno), log

    def apply(self, event: StreamEvent) -> None:
        vb = event.vbucket
        if isinstance(event, StreamOpened):
            self.logs[vb] = event.failover_log
        elif isinstance(event, SnapshotMarker):
            self._complete(vb)
            self._marker_end[vb] = event.end_seqno
        elif isinstance(event, Mutation | Deletion | Expiration):
            self._pending[vb][event.key] = event.value if isinstance(event, Mutation) else None
            if event.by_seqno == self._marker_end[vb]:
                self._complete(vb)
        elif isinstance(event, StreamEnd):
            self.ends.append(event)
            if event.reason is StreamEndReason.OK:
                self._complete(vb)
            self._pending[vb].clear()
            self._marker_end[vb] = None
        elif isinstance(event, RollbackRequired):
            self.rollbacks.append(event)

    def _complete(self, vb: int) -> None:
        end = self._marker_end[vb]
        if end is None:
            return
        for key, value in self._pending[vb].items():
            if value is None:
                self.docs[vb].pop(key, None)
            else:
                self.docs[vb][key] = value
        self._pending[vb].clear()
        self.committed[vb] = end
        self._marker_end[vb] = None

    def resync(self, client: DcpClient, vb: int) -> None:
        """Answer a rollback the simplest correct way: start the vbucket again from 0."""
        self.docs[vb].clear()
        self.committed[vb] = 0
        self.logs[vb] = None
        client.open_stream(vb, VbucketPosition.beginning(vb), None)

    def live_state(self) -> dict[int, dict[bytes, bytes]]:
        return {vb: dict(docs) for vb, docs in self.docs.items()}


def bucket_state(bucket: SimBucket) -> dict[int, dict[bytes, bytes]]:
    state: dict[int, dict[bytes, bytes]] = {vb: {} for vb in range(bucket.num_vbuckets)}
    for record in bucket.documents():
        state[record.vbucket][record.key] = record.value
    return state


def catch_up(client: DcpClient, mirror: Mirror, bucket: SimBucket, timeout: float = 15.0) -> None:
    """Poll until every vbucket's committed seqno reached the bucket's high seqno."""
    deadline = time.monotonic() + timeout
    while True:
        high = bucket.high_seqnos()
        if all(mirror.committed[vb] == high[vb] for vb in high):
            return
        assert time.monotonic() < deadline, f"committed {mirror.committed} vs high {high}"
        batch = client.poll(timeout=0.2)
        for event in batch:
            mirror.apply(event)
            if isinstance(event, RollbackRequired):
                mirror.resync(client, event.vbucket)
        client.acknowledge(batch)


def load(bucket: SimBucket, count: int, *, prefix: str = "doc", size: int = 20) -> None:
    """`count` documents with `size` bytes of incompressible padding (snappy is on)."""
    rng = random.Random(prefix)
    pads = [rng.randbytes(size // 2).hex() for _ in range(count)]
    bucket.apply_batch([Upsert(f"{prefix}-{n}", {"n": n, "pad": pads[n]}) for n in range(count)])


@pytest.fixture
def bucket() -> SimBucket:
    b = SimBucket("travel", num_vbuckets=NUM_VBUCKETS, seed=7)
    load(b, 120)
    b.apply_batch([Delete(f"doc-{n}") for n in range(0, 120, 7)])
    b.evict_checkpoints()  # new streams backfill from "disk"
    return b


@pytest.fixture
def cluster(bucket: SimBucket) -> Iterator[SimCluster]:
    with SimCluster(bucket, nodes=2, options=ServerOptions(noop_time_scale=0.05)) as c:
        yield c


def start(cluster: SimCluster, mirror: Mirror, **connection: object) -> DcpClient:
    client = DcpClient(
        cluster.connection_string,
        CREDENTIALS,
        options=options(**connection),
        committed_position=mirror.committed_position,
    )
    for vb in range(NUM_VBUCKETS):
        client.open_stream(vb, *mirror.committed_position(vb))
    return client


def test_full_copy_then_live_changes(cluster: SimCluster, bucket: SimBucket) -> None:
    mirror = Mirror(NUM_VBUCKETS)
    with start(cluster, mirror) as client:
        assert {str(n) for n in client.cluster_map.nodes} == {
            f"127.0.0.1:{node.port}" for node in cluster.nodes
        }
        catch_up(client, mirror, bucket)
        assert mirror.live_state() == bucket_state(bucket)
        load(bucket, 40, prefix="live")
        bucket.apply_batch([Upsert("doc-1", {"changed": True}), Delete("doc-2")])
        catch_up(client, mirror, bucket)
        assert mirror.live_state() == bucket_state(bucket)
        assert all(e.reason is not StreamEndReason.DISCONNECTED for e in mirror.ends)


def test_queries_match_the_bucket(cluster: SimCluster, bucket: SimBucket) -> None:
    with DcpClient(cluster.connection_string, CREDENTIALS, options=options()) as client:
        assert client.high_seqnos() == bucket.high_seqnos()
        assert client.failover_log(5) == bucket.failover_log(5)
        manifest = client.collections_manifest()
        assert int(str(manifest["uid"]), 16) == bucket.manifest.uid


def test_wrong_password_is_refused_at_bootstrap(cluster: SimCluster) -> None:
    with pytest.raises(AuthenticationError) as caught:
        DcpClient(
            cluster.connection_string,
            Credentials(DEFAULT_USERNAME, "bad-pw-123"),
            options=options(),
        )
    assert "bad-pw-123" not in str(caught.value)


def test_rebalance_moves_streams_to_the_new_owners(cluster: SimCluster, bucket: SimBucket) -> None:
    mirror = Mirror(NUM_VBUCKETS)
    with start(cluster, mirror) as client:
        catch_up(client, mirror, bucket)
        before = client.cluster_map.version
        cluster.rebalance("rotate")
        load(bucket, 30, prefix="after-move")
        catch_up(client, mirror, bucket)
        assert mirror.live_state() == bucket_state(bucket)
        assert client.cluster_map.version > before
        moved = [e for e in mirror.ends if e.reason is StreamEndReason.STATE_CHANGED]
        assert {e.vbucket for e in moved} == set(range(NUM_VBUCKETS))


def test_failover_makes_the_mirror_roll_back(cluster: SimCluster, bucket: SimBucket) -> None:
    mirror = Mirror(NUM_VBUCKETS)
    with start(cluster, mirror) as client:
        catch_up(client, mirror, bucket)
        vb = bucket.vbucket_for("doc-3")
        high = bucket.high_seqnos()[vb]
        new_log = cluster.failover(vb, lose_last=2)
        assert new_log.newest.seqno == high - 2
        bucket.upsert("doc-3", {"after": "failover"})  # the new branch diverges
        catch_up(client, mirror, bucket)
        assert [r.vbucket for r in mirror.rollbacks] == [vb]
        assert mirror.rollbacks[0].rollback_seqno == high - 2  # the branch point
        assert mirror.live_state() == bucket_state(bucket)


def test_malformed_frame_reconnects_and_resumes(cluster: SimCluster, bucket: SimBucket) -> None:
    mirror = Mirror(NUM_VBUCKETS)
    with start(cluster, mirror) as client:
        catch_up(client, mirror, bucket)
        assert cluster.send_malformed_frame(MalformedFrame.BAD_EXTRAS) == 2
        load(bucket, 40, prefix="after-bad-frame")
        catch_up(client, mirror, bucket)
        assert mirror.live_state() == bucket_state(bucket)
        disconnected = [e for e in mirror.ends if e.reason is StreamEndReason.DISCONNECTED]
        assert disconnected, "the broken connections ended their streams"
        assert client.last_connection_error is not None
        assert "opcode 0x5" in str(client.last_connection_error)


def test_dropped_connections_reconnect(cluster: SimCluster, bucket: SimBucket) -> None:
    mirror = Mirror(NUM_VBUCKETS)
    with start(cluster, mirror) as client:
        catch_up(client, mirror, bucket)
        cluster.drop_connections()
        load(bucket, 25, prefix="after-drop")
        catch_up(client, mirror, bucket)
        assert mirror.live_state() == bucket_state(bucket)


def test_stalled_node_is_declared_dead_and_reconnected(
    cluster: SimCluster, bucket: SimBucket
) -> None:
    mirror = Mirror(NUM_VBUCKETS)
    with start(cluster, mirror, noop_interval=1, dead_connection_timeout=0.5) as client:
        catch_up(client, mirror, bucket)
        cluster.stall(0)
        deadline = time.monotonic() + 10
        # Waits for the stall's own error: on a loaded machine another connection may break
        # first (the producer's scaled noop clock), and that is not what this test is about.
        while "presumed dead" not in str(client.last_connection_error):
            assert time.monotonic() < deadline, f"no stall seen: {client.last_connection_error}"
            batch = client.poll(timeout=0.1)
            for event in batch:
                mirror.apply(event)
            client.acknowledge(batch)
        assert isinstance(client.last_connection_error, ConnectionLostError)
        cluster.release(0)
        load(bucket, 20, prefix="after-stall")
        catch_up(client, mirror, bucket)
        assert mirror.live_state() == bucket_state(bucket)


def test_large_backfill_through_a_tiny_window(cluster: SimCluster, bucket: SimBucket) -> None:
    load(bucket, 400, prefix="big", size=900)
    bucket.evict_checkpoints()
    mirror = Mirror(NUM_VBUCKETS)
    with start(cluster, mirror, flow_control_window=8 * 1024) as client:
        catch_up(client, mirror, bucket, timeout=30.0)
        assert mirror.live_state() == bucket_state(bucket)
        assert client.acknowledged_bytes > 40 * 8 * 1024  # the window was reopened many times


def test_tls_connection_to_the_simulated_cluster(bucket: SimBucket, tmp_path: Path) -> None:
    files = make_tls_files(tmp_path)
    context = server_tls_context(str(files.server_cert), str(files.server_key))
    with SimCluster(bucket, nodes=2, tls_context=context) as cluster:
        assert cluster.tls_connection_string is not None
        mirror = Mirror(NUM_VBUCKETS)
        client = DcpClient(
            cluster.tls_connection_string,
            CREDENTIALS,
            options=options(tls=TlsSettings(ca_file=str(files.ca_cert))),
            committed_position=mirror.committed_position,
        )
        with client:
            for vb in range(NUM_VBUCKETS):
                client.open_stream(vb, VbucketPosition.beginning(vb), None)
            catch_up(client, mirror, bucket)
            assert mirror.live_state() == bucket_state(bucket)


def test_bounded_streams_end_at_the_high_seqno_and_are_not_reopened(
    cluster: SimCluster, bucket: SimBucket
) -> None:
    mirror = Mirror(NUM_VBUCKETS)
    asked: list[int] = []

    def committed_position(vb: int) -> tuple[VbucketPosition, FailoverLog | None]:
        asked.append(vb)
        return mirror.committed_position(vb)

    with DcpClient(
        cluster.connection_string,
        CREDENTIALS,
        options=options(),
        committed_position=committed_position,
    ) as client:
        high = client.high_seqnos()
        assert high == bucket.high_seqnos()
        expected = bucket_state(bucket)
        for vb in range(NUM_VBUCKETS):
            client.open_stream(vb, VbucketPosition.beginning(vb), None, end=high[vb])
        load(bucket, 30, prefix="beyond-the-end")  # past every bound: must not arrive
        events: list[StreamEvent] = []
        ends: dict[int, StreamEnd] = {}
        deadline = time.monotonic() + 15
        while len(ends) < NUM_VBUCKETS:
            assert time.monotonic() < deadline, f"ends so far: {ends}"
            batch = client.poll(timeout=0.2)
            for event in batch:
                mirror.apply(event)
                events.append(event)
                if isinstance(event, StreamEnd):
                    ends[event.vbucket] = event
            client.acknowledge(batch)
        assert {e.reason for e in ends.values()} == {StreamEndReason.OK}
        for vb in range(NUM_VBUCKETS):
            seqnos = [
                e.by_seqno
                for e in events
                if isinstance(e, Mutation | Deletion | Expiration) and e.vbucket == vb
            ]
            assert seqnos and max(seqnos) == high[vb], f"vbucket {vb}: {seqnos}"
            assert client.stream_state(vb) is None  # ended for good
        assert mirror.committed == high
        assert mirror.live_state() == expected
        assert sum(isinstance(e, StreamOpened) for e in events) == NUM_VBUCKETS
        assert asked == []  # an OK end is final: nothing asked where to resume


def test_queued_events_stay_within_the_windows_while_the_layer_above_waits(
    cluster: SimCluster, bucket: SimBucket
) -> None:
    load(bucket, 300, prefix="wide", size=400)  # about 75 KB per node
    bucket.evict_checkpoints()
    window, largest_message = 4096, 1024
    mirror = Mirror(NUM_VBUCKETS)
    with start(cluster, mirror, flow_control_window=window) as client:
        assert len(client.cluster_map.nodes) == 2
        # Not polled: nothing is acknowledged, so each producer stops once its window is full.
        assert wait_until(lambda: client.queued_bytes >= 2 * window, timeout=10.0), (
            f"only {client.queued_bytes} bytes arrived"
        )
        bound = 2 * (window + largest_message)
        for _ in range(2):  # a round trip to both nodes: whatever they sent before is queued
            client.high_seqnos()
            assert client.queued_bytes <= bound
        catch_up(client, mirror, bucket, timeout=30.0)  # released by acknowledging: no stall
        assert mirror.live_state() == bucket_state(bucket)


def start_with_deadline(cluster: SimCluster, mirror: Mirror, deadline: float) -> DcpClient:
    """`start`, with a short reconnect deadline."""
    client = DcpClient(
        cluster.connection_string,
        CREDENTIALS,
        options=dataclasses.replace(
            options(), reconnect=Backoff(initial=0.05, maximum=0.2, deadline=deadline)
        ),
        committed_position=mirror.committed_position,
    )
    for vb in range(NUM_VBUCKETS):
        client.open_stream(vb, *mirror.committed_position(vb))
    return client


def test_a_frame_refused_after_a_good_marker_on_every_connection_fails_at_the_deadline(
    cluster: SimCluster, bucket: SimBucket, caplog: pytest.LogCaptureFixture
) -> None:
    """Every new connection sends a good snapshot marker, then a mutation the consumer refuses.
    The markers are acknowledged, but acknowledged data proves no health: the node's streak of
    failures runs on and the client gives up at its deadline, naming the node and the frame."""
    mirror = Mirror(NUM_VBUCKETS)
    cluster.always_send_malformed(MalformedFrame.BAD_EXTRAS)
    deadline = 2.0
    client = start_with_deadline(cluster, mirror, deadline)
    markers = 0
    started = time.monotonic()
    with client, pytest.raises(ConnectionLostError) as failure:
        while time.monotonic() - started < 30.0:
            batch = client.poll(timeout=0.2)
            markers += sum(isinstance(event, SnapshotMarker) for event in batch)
            for event in batch:
                mirror.apply(event)
            client.acknowledge(batch)

    assert markers >= 2, "good markers came (and were acknowledged) before the refused frames"
    text = str(failure.value)
    assert text.startswith("127.0.0.1:"), text
    assert "the same frame was refused" in text and "times in a row" in text, text
    assert "extras" in text and "check the server's version" in text, text
    assert any(
        "the same frame was refused 3 times in a row" in record.getMessage()
        for record in caplog.records
    )
    assert all(seqno == 0 for seqno in mirror.committed.values())


def test_committed_progress_proves_a_connection_that_later_breaks_on_a_refused_frame(
    cluster: SimCluster, bucket: SimBucket
) -> None:
    """A connection whose data the layer above committed was healthy: when the producer later
    sends a frame the consumer refuses, the node's streak starts afresh instead of carrying
    the failures of an earlier bad stretch to the deadline."""
    mirror = Mirror(NUM_VBUCKETS)
    deadline = 3.0
    client = start_with_deadline(cluster, mirror, deadline)
    with client:
        for round_ in range(3):
            # A bad stretch (each node's connection breaks once on a refused frame), then the
            # new connections deliver changes that are committed and reported as progress.
            assert cluster.send_malformed_frame(MalformedFrame.BAD_EXTRAS) == 2
            load(bucket, 16, prefix=f"round-{round_}")
            catch_up(client, mirror, bucket)
            client.note_progress(range(NUM_VBUCKETS))
            time.sleep(deadline / 2)  # the rounds together outlast the deadline
            load(bucket, 16, prefix=f"after-{round_}")
            catch_up(client, mirror, bucket)
            client.note_progress(range(NUM_VBUCKETS))
        assert mirror.live_state() == bucket_state(bucket)
