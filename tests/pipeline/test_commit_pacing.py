"""When the replication loop commits: paced by how long the last commit took and, in a run with
targets, by whether everything up to them is staged; in the background while staging goes on,
but never across a stream that must resume from the committed boundary.

A real producer over TCP and real staging, with a store that only records batches and makes
its first commit take 20 s of a clock the test moves (no Delta: the scheduling is the driver's).
The pacing tests commit on the replication thread, so that each step's outcome is settled
when it returns.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from replicator.config import ReplicatorConfig, Secret
from replicator.dcp.cluster.batch import EventBatch
from replicator.dcp.cluster.client import DcpClient
from replicator.dcp.protocol.events import StreamEnd, StreamEndReason
from replicator.model.mirror import RecoveredMirror, RollbackOutcome, RollbackRequest
from replicator.model.positions import FailoverLog, VbucketPosition
from replicator.pipeline.replication import Replication
from replicator.planning.planner import CommitBatch, CommitThresholds, CommitTrigger
from replicator.sim.bucket import SimBucket
from replicator.sim.cluster import DEFAULT_PASSWORD, SimCluster
from replicator.source import connect_source
from replicator.staging.collections import CollectionRegistry
from replicator.staging.rows import ChangeRowConverter
from replicator.staging.stager import Stager
from replicator.staging.stream import StreamStager
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

    def rollback(self, requests: Sequence[RollbackRequest]) -> list[RollbackOutcome]:
        raise AssertionError("no rollback expected")

    def heartbeat(self) -> None:
        pass


def step_until(replication: Replication, seqno: int, vbucket: int = 0) -> None:
    """Step until the vbucket's staged snapshots (ready, or waiting in a chunk to be
    converted) reach `seqno` (a real producer: bounded)."""
    for _ in range(200):
        if replication.staged_up_to().get(vbucket, 0) >= seqno:
            return
        replication.step(poll_timeout=0.05)
    raise AssertionError(f"vbucket {vbucket} never staged up to seqno {seqno}")


@contextmanager
def replication_over(
    cluster: SimCluster,
    tmp_path: Path,
    store: RecordingStore,
    clock: ManualClock,
    *,
    vbuckets: tuple[int, ...],
    targets: Mapping[int, int] | None = None,
    commit_in_background: bool = False,
) -> Iterator[tuple[Replication, Stager, DcpClient]]:
    """A started Replication of `vbuckets` from the cluster into `store`, its stager and client.

    Its client reopens a stream that ended early from the replication's committed position,
    as `replicator run` does."""
    holder: list[Replication] = []
    source = connect_source(
        ReplicatorConfig(source=cluster.connection_string, password=Secret(DEFAULT_PASSWORD)),
        committed_position=lambda vbucket: holder[0].committed_position(vbucket),
    )
    stager = Stager(tmp_path / "staging", clock=clock)
    try:
        registry = CollectionRegistry.from_manifest(source.collections_manifest())
        replication = Replication(
            source=source,
            store=store,
            stream_stager=StreamStager(stager, ChangeRowConverter(registry)),
            vbuckets=vbuckets,
            thresholds=CommitThresholds(max_delay_seconds=DELAY_S),
            targets=targets,
            clock=clock,
            commit_in_background=commit_in_background,
        )
        holder.append(replication)
        replication.start()
        yield replication, stager, source
    finally:
        stager.close()
        source.close()


def one_vbucket_of_five_documents(name: str, *, seed: int) -> SimBucket:
    """A bucket of one vbucket holding seqnos 1 to 5."""
    bucket = SimBucket(name, num_vbuckets=1, seed=seed)
    for index in range(5):
        bucket.upsert(f"first-{index}", {"n": index})
    return bucket


def test_after_a_slow_commit_the_next_batch_waits_as_long_as_it_took(tmp_path: Path) -> None:
    bucket = one_vbucket_of_five_documents("paced", seed=1)
    clock = ManualClock(1000.0)
    store = RecordingStore(clock)
    with SimCluster(bucket, nodes=1) as cluster, replication_over(
        cluster, tmp_path, store, clock, vbuckets=(0,)
    ) as (replication, _, _):
        step_until(replication, 5)
        clock.now += DELAY_S
        replication.step(poll_timeout=0.0)
        assert len(store.batches) == 1  # the configured delay: and it took 20 s

        for index in range(3):
            bucket.upsert(f"second-{index}", {"n": index})
        step_until(replication, 8)
        clock.now += DELAY_S + 1
        replication.step(poll_timeout=0.0)
        assert len(store.batches) == 1, "after a 20 s commit, 3 s of waiting is too soon"
        clock.now += SLOW_COMMIT_S - DELAY_S
        replication.step(poll_timeout=0.0)
        assert len(store.batches) == 2
        assert store.batches[1].positions[0].seqno == 8


def test_a_run_with_targets_commits_once_every_target_is_staged_not_before(
    tmp_path: Path,
) -> None:
    bucket = SimBucket("targeted", num_vbuckets=2, seed=2)
    for vbucket in (0, 1):
        for key in bucket.keys_in_vbucket(vbucket, 3, f"first-{vbucket}"):
            bucket.upsert(key, {"vb": vbucket})
    later = bucket.keys_in_vbucket(1, 2, "later")
    highs = bucket.high_seqnos()
    # Vbucket 1's target lies two writes beyond what the producer holds yet.
    targets = {0: highs[0], 1: highs[1] + len(later)}
    clock = ManualClock(1000.0)  # never moved: the commit delay never runs out
    store = RecordingStore(clock)
    with SimCluster(bucket, nodes=1) as cluster, replication_over(
        cluster, tmp_path, store, clock, vbuckets=(0, 1), targets=targets
    ) as (replication, _, _):
        step_until(replication, highs[0], vbucket=0)
        step_until(replication, highs[1], vbucket=1)
        replication.step(poll_timeout=0.0)
        assert store.batches == [], "vbucket 1's target is not staged yet"

        for key in later:
            bucket.upsert(key, {"vb": 1})
        # The step that stages vbucket 1's target commits; the clock has not moved.
        for _ in range(200):
            if store.batches:
                break
            replication.step(poll_timeout=0.05)
        assert len(store.batches) == 1
        assert store.batches[0].trigger is CommitTrigger.TARGETS_STAGED
        assert {vb: p.seqno for vb, p in store.batches[0].positions.items()} == targets


class RollbackRecordingStore(RecordingStore):
    """Also records the rollbacks it is asked for, and rewinds each to its rollback seqno."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock)
        self.rollbacks: list[tuple[int, int, int]] = []
        """(vbucket, rollback seqno, committed seqno the driver rolled back from)."""
        self.rollback_calls: list[int] = []
        """How many vbuckets each call to `rollback` handed over."""

    def rollback(self, requests: Sequence[RollbackRequest]) -> list[RollbackOutcome]:
        self.rollback_calls.append(len(requests))
        outcomes = []
        for request in requests:
            assert request.failover_log is not None
            vbucket, seqno = request.vbucket, request.rollback_seqno
            self.rollbacks.append((vbucket, seqno, request.committed.seqno))
            position = VbucketPosition.at_boundary(
                vbucket, request.failover_log.newest.vbucket_uuid, seqno
            )
            outcomes.append(RollbackOutcome(vbucket, position, False, None))
        return outcomes


class InFlightStore(RollbackRecordingStore):
    """Holds its first commit until the replication thread has been handed the StreamEnd of a
    failover, so that the StreamEnd arrives while that commit is in flight."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock)
        self.commit_started = threading.Event()
        self.stream_ended = threading.Event()

    def commit(self, batch: CommitBatch, *, replace: frozenset[int]) -> int:
        if not self.batches:
            self.commit_started.set()
            if not self.stream_ended.wait(timeout=30):
                raise AssertionError("the failover's StreamEnd never reached the driver")
        return super().commit(batch, replace=replace)


def test_staging_goes_on_during_a_commit_and_a_stream_resumes_after_what_it_commits(
    tmp_path: Path,
) -> None:
    bucket = one_vbucket_of_five_documents("overlapped", seed=3)
    clock = ManualClock(1000.0)
    store = InFlightStore(clock)
    with SimCluster(bucket, nodes=1) as cluster, replication_over(
        cluster, tmp_path, store, clock, vbuckets=(0,), commit_in_background=True
    ) as (replication, stager, source):
        poll = source.poll

        def watching_poll(timeout: float = 1.0, *, max_events: int | None = None) -> EventBatch:
            batch = poll(timeout, max_events=max_events)
            if any(
                isinstance(event, StreamEnd) and event.reason is StreamEndReason.STATE_CHANGED
                for event in batch
            ):
                store.stream_ended.set()
            return batch

        source.poll = watching_poll  # type: ignore[method-assign]
        step_until(replication, 5)
        clock.now += DELAY_S
        replication.step(poll_timeout=0.0)
        assert store.commit_started.wait(timeout=30), "the batch up to seqno 5 never started"

        # The commit is held, and the replication goes on streaming and staging.
        for index in range(3):
            bucket.upsert(f"second-{index}", {"n": index})
        step_until(replication, 8)
        assert replication.stats.commits == 0, "the held commit was taken as landed"
        # Until a commit may be planned, the new items wait in chunks, converted in one go.
        assert [run.end_seqno for run in stager.ready(0)] == [5]

        # A failover that loses seqnos 5 to 8 ends the stream while the commit is in flight.
        # The stream must resume from the seqno that commit reaches, and so roll back from it.
        cluster.failover(0, lose_last=4)
        for _ in range(200):
            if store.rollbacks:
                break
            replication.step(poll_timeout=0.05)
        assert [batch.positions[0].seqno for batch in store.batches] == [5]
        assert replication.stats.commits == 1
        assert store.rollbacks == [(0, 4, 5)]
        assert replication.positions()[0].seqno == 4


def test_the_rollbacks_of_one_failover_reach_the_store_together(tmp_path: Path) -> None:
    # An unclean restart of node 1 makes each of its vbuckets lose its last 2 of 3 items: their
    # stream requests are all answered ROLLBACK, and the store gets them in one call (one
    # commit), not one call per vbucket, even when they come one poll at a time.
    bucket = SimBucket("failover", num_vbuckets=8, seed=4)
    for vbucket in range(8):
        for key in bucket.keys_in_vbucket(vbucket, 3, f"first-{vbucket}"):
            bucket.upsert(key, {"vb": vbucket})
    clock = ManualClock(1000.0)  # never past the longest wait: only a quiet poll ends it
    store = RollbackRecordingStore(clock)
    with SimCluster(bucket, nodes=2) as cluster, replication_over(
        cluster, tmp_path, store, clock, vbuckets=tuple(range(8))
    ) as (replication, _, source):
        poll = source.poll

        def one_event_at_a_time(
            timeout: float = 1.0, *, max_events: int | None = None
        ) -> EventBatch:
            return poll(timeout, max_events=1)

        source.poll = one_event_at_a_time  # type: ignore[method-assign]
        for vbucket in range(8):
            step_until(replication, 3, vbucket=vbucket)
        clock.now += DELAY_S
        replication.step(poll_timeout=0.0)
        assert [sorted(b.positions) for b in store.batches] == [list(range(8))]
        hit = cluster.node_vbuckets(1)
        assert len(hit) > 1

        cluster.restart_node(1, lose_last=2)
        for _ in range(400):
            if store.rollbacks:
                break
            replication.step(poll_timeout=0.05)

        assert store.rollback_calls == [len(hit)]
        assert sorted(store.rollbacks) == [(vb, 1, 3) for vb in sorted(hit)]
        assert {vb: replication.positions()[vb].seqno for vb in hit} == dict.fromkeys(hit, 1)
        # The streams reopen from there, on the new history: no second rollback.
        bucket.upsert(bucket.keys_in_vbucket(hit[0], 1, "after")[0], {"vb": hit[0]})
        step_until(replication, 2, vbucket=hit[0])
        assert store.rollback_calls == [len(hit)]
