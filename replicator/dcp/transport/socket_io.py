"""The socket of one node connection: connecting (TCP, then TLS), non-blocking reads and
writes for the I/O thread, and the pipe that wakes that thread when another one queues bytes.

Only the connection's I/O thread reads and writes once it runs (a TLS socket is never used
from two threads at once); other threads only queue bytes and wake it. OS and TLS failures
come out as the project's errors, naming the node.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections import deque

from replicator.dcp.transport.options import ConnectionOptions
from replicator.errors import ConnectionLostError, NodeUnreachableError, TlsError

READ_CHUNK = 256 * 1024



def format_address(host: str, port: int) -> str:
    """`host:port`, bracketing an IPv6 host."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class NodeSocket:
    """The socket to `address`, its queue of bytes to send, and the wake-up pipe.

    `lock` is the connection's: it guards the queue together with the connection's requests
    in flight, so a request is registered and its bytes queued as one.
    """

    def __init__(
        self,
        host: str,
        port: int,
        address: str,
        *,
        tls: bool,
        options: ConnectionOptions,
        lock: threading.Lock,
    ) -> None:
        self.host = host
        self.port = port
        self.address = address
        self.tls = tls
        self.options = options
        self.sock: socket.socket | None = None
        """The connected socket; blocking during the handshake, non-blocking after."""
        self._lock = lock
        self._outbound: deque[bytes] = deque()
        self._send_buffer = bytearray()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)

    @property
    def wake_reader(self) -> socket.socket:
        """The end of the wake-up pipe the I/O thread's selector watches."""
        return self._wake_r

    def connect(self) -> socket.socket:
        """Connect (and wrap in TLS when asked); the socket stays blocking for the handshake."""
        timeout = self.options.connect_timeout
        try:
            sock = socket.create_connection((self.host, self.port), timeout=timeout)
        except OSError as exc:
            raise NodeUnreachableError(
                self.address, f"cannot connect within {timeout:g} s: {os_reason(exc)}"
            ) from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if not self.tls:
            self.sock = sock
            return sock
        context = self.options.tls.context()
        try:
            self.sock = context.wrap_socket(sock, server_hostname=self.host)
            return self.sock
        except ssl.SSLCertVerificationError as exc:
            sock.close()
            raise TlsError(
                self.address, f"certificate not trusted: {exc.verify_message or exc.reason}"
            ) from None
        except (ssl.SSLError, OSError) as exc:
            sock.close()
            raise TlsError(self.address, f"TLS handshake failed: {os_reason(exc)}") from None

    def receive(self) -> bytes | None:
        """One non-blocking read: the bytes, or None when nothing is waiting."""
        sock = self.sock
        assert sock is not None
        while True:
            try:
                data = sock.recv(READ_CHUNK)
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return None
            except InterruptedError:
                continue
            except OSError as exc:
                raise ConnectionLostError(self.address, f"read failed: {os_reason(exc)}") from None
            if not data:
                raise ConnectionLostError(self.address, "the node closed the connection")
            return data

    def queue(self, data: bytes) -> None:
        """Queue bytes for the I/O thread to send (the caller holds the connection's lock)."""
        self._outbound.append(data)

    def flush(self) -> bool:
        """Send queued bytes; True when the socket would block (wait for writability)."""
        sock = self.sock
        assert sock is not None
        with self._lock:
            while self._outbound:
                self._send_buffer += self._outbound.popleft()
        while self._send_buffer:
            try:
                sent = sock.send(self._send_buffer)
            except (BlockingIOError, ssl.SSLWantWriteError):
                return True
            except ssl.SSLWantReadError:
                return False
            except InterruptedError:
                continue
            except OSError as exc:
                raise ConnectionLostError(self.address, f"write failed: {os_reason(exc)}") from None
            del self._send_buffer[:sent]
        return False

    def wake(self) -> None:
        """Wake the I/O thread's selector."""
        with contextlib.suppress(OSError):  # a full wake pipe already wakes the loop
            self._wake_w.send(b"\x00")

    def drain_wake(self) -> None:
        with contextlib.suppress(OSError):
            while self._wake_r.recv(4096):
                pass

    def close(self) -> None:
        """Shut the socket down and close it and the wake-up pipe."""
        sock = self.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()
        for end in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                end.close()


def os_reason(exc: BaseException) -> str:
    """The OS's words for a socket error, without errno noise."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__
