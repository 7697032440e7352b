"""Issue 5's guarantees end to end: whole snapshots only, nothing lost, nothing applied twice.

The embedded producer serves over TCP; the replicator runs in-process with the real Delta
layer. A crash is an exception raised from the executor's fault hook at a named step of the
commit sequence; the restart is a new run against the same target.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from delta.tables import DeltaTable

from replicator.delta.executor import FAULT_STEPS, CommitExecutor, WriteStrategy
from replicator.delta.failover_logs import FailoverLogsTable
from replicator.delta.schema import MirrorLayout
from replicator.pipeline.replication import ReplicationSummary
from replicator.sim.bucket import DocumentRecord, SimBucket
from replicator.sim.cluster import SimCluster
from replicator.sim.workload import Workload, WorkloadMix, initial_load
from replicator.soak.table_log import newest_version
from tests.mirror_check import (
    ReadersView,
    assert_every_version_consistent,
    assert_mirror_equals_bucket,
    assert_no_change_applied_twice,
)
from tests.replication_runs import replicate as replicate_once

pytestmark = pytest.mark.spark


class SimulatedCrash(Exception):
    pass


@dataclass
class CommitCrash:
    """A fault hook: crash at `step` of the `occurrence`-th data commit of kind `strategy`.

    The executor only names the step; which kind of commit is under way comes from the batch
    being executed (`watch` records it): its first-load part is APPENDed first, then the rest
    MERGEd, each part passing the steps and ending at after_checkpoint.
    """

    step: str
    strategy: WriteStrategy
    occurrence: int = 1
    parts: list[WriteStrategy] = field(default_factory=list)
    seen: int = 0
    interrupted: WriteStrategy | None = None

    def watch(self, monkeypatch: pytest.MonkeyPatch) -> None:
        execute = CommitExecutor.execute

        def recording(executor: CommitExecutor, batch: Any) -> Any:
            self.parts = [
                strategy
                for strategy, present in (
                    (WriteStrategy.APPEND, any(c.first_load for c in batch.commits)),
                    (WriteStrategy.MERGE, any(not c.first_load for c in batch.commits)),
                )
                if present
            ]
            return execute(executor, batch)

        monkeypatch.setattr(CommitExecutor, "execute", recording)

    def __call__(self, name: str) -> None:
        if name not in FAULT_STEPS or not self.parts:
            return
        current = self.parts[0]
        if name == "after_checkpoint":
            self.parts.pop(0)
        if name == self.step and current is self.strategy:
            self.seen += 1
            if self.seen == self.occurrence:
                self.interrupted = current
                raise SimulatedCrash(f"crash at {name} of a {current.value}")


CRASH_ROUNDS = (
    # The first load is at least two APPENDs (300 rows, 150 a batch, vbuckets never split),
    # so this crash lands after one made it, leaving a partial first load.
    ("after_checkpoint", WriteStrategy.APPEND, 2),
    # Every later round's 100 changes touch the vbuckets already loaded: a MERGE follows.
    ("before_data_commit", WriteStrategy.MERGE, 1),
    ("after_data_commit", WriteStrategy.MERGE, 1),
)


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
    spark: Any, cluster: SimCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "mirror"
    bucket = cluster.bucket
    assert {step for step, _, _ in CRASH_ROUNDS} == set(FAULT_STEPS)
    landed_at: dict[int, WriteStrategy] = {}
    for round_, (step, strategy, occurrence) in enumerate(CRASH_ROUNDS):
        crash = CommitCrash(step, strategy, occurrence)
        crash.watch(monkeypatch)
        with pytest.raises(SimulatedCrash):
            replicate(spark, cluster, target, fault_hook=crash)
        assert crash.interrupted is strategy, f"round {round_} crashed in no {strategy.value}"
        if step != "before_data_commit":  # the interrupted commit landed: it is the newest
            landed = newest_version(target)
            assert landed is not None
            landed_at[landed] = strategy
        apply_changes(bucket, 100, seed=round_)
    monkeypatch.undo()
    summary = replicate(spark, cluster, target)

    assert summary.caught_up
    assert_mirror_equals_bucket(spark, str(target), bucket)
    assert_no_change_applied_twice(spark, str(target))
    assert assert_every_version_consistent(spark, str(target), bucket) >= 4
    history = {row["version"]: row for row in DeltaTable.forPath(spark, str(target)).history()
               .select("version", "operation", "userMetadata").collect()}
    for version, strategy in landed_at.items():
        assert json.loads(history[version]["userMetadata"])["strategy"] == strategy.value
        assert history[version]["operation"] == (
            "MERGE" if strategy is WriteStrategy.MERGE else "WRITE"
        )
    # Saved on each stream request of every restart: the producer's logs, whole.
    stored = FailoverLogsTable(spark, MirrorLayout(str(target)).failover_logs).load()
    assert stored == {vb: bucket.failover_log(vb) for vb in range(bucket.num_vbuckets)}


def expire_some(bucket: SimBucket) -> DocumentRecord:
    """Expirations from the producer (an explicit expire and the expiry pager) and a touch to
    an expiry already past that no pager visits; returns the touched document's old record."""
    now = int(time.time())
    past_expiry, paged, expired = bucket.documents()[:3]
    bucket.touch(past_expiry.key, now - 3600, collection=past_expiry.collection)
    bucket.expire(expired.key, collection=expired.collection)
    bucket.touch(paged.key, now - 7200, collection=paged.collection)
    assert bucket.run_expiry_pager(now=now - 5400) == 1  # `paged` only
    return past_expiry


def test_updates_deletes_expiries_duplicates_and_group_commits_match_the_producer(
    spark: Any, cluster: SimCluster, tmp_path: Path
) -> None:
    target = tmp_path / "mirror"
    bucket = cluster.bucket
    replicate(spark, cluster, target, commit_max_rows=100_000, commit_interval_s=1.0)
    apply_changes(bucket, 400, seed=9)
    touched = expire_some(bucket)
    replicate(spark, cluster, target, commit_max_rows=100_000, commit_interval_s=1.0)

    # The touched document is still the producer's, past its expiry; the mirror dropped it.
    assert touched.key in {r.key for r in bucket.documents(vbucket=touched.vbucket)}
    mirrored = spark.read.format("delta").load(str(target)).where(
        f"vbucket = {touched.vbucket} AND key = '{touched.key.decode()}'"
    )
    assert mirrored.count() == 0
    readers_view = ReadersView(bucket)
    assert_mirror_equals_bucket(spark, str(target), readers_view)
    assert_no_change_applied_twice(spark, str(target))
    assert_every_version_consistent(spark, str(target), readers_view)
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
        # A 1 MiB flow-control window, a 18 MB snapshot: the stream only gets to the end of
        # it if every staged chunk is acknowledged long before the snapshot can commit.
        summary = replicate(
            spark, cluster, tmp_path / "mirror", memory_budget_mb=8, commit_max_rows=1_000_000,
            staging_dir=str(tmp_path / "staging"), flow_control_window_kb=1024,
        )
        assert summary.commits == 1
        assert summary.spilled_bytes > 2**20  # Parquet compresses the padding
        assert summary.peak_buffered_bytes <= 8 * 2**20 + 4 * 2**20  # budget + one chunk
        assert_mirror_equals_bucket(spark, str(tmp_path / "mirror"), bucket)
    leftovers = [p for p in (tmp_path / "staging").rglob("*") if p.is_file()]
    assert leftovers == [], "spill files must be removed once their commit landed"
