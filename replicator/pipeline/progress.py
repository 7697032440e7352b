"""Progress of a replication, for people: a live bar on a terminal, periodic lines in logs.

During an initial load it shows items and seqnos done against the high seqnos observed at
start, the rate and an ETA; in continuous mode it prints structured lines with throughput and lag.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO


@dataclass(frozen=True, slots=True)
class ProgressSnapshot:
    """What the replicator has done so far (cumulative since start)."""

    items_committed: int
    seqnos_committed: int
    seqnos_target: int
    commits: int
    rollbacks: int
    vbuckets_caught_up: int
    vbuckets_total: int
    lag_seqnos: int
    reopening: int = 0
    """Vbuckets whose stream the producer ended unasked, waiting out a backoff to reopen."""
    early_ends: int = 0
    """Streams the producer ended unasked since the start."""


def format_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


class ProgressReporter:
    """Renders `ProgressSnapshot`s; call `update` often, it throttles itself.

    `mode` is `bar` (redraws one terminal line), `lines` (one log line per interval), `off`, or
    `auto` (bar when the stream is a terminal).
    """

    def __init__(
        self,
        mode: str = "auto",
        *,
        stream: TextIO | None = None,
        interval_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stream = stream or sys.stderr
        if mode == "auto":
            mode = "bar" if self._stream.isatty() else "lines"
        self.mode = mode
        self._interval = 0.2 if mode == "bar" else interval_s
        self._clock = clock
        self._started = clock()
        self._last_render = float("-inf")
        self._last_items = 0
        self._last_time = self._started

    def due(self) -> bool:
        """Whether `update` would show anything now: callers skip building a snapshot (a sum
        over every vbucket) on the steps in between."""
        return self.mode != "off" and self._clock() - self._last_render >= self._interval

    def update(self, snapshot: ProgressSnapshot, *, force: bool = False) -> None:
        now = self._clock()
        if self.mode == "off" or (not force and now - self._last_render < self._interval):
            return
        self._last_render = now
        elapsed = max(now - self._started, 1e-9)
        rate = snapshot.items_committed / elapsed
        window = max(now - self._last_time, 1e-9)
        recent_rate = (snapshot.items_committed - self._last_items) / window
        self._last_items, self._last_time = snapshot.items_committed, now
        if self.mode == "bar":
            self._stream.write("\r" + self.render_bar(snapshot, rate, elapsed) + "\x1b[K")
        else:
            self._stream.write(self.render_line(snapshot, recent_rate, elapsed) + "\n")
        self._stream.flush()

    def finish(self, snapshot: ProgressSnapshot) -> None:
        if self.mode == "off":
            return
        self.update(snapshot, force=True)
        if self.mode == "bar":
            self._stream.write("\n")
            self._stream.flush()

    @staticmethod
    def render_bar(snapshot: ProgressSnapshot, rate: float, elapsed: float, width: int = 30) -> str:
        target = max(snapshot.seqnos_target, 1)
        fraction = min(snapshot.seqnos_committed / target, 1.0)
        filled = int(fraction * width)
        remaining = target - snapshot.seqnos_committed
        seqno_rate = snapshot.seqnos_committed / max(elapsed, 1e-9)
        eta = format_duration(remaining / seqno_rate) if seqno_rate > 0 and remaining > 0 else "-"
        return (
            f"[{'#' * filled}{'.' * (width - filled)}] {fraction:6.1%} "
            f"{snapshot.items_committed:,} items {rate:,.0f}/s "
            f"vb {snapshot.vbuckets_caught_up}/{snapshot.vbuckets_total} ETA {eta}"
        )

    @staticmethod
    def render_line(snapshot: ProgressSnapshot, rate: float, elapsed: float) -> str:
        return (
            f"progress elapsed={format_duration(elapsed)} items={snapshot.items_committed} "
            f"rate={rate:.0f}/s seqnos={snapshot.seqnos_committed}/{snapshot.seqnos_target} "
            f"caught_up={snapshot.vbuckets_caught_up}/{snapshot.vbuckets_total} "
            f"lag_seqnos={snapshot.lag_seqnos} commits={snapshot.commits} "
            f"rollbacks={snapshot.rollbacks}"
            + (
                f" early_stream_ends={snapshot.early_ends} reopening={snapshot.reopening}"
                if snapshot.early_ends else ""
            )
        )
