"""The operator's commands end to end, against the embedded producer over 127.0.0.1.

One story, because every Spark process costs many seconds: `replicator run --until-caught-up`
is stopped with SIGTERM in the middle of the initial load, restarted to completion, inspected
with `status`, compared with `verify`, caught up again by the spark-submit job after the source
changed, and finally tampered with so that `verify` names the differing keys. Tests run in file
order; the last one changes the source and the mirror.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from chispa import assert_df_equality

from replicator.cli.main import EXIT_DIFFERENT, EXIT_OK, main
from replicator.sim.bucket import SimBucket
from replicator.sim.cluster import SimCluster
from replicator.sim.workload import initial_load
from replicator.soak.table_log import table_versions
from tests.cli import (
    FAST_START_JAVA_OPTIONS,
    PASSWORD,
    REPO,
    CliRun,
    clean_env,
    run_and_signal,
    run_cli,
)
from tests.mirror_check import assert_mirror_equals_bucket, expected_frame, mirror_frame

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(1500)]

VBUCKETS = 16
DOCS = 2400
SLOW_NODE = 1
SLOW_BYTES_PER_SECOND = 4_000
"""Node 1's vbuckets trickle in, so a stop lands after node 0's vbuckets were committed and
before node 1's backfills completed."""
SPARK_RUN_TIMEOUT = 900.0
"""Generous: a Spark process on a busy two-core machine takes minutes, not seconds."""


@dataclass(frozen=True)
class InterruptedLoad:
    """What the stopped and the restarted run did."""

    cluster: SimCluster
    target: Path
    stopped: CliRun
    stop_version: int
    restarted: CliRun


@pytest.fixture(scope="module")
def cluster() -> Iterator[SimCluster]:
    bucket = SimBucket("travel", num_vbuckets=VBUCKETS, seed=11)
    initial_load(bucket, docs=DOCS, doc_size=300, seed=11)
    with SimCluster(bucket, nodes=2, users={"Administrator": PASSWORD}) as running:
        yield running


@pytest.fixture(scope="module")
def interrupted_load(
    cluster: SimCluster, tmp_path_factory: pytest.TempPathFactory
) -> InterruptedLoad:
    """`replicator run --until-caught-up`, SIGTERM after its first commit, then a restart."""
    work = tmp_path_factory.mktemp("e2e")
    target = work / "mirror"
    args = [
        "run", "--source", cluster.connection_string, "--target", str(target),
        "--until-caught-up", "--commit-interval-s", "0.5", "--progress", "lines",
    ]
    cluster.slow_sending(SLOW_BYTES_PER_SECOND, node=SLOW_NODE)
    # Small commits: the first lands while node 1's backfills still trickle in. Version 0
    # creates the table; version 1 is the first data commit.
    stopped = run_and_signal(
        [*args, "--commit-max-rows", "100"],
        until=lambda: 1 in table_versions(target), what="the first data commit",
        timeout=SPARK_RUN_TIMEOUT, logs=work / "stopped", cwd=REPO,
        env=clean_env(REPLICATOR_STATUS_INTERVAL_S="1"),
    )
    stop_version = max(table_versions(target))

    cluster.slow_sending(None)
    restarted = run_cli(*args, timeout=SPARK_RUN_TIMEOUT)
    return InterruptedLoad(cluster, target, stopped, stop_version, restarted)


def data_history(spark: Any, target: Path) -> list[Any]:
    from delta.tables import DeltaTable

    history = DeltaTable.forPath(spark, str(target)).history()
    return history.select("version", "operation", "operationMetrics", "userMetadata").orderBy(
        "version"
    ).collect()


def test_sigterm_mid_load_then_restart_equals_source_with_each_change_applied_once(
    spark: Any, interrupted_load: InterruptedLoad
) -> None:
    from replicator.delta.commit_metadata import CommitMetadata
    from replicator.delta.reader import SparkReader
    from replicator.inspect.mirror import read_mirror

    load = interrupted_load
    bucket = load.cluster.bucket
    target = str(load.target)
    for run in (load.stopped, load.restarted):
        assert PASSWORD not in run.output
        assert "Traceback" not in run.stderr

    # The stop was clean and really in the middle of the load.
    assert load.stopped.returncode == EXIT_OK, load.stopped.stderr
    assert load.stopped.stdout.startswith("stopped: "), load.stopped.stdout
    assert "received SIGTERM" in load.stopped.stderr
    history = data_history(spark, load.target)
    at_stop: dict[int, int] = {}
    for row in history:
        metadata = CommitMetadata.from_json(row["userMetadata"])
        if metadata is not None and row["version"] <= load.stop_version:
            at_stop.update({vb: p.seqno for vb, p in metadata.positions.items()})
    highs = bucket.high_seqnos()
    assert at_stop, "nothing was committed before the stop"
    assert any(at_stop.get(vb, 0) < highs[vb] for vb in highs), "the load finished before SIGTERM"
    # At the stop, the mirror held whole snapshots of the committed vbuckets, nothing else.
    assert_df_equality(
        mirror_frame(spark, target, version=load.stop_version).orderBy("vbucket", "key"),
        expected_frame(
            spark, [r for vb, seqno in at_stop.items() for r in bucket.state_at(vb, seqno)]
        ).orderBy("vbucket", "key"),
        ignore_nullable=True,
    )

    # The restart finished the load, and the mirror is the source.
    assert load.restarted.returncode == EXIT_OK, load.restarted.stderr
    assert load.restarted.stdout.startswith("caught up: "), load.restarted.stdout
    assert_mirror_equals_bucket(spark, target, bucket)

    # No change was applied twice: every document was inserted exactly once, none rewritten.
    inserted = updated = deleted = 0
    batches = set()
    for row in data_history(spark, load.target):
        metrics = row["operationMetrics"] or {}
        if row["operation"] == "WRITE":
            inserted += int(metrics.get("numOutputRows", 0))
        elif row["operation"] == "MERGE":
            inserted += int(metrics.get("numTargetRowsInserted", 0))
            updated += int(metrics.get("numTargetRowsUpdated", 0))
            deleted += int(metrics.get("numTargetRowsDeleted", 0))
        metadata = CommitMetadata.from_json(row["userMetadata"])
        if metadata is not None:
            key = (metadata.owner_id, metadata.batch_id, metadata.part)
            assert key not in batches, f"batch {key} committed twice"
            batches.add(key)
    assert (inserted, updated, deleted) == (DOCS, 0, 0)
    # And recovery sees every vbucket at the source's high seqno.
    positions = read_mirror(SparkReader(spark), target, bucket="travel").checkpoints
    assert {vb: c.seqno for vb, c in positions.items()} == highs


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> CliRun:
    """`replicator ARGS` in this process (on the shared Spark session)."""
    code = main(list(args))
    captured = capsys.readouterr()
    assert PASSWORD not in captured.out + captured.err
    return CliRun(code, captured.out, captured.err)


@pytest.fixture
def operator_env(monkeypatch: pytest.MonkeyPatch) -> Callable[[bool], None]:
    """Set (or leave out) the password, as an operator's shell would."""
    import os

    for name in list(os.environ):
        if name.startswith("REPLICATOR_") and name != "REPLICATOR_JAR_CACHE":
            monkeypatch.delenv(name)

    def with_password(present: bool) -> None:
        if present:
            monkeypatch.setenv("REPLICATOR_PASSWORD", PASSWORD)
        else:
            monkeypatch.delenv("REPLICATOR_PASSWORD", raising=False)

    return with_password


def test_status_of_the_caught_up_mirror(
    spark: Any,
    interrupted_load: InterruptedLoad,
    operator_env: Callable[[bool], None],
    capsys: pytest.CaptureFixture[str],
) -> None:
    load = interrupted_load
    highs = load.cluster.bucket.high_seqnos()
    target = str(load.target)

    operator_env(False)  # reading the mirror alone needs no password
    shown = run_main(capsys, "status", "--target", target, "--json")
    assert shown.returncode == EXIT_OK, shown.stderr
    document = json.loads(shown.stdout)
    assert document["bucket"] == "travel"
    assert {vb["vbucket"]: vb["seqno"] for vb in document["vbuckets"]} == highs
    summary = document["summary"]
    assert summary["vbuckets_mirrored"] == VBUCKETS
    assert summary["seqnos_committed"] == sum(highs.values())
    assert (summary["rollbacks"], summary["owners_live"], summary["lag"]) == (0, 0, None)
    assert summary["last_commit"] is not None

    operator_env(True)
    shown = run_main(capsys, "status", "--target", target, "--source",
                     load.cluster.connection_string)
    assert shown.returncode == EXIT_OK, shown.stderr
    first, *rest = shown.stdout.splitlines()
    assert first.startswith(f"mirror of bucket 'travel' at {target}")
    assert f"{VBUCKETS} of {VBUCKETS} vbuckets mirrored" in first
    assert f"{sum(highs.values())} seqnos committed" in first
    assert first.endswith("rollbacks 0, owners live 0, lag 0 seqnos in 0 vbuckets")
    table = [line.split() for line in rest if line and line.split()[0].isdigit()]
    assert {int(cells[0]): int(cells[1]) for cells in table} == highs
    assert {cells[-2]: cells[-1] for cells in table} == {str(h): "0" for h in highs.values()}


def spark_submit_job(cluster: SimCluster, target: Path) -> CliRun:
    """`spark-submit jobs/replicate.py --until-caught-up`, the Delta jars passed with --jars."""
    from replicator.runtime.jars import locate_delta_jars

    jars = ",".join(str(path) for path in locate_delta_jars().paths)
    spark_submit = Path(sys.executable).parent / "spark-submit"
    completed = subprocess.run(
        [
            str(spark_submit), "--master", "local[2]", "--jars", jars,
            "--driver-java-options", FAST_START_JAVA_OPTIONS,
            str(REPO / "jobs" / "replicate.py"),
            "--source", cluster.connection_string, "--target", str(target), "--until-caught-up",
            "--commit-interval-s", "0.5", "--progress", "off",
        ],
        env=clean_env(
            PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
            SPARK_LOCAL_IP="127.0.0.1",
        ),
        capture_output=True, text=True, timeout=SPARK_RUN_TIMEOUT, cwd=REPO, check=False,
    )
    return CliRun(completed.returncode, completed.stdout, completed.stderr)


def key_in(bucket: SimBucket, vbucket: int, prefix: str) -> str:
    """A new key that hashes to `vbucket`."""
    return next(
        key for key in (f"{prefix}_{n}" for n in range(10_000))
        if bucket.vbucket_for(key) == vbucket
    )


def change_source(bucket: SimBucket) -> set[int]:
    """An update, a delete, an insert and an expiring insert, in vbuckets 0-3; returns those."""
    updated, deleted = bucket.documents(vbucket=0)[3], bucket.documents(vbucket=1)[4]
    bucket.upsert(updated.key, {"changed": True}, collection=updated.collection)
    bucket.delete(deleted.key, collection=deleted.collection)
    bucket.upsert(key_in(bucket, 2, "late"), {"n": 1})
    bucket.upsert(key_in(bucket, 3, "expiring"), {"n": 2}, expiry=int(time.time()) + 3600)
    return {0, 1, 2, 3}


def test_verify_catches_source_changes_the_job_catches_up_and_tampering_is_named(
    spark: Any,
    interrupted_load: InterruptedLoad,
    operator_env: Callable[[bool], None],
    capsys: pytest.CaptureFixture[str],
) -> None:
    from replicator.config import ReplicatorConfig, Secret
    from replicator.inspect.verify import run_verify

    load = interrupted_load
    cluster, bucket, target = load.cluster, load.cluster.bucket, str(load.target)
    operator_env(True)
    verify_args = ("verify", "--source", cluster.connection_string, "--target", target)

    equal = run_main(capsys, *verify_args)
    assert equal.returncode == EXIT_OK, equal.output
    assert equal.stdout.startswith("verify of bucket 'travel' against")
    assert f"EQUAL: {VBUCKETS} vbuckets, {VBUCKETS} equal" in equal.stdout
    assert f"{DOCS} documents compared" in equal.stdout

    before = bucket.high_seqnos()
    changed = change_source(bucket)
    assert {vb for vb, high in bucket.high_seqnos().items() if high != before[vb]} == changed
    behind = run_main(capsys, *verify_args)
    assert behind.returncode == EXIT_DIFFERENT, behind.output
    reported = {
        int(line.split()[1].rstrip(":"))
        for line in behind.stdout.splitlines()
        if "not at the same boundary: mirror at seqno" in line
    }
    assert reported == changed
    assert "replicator run --until-caught-up" in behind.stdout

    job = spark_submit_job(cluster, load.target)
    assert job.returncode == EXIT_OK, job.stderr[-3000:]
    assert "caught up: " in job.stdout
    assert PASSWORD not in job.output and "Traceback" not in job.stderr
    assert_mirror_equals_bucket(spark, target, bucket)
    config = ReplicatorConfig(
        source=cluster.connection_string, target=target, password=Secret(PASSWORD)
    )
    assert run_verify(config, spark=spark).equal
    # An hour and a half later the expiring document counts as expired on both sides.
    later = run_verify(config, spark=spark, now=lambda: time.time() + 5400)
    assert later.equal and later.expired_ignored == 1
    later = run_verify(config, engine="delta-rs", now=lambda: time.time() + 5400)
    assert later.equal and later.expired_ignored == 1

    # Tamper with one vbucket of the mirror: a row lost, a row altered, a row invented.
    vb = sorted(set(range(VBUCKETS)) - changed)[0]
    lost, altered = (r for r in bucket.documents(vbucket=vb)[:2])
    spark.sql(f"DELETE FROM delta.`{target}` WHERE vbucket = {vb} AND key = '{lost.key.decode()}'")
    spark.sql(
        f"UPDATE delta.`{target}` SET doc = '{{\"tampered\":true}}' "
        f"WHERE vbucket = {vb} AND key = '{altered.key.decode()}'"
    )
    different = run_main(capsys, *verify_args, "--max-keys", "5")
    assert different.returncode == EXIT_DIFFERENT, different.output
    lines = different.stdout.splitlines()
    assert f"{VBUCKETS - 1} equal, 0 not at the same boundary, 1 different" in lines[0]
    assert lines[1].startswith(f"vbucket {vb}: different at seqno {bucket.high_seqnos()[vb]}: "
                               "1 missing in mirror, 0 extra in mirror, 1 different")
    lost_scope, _, lost_collection = lost.collection.partition(".")
    assert (
        f"  missing in mirror: {lost_scope}.{lost_collection} {lost.key.decode()!r} "
        f"(source seqno {lost.seqno})"
    ) in lines
    assert any(
        line.startswith("  different: ") and repr(altered.key.decode()) in line
        for line in lines
    )
    # The command read the mirror with delta-rs (deletion vectors included); Spark agrees.
    assert run_verify(config, spark=spark).describe(max_keys=5) == different.stdout.rstrip("\n")
