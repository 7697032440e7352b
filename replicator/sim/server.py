"""The embedded producer's wire half: one TCP server per simulated node, one session per client.

A `NodeServer` listens on 127.0.0.1 (plain, and TLS when given a context) and runs each
accepted connection as a `Session` (replicator.sim.session) on its own thread; it also carries
the node's faults (stalls, send rates, malformed frames) to its sessions, present and future.
"""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterable
from contextlib import suppress

from replicator.dcp.protocol.events import StreamEndReason
from replicator.sim.faults import MalformedFrame
from replicator.sim.node_context import SERVER_VERSION, ClusterContext, ServerOptions
from replicator.sim.session import Session

__all__ = ["SERVER_VERSION", "ClusterContext", "NodeServer", "ServerOptions"]


class NodeServer:
    """One simulated node: listens on a plain port (and a TLS port), runs a Session per client.

    `port=0` picks an ephemeral port; `restart()` keeps the ports the node had.
    """

    def __init__(
        self,
        cluster: ClusterContext,
        index: int,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        tls_context: ssl.SSLContext | None = None,
        tls_port: int = 0,
    ) -> None:
        self.cluster = cluster
        self.index = index
        self.host = host
        self._requested_port = port
        self._requested_tls_port = tls_port
        self._tls_context = tls_context
        self._lock = threading.Lock()
        self._sessions: set[Session] = set()
        self._dcp_names: dict[str, Session] = {}
        self._listeners: list[tuple[socket.socket, bool, threading.Thread]] = []
        self._port: int | None = None
        self._tls_port: int | None = None
        self._running = False
        self.stalled = False
        """New and existing connections send nothing while set (see `stall`)."""
        self.send_rate: int | None = cluster.options.send_rate_bytes_per_second
        """Bytes per second every connection may send (None: no cap)."""
        self.refused_opcodes: frozenset[int] = frozenset()
        """Requests every connection answers UNKNOWN_COMMAND (see SimCluster.refuse_commands)."""
        self.malformed_documents: MalformedFrame | None = None
        """Break the first document message of every connection, present and future (see
        SimCluster.always_send_malformed)."""

    @property
    def port(self) -> int:
        """The plain (non-TLS) data-service port; valid once started."""
        if self._port is None:
            raise RuntimeError(f"node {self.index} is not started")
        return self._port

    @property
    def tls_port(self) -> int | None:
        """The TLS data-service port, None when the node serves no TLS."""
        return self._tls_port

    @property
    def running(self) -> bool:
        return self._running

    def start(self) -> None:
        """Bind the listening sockets and start accepting."""
        if self._running:
            return
        self._running = True  # before listening: the accept loops check it
        try:
            port = self._port if self._port is not None else self._requested_port
            self._port = self._listen(port, tls=False)
            if self._tls_context is not None:
                tls_port = (
                    self._tls_port if self._tls_port is not None else self._requested_tls_port
                )
                self._tls_port = self._listen(tls_port, tls=True)
        except OSError:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop listening and drop every connection (ports are kept for a restart)."""
        self._running = False
        listeners, self._listeners = self._listeners, []
        for sock, _tls, _thread in listeners:
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with suppress(OSError):
                sock.close()
        for _sock, _tls, thread in listeners:
            thread.join(timeout=5.0)
        self.drop_connections()

    def restart(self) -> None:
        """Drop every connection and listen again on the same ports."""
        self.stop()
        self.start()

    def sessions(self) -> list[Session]:
        """The live sessions, in no particular order."""
        with self._lock:
            return [s for s in self._sessions if not s.closed]

    def stall(self) -> None:
        """Stall every connection, present and future: no data, no responses, no noops."""
        self.stalled = True
        for session in self.sessions():
            session.set_stalled(True)

    def release(self) -> None:
        """End a stall: connections carry on where they stopped."""
        self.stalled = False
        for session in self.sessions():
            session.set_stalled(False)

    def set_send_rate(self, bytes_per_second: int | None) -> None:
        """Cap how fast each connection sends, present and future (None lifts the cap)."""
        if bytes_per_second is not None and bytes_per_second < 1:
            raise ValueError(f"send rate must be positive, got {bytes_per_second}")
        self.send_rate = bytes_per_second
        for session in self.sessions():
            session.set_send_rate(bytes_per_second)

    def end_streams(self, reason: StreamEndReason, vbuckets: Iterable[int] | None = None) -> None:
        """End the open streams of these vbuckets (all by default) with STREAM_END `reason`."""
        for session in self.sessions():
            session.end_streams(
                range(self.cluster.bucket.num_vbuckets) if vbuckets is None else vbuckets, reason
            )

    def inject_malformed_documents(self, kind: MalformedFrame) -> None:
        """Break the next document message of every open connection."""
        for session in self.sessions():
            session.post(lambda s: s._set_malformed(kind, documents_only=True))

    def inject_malformed(self, kind: MalformedFrame) -> int:
        """Break the next DCP message of every open DCP connection; returns how many."""
        targets = [s for s in self.sessions() if s.dcp_name is not None]
        for session in targets:
            session.inject_malformed(kind)
        return len(targets)

    def drop_connections(self) -> None:
        """Close every connection of this node now."""
        for session in self.sessions():
            session.close(wait=False)
        for session in self.sessions():
            session.wait_closed(5.0)

    def _listen(self, port: int, *, tls: bool) -> int:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, port))
            sock.listen(128)
        except OSError:
            sock.close()
            raise
        bound = int(sock.getsockname()[1])
        thread = threading.Thread(
            target=self._accept_loop,
            args=(sock, tls),
            name=f"sim-node{self.index}-{'tls' if tls else 'tcp'}-{bound}",
            daemon=True,
        )
        self._listeners.append((sock, tls, thread))
        thread.start()
        return bound

    def _accept_loop(self, listener: socket.socket, tls: bool) -> None:
        while True:
            try:
                conn, address = listener.accept()
            except OSError:
                return  # the listener was shut down
            if not self._running:
                conn.close()
                return
            peer = f"{address[0]}:{address[1]}"
            sock: socket.socket = conn
            if tls:
                assert self._tls_context is not None
                try:
                    sock = self._tls_context.wrap_socket(
                        conn, server_side=True, do_handshake_on_connect=False
                    )
                except (OSError, ssl.SSLError):
                    conn.close()
                    continue
            session = Session(self, sock, peer, tls=tls)
            with self._lock:
                self._sessions.add(session)
            session.start()

    def forget(self, session: Session) -> None:
        with self._lock:
            self._sessions.discard(session)
            name = session.dcp_name
            if name is not None and self._dcp_names.get(name) is session:
                del self._dcp_names[name]

    def claim_dcp_name(self, name: str, session: Session) -> None:
        """kv_engine closes an older connection that used the same DCP name."""
        with self._lock:
            previous = self._dcp_names.get(name)
            self._dcp_names[name] = session
        if previous is not None and previous is not session:
            previous.close(wait=False)
