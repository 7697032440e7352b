"""DCP connection flow control: byte accounting and when to send BUFFER_ACK. Pure, no I/O.

The producer stops sending once the bytes it sent minus the bytes we acknowledged reach the
window (`connection_buffer_size`). We acknowledge a message only once the layer above has staged
it (not on receipt), so delivered-but-unstaged data stays bounded by the window, and never hold
acks until a Delta commit (a first backfill is one snapshot larger than any window: holding
acks would deadlock; spec/NOTES.md section 4).
"""

from __future__ import annotations

import threading

DEFAULT_WINDOW_BYTES = 10 * 1024 * 1024
DEFAULT_ACK_RATIO = 0.2
"""Acknowledge once this share of the window is ack-able (kv_engine's recommendation)."""


class FlowControl:
    """Per-connection accounting. Thread-safe: the reader counts, the layer above stages.

    >>> fc = FlowControl(window_bytes=1000)
    >>> fc.received(300); fc.staged(150)
    0
    >>> fc.staged(150)  # 300 bytes >= 20% of 1000: acknowledge them
    300
    """

    def __init__(
        self, *, window_bytes: int = DEFAULT_WINDOW_BYTES, ack_ratio: float = DEFAULT_ACK_RATIO
    ) -> None:
        if window_bytes < 1 or window_bytes > 0xFFFFFFFF:
            raise ValueError(f"flow-control window must be 1..2^32-1 bytes, not {window_bytes}")
        if not 0.0 < ack_ratio <= 1.0:
            raise ValueError(f"ack ratio must be in (0, 1], not {ack_ratio}")
        self._window = window_bytes
        self._threshold = max(1, int(window_bytes * ack_ratio))
        self._lock = threading.Lock()
        self._unacked = 0
        self._ackable = 0
        self._acked_total = 0

    @property
    def window_bytes(self) -> int:
        return self._window

    @property
    def ack_threshold(self) -> int:
        """Ack-able bytes that trigger a BUFFER_ACK."""
        return self._threshold

    @property
    def unacknowledged_bytes(self) -> int:
        """Bytes received and not yet acknowledged to the producer (staged or not)."""
        with self._lock:
            return self._unacked

    @property
    def unstaged_bytes(self) -> int:
        """Bytes received that the layer above has not staged yet."""
        with self._lock:
            return self._unacked - self._ackable

    @property
    def acknowledged_total(self) -> int:
        """All bytes ever acknowledged on this connection."""
        with self._lock:
            return self._acked_total

    def received(self, size: int) -> None:
        """Count a DCP message (header + body) the producer counted against the window."""
        if size < 0:
            raise ValueError(f"message size must not be negative: {size}")
        with self._lock:
            self._unacked += size

    def staged(self, size: int) -> int:
        """The layer above staged `size` received bytes; return bytes to BUFFER_ACK now (or 0)."""
        if size < 0:
            raise ValueError(f"staged size must not be negative: {size}")
        with self._lock:
            if self._ackable + size > self._unacked:
                raise ValueError(
                    f"staged {size} bytes but only {self._unacked - self._ackable} received "
                    "bytes are unstaged: acknowledged twice?"
                )
            self._ackable += size
            if self._ackable < self._threshold:
                return 0
            return self._take_ack()

    def flush(self) -> int:
        """Acknowledge every staged byte now, whatever the threshold (0 when none)."""
        with self._lock:
            return self._take_ack() if self._ackable else 0

    def _take_ack(self) -> int:
        ack = self._ackable
        self._unacked -= ack
        self._ackable = 0
        self._acked_total += ack
        return ack
