"""One client connection of a simulated node: a `Session`, served by its own thread.

A session is a single-threaded loop over a non-blocking socket: it reads requests and has its
`CommandProcessor` (replicator.sim.commands) answer them in order, then fills the socket with
stream data as DCP flow control allows, sends noops when idle and drops a consumer that leaves a
noop unanswered. Other threads (the bucket's writers, the cluster's fault injection) never touch
a session's state: they post an action and wake the loop.

Over 500 lines on purpose, for now: the loop, its serving turn and its flow control share one
socket's state; the commands are already apart. The serving turn (`_fill`, `_serve_ready`) is
the seam to split along next.
"""

from __future__ import annotations

import logging
import selectors
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from contextlib import suppress
from typing import TYPE_CHECKING, Protocol

from replicator.dcp.protocol.codec import encode_dcp_message
from replicator.dcp.protocol.dcp_messages import DcpNoop
from replicator.dcp.protocol.events import StreamEndReason
from replicator.dcp.protocol.frame import Frame, FrameReader
from replicator.dcp.protocol.opcodes import HelloFeature, Magic, Opcode
from replicator.dcp.protocol.pushes import ClustermapChangeNotification, encode_server_request
from replicator.errors import ProtocolError
from replicator.sim.commands.processor import CommandProcessor
from replicator.sim.faults import DOCUMENT_OPCODES, MalformedFrame, SendRateLimit

if TYPE_CHECKING:
    from replicator.sim.commands.state import DcpState
    from replicator.sim.node_context import ClusterContext

log = logging.getLogger(__name__)

_READ_CHUNK = 256 * 1024


class SessionHost(Protocol):
    """What a session needs of the node that accepted it (a NodeServer): the node's fault
    settings, read on each use since a test may change them mid-session, and its registry of
    sessions and DCP names."""

    cluster: ClusterContext
    index: int
    stalled: bool
    send_rate: int | None
    refused_opcodes: frozenset[int]
    malformed_documents: MalformedFrame | None

    def forget(self, session: Session) -> None: ...

    def claim_dcp_name(self, name: str, session: Session) -> None: ...


class _ConnectionClosed(Exception):
    """The peer went away or the session decided to drop it."""


class Session:
    """One client connection of a simulated node, served by its own thread.

    Public methods are safe to call from any thread; they post work to the session's loop.
    """

    def __init__(self, node: SessionHost, sock: socket.socket, peer: str, *, tls: bool) -> None:
        self.node = node
        self.peer = peer
        self.tls = tls
        self._sock = sock
        self._cluster = node.cluster
        self._options = node.cluster.options
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._wake_pending = False
        self._actions: deque[Callable[[], None]] = deque()
        self._changed: set[int] = set()
        self._changed_lock = threading.Lock()
        self._stream_vbuckets: frozenset[int] = frozenset()
        self._closing = False
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"sim-session-{peer}", daemon=True)
        # Loop-owned state.
        self._reader = FrameReader()
        self._out = bytearray()
        self._out_pos = 0
        self._last_send = time.monotonic()
        self._commands = CommandProcessor(node.cluster, node.index, self)
        self._noop_outstanding = False
        self._noop_sent_at = 0.0
        self._noop_opaque = 0
        self._stalled = False
        self._rate: SendRateLimit | None = SendRateLimit(node.send_rate) if node.send_rate else None
        self._malformed: MalformedFrame | None = node.malformed_documents
        self._malformed_documents_only = self._malformed is not None
        """The pending corruption waits for a mutation, deletion or expiration."""
        self._want_write = False
        self._selector: selectors.BaseSelector | None = None
        self._sock_registered = False

    @property
    def dcp_name(self) -> str | None:
        """The DCP connection name once DCP_OPEN succeeded."""
        dcp = self._commands.dcp
        return dcp.name if dcp is not None else None

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def start(self) -> None:
        self._thread.start()

    def close(self, *, wait: bool = True, timeout: float = 5.0) -> None:
        """Drop the connection; with `wait`, return once the socket is closed."""
        self._closing = True
        self._wake()
        if wait and threading.current_thread() is not self._thread:
            self._closed.wait(timeout)

    def wait_closed(self, timeout: float) -> bool:
        """Block until the session ended or `timeout` seconds passed; True if it ended."""
        return self._closed.wait(timeout)

    def notify_changed(self, vbuckets: frozenset[int]) -> None:
        """Called from the bucket's writers: these vbuckets have new history."""
        if not vbuckets & self._stream_vbuckets:
            return
        with self._changed_lock:
            self._changed |= vbuckets
        self._wake()

    def post(self, action: Callable[[Session], None]) -> None:
        """Run `action(self)` on the session's loop."""
        self._actions.append(lambda: action(self))
        self._wake()

    def end_streams(self, vbuckets: Iterable[int], reason: StreamEndReason) -> None:
        """End the open streams of these vbuckets with STREAM_END `reason`."""
        targets = frozenset(vbuckets)
        self.post(lambda s: s._end_streams(targets, reason))

    def set_stalled(self, stalled: bool) -> None:
        """Stop (or resume) sending anything at all: no data, no responses, no noops."""
        self.post(lambda s: s._set_stalled(stalled))

    def set_send_rate(self, bytes_per_second: int | None) -> None:
        """Cap (or uncap, with None) how fast this connection sends."""
        self.post(lambda s: s._set_rate(bytes_per_second))

    def inject_malformed(self, kind: MalformedFrame) -> None:
        """Break the next DCP message this connection sends in the way `kind` says."""
        self.post(lambda s: s._set_malformed(kind))

    def push_cluster_map(self) -> None:
        """Send a cluster-map change notification if the client asked for them."""
        self.post(lambda s: s._push_cluster_map())

    def _wake(self) -> None:
        if self._wake_pending:
            return
        self._wake_pending = True
        # A full pipe means a wake is pending anyway; a closed one, that the session is over.
        with suppress(OSError):
            self._wake_w.send(b"\x00")

    def _run(self) -> None:
        try:
            self._prepare_socket()
            self._loop()
        except (_ConnectionClosed, OSError, ssl.SSLError) as exc:
            log.debug("session %s ended: %s", self.peer, exc)
        except Exception:
            log.exception("session %s failed", self.peer)
        finally:
            self._shutdown()

    def _prepare_socket(self) -> None:
        sock = self._sock
        if self.tls:
            assert isinstance(sock, ssl.SSLSocket)
            sock.settimeout(self._options.handshake_timeout_s)
            sock.do_handshake()
        sock.setblocking(False)
        with suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ)
        selector.register(sock, selectors.EVENT_READ)
        self._selector = selector
        self._sock_registered = True
        if self.node.stalled:
            self._set_stalled(True)

    def _loop(self) -> None:
        selector = self._selector
        assert selector is not None
        while True:
            timeout = self._timeout()
            for key, mask in selector.select(timeout):
                if key.fileobj is self._wake_r:
                    self._drain_wake()
                elif mask & selectors.EVENT_READ:
                    self._read()
            self._run_actions()
            if self._closing:
                raise _ConnectionClosed("closed by the server")
            if self._stalled:
                continue
            if isinstance(self._sock, ssl.SSLSocket) and self._sock.pending():
                self._read()
            self._take_changes()
            self._check_noop()
            self._fill()
            self._flush()

    def _timeout(self) -> float | None:
        if self._closing:
            return 0.0
        if self._stalled:
            return None
        if self._tls_pending():
            return 0.0
        deadlines: list[float] = []
        now = time.monotonic()
        dcp = self._commands.dcp
        if dcp is not None and dcp.any_stream_opened and dcp.settings.noop_enabled:
            interval = dcp.settings.noop_interval_s * self._options.noop_time_scale
            if self._noop_outstanding:
                deadlines.append(self._noop_sent_at + interval)
            else:
                deadlines.append(self._last_send + interval)
        if self._rate is not None and self._out_pos < len(self._out):
            deadlines.append(now + self._rate.wait_time(len(self._out) - self._out_pos))
        if dcp is not None and dcp.ready and not self._output_full() and not self._window_full():
            return 0.0
        if not deadlines:
            return None
        return max(0.0, min(deadlines) - now)

    def _tls_pending(self) -> bool:
        return isinstance(self._sock, ssl.SSLSocket) and self._sock.pending() > 0

    def _drain_wake(self) -> None:
        # Drain first, then clear the flag: a wake posted in between finds the flag still set
        # and sends nothing, but its work is queued before it and this loop turn takes it.
        with suppress(OSError):
            while self._wake_r.recv(4096):
                pass
        self._wake_pending = False

    def _run_actions(self) -> None:
        while self._actions:
            self._actions.popleft()()

    def _shutdown(self) -> None:
        dcp = self._commands.dcp
        if dcp is not None:
            for stream in dcp.streams.values():
                stream.drop()
            dcp.clear_streams()
        if self._selector is not None:
            self._selector.close()
        for sock in (self._sock, self._wake_r, self._wake_w):
            with suppress(OSError):
                sock.close()
        self.node.forget(self)
        self._closed.set()

    def _read(self) -> None:
        sock = self._sock
        while True:
            try:
                data = sock.recv(_READ_CHUNK)
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return
            except InterruptedError:
                continue
            if not data:
                raise _ConnectionClosed("peer closed the connection")
            try:
                frames = self._reader.feed(data)
            except ProtocolError as exc:
                raise _ConnectionClosed(f"malformed frame from the client: {exc}") from None
            for frame in frames:
                self._handle(frame)
                if self._closing:
                    return
            if len(data) < _READ_CHUNK and not self._tls_pending():
                return

    def _handle(self, frame: Frame) -> None:
        magic = frame.magic
        if magic == Magic.RESPONSE or magic == Magic.FLEX_RESPONSE:
            if frame.opcode == Opcode.DCP_NOOP and frame.opaque == self._noop_opaque:
                self._noop_outstanding = False
            return  # replies to anything else we sent need no action
        if magic == Magic.SERVER_RESPONSE:
            return  # a reply to a cluster-map notification: dropped, as kv_engine does
        if magic == Magic.SERVER_REQUEST:
            raise _ConnectionClosed("client sent a server-only magic 0x82")
        self._commands.refused_opcodes = self.node.refused_opcodes
        self._commands.handle(frame)

    def queue(self, data: bytes) -> None:
        """Append to what goes out next (ConnectionHooks; loop thread only)."""
        self._out += data

    def claim_dcp_name(self, name: str) -> None:
        """ConnectionHooks: an older connection with this DCP name is closed."""
        self.node.claim_dcp_name(name, self)

    def streams_changed(self) -> None:
        """ConnectionHooks: refresh the vbuckets the bucket's writers should wake us for."""
        dcp = self._commands.dcp
        self._stream_vbuckets = dcp.vbuckets() if dcp is not None else frozenset()

    def _output_full(self) -> bool:
        return len(self._out) - self._out_pos >= self._options.batch_bytes

    def _window_full(self) -> bool:
        dcp = self._commands.dcp
        return (
            dcp is not None
            and dcp.settings.buffer_size > 0
            and dcp.unacked_bytes >= dcp.settings.buffer_size
        )

    def _flush(self) -> None:
        pending = len(self._out) - self._out_pos
        if pending <= 0:
            self._set_want_write(False)
            return
        limit = pending
        if self._rate is not None:
            limit = min(limit, self._rate.allowance())
            if limit <= 0:
                return
        view = memoryview(self._out)[self._out_pos : self._out_pos + limit]
        try:
            sent = self._sock.send(view)
        except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
            sent = 0
        finally:
            view.release()
        if sent:
            self._out_pos += sent
            self._last_send = time.monotonic()
            if self._rate is not None:
                self._rate.spend(sent)
        if self._out_pos >= len(self._out):
            self._out.clear()
            self._out_pos = 0
            self._set_want_write(False)
        else:
            if self._out_pos > (1 << 20):
                del self._out[: self._out_pos]
                self._out_pos = 0
            self._set_want_write(self._rate is None or limit == pending)

    def _set_want_write(self, wanted: bool) -> None:
        if wanted == self._want_write or self._selector is None or not self._sock_registered:
            return
        self._want_write = wanted
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if wanted else 0)
        self._selector.modify(self._sock, events)

    def _take_changes(self) -> None:
        dcp = self._commands.dcp
        if dcp is None:
            return
        with self._changed_lock:
            changed, self._changed = self._changed, set()
        for vb in changed:
            for key in dcp.keys_of(vb):
                dcp.mark_ready(key)

    def _fill(self) -> None:
        """Queue stream frames until the batch is full, the window closes or nothing is ready."""
        dcp = self._commands.dcp
        if dcp is None or not dcp.ready:
            return
        budget = self._options.batch_bytes - (len(self._out) - self._out_pos)
        # One hold of the bucket's lock for the whole turn (the cursors take it again,
        # re-entrantly): taken stream by stream, the session waited for the workload's batches
        # most of its time at 20,000 writes/s.
        with self._cluster.bucket.condition:
            changed_streams = self._serve_ready(dcp, budget)
        if changed_streams:
            self.streams_changed()

    def _serve_ready(self, dcp: DcpState, budget: int) -> bool:
        """Queue the ready streams' frames into `budget` bytes, round-robin; whether streams
        finished and were removed."""
        window = dcp.settings.buffer_size
        per_pull = self._options.items_per_pull
        ready = dcp.ready
        changed_streams = False
        while budget > 0 and ready:
            if window and dcp.unacked_bytes >= window:
                break  # paused until a BUFFER_ACK frees room, as a real producer is
            key = ready[0]
            stream = dcp.streams.get(key)
            if stream is None:
                dcp.pop_ready()
                continue
            # A backfill waiting for its turn leaves `ready` until it comes.
            if not (stream.pending or (dcp.backfill_turn(key, stream) and stream.pull(per_pull))):
                dcp.pop_ready()
                if stream.finished:
                    dcp.remove_stream(key)
                    changed_streams = True
                continue
            pending = stream.pending
            moved = 0
            while pending and budget > 0 and moved < per_pull:
                if window and dcp.unacked_bytes >= window:
                    break
                frame = pending.popleft()
                if (
                    self._malformed is not None
                    and (frame[1] in DOCUMENT_OPCODES or not self._malformed_documents_only)
                    and self._malformed.applies_to(
                        frame, collections=HelloFeature.COLLECTIONS in self._commands.features
                    )
                ):
                    frame = self._malformed.corrupt(frame)
                    self._malformed = None
                self._out += frame
                size = len(frame)
                budget -= size
                dcp.unacked_bytes += size
                moved += 1
            if not pending and stream.finished:
                dcp.pop_ready()
                dcp.remove_stream(key)
                changed_streams = True
            else:
                ready.rotate(-1)
                dcp.served(key)
        return changed_streams

    def _check_noop(self) -> None:
        dcp = self._commands.dcp
        if dcp is None or not dcp.any_stream_opened or not dcp.settings.noop_enabled:
            return
        now = time.monotonic()
        interval = dcp.settings.noop_interval_s * self._options.noop_time_scale
        if self._noop_outstanding:
            if now - self._noop_sent_at >= interval:
                raise _ConnectionClosed("noop left unanswered for a whole interval")
            return
        if now - self._last_send >= interval:
            self._noop_opaque = (self._noop_opaque + 1) & 0xFFFFFFFF
            # Noops bypass flow control and are not counted in it.
            self.queue(encode_dcp_message(DcpNoop(self._noop_opaque)))
            self._noop_outstanding = True
            self._noop_sent_at = now
            self._last_send = now

    def _end_streams(self, vbuckets: frozenset[int], reason: StreamEndReason) -> None:
        dcp = self._commands.dcp
        if dcp is None:
            return
        for vb in vbuckets:
            for key in dcp.keys_of(vb):
                stream = dcp.streams[key]
                if not stream.finished:
                    stream.end(reason)
                    dcp.mark_ready(key)

    def _set_stalled(self, stalled: bool) -> None:
        if stalled == self._stalled or self._selector is None:
            self._stalled = stalled
            return
        self._stalled = stalled
        if stalled:
            self._selector.unregister(self._sock)
            self._sock_registered = False
            self._want_write = False
        else:
            self._selector.register(self._sock, selectors.EVENT_READ)
            self._sock_registered = True
            self._last_send = time.monotonic()  # the stall is not the client's silence

    def _set_rate(self, bytes_per_second: int | None) -> None:
        self._rate = SendRateLimit(bytes_per_second) if bytes_per_second else None

    def _set_malformed(self, kind: MalformedFrame, *, documents_only: bool = False) -> None:
        self._malformed = kind
        self._malformed_documents_only = documents_only

    def _push_cluster_map(self) -> None:
        commands = self._commands
        kind = commands.clustermap_notifications
        if kind is None or not commands.bucket_selected:
            return
        epoch, revision = self._cluster.config_revision()
        # A brief notification names the version only; the client fetches the map itself.
        config = b"" if kind == "brief" else self._cluster.config_json(self.node.index)
        if config:
            commands.config_sent(epoch, revision)
        notification = ClustermapChangeNotification(
            self._cluster.bucket.name, revision, epoch, config
        )
        self.queue(encode_server_request(notification))
