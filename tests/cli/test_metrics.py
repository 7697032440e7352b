"""`replicator run --metrics-port`: a running replicator's metrics, scraped as Prometheus does.

One real run, as an operator starts it (a subprocess against the embedded producer over
127.0.0.1), with a live workload: the scrapes must show changes committed and a lag while the
workload runs, then every vbucket caught up with the producer's own high seqnos once it stops.
The same numbers reach the log as JSON lines (`--metrics-log-s`).
"""

from __future__ import annotations

import json
import socket
import threading
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from replicator.cli.main import EXIT_OK
from replicator.sim.bucket import SimBucket
from replicator.sim.cluster import SimCluster
from replicator.sim.workload import initial_load, run_workload
from tests.cli import PASSWORD, clean_env, run_and_signal

VBUCKETS = 8
CHANGES_PER_S = 50
TIMEOUT_S = 900.0
"""Generous: a Spark process on a busy two-core machine takes minutes, not seconds."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def scrape(port: int) -> dict[str, dict[str, float]]:
    """metric name -> {vbucket label or "": value}; empty when nothing answers yet."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except OSError:
        return {}
    samples: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[sample.labels.get("vbucket", "")] = sample.value
    return samples


@dataclass
class Watch:
    """What the scrapes showed, phase by phase."""

    port: int
    bucket: SimBucket
    stop_workload: threading.Event
    while_running: list[dict[str, dict[str, float]]] = field(default_factory=list)
    settled: dict[str, dict[str, float]] = field(default_factory=dict)

    def step(self) -> bool:
        """Scrape once; True when the run has been seen lagging and then caught up."""
        samples = scrape(self.port)
        if not samples:
            return False
        if not self.stop_workload.is_set():
            self.while_running.append(samples)
            committed = samples.get("replicator_changes_committed_total", {}).get("", 0)
            lagging = any(v > 0 for v in samples.get("replicator_lag_seqnos", {}).values())
            if committed > 0 and lagging and len(self.while_running) >= 2:
                self.stop_workload.set()
            return False
        highs = {str(vb): float(high) for vb, high in self.bucket.high_seqnos().items()}
        if samples.get("replicator_committed_seqno") == highs and samples.get(
            "replicator_source_high_seqno"
        ) == highs:
            self.settled = samples
            return True
        return False


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_scraped_metrics_follow_the_workload(tmp_path: Path) -> None:
    bucket = SimBucket("metrics", num_vbuckets=VBUCKETS, seed=9)
    workload = initial_load(bucket, docs=200, doc_size=100, seed=9)
    stop_workload = threading.Event()
    watch = Watch(free_port(), bucket, stop_workload)
    with SimCluster(bucket, nodes=1, users={"Administrator": PASSWORD}) as cluster:
        writer = threading.Thread(
            target=run_workload, args=(bucket, CHANGES_PER_S),
            kwargs={"workload": workload, "stop_event": stop_workload}, daemon=True,
        )  # fmt: skip
        writer.start()
        try:
            run = run_and_signal(
                [
                    "run", "--source", cluster.connection_string, "--target",
                    str(tmp_path / "mirror"), "--commit-interval-s", "1", "--progress", "off",
                    "--metrics-port", str(watch.port), "--metrics-host", "127.0.0.1",
                    "--metrics-log-s", "1",
                ],
                until=watch.step, what="the metrics to show a lag, then none",
                timeout=TIMEOUT_S, logs=tmp_path / "run", cwd=tmp_path,
                env=clean_env(REPLICATOR_SOURCE_CHECK_INTERVAL_S="1"),
            )  # fmt: skip
        finally:
            stop_workload.set()
            writer.join(30)

    assert run.returncode == EXIT_OK, run.stderr
    first, last = watch.while_running[0], watch.settled
    changes = "replicator_changes_committed_total"
    # Committed counts moved with the workload; the lag was seen, then went to nothing.
    assert last[changes][""] > first.get(changes, {}).get("", 0) >= 0
    assert last["replicator_commits_total"][""] >= 2
    assert max(sum(s.get("replicator_lag_seqnos", {}).values()) for s in watch.while_running) > 0
    assert set(last["replicator_lag_seqnos"].values()) == {0.0}
    assert set(last["replicator_lag_seconds"].values()) == {0.0}
    assert sorted(last["replicator_committed_seqno"], key=int) == [str(v) for v in range(8)]
    commits = last["replicator_commits_total"][""]
    assert last["replicator_commit_duration_seconds_count"][""] == commits
    assert last["replicator_last_commit_timestamp_seconds"][""] > 0
    assert last["replicator_rollbacks_total"][""] == 0
    # The same numbers as log lines, for deployments without a scrape.
    lines = [
        line.split(" metrics ", 1)[1] for line in run.stderr.splitlines() if " metrics {" in line
    ]
    assert lines, run.stderr
    logged = json.loads(lines[-1])
    assert logged["changes_committed"] >= first.get(changes, {}).get("", 0)
    assert logged["vbuckets"] == VBUCKETS
    assert PASSWORD not in run.output


def test_a_taken_metrics_port_is_a_clear_error() -> None:
    from replicator.errors import ConfigError
    from replicator.pipeline.metrics import ReplicationMetrics

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            ReplicationMetrics().serve(port, "127.0.0.1")
