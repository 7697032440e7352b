"""The replication loop paces its group commits by how long the last one took.

A real producer over TCP and real staging, with a store that only records batches and makes
its first commit take 20 s of a clock the test moves (no Delta: the pacing is the driver's).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from replicator.config import ReplicatorConfig, Secret
from replicator.dcp.positions import FailoverLog, VbucketPosition
from replicator.replication import RecoveredMirror, Replication, RollbackOutcome
from replicator.runner import connect_source
from replicator.sim.bucket import SimBucket
from replicator.sim.cluster import DEFAULT_PASSWORD, SimCluster
from replicator.snapshots.planner import CommitBatch, CommitThresholds
from replicator.snapshots.rows import ChangeRowConverter, CollectionRegistry
from replicator.snapshots.staging import Stager, StreamStager
from tests.clocks import ManualClock

DELAY_S = 2.0
SLOW_COMMIT_S = 20.0


class RecordingStore:
    """Accepts every batch; the first commit takes SLOW_COMMIT_S of the clock."""

    def __init__(self, clock: ManualClock) -> None:
        self._clock = clock
        self.batches: list[CommitBatch] = []

    def recover(self, vbuckets: tuple[int, ...]) -> RecoveredMirror:
        return RecoveredMirror(positions={}, failover_logs={}, next_batch_id=0)

    def save_failover_logs(self, logs: Mapping[int, FailoverLog]) -> None:
        pass

    def commit(self, batch: CommitBatch, *, replace: frozenset[int]) -> int:
        if not self.batches:
            self._clock.now += SLOW_COMMIT_S
        self.batches.append(batch)
        return len(self.batches)

    def rollback(
        self, vbucket: int, rollback_seqno: int, *, committed: VbucketPosition,
        failover_log: FailoverLog | None, reason: str,
    ) -> RollbackOutcome:
        raise AssertionError("no rollback expected")

    def heartbeat(self) -> None:
        pass


def step_until(replication: Replication, stager: Stager, seqno: int) -> None:
    """Step until vbucket 0's staged snapshots reach `seqno` (a real producer: bounded)."""
    for _ in range(200):
        ready = stager.ready_snapshots().get(0, ())
        if any(run.end_seqno >= seqno for run in ready):
            return
        replication.step(poll_timeout=0.05)
    raise AssertionError(f"vbucket 0 never staged up to seqno {seqno}")


def test_after_a_slow_commit_the_next_batch_waits_as_long_as_it_took(tmp_path: Path) -> None:
    bucket = SimBucket("paced", num_vbuckets=1, seed=1)
    for index in range(5):
        bucket.upsert(f"first-{index}", {"n": index})
    clock = ManualClock(1000.0)
    store = RecordingStore(clock)
    with SimCluster(bucket, nodes=1) as cluster:
        source = connect_source(
            ReplicatorConfig(
                source=cluster.connection_string, password=Secret(DEFAULT_PASSWORD)
            )
        )
        stager = Stager(tmp_path / "staging", clock=clock)
        try:
            registry = CollectionRegistry.from_manifest(source.collections_manifest())
            replication = Replication(
                source=source,
                store=store,
                stream_stager=StreamStager(stager, ChangeRowConverter(registry)),
                vbuckets=(0,),
                thresholds=CommitThresholds(max_delay_seconds=DELAY_S),
                clock=clock,
            )
            replication.start()
            step_until(replication, stager, 5)
            clock.now += DELAY_S
            replication.step(poll_timeout=0.0)
            assert len(store.batches) == 1  # the configured delay: and it took 20 s

            for index in range(3):
                bucket.upsert(f"second-{index}", {"n": index})
            step_until(replication, stager, 8)
            clock.now += DELAY_S + 1
            replication.step(poll_timeout=0.0)
            assert len(store.batches) == 1, "after a 20 s commit, 3 s of waiting is too soon"
            clock.now += SLOW_COMMIT_S - DELAY_S
            replication.step(poll_timeout=0.0)
            assert len(store.batches) == 2
            assert store.batches[1].positions[0].seqno == 8
        finally:
            stager.close()
            source.close()
