"""`replicator demo` (what `make demo` runs): the whole product in a few minutes, on one machine.

It starts the embedded producer with a multi-collection data set, mirrors it into Delta with a
progress display, applies a live workload (inserts, updates, deletes, expiries) with a failover
that forces a rollback, stops caught up, verifies the mirror against the source, and shows a
few analyst queries, including time travel. The table stays on disk for the notebooks.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from replicator.config import ReplicatorConfig, Secret
from replicator.inspect.formatting import align_columns
from replicator.pipeline.replication import ReplicationSummary
from replicator.pipeline.runner import BackgroundRun, run_replication
from replicator.sim.bucket import SimBucket
from replicator.sim.cluster import SimCluster
from replicator.sim.workload import Workload, WorkloadMix, initial_load, run_workload

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEMO_BUCKET = "travel"
DEMO_PASSWORD = "password"  # the embedded producer's default, as on a fresh dev cluster
FAILOVER_LOSES = 5


class DemoConsole:
    """Headings and results, one place for how the demo talks."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream or sys.stdout
        self._started = time.monotonic()

    def step(self, text: str) -> None:
        elapsed = time.monotonic() - self._started
        self._stream.write(f"\n== [{elapsed:5.1f}s] {text}\n")
        self._stream.flush()

    def say(self, text: str) -> None:
        self._stream.write(f"   {text}\n")
        self._stream.flush()

    def table(self, rows: list[Any], columns: list[str]) -> None:
        cells = [tuple(columns), *(tuple(str(row[name]) for name in columns) for row in rows)]
        for line in align_columns(cells):
            self.say(line)


def demo_config(cluster: SimCluster, target: Path, **overrides: Any) -> ReplicatorConfig:
    """The demo's replication settings against `cluster`, with `overrides` applied."""
    settings: dict[str, Any] = {
        "source": cluster.connection_string,
        "target": str(target),
        "password": Secret(DEMO_PASSWORD),
        "commit_interval_s": 1.0,
        "progress": "auto",
        "status_interval_s": 5.0,
    }
    settings.update(overrides)
    return ReplicatorConfig(**settings)


def run_demo(
    *,
    output_dir: str = "demo-output",
    docs: int = 20_000,
    vbuckets: int = 64,
    live_seconds: float = 8.0,
    live_rate: float = 400.0,
    spark: SparkSession | None = None,
    console: DemoConsole | None = None,
) -> int:
    """Run the demo; returns 0 when the mirror verified equal to the source."""
    from replicator.inspect.mirror import open_mirror
    from replicator.inspect.verify import run_verify
    from replicator.runtime.spark import build_session

    out = console or DemoConsole()
    target = Path(output_dir).resolve() / "mirror"
    if target.exists():
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)

    out.step(f"Starting the embedded producer: bucket {DEMO_BUCKET!r}, {vbuckets} vbuckets, "
             f"2 nodes, {docs:,} documents")
    bucket = SimBucket(DEMO_BUCKET, num_vbuckets=vbuckets, seed=2026)
    initial_load(bucket, docs=docs, doc_size=512, seed=2026)
    with SimCluster(bucket, nodes=2) as cluster:
        out.say(f"serving {cluster.connection_string}")
        out.step("Starting Spark with Delta Lake")
        session = spark or build_session("replicator-demo")
        if spark is None:
            # Delta's internal warnings (checkpointed RDDs, missing statistics) drown the story.
            session.sparkContext.setLogLevel("ERROR")

        out.step(f"Initial load into {target}")
        first = run_replication(
            demo_config(cluster, target, until_caught_up=True), spark=session
        )
        out.say(first.describe())
        initial_version = open_mirror(session, str(target)).version()

        out.step(f"Live workload for {live_seconds:.0f}s at {live_rate:.0f} changes/s, "
                 f"with a failover of one vbucket losing its last {FAILOVER_LOSES} changes")
        live = _live_phase(session, cluster, target, live_seconds, live_rate, out)
        out.say(live.describe())

        out.step("Verifying the mirror against the producer")
        report = run_verify(demo_config(cluster, target), spark=session)
        out.say(report.describe())

        out.step("Analyst queries")
        _analyst_queries(session, target, initial_version, out)

    out.step(f"Done. The mirror is at {target}; open notebooks/ to explore it.")
    return 0 if report.equal else 1


def build_sample_mirror(
    spark: SparkSession, root: Path, *, console: DemoConsole | None = None
) -> str:
    """A small mirror under `root` with a known shape, for the notebooks; returns its path.

    A few hundred documents in 8 vbuckets, loaded; a round of updates, deletes and inserts;
    then the busiest vbucket fails over to a replica that lacked its last 3 changes, which
    the mirror had committed, so it rolls that vbucket back.
    """
    out = console or DemoConsole()
    target = root / "mirror"
    bucket = SimBucket("shop", num_vbuckets=8, seed=2026)
    mix = WorkloadMix(inserts=0.2, updates=0.6, deletes=0.2, expiries=0.0)
    workload = initial_load(bucket, docs=400, doc_size=200, seed=2026, mix=mix)
    with SimCluster(bucket, nodes=1) as cluster:
        config = demo_config(
            cluster, target, until_caught_up=True, commit_interval_s=0.2, progress="off"
        )
        out.say(run_replication(config, spark=spark).describe())  # the initial load
        changed = bucket.apply_batch(workload.next_batch(150))
        out.say(run_replication(config, spark=spark).describe())
        victim, count = Counter(item.vbucket for item in changed).most_common(1)[0]
        cluster.failover(victim, lose_last=min(3, count))
        bucket.apply_batch(workload.next_batch(60))
        out.say(run_replication(config, spark=spark).describe())
    return str(target)


def _live_phase(
    spark: SparkSession,
    cluster: SimCluster,
    target: Path,
    seconds: float,
    rate: float,
    out: DemoConsole,
) -> ReplicationSummary:
    """Replicate continuously while the workload runs; fail one vbucket over halfway."""
    bucket = cluster.bucket
    config = demo_config(cluster, target, progress="off")
    # Leaving the block stops the run: it must not outlive the demo's producer.
    with BackgroundRun(config, spark=spark, name="demo-replication") as run:
        replication = run.wait_started(timeout=300)
        mix = WorkloadMix(inserts=4, updates=4, deletes=1, expiries=1)

        before = Workload(seed=7, mix=mix, doc_size=512, expiry_ttl_s=(1, 3))
        before.ensure_collections(bucket)
        report = run_workload(bucket, rate, workload=before, duration_s=seconds / 2)
        victim, high = max(bucket.high_seqnos().items(), key=lambda item: item[1])

        # Fail over only once the changes about to be lost are committed: then the mirror
        # holds history the producer no longer has, and must roll that vbucket back.
        def victim_committed() -> bool:
            position = replication.positions().get(victim)
            return position is not None and position.seqno >= high

        if not run.wait_for(victim_committed, timeout=300):
            raise TimeoutError("the demo waited 300 s for the replicator to commit")
        cluster.failover(victim, lose_last=FAILOVER_LOSES)
        out.say(f"{report.ops} changes applied; failed over vbucket {victim} "
                f"(new failover log head {bucket.failover_log(victim).newest.vbucket_uuid:#x})")
        after = Workload(seed=8, mix=mix, doc_size=512, expiry_ttl_s=(1, 3))
        report = run_workload(bucket, rate, workload=after, duration_s=seconds / 2)
        out.say(f"{report.ops} more changes applied after the failover")
        bucket.run_expiry_pager()
        return run.catch_up(bucket.high_seqnos(), timeout=600)


def _analyst_queries(
    spark: SparkSession, target: Path, initial_version: int, out: DemoConsole
) -> None:
    from replicator.inspect.commits import rollbacks

    spark.read.format("delta").load(str(target)).createOrReplaceTempView("mirror")
    out.say("Documents per collection:")
    out.table(
        spark.sql(
            "SELECT scope, collection, count(*) AS documents FROM mirror "
            "GROUP BY scope, collection ORDER BY scope, collection"
        ).collect(),
        ["scope", "collection", "documents"],
    )
    out.say("")
    out.say("Orders by status, from the JSON documents:")
    out.table(
        spark.sql(
            "SELECT get_json_object(doc, '$.status') AS status, count(*) AS orders, "
            "round(sum(CAST(get_json_object(doc, '$.total') AS DOUBLE)), 2) AS total "
            "FROM mirror WHERE collection = 'orders' GROUP BY 1 ORDER BY 2 DESC"
        ).collect(),
        ["status", "orders", "total"],
    )
    out.say("")
    then = spark.sql(
        f"SELECT count(*) AS n FROM delta.`{target}` VERSION AS OF {initial_version}"
    ).first()
    now = spark.sql("SELECT count(*) AS n FROM mirror").first()
    out.say(f"Time travel: {then['n'] if then else 0:,} documents at version {initial_version} "
            f"(end of the initial load), {now['n'] if now else 0:,} now.")
    out.say("")
    out.say("Rollbacks recorded in the table history:")
    for record in rollbacks(spark, str(target)):
        out.say(record.explain())
