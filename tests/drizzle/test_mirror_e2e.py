"""End to end: Drizzle transactions from a log file and from RabbitMQ, mirrored into Delta.

Real Spark and Delta (local), a real broker (tests/drizzle/conftest.py). Every run is checked
against the producer's own state (chispa, table by table) and, for the log, every table
version ever written against the producer's state after the group that wrote it.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

from replicator.drizzle.amqp.publisher import TransactionPublisher
from replicator.drizzle.amqp.source import AmqpSource
from replicator.drizzle.errors import SegmentGapError
from replicator.drizzle.log import TransactionLogWriter, read_transaction_log
from replicator.drizzle.planning import UnsupportedChange
from replicator.drizzle.replication import DrizzleReplication, DrizzleSettings
from replicator.drizzle.sources import LogFileSource, QueueSource
from replicator.drizzle.state import SourceDatabase
from replicator.drizzle.workload import Workload, WorkloadSettings
from replicator.inspect.relational import read_status
from tests.drizzle.messages import builder, insert_messages, setup_messages
from tests.drizzle.mirror_checks import (
    CrashAt,
    SimulatedCrash,
    assert_every_version_whole,
    assert_mirror_equals,
    complete_transactions,
)

SMALL = WorkloadSettings(seed=0, bulk_rows=40, segment_bytes=2048, ddl_share=0.12)


class MidGroupCrash:
    """Stops a run after a table commit that left its group landed in some tables only."""

    def __init__(self, spark: Any, root: str) -> None:
        self.spark, self.root = spark, root

    def __call__(self, step: str) -> None:
        if step == "after_table_commit" and not read_status(self.spark, self.root).landed:
            raise SimulatedCrash("part-way through a group's tables")


def _run(spark: Any, source: Any, root: Path, hook: Any = None, *, groups: int = 12) -> Any:
    # A small memory budget: bulk transactions spill, so the spill path runs end to end.
    settings = DrizzleSettings(
        until_caught_up=True, group_max_transactions=groups, memory_budget_bytes=8192
    )
    return DrizzleReplication(spark, source, str(root), settings, fault_hook=hook).run()


def test_a_log_survives_a_crash_at_every_step_and_every_version_is_whole(
    spark: Any, tmp_path: Path
) -> None:
    workload = Workload(SMALL)
    log = tmp_path / "transaction.log"
    workload.write_log(log, 45)
    root = tmp_path / "mirror"
    # Each run stops at one step (counted within that run); the next starts where it left.
    mid_group = MidGroupCrash(spark, str(root))
    for hook, left_unlanded in [
        (CrashAt("after_journal", 2), True),
        (mid_group, True),
        (CrashAt("after_group", 1), False),
        (CrashAt("after_settle", 1), False),
    ]:
        with pytest.raises(SimulatedCrash):
            _run(spark, LogFileSource(log), root, hook, groups=8)
        assert read_status(spark, str(root)).landed is not left_unlanded, hook
    summary = _run(spark, LogFileSource(log), root, groups=8)
    assert summary.transactions > 0
    assert_mirror_equals(spark, str(root), workload.database)
    transactions = complete_transactions(e.transaction for e in read_transaction_log(log))
    assert assert_every_version_whole(spark, str(root), transactions) > 10
    assert workload.database.retired, "the workload drops a table: its retirement is checked"


def test_a_queue_is_mirrored_and_redelivered_messages_apply_once(
    spark: Any, tmp_path: Path, queue_source: AmqpSource, rabbitmq: Any
) -> None:
    workload = Workload(SMALL)
    messages = [m.SerializeToString() for m in workload.messages(36)]
    with TransactionPublisher(queue_source).connect() as publisher:
        publisher.publish_all(messages)
        # Duplicates as a publisher that retried after a lost confirm would send them.
        publisher.publish_all(messages[10:20])
    root = tmp_path / "mirror"
    with pytest.raises(SimulatedCrash):
        # Committed but not acknowledged: the broker gives those messages again.
        _run(spark, QueueSource(queue_source), root, CrashAt("after_group", 2))
    summary = _run(spark, QueueSource(queue_source), root)
    assert summary.redeliveries_skipped >= 10
    assert summary.redone_group is None
    assert_mirror_equals(spark, str(root), workload.database)
    counts = rabbitmq.rabbitmqctl("list_queues", "-p", rabbitmq.vhost, "name", "messages")
    line = next(row for row in counts.splitlines() if row.startswith(queue_source.queue))
    assert line.split()[-1] == "0", f"every message acknowledged: {line}"


def _applied(messages: list[Any]) -> SourceDatabase:
    database = SourceDatabase()
    database.apply_all(complete_transactions(messages).values())
    return database


def _write_log(path: Path, messages: list[Any]) -> None:
    with TransactionLogWriter(path) as writer:
        for message in messages:
            writer.append(message)


def test_a_segment_gap_commits_what_came_before_and_nothing_of_its_transaction(
    spark: Any, tmp_path: Path
) -> None:
    bulk = insert_messages(4, range(100, 400), segment_bytes=2048)
    assert len(bulk) >= 3
    log = tmp_path / "gap.log"
    _write_log(log, [*setup_messages(), *insert_messages(3, range(1, 6)), bulk[0], bulk[2]])
    root = tmp_path / "mirror"
    with pytest.raises(SegmentGapError) as caught:
        _run(spark, LogFileSource(log), root)
    assert caught.value.transaction_id == 4
    assert "every complete transaction before it is committed" in str(caught.value)
    expected = _applied([*setup_messages(), *insert_messages(3, range(1, 6))])
    assert_mirror_equals(spark, str(root), expected)
    # The journal did not move past it: a second run meets the same error, applies nothing.
    with pytest.raises(SegmentGapError):
        _run(spark, LogFileSource(log), root)
    assert_mirror_equals(spark, str(root), expected)


def test_raw_sql_stops_before_its_transaction_and_names_it(spark: Any, tmp_path: Path) -> None:
    raw = builder(4)
    raw.raw_sql("ALTER TABLE items RENAME TO things", "shop")
    log = tmp_path / "raw.log"
    _write_log(log, [*setup_messages(), *insert_messages(3, range(1, 4)), *raw.messages(),
                     *insert_messages(5, range(10, 12))])
    root = tmp_path / "mirror"
    with pytest.raises(UnsupportedChange) as caught:
        _run(spark, LogFileSource(log), root)
    assert caught.value.transaction_id == 4
    assert "SQL text only" in str(caught.value) and "Every transaction before it" in str(
        caught.value
    )
    expected = _applied([*setup_messages(), *insert_messages(3, range(1, 4))])
    assert_mirror_equals(spark, str(root), expected)
    # The transactions after it completed too, but were not committed: the journal does not
    # count them finished, so a second run meets the same transaction again.
    with pytest.raises(UnsupportedChange) as again:
        _run(spark, LogFileSource(log), root)
    assert again.value.transaction_id == 4
    assert_mirror_equals(spark, str(root), expected)


@pytest.mark.soak
def test_a_sigkilled_run_restarts_without_loss_or_duplicates(spark: Any, tmp_path: Path) -> None:
    """A real `replicator run` process following a growing log, killed with SIGKILL once it
    has committed a few groups (wherever it is then), and a restart that catches up. A few
    minutes with its own JVM: `make soak` runs it; `make test` stops runs at each commit step
    in-process (above)."""
    import os
    import signal
    import subprocess
    import sys

    from tests.cli import clean_env, wait_until

    workload = Workload(SMALL)
    log = tmp_path / "transaction.log"
    workload.write_log(log, 10)
    root = tmp_path / "mirror"
    journal_log = root / "_replicator" / "drizzle_progress" / "_delta_log"
    process = subprocess.Popen(
        [sys.executable, "-m", "replicator.cli", "run", "--source", f"drizzle-log://{log}",
         "--target", str(root), "--commit-interval-s", "0.5"],
        cwd=tmp_path, env=clean_env(password=None), stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, start_new_session=True,
    )
    try:
        for _ in range(3):
            # More transactions while it runs: each batch becomes a group of its own.
            wait_until(
                functools.partial(_journal_grew, journal_log, _journal_rows(journal_log)),
                timeout=180, what="the running replicator to commit another group",
            )
            workload.write_log(log, 8)
        os.killpg(process.pid, signal.SIGKILL)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL
    summary = _run(spark, LogFileSource(log), root)
    assert summary.transactions > 0
    assert_mirror_equals(spark, str(root), workload.database)


def _journal_rows(delta_log: Path) -> int:
    return len(list(delta_log.glob("*.json"))) if delta_log.is_dir() else 0


def _journal_grew(delta_log: Path, before: int) -> bool:
    return _journal_rows(delta_log) > before
