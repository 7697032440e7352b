"""`replicator run`: validate, connect, open the mirror, claim the vbuckets, replicate.

Validation runs cheapest first so that a user's mistake fails in seconds with one line: config
values, Delta jars, then the source (reachable, credentials, bucket, TLS), then the target (a
mirror of this bucket, writable), then ownership of the vbuckets.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from replicator.config import ReplicatorConfig
from replicator.dcp.cluster.client import DcpClient
from replicator.delta.store import DeltaMirrorStore
from replicator.errors import ConfigError
from replicator.model.aliases import FaultHook
from replicator.pipeline.progress import ProgressReporter
from replicator.pipeline.replication import Replication, ReplicationSummary
from replicator.pipeline.signals import stop_on_signals
from replicator.planning.planner import CommitThresholds
from replicator.source import check_source, connect_source
from replicator.staging.collections import CollectionRegistry
from replicator.staging.rows import ChangeRowConverter
from replicator.staging.stager import Stager
from replicator.staging.stream import StreamStager

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from replicator.delta.executor import CommitExecutor

log = logging.getLogger(__name__)

def staging_root(config: ReplicatorConfig) -> str:
    """Where spill files go: `staging_dir`, else beside the table so executors can read them.

    ConfigError for a target on an object store without a staging dir: spill files are
    written with the driver's own filesystem calls, not Hadoop's.
    """
    if config.staging_dir:
        return str(Path(config.staging_dir))
    scheme = urlparse(config.target).scheme
    if scheme not in ("", "file"):
        raise ConfigError(
            f"the target {config.target} is on {scheme}://, where spill files cannot be "
            "written directly: set staging_dir (--staging-dir) to a directory on storage "
            "every executor can read, such as a shared mount"
        )
    return f"{config.target.removeprefix('file://').rstrip('/')}/_replicator/staging"


def staging_dir_for(config: ReplicatorConfig, owner_id: str) -> str:
    """One owner's spill directory under staging_root (shards never share one)."""
    return f"{staging_root(config)}/{owner_id}"


CHECKPOINT_EVERY = 16
"""Data commits whose checkpoint rows share one checkpoints commit (heartbeats and the end of a
run write what is queued sooner; a rollback plans from the queue too). Recovery rebuilds the
rows of a crashed run from the data commits' metadata, so queueing loses nothing."""

STOP_GRACE_S = 60.0
"""How long leaving a BackgroundRun's block waits for the stopped run to end (it commits what is
complete first)."""


class BackgroundRun:
    """`run_replication` on a thread of its own, for callers that act while it runs.

    The demo, the steady-state benchmark and the tests' fault injection all do. `stop` ends
    a continuous run (complete snapshots still commit); `replication` is there once started.
    """

    def __init__(
        self,
        config: ReplicatorConfig,
        *,
        spark: SparkSession | None = None,
        fault_hook: FaultHook | None = None,
        on_started: Callable[[Replication], None] | None = None,
        name: str = "replication",
    ) -> None:
        self.stop = threading.Event()
        self._started = threading.Event()
        self._done = threading.Event()
        self._replication: Replication | None = None
        self._summary: ReplicationSummary | None = None
        self._error: BaseException | None = None

        def started(replication: Replication) -> None:
            if on_started is not None:
                on_started(replication)
            self._replication = replication
            self._started.set()

        def run() -> None:
            try:
                self._summary = run_replication(
                    config, spark=spark, stop=self.stop, fault_hook=fault_hook,
                    on_started=started,
                )
            except BaseException as exc:  # handed to the caller by result()
                self._error = exc
            finally:
                self._started.set()
                self._done.set()

        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()

    def __enter__(self) -> BackgroundRun:
        return self

    def __exit__(self, *exc_info: object) -> None:
        # A run must not outlive its caller's block (nor the producer the block started).
        self.stop.set()
        self.wait(STOP_GRACE_S)

    @property
    def done(self) -> bool:
        """The run ended (caught up, stopped or failed)."""
        return self._done.is_set()

    def wait_started(self, timeout: float) -> Replication:
        """The running replication; the run's failure, or TimeoutError, if it never started."""
        if not self._started.wait(timeout):
            raise TimeoutError(f"the replication did not start within {timeout:g} s")
        if self._replication is None:
            self.result()  # it ended before starting: raise why
            raise RuntimeError("the replication ended before it started")
        return self._replication

    @property
    def replication(self) -> Replication:
        """The running replication (RuntimeError before it started)."""
        if self._replication is None:
            raise RuntimeError("the replication has not started")
        return self._replication

    def wait(self, timeout: float) -> bool:
        """Wait for the run to end; False if it is still running after `timeout` seconds."""
        return self._done.wait(timeout)

    def wait_for(self, condition: Callable[[], bool], *, timeout: float) -> bool:
        """Wait until `condition()` holds while the run goes on; False after `timeout` seconds.

        Raises the run's failure, or RuntimeError, if it ended before the condition held.
        """
        deadline = time.monotonic() + timeout
        while not condition():
            if self.done:
                self.result()  # raises what ended it
                raise RuntimeError("the replication ended before the awaited condition held")
            if time.monotonic() > deadline:
                return False
            self.wait(0.05)
        return True

    def catch_up(self, targets: Mapping[int, int], *, timeout: float) -> ReplicationSummary:
        """Have the run stop once every vbucket committed its seqno in `targets`; its summary.

        TimeoutError if it has not ended within `timeout` seconds; the run's own failure if it
        failed.
        """
        self.replication.request_catch_up(targets)
        if not self.wait(timeout):
            raise TimeoutError(f"the replication did not catch up within {timeout:g} s")
        return self.result()

    def result(self) -> ReplicationSummary:
        """The summary of the ended run, or the exception it ended with."""
        if not self._done.is_set():
            raise RuntimeError("the replication is still running")
        if self._error is not None:
            raise self._error
        assert self._summary is not None
        return self._summary


def run_replication(
    config: ReplicatorConfig,
    *,
    spark: SparkSession | None = None,
    stop: threading.Event | None = None,
    fault_hook: FaultHook | None = None,
    on_started: Callable[[Replication], None] | None = None,
) -> ReplicationSummary:
    """Replicate `config.source` into `config.target` until stopped or caught up.

    `fault_hook` (tests) is called with the executor's commit steps and the stager's spill
    steps (FAULT_STEPS, SPILL_FAULT_STEPS); an exception it raises acts as a fault there.
    """
    from replicator.delta.compaction import Compactor
    from replicator.delta.executor import CommitExecutor
    from replicator.delta.history import HistoryTable
    from replicator.delta.ownership import OwnersTable
    from replicator.delta.retention import MetadataPruner
    from replicator.delta.schema import MirrorConfig
    from replicator.delta.table import open_or_create
    from replicator.runtime.jars import locate_delta_jars
    from replicator.runtime.spark import build_session

    config.require_source_and_target()
    config.resolved_password()
    staging_root(config)  # fails early when spill files would have nowhere to go
    if spark is None:
        locate_delta_jars()
    stop = stop or threading.Event()
    # Installed before start-up: a SIGTERM while the session starts or the vbuckets are being
    # claimed stops the run as soon as it is up (nothing committed, its claim released), where
    # Python's default action would end it mid-claim.
    with stop_on_signals(stop), ExitStack() as cleanup:
        client = connect_source(config)
        cleanup.callback(client.close)
        vbuckets = config.vbuckets.resolve(client.cluster_map.num_vbuckets)
        source = check_source(client, config, vbuckets)
        session = spark or build_session("replicator")
        mirror = open_or_create(
            session, config.target,
            MirrorConfig(
                client.bucket,
                deleted_file_retention=_interval(config.deleted_file_retention),
                log_retention=_interval(config.log_retention),
                num_vbuckets=client.cluster_map.num_vbuckets,
            ),
        )
        owners = OwnersTable.of(mirror)
        claim = owners.claim(vbuckets)
        history = None
        if source.history:
            history = HistoryTable.of(mirror)
            history.ensure(mirror.config)
        executor = CommitExecutor(
            mirror, claim, owners, fault_hook=fault_hook, checkpoint_every=CHECKPOINT_EVERY,
            history=history, first_load_writer=config.first_load_writer,
            steady_writer=config.steady_writer, row_images=config.row_images,
            writer_process=config.writer_process,
        )
        cleanup.callback(executor.close)
        store = DeltaMirrorStore(
            executor, owners, claim, compactor=Compactor(
                mirror, claim.vbuckets,
                writer="spark" if config.steady_writer == "spark" else "arrow",
                row_images=config.row_images, packer=executor.steady_writer_if_decided,
            ),
            pruner=MetadataPruner(mirror, claim.vbuckets),
        )
        cleanup.callback(_release_quietly, store)

        registry = CollectionRegistry.from_manifest(source.manifest)
        stager = Stager(
            staging_dir_for(config, claim.owner_id),
            memory_budget_bytes=config.memory_budget_mb * 1024 * 1024,
            fault_hook=fault_hook,
        )
        cleanup.callback(stager.close)
        replication = Replication(
            source=client,
            store=store,
            stream_stager=StreamStager(stager, ChangeRowConverter(registry)),
            vbuckets=vbuckets,
            thresholds=CommitThresholds(
                max_rows=config.commit_max_rows, max_delay_seconds=config.commit_interval_s
            ),
            targets=source.targets,
            source_highs=source.highs,
            progress=ProgressReporter(config.progress, interval_s=config.status_interval_s),
            source_check_interval_s=config.source_check_interval_s,
        )
        client.resume_from(replication.committed_position)
        _follow_with_metrics(config, replication, client, executor, stager, cleanup)
        if on_started is not None:
            on_started(replication)
        log.info("replicating %d vbuckets of %s into %s", len(vbuckets), client.bucket,
                 config.target)
        summary = replication.run(stop)
    return summary


def _follow_with_metrics(
    config: ReplicatorConfig,
    replication: Replication,
    client: DcpClient,
    executor: CommitExecutor,
    stager: Stager,
    cleanup: ExitStack,
) -> None:
    """Serve and/or log the run's metrics, as `config` asks (nothing when it does not)."""
    if not config.metrics_port and not config.metrics_log_s:
        return
    from replicator.pipeline.metrics import MetricsSources, ReplicationMetrics

    metrics = ReplicationMetrics(log_every_s=config.metrics_log_s or None)
    metrics.attach(replication, MetricsSources(
        reconnects=lambda: client.reconnects,
        conflicts_retried=lambda: executor.conflicts_retried,
        staged_bytes=lambda: stager.buffered_bytes,
        spilled_bytes_total=lambda: stager.spilled_bytes_total,
    ))  # fmt: skip
    if config.metrics_port:
        metrics.serve(config.metrics_port, config.metrics_host)
        cleanup.callback(metrics.close)


def _release_quietly(store: DeltaMirrorStore) -> None:
    try:
        store.release()
    except Exception as exc:  # the lease expires anyway; a failed release must not mask errors
        log.warning("could not release the vbucket claim: %s", exc)


def _interval(text: str) -> timedelta:
    """`interval 7 days` / `7 days` / `3600 seconds` -> timedelta (Delta's interval syntax)."""
    words = text.lower().replace("interval", "").split()
    units = {"second": 1, "minute": 60, "hour": 3600, "day": 86400, "week": 604800}
    try:
        amount = float(words[0])
        unit = words[1].rstrip("s")
        return timedelta(seconds=amount * units[unit])
    except (IndexError, ValueError, KeyError):
        raise ConfigError(
            f"invalid retention {text!r}: use e.g. 'interval 7 days' or '12 hours'"
        ) from None
