"""Metrics of a running replication, for the monitoring people already have.

`replicator run --metrics-port N` serves them as Prometheus / OpenMetrics text on
`http://HOST:N/metrics` (prometheus_client); `--metrics-log-s S` also writes them every S
seconds as one structured log line (`metrics {...}`), for spark-submit deployments that
collect logs rather than scrape ports. Both read the same snapshot.

The snapshot is taken on the replication thread after a step, at most once a second, and a
scrape only reads the newest one: a scrape never waits for the driver, and never sees a
half-updated state. Per vbucket: the committed seqno, the producer's high seqno (from the
periodic source check), the lag in seqnos, and the lag in seconds (how long the vbucket has
been behind: since the last snapshot that found it caught up; 0 when it is not behind).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

    from replicator.pipeline.replication import Replication
    from replicator.planning.planner import CommitBatch

log = logging.getLogger(__name__)

COMMIT_SECONDS_BUCKETS = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
BATCH_ROWS_BUCKETS = (10.0, 100.0, 1_000.0, 10_000.0, 100_000.0, 1_000_000.0)


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """What the replication had done when the snapshot was taken (cumulative since start)."""

    taken_at: float
    committed: Mapping[int, int] = field(default_factory=dict)
    source_highs: Mapping[int, int] = field(default_factory=dict)
    lag_seconds: Mapping[int, float] = field(default_factory=dict)
    changes_committed: int = 0
    commits: int = 0
    rollbacks: int = 0
    full_resyncs: int = 0
    staged_bytes: int = 0
    spilled_bytes_total: int = 0
    reconnects: int = 0
    conflicts_retried: int = 0
    last_commit_at: float | None = None

    def lag_seqnos(self) -> dict[int, int]:
        """Per vbucket the producer reported, seqnos it has that the mirror has not committed."""
        return {
            vb: max(0, high - self.committed.get(vb, 0)) for vb, high in self.source_highs.items()
        }

    def summary(self) -> dict[str, Any]:
        """The totals and the lag, as one log line carries them."""
        lag = self.lag_seqnos()
        behind = {vb: seqnos for vb, seqnos in lag.items() if seqnos > 0}
        return {
            "changes_committed": self.changes_committed,
            "commits": self.commits,
            "rollbacks": self.rollbacks,
            "full_resyncs": self.full_resyncs,
            "staged_bytes": self.staged_bytes,
            "spilled_bytes_total": self.spilled_bytes_total,
            "reconnects": self.reconnects,
            "conflicts_retried": self.conflicts_retried,
            "last_commit_at": self.last_commit_at,
            "vbuckets": len(self.committed),
            "lag_seqnos": sum(lag.values()),
            "vbuckets_behind": len(behind),
            "max_lag_seconds": max(self.lag_seconds.values(), default=0.0),
            "lag_seqnos_by_vbucket": {str(vb): behind[vb] for vb in sorted(behind)},
        }


@dataclass(frozen=True, slots=True)
class MetricsSources:
    """Counters kept outside the Replication: the DCP client's and the commit executor's."""

    reconnects: Callable[[], int] = lambda: 0
    conflicts_retried: Callable[[], int] = lambda: 0
    staged_bytes: Callable[[], int] = lambda: 0
    spilled_bytes_total: Callable[[], int] = lambda: 0


class ReplicationMetrics:
    """Keeps the newest MetricsSnapshot of a Replication and exposes it.

    >>> metrics = ReplicationMetrics()  # doctest: +SKIP
    >>> metrics.attach(replication, MetricsSources())  # doctest: +SKIP
    >>> metrics.serve(9464)  # doctest: +SKIP
    """

    def __init__(
        self,
        *,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.time,
        log_every_s: float | None = None,
    ) -> None:
        from prometheus_client import CollectorRegistry, Histogram

        self._interval_s = interval_s
        self._clock = clock
        self._log_every_s = log_every_s
        self._logged_at = float("-inf")
        self._snapshot = MetricsSnapshot(taken_at=clock())
        self._behind_since: dict[int, float] = {}
        self._last_commit_at: float | None = None
        self._server: Any = None
        self.registry: CollectorRegistry = CollectorRegistry()
        self.registry.register(_SnapshotCollector(self))
        self.commit_seconds = Histogram(
            "replicator_commit_duration_seconds", "Wall time of each data commit.",
            buckets=COMMIT_SECONDS_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.batch_rows = Histogram(
            "replicator_batch_rows", "Changes per data commit (group commit size).",
            buckets=BATCH_ROWS_BUCKETS, registry=self.registry,
        )  # fmt: skip

    @property
    def snapshot(self) -> MetricsSnapshot:
        return self._snapshot

    def attach(self, replication: Replication, sources: MetricsSources | None = None) -> None:
        """Follow `replication` (call before it runs)."""
        found = sources or MetricsSources()
        replication.after_each_step(lambda r: self.observe(r, found))
        replication.on_commit_landed(self.commit_landed)

    def commit_landed(self, batch: CommitBatch, seconds: float) -> None:
        """A data commit landed (on the thread that saw it land)."""
        self.commit_seconds.observe(seconds)
        self.batch_rows.observe(batch.row_count)
        self._last_commit_at = self._clock()

    def observe(
        self, replication: Replication, sources: MetricsSources, *, force: bool = False
    ) -> None:
        """Take a snapshot of `replication` when one is due (on its thread)."""
        now = self._clock()
        if not force and now - self._snapshot.taken_at < self._interval_s:
            return
        committed = {vb: p.seqno for vb, p in replication.positions().items()}
        highs = replication.source_highs()
        lag_seconds = {}
        for vb, seqno in committed.items():
            high = highs.get(vb)
            if high is None or seqno >= high:
                self._behind_since.pop(vb, None)
                lag_seconds[vb] = 0.0
            else:
                lag_seconds[vb] = now - self._behind_since.setdefault(vb, now)
        stats = replication.stats
        self._snapshot = MetricsSnapshot(
            taken_at=now, committed=committed, source_highs=dict(highs), lag_seconds=lag_seconds,
            changes_committed=stats.items_committed, commits=stats.commits,
            rollbacks=stats.rollbacks, full_resyncs=stats.full_resyncs,
            staged_bytes=sources.staged_bytes(), spilled_bytes_total=sources.spilled_bytes_total(),
            reconnects=sources.reconnects(), conflicts_retried=sources.conflicts_retried(),
            last_commit_at=self._last_commit_at,
        )  # fmt: skip
        if self._log_every_s is not None and now - self._logged_at >= self._log_every_s:
            self._logged_at = now
            log.info("metrics %s", json.dumps(self._snapshot.summary(), separators=(",", ":")))

    def serve(self, port: int, host: str = "0.0.0.0") -> int:
        """Serve /metrics on `host:port` from a daemon thread; returns the port bound."""
        from prometheus_client import start_http_server

        from replicator.errors import ConfigError

        try:
            self._server, _ = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise ConfigError(
                f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}; choose another "
                "--metrics-port"
            ) from None
        bound = int(self._server.server_port)
        log.info("serving metrics on http://%s:%d/metrics", host, bound)
        return bound

    def close(self) -> None:
        """Stop serving (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            threading.Thread(target=server.shutdown, daemon=True).start()
            server.server_close()


class _SnapshotCollector:
    """Renders the newest snapshot as metric families, at scrape time."""

    def __init__(self, metrics: ReplicationMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        snap = self._metrics.snapshot
        per_vbucket: tuple[tuple[str, str, Mapping[int, float]], ...] = (
            ("replicator_committed_seqno", "Seqno committed to the mirror, per vbucket.",
             snap.committed),
            ("replicator_source_high_seqno", "The producer's high seqno at its last check.",
             snap.source_highs),
            ("replicator_lag_seqnos", "Seqnos the producer has that the mirror has not committed.",
             snap.lag_seqnos()),
            ("replicator_lag_seconds", "Seconds the vbucket has been behind the producer.",
             snap.lag_seconds),
        )  # fmt: skip
        for name, text, values in per_vbucket:
            family = GaugeMetricFamily(name, text, labels=["vbucket"])
            for vb in sorted(values):
                family.add_metric([str(vb)], float(values[vb]))
            yield family
        counters = (
            ("replicator_changes_committed", "Changes committed.", snap.changes_committed),
            ("replicator_commits", "Data commits.", snap.commits),
            ("replicator_rollbacks", "Vbucket rollbacks.", snap.rollbacks),
            ("replicator_full_resyncs", "Vbuckets streamed again from 0.", snap.full_resyncs),
            ("replicator_spilled_bytes", "Bytes written to spill files.", snap.spilled_bytes_total),
            ("replicator_reconnects", "Reconnects to producer nodes.", snap.reconnects),
            ("replicator_conflicts_retried", "Delta commits retried after a conflict.",
             snap.conflicts_retried),
        )  # fmt: skip
        for name, text, value in counters:
            yield CounterMetricFamily(name, text, value=float(value))
        yield GaugeMetricFamily(
            "replicator_staged_bytes", "Bytes of changes staged in memory.",
            value=float(snap.staged_bytes),
        )  # fmt: skip
        if snap.last_commit_at is not None:
            yield GaugeMetricFamily(
                "replicator_last_commit_timestamp_seconds",
                "Unix time of the last successful data commit.", value=snap.last_commit_at,
            )  # fmt: skip


__all__ = ["MetricsSnapshot", "MetricsSources", "ReplicationMetrics"]
