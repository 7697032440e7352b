"""Measurement 10: the Drizzle transaction source, from a transaction log and from RabbitMQ.

The embedded producer writes `transactions` transactions (small ones, bulk ones in segments,
rollbacks, DDL) to a log, untimed; one until-caught-up run mirrors them, timed from the call
with Spark up to its return. Then the same workload goes through a private RabbitMQ broker
(published untimed before the run; skipped, with the reason, when RabbitMQ is not installed).
Reported: transactions/s and row changes/s of each run, groups and table commits.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from replicator.drizzle.replication import DrizzleReplication, DrizzleSettings
from replicator.drizzle.sources import LogFileSource, MessageSource, QueueSource
from replicator.drizzle.workload import Workload, WorkloadSettings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True, slots=True)
class TransactionRun:
    source: str
    transactions: int
    rows: int
    groups: int
    table_commits: int
    seconds: float

    @property
    def transactions_per_second(self) -> float:
        return self.transactions / self.seconds if self.seconds else 0.0

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0


@dataclass(frozen=True, slots=True)
class TransactionSourceResult:
    produced: int
    log: TransactionRun
    queue: TransactionRun | None
    queue_skipped: str | None = None


WORKLOAD = WorkloadSettings(seed=5, bulk_rows=200, schemas=2, tables_per_schema=3)
"""The producer's workload: 6 tables, bulk statements of 200 rows, the default mix."""


def _timed(spark: SparkSession, source: MessageSource, target: Path, name: str) -> TransactionRun:
    settings = DrizzleSettings(until_caught_up=True, group_max_transactions=2_000)
    started = time.perf_counter()
    summary = DrizzleReplication(spark, source, str(target), settings).run()
    seconds = time.perf_counter() - started
    return TransactionRun(
        name, summary.transactions, summary.rows, summary.groups, summary.table_commits, seconds
    )


def measure_transaction_source(
    spark: SparkSession, work: Path, *, transactions: int
) -> TransactionSourceResult:
    log = work / "drizzle" / "transaction.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    Workload(WORKLOAD).write_log(log, transactions)
    log_run = _timed(spark, LogFileSource(log), work / "drizzle" / "from-log", "log")
    try:
        from replicator.drizzle.amqp.publisher import TransactionPublisher
        from replicator.drizzle.broker import LocalBroker, RabbitMQNotInstalled

        broker = LocalBroker()
        broker.start()
    except RabbitMQNotInstalled as error:
        return TransactionSourceResult(transactions, log_run, None, str(error))
    try:
        queue = broker.source("bench-transactions")
        with TransactionPublisher(queue).connect() as publisher:
            publisher.publish_all(Workload(WORKLOAD).serialized(transactions))
        queue_run = _timed(spark, QueueSource(queue), work / "drizzle" / "from-queue", "queue")
    finally:
        broker.stop()
    return TransactionSourceResult(transactions, log_run, queue_run)
