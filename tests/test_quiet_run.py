"""A healthy continuous `replicator run` is quiet and tidy.

Quiet: no Spark or Delta warning recurs in its log (a warning at every heartbeat or every
commit buries the ones that matter). The run is verbose (`-v`), so that Spark's warnings are
printed at all: by default the CLI's Spark prints errors only. Tidy: it writes nothing into its
working directory, only into the target and the staging area. One real run, as an operator
starts it: a subprocess against the embedded producer over 127.0.0.1 with live changes, in an
empty working directory, kept running through two owner heartbeats and several data commits,
then stopped with SIGTERM.
"""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from replicator.cli.main import EXIT_OK
from replicator.sim.bucket import SimBucket
from replicator.sim.cluster import SimCluster
from replicator.sim.workload import initial_load, run_workload
from replicator.soak.table_log import table_versions
from tests.cli import PASSWORD, CliRun, clean_env, run_and_signal

VBUCKETS = 16
DOCS = 400
LIVE_CHANGES_PER_S = 20
"""Enough that every commit interval has changes to commit: a data MERGE every second or so."""
HEARTBEATS = 2
"""The owner heartbeats every 15 s (replicator.pipeline.replication): a warning per heartbeat
shows twice."""
DATA_COMMITS = 4
SPARK_RUN_TIMEOUT = 900.0
"""Generous: a Spark process on a busy two-core machine takes minutes, not seconds."""

SPARK_LOG_LINE = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (WARN|ERROR) (\S+): (.*)$")
"""A line of Spark's log4j console layout (`%d{yy/MM/dd HH:mm:ss} %p %c{1}: %m`)."""
_COMMIT_FILE = re.compile(r"^\d{20}\.json$")


def repeated_spark_warnings(log: str) -> dict[str, int]:
    """Spark's and Delta's WARN and ERROR lines that occur more than once in `log`, with counts.

    Numbers are masked, so "RDD 57 was ..." and "RDD 158 was ..." are one warning.
    """
    counts = Counter(
        f"{match[1]} {match[2]}: {re.sub(r'[0-9]+', 'N', match[3])}"
        for match in map(SPARK_LOG_LINE.match, log.splitlines())
        if match is not None
    )
    return {line: count for line, count in counts.items() if count > 1}


def owner_actions(target: Path) -> list[str]:
    """What each commit of the owners table did (claim, heartbeat, release), oldest first."""
    log_dir = target / "_replicator" / "owners" / "_delta_log"
    if not log_dir.is_dir():
        return []
    actions = []
    for path in sorted(p for p in log_dir.iterdir() if _COMMIT_FILE.match(p.name)):
        for line in path.read_text(encoding="utf-8").splitlines():
            info = json.loads(line).get("commitInfo")
            if info is not None and info.get("userMetadata"):
                actions.append(str(json.loads(info["userMetadata"]).get("action")))
    return actions


@dataclass(frozen=True)
class ContinuousRun:
    """A run stopped after HEARTBEATS heartbeats and DATA_COMMITS data commits."""

    run: CliRun
    workdir: Path
    target: Path


@pytest.fixture(scope="module")
def continuous_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ContinuousRun]:
    work = tmp_path_factory.mktemp("quiet")
    workdir = work / "cwd"
    workdir.mkdir()
    target = work / "mirror"
    bucket = SimBucket("quiet", num_vbuckets=VBUCKETS, seed=5)
    workload = initial_load(bucket, docs=DOCS, doc_size=200, seed=5)
    stop_workload = threading.Event()
    with SimCluster(bucket, nodes=1, users={"Administrator": PASSWORD}) as cluster:
        writer = threading.Thread(
            target=run_workload,
            args=(bucket, LIVE_CHANGES_PER_S),
            kwargs={"workload": workload, "stop_event": stop_workload},
            daemon=True,
        )
        writer.start()
        try:
            run = run_and_signal(
                [
                    "-v", "run", "--source", cluster.connection_string, "--target", str(target),
                    "--commit-interval-s", "1", "--progress", "lines",
                ],
                until=lambda: (
                    owner_actions(target).count("heartbeat") >= HEARTBEATS
                    and len(table_versions(target)) > DATA_COMMITS
                ),
                what=f"{HEARTBEATS} heartbeats and {DATA_COMMITS} commits",
                timeout=SPARK_RUN_TIMEOUT, logs=work / "run", cwd=workdir, env=clean_env(),
            )
        finally:
            stop_workload.set()
            writer.join(30)
    yield ContinuousRun(run, workdir, target)


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_no_spark_warning_recurs_in_a_healthy_run(continuous_run: ContinuousRun) -> None:
    run = continuous_run.run
    assert run.returncode == EXIT_OK, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    # The run went through what used to warn each time: heartbeats (UPDATEs of the owners
    # table, MERGEs now) and data commits (MERGEs whose source Delta materializes).
    assert owner_actions(continuous_run.target).count("heartbeat") >= HEARTBEATS
    assert len(table_versions(continuous_run.target)) > DATA_COMMITS
    # Verbose, Spark's own log configuration applies: its warnings are printed.
    assert "Using Spark's default log4j profile" in run.stderr
    repeated = repeated_spark_warnings(run.stderr)
    assert repeated == {}, f"recurring: {repeated}\n--- the run's stderr:\n{run.stderr}"


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_run_writes_nothing_into_its_working_directory(continuous_run: ContinuousRun) -> None:
    # No spark-warehouse/, derby.log or metastore_db/: Spark's defaults put them in the cwd.
    assert sorted(p.name for p in continuous_run.workdir.iterdir()) == []
    assert (continuous_run.target / "_delta_log").is_dir()


def test_repeated_spark_warnings_mask_numbers_and_keep_single_ones_and_python_lines() -> None:
    log = "\n".join([
        "26/11/26 00:39:06 WARN SparkStringUtils: Truncated the string representation of a plan.",
        "26/11/26 00:39:23 WARN MapPartitionsRDD: RDD 57 was locally checkpointed",
        "2026-11-26 00:39:23,333 INFO replicator.pipeline.runner replicating 64 vbuckets",
        "26/11/26 00:40:01 WARN MapPartitionsRDD: RDD 240 was locally checkpointed",
        "26/11/26 00:40:10 WARN UpdateCommand: Could not validate number of records.",
        "26/11/26 00:40:36 WARN UpdateCommand: Could not validate number of records.",
        "26/11/26 00:40:38 ERROR DeleteCommand: once",
        "2026-11-26 00:40:39,000 WARNING replicator.pipeline.runner twice",
        "2026-11-26 00:40:40,000 WARNING replicator.pipeline.runner twice",
    ])
    assert repeated_spark_warnings(log) == {
        "WARN MapPartitionsRDD: RDD N was locally checkpointed": 2,
        "WARN UpdateCommand: Could not validate number of records.": 2,
    }
