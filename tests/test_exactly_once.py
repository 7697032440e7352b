"""Issue 5's guarantees end to end: whole snapshots only, nothing lost, nothing applied twice.

The embedded producer serves over TCP; the replicator runs in-process with the real Delta
layer. A crash is an exception raised from the executor's fault hook at a named step of the
commit sequence; the restart is a new run against the same target.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from delta.tables import DeltaTable

from replicator.delta.executor import FAULT_STEPS
from replicator.replication import ReplicationSummary
from replicator.sim.bucket import SimBucket
from replicator.sim.cluster import SimCluster
from replicator.sim.workload import Workload, WorkloadMix, initial_load
from tests.mirror_check import (
    assert_every_version_consistent,
    assert_mirror_equals_bucket,
    assert_no_change_applied_twice,
)
from tests.replication_runs import replicate as replicate_once

pytestmark = pytest.mark.spark


class SimulatedCrash(Exception):
    pass


def crash_at(step: str, occurrence: int = 1) -> Callable[[str], None]:
    seen = {"count": 0}

    def hook(name: str) -> None:
        if name == step:
            seen["count"] += 1
            if seen["count"] == occurrence:
                raise SimulatedCrash(f"crash at {step}")

    return hook


def replicate(
    spark: Any, cluster: SimCluster, target: Path, **overrides: Any
) -> ReplicationSummary:
    """A run that commits at most 150 rows at a time, so a load is several commits."""
    return replicate_once(spark, cluster, target, **{"commit_max_rows": 150, **overrides})


@pytest.fixture
def cluster() -> Iterator[SimCluster]:
    bucket = SimBucket("ledger", num_vbuckets=6, seed=5, may_contain_duplicates=True)
    initial_load(bucket, docs=300, doc_size=120, seed=5)
    with SimCluster(bucket, nodes=2) as running:
        yield running


def apply_changes(bucket: SimBucket, count: int, seed: int) -> None:
    workload = Workload(seed=seed, mix=WorkloadMix(inserts=3, updates=5, deletes=2, expiries=0))
    workload.ensure_collections(bucket)
    for _ in range(count // 50):
        bucket.apply_batch(workload.next_batch(50))


def test_crash_at_every_commit_step_then_restart_loses_and_repeats_nothing(
    spark: Any, cluster: SimCluster, tmp_path: Path
) -> None:
    target = tmp_path / "mirror"
    bucket = cluster.bucket
    for round_, step in enumerate(FAULT_STEPS):
        # The first load is at least two commits (300 rows, 150 a batch, vbuckets never
        # split), so its crash lands after one made it; later rounds' 100 changes may all
        # fit in a single commit, so they crash in their first.
        occurrence = 2 if round_ == 0 else 1
        with pytest.raises(SimulatedCrash):
            replicate(spark, cluster, target, fault_hook=crash_at(step, occurrence=occurrence))
        apply_changes(bucket, 100, seed=round_)
    summary = replicate(spark, cluster, target)

    assert summary.caught_up
    assert_mirror_equals_bucket(spark, str(target), bucket)
    assert_no_change_applied_twice(spark, str(target))
    assert assert_every_version_consistent(spark, str(target), bucket) >= 4


def test_updates_deletes_duplicates_and_group_commits_match_the_producer(
    spark: Any, cluster: SimCluster, tmp_path: Path
) -> None:
    target = tmp_path / "mirror"
    bucket = cluster.bucket
    replicate(spark, cluster, target, commit_max_rows=100_000, commit_interval_s=1.0)
    apply_changes(bucket, 400, seed=9)
    replicate(spark, cluster, target, commit_max_rows=100_000, commit_interval_s=1.0)

    assert_mirror_equals_bucket(spark, str(target), bucket)
    assert_no_change_applied_twice(spark, str(target))
    assert_every_version_consistent(spark, str(target), bucket)
    history = DeltaTable.forPath(spark, str(target)).history().collect()
    widest = max(
        len(json.loads(row["userMetadata"])["positions"])
        for row in history
        if row["userMetadata"] and '"positions"' in row["userMetadata"]
    )
    assert widest >= 4, "a group commit should carry several vbuckets' snapshots"


def test_a_first_snapshot_larger_than_the_memory_budget_spills_and_commits_whole(
    spark: Any, tmp_path: Path
) -> None:
    bucket = SimBucket("big", num_vbuckets=1, seed=3)
    initial_load(bucket, docs=6_000, doc_size=3_000, seed=3)  # ~18 MB in one disk snapshot
    with SimCluster(bucket, nodes=1) as cluster:
        summary = replicate(
            spark, cluster, tmp_path / "mirror", memory_budget_mb=8, commit_max_rows=1_000_000,
            staging_dir=str(tmp_path / "staging"),
        )
        assert summary.commits == 1
        assert summary.spilled_bytes > 2**20  # Parquet compresses the padding
        assert summary.peak_buffered_bytes <= 8 * 2**20 + 4 * 2**20  # budget + one chunk
        assert_mirror_equals_bucket(spark, str(tmp_path / "mirror"), bucket)
    leftovers = [p for p in (tmp_path / "staging").rglob("*") if p.is_file()]
    assert leftovers == [], "spill files must be removed once their commit landed"
