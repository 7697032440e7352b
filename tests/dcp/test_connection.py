"""NodeConnection against the scripted peer over real sockets (TCP and TLS)."""

from __future__ import annotations

import dataclasses
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from replicator.dcp.protocol.codec import ProducerMessage, encode_dcp_message
from replicator.dcp.protocol.dcp_requests import (
    BufferAck,
    DcpControl,
    DcpOpen,
    GetFailoverLog,
    StreamRequest,
)
from replicator.dcp.protocol.events import (
    DocumentChanges,
    Mutation,
    SnapshotFlags,
    SnapshotMarker,
    StreamEnd,
    StreamEndReason,
)
from replicator.dcp.protocol.frame import encode_frame
from replicator.dcp.protocol.opcodes import DcpOpenFlags, HelloFeature, Opcode, Status
from replicator.dcp.protocol.pushes import ClustermapChangeNotification, encode_server_request
from replicator.dcp.protocol.requests import GetAllVbSeqnos, Hello, Noop, SaslAuth
from replicator.dcp.protocol.responses import Response, failover_log_of
from replicator.dcp.transport.auth import Credentials
from replicator.dcp.transport.connection import Delivered, NodeConnection
from replicator.dcp.transport.options import ConnectionOptions, TlsSettings
from replicator.errors import (
    AuthenticationError,
    BucketNotFoundError,
    ConfigError,
    ConnectionLostError,
    NodeUnreachableError,
    ProtocolError,
    ReplicatorError,
    TlsError,
)
from tests.dcp.scripted_peer import (
    DEFAULT_FAILOVER_LOG,
    PeerBehaviour,
    PeerSession,
    ScriptedPeer,
    TlsFiles,
    make_tls_files,
)

PASSWORD = "s3cret-pw"
CREDENTIALS = Credentials("dcp", PASSWORD)
FAST = ConnectionOptions(connect_timeout=2.0, request_timeout=2.0)
SEQUENTIAL = dataclasses.replace(FAST, backfill_order="sequential")


def _count(message: object) -> int:
    return len(message) if isinstance(message, DocumentChanges) else 1


class Recorder:
    """A ConnectionListener that records and lets tests wait on what arrives."""

    def __init__(self) -> None:
        self.messages: list[Delivered] = []
        self.timeline: list[int | str] = []
        """In arrival order: the size of each hand-up of messages, or "notification"."""
        self.notifications: list[ClustermapChangeNotification] = []
        self.lost: list[ReplicatorError] = []
        self._cond = threading.Condition()

    def on_messages(self, connection: NodeConnection, messages: Sequence[Delivered]) -> None:
        with self._cond:
            self.messages.extend(messages)
            self.timeline.append(sum(_count(message) for message, _, _ in messages))
            self._cond.notify_all()

    @property
    def events(self) -> list[object]:
        """Every message handed up, data runs taken apart into typed events."""
        with self._cond:
            delivered = list(self.messages)
        expanded: list[object] = []
        for message, _, _ in delivered:
            if isinstance(message, DocumentChanges):
                expanded.extend(message.events())
            else:
                expanded.append(message)
        return expanded

    def on_cluster_map_notification(
        self, connection: NodeConnection, notification: ClustermapChangeNotification
    ) -> None:
        with self._cond:
            self.notifications.append(notification)
            self.timeline.append("notification")
            self._cond.notify_all()

    def on_connection_lost(self, connection: NodeConnection, error: ReplicatorError) -> None:
        with self._cond:
            self.lost.append(error)
            self._cond.notify_all()

    def wait(self, condition: Callable[[], bool], timeout: float = 5.0) -> None:
        with self._cond:
            assert self._cond.wait_for(condition, timeout), "condition not met in time"


@pytest.fixture
def peer() -> Iterator[ScriptedPeer]:
    with ScriptedPeer() as p:
        yield p


def connect(
    peer: ScriptedPeer,
    *,
    options: ConnectionOptions = FAST,
    credentials: Credentials = CREDENTIALS,
    bucket: str = "travel",
    tls: bool = False,
    listener: Recorder | None = None,
) -> NodeConnection:
    return NodeConnection(
        "127.0.0.1",
        peer.port,
        bucket=bucket,
        credentials=credentials,
        tls=tls,
        options=options,
        listener=listener,
    ).open()


def open_stream(connection: NodeConnection, session: PeerSession, vbucket: int = 0) -> int:
    request = StreamRequest(vbucket, 0, 2**64 - 1, 0, 0, 0)
    reply = connection.call(request)
    assert reply.status == Status.SUCCESS
    return session.stream_opaque(vbucket)


# --- handshake ---------------------------------------------------------------------------


def test_handshake_order_and_values(peer: ScriptedPeer) -> None:
    connection = connect(peer)
    try:
        session = peer.dcp_session()
        kinds = [type(m).__name__ for m in session.received]
        assert kinds[:7] == [
            "Hello",
            "SaslListMechs",
            "SaslAuth",
            "SaslStep",
            "SelectBucket",
            "GetClusterConfig",
            "DcpOpen",
        ]
        hello = session.of_kind(Hello)[0]
        assert hello.agent == connection.name
        service, _, unique = connection.name.partition(":")
        assert service == "replicator" and len(unique) == 32
        assert len(connection.name.encode()) <= 200
        for feature in (
            HelloFeature.XERROR,
            HelloFeature.SELECT_BUCKET,
            HelloFeature.JSON,
            HelloFeature.SNAPPY,
            HelloFeature.XATTR,
            HelloFeature.COLLECTIONS,
            HelloFeature.DUPLEX,
        ):
            assert feature in hello.features
        assert session.of_kind(SaslAuth)[0].mechanism == "SCRAM-SHA512"
        dcp_open = session.of_kind(DcpOpen)[0]
        assert dcp_open.name == connection.name
        assert dcp_open.flags == (
            DcpOpenFlags.PRODUCER | DcpOpenFlags.INCLUDE_XATTRS | DcpOpenFlags.INCLUDE_DELETE_TIMES
        )
        controls = [(c.key, c.value) for c in session.wait_for(DcpControl, count=6)]
        assert controls == [
            ("connection_buffer_size", str(10 * 1024 * 1024)),
            ("enable_noop", "true"),
            ("set_noop_interval", "120"),
            ("enable_expiry_opcode", "true"),
            ("send_stream_end_on_client_close_stream", "true"),
            ("max_marker_version", "2.2"),
        ]
        assert connection.collections and connection.purge_seqno_supported
        assert connection.stream_end_on_close
        assert b'"vBucketServerMap"' in connection.cluster_config
    finally:
        connection.close()


@pytest.mark.parametrize("refusal", [Status.EINVAL, Status.NOT_SUPPORTED, Status.UNKNOWN_COMMAND])
def test_optional_controls_refused_are_tolerated(refusal: Status) -> None:
    behaviour = PeerBehaviour(
        control_status={
            "enable_expiry_opcode": refusal,
            "send_stream_end_on_client_close_stream": refusal,
            "max_marker_version": refusal,
            "backfill_order": refusal,  # Couchbase before 6.6
        }
    )
    with ScriptedPeer(behaviour) as peer:
        connection = connect(peer, options=SEQUENTIAL)
        try:
            assert connection.accepted_controls == {
                "connection_buffer_size",
                "enable_noop",
                "set_noop_interval",
            }
            assert not connection.purge_seqno_supported
            assert not connection.stream_end_on_close
        finally:
            connection.close()


def test_required_control_refused_fails_the_handshake() -> None:
    with ScriptedPeer(PeerBehaviour(control_status={"enable_noop": Status.EINVAL})) as peer:
        with pytest.raises(ProtocolError, match="enable_noop=true refused: EINVAL") as caught:
            connect(peer)
        assert caught.value.opcode == Opcode.DCP_CONTROL


def test_no_marker_v2_2_without_collections() -> None:
    behaviour = PeerBehaviour(refuse_features=frozenset({HelloFeature.COLLECTIONS}))
    with ScriptedPeer(behaviour) as peer:
        connection = connect(peer)
        try:
            keys = [c.key for c in peer.session().wait_for(DcpControl, count=5)]
            assert "max_marker_version" not in keys
            assert not connection.collections
        finally:
            connection.close()


def test_configured_window_and_noop_interval_are_sent() -> None:
    options = ConnectionOptions(
        flow_control_window=4096, noop_interval=30, enable_expiry_opcode=False
    )
    with ScriptedPeer() as peer:
        connection = connect(peer, options=options)
        try:
            controls = {c.key: c.value for c in peer.session().wait_for(DcpControl, count=5)}
            assert controls["connection_buffer_size"] == "4096"
            assert controls["set_noop_interval"] == "30"
            assert "enable_expiry_opcode" not in controls
            assert "backfill_order" not in controls  # the producer's default unless asked
        finally:
            connection.close()


def test_a_backfill_order_asked_for_is_sent() -> None:
    with ScriptedPeer() as peer:
        connection = connect(peer, options=SEQUENTIAL)
        try:
            controls = {c.key: c.value for c in peer.session().wait_for(DcpControl, count=7)}
            assert controls["backfill_order"] == "sequential"
            assert "backfill_order" in connection.accepted_controls
        finally:
            connection.close()


def test_an_unknown_backfill_order_is_refused_before_connecting() -> None:
    with pytest.raises(ConfigError, match="backfill order must be one of round-robin, sequential"):
        ConnectionOptions(backfill_order="random")


# --- authentication and bucket -----------------------------------------------------------


def test_wrong_password_is_an_authentication_error_without_the_password(
    peer: ScriptedPeer,
) -> None:
    with pytest.raises(AuthenticationError) as caught:
        connect(peer, credentials=Credentials("dcp", "wrong-password-xyz"))
    text = str(caught.value)
    assert peer.address in text and "'dcp'" in text
    assert "wrong-password-xyz" not in text and PASSWORD not in text


def test_plain_only_server_is_refused_over_tcp_before_sending_the_password() -> None:
    with ScriptedPeer(PeerBehaviour(mechanisms=("PLAIN",))) as peer:
        with pytest.raises(ConfigError, match="clear over plain TCP") as caught:
            connect(peer)
        assert str(caught.value).startswith(f"{peer.address}: ")
        assert not peer.session().of_kind(SaslAuth)
        assert PASSWORD.encode() not in peer.session().raw_received


def test_plain_allowed_over_tcp_when_asked() -> None:
    with ScriptedPeer(PeerBehaviour(mechanisms=("PLAIN",))) as peer:
        options = ConnectionOptions(allow_plain_over_tcp=True, request_timeout=2.0)
        connect(peer, options=options).close()
        assert peer.session().of_kind(SaslAuth)[0].mechanism == "PLAIN"


@pytest.mark.parametrize("status", [None, Status.EACCESS])
def test_unknown_bucket_names_node_and_bucket(status: Status | None) -> None:
    with ScriptedPeer(PeerBehaviour(select_bucket_status=status)) as peer:
        with pytest.raises(BucketNotFoundError) as caught:
            connect(peer, bucket="nosuch")
        assert "'nosuch'" in str(caught.value) and peer.address in str(caught.value)


def test_connection_refused_is_node_unreachable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    connection = NodeConnection(
        "127.0.0.1", port, bucket="b", credentials=CREDENTIALS, options=FAST
    )
    with pytest.raises(NodeUnreachableError, match=f"127.0.0.1:{port}"):
        connection.open()


# --- TLS ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[TlsFiles, TlsFiles]:
    base = tmp_path_factory.mktemp("tls")
    return make_tls_files(base, "good"), make_tls_files(base, "other")


def test_tls_with_the_right_ca_works(tls_files: tuple[TlsFiles, TlsFiles]) -> None:
    good, _ = tls_files
    with ScriptedPeer(server_context=good.server_context()) as peer:
        options = ConnectionOptions(tls=TlsSettings(ca_file=str(good.ca_cert)), request_timeout=3.0)
        connection = connect(peer, tls=True, options=options)
        try:
            assert connection.is_open
            reply = connection.call(GetFailoverLog(0))
            assert failover_log_of(reply) == DEFAULT_FAILOVER_LOG
        finally:
            connection.close()


def test_tls_with_a_wrong_ca_is_a_tls_error(tls_files: tuple[TlsFiles, TlsFiles]) -> None:
    good, other = tls_files
    with ScriptedPeer(server_context=good.server_context()) as peer:
        options = ConnectionOptions(
            tls=TlsSettings(ca_file=str(other.ca_cert)), request_timeout=3.0
        )
        with pytest.raises(TlsError, match="not trusted") as caught:
            connect(peer, tls=True, options=options)
        assert caught.value.node == peer.address


def test_tls_to_a_plain_port_is_a_tls_error(
    peer: ScriptedPeer, tls_files: tuple[TlsFiles, TlsFiles]
) -> None:
    good, _ = tls_files
    options = ConnectionOptions(tls=TlsSettings(ca_file=str(good.ca_cert)), request_timeout=3.0)
    with pytest.raises(TlsError):
        connect(peer, tls=True, options=options)


def test_missing_ca_file_is_a_config_error(peer: ScriptedPeer, tmp_path: Path) -> None:
    options = ConnectionOptions(tls=TlsSettings(ca_file=str(tmp_path / "none.pem")))
    with pytest.raises(ConfigError, match="CA bundle"):
        connect(peer, tls=True, options=options)


# --- the I/O thread ----------------------------------------------------------------------


def test_requests_are_matched_by_opaque(peer: ScriptedPeer) -> None:
    connection = connect(peer)
    try:
        peer.behaviour.high_seqnos = {0: 12, 3: 40}
        first = connection.request(GetFailoverLog(0))
        second = connection.request(GetAllVbSeqnos())
        assert second.result(2).opcode == Opcode.GET_ALL_VB_SEQNOS
        assert first.result(2).opcode == Opcode.DCP_GET_FAILOVER_LOG
        assert first.result(2).opaque != second.result(2).opaque
    finally:
        connection.close()


def test_dcp_noop_is_answered_with_a_response_of_the_same_opaque(peer: ScriptedPeer) -> None:
    recorder = Recorder()
    connection = connect(peer, listener=recorder)
    try:
        session = peer.dcp_session()
        session.send_noop(opaque=0xFEED)
        reply = session.wait_for(Response)[0]
        assert (reply.opcode, reply.status, reply.opaque) == (
            Opcode.DCP_NOOP,
            Status.SUCCESS,
            0xFEED,
        )
        raw_reply = encode_frame(0x81, Opcode.DCP_NOOP, opaque=0xFEED)
        assert raw_reply in bytes(session.raw_received)
        assert recorder.messages == []  # noops are not handed up
        assert connection.flow_control.unacknowledged_bytes == 0  # nor counted
    finally:
        connection.close()


def test_messages_are_handed_up_in_order_and_counted(peer: ScriptedPeer) -> None:
    recorder = Recorder()
    connection = connect(peer, listener=recorder)
    try:
        session = peer.dcp_session()
        opaque = open_stream(connection, session)
        marker = SnapshotMarker(0, 1, 2, SnapshotFlags.MEMORY)
        mutation = Mutation(0, 2, 1, 5, 0, 0, 0, 0, b"k", b"{}", True)
        session.send_event(marker, opaque=opaque)
        session.send_noop()
        session.send_event(mutation, opaque=opaque)
        recorder.wait(lambda: len(recorder.events) == 2)
        assert recorder.events == [marker, mutation]
        assert all(frame_opaque == opaque for _, frame_opaque, _ in recorder.messages)
        total = sum(size for _, _, size in recorder.messages)
        assert connection.flow_control.unacknowledged_bytes == total
    finally:
        connection.close()


def test_the_messages_of_one_read_are_handed_up_at_once_split_at_other_frames(
    peer: ScriptedPeer,
) -> None:
    recorder = Recorder()
    connection = connect(peer, listener=recorder)
    try:
        session = peer.dcp_session()
        opaque = open_stream(connection, session)
        delivered_before = len(recorder.timeline)
        events = [SnapshotMarker(0, 1, 4, SnapshotFlags.MEMORY)] + [
            Mutation(0, seqno, 1, seqno, 0, 0, 0, 0, b"k%d" % seqno, b"{}", True)
            for seqno in range(1, 5)
        ]

        def wire(event: ProducerMessage) -> bytes:
            return encode_dcp_message(event, opaque=opaque, features=session.features)

        # One write: the marker, two mutations, a cluster-map push, two more mutations.
        push = encode_server_request(ClustermapChangeNotification("default", 9, 1, b""))
        session.send_raw(b"".join([*map(wire, events[:3]), push, *map(wire, events[3:])]))
        recorder.wait(lambda: len(recorder.events) == 5 and len(recorder.notifications) == 1)
        assert recorder.events == events
        # The push ends the run of data messages: the mutations before it and after it are
        # handed up as separate runs.
        runs = [m for m, _, _ in recorder.messages if isinstance(m, DocumentChanges)]
        assert [len(run) for run in runs] in ([2, 2], [1, 1, 2], [2, 1, 1], [1, 1, 1, 1])
        # Messages before the push go up before it; the rest after it, not one call each
        # (TCP may still split the write: at most two more calls then).
        timeline = recorder.timeline[delivered_before:]
        before_push = timeline[: timeline.index("notification")]
        assert before_push and all(isinstance(entry, int) for entry in before_push)
        assert sum(entry for entry in before_push if isinstance(entry, int)) == 3
        assert len(timeline) - 1 <= 4
        total = sum(size for _, _, size in recorder.messages)
        assert connection.flow_control.unacknowledged_bytes == total
    finally:
        connection.close()


def test_buffer_ack_sent_once_staged_bytes_reach_a_fifth_of_the_window() -> None:
    with ScriptedPeer() as peer:
        recorder = Recorder()
        options = ConnectionOptions(flow_control_window=1000, request_timeout=2.0)
        connection = connect(peer, options=options, listener=recorder)
        try:
            session = peer.dcp_session()
            opaque = open_stream(connection, session)
            mutations = [
                Mutation(0, seqno, 1, 1, 0, 0, 0, 0, b"k", b"x" * 40, False)
                for seqno in range(1, 6)
            ]
            for mutation in mutations:
                session.send_event(mutation, opaque=opaque)
            recorder.wait(lambda: len(recorder.events) == 5)
            sizes = [
                len(encode_dcp_message(m, opaque=opaque, features=session.features))
                for m in mutations
            ]
            assert sum(size for _, _, size in recorder.messages) == sum(sizes)
            assert connection.acknowledge(sizes[0]) == 0  # below 200 bytes
            assert connection.acknowledge(sizes[1] + sizes[2]) == sum(sizes[:3])
            acks = session.wait_for(BufferAck)
            assert [a.acked_bytes for a in acks] == [sum(sizes[:3])]
            assert connection.flow_control.unacknowledged_bytes == sum(sizes[3:])
        finally:
            connection.close()


def test_cluster_map_notification_is_handed_up(peer: ScriptedPeer) -> None:
    recorder = Recorder()
    connection = connect(peer, listener=recorder)
    try:
        session = peer.dcp_session()
        session.send_map_notification(b'{"rev": 7}', revision=7, epoch=2)
        recorder.wait(lambda: bool(recorder.notifications))
        notification = recorder.notifications[0]
        assert (notification.revision, notification.epoch, notification.config) == (
            7,
            2,
            b'{"rev": 7}',
        )
        assert notification.bucket == "travel"
    finally:
        connection.close()


def test_malformed_frame_closes_the_connection_and_nothing_after_it_is_handed_up(
    peer: ScriptedPeer,
) -> None:
    recorder = Recorder()
    connection = connect(peer, listener=recorder)
    session = peer.dcp_session()
    opaque = open_stream(connection, session)
    good = Mutation(0, 1, 1, 1, 0, 0, 0, 0, b"a", b"1", False)
    later = Mutation(0, 2, 1, 1, 0, 0, 0, 0, b"b", b"2", False)
    session.send_event(good, opaque=opaque)
    recorder.wait(lambda: len(recorder.messages) == 1)
    # A mutation whose extras are 3 bytes short, then a valid one, in a single write.
    bad = encode_frame(0x80, Opcode.DCP_MUTATION, opaque=opaque, extras=b"\0" * 28, key=b"\0x")
    session.send_raw(bad + encode_dcp_message(later, opaque=opaque, features=session.features))
    recorder.wait(lambda: bool(recorder.lost))
    error = recorder.lost[0]
    assert isinstance(error, ProtocolError)
    assert error.opcode == Opcode.DCP_MUTATION
    assert recorder.events == [good]
    assert not connection.is_open and connection.failure is error
    session.closed.wait(5)
    assert session.closed.is_set()  # the socket was closed too
    with pytest.raises(ConnectionLostError):
        connection.request(GetFailoverLog(0))


def test_bad_magic_is_a_protocol_error(peer: ScriptedPeer) -> None:
    recorder = Recorder()
    connection = connect(peer, listener=recorder)
    try:
        peer.dcp_session().send_raw(b"\x42" + b"\0" * 23)
        recorder.wait(lambda: bool(recorder.lost))
        assert isinstance(recorder.lost[0], ProtocolError)
        assert "bad magic" in str(recorder.lost[0])
    finally:
        connection.close()


def test_peer_closing_is_a_lost_connection_and_pending_requests_fail(peer: ScriptedPeer) -> None:
    recorder = Recorder()
    behaviour = peer.behaviour
    behaviour.on_stream_request = lambda session, request: None  # never answered
    connection = connect(peer, listener=recorder)
    pending = connection.request(StreamRequest(1, 0, 10, 0, 0, 0))
    peer.dcp_session().wait_for(StreamRequest)
    peer.session().close()
    recorder.wait(lambda: bool(recorder.lost))
    assert isinstance(recorder.lost[0], ConnectionLostError)
    with pytest.raises(ConnectionLostError):
        pending.result(2)


# --- dead connections --------------------------------------------------------------------


def test_silence_for_two_noop_intervals_is_a_dead_connection(peer: ScriptedPeer) -> None:
    recorder = Recorder()
    options = ConnectionOptions(dead_connection_timeout=0.4, request_timeout=2.0)
    connection = connect(peer, options=options, listener=recorder)
    open_stream(connection, peer.dcp_session())  # a stream is open: the producer owes noops
    recorder.wait(lambda: bool(recorder.lost), timeout=5.0)
    assert isinstance(recorder.lost[0], ConnectionLostError)
    assert "presumed dead" in str(recorder.lost[0])
    assert not peer.session().of_kind(Noop)  # no client probe while a stream is open


def test_noops_keep_a_streaming_connection_alive(peer: ScriptedPeer) -> None:
    recorder = Recorder()
    options = ConnectionOptions(dead_connection_timeout=0.6, request_timeout=2.0)
    connection = connect(peer, options=options, listener=recorder)
    try:
        session = peer.dcp_session()
        open_stream(connection, session)
        for _ in range(13):  # 13 x 0.1 s: over twice the timeout
            session.send_noop()
            time.sleep(0.1)  # pacing the producer's noops, not waiting for a result
        assert not recorder.lost and connection.is_open
    finally:
        connection.close()


def test_idle_connection_without_streams_is_probed_with_client_noops(peer: ScriptedPeer) -> None:
    recorder = Recorder()
    options = ConnectionOptions(dead_connection_timeout=0.4, request_timeout=2.0)
    connection = connect(peer, options=options, listener=recorder)
    try:
        session = peer.dcp_session()
        session.wait_for(Noop, count=3, timeout=5.0)  # the peer answers each probe
        assert not recorder.lost and connection.is_open
    finally:
        connection.close()


def test_unanswered_probes_end_in_a_dead_connection() -> None:
    with ScriptedPeer(PeerBehaviour(answer_noops=False)) as peer:
        recorder = Recorder()
        options = ConnectionOptions(dead_connection_timeout=0.4, request_timeout=2.0)
        connect(peer, options=options, listener=recorder)
        recorder.wait(lambda: bool(recorder.lost), timeout=5.0)
        assert isinstance(recorder.lost[0], ConnectionLostError)
        assert peer.session().of_kind(Noop)  # it did probe


def test_stream_end_stops_counting_the_stream_as_open(peer: ScriptedPeer) -> None:
    recorder = Recorder()
    options = ConnectionOptions(dead_connection_timeout=0.4, request_timeout=2.0)
    connection = connect(peer, options=options, listener=recorder)
    try:
        session = peer.dcp_session()
        opaque = open_stream(connection, session)
        session.send_event(StreamEnd(0, StreamEndReason.OK), opaque=opaque)
        session.wait_for(Noop, timeout=5.0)  # no stream open any more: probes start
        assert not recorder.lost
    finally:
        connection.close()


def test_options_validation() -> None:
    with pytest.raises(ConfigError):
        ConnectionOptions(service_name="a:b")
    with pytest.raises(ConfigError):
        ConnectionOptions(service_name="x" * 190)
    with pytest.raises(ConfigError):
        ConnectionOptions(noop_interval=0)
    with pytest.raises(ConfigError):
        ConnectionOptions(flow_control_window=0)
    assert ConnectionOptions(noop_interval=30).dead_after == 60.0


def test_the_password_never_reaches_the_logs(
    peer: ScriptedPeer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    connect(peer).close()
    with pytest.raises(AuthenticationError):
        connect(peer, credentials=Credentials("dcp", "another-secret-9"))
    with ScriptedPeer(PeerBehaviour(mechanisms=("PLAIN",))) as plain_peer:
        options = ConnectionOptions(allow_plain_over_tcp=True, request_timeout=2.0)
        connect(plain_peer, options=options).close()
    assert caplog.records  # something was logged at all
    assert PASSWORD not in caplog.text and "another-secret-9" not in caplog.text
