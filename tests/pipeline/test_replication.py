"""End to end: the embedded producer over TCP -> DCP client -> staging -> Delta, in one process."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from replicator.config import ReplicatorConfig, Secret
from replicator.delta.failover_logs import FailoverLogsTable
from replicator.delta.schema import MirrorLayout
from replicator.pipeline.runner import BackgroundRun, run_replication
from replicator.planning.planner import CommitTrigger
from replicator.sim.bucket import SimBucket
from replicator.sim.cluster import SimCluster
from replicator.sim.workload import initial_load
from replicator.soak.table_log import commits_after, newest_version
from tests.mirror_check import assert_mirror_equals_bucket
from tests.replication_runs import WAIT_S

pytestmark = pytest.mark.spark


@pytest.fixture
def cluster() -> Iterator[SimCluster]:
    bucket = SimBucket("travel", num_vbuckets=8, seed=7)
    initial_load(bucket, docs=400, doc_size=200, seed=7)
    with SimCluster(bucket, nodes=2) as running:
        yield running


def config_for(cluster: SimCluster, target: Path, **overrides: Any) -> ReplicatorConfig:
    settings: dict[str, Any] = {
        "source": cluster.connection_string,
        "target": str(target),
        "password": Secret("password"),
        "until_caught_up": True,
        "commit_interval_s": 0.2,
        "progress": "off",
    }
    settings.update(overrides)
    return ReplicatorConfig(**settings)


def test_initial_load_until_caught_up_equals_source(
    spark: Any, cluster: SimCluster, tmp_path: Path
) -> None:
    summary = run_replication(config_for(cluster, tmp_path / "mirror"), spark=spark)
    assert summary.caught_up
    assert summary.items_committed >= 400
    assert_mirror_equals_bucket(spark, str(tmp_path / "mirror"), cluster.bucket)


def test_a_run_until_caught_up_commits_once_its_targets_are_staged_not_after_the_interval(
    spark: Any, cluster: SimCluster, tmp_path: Path
) -> None:
    target = tmp_path / "mirror"
    # An hour's commit interval: only the staged targets can make the commits due.
    with BackgroundRun(config_for(cluster, target, commit_interval_s=3600), spark=spark) as run:
        assert run.wait(WAIT_S), "the run waited out the commit interval"
        summary = run.result()

    assert summary.caught_up and summary.commits >= 1
    commits = commits_after(Path(MirrorLayout(str(target)).data), -1)
    triggers = {c.metadata.details["trigger"] for c in commits if c.metadata is not None}
    assert triggers == {CommitTrigger.TARGETS_STAGED.name.lower()}
    assert_mirror_equals_bucket(spark, str(target), cluster.bucket)


def test_a_restart_with_nothing_new_commits_nothing_but_saves_a_changed_failover_log(
    spark: Any, cluster: SimCluster, tmp_path: Path
) -> None:
    target = tmp_path / "mirror"
    layout = MirrorLayout(str(target))
    run_replication(config_for(cluster, target), spark=spark)
    data_version = newest_version(Path(layout.data))
    logs_version = newest_version(Path(layout.failover_logs))

    again = run_replication(config_for(cluster, target), spark=spark)

    assert again.caught_up and again.commits == 0
    assert newest_version(Path(layout.data)) == data_version
    # The failover logs the producer sent are the ones stored: saving them again is no commit.
    assert newest_version(Path(layout.failover_logs)) == logs_version

    cluster.failover(0, lose_last=0)  # a new branch, nothing lost: the stored log is stale
    cluster.bucket.upsert(cluster.bucket.keys_in_vbucket(0, 1, "late")[0], {"after": "failover"})
    run_replication(config_for(cluster, target), spark=spark)
    assert_mirror_equals_bucket(spark, str(target), cluster.bucket)
    stored = FailoverLogsTable(spark, layout.failover_logs).load([0])
    assert stored[0] == cluster.bucket.failover_log(0)


def test_a_sigterm_during_start_up_stops_the_run_once_it_is_up_committing_nothing(
    spark: Any, cluster: SimCluster, tmp_path: Path
) -> None:
    # The signal handler only exists in the main thread, where an operator's process runs.
    assert threading.current_thread() is threading.main_thread()
    target = tmp_path / "mirror"
    escaped: list[int] = []
    # Catches a SIGTERM the run did not handle, as Python's default action would end the run.
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: escaped.append(signum))
    try:
        summary = run_replication(
            config_for(cluster, target), spark=spark,
            # The last step of start-up, before any change is streamed.
            on_started=lambda _replication: signal.raise_signal(signal.SIGTERM),
        )
    finally:
        signal.signal(signal.SIGTERM, previous)

    assert escaped == [], "SIGTERM during start-up reached the default handler"
    assert not summary.caught_up and summary.commits == 0 and summary.items_committed == 0
    assert newest_version(Path(MirrorLayout(str(target)).data)) == 0  # created, nothing committed
    # It released its claim: a restart owns the vbuckets at once and catches up.
    assert run_replication(config_for(cluster, target), spark=spark).caught_up
    assert_mirror_equals_bucket(spark, str(target), cluster.bucket)
