"""The SIGKILL crash loop: the replicator, killed at random moments, must lose and repeat nothing.

The embedded producer (a `SimCluster` on 127.0.0.1) serves an initial data set while a workload
thread inserts, updates, deletes and sets expiries (the expiry pager runs with it). A
`replicator run` subprocess is started against it and SIGKILLed, JVM included, at a moment
drawn from a seeded generator: during startup, after a commit of the initial load or of the
steady state, or while it handles a rollback. After each kill, and before the next start,
`MirrorAudit` checks every table version the run added. Between runs a failover (with lost
items the mirror had committed) and a tombstone purge are injected, so later runs roll back.
At the end the workload stops, one run catches up, and the mirror must equal the producer.
"""

from __future__ import annotations

import os
import random
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from replicator.errors import ReplicatorError
from replicator.sim.bucket import DocumentRecord, SimBucket
from replicator.sim.cluster import DEFAULT_PASSWORD, SimCluster
from replicator.sim.workload import Workload, WorkloadMix, initial_load, run_workload
from replicator.soak.audit import MirrorAudit
from replicator.soak.process import (
    JvmTuning,
    ReplicatorProcess,
    default_class_archive,
    replicator_environment,
)
from replicator.soak.report import CrashLoopReport
from replicator.soak.table_log import newest_version

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

STARTUP = "startup"
INITIAL_LOAD = "initial load"
STEADY = "steady commits"
ROLLBACK = "rollback handling"

ROLLBACK_LOG_LINE = "producer asked for rollback"
"""What `replicator run` logs when a stream request is answered with a rollback."""

_LONGEST_TTL_S = 5
_MIX = WorkloadMix(inserts=0.35, updates=0.4, deletes=0.15, expiries=0.1)


class CrashLoopFailure(ReplicatorError):
    """The loop could not go on (a run died by itself or hung); the message shows its log."""


@dataclass(frozen=True, slots=True)
class CrashLoopSettings:
    """How long and how hard the loop runs. `work_dir` holds the mirror and each run's log."""

    work_dir: Path
    kills: int = 20
    seed: int = 0
    vbuckets: int = 8
    nodes: int = 2
    initial_docs: int = 800
    doc_size: int = 200
    workload_ops_per_s: float = 25.0
    failovers: int = 1
    purges: int = 1
    startup_kill_share: float = 0.35
    commit_interval_s: float = 0.5
    commit_max_rows: int = 5_000
    run_timeout_s: float = 600.0
    jvm: JvmTuning = field(default_factory=lambda: JvmTuning(default_class_archive()))

    def __post_init__(self) -> None:
        if self.kills < 1:
            raise ValueError(f"kills must be at least 1, got {self.kills}")
        if not 0 <= self.startup_kill_share <= 1:
            raise ValueError(f"startup_kill_share must be in [0, 1], got {self.startup_kill_share}")
        if self.failovers + self.purges > self.kills:
            raise ValueError("faults are injected after kills: give at least one kill per fault")


def fault_schedule(
    kills: int, failovers: int, purges: int, rng: random.Random
) -> list[tuple[int, str]]:
    """After which kill cycle (0 to kills - 1) each fault comes, in order: spread over the
    middle of the loop, before the last two kills when there is room."""
    faults = ["failover"] * failovers + ["purge"] * purges
    rng.shuffle(faults)
    low = max(1, kills // 4)
    # Every cycle must be one the loop reaches (below `kills`), else the fault would silently
    # never be injected.
    high = min(kills, max(kills - 2, low + len(faults)))
    low = max(0, min(low, high - len(faults)))
    cycles = sorted(rng.sample(range(low, high), len(faults)))
    return list(zip(cycles, faults, strict=True))


class _WorkloadThread:
    """The workload, in a thread that can be stopped and replaced (after a failover)."""

    def __init__(self, bucket: SimBucket, ops_per_s: float, seed: int, doc_size: int) -> None:
        self._bucket = bucket
        self._ops_per_s = ops_per_s
        self._doc_size = doc_size
        self._seed = seed
        self._generation = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._errors: list[BaseException] = []
        self.ops = 0

    def start(self) -> None:
        # A fresh workload after a failover: the old one may still think lost keys exist.
        workload = Workload(
            seed=self._seed * 1000 + self._generation, mix=_MIX, doc_size=self._doc_size,
            expiry_ttl_s=(1, _LONGEST_TTL_S),
        )
        self._generation += 1
        workload.ensure_collections(self._bucket)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(workload, self._stop), name="soak-workload", daemon=True
        )
        self._thread.start()

    def _run(self, workload: Workload, stop: threading.Event) -> None:
        try:
            report = run_workload(
                self._bucket, self._ops_per_s, workload=workload, stop_event=stop,
                batch_size=20, pager_interval_s=1.0,
            )
            self.ops += report.ops
        except BaseException as exc:  # surfaced by stop(): a dead workload would prove nothing
            self._errors.append(exc)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)
            if self._thread.is_alive():
                raise CrashLoopFailure("the workload thread did not stop within 60s")
            self._thread = None
        if self._errors:
            raise CrashLoopFailure(f"the workload failed: {self._errors[0]!r}")


class CrashLoop:
    """One crash loop over a running cluster; `run()` returns the figures or raises."""

    def __init__(
        self,
        settings: CrashLoopSettings,
        spark: SparkSession,
        *,
        on_cycle: Callable[[int, str], None] | None = None,
    ) -> None:
        self.settings = settings
        self._spark = spark
        self._rng = random.Random(settings.seed)
        # Kill moments draw from their own stream: which phase each kill lands in then follows
        # from the seed alone, not from how many draws the faults' victims took.
        self._moments = random.Random(f"{settings.seed}-moments")
        self._on_cycle = on_cycle
        self._target = settings.work_dir / "mirror"
        self._logs = settings.work_dir / "runs"
        self._runs = 0
        self._startup_times: list[float] = []
        self._run_seconds: list[float] = []
        self._run_cpu_seconds: list[float] = []
        self._phases: Counter[str] = Counter()
        self._graceful = 0
        self._failovers = 0
        self._purges = 0
        self._purged_vbuckets: set[int] = set()

    def run(self) -> CrashLoopReport:
        """Load, kill and restart `kills` times, inject the faults, catch up, compare."""
        settings = self.settings
        started = time.monotonic()
        self._logs.mkdir(parents=True, exist_ok=True)
        bucket = SimBucket("soak", num_vbuckets=settings.vbuckets, seed=settings.seed)
        initial_load(bucket, docs=settings.initial_docs, doc_size=settings.doc_size,
                     seed=settings.seed)
        fault_cycles = fault_schedule(
            settings.kills, settings.failovers, settings.purges, self._rng
        )
        with SimCluster(bucket, nodes=settings.nodes) as cluster:
            audit = MirrorAudit(self._spark, self._target, bucket)
            workload = _WorkloadThread(
                bucket, settings.workload_ops_per_s, settings.seed, settings.doc_size
            )
            workload.start()
            try:
                pending_fault = False
                if not settings.jvm.archive_ready and settings.jvm.class_archive is not None:
                    self._warm_up(cluster)
                for cycle in range(settings.kills):
                    phase = self._kill_one_run(cluster, audit, after_fault=pending_fault)
                    audit.check_new_versions()
                    if self._on_cycle is not None:
                        self._on_cycle(cycle, phase)
                    pending_fault = self._inject_due_faults(
                        cycle, fault_cycles, cluster, audit, workload
                    )
            finally:
                workload.stop()
            # Expire every document the workload gave a time to live (at most its longest
            # TTL early), so none expires between the final run and the comparison.
            bucket.run_expiry_pager(int(time.time()) + _LONGEST_TTL_S + 1)
            self._catch_up(cluster)
            audit.check_new_versions()
            audit.check_equals_producer()
            documents = len(bucket.documents())
        progress = audit.progress
        return CrashLoopReport(
            seed=settings.seed,
            kills=sum(self._phases.values()),
            restarts=self._runs - 1,
            graceful_stops=self._graceful,
            kills_by_phase=dict(self._phases),
            versions_checked=progress.versions_checked,
            failovers=self._failovers,
            purges=self._purges,
            purged_vbuckets=len(self._purged_vbuckets),
            rollbacks_seen=progress.rollbacks_seen,
            resyncs_seen=progress.resyncs_seen,
            rolled_back_vbuckets=progress.rolled_back_vbuckets,
            resynced_vbuckets=progress.resynced_vbuckets,
            changes_applied=progress.changes_applied,
            workload_ops=workload.ops,
            documents_at_end=documents,
            elapsed_s=time.monotonic() - started,
            run_seconds=tuple(self._run_seconds),
            run_cpu_seconds=tuple(self._run_cpu_seconds),
        )

    # -- runs -------------------------------------------------------------------------------

    def _start(self, cluster: SimCluster, *extra: str, submit_args: str | None = None,
               target: Path | None = None) -> ReplicatorProcess:
        settings = self.settings
        env = replicator_environment(
            DEFAULT_PASSWORD, PYSPARK_SUBMIT_ARGS=submit_args or settings.jvm.submit_args()
        )
        args = [
            "run", "--source", cluster.connection_string,
            "--target", str(target or self._target),
            "--commit-interval-s", str(settings.commit_interval_s),
            "--commit-max-rows", str(settings.commit_max_rows), "--progress", "off", *extra,
        ]
        self._runs += 1
        return ReplicatorProcess(args, env, self._logs / f"run-{self._runs:04d}.log")

    def _warm_up(self, cluster: SimCluster) -> None:
        """When no class archive exists: a run into a scratch mirror, stopped cleanly after a
        commit, writes the archive every later run starts from. The loop's own mirror stays
        empty, so its first kill still lands in the initial load."""
        archive = self.settings.jvm.class_archive
        assert archive is not None
        archive.parent.mkdir(parents=True, exist_ok=True)
        partial = archive.with_name(f"{archive.name}.{os.getpid()}.tmp")
        scratch = self.settings.work_dir / "warm-up"
        process = self._start(
            cluster, submit_args=self.settings.jvm.submit_args(write_archive_to=partial),
            target=scratch,
        )
        self._wait_for(process, lambda: self._has_new_version(0, scratch), "a first commit")
        code = process.stop(self.settings.run_timeout_s)
        if code != 0:
            raise CrashLoopFailure(self._failure(process, f"warm-up run exited with {code}"))
        self._graceful += 1
        if partial.is_file():
            partial.replace(archive)

    def _kill_one_run(self, cluster: SimCluster, audit: MirrorAudit, *, after_fault: bool) -> str:
        # Version 0 creates the table during start-up: only a later version is a commit.
        before_version = newest_version(self._target) or 0
        initial = len(audit.committed_seqnos()) < self.settings.vbuckets
        process = self._start(cluster)
        try:
            phase = self._choose_kill_moment(process, before_version, initial, after_fault)
        except BaseException:
            if process.returncode is None:
                process.kill()
            raise
        if process.returncode is not None:
            raise CrashLoopFailure(self._failure(process, "the run ended before it was killed"))
        self._run_cpu_seconds.append(process.kill())
        self._run_seconds.append(time.monotonic() - process.started_at)
        self._phases[phase] += 1
        return phase

    def _choose_kill_moment(
        self,
        process: ReplicatorProcess,
        before_version: int,
        initial: bool,
        after_fault: bool,
    ) -> str:
        """Let the run go on until the moment drawn for its kill; returns the phase."""
        rng = self._moments
        if after_fault:
            phase = ROLLBACK
            self._wait_for(
                process,
                lambda: ROLLBACK_LOG_LINE in process.output()
                or self._has_new_version(before_version),
                "the rollback",
            )
            self._pause(process, rng.uniform(0.0, 1.5))
        elif self._startup_times and rng.random() < self.settings.startup_kill_share:
            # The first run always reaches a commit: it is the initial load's, and it tells
            # how long a start-up lasts.
            phase = STARTUP
            expected = statistics.median(self._startup_times)
            self._pause(process, rng.uniform(0.2, expected))
        else:
            phase = INITIAL_LOAD if initial else STEADY
            self._wait_for(
                process, lambda: self._has_new_version(before_version), "a commit"
            )
            self._startup_times.append(time.monotonic() - process.started_at)
            self._pause(process, rng.uniform(0.0, 1.0))
        return phase

    def _catch_up(self, cluster: SimCluster) -> None:
        process = self._start(cluster, "--until-caught-up")
        try:
            code = process.wait(self.settings.run_timeout_s)
        except BaseException:
            process.kill()
            raise
        if code is None:
            process.kill()
            raise CrashLoopFailure(self._failure(process, "the final catch-up run hung"))
        if code != 0:
            raise CrashLoopFailure(self._failure(process, f"the final run exited with {code}"))

    def _has_new_version(self, version: int, target: Path | None = None) -> bool:
        newest = newest_version(target or self._target)
        return newest is not None and newest > version

    def _wait_for(
        self, process: ReplicatorProcess, condition: Callable[[], bool], what: str
    ) -> None:
        deadline = time.monotonic() + self.settings.run_timeout_s
        while not condition():
            if process.wait(0.1) is not None:
                raise CrashLoopFailure(self._failure(process, f"the run ended awaiting {what}"))
            if time.monotonic() > deadline:
                process.kill()
                raise CrashLoopFailure(self._failure(process, f"no {what} within the timeout"))

    def _pause(self, process: ReplicatorProcess, seconds: float) -> None:
        """Let the run go on for `seconds` (the random part of the kill moment)."""
        process.wait(seconds)

    def _failure(self, process: ReplicatorProcess, what: str) -> str:
        tail = "\n".join(process.output().splitlines()[-25:])
        return f"{what} (run log {process.log_path}):\n{tail}"

    # -- faults -----------------------------------------------------------------------------

    def _inject_due_faults(
        self,
        cycle: int,
        schedule: list[tuple[int, str]],
        cluster: SimCluster,
        audit: MirrorAudit,
        workload: _WorkloadThread,
    ) -> bool:
        """Inject the faults due after this kill (or postponed); True if one was injected."""
        due = [(at, kind) for at, kind in schedule if at <= cycle]
        injected = False
        for entry in due:
            _, kind = entry
            bucket = cluster.bucket
            if kind == "failover":
                # Keep the last items down to an older commit of the vbucket: the producer
                # then asks for a rollback the mirror can answer from its own history.
                histories = {vb: audit.committed_history(vb) for vb in range(bucket.num_vbuckets)}
                choices = [
                    vb for vb, seqnos in histories.items() if len(seqnos) >= 2 and seqnos[-2] >= 1
                ]
            else:
                # Purging needs a tombstone above the committed seqno to force a resync.
                lasting = {
                    vb: _lasting_documents(bucket, vb)
                    for vb, seqno in audit.committed_seqnos().items() if seqno > 0
                }
                choices = sorted(vb for vb, documents in lasting.items() if documents)
            if not choices:
                continue  # nothing committed yet that this fault could take away: next time
            vbucket = self._rng.choice(choices)
            workload.stop()
            if kind == "failover":
                *_, older, newest = histories[vbucket]
                keep = self._rng.randint(older, newest - 1)
                cluster.failover(vbucket, lose_last=bucket.high_seqnos()[vbucket] - keep)
                self._failovers += 1
            else:
                victim = self._rng.choice(lasting[vbucket])
                bucket.delete(victim.key, collection=victim.collection)
                cluster.purge_tombstones(vbucket)
                self._purges += 1
                self._purged_vbuckets.add(vbucket)
            workload.start()
            schedule.remove(entry)
            injected = True
        return injected


def _lasting_documents(bucket: SimBucket, vbucket: int) -> list[DocumentRecord]:
    """The vbucket's live documents that have no expiry (none can vanish while we delete)."""
    return [record for record in bucket.documents(vbucket=vbucket) if not record.expiry]


def run_crash_loop(
    settings: CrashLoopSettings,
    spark: SparkSession,
    *,
    on_cycle: Callable[[int, str], None] | None = None,
) -> CrashLoopReport:
    """Run the crash loop; raises MirrorViolation on a lost, repeated or partial change."""
    return CrashLoop(settings, spark, on_cycle=on_cycle).run()
