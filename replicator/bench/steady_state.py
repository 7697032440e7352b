"""Measurement 5: steady state at a fixed offered rate: throughput and source-to-Delta lag.

The producer (its own process) applies a mix of inserts, updates, deletes and expiries at the
offered rate from start to end. The replicator runs continuously in this process; once it has
caught up (with the backfill, then with the backlog that built up meanwhile), a window opens. At
its end the replicator is asked to catch up with the producer's high seqnos and stop.

- applied rate: seqnos the producer wrote per second during the window (it may fall short of
  the offered rate on a busy machine; the report says so).
- committed rate: seqnos committed per second between the commits that bracket the window,
  read from the commits' own positions and timestamps.
- lag: per row of the change data feed (inserts and update post-images) whose CAS lies in the
  window, `_commit_timestamp` minus the CAS (the producer's wall clock, in ns, when it applied
  the change). Versions superseded or deleted within a batch never reach the table, so only
  surviving versions are measured.
- delivered rate: seqnos the replicator received per second during the window; below the
  applied rate, the producer could not stream its own writes as fast (a backlog at the source,
  which the lag counts too).
- file health: the data table's files when the run stops (the replicator's own compactions
  included), against the files right after a full OPTIMIZE of the same table.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass
from typing import TYPE_CHECKING

from replicator.bench.initial_load import bench_config
from replicator.bench.simulator import SIM_PASSWORD, SIM_USERNAME, SimulatorProcess
from replicator.config import ReplicatorConfig
from replicator.dcp.cluster.client import DcpClient
from replicator.dcp.transport.auth import Credentials
from replicator.delta.commit_metadata import CommitMetadata
from replicator.pipeline.runner import BackgroundRun

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from replicator.pipeline.replication import Replication

STOP_TIMEOUT_S = 600.0
"""How long a stopped replication may take to make its last commit and return."""

PRODUCER_SUPERSEDED_WINDOW = 2_000
"""Seqnos per vbucket for which the producer keeps replaced versions and checkpoints.

A producer keeping every version holds every write: 20,000 writes/s of 1 KB filled this
24 GB machine within a run of the default preset (18.5 GB after about 10 minutes). This
bounds it to about 2.7 GB over 1024 vbuckets, as a server's memory is bounded; the replicator
streams the same changes (a stream further behind than the window backfills, deduplicated,
as from a server whose checkpoints were expelled).
"""

KEEP_UP_SHARE = 0.95
"""The committed rate must reach this share of the applied rate to count as keeping up."""


@dataclass(frozen=True, slots=True)
class SteadyStateSettings:
    """One steady-state run: offered rate, window, and the replicator's commit interval."""

    offered_rate: float
    window_s: float
    seed_docs: int
    doc_size: int
    vbuckets: int
    commit_interval_s: float
    catch_up_timeout_s: float
    warmup_catch_ups: int = 2


@dataclass(frozen=True, slots=True)
class LagPercentiles:
    """Lag in milliseconds of the rows of one part of the window."""

    rows: int
    p50_ms: float
    p99_ms: float
    max_ms: float


@dataclass(frozen=True, slots=True)
class SteadyStateResult:
    """What one offered rate gave.

    `lag_first_quarter` / `lag_last_quarter`: the same percentiles over rows whose CAS lies in
    the window's first and last quarter; a lag that grows between them is a backlog building.
    `drained_after_s`: seconds after the window's end until every change of the window was
    committed (None when the catch-up timed out: then the lag figures leave out the changes
    never committed, and understate it). `warmed_up` is False when the replicator never caught
    up before the window (it was already falling behind). `data_files` is the table's file
    count when the run stopped, `files_after_optimize` the count after a full OPTIMIZE then.

    The warm-up compares sums of seqnos, so the window can open while vbuckets of the seed have
    not had their first load committed (a backfill starved by the write load): their rows wait
    for it. `vbuckets_loading_at_start` counts them; `lag_loaded_vbuckets` is the lag of the
    other vbuckets' rows, the steady state without the seed's tail.

    The lag runs from the producer's write to the commit, so a producer that cannot stream its
    writes as fast as it makes them (it shares the machine) counts in it. `delivered_rate` is
    what the replicator received over the window (seqnos staged or committed, sampled on its
    thread), `undelivered_at_end` the changes written but not yet received when the window
    closed (received as sampled within its last second): a backlog at the producer rather
    than in the replicator.
    """

    offered_rate: float
    applied_rate: float
    committed_rate: float
    warmed_up: bool
    window_seconds: float
    commits_in_window: int
    lag: LagPercentiles
    lag_first_quarter: LagPercentiles
    lag_last_quarter: LagPercentiles
    drained_after_s: float | None
    producer_kept_pace: bool
    lag_bounded: bool
    keeps_up: bool
    data_files: int = 0
    files_after_optimize: int = 0
    vbuckets_loading_at_start: int = 0
    lag_loaded_vbuckets: LagPercentiles | None = None
    delivered_rate: float | None = None
    undelivered_at_end: int | None = None

    @property
    def files_ratio(self) -> float | None:
        """Data files per file of a fully optimized table (None when not measured)."""
        if self.files_after_optimize <= 0:
            return None
        return self.data_files / self.files_after_optimize

    @property
    def received_short(self) -> bool:
        """Whether the replicator received less than the producer wrote over the window (a
        backlog before staging, at the producer)."""
        return (
            self.delivered_rate is not None
            and self.delivered_rate < KEEP_UP_SHARE * self.applied_rate
        )


def measure_steady_state(
    spark: SparkSession, settings: SteadyStateSettings, *, work_dir: str
) -> SteadyStateResult:
    """Run the replicator against a producer writing at `settings.offered_rate`."""
    rate_name = f"{int(settings.offered_rate)}"
    with SimulatorProcess(
        "steady",
        docs=settings.seed_docs,
        doc_size=settings.doc_size,
        vbuckets=settings.vbuckets,
        rate=settings.offered_rate,
        log_path=f"{work_dir}/sim-steady-{rate_name}.log",
        superseded_window=PRODUCER_SUPERSEDED_WINDOW,
    ) as simulator:
        config = bench_config(
            simulator.connection_string,
            f"{work_dir}/steady-{rate_name}",
            SIM_PASSWORD,
            commit_interval_s=settings.commit_interval_s,
            staging_dir=f"{work_dir}/staging-steady-{rate_name}",
        )
        window = _run_window(spark, config, settings)
    result = _analyse(spark, config.target, settings, window)
    files, optimized = _file_health(spark, config.target)
    return dataclasses.replace(result, data_files=files, files_after_optimize=optimized)


def _file_health(spark: SparkSession, target: str) -> tuple[int, int]:
    """The data table's files now, and after a full OPTIMIZE (which this run then keeps)."""
    from delta.tables import DeltaTable

    from replicator.delta.compaction import FULL_COMPACTION_FILE_BYTES, MIN_FILE_SIZE_CONF
    from replicator.delta.table import delta_snapshot

    files = int(delta_snapshot(spark, target).numOfFiles())
    spark.conf.set(MIN_FILE_SIZE_CONF, str(FULL_COMPACTION_FILE_BYTES))
    try:
        DeltaTable.forPath(spark, target).optimize().executeCompaction()
    finally:
        spark.conf.unset(MIN_FILE_SIZE_CONF)
    return files, int(delta_snapshot(spark, target).numOfFiles())


@dataclass(frozen=True, slots=True)
class _Window:
    warmed_up: bool
    start_ns: int
    end_ns: int
    applied_seqnos: int
    drained_after_s: float | None
    delivered_seqnos: int | None = None
    undelivered_at_end: int | None = None


class ReceivedSeqnos:
    """The seqnos a replication has received (staged or committed), summed over its vbuckets,
    sampled on its thread after a step at most every `every_s` seconds."""

    def __init__(self, every_s: float = 1.0) -> None:
        self.samples: list[tuple[int, int]] = []  # (time in ns, seqnos received)
        self._every_ns = int(every_s * 1e9)

    def observe(self, replication: Replication) -> None:
        now = time.time_ns()
        if self.samples and now - self.samples[-1][0] < self._every_ns:
            return
        received = {vb: position.seqno for vb, position in replication.positions().items()}
        for vb, staged in replication.staged_up_to().items():
            received[vb] = max(received.get(vb, 0), staged)
        self.samples.append((now, _total(received)))

    def at(self, ns: int) -> int | None:
        """The newest sample taken at or before `ns` (None before the first).

        >>> received = ReceivedSeqnos()
        >>> received.samples += [(10, 100), (20, 250)]
        >>> received.at(5), received.at(10), received.at(19), received.at(99)
        (None, 100, 100, 250)
        """
        found = None
        for taken, seqnos in self.samples:
            if taken > ns:
                break
            found = seqnos
        return found


def _wait_committed(run: BackgroundRun, target: int, timeout_s: float) -> bool:
    """Wait until the run's committed seqnos add up to `target`; False after `timeout_s`."""
    return run.wait_for(
        lambda: _total({vb: p.seqno for vb, p in run.replication.positions().items()}) >= target,
        timeout=timeout_s,
    )


def _stop(run: BackgroundRun, *, wait_s: float) -> None:
    """Let the run end by itself for `wait_s`, then stop it; raise what it failed with."""
    if not run.wait(wait_s):
        run.stop.set()
        # A stop still commits what is complete; that commit may take a while.
        if not run.wait(STOP_TIMEOUT_S):
            raise RuntimeError(f"the replication did not stop within {STOP_TIMEOUT_S:.0f} s")
    run.result()


def _run_window(
    spark: SparkSession, config: ReplicatorConfig, settings: SteadyStateSettings
) -> _Window:
    probe = DcpClient(config.source, Credentials(SIM_USERNAME, SIM_PASSWORD))
    received = ReceivedSeqnos()
    with (
        closing(probe),
        BackgroundRun(
            config,
            spark=spark,
            name="bench-replication",
            on_started=lambda replication: replication.after_each_step(received.observe),
        ) as run,
    ):
        run.wait_started(settings.catch_up_timeout_s)
        # The backfill, then the changes that piled up while it was committed, ...
        warmed_up = all(
            _wait_committed(run, _total(probe.high_seqnos()), settings.catch_up_timeout_s)
            for _ in range(settings.warmup_catch_ups)
        )
        start_ns = time.time_ns()
        applied_before = _total(probe.high_seqnos())
        if run.wait(settings.window_s):
            run.result()
            raise RuntimeError("the replication ended during the window")
        highs = probe.high_seqnos()
        end_ns = time.time_ns()
        received_at_start, received_at_end = received.at(start_ns), received.at(end_ns)
        run.replication.request_catch_up(highs)
        # A replicator that never caught up will not drain the window either: do not wait.
        drained = warmed_up and _wait_committed(run, _total(highs), settings.catch_up_timeout_s)
        drained_at_ns = time.time_ns()
        _stop(run, wait_s=STOP_TIMEOUT_S if drained else 0.0)
    return _Window(
        warmed_up=warmed_up,
        start_ns=start_ns,
        end_ns=end_ns,
        applied_seqnos=_total(highs) - applied_before,
        drained_after_s=(drained_at_ns - end_ns) / 1e9 if drained else None,
        delivered_seqnos=(
            None
            if received_at_start is None or received_at_end is None
            else received_at_end - received_at_start
        ),
        undelivered_at_end=None if received_at_end is None else _total(highs) - received_at_end,
    )


def _total(seqnos: Mapping[int, int]) -> int:
    return sum(seqnos.values())


def _analyse(
    spark: SparkSession, target: str, settings: SteadyStateSettings, window: _Window
) -> SteadyStateResult:
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    seconds = (window.end_ns - window.start_ns) / 1e9
    history = (
        DeltaTable.forPath(spark, target)
        .history()
        .select("version", F.unix_millis("timestamp").alias("millis"), "userMetadata")
        .orderBy("version")
        .collect()
    )
    committed: dict[int, int] = {}
    commits: list[tuple[int, int]] = []  # (commit time in ns, seqnos committed after it)
    first_version_in_window: int | None = None
    loaded_at_start: frozenset[int] | None = None
    for row in history:
        metadata = CommitMetadata.from_json(row["userMetadata"])
        if metadata is None:
            continue
        commit_ns = int(row["millis"]) * 1_000_000
        if first_version_in_window is None and commit_ns >= window.start_ns:
            first_version_in_window = int(row["version"])
            loaded_at_start = frozenset(committed)
        committed.update({vb: p.seqno for vb, p in metadata.positions.items()})
        commits.append((commit_ns, sum(committed.values())))
    if loaded_at_start is None:
        loaded_at_start = frozenset(committed)
    committed_rate = committed_rate_over(commits, window.start_ns, window.end_ns)
    in_window = [c for c in commits if window.start_ns <= c[0] <= window.end_ns]
    quarter = (window.end_ns - window.start_ns) // 4
    starting = first_version_in_window if first_version_in_window is not None else 0
    lags = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", starting)
        .load(target)
        .where(F.col("_change_type").isin("insert", "update_postimage"))
        .where(F.col("cas").between(window.start_ns, window.end_ns))
        .select(
            "cas",
            "vbucket",
            ((F.unix_micros("_commit_timestamp") * 1000 - F.col("cas")) / 1e6).alias("lag_ms"),
        )
        .cache()
    )
    try:
        overall = _percentiles(lags)
        first = _percentiles(lags.where(F.col("cas") < window.start_ns + quarter))
        last = _percentiles(lags.where(F.col("cas") >= window.end_ns - quarter))
        loaded = _percentiles(lags.where(F.col("vbucket").isin(sorted(loaded_at_start))))
    finally:
        lags.unpersist()
    applied_rate = window.applied_seqnos / seconds
    lag_bounded = (
        window.warmed_up
        and window.drained_after_s is not None
        and overall.rows > 0
        and last.p50_ms <= first.p50_ms + settings.commit_interval_s * 1000
    )
    return SteadyStateResult(
        offered_rate=settings.offered_rate,
        applied_rate=applied_rate,
        committed_rate=committed_rate,
        warmed_up=window.warmed_up,
        window_seconds=seconds,
        commits_in_window=len(in_window),
        lag=overall,
        lag_first_quarter=first,
        lag_last_quarter=last,
        drained_after_s=window.drained_after_s,
        producer_kept_pace=applied_rate >= KEEP_UP_SHARE * settings.offered_rate,
        lag_bounded=lag_bounded,
        keeps_up=lag_bounded and committed_rate >= KEEP_UP_SHARE * applied_rate,
        vbuckets_loading_at_start=settings.vbuckets - len(loaded_at_start),
        lag_loaded_vbuckets=loaded,
        delivered_rate=(
            None if window.delivered_seqnos is None else window.delivered_seqnos / seconds
        ),
        undelivered_at_end=window.undelivered_at_end,
    )


def committed_rate_over(commits: Sequence[tuple[int, int]], start_ns: int, end_ns: int) -> float:
    """Seqnos committed per second between the commits that bracket [start, end] (pure).

    `commits` are (commit time in ns, total seqnos committed after it), oldest first. The span
    runs from the last commit at or before `start` (else the first after it) to the first
    commit at or after `end` (else the last one): every commit cycle overlapping the window
    counts whole, however long a cycle takes. 0.0 without two distinct commit times.

    >>> commits = [(0, 0), (2_000_000_000, 100), (4_000_000_000, 300)]
    >>> committed_rate_over(commits, 1_000_000_000, 3_000_000_000)
    75.0
    """
    before = [c for c in commits if c[0] <= start_ns]
    after = [c for c in commits if c[0] >= end_ns]
    first = before[-1] if before else next((c for c in commits if c[0] > start_ns), None)
    last = after[0] if after else (commits[-1] if commits else None)
    if first is None or last is None or last[0] <= first[0]:
        return 0.0
    return (last[1] - first[1]) / ((last[0] - first[0]) / 1e9)


PERCENTILE_ACCURACY = 100_000
"""The lag percentiles' rank is within 1/this of the rows (180 rows of 18 million)."""


def _percentiles(lags: DataFrame) -> LagPercentiles:
    from pyspark.sql import functions as F

    # Approximate: Spark's exact percentile holds every distinct value in one task's heap, and
    # 30 minutes at 10,000/s (18 million rows) ran the bench's JVM out of memory.
    row = lags.agg(
        F.count("*").alias("rows"),
        F.percentile_approx("lag_ms", [0.5, 0.99], PERCENTILE_ACCURACY).alias("quantiles"),
        F.max("lag_ms").alias("max"),
    ).first()
    if row is None or not row["rows"]:
        return LagPercentiles(0, 0.0, 0.0, 0.0)
    p50, p99 = row["quantiles"]
    return LagPercentiles(int(row["rows"]), float(p50), float(p99), float(row["max"]))
