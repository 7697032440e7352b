"""Checks of a relational mirror against the producer: final state, and every table version."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from chispa import assert_df_equality

from replicator.delta.journal import GroupJournal
from replicator.delta.relational import RelationalMirror
from replicator.delta.table import has_commits
from replicator.drizzle.assembly import TransactionAssembler, TransactionCompleted
from replicator.drizzle.changes import CompleteTransaction
from replicator.drizzle.proto.transaction_pb2 import Transaction
from replicator.drizzle.replication import APP_ID
from replicator.drizzle.state import SourceDatabase
from replicator.inspect.relational import expected_frame, verify_mirror


class SimulatedCrash(Exception):
    """Raised by a fault hook: the run stops there, as if killed."""


class CrashAt:
    """A fault hook raising SimulatedCrash at the `occurrence`-th call of `step`."""

    def __init__(self, step: str, occurrence: int) -> None:
        self.step, self.occurrence, self.calls = step, occurrence, 0

    def __call__(self, step: str) -> None:
        if step == self.step:
            self.calls += 1
            if self.calls == self.occurrence:
                raise SimulatedCrash(f"{step} #{self.occurrence}")


def complete_transactions(messages: Iterable[Transaction]) -> dict[int, CompleteTransaction]:
    assembler = TransactionAssembler()
    done: dict[int, CompleteTransaction] = {}
    for message in messages:
        result = assembler.feed(message)
        if isinstance(result, TransactionCompleted):
            done[result.transaction.transaction_id] = result.transaction
    return done


def assert_mirror_equals(spark: Any, root: str, database: SourceDatabase) -> None:
    """Every live table equals the producer's, row by row (chispa); dropped ones are retired."""
    report = verify_mirror(spark, root, database)
    assert report.equal, report.describe()
    mirror = RelationalMirror(spark, root, app_id=APP_ID)
    for name, state in database.tables.items():
        expected = expected_frame(spark, state.definition, list(state.rows.values()))
        assert_df_equality(mirror.read(name), expected, ignore_row_order=True)


def assert_every_version_whole(
    spark: Any, root: str, transactions: Mapping[int, CompleteTransaction]
) -> int:
    """Each version of each table holds exactly the producer's rows after the group that made
    it: no version shows part of a transaction. Returns the number of versions checked."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    journal = spark.read.format("delta").load(GroupJournal(spark, root, app_id=APP_ID).path)
    groups = {
        row["group"]: json.loads(row["transactions"])
        for row in journal.select("group", "transactions").collect()
    }
    assert sorted(groups) == list(range(1, len(groups) + 1)), "groups are numbered 1, 2, ..."
    database = SourceDatabase()
    after: dict[int, dict[Any, Any]] = {}
    dropped_rows: dict[Any, int] = {}
    for group in sorted(groups):
        for transaction_id in groups[group]:
            before = {r.definition.name for r in database.retired}
            database.apply(transactions[transaction_id])
            for retired in database.retired:
                if retired.definition.name not in before:
                    dropped_rows[(retired.definition.name, retired.transaction_id)] = (
                        retired.row_count
                    )
        after[group] = {
            name: (state.definition, list(state.rows.values()))
            for name, state in database.tables.items()
        }
    mirror = RelationalMirror(spark, root, app_id=APP_ID)
    paths: list[tuple[Any, str, int | None]] = [
        (name, mirror.table_path(name), None) for name in database.tables
    ]
    paths += [
        (r.definition.name, mirror.retired_path(r.definition.name, r.transaction_id),
         r.transaction_id)
        for r in database.retired if r.transaction_id is not None
    ]
    checked = 0
    for name, path, dropped_by in paths:
        if not has_commits(spark, path):
            continue
        history = DeltaTable.forPath(spark, path).history().select("version", "userMetadata")
        versions = history.orderBy(F.col("version")).collect()
        for index, row in enumerate(versions):
            metadata = json.loads(row["userMetadata"])
            assert metadata["table"] == str(name)
            frame = spark.read.format("delta").option("versionAsOf", row["version"]).load(path)
            if dropped_by is not None and index == len(versions) - 1:
                # The retired table's last version: its rows as the DROP found them.
                assert frame.count() == dropped_rows[(name, dropped_by)]
            else:
                definition, rows = after[metadata["group"]][name]
                assert_df_equality(
                    frame, expected_frame(spark, definition, rows), ignore_row_order=True
                )
            checked += 1
    return checked
