"""DcpClient against scripted peers: bootstrap, routing, stream outcomes, ends, reconnects."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest

from replicator.dcp.cluster.batch import EventBatch
from replicator.dcp.cluster.client import DcpClient
from replicator.dcp.cluster.options import ClientOptions
from replicator.dcp.cluster.streams import StreamState
from replicator.dcp.protocol.codec import encode_dcp_message
from replicator.dcp.protocol.dcp_requests import BufferAck, CloseStream, DcpControl, StreamRequest
from replicator.dcp.protocol.events import (
    Mutation,
    RollbackRequired,
    SnapshotFlags,
    SnapshotMarker,
    StreamEnd,
    StreamEndReason,
    StreamEvent,
    StreamOpened,
)
from replicator.dcp.protocol.frame import encode_frame
from replicator.dcp.protocol.opcodes import Opcode, Status
from replicator.dcp.protocol.requests import GetClusterConfig
from replicator.dcp.protocol.responses import Response, encode_failover_log, encode_rollback_seqno
from replicator.dcp.transport.auth import Credentials
from replicator.dcp.transport.options import ConnectionOptions
from replicator.errors import (
    AuthenticationError,
    BucketNotFoundError,
    ConfigError,
    ConnectionLostError,
    NodeUnreachableError,
    ProtocolError,
)
from replicator.model.backoff import Backoff
from replicator.model.positions import FailoverLog, VbucketPosition
from tests.dcp.scripted_peer import (
    DEFAULT_FAILOVER_LOG,
    PeerSession,
    ScriptedPeer,
    cluster_config,
)

E = TypeVar("E")
CREDENTIALS = Credentials("dcp", "s3cret-pw")
OPTIONS = ClientOptions(
    connection=ConnectionOptions(connect_timeout=2.0, request_timeout=2.0),
    reconnect=Backoff(initial=0.05, maximum=0.2, deadline=5.0),
    stream_retry=Backoff(initial=0.02, maximum=0.1, deadline=3.0),
)
LOG = FailoverLog.of([(0xBEEF, 50), (0xABCDEF, 0)])


class Positions:
    """The layer above's committed positions, recording when the client asks."""

    def __init__(self) -> None:
        self.committed: dict[int, tuple[VbucketPosition, FailoverLog | None]] = {}
        self.asked: list[int] = []

    def __call__(self, vbucket: int) -> tuple[VbucketPosition, FailoverLog | None]:
        self.asked.append(vbucket)
        return self.committed.get(vbucket, (VbucketPosition.beginning(vbucket), None))


class Consumer:
    """Polls the client like the layer above does: stage (record) then acknowledge."""

    def __init__(self, client: DcpClient) -> None:
        self.client = client
        self.events: list[StreamEvent] = []
        self.batches: list[EventBatch] = []

    def until(self, done: Callable[[list[StreamEvent]], bool], timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while not done(self.events):
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"timed out; events so far: {self.events}"
            batch = self.client.poll(timeout=min(remaining, 0.5))
            self.events.extend(batch)
            self.batches.append(batch)
            self.client.acknowledge(batch)

    def of(self, kind: type[E]) -> list[E]:
        return [e for e in self.events if isinstance(e, kind)]


def has(kind: type, count: int = 1) -> Callable[[list[StreamEvent]], bool]:
    return lambda events: sum(isinstance(e, kind) for e in events) >= count


@pytest.fixture
def peer() -> Iterator[ScriptedPeer]:
    with ScriptedPeer() as p:
        yield p


def make_client(
    peer: ScriptedPeer, positions: Positions | None = None, **kwargs: object
) -> DcpClient:
    return DcpClient(
        peer.connection_string(),
        CREDENTIALS,
        options=kwargs.pop("options", OPTIONS),  # type: ignore[arg-type]
        committed_position=positions,
    )


def mutation(vb: int, seqno: int, key: bytes = b"k") -> Mutation:
    return Mutation(vb, seqno, 1, seqno, 0, 0, 0, 0, key, b"{}", True)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# --- bootstrap ---------------------------------------------------------------------------


def test_bootstrap_skips_an_unreachable_seed_and_streams(peer: ScriptedPeer) -> None:
    dead = closed_port()
    connstr = f"couchbase://127.0.0.1:{dead},127.0.0.1:{peer.port}/travel"
    with DcpClient(connstr, CREDENTIALS, options=OPTIONS) as client:
        assert client.cluster_map.num_vbuckets == 4
        client.open_stream(2, VbucketPosition.beginning(2), None)
        session = peer.dcp_session()
        request = session.wait_for(StreamRequest)[0]
        assert (request.vbucket, request.start_seqno, request.vbucket_uuid) == (2, 0, 0)
        opaque = session.stream_opaque(2)
        marker = SnapshotMarker(2, 1, 2, SnapshotFlags.MEMORY)
        session.send_event(marker, opaque=opaque)
        session.send_event(mutation(2, 1, b"a"), opaque=opaque)
        session.send_event(mutation(2, 2, b"b"), opaque=opaque)
        consumer = Consumer(client)
        consumer.until(has(Mutation, 2))
        assert consumer.events == [
            StreamOpened(2, DEFAULT_FAILOVER_LOG),
            marker,
            mutation(2, 1, b"a"),
            mutation(2, 2, b"b"),
        ]
        assert client.stream_state(2) is StreamState.OPEN


def test_bootstrap_fails_when_no_seed_answers() -> None:
    with pytest.raises(NodeUnreachableError, match="no seed node"):
        DcpClient(f"couchbase://127.0.0.1:{closed_port()}/b", CREDENTIALS, options=OPTIONS)


def test_wrong_password_raises_at_bootstrap_without_retrying(peer: ScriptedPeer) -> None:
    other = ScriptedPeer()
    try:
        connstr = f"couchbase://127.0.0.1:{peer.port},127.0.0.1:{other.port}/travel"
        with pytest.raises(AuthenticationError) as caught:
            DcpClient(connstr, Credentials("dcp", "nope-nope"), options=OPTIONS)
        assert "nope-nope" not in str(caught.value)
        assert len(peer.sessions) == 1 and not other.sessions  # no second seed, no retry
    finally:
        other.stop()


def test_unknown_bucket_raises_at_bootstrap(peer: ScriptedPeer) -> None:
    with pytest.raises(BucketNotFoundError, match="'other'"):
        DcpClient(peer.connection_string("other"), CREDENTIALS, options=OPTIONS)


def test_open_stream_validates_its_arguments(peer: ScriptedPeer) -> None:
    with make_client(peer) as client:
        with pytest.raises(ConfigError, match="out of range"):
            client.open_stream(9, VbucketPosition.beginning(9), None)
        with pytest.raises(ConfigError, match="position of vbucket 2"):
            client.open_stream(1, VbucketPosition.beginning(2), None)
        with pytest.raises(ConfigError, match="needs the failover log"):
            client.open_stream(1, VbucketPosition.at_boundary(1, 7, 10), None)
        client.open_stream(1, VbucketPosition.beginning(1), None)
        Consumer(client).until(has(StreamOpened))
        with pytest.raises(ConfigError, match="already has a stream"):
            client.open_stream(1, VbucketPosition.beginning(1), None)


# --- routing -----------------------------------------------------------------------------


def test_streams_go_to_each_vbuckets_active_node() -> None:
    with ScriptedPeer() as a, ScriptedPeer() as b:
        config = lambda: cluster_config([a.port, b.port], owners=[0, 1, 0, 1])  # noqa: E731
        a.behaviour.config = b.behaviour.config = config
        with DcpClient(a.connection_string(), CREDENTIALS, options=OPTIONS) as client:
            for vb in range(4):
                client.open_stream(vb, VbucketPosition.beginning(vb), None)
            consumer = Consumer(client)
            consumer.until(has(StreamOpened, 4))
            on_a = {r.vbucket for r in a.dcp_session().of_kind(StreamRequest)}
            on_b = {r.vbucket for r in b.dcp_session().of_kind(StreamRequest)}
            assert (on_a, on_b) == ({0, 2}, {1, 3})
            # Interleave two vbuckets from two nodes: each vbucket's order is kept.
            sa, sb = a.dcp_session(), b.dcp_session()
            for seqno in range(1, 6):
                sa.send_event(mutation(0, seqno), opaque=sa.stream_opaque(0))
                sb.send_event(mutation(1, seqno), opaque=sb.stream_opaque(1))
            consumer.until(has(Mutation, 10))
            for vb in (0, 1):
                seqnos = [e.by_seqno for e in consumer.of(Mutation) if e.vbucket == vb]
                assert seqnos == [1, 2, 3, 4, 5]


def test_not_my_vbucket_with_a_map_reroutes_to_the_new_owner() -> None:
    with ScriptedPeer() as a, ScriptedPeer() as b:
        old = cluster_config([a.port, b.port], owners=[0, 0, 0, 0], rev=1)
        new = cluster_config([a.port, b.port], owners=[0, 1, 0, 0], rev=2)
        a.behaviour.config = b.behaviour.config = lambda: old

        def moved(session: PeerSession, request: StreamRequest) -> None:
            session.reply(request, Status.NOT_MY_VBUCKET, new)

        a.behaviour.on_stream_request = moved
        with DcpClient(a.connection_string(), CREDENTIALS, options=OPTIONS) as client:
            assert not b.sessions  # b owned nothing at bootstrap
            client.open_stream(1, VbucketPosition.beginning(1), None)
            Consumer(client).until(has(StreamOpened))
            assert [r.vbucket for r in b.dcp_session().of_kind(StreamRequest)] == [1]
            assert client.cluster_map.rev == 2


def test_not_my_vbucket_without_a_map_fetches_one() -> None:
    with ScriptedPeer() as a, ScriptedPeer() as b:
        current = {"config": cluster_config([a.port, b.port], owners=[0, 0, 0, 0], rev=1)}
        a.behaviour.config = b.behaviour.config = lambda: current["config"]

        def moved(session: PeerSession, request: StreamRequest) -> None:
            current["config"] = cluster_config([a.port, b.port], owners=[0, 1, 0, 0], rev=2)
            session.reply(request, Status.NOT_MY_VBUCKET)

        a.behaviour.on_stream_request = moved
        with DcpClient(a.connection_string(), CREDENTIALS, options=OPTIONS) as client:
            client.open_stream(1, VbucketPosition.beginning(1), None)
            Consumer(client).until(has(StreamOpened))
            assert len(a.session().of_kind(GetClusterConfig)) >= 2  # handshake + refresh
            assert b.dcp_session().of_kind(StreamRequest)[0].vbucket == 1


def test_pushed_cluster_map_is_adopted(peer: ScriptedPeer) -> None:
    with make_client(peer) as client:
        newer = cluster_config([peer.port], rev=9)
        peer.dcp_session().send_map_notification(newer, revision=9)
        deadline = time.monotonic() + 5
        while client.cluster_map.rev != 9:
            assert time.monotonic() < deadline
            client.poll(timeout=0.05)
        older = cluster_config([peer.port], rev=3)
        session = peer.session()
        session.send_map_notification(older, revision=3)
        session.send_noop(opaque=0x3)  # its reply proves the notification was handled
        assert any(r.opaque == 0x3 for r in session.wait_for(Response))
        assert client.cluster_map.rev == 9  # never goes back


# --- stream request outcomes -------------------------------------------------------------


def test_rollback_is_surfaced_with_the_seqno_from_the_value(peer: ScriptedPeer) -> None:
    peer.behaviour.on_stream_request = lambda s, r: s.reply(
        r, Status.ROLLBACK, encode_rollback_seqno(37)
    )
    with make_client(peer) as client:
        client.open_stream(3, VbucketPosition.at_boundary(3, 0xBEEF, 60), LOG)
        consumer = Consumer(client)
        consumer.until(has(RollbackRequired))
        assert consumer.events == [RollbackRequired(3, 37)]
        assert client.stream_state(3) is None  # the layer above decides what next
        request = peer.session().of_kind(StreamRequest)[0]
        assert (request.start_seqno, request.vbucket_uuid) == (60, 0xBEEF)
        assert (request.snapshot_start, request.snapshot_end) == (60, 60)


def test_temporary_failure_is_retried_with_backoff(peer: ScriptedPeer) -> None:
    replies = iter([Status.ETMPFAIL, Status.ETMPFAIL, Status.SUCCESS])
    arrivals: list[float] = []

    def flaky(session: PeerSession, request: StreamRequest) -> None:
        arrivals.append(time.monotonic())
        status = next(replies)
        value = encode_failover_log(DEFAULT_FAILOVER_LOG) if status == Status.SUCCESS else b""
        session.reply(request, status, value)

    peer.behaviour.on_stream_request = flaky
    # No jitter: the waits are exactly 0.05 s, then 0.2 s.
    retry = Backoff(initial=0.05, maximum=1.0, multiplier=4.0, deadline=3.0, jitter=False)
    options = ClientOptions(connection=OPTIONS.connection, stream_retry=retry)
    with make_client(peer, options=options) as client:
        client.open_stream(0, VbucketPosition.beginning(0), None)
        consumer = Consumer(client)
        consumer.until(has(StreamOpened))
        requests = peer.session().of_kind(StreamRequest)
        assert len(requests) == 3
        assert len({r.opaque for r in requests}) == 3  # each attempt is a new stream id
        assert consumer.events == [StreamOpened(0, DEFAULT_FAILOVER_LOG)]
    first_gap, second_gap = arrivals[1] - arrivals[0], arrivals[2] - arrivals[1]
    # Never sooner than the backoff says; the second wait is the longer one (0.2 s against
    # 0.05 s). Only lower bounds: a loaded machine can make any wait longer.
    assert first_gap >= 0.05 and second_gap >= 0.2


def test_temporary_failure_past_the_deadline_is_raised(peer: ScriptedPeer) -> None:
    peer.behaviour.on_stream_request = lambda s, r: s.reply(r, Status.ETMPFAIL)
    options = ClientOptions(
        connection=OPTIONS.connection,
        stream_retry=Backoff(initial=0.02, maximum=0.05, deadline=0.3),
    )
    with make_client(peer, options=options) as client:
        client.open_stream(0, VbucketPosition.beginning(0), None)
        with pytest.raises(ConnectionLostError, match="kept failing"):
            Consumer(client).until(lambda events: False, timeout=5.0)


def test_existing_stream_is_closed_and_requested_again(peer: ScriptedPeer) -> None:
    replies = iter([Status.KEY_EEXISTS, Status.SUCCESS])

    def exists_once(session: PeerSession, request: StreamRequest) -> None:
        status = next(replies)
        value = encode_failover_log(DEFAULT_FAILOVER_LOG) if status == Status.SUCCESS else b""
        session.reply(request, status, value)

    peer.behaviour.on_stream_request = exists_once
    peer.behaviour.answer_close_with_stream_end = False
    with make_client(peer) as client:
        client.open_stream(1, VbucketPosition.beginning(1), None)
        Consumer(client).until(has(StreamOpened))
        kinds = [type(m).__name__ for m in peer.session().received[-3:]]
        assert kinds == ["StreamRequest", "CloseStream", "StreamRequest"]


def test_out_of_range_beyond_the_producer_high_seqno_becomes_a_rollback(
    peer: ScriptedPeer,
) -> None:
    peer.behaviour.on_stream_request = lambda s, r: s.reply(r, Status.ERANGE)
    peer.behaviour.high_seqnos = {0: 10, 1: 40}
    with make_client(peer) as client:
        client.open_stream(1, VbucketPosition.at_boundary(1, 0xBEEF, 55), LOG)
        consumer = Consumer(client)
        consumer.until(has(RollbackRequired))
        assert consumer.events == [RollbackRequired(1, 40)]


def test_out_of_range_within_the_high_seqno_is_a_protocol_error(peer: ScriptedPeer) -> None:
    peer.behaviour.on_stream_request = lambda s, r: s.reply(r, Status.ERANGE)
    peer.behaviour.high_seqnos = {1: 90}
    with make_client(peer) as client:
        client.open_stream(1, VbucketPosition.at_boundary(1, 0xBEEF, 55), LOG, end=80)
        with pytest.raises(
            ProtocolError, match="start 55, snapshot \\[55, 55\\], end 80"
        ) as caught:
            Consumer(client).until(lambda events: False)
        assert caught.value.opcode == Opcode.DCP_STREAM_REQ
        assert client.stream_state(1) is None


def test_refused_stream_request_is_raised_from_poll(peer: ScriptedPeer) -> None:
    peer.behaviour.on_stream_request = lambda s, r: s.reply(r, Status.EACCESS)
    with make_client(peer) as client:
        client.open_stream(0, VbucketPosition.beginning(0), None)
        with pytest.raises(ProtocolError, match="EACCESS"):
            Consumer(client).until(lambda events: False)


# --- stream ends and reopening -----------------------------------------------------------


def open_and_stream(client: DcpClient, peer: ScriptedPeer, vb: int) -> tuple[PeerSession, int]:
    client.open_stream(vb, VbucketPosition.beginning(vb), None)
    session = peer.dcp_session()
    session.wait_for(StreamRequest)
    return session, session.stream_opaque(vb)


@pytest.mark.parametrize("reason", [StreamEndReason.OK, StreamEndReason.CLOSED])
def test_final_stream_ends(peer: ScriptedPeer, reason: StreamEndReason) -> None:
    positions = Positions()
    with make_client(peer, positions) as client:
        session, opaque = open_and_stream(client, peer, 0)
        session.send_event(StreamEnd(0, reason), opaque=opaque)
        consumer = Consumer(client)
        consumer.until(has(StreamEnd))
        client.poll(timeout=0.1)
        assert consumer.events[-1] == StreamEnd(0, reason)
        assert client.stream_state(0) is None
        assert positions.asked == [] and len(session.of_kind(StreamRequest)) == 1


@pytest.mark.parametrize(
    "reason",
    [
        StreamEndReason.STATE_CHANGED,
        StreamEndReason.DISCONNECTED,
        StreamEndReason.TOO_SLOW,
        StreamEndReason.BACKFILL_FAILED,
        StreamEndReason.ROLLBACK,
    ],
)
def test_other_stream_ends_reopen_from_the_committed_position_after_delivery(
    peer: ScriptedPeer, reason: StreamEndReason
) -> None:
    positions = Positions()
    positions.committed[0] = (VbucketPosition.at_boundary(0, 0xBEEF, 60), LOG)
    with make_client(peer, positions) as client:
        session, opaque = open_and_stream(client, peer, 0)
        configs_before = len(session.of_kind(GetClusterConfig))
        session.send_event(mutation(0, 61), opaque=opaque)
        session.send_event(StreamEnd(0, reason), opaque=opaque)
        session.send_event(mutation(0, 62), opaque=opaque)  # after the end: not this stream's
        consumer = Consumer(client)
        consumer.until(has(StreamEnd))
        assert consumer.events[-2:] == [mutation(0, 61), StreamEnd(0, reason)]
        assert positions.asked == []  # not before the layer above has seen the end
        consumer.until(has(StreamOpened, 2))
        assert positions.asked == [0]
        reopen = session.wait_for(StreamRequest, count=2)[1]
        assert (reopen.start_seqno, reopen.vbucket_uuid) == (60, 0xBEEF)
        assert consumer.of(Mutation) == [mutation(0, 61)]  # 62 came after the end: dropped
        if reason is StreamEndReason.STATE_CHANGED:
            assert len(session.of_kind(GetClusterConfig)) > configs_before


def test_close_stream_hands_up_a_closed_end(peer: ScriptedPeer) -> None:
    positions = Positions()
    with make_client(peer, positions) as client:
        session, _ = open_and_stream(client, peer, 2)
        consumer = Consumer(client)
        consumer.until(has(StreamOpened))
        assert client.close_stream(2)
        consumer.until(has(StreamEnd))
        assert consumer.events[-1] == StreamEnd(2, StreamEndReason.CLOSED)
        assert session.of_kind(CloseStream)[0].vbucket == 2
        assert client.stream_state(2) is None and positions.asked == []
        assert not client.close_stream(2)


def test_close_before_the_stream_opened_closes_it_once_open(peer: ScriptedPeer) -> None:
    held: list[tuple[PeerSession, StreamRequest]] = []
    peer.behaviour.on_stream_request = lambda session, request: held.append((session, request))
    with make_client(peer) as client:
        client.open_stream(0, VbucketPosition.beginning(0), None)
        session = peer.dcp_session()
        session.wait_for(StreamRequest)
        assert client.close_stream(0)
        assert client.stream_state(0) is StreamState.REQUESTED
        held_session, request = held[0]
        held_session.reply(request, value=encode_failover_log(DEFAULT_FAILOVER_LOG))
        consumer = Consumer(client)
        consumer.until(has(StreamEnd))
        assert consumer.events == [
            StreamOpened(0, DEFAULT_FAILOVER_LOG),
            StreamEnd(0, StreamEndReason.CLOSED),
        ]
        assert session.of_kind(CloseStream)[0].vbucket == 0


def test_close_before_a_refused_request_drops_it_without_retrying(peer: ScriptedPeer) -> None:
    held: list[tuple[PeerSession, StreamRequest]] = []
    peer.behaviour.on_stream_request = lambda session, request: held.append((session, request))
    with make_client(peer) as client:
        client.open_stream(0, VbucketPosition.beginning(0), None)
        peer.dcp_session().wait_for(StreamRequest)
        client.close_stream(0)
        held_session, request = held[0]
        held_session.reply(request, Status.ETMPFAIL)
        deadline = time.monotonic() + 5
        while client.stream_state(0) is not None:
            assert time.monotonic() < deadline
            assert not client.poll(timeout=0.05)
        assert len(peer.session().of_kind(StreamRequest)) == 1


def test_close_stream_on_a_producer_without_stream_end_on_close(peer: ScriptedPeer) -> None:
    peer.behaviour.control_status = {"send_stream_end_on_client_close_stream": Status.EINVAL}
    with make_client(peer) as client:
        open_and_stream(client, peer, 1)
        consumer = Consumer(client)
        consumer.until(has(StreamOpened))
        client.close_stream(1)
        consumer.until(has(StreamEnd))
        assert consumer.events[-1] == StreamEnd(1, StreamEndReason.CLOSED)


# --- connection failures -----------------------------------------------------------------


def test_malformed_frame_reconnects_and_reopens_with_nothing_after_it_delivered(
    peer: ScriptedPeer,
) -> None:
    positions = Positions()
    positions.committed[0] = (VbucketPosition.at_boundary(0, 0xBEEF, 60), LOG)
    with make_client(peer, positions) as client:
        session, opaque = open_and_stream(client, peer, 0)
        consumer = Consumer(client)
        consumer.until(has(StreamOpened))
        good = encode_frame(
            0x80,
            Opcode.DCP_SNAPSHOT_MARKER,
            vbucket_or_status=0,
            opaque=opaque,
            extras=(61).to_bytes(8, "big") + (62).to_bytes(8, "big") + b"\0\0\0\1",
        )
        bad = encode_frame(0x80, Opcode.DCP_MUTATION, opaque=opaque, extras=b"\0" * 5)
        later = encode_dcp_message(mutation(0, 61), opaque=opaque, features=session.features)
        session.send_raw(good + bad + later)
        consumer.until(has(StreamEnd))
        assert consumer.events[1:] == [
            SnapshotMarker(0, 61, 62, SnapshotFlags.MEMORY),
            StreamEnd(0, StreamEndReason.DISCONNECTED),
        ]
        error = client.last_connection_error
        assert isinstance(error, ProtocolError) and error.opcode == Opcode.DCP_MUTATION
        consumer.until(has(StreamOpened, 2))
        second = peer.dcp_session(1)
        reopen = second.wait_for(StreamRequest)[0]
        assert (reopen.vbucket, reopen.start_seqno) == (0, 60)
        assert not consumer.of(Mutation)


def test_lost_connection_reconnects_and_reopens(peer: ScriptedPeer) -> None:
    positions = Positions()
    with make_client(peer, positions) as client:
        session, _ = open_and_stream(client, peer, 3)
        consumer = Consumer(client)
        consumer.until(has(StreamOpened))
        session.close()
        consumer.until(has(StreamEnd))
        assert consumer.events[-1] == StreamEnd(3, StreamEndReason.DISCONNECTED)
        consumer.until(has(StreamOpened, 2))
        assert positions.asked == [3]
        assert peer.dcp_session(1).of_kind(StreamRequest)[0].vbucket == 3


def test_request_in_flight_when_the_connection_drops_is_sent_again(peer: ScriptedPeer) -> None:
    answered = threading.Event()

    def first_never(session: PeerSession, request: StreamRequest) -> None:
        if answered.is_set():
            session.reply(request, value=encode_failover_log(DEFAULT_FAILOVER_LOG))
        else:
            answered.set()
            session.close()

    peer.behaviour.on_stream_request = first_never
    positions = Positions()
    with make_client(peer, positions) as client:
        client.open_stream(0, VbucketPosition.at_boundary(0, 0xBEEF, 60), LOG)
        consumer = Consumer(client)
        consumer.until(has(StreamOpened))
        assert not consumer.of(StreamEnd)  # it never opened: nothing to drop
        assert positions.asked == []  # the original position is reused
        assert peer.session(1).of_kind(StreamRequest)[0].start_seqno == 60


def test_reconnect_with_revoked_credentials_is_fatal(peer: ScriptedPeer) -> None:
    with make_client(peer, Positions()) as client:
        peer.set_users({"dcp": "changed"})
        peer.dcp_session().close()
        with pytest.raises(AuthenticationError):
            Consumer(client).until(lambda events: False)
        with pytest.raises(AuthenticationError):
            client.poll(timeout=0)


def test_reconnect_gives_up_after_its_deadline() -> None:
    peer = ScriptedPeer()
    options = ClientOptions(
        connection=OPTIONS.connection,
        reconnect=Backoff(initial=0.05, maximum=0.1, deadline=0.5),
    )
    with make_client(peer, Positions(), options=options) as client:
        peer.stop()
        with pytest.raises(ConnectionLostError, match="could not reconnect"):
            Consumer(client).until(lambda events: False, timeout=10.0)


def test_node_breaking_after_every_handshake_is_backed_off_then_given_up(
    peer: ScriptedPeer,
) -> None:
    def open_then_break(session: PeerSession, request: StreamRequest) -> None:
        session.reply(request, value=encode_failover_log(DEFAULT_FAILOVER_LOG))
        bad = encode_frame(0x80, Opcode.DCP_MUTATION, opaque=request.opaque, extras=b"\0" * 5)
        session.send_raw(bad)

    peer.behaviour.on_stream_request = open_then_break
    deadline = 0.5
    options = ClientOptions(
        connection=OPTIONS.connection,
        reconnect=Backoff(initial=0.05, maximum=0.2, deadline=deadline),
    )
    with make_client(peer, Positions(), options=options) as client:
        client.open_stream(0, VbucketPosition.beginning(0), None)
        with pytest.raises(ConnectionLostError) as caught:
            Consumer(client).until(lambda events: False, timeout=10.0)
    message = str(caught.value)
    assert message.startswith(f"{peer.address}: could not reconnect within 0.5 s")
    assert "the same frame was refused" in message and "opcode 0x57" in message
    # Delays of at least 0.025, 0.05, 0.1, 0.1, ... s: a handful of sessions fit, not dozens.
    assert 3 <= len(peer.sessions) <= 10


def test_node_closing_every_connection_after_the_handshake_is_given_up(
    peer: ScriptedPeer,
) -> None:
    options = ClientOptions(
        connection=OPTIONS.connection,
        reconnect=Backoff(initial=0.05, maximum=0.1, deadline=0.3),
    )
    with make_client(peer, Positions(), options=options) as client:
        controls = len(peer.dcp_session().of_kind(DcpControl))
        peer.behaviour.close_after_controls = controls  # every later connection: at once
        peer.sessions[0].close()
        with pytest.raises(ConnectionLostError, match=r"could not reconnect within 0\.3 s"):
            Consumer(client).until(lambda events: False, timeout=10.0)
    assert 3 <= len(peer.sessions) <= 10  # backed off: a handful of attempts, not dozens


def test_a_connection_that_stayed_up_starts_a_fresh_streak(peer: ScriptedPeer) -> None:
    stable_after = 0.05
    options = ClientOptions(
        connection=OPTIONS.connection,
        reconnect=Backoff(initial=0.02, maximum=0.05, deadline=0.1),
        connection_stable_after=stable_after,
    )
    with make_client(peer, options=options) as client:
        for losses in range(3):  # three losses, over more than the deadline in all
            peer.dcp_session(losses)
            client.high_seqnos()  # answered: the client has this connection open and in use
            up_since = time.monotonic()
            # Stay up past connection_stable_after (the client must not fail meanwhile).
            while (remaining := up_since + stable_after * 1.2 - time.monotonic()) > 0:
                assert not client.poll(timeout=remaining)
            peer.sessions[losses].close()
        peer.dcp_session(3)  # reconnected again: no fatal error after the deadline
        assert not client.poll(timeout=0)


@pytest.mark.parametrize("committed", [True, False], ids=["committed", "acknowledged-only"])
def test_a_connection_whose_data_was_committed_starts_a_fresh_streak(
    peer: ScriptedPeer, committed: bool
) -> None:
    """Committed progress (note_progress) proves a connection healthy; data acknowledged but
    not committed does not (a marker is acknowledged before the frame after it is refused)."""
    options = ClientOptions(
        connection=OPTIONS.connection,
        reconnect=Backoff(initial=0.05, maximum=0.05, deadline=0.08, jitter=False),
    )
    with make_client(peer, Positions(), options=options) as client:
        client.open_stream(0, VbucketPosition.beginning(0), None)
        consumer = Consumer(client)

        def three_short_lived_connections() -> None:  # together longer than the deadline
            for losses in range(3):
                consumer.until(has(StreamOpened, losses + 1))
                session = peer.dcp_session(losses)
                session.send_event(mutation(0, losses + 1), opaque=session.stream_opaque(0))
                consumer.until(has(Mutation, losses + 1))  # acknowledged while it is up
                if committed:
                    client.note_progress([0])
                session.close()
                consumer.until(has(StreamEnd, losses + 1))
            consumer.until(has(StreamOpened, 4))  # reopened on a fourth connection

        if committed:
            three_short_lived_connections()
        else:
            with pytest.raises(ConnectionLostError, match=r"could not reconnect within 0\.08 s"):
                three_short_lived_connections()


# --- flow control ------------------------------------------------------------------------


def test_tiny_window_never_stalls_when_the_layer_above_acknowledges() -> None:
    window = 1500
    options = ClientOptions(
        connection=ConnectionOptions(flow_control_window=window, request_timeout=2.0),
        max_batch_events=7,
    )
    with ScriptedPeer() as peer, make_client(peer, options=options) as client:
        session, opaque = open_and_stream(client, peer, 0)
        total = 300
        frames = [
            (mutation(0, seqno, b"key-%d" % seqno), len(_encoded(session, seqno, opaque)))
            for seqno in range(1, total + 1)
        ]
        stop = threading.Event()
        peak = {"unacked": 0}

        def producer() -> None:
            """Sends while sent - acked < window, like kv_engine."""
            sent = 0
            for event, size in frames:
                acks = session.of_kind(BufferAck)
                while sent - sum(a.acked_bytes for a in acks) >= window:
                    if stop.is_set():
                        return
                    acks = session.wait_for(BufferAck, count=len(acks) + 1)
                session.send_event(event, opaque=opaque)
                sent += size
                peak["unacked"] = max(peak["unacked"], sent - sum(a.acked_bytes for a in acks))

        thread = threading.Thread(target=producer, daemon=True)
        thread.start()
        consumer = Consumer(client)
        try:
            consumer.until(has(Mutation, total), timeout=20.0)
        finally:
            stop.set()
        thread.join(5)
        assert [e.by_seqno for e in consumer.of(Mutation)] == list(range(1, total + 1))
        assert peak["unacked"] < window + max(size for _, size in frames)
        assert session.of_kind(BufferAck), "acks were sent"


def test_a_read_split_across_polls_hands_each_batch_its_own_bytes(peer: ScriptedPeer) -> None:
    """One socket read queues as one entry; `max_events` splits it between events (a run of
    data messages stays whole), and each batch's receipt holds exactly the wire bytes of its
    messages (over-acknowledging would over-open a window)."""
    with make_client(peer) as client:
        session, opaque = open_and_stream(client, peer, 0)
        Consumer(client).until(has(StreamOpened))
        sizes: dict[tuple[str, int], int] = {}
        wire: list[bytes] = []
        for start in range(1, 31, 5):  # six snapshots of five mutations: six runs
            marker = encode_dcp_message(
                SnapshotMarker(0, start, start + 4, SnapshotFlags.MEMORY),
                opaque=opaque,
                features=session.features,
            )
            wire.append(marker)
            sizes["marker", start] = len(marker)
            for seqno in range(start, start + 5):
                wire.append(_encoded(session, seqno, opaque))
                sizes["mutation", seqno] = len(wire[-1])
        session.send_raw(b"".join(wire))  # one send: read (and handed up) at once
        seen: list[int] = []
        batches = 0
        deadline = time.monotonic() + 10.0
        while len(seen) < 30 and time.monotonic() < deadline:
            batch = client.poll(timeout=0.5, max_events=7)
            if not batch:
                continue
            batches += 1
            messages = list(batch)
            assert len(batch) == len(messages) <= 7
            items = [e.by_seqno for e in messages if isinstance(e, Mutation)]
            markers = [e.start_seqno for e in messages if isinstance(e, SnapshotMarker)]
            expected = sum(sizes["mutation", seqno] for seqno in items) + sum(
                sizes["marker", start] for start in markers
            )
            assert batch.receipt.total_bytes == expected
            seen += items
            client.acknowledge(batch)
        assert seen == list(range(1, 31))
        assert batches >= 36 // 7
        assert client.queued_bytes == 0


def _encoded(session: PeerSession, seqno: int, opaque: int) -> bytes:
    return encode_dcp_message(
        mutation(0, seqno, b"key-%d" % seqno), opaque=opaque, features=session.features
    )


def test_messages_of_no_stream_are_dropped_and_acknowledged(peer: ScriptedPeer) -> None:
    options = ClientOptions(
        connection=ConnectionOptions(flow_control_window=500, request_timeout=2.0)
    )
    with make_client(peer, options=options) as client:
        session, opaque = open_and_stream(client, peer, 0)
        Consumer(client).until(has(StreamOpened))
        for seqno in range(1, 6):  # 5 x ~60 bytes of a stream the client never asked for
            session.send_event(mutation(1, seqno), opaque=opaque + 1000)
        acks = session.wait_for(BufferAck)
        assert acks[0].acked_bytes >= 100
        assert client.poll(timeout=0.1).events == ()


def test_acknowledging_a_batch_twice_is_refused(peer: ScriptedPeer) -> None:
    with make_client(peer) as client:
        open_and_stream(client, peer, 0)
        batch = client.poll(timeout=5.0)
        assert batch.events
        client.acknowledge(batch)
        with pytest.raises(ValueError, match="already acknowledged"):
            client.acknowledge(batch)


# --- queries -----------------------------------------------------------------------------


def test_failover_log_high_seqnos_and_manifest(peer: ScriptedPeer) -> None:
    peer.behaviour.failover_log = LOG
    peer.behaviour.high_seqnos = {0: 5, 1: 6, 2: 7, 3: 8}
    with make_client(peer) as client:
        assert client.failover_log(2) == LOG
        assert client.high_seqnos() == {0: 5, 1: 6, 2: 7, 3: 8}
        manifest = client.collections_manifest()
        assert manifest["uid"] == "2"


def test_poll_after_close_is_refused(peer: ScriptedPeer) -> None:
    client = make_client(peer)
    client.close()
    client.close()  # idempotent
    with pytest.raises(ConfigError, match="closed"):
        client.poll(timeout=0)
