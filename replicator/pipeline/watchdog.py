"""The driver's watch over its vbuckets: none is left without a stream, none lags unseen.

Pure bookkeeping, no sockets and no Spark: the replication driver (replication.py) tells the
watchdog what happened and asks it what to do.

- A stream that ends when the replicator did not ask (a producer ending an open-ended stream
  with OK, or a filter it never set) is reopened from the committed position after a backoff
  that grows while the vbucket makes no committed progress. Every vbucket is always streaming,
  waiting out that backoff, or the run has failed loudly.
- The producer's high seqnos, fetched every `source_check_interval_s`, give the lag of a
  continuous run (a stalled vbucket shows as lagging) and reveal a source behind the mirror
  (a high seqno below the committed one on the same history: the producer lost data).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from replicator.dcp.protocol.events import StreamEndReason
from replicator.model.backoff import Backoff
from replicator.model.positions import VbucketPosition

log = logging.getLogger(__name__)

REOPEN_BACKOFF = Backoff(initial=0.5, maximum=30.0, deadline=float("inf"), jitter=False)
"""Pacing of reopens after unasked ends; no deadline: a vbucket is reopened as long as it runs."""

EARLY_END_LOG_INTERVAL_S = 10.0
"""At most one warning line per this many seconds about unasked stream ends (1024 vbuckets can
end at once); the count since the last line is in it, and in every progress line."""


@dataclass(frozen=True, slots=True)
class EarlyEnd:
    """A stream the producer ended although the replicator wanted more from it."""

    vbucket: int
    reason: StreamEndReason
    committed_seqno: int
    reopen_in_s: float
    ends_in_a_row: int


@dataclass
class StreamWatchdog:
    """Unasked stream ends and their reopen times, per vbucket."""

    clock: Callable[[], float]
    backoff: Backoff = REOPEN_BACKOFF
    _ends_in_a_row: dict[int, int] = field(default_factory=dict)
    _reopen_at: dict[int, float] = field(default_factory=dict)
    _unlogged: list[EarlyEnd] = field(default_factory=list)
    _last_log: float = float("-inf")
    early_ends_total: int = 0

    def ended_early(
        self, vbucket: int, reason: StreamEndReason, committed: VbucketPosition
    ) -> EarlyEnd:
        """Record an unasked end; the vbucket is due for a reopen after the backoff."""
        ends = self._ends_in_a_row.get(vbucket, 0) + 1
        self._ends_in_a_row[vbucket] = ends
        delay = self.backoff.delay(ends)
        self._reopen_at[vbucket] = self.clock() + delay
        self.early_ends_total += 1
        end = EarlyEnd(vbucket, reason, committed.seqno, delay, ends)
        self._unlogged.append(end)
        self._log_if_due()
        return end

    def due(self) -> list[int]:
        """The vbuckets whose reopen time has come (they are forgotten here: reopen them)."""
        if not self._reopen_at:
            return []
        now = self.clock()
        ready = [vb for vb, at in self._reopen_at.items() if at <= now]
        for vb in ready:
            del self._reopen_at[vb]
        return ready

    def seconds_until_due(self) -> float | None:
        if not self._reopen_at:
            return None
        return max(0.0, min(self._reopen_at.values()) - self.clock())

    def forget(self, vbucket: int) -> None:
        """The vbucket is handled otherwise (rolled back, resynced): no reopen from here."""
        self._reopen_at.pop(vbucket, None)

    def progressed(self, vbuckets: Iterable[int]) -> None:
        """Committed progress: the next unasked end of these vbuckets reopens them quickly."""
        if self._ends_in_a_row:
            for vb in vbuckets:
                self._ends_in_a_row.pop(vb, None)

    @property
    def waiting(self) -> int:
        """Vbuckets waiting out a reopen backoff."""
        return len(self._reopen_at)

    def _log_if_due(self) -> None:
        now = self.clock()
        if not self._unlogged or now - self._last_log < EARLY_END_LOG_INTERVAL_S:
            return
        self._last_log = now
        ends, self._unlogged = self._unlogged, []
        first = ends[0]
        vbuckets = sorted({e.vbucket for e in ends})
        more = f" and {len(vbuckets) - 1} other vbuckets" if len(vbuckets) > 1 else ""
        log.warning(
            "the producer ended %d streams the replicator did not ask to end (vbucket %d: %s at "
            "committed seqno %d, %d in a row%s); reopening each from its committed position, "
            "the first in %.1f s, backing off while a vbucket makes no progress",
            len(ends), first.vbucket, first.reason.name, first.committed_seqno,
            first.ends_in_a_row, more, first.reopen_in_s,
        )


@dataclass
class SourceWatch:
    """The producer's high seqnos, refreshed every `interval_s`, against the committed ones."""

    interval_s: float
    clock: Callable[[], float]
    highs: dict[int, int] = field(default_factory=dict)
    _fetched_at: float = float("-inf")

    def due(self) -> bool:
        return self.clock() - self._fetched_at >= self.interval_s

    def update(self, highs: Mapping[int, int]) -> None:
        self.highs.update(highs)
        self._fetched_at = self.clock()

    def lag(self, committed: Mapping[int, VbucketPosition]) -> int:
        """Seqnos the producer has that the mirror has not committed (0 for unknown vbuckets)."""
        return sum(
            max(0, high - committed[vb].seqno) for vb, high in self.highs.items() if vb in committed
        )

    def behind(self, committed: Mapping[int, VbucketPosition]) -> list[int]:
        """Vbuckets whose producer high seqno is below the committed seqno: data the producer
        no longer has (same history) or a failover the stream request will reveal."""
        return sorted(
            vb for vb, high in self.highs.items()
            if vb in committed and high < committed[vb].seqno
        )
