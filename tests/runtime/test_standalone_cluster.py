"""Issue 11: the replicator runs unchanged on a Spark standalone cluster.

A real master and worker on 127.0.0.1 (replicator.runtime.standalone); `spark-submit --master
spark://...` runs jobs/replicate.py against the embedded producer until caught up. The MERGEs
and appends must run in the worker's executor (the event log says which executor ran each
task), and the mirror, read back through this test's own local session, must equal the producer.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from replicator.runtime.jars import locate_delta_jars
from replicator.runtime.standalone import MasterState, StandaloneCluster, executor_task_counts
from replicator.sim.bucket import SimBucket
from replicator.sim.cluster import SimCluster
from replicator.sim.workload import initial_load
from tests.cli import FAST_START_JAVA_OPTIONS, PASSWORD, REPO, clean_env
from tests.mirror_check import assert_mirror_equals_bucket

VBUCKETS = 8
DOCS = 400


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    with StandaloneCluster(
        tmp_path_factory.mktemp("standalone"), worker_cores=2, worker_memory="1g"
    ) as cluster:
        yield cluster


@pytest.fixture
def producer() -> Iterator[SimCluster]:
    bucket = SimBucket("travel", num_vbuckets=VBUCKETS, seed=5)
    initial_load(bucket, docs=DOCS, doc_size=200, seed=5)
    with SimCluster(bucket, nodes=1, users={"Administrator": PASSWORD}) as running:
        yield running


@pytest.mark.spark
@pytest.mark.timeout(600)
def test_spark_submit_on_a_standalone_cluster_mirrors_the_bucket_from_executors(
    spark: Any, spark_cluster: StandaloneCluster, producer: SimCluster, tmp_path: Path
) -> None:
    target = tmp_path / "mirror"
    assert len(spark_cluster.state().alive_workers) == 1

    result = spark_cluster.submit(
        REPO / "jobs" / "replicate.py",
        [
            "--source", producer.connection_string, "--target", str(target),
            "--until-caught-up", "--commit-interval-s", "0.5", "--progress", "off",
        ],
        jars=locate_delta_jars().paths,
        conf={
            "spark.driver.extraJavaOptions": FAST_START_JAVA_OPTIONS,
            "spark.executor.extraJavaOptions": FAST_START_JAVA_OPTIONS,
        },
        env=clean_env(),
        name="replicate",
    )

    assert result.returncode == 0, result.stderr[-3000:]
    assert "caught up: " in result.stdout, result.stdout
    assert PASSWORD not in result.stdout + result.stderr
    # The session kept spark-submit's master: the application ran on the standalone master...
    finished = [a for a in spark_cluster.state().completed_apps if a.name == "replicator"]
    assert [a.state for a in finished] == ["FINISHED"]
    # ...and its tasks (reads, MERGE/append writes) ran in the worker's executor, none in the
    # driver (a local[...] session would log every task under executor "driver").
    tasks = executor_task_counts(result.event_log_dir)
    assert tasks, "the event log holds no finished task"
    assert "driver" not in tasks, tasks
    assert sum(tasks.values()) >= VBUCKETS
    assert_mirror_equals_bucket(spark, str(target), producer.bucket)


def test_the_masters_json_is_read_into_workers_and_applications() -> None:
    document = {
        "workers": [
            {"id": "worker-1", "host": "127.0.0.1", "cores": 2, "memory": 1024, "state": "ALIVE"},
            {"id": "worker-0", "host": "127.0.0.1", "cores": 2, "memory": 1024, "state": "DEAD"},
        ],
        "activeapps": [],
        "completedapps": [
            {"id": "app-1", "name": "replicator", "state": "FINISHED", "duration": 5300},
        ],
    }
    state = MasterState.from_json(document)
    assert [w.worker_id for w in state.alive_workers] == ["worker-1"]
    assert [(a.name, a.state, a.duration_ms) for a in state.completed_apps] == [
        ("replicator", "FINISHED", 5300)
    ]


def test_tasks_are_counted_per_executor_from_the_event_log(tmp_path: Path) -> None:
    def task_end(executor: str) -> str:
        return json.dumps({"Event": "SparkListenerTaskEnd", "Task Info": {"Executor ID": executor}})

    app = tmp_path / "app-1"
    app.write_text(
        "\n".join([
            json.dumps({"Event": "SparkListenerApplicationStart"}),
            task_end("0"), task_end("1"), task_end("0"),
        ])
    )
    (tmp_path / "app-2.zstd").write_bytes(b"\x28\xb5\x2f\xfd")  # compressed: not ours to read
    assert executor_task_counts(tmp_path) == {"0": 2, "1": 1}
