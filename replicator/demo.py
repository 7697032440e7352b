"""`replicator demo` (what `make demo` runs): the whole product in a few minutes, on one machine.

It starts the embedded producer with a multi-collection data set, mirrors it into Delta with a
progress display, applies a live workload (inserts, updates, deletes, expiries) with a failover
that forces a rollback, stops caught up, verifies the mirror against the source, and shows a
few analyst queries, including time travel. The table stays on disk for the notebooks.
"""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from replicator.config import ReplicatorConfig, Secret
from replicator.replication import Replication, ReplicationSummary
from replicator.runner import run_replication
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
        widths = [
            max(len(name), *(len(str(row[name])) for row in rows)) if rows else len(name)
            for name in columns
        ]
        self.say("  ".join(name.ljust(w) for name, w in zip(columns, widths, strict=True)))
        for row in rows:
            self.say("  ".join(str(row[n]).ljust(w) for n, w in zip(columns, widths, strict=True)))


def demo_config(cluster: SimCluster, target: Path, **overrides: Any) -> ReplicatorConfig:
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
    from replicator.spark import build_session
    from replicator.verify import run_verify

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

        out.step(f"Initial load into {target}")
        first = run_replication(
            demo_config(cluster, target, until_caught_up=True), spark=session
        )
        out.say(first.describe())
        initial_version = _latest_version(session, target)

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
    started = threading.Event()
    holder: dict[str, Replication] = {}
    result: dict[str, ReplicationSummary] = {}
    errors: list[BaseException] = []

    def on_started(replication: Replication) -> None:
        holder["replication"] = replication
        started.set()

    def replicate() -> None:
        try:
            result["summary"] = run_replication(
                demo_config(cluster, target, progress="off"), spark=spark, on_started=on_started
            )
        except BaseException as exc:  # surfaced on the main thread below
            errors.append(exc)
            started.set()

    mix = WorkloadMix(inserts=4, updates=4, deletes=1, expiries=1)
    thread = threading.Thread(target=replicate, name="demo-replication", daemon=True)
    thread.start()
    if not started.wait(timeout=300) or errors:
        raise errors[0] if errors else TimeoutError("replication did not start within 300 s")

    before = Workload(seed=7, mix=mix, doc_size=512, expiry_ttl_s=(1, 3))
    before.ensure_collections(bucket)
    report = run_workload(bucket, rate, workload=before, duration_s=seconds / 2)
    victim, high = max(bucket.high_seqnos().items(), key=lambda item: item[1])
    # Fail over only once the changes about to be lost are committed: then the mirror holds
    # history the producer no longer has, and must roll that vbucket back.
    def victim_committed() -> bool:
        position = holder["replication"].positions().get(victim)
        return position is not None and position.seqno >= high

    _wait_until(victim_committed, timeout=300)
    cluster.failover(victim, lose_last=FAILOVER_LOSES)
    out.say(f"{report.ops} changes applied; failed over vbucket {victim} "
            f"(new failover log head {bucket.failover_log(victim).newest.vbucket_uuid:#x})")
    after = Workload(seed=8, mix=mix, doc_size=512, expiry_ttl_s=(1, 3))
    report = run_workload(bucket, rate, workload=after, duration_s=seconds / 2)
    out.say(f"{report.ops} more changes applied after the failover")
    bucket.run_expiry_pager()
    holder["replication"].request_catch_up(bucket.high_seqnos())
    thread.join(timeout=600)
    if errors:
        raise errors[0]
    if thread.is_alive():
        raise TimeoutError("the live replication did not catch up within 600 s")
    return result["summary"]


def _wait_until(condition: Callable[[], bool], *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the demo waited {timeout:.0f}s for the replicator to commit")
        time.sleep(0.1)


def _latest_version(spark: SparkSession, target: Path) -> int:
    from delta.tables import DeltaTable

    row = DeltaTable.forPath(spark, str(target)).history(1).select("version").first()
    return int(row[0]) if row is not None else 0


def _analyst_queries(
    spark: SparkSession, target: Path, initial_version: int, out: DemoConsole
) -> None:
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
    history = spark.sql(f"DESCRIBE HISTORY delta.`{target}`").where(
        "userMetadata LIKE '%\"kind\":\"rollback\"%' OR userMetadata LIKE '%\"kind\":\"resync\"%'"
    )
    for row in history.orderBy("version").collect():
        meta = json.loads(row["userMetadata"])
        out.say(f"version {row['version']}: {meta['kind']} of vbucket {meta.get('vbucket')} "
                f"from seqno {meta.get('from_seqno')} to {meta.get('to_seqno')} "
                f"({meta.get('reason')})")
