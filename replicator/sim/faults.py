"""Faults a simulated node can inject into its connections, and the pure parts of each.

The cluster decides when (tests call `SimCluster` methods, the CLI takes flags); a connection
applies them: a malformed frame replaces its next DCP message, a send-rate cap paces its
writes, a stall stops it until released. The corruptions here are exact and documented so a
consumer test can say which error it expects.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable

from replicator.dcp.protocol.frame import HEADER_SIZE
from replicator.dcp.protocol.opcodes import Opcode

DOCUMENT_OPCODES = frozenset(
    {int(Opcode.DCP_MUTATION), int(Opcode.DCP_DELETION), int(Opcode.DCP_EXPIRATION)}
)


class MalformedFrame(enum.Enum):
    """How to break the next DCP message a connection sends.

    BAD_MAGIC: byte 0 becomes 0x42. BAD_LENGTHS: the body length is made smaller than extras
    plus key. BAD_LEB128: the document key's collection-id prefix becomes six continuation
    bytes (longer than a u32 allows; only on a mutation, deletion or expiration of a
    collection-aware connection). BAD_EXTRAS: the extras length is cut to 3 bytes (wrong for
    every DCP message) with the key and value moved to match, so the frame itself parses.
    """

    BAD_MAGIC = "bad-magic"
    BAD_LENGTHS = "bad-lengths"
    BAD_LEB128 = "bad-leb128"
    BAD_EXTRAS = "bad-extras"

    def applies_to(self, frame: bytes, *, collections: bool) -> bool:
        """Whether this corruption can be applied to `frame` (a whole classic frame)."""
        if self is MalformedFrame.BAD_LEB128:
            return collections and frame[1] in DOCUMENT_OPCODES and _key_length(frame) > 0
        if self is MalformedFrame.BAD_EXTRAS:
            return frame[4] > 3
        if self is MalformedFrame.BAD_LENGTHS:
            return frame[4] + _key_length(frame) > 0  # else no length can be too small
        return True

    def corrupt(self, frame: bytes) -> bytes:
        """The broken version of `frame`; call `applies_to` first."""
        data = bytearray(frame)
        if self is MalformedFrame.BAD_MAGIC:
            data[0] = 0x42
        elif self is MalformedFrame.BAD_LENGTHS:
            claimed = max(0, data[4] + _key_length(frame) - 1)
            data[8:12] = claimed.to_bytes(4, "big")
            del data[HEADER_SIZE + claimed :]
        elif self is MalformedFrame.BAD_LEB128:
            key_start = HEADER_SIZE + data[4]
            key_len = _key_length(frame)
            # Replace the key by continuation bytes only: an over-long, unterminated id.
            bad_key = b"\xff" * 6
            data[key_start : key_start + key_len] = bad_key
            data[2:4] = len(bad_key).to_bytes(2, "big")
            body = len(data) - HEADER_SIZE
            data[8:12] = body.to_bytes(4, "big")
        else:
            extras_len = data[4]
            del data[HEADER_SIZE + 3 : HEADER_SIZE + extras_len]
            data[4] = 3
            data[8:12] = (len(data) - HEADER_SIZE).to_bytes(4, "big")
        return bytes(data)


def _key_length(frame: bytes) -> int:
    return int.from_bytes(frame[2:4], "big")


class SendRateLimit:
    """A token bucket capping a connection's sends at `bytes_per_second`.

    Burst is a tenth of a second's worth (at least one 4 KiB chunk), so pacing is smooth.
    """

    def __init__(
        self, bytes_per_second: int, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if bytes_per_second < 1:
            raise ValueError(f"bytes_per_second must be positive, got {bytes_per_second}")
        self.bytes_per_second = bytes_per_second
        self._burst = max(4096, bytes_per_second // 10)
        self._clock = clock
        self._tokens = float(self._burst)
        self._stamp = clock()

    def allowance(self) -> int:
        """How many bytes may go out now."""
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._stamp) * self.bytes_per_second)
        self._stamp = now
        return int(self._tokens)

    def spend(self, sent: int) -> None:
        """Record `sent` bytes as gone out."""
        self._tokens -= sent

    def wait_time(self, wanted: int) -> float:
        """Seconds until `wanted` bytes (capped at the burst) are allowed."""
        missing = min(wanted, self._burst) - self._tokens
        return max(0.0, missing / self.bytes_per_second)
