"""Stopping `replicator run` as operators' tools do: a clean stop, whoever gets the signal.

A terminal's Ctrl-C, `timeout`, systemd (KillMode=control-group) and Kubernetes signal the whole
process group, not just the driver. Each test starts a real continuous run (a subprocess in a
session of its own, against the embedded producer with live changes), waits for a data commit,
then delivers the signal. A clean stop: the commit in flight finishes, the claim is released,
the summary is printed, exit 0, no traceback, and the Spark JVM ends with the driver. A second
SIGINT stops at once (exit 130); that loses nothing either, as the crash tests show for SIGKILL.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from replicator.cli.main import EXIT_INTERRUPTED, EXIT_OK
from replicator.sim.bucket import SimBucket
from replicator.sim.cluster import SimCluster
from replicator.sim.workload import initial_load, run_workload
from replicator.soak.table_log import table_versions
from tests.cli import PASSWORD, CliRun, clean_env, run_and_signal, wait_until
from tests.test_quiet_run import SPARK_LOG_LINE, owner_actions

VBUCKETS = 16
SPARK_RUN_TIMEOUT = 900.0


@dataclass(frozen=True)
class Producer:
    connection_string: str


@pytest.fixture(scope="module")
def producer() -> Iterator[Producer]:
    bucket = SimBucket("stops", num_vbuckets=VBUCKETS, seed=9)
    workload = initial_load(bucket, docs=300, doc_size=200, seed=9)
    stop_workload = threading.Event()
    with SimCluster(bucket, nodes=1, users={"Administrator": PASSWORD}) as cluster:
        writer = threading.Thread(
            target=run_workload,
            args=(bucket, 20),
            kwargs={"workload": workload, "stop_event": stop_workload},
            daemon=True,
        )
        writer.start()
        try:
            yield Producer(cluster.connection_string)
        finally:
            stop_workload.set()
            writer.join(30)


def stopped_run(
    producer: Producer, work: Path, *, to_group: bool, signals: tuple[signal.Signals, ...]
) -> tuple[CliRun, Path, int | None]:
    """A run stopped by `signals` after its first data commit; how it ended, its target and
    the pid its Spark JVM had."""
    target = work / "mirror"
    jvm: list[int | None] = []
    run = run_and_signal(
        [
            "run", "--source", producer.connection_string, "--target", str(target),
            "--commit-interval-s", "1", "--progress", "lines",
        ],
        until=lambda: len(table_versions(target)) > 2, what="the run's first data commit",
        timeout=SPARK_RUN_TIMEOUT, logs=work / "run", cwd=work, env=clean_env(),
        signals=signals, to_group=to_group, before_signals=lambda pid: jvm.append(_child_java(pid)),
    )  # fmt: skip
    return run, target, jvm[0] if jvm else None


def _child_java(pid: int) -> int | None:
    """The driver's JVM: its child process running java."""
    children = Path(f"/proc/{pid}/task/{pid}/children")
    for child in children.read_text().split():
        try:
            command = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")[0]
        except FileNotFoundError:
            continue
        if command.endswith(b"java"):
            return int(child)
    return None


JVM_START_LINES = (
    "WARNING: Using incubator modules", "Using Spark's default log4j profile",
    "Setting default log level", "To adjust logging level",
)
"""What a Spark driver JVM prints at start under Spark's default logging configuration."""


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie is gone too: it only waits for its parent (gone) to be reaped by init.
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize(
    "to_group, sig",
    [
        pytest.param(True, signal.SIGINT, id="group-SIGINT"),
        # The same path as group-SIGINT with the other signal: `make soak` runs it, keeping
        # `make test` under CI's 30 minutes.
        pytest.param(True, signal.SIGTERM, marks=pytest.mark.soak, id="group-SIGTERM"),
        pytest.param(False, signal.SIGINT, id="driver-SIGINT"),
    ],
)
def test_a_signal_to_the_group_or_the_driver_stops_the_run_cleanly(
    producer: Producer, tmp_path: Path, to_group: bool, sig: signal.Signals
) -> None:
    run, target, jvm = stopped_run(producer, tmp_path, to_group=to_group, signals=(sig,))
    assert run.returncode == EXIT_OK, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    assert f"received {sig.name}: finishing the current commit and stopping" in run.stderr
    assert run.stdout.strip().splitlines()[-1].startswith("stopped:"), run.stdout
    assert owner_actions(target)[-1] == "release"
    # Quiet from start to end: the JVM, log4j and Spark print nothing without -v.
    jvm_lines = [
        line for line in run.stderr.splitlines()
        if SPARK_LOG_LINE.match(line) or line.startswith(JVM_START_LINES)
    ]
    assert jvm_lines == [], run.stderr
    assert PASSWORD not in run.output
    assert jvm is not None, "no Spark JVM found under the driver"
    wait_until(lambda: _gone(jvm), 60.0, "the Spark JVM to end with the driver")


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_second_sigint_stops_at_once(producer: Producer, tmp_path: Path) -> None:
    run, _, jvm = stopped_run(
        producer, tmp_path, to_group=True, signals=(signal.SIGINT, signal.SIGINT)
    )
    assert run.returncode == EXIT_INTERRUPTED, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    assert "received SIGINT again: stopping at once" in run.stderr
    assert jvm is not None
    wait_until(lambda: _gone(jvm), 60.0, "the Spark JVM to end with the driver")
