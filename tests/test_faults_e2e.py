"""Issue 9: network faults and bad input against the whole replicator (DCP -> snapshots -> Delta).

The embedded producer serves over TCP and injects the faults; the replicator runs in-process in
continuous mode on a thread (`BackgroundReplication`), so a fault lands while it is streaming.
`finish` then asks it to catch up to the producer's current high seqnos and stop. Every
scenario ends with the mirror equal to the producer and no change applied twice; where the
producer's history is unbroken, also with every table version a whole-snapshot state.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from replicator.config import ReplicatorConfig
from replicator.delta.table import table_version
from replicator.errors import ReplicatorError
from replicator.inspect.commits import rollbacks
from replicator.pipeline.runner import run_replication
from replicator.sim.bucket import SimBucket, Upsert
from replicator.sim.cluster import SimCluster
from replicator.sim.failover_table import StreamRangeError, StreamRequest
from replicator.sim.faults import MalformedFrame
from replicator.sim.server import ServerOptions
from replicator.sim.workload import Workload, WorkloadMix, initial_load
from replicator.staging.stager import StagingError
from tests.mirror_check import (
    assert_every_version_consistent,
    assert_mirror_equals_bucket,
    assert_no_change_applied_twice,
    mirror_frame,
)
from tests.replication_runs import BackgroundReplication, replicator_settings

pytestmark = pytest.mark.spark

VBUCKETS = 8
NO_EXPIRIES = WorkloadMix(inserts=4, updates=4, deletes=2, expiries=0)
"""Writes only: a TTL of seconds could lapse before a loaded machine streams the document."""


def settings(cluster: SimCluster, tmp_path: Path, **overrides: Any) -> ReplicatorConfig:
    """A continuous run (unless overridden) with its spill files in the test's directory."""
    values: dict[str, Any] = {
        "staging_dir": str(tmp_path / "staging"),
        "until_caught_up": False,
        "commit_interval_s": 0.5,
        "commit_max_rows": 10_000,
    }
    values.update(overrides)
    return replicator_settings(cluster, tmp_path / "mirror", **values)


def write_changes(bucket: SimBucket, workload: Workload, batches: int, size: int = 20) -> None:
    for _ in range(batches):
        bucket.apply_batch(workload.next_batch(size))


def fresh_workload(bucket: SimBucket, seed: int) -> Workload:
    """A workload for after a fault: inserts, updates and deletes, no expiries (no clock)."""
    workload = Workload(seed=seed, doc_size=300, mix=NO_EXPIRIES)
    workload.ensure_collections(bucket)
    bucket.apply_batch(workload.inserts(40))  # live documents for the updates and deletes
    return workload


def log_count(caplog: pytest.LogCaptureFixture, fragment: str) -> int:
    return sum(1 for record in caplog.records if fragment in record.getMessage())


def logged_more(
    caplog: pytest.LogCaptureFixture, fragment: str, *, than: int
) -> Callable[[], bool]:
    return lambda: log_count(caplog, fragment) > than


def assert_mirror_complete(spark: Any, target: str, bucket: SimBucket, *, versions: bool) -> None:
    assert_mirror_equals_bucket(spark, target, bucket)
    assert_no_change_applied_twice(spark, target)
    if versions:
        assert assert_every_version_consistent(spark, target, bucket) >= 2


@pytest.fixture
def info_logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="replicator")
    return caplog


@pytest.fixture
def backfill_cluster() -> Iterator[SimCluster]:
    """8 vbuckets on 2 nodes, ~100 KB of backfill per vbucket, streamed 16 items at a time so
    every vbucket's disk snapshot is in flight at once."""
    bucket = SimBucket("fleet", num_vbuckets=VBUCKETS, seed=21)
    initial_load(bucket, docs=800, doc_size=1000, seed=21, mix=NO_EXPIRIES)
    with SimCluster(bucket, nodes=2, options=ServerOptions(items_per_pull=16)) as running:
        yield running


def caught_up_with(run: BackgroundReplication, bucket: SimBucket) -> bool:
    return dict(run.progress.committed) == bucket.high_seqnos()


def dcp_sessions(cluster: SimCluster) -> int:
    return sum(1 for s in cluster.sessions() if s.dcp_name and not s.closed)


def connections_replaced(
    cluster: SimCluster, caplog: pytest.LogCaptureFixture, *, nodes: int
) -> bool:
    """The client reconnected once for each connection it lost, and the producer has let go of
    the broken ones: a fault injected now reaches the connections that carry the streams (a
    broken one the producer has not yet seen closed would take it, and nothing would break)."""
    replaced = log_count(caplog, "reconnected to") >= log_count(caplog, "connection lost")
    return replaced and dcp_sessions(cluster) == nodes


def no_vbucket_committed(run: BackgroundReplication) -> bool:
    return all(seqno == 0 for seqno in run.progress.committed.values())


def rows_staged_mid_snapshot(run: BackgroundReplication) -> bool:
    return run.progress.peak_buffered_bytes > 0 and no_vbucket_committed(run)


# --- network faults ---------------------------------------------------------------------------


def test_connection_dropped_mid_snapshot_through_a_tiny_window_on_a_slow_network(
    spark: Any, backfill_cluster: SimCluster, tmp_path: Path, info_logs: pytest.LogCaptureFixture
) -> None:
    cluster, bucket = backfill_cluster, backfill_cluster.bucket
    cluster.slow_sending(400_000)
    config = settings(cluster, tmp_path, flow_control_window_kb=16)
    with BackgroundReplication(spark, config) as run:
        run.wait_for(lambda: rows_staged_mid_snapshot(run), "rows of the first snapshots")
        cluster.drop_connections()
        assert no_vbucket_committed(run), "the drop must land before any snapshot completed"
        run.wait_for(lambda: log_count(info_logs, "stream ended (DISCONNECTED)") > 0,
                     "the dropped streams to be handed up")
        cluster.slow_sending(None)
        write_changes(bucket, fresh_workload(bucket, seed=1), batches=5)
        summary = run.finish(bucket.high_seqnos())

    # 16 KB of window against ~100 KB per vbucket snapshot: acks were not held for commits.
    assert summary.items_committed >= 800
    assert_mirror_complete(spark, config.target, bucket, versions=True)


def test_stalled_producer_is_declared_dead_and_replaced(
    spark: Any, tmp_path: Path, info_logs: pytest.LogCaptureFixture
) -> None:
    bucket = SimBucket("fleet", num_vbuckets=VBUCKETS, seed=22)
    workload = initial_load(bucket, docs=200, doc_size=300, seed=22, mix=NO_EXPIRIES)
    with SimCluster(bucket, nodes=2) as cluster:
        config = settings(cluster, tmp_path, noop_interval_s=1)
        with BackgroundReplication(spark, config) as run:
            run.wait_for(lambda: caught_up_with(run, bucket), "the initial load to be committed")
            stalled = cluster.sessions(0)
            cluster.stall(0)
            write_changes(bucket, workload, batches=3)
            run.wait_for(lambda: log_count(info_logs, "presumed dead") > 0,
                         "the silent connection to be declared dead", timeout=15.0)
            cluster.release(0)
            assert all(session.wait_closed(5.0) for session in stalled)
            run.wait_for(lambda: any(s.dcp_name for s in cluster.sessions(0) if s not in stalled),
                         "a new DCP connection to node 0")
            write_changes(bucket, workload, batches=3)
            run.finish(bucket.high_seqnos())
    assert_mirror_complete(spark, config.target, bucket, versions=False)


def test_rebalance_moves_vbuckets_mid_snapshot_and_after_adding_a_node(
    spark: Any, backfill_cluster: SimCluster, tmp_path: Path, info_logs: pytest.LogCaptureFixture
) -> None:
    cluster, bucket = backfill_cluster, backfill_cluster.bucket
    cluster.slow_sending(400_000)
    config = settings(cluster, tmp_path)
    with BackgroundReplication(spark, config) as run:
        run.wait_for(lambda: rows_staged_mid_snapshot(run), "rows of the first snapshots")
        moved = cluster.rebalance("rotate")
        assert no_vbucket_committed(run), "the move must land before any snapshot completed"
        run.wait_for(lambda: log_count(info_logs, "stream ended (STATE_CHANGED)") > 0,
                     "the moved streams to end")
        cluster.slow_sending(None)
        workload = fresh_workload(bucket, seed=2)
        write_changes(bucket, workload, batches=3)
        cluster.add_node()
        spread = cluster.rebalance("spread")
        assert spread.active_nodes != moved.active_nodes and 2 in spread.active_nodes
        write_changes(bucket, workload, batches=3)
        run.finish(bucket.high_seqnos())

    assert log_count(info_logs, "stream ended (STATE_CHANGED)") >= VBUCKETS
    assert_mirror_complete(spark, config.target, bucket, versions=False)


@pytest.fixture
def restart_cluster() -> Iterator[SimCluster]:
    bucket = SimBucket("fleet", num_vbuckets=VBUCKETS, seed=23)
    initial_load(bucket, docs=240, doc_size=300, seed=23, mix=NO_EXPIRIES)
    with SimCluster(bucket, nodes=2) as running:
        yield running


def test_producer_restart_keeping_its_data_resumes_the_streams(
    spark: Any, restart_cluster: SimCluster, tmp_path: Path, info_logs: pytest.LogCaptureFixture
) -> None:
    cluster, bucket = restart_cluster, restart_cluster.bucket
    config = settings(cluster, tmp_path)
    with BackgroundReplication(spark, config) as run:
        workload = fresh_workload(bucket, seed=3)
        write_changes(bucket, workload, batches=2)
        run.wait_for(lambda: caught_up_with(run, bucket), "the changes to be committed")
        cluster.restart_node(0)
        write_changes(bucket, workload, batches=2)
        summary = run.finish(bucket.high_seqnos())
    assert summary.rollbacks == 0
    assert log_count(info_logs, "stream ended (DISCONNECTED)") >= len(cluster.node_vbuckets(0))
    assert_mirror_complete(spark, config.target, bucket, versions=False)


def test_producer_restart_losing_its_last_items_rolls_the_mirror_back(
    spark: Any, restart_cluster: SimCluster, tmp_path: Path
) -> None:
    """The unclean restart lands mid-run: node 1's vbuckets lose their last 3 items and start
    a new history branch; the run rolls them back, together, and a new run catches up."""
    cluster, bucket = restart_cluster, restart_cluster.bucket
    config = settings(cluster, tmp_path)
    hit = cluster.node_vbuckets(1)
    with BackgroundReplication(spark, config) as run:
        write_changes(bucket, fresh_workload(bucket, seed=4), batches=2)
        run.wait_for(lambda: caught_up_with(run, bucket), "the changes to be committed")
        cluster.restart_node(1, lose_last=3)
        write_changes(bucket, fresh_workload(bucket, seed=5), batches=2)
        run.wait_for(lambda: run.progress.rollbacks >= len(hit),
                     "the mirror to roll the vbuckets back")
    summary = run_replication(settings(cluster, tmp_path, until_caught_up=True), spark=spark)
    assert summary.caught_up
    assert_mirror_equals_bucket(spark, config.target, bucket)
    assert assert_no_change_applied_twice(spark, config.target) >= set(hit)
    # Their answers arrive together: they share commits (a commit each cost 4 to 7 s).
    records = [r for r in rollbacks(spark, config.target) if r.vbucket in hit]
    assert sorted({r.vbucket for r in records}) == sorted(hit)
    assert len({r.table_version for r in records}) < len(hit)


def test_producer_restart_wiping_its_data_empties_those_vbuckets(
    spark: Any, tmp_path: Path
) -> None:
    """Node 0 comes back with empty vbuckets (default collection only: no system event is
    replayed, the high seqno is 0) and nothing is written to them again. The producer never
    sends anything for them, yet the mirror must drop their rows."""
    bucket = SimBucket("fleet", num_vbuckets=4, seed=28)
    bucket.apply_batch([Upsert(f"doc-{n}", {"n": n}) for n in range(80)])
    with SimCluster(bucket, nodes=2) as cluster:
        config = settings(cluster, tmp_path)
        wiped = cluster.node_vbuckets(0)
        with BackgroundReplication(spark, config) as run:
            run.wait_for(lambda: caught_up_with(run, bucket), "the documents to be committed")
            cluster.restart_node(0, wipe=True)
            assert all(bucket.high_seqnos()[vb] == 0 for vb in wiped)
            run.wait_for(lambda: run.progress.full_resyncs >= len(wiped),
                         "the wiped vbuckets to be resynced")
            summary = run.finish(bucket.high_seqnos())
        assert summary.rollbacks >= len(wiped) and summary.full_resyncs >= len(wiped)
    assert not [r for r in bucket.documents() if r.vbucket in wiped]
    assert_mirror_equals_bucket(spark, config.target, bucket)
    assert assert_no_change_applied_twice(spark, config.target) >= set(wiped)


def test_resume_beyond_the_producer_high_seqno_erange_rolls_back(
    spark: Any, tmp_path: Path, info_logs: pytest.LogCaptureFixture
) -> None:
    """kv_engine answers ERANGE, not rollback, when start > high seqno yet the failover table
    still vouches for the consumer's branch (an entry at or above its seqno, NOTES.md section 5).
    Failovers of the simulator drop such entries, so the vbucket is made to answer as kv_engine
    does in that state; the replicator must treat it as data loss and roll back."""
    bucket = SimBucket("fleet", num_vbuckets=VBUCKETS, seed=24)
    workload = initial_load(bucket, docs=200, doc_size=300, seed=24, mix=NO_EXPIRIES)
    lossy = 5
    with SimCluster(bucket, nodes=2) as cluster:
        config = settings(cluster, tmp_path, until_caught_up=True)
        run_replication(config, spark=spark)
        write_changes(bucket, workload, batches=2, size=40)
        run_replication(config, spark=spark)
        vbucket = bucket.vbucket(lossy)
        committed = vbucket.high_seqno
        cluster.failover(lossy, lose_last=4)
        answer = vbucket.stream_request

        def erange_beyond_high(request: StreamRequest) -> Any:
            if request.start_seqno > vbucket.high_seqno:
                return StreamRangeError(f"start {request.start_seqno} beyond the high seqno")
            return answer(request)

        vbucket.stream_request = erange_beyond_high  # type: ignore[method-assign]
        summary = run_replication(config, spark=spark)

    assert committed > bucket.high_seqnos()[lossy]
    assert summary.rollbacks >= 1
    assert log_count(info_logs, "beyond the producer's high seqno") >= 1
    assert_mirror_equals_bucket(spark, config.target, bucket)
    assert assert_no_change_applied_twice(spark, config.target) == {lossy}


# --- bad input --------------------------------------------------------------------------------


def test_malformed_frames_replace_the_connection_and_streams_resume(
    spark: Any, tmp_path: Path, info_logs: pytest.LogCaptureFixture
) -> None:
    bucket = SimBucket("fleet", num_vbuckets=VBUCKETS, seed=25)
    workload = initial_load(bucket, docs=200, doc_size=300, seed=25, mix=NO_EXPIRIES)
    with SimCluster(bucket, nodes=2) as cluster:
        config = settings(cluster, tmp_path)
        with BackgroundReplication(spark, config) as run:
            for kind in MalformedFrame:
                lost_before = log_count(info_logs, "connection lost")
                run.wait_for(lambda: connections_replaced(cluster, info_logs, nodes=2),
                             "a new DCP connection to each node, the broken ones gone")
                assert cluster.send_malformed_frame(kind) >= 1
                write_changes(bucket, workload, batches=1, size=30)
                run.wait_for(logged_more(info_logs, "connection lost", than=lost_before),
                             f"the {kind.value} frame to break its connection")
            write_changes(bucket, workload, batches=2)
            run.finish(bucket.high_seqnos())
    assert_mirror_complete(spark, config.target, bucket, versions=True)


def test_disk_full_while_spilling_commits_nothing_partial_and_says_what_to_do(
    spark: Any, tmp_path: Path
) -> None:
    bucket = SimBucket("fleet", num_vbuckets=2, seed=26)
    initial_load(bucket, docs=40, doc_size=300, seed=26, mix=NO_EXPIRIES)
    with SimCluster(bucket, nodes=1) as cluster:
        config = settings(cluster, tmp_path, until_caught_up=True, memory_budget_mb=8)
        run_replication(config, spark=spark)
        version_before = table_version(spark, config.target)
        rows_before = mirror_frame(spark, config.target).count()
        bucket.apply_batch(Workload(seed=27, doc_size=3000).inserts(3600))  # ~11 MB > 8 MB

        def disk_full(step: str) -> None:
            if step == "before_spill_write":
                raise OSError(errno.ENOSPC, "No space left on device")

        with pytest.raises(StagingError) as failure:
            run_replication(config, spark=spark, fault_hook=disk_full)
        message = str(failure.value)
        assert isinstance(failure.value, ReplicatorError)
        assert "disk is full" in message and "MiB free" in message
        assert str(tmp_path / "staging") in message and "memory_budget_mb" in message
        assert table_version(spark, config.target) == version_before
        assert mirror_frame(spark, config.target).count() == rows_before
        assert [p for p in (tmp_path / "staging").rglob("*") if p.is_file()] == []

        summary = run_replication(config, spark=spark)
        assert summary.spilled_bytes > 0
    assert_mirror_complete(spark, config.target, bucket, versions=True)
