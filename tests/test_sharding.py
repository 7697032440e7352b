"""Issue 11: sharded replicators mirror one bucket into one table, and conflicts are retried.

Two `replicator run --vbuckets k/2` processes write one target while a workload runs and a
vbucket of each shard fails over. Both must end caught up with the mirror equal to the
producer, every commit present in the table history, a third overlapping claim refused, and
`replicator status` showing every vbucket once with its owner. A commit that loses a race to a
concurrent commit of the same partition (forced below) is retried and lands once.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from delta.exceptions import (
    ConcurrentAppendException,
    ConcurrentDeleteReadException,
    ConcurrentTransactionException,
)

from replicator.delta.commit_metadata import CommitMetadata
from replicator.delta.conflicts import (
    ConflictRetry,
    MergeConflict,
    delta_conflict_name,
    retry_on_conflict,
)
from replicator.delta.executor import CommitExecutor
from replicator.delta.ownership import OwnersTable
from replicator.delta.schema import MirrorConfig
from replicator.delta.table import open_or_create
from replicator.model.backoff import Backoff
from replicator.sim.bucket import SimBucket
from replicator.sim.cluster import SimCluster
from replicator.sim.workload import Workload, initial_load, run_workload
from replicator.soak.process import replicator_command
from replicator.soak.table_log import commits_after
from tests.cli import PASSWORD, REPO, CliRun, clean_env, wait_until
from tests.delta.helpers import batch, delete, upsert, vbucket_commit
from tests.mirror_check import assert_mirror_equals_bucket

VBUCKETS = 8
DOCS = 400
SHARDS = {"1/2": "vb0-3", "2/2": "vb4-7"}
"""`--vbuckets` of each shard -> the owner id its claim gets (stable per vbucket set)."""
FAILED_OVER = (1, 5)
"""One vbucket of each shard."""
RUN_TIMEOUT = 300.0
WORKLOAD_OPS = 400
WORKLOAD_SECONDS = 4.0


def replicator_commits(target: Path) -> list[tuple[int, CommitMetadata]]:
    """(version, metadata) of every replicator commit, read from the log files (no Spark)."""
    return [(c.version, c.metadata) for c in commits_after(target, -1) if c.metadata is not None]


def committed_seqnos(target: Path) -> dict[int, int]:
    """Each vbucket's seqno as of the newest commit that reached it."""
    seqnos: dict[int, int] = {}
    for _, metadata in replicator_commits(target):
        seqnos.update({vb: p.seqno for vb, p in metadata.positions.items()})
    return seqnos


def caught_up(target: Path, bucket: SimBucket, vbuckets: Iterable[int] | None = None) -> bool:
    highs = bucket.high_seqnos()
    wanted = range(VBUCKETS) if vbuckets is None else vbuckets
    seqnos = committed_seqnos(target)
    return all(seqnos.get(vb) == highs[vb] for vb in wanted)


class ShardProcess:
    """A `replicator run --vbuckets SHARD` subprocess, output to files."""

    def __init__(self, work: Path, name: str, args: list[str]) -> None:
        self.stdout_path, self.stderr_path = work / f"{name}.out", work / f"{name}.err"
        with self.stdout_path.open("w") as out, self.stderr_path.open("w") as err:
            self.process = subprocess.Popen(
                [*replicator_command(), *args], stdout=out, stderr=err, env=clean_env(), cwd=REPO
            )

    def stop(self) -> CliRun:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(RUN_TIMEOUT)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait(30)
        return CliRun(code, self.stdout_path.read_text(), self.stderr_path.read_text())


def run_args(cluster: SimCluster, target: Path, vbuckets: str) -> list[str]:
    return [
        "run", "--source", cluster.connection_string, "--target", str(target),
        "--vbuckets", vbuckets, "--commit-interval-s", "0.3", "--progress", "off",
    ]


@pytest.fixture
def producer() -> Iterator[SimCluster]:
    bucket = SimBucket("travel", num_vbuckets=VBUCKETS, seed=21)
    initial_load(bucket, docs=DOCS, doc_size=200, seed=21)
    with SimCluster(bucket, nodes=1, users={"Administrator": PASSWORD}) as running:
        yield running


def live_workload(bucket: SimBucket, seed: int) -> threading.Thread:
    """WORKLOAD_OPS changes over WORKLOAD_SECONDS, in a thread (expiries far in the future)."""
    workload = Workload(seed=seed, doc_size=200, expiry_ttl_s=(3600, 7200))
    thread = threading.Thread(
        target=run_workload,
        args=(bucket, WORKLOAD_OPS / WORKLOAD_SECONDS),
        kwargs={"workload": workload, "duration_s": WORKLOAD_SECONDS, "batch_size": 10},
        daemon=True,
    )
    thread.start()
    return thread


@pytest.mark.spark
@pytest.mark.soak
@pytest.mark.timeout(900)
def test_two_shards_with_failovers_mirror_the_bucket_and_lose_no_commit(
    spark: Any, producer: SimCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from replicator.cli.main import main

    bucket = producer.bucket
    target = tmp_path / "mirror"
    first, second = SHARDS
    shards = {first: ShardProcess(tmp_path, "shard-1", run_args(producer, target, first))}
    try:
        # The second shard starts once the first has created the mirror and claimed its
        # vbuckets: two processes creating the tables at the same instant still fail in
        # open_or_create (ProtocolChangedException escapes its creation race fallback).
        first_claim = target / "_replicator" / "owners" / "_delta_log" / f"{1:020d}.json"
        wait_until(
            lambda: first_claim.exists() or shards[first].process.poll() is not None,
            RUN_TIMEOUT, "the first shard's claim",
        )
        shards[second] = ShardProcess(tmp_path, "shard-2", run_args(producer, target, second))
        wait_until(lambda: len(committed_seqnos(target)) == VBUCKETS, RUN_TIMEOUT, "both loads")

        # Live changes while both shards stream, and meanwhile a third replicator whose range
        # overlaps both shards is refused.
        writer = live_workload(bucket, seed=1)
        intruder = subprocess.run(
            [*replicator_command(), *run_args(producer, target, "2-5")],
            env=clean_env(), cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT,
        )
        writer.join(60)
        assert not writer.is_alive(), "the workload did not finish"

        # Fail over a vbucket of each shard once its shard has committed the items it loses.
        wait_until(lambda: caught_up(target, bucket, FAILED_OVER), RUN_TIMEOUT, "the lost items")
        for vbucket in FAILED_OVER:
            producer.failover(vbucket, lose_last=3)
        writer = live_workload(bucket, seed=2)  # a fresh workload: it knows no lost keys
        writer.join(60)
        assert not writer.is_alive(), "the workload did not finish"
        wait_until(lambda: caught_up(target, bucket), RUN_TIMEOUT, "both shards to catch up")
    finally:
        runs = {spec: shard.stop() for spec, shard in shards.items()}

    assert intruder.returncode == 2, intruder.stderr
    refusal = [line for line in intruder.stderr.splitlines() if line.startswith("replicator:")]
    assert len(refusal) == 1 and "cannot claim vbuckets 2, 3, 4, 5" in refusal[0], refusal
    assert "held by owner 'vb0-3'" in refusal[0] and "held by owner 'vb4-7'" in refusal[0]
    for spec, run in runs.items():
        assert run.returncode == 0, f"shard {spec}: {run.stderr[-3000:]}"
        assert run.stdout.startswith("stopped: "), run.stdout
        assert "Traceback" not in run.stderr and PASSWORD not in run.output
        # A commit refused for a concurrent commit is retried, never given up.
        assert "still conflicting" not in run.stderr
    retried = sum(run.stderr.count("conflicted with a concurrent commit") for run in runs.values())

    assert_mirror_equals_bucket(spark, str(target), bucket)
    commits = replicator_commits(target)
    # Every commit of each shard is in the history, once: batch ids run without a gap.
    for spec, owner in SHARDS.items():
        keys = [(m.batch_id, m.part) for _, m in commits if m.owner_id == owner]
        assert len(keys) == len(set(keys)), f"{owner} committed a batch twice"
        batches = sorted({batch_id for batch_id, _ in keys})
        assert batches == list(range(1, batches[-1] + 1)), f"{owner} lost batches: {batches}"
        owned = {vb for _, m in commits if m.owner_id == owner for vb in m.positions}
        assert owned == set(range(0, 4) if spec == "1/2" else range(4, 8))
    rolled_back = {
        vb for _, m in commits if m.kind in ("rollback", "resync") for vb in m.positions
    }
    assert rolled_back == set(FAILED_OVER)

    # `replicator status` shows both shards' vbuckets in one view, each once with its owner.
    assert main(["status", "--target", str(target), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [vb["vbucket"] for vb in document["vbuckets"]] == list(range(VBUCKETS))
    assert {vb["vbucket"]: vb["seqno"] for vb in document["vbuckets"]} == bucket.high_seqnos()
    assert {vb["vbucket"]: vb["owner"] for vb in document["vbuckets"]} == {
        vb: "vb0-3" if vb < 4 else "vb4-7" for vb in range(VBUCKETS)
    }
    assert main(["status", "--target", str(target)]) == 0
    shown = capsys.readouterr().out.splitlines()
    header = next(line for line in shown if line.lstrip().startswith("vbucket"))
    assert header.split()[-1] == "owner"
    # Numeric columns are right-aligned: vbucket rows start with spaces.
    table = [line.split() for line in shown if line.lstrip()[:1].isdigit()]
    assert {int(cells[0]): cells[-1] for cells in table} == {
        vb: "vb0-3" if vb < 4 else "vb4-7" for vb in range(VBUCKETS)
    }
    print(f"conflicts retried by the shards: {retried}")


# --- conflicts -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (ConcurrentAppendException("[DELTA_CONCURRENT_APPEND] Files were added to partition "
                                   "[vbucket=3]"), "ConcurrentAppendException"),
        (ConcurrentDeleteReadException("[DELTA_CONCURRENT_DELETE_READ]"),
         "ConcurrentDeleteReadException"),
        (ConcurrentTransactionException("[DELTA_CONCURRENT_TRANSACTION]"),
         "ConcurrentTransactionException"),
        (MergeConflict("other writers took 5 versions in a row"), "MergeConflict"),
        (RuntimeError("ConcurrentAppendException named in the text of another error"), None),
    ],
)
def test_delta_conflicts_are_named_from_their_exception_class(
    error: Exception, expected: str | None
) -> None:
    assert delta_conflict_name(error) == expected


def test_conflict_retries_are_bounded_and_paced_by_the_shared_backoff() -> None:
    assert ConflictRetry().backoff == Backoff(initial=0.2, maximum=5.0, deadline=math.inf)
    with pytest.raises(ValueError, match="attempts"):
        ConflictRetry(attempts=0)


def test_the_replicator_s_own_writer_losing_its_versions_is_retried_with_backoff() -> None:
    failures = [MergeConflict("taken"), MergeConflict("taken again")]
    pauses: list[float] = []

    def commit() -> str:
        if failures:
            raise failures.pop(0)
        return "landed"

    assert retry_on_conflict(commit, pause=pauses.append) == "landed"
    assert len(pauses) == 2 and all(wait > 0 for wait in pauses)

    def always_taken() -> str:
        raise MergeConflict("always")

    with pytest.raises(MergeConflict):
        retry_on_conflict(always_taken, policy=ConflictRetry(attempts=3), pause=pauses.append)
    assert len(pauses) == 4  # two more: three attempts, a pause between each


@pytest.mark.spark
def test_a_merge_that_loses_a_race_for_its_partition_is_retried_and_lands_once(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType

    path = str(tmp_path / "mirror")
    mirror = open_or_create(spark, path, MirrorConfig("travel"))
    owners = OwnersTable.of(mirror)
    claim = owners.claim([0, 1], "shard-a")
    pauses: list[float] = []
    executor = CommitExecutor(mirror, claim, owners, pause=pauses.append, steady_writer="spark")
    load = [upsert(0, "a", 1), upsert(0, "b", 2), upsert(1, "c", 1)]
    executor.execute(
        batch(1, vbucket_commit(0, load, seqno=2, first_load=True),
              vbucket_commit(1, load, seqno=1, first_load=True))
    )

    def wait_for_go(directory: str) -> bool:
        """In a Python worker, while the MERGE reads its source: signal, then wait for `go`.

        Only the first caller waits, so the other task slot stays free for the rival's
        commit. Defined here so it is shipped by value (the worker imports no test module).
        """
        import os
        import time as clock

        go = os.path.join(directory, "go")
        try:
            os.close(os.open(os.path.join(directory, "reading"), os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return True
        deadline = clock.monotonic() + 120
        while not os.path.exists(go) and clock.monotonic() < deadline:
            clock.sleep(0.05)
        return True

    # The MERGE's source scan waits (inside its transaction) until a rival has committed.
    flags = tmp_path / "flags"
    flags.mkdir()
    gate = F.udf(wait_for_go, BooleanType())
    original = CommitExecutor.change_rows
    monkeypatch.setattr(
        CommitExecutor, "change_rows",
        lambda self, commits: original(self, commits).where(gate(F.lit(str(flags)))),
    )
    steady = [upsert(0, "a", 3, '{"v":"a3"}'), delete(0, "b", 4)]
    outcome: dict[str, Any] = {}

    def commit() -> None:
        try:
            outcome["batch"] = executor.execute(
                batch(2, vbucket_commit(0, steady, seqno=4, first_load=False, previous_seqno=2))
            )
        except Exception as exc:  # reported by the main thread
            outcome["error"] = exc

    committer = threading.Thread(target=commit, daemon=True)
    committer.start()
    wait_until(lambda: (flags / "reading").exists() or not committer.is_alive(), 120, "the MERGE")
    # A rival rewrites vbucket 0's file (an OPTIMIZE would do the same), in its own session:
    # the MERGE's txn and metadata confs must not stamp it.
    rival = spark.newSession()
    rival.sql(f"UPDATE delta.`{path}` SET flags = flags WHERE vbucket = 0 AND key = 'b'")
    rival_version = mirror.version()
    (flags / "go").touch()
    committer.join(180)
    assert not committer.is_alive()
    assert "error" not in outcome, outcome.get("error")

    assert executor.conflicts_retried == 1 and len(pauses) == 1
    (merge,) = outcome["batch"].commits
    assert merge.table_version == rival_version + 1
    batch_two = [v for v, m in replicator_commits(Path(path)) if m.batch_id == 2]
    assert batch_two == [merge.table_version]
    rows = {(r["vbucket"], r["key"], r["seqno"]) for r in mirror.read().collect()}
    assert rows == {(0, "a", 3), (1, "c", 1)}
    checkpoint = executor.checkpoints.latest([0])[0]
    assert (checkpoint.seqno, checkpoint.table_version) == (4, merge.table_version)
    owners.release(claim)


def test_status_of_a_sharded_mirror_shows_each_vbuckets_owner() -> None:
    from datetime import UTC, datetime

    from replicator.inspect.status import MirrorStatus, VbucketStatus
    from replicator.model.positions import VbucketPosition

    at = datetime(2026, 1, 31, 12, 0, tzinfo=UTC)

    def vb(number: int, owner: str) -> VbucketStatus:
        position = VbucketPosition.at_boundary(number, 7, 10)
        return VbucketStatus(number, position, committed_at=at, owner_id=owner)

    def status(*vbuckets: VbucketStatus) -> MirrorStatus:
        return MirrorStatus("/lake/t", "travel", 3, at, tuple(vbuckets))

    sharded = status(*(vb(n, "vb0-1" if n < 2 else "vb2-3") for n in range(4)))
    assert sharded.sharded
    lines = sharded.render(fold=True).splitlines()
    assert lines[3].split()[-1] == "owner"
    # Identical vbuckets fold into one row per owner, never across owners.
    assert [(row.split()[0], row.split()[-1]) for row in lines[4:]] == [
        ("0-1", "vb0-1"), ("2-3", "vb2-3")
    ]
    single = status(*(vb(n, "vb0-3") for n in range(4)))
    assert not single.sharded and "owner" not in single.render().splitlines()[3]
