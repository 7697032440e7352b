"""Driving the replicator from tests against the embedded producer.

`replicate` is one in-process run (until caught up by default); `BackgroundReplication` is a
continuous run on a thread, for faults injected while it runs. Its `progress` is published by
the replication thread after each of its steps, so the test thread reads a consistent copy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replicator.config import ReplicatorConfig, Secret
from replicator.model.aliases import FaultHook
from replicator.pipeline.replication import Replication, ReplicationSummary
from replicator.pipeline.runner import BackgroundRun, run_replication
from replicator.sim.cluster import DEFAULT_PASSWORD, SimCluster

WAIT_S = 120.0
"""Upper bound on any wait for the replicator (generous: the suite shares two cores)."""


def replicator_settings(cluster: SimCluster, target: Path, **overrides: Any) -> ReplicatorConfig:
    """A run of `cluster` into `target` until caught up, committing often; `overrides` win."""
    values: dict[str, Any] = {
        "source": cluster.connection_string,
        "target": str(target),
        "password": Secret(DEFAULT_PASSWORD),
        "until_caught_up": True,
        "commit_interval_s": 0.1,
        "progress": "off",
    }
    values.update(overrides)
    return ReplicatorConfig(**values)


def replicate(
    spark: Any,
    cluster: SimCluster,
    target: Path,
    *,
    fault_hook: FaultHook | None = None,
    on_started: Callable[[Replication], None] | None = None,
    **overrides: Any,
) -> ReplicationSummary:
    """One in-process run with `replicator_settings(cluster, target, **overrides)`."""
    return run_replication(
        replicator_settings(cluster, target, **overrides), spark=spark,
        fault_hook=fault_hook, on_started=on_started,
    )


@dataclass(frozen=True, slots=True)
class RunProgress:
    """What a background run had done after its latest step."""

    committed: Mapping[int, int] = field(default_factory=dict)
    staged_up_to: Mapping[int, int] = field(default_factory=dict)
    rollbacks: int = 0
    full_resyncs: int = 0
    peak_buffered_bytes: int = 0


class BackgroundReplication:
    """A runner.BackgroundRun with test waits; use as a context manager."""

    def __init__(
        self, spark: Any, config: ReplicatorConfig, *, fault_hook: FaultHook | None = None
    ) -> None:
        self._spark = spark
        self._config = config
        self._fault_hook = fault_hook
        self._run: BackgroundRun | None = None
        self.progress = RunProgress()

    def _publish(self, replication: Replication) -> None:
        """Runs on the replication thread after each step: the test thread reads a whole copy."""
        summary = replication.summary()
        self.progress = RunProgress(
            committed={vb: p.seqno for vb, p in replication.positions().items()},
            staged_up_to=replication.staged_up_to(),
            rollbacks=summary.rollbacks,
            full_resyncs=summary.full_resyncs,
            peak_buffered_bytes=summary.peak_buffered_bytes,
        )

    def __enter__(self) -> BackgroundReplication:
        self._run = BackgroundRun(
            self._config, spark=self._spark, fault_hook=self._fault_hook,
            on_started=lambda replication: replication.after_each_step(self._publish),
        )
        try:
            self._run.wait_started(240.0)
        except BaseException:
            # No __exit__ follows a failed __enter__: a run still starting must not outlive it.
            self._run.__exit__()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.background.__exit__(*exc_info)

    @property
    def background(self) -> BackgroundRun:
        assert self._run is not None, "the replication has not started"
        return self._run

    @property
    def replication(self) -> Replication:
        return self.background.replication

    def wait_for(
        self, condition: Callable[[], bool], what: str, *, timeout: float = WAIT_S
    ) -> None:
        """Return once `condition()` holds; fail on timeout or if the run ended first."""
        try:
            held = self.background.wait_for(condition, timeout=timeout)
        except Exception as exc:
            if not self.background.done:
                raise  # the condition itself failed: its own error says more
            raise AssertionError(f"the run ended while waiting for {what}") from exc
        if not held:
            raise AssertionError(
                f"timed out after {timeout:g} s waiting for {what}: {self.progress}"
            )

    def finish(self, targets: Mapping[int, int], *, timeout: float = 180.0) -> ReplicationSummary:
        """Catch up to `targets` (seqno per vbucket), stop, and return the summary."""
        try:
            summary = self.background.catch_up(targets, timeout=timeout)
        except TimeoutError:
            raise AssertionError(
                f"no catch-up to {dict(targets)} within {timeout:g} s: {self.progress}"
            ) from None
        assert summary.caught_up
        return summary

    def stop(self, *, timeout: float = 180.0) -> ReplicationSummary:
        """Stop as an operator's SIGTERM does (complete snapshots commit) and return the summary."""
        self.background.stop.set()
        if not self.background.wait(timeout):
            raise AssertionError(f"the run did not stop within {timeout:g} s: {self.progress}")
        return self.background.result()
