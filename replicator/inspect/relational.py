"""Reading a relational (Drizzle) mirror: status, and verification against the producer.

The producer's own state comes from its transaction log (Drizzle's record of what it
committed, which it also publishes to the queue): `replay_log` assembles it and applies every
complete transaction to a `SourceDatabase`. `verify_mirror` then compares each live table row
by row in Spark (both directions of `exceptAll`), checks that the mirror has no table the
source lacks, and that every table the source dropped sits in `_retired/`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replicator.delta.journal import GroupJournal
from replicator.delta.relational import RelationalMirror, spark_schema
from replicator.delta.table import has_commits
from replicator.drizzle.assembly import TransactionAssembler, TransactionCompleted
from replicator.drizzle.log import TransactionLogReader
from replicator.drizzle.replication import APP_ID, group_landed
from replicator.drizzle.schema import TableDefinition, TableName, Value
from replicator.drizzle.state import SourceDatabase

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def replay_log(path: Path | str) -> SourceDatabase:
    """The producer's state: every complete transaction of the log at `path`, applied."""
    database = SourceDatabase()
    assembler = TransactionAssembler(allow_late_commits=True)
    for entry in TransactionLogReader(path, require_complete=False):
        result = assembler.feed(entry.transaction, position=entry.offset)
        if isinstance(result, TransactionCompleted):
            database.apply(result.transaction)
    return database


def expected_frame(
    spark: SparkSession, definition: TableDefinition, rows: Sequence[Mapping[str, Value]]
) -> DataFrame:
    """The rows a mirror table must hold, typed as the mirror types them."""
    data = [tuple(c.delta_value(row.get(c.name)) for c in definition.columns) for row in rows]
    return spark.createDataFrame(data, schema=spark_schema(definition))


@dataclass(frozen=True, slots=True)
class TableDifference:
    table: TableName
    missing_rows: int
    unexpected_rows: int
    examples: tuple[str, ...] = ()


@dataclass
class RelationalVerifyReport:
    tables_checked: int = 0
    rows_checked: int = 0
    differences: list[TableDifference] = field(default_factory=list)
    missing_tables: list[str] = field(default_factory=list)
    unexpected_tables: list[str] = field(default_factory=list)
    unretired_tables: list[str] = field(default_factory=list)

    @property
    def equal(self) -> bool:
        return not (
            self.differences or self.missing_tables or self.unexpected_tables
            or self.unretired_tables
        )

    def describe(self, max_keys: int = 10) -> str:
        if self.equal:
            return (
                f"mirror equals the source: {self.tables_checked} tables, "
                f"{self.rows_checked} rows"
            )
        lines = [f"mirror differs from the source ({self.tables_checked} tables checked):"]
        for name in self.missing_tables:
            lines.append(f"  table {name}: in the source, not in the mirror")
        for name in self.unexpected_tables:
            lines.append(f"  table {name}: in the mirror, not in the source")
        for name in self.unretired_tables:
            lines.append(f"  table {name}: dropped at the source, not retired in the mirror")
        for difference in self.differences:
            lines.append(
                f"  table {difference.table}: {difference.missing_rows} rows missing, "
                f"{difference.unexpected_rows} rows not in the source"
            )
            lines.extend(f"    {example}" for example in difference.examples[:max_keys])
        return "\n".join(lines)


def verify_mirror(
    spark: SparkSession, target: str, database: SourceDatabase, *, max_examples: int = 10
) -> RelationalVerifyReport:
    """Compare the mirror at `target` with `database`, table by table and row by row."""
    mirror = RelationalMirror(spark, target, app_id=APP_ID)
    report = RelationalVerifyReport()
    mirrored = dict(GroupJournal(spark, target, app_id=APP_ID).read().catalog_last)
    for name in sorted(set(mirrored) - set(database.tables)):
        report.unexpected_tables.append(str(name))
    for name, state in sorted(database.tables.items()):
        if not mirror.exists(name):
            report.missing_tables.append(str(name))
            continue
        report.tables_checked += 1
        report.rows_checked += len(state.rows)
        expected = expected_frame(spark, state.definition, list(state.rows.values()))
        actual = mirror.read(name)
        if actual.columns != expected.columns:
            report.differences.append(TableDifference(
                name, 0, 0, (f"columns {actual.columns}, the source has {expected.columns}",)
            ))
            continue
        missing = expected.exceptAll(actual)
        unexpected = actual.exceptAll(expected)
        missing_count, unexpected_count = missing.count(), unexpected.count()
        if missing_count or unexpected_count:
            keys = list(state.definition.primary_key)
            examples = [
                f"missing {_key_text(row, keys)}" for row in missing.limit(max_examples).collect()
            ] + [
                f"not in the source {_key_text(row, keys)}"
                for row in unexpected.limit(max_examples).collect()
            ]
            report.differences.append(
                TableDifference(name, missing_count, unexpected_count, tuple(examples))
            )
    for retired in database.retired:
        if retired.transaction_id is None:
            continue
        path = mirror.retired_path(retired.definition.name, retired.transaction_id)
        if not has_commits(spark, path):
            report.unretired_tables.append(
                f"{retired.definition.name} (dropped by transaction {retired.transaction_id})"
            )
    return report


def _key_text(row: Any, keys: Sequence[str]) -> str:
    return "(" + ", ".join(f"{key}={row[key]!r}" for key in keys) + ")"


@dataclass(frozen=True, slots=True)
class RelationalStatus:
    target: str
    last_group: int | None
    transactions_in_last_group: int
    resume_from: int | None
    source: str | None
    tables: Mapping[TableName, int]
    """Each live table's Delta version."""
    landed: bool

    def render(self) -> str:
        if self.last_group is None:
            return f"{self.target}: no group committed yet"
        lines = [
            f"{self.target}: relational mirror of {self.source}",
            f"  last group {self.last_group} ({self.transactions_in_last_group} transactions)"
            + ("" if self.landed else ", not landed in every table: the next run finishes it"),
        ]
        if self.resume_from is not None:
            lines.append(f"  resumes at log offset {self.resume_from}")
        lines.append(f"  {len(self.tables)} live tables:")
        lines.extend(f"    {name} (Delta version {version})" for name, version in
                     sorted(self.tables.items()))
        return "\n".join(lines)


def read_status(spark: SparkSession, target: str) -> RelationalStatus:
    from replicator.delta.table import table_version

    state = GroupJournal(spark, target, app_id=APP_ID).read()
    mirror = RelationalMirror(spark, target, app_id=APP_ID)
    last = state.last
    tables = {
        name: table_version(spark, mirror.table_path(name)) for name in state.catalog_last
    }
    landed = True
    if last is not None:
        landed = group_landed(mirror, last)
    return RelationalStatus(
        target,
        None if last is None else last.group,
        0 if last is None else len(last.transaction_ids),
        None if last is None else last.resume_from,
        None if last is None else last.source,
        tables,
        landed,
    )


def is_relational_mirror(spark: SparkSession, target: str) -> bool:
    return GroupJournal(spark, target, app_id=APP_ID).exists()


@dataclass(frozen=True, slots=True)
class TableCommitEntry:
    """One commit of a mirror table: which group made it, and the transactions it applied."""

    table: str
    version: int
    committed_at: Any
    group: int
    kind: str
    transactions: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "table": self.table, "version": self.version, "committed_at": str(self.committed_at),
            "group": self.group, "kind": self.kind, "transactions": list(self.transactions),
        }


def table_commits(
    spark: SparkSession, target: str, table: TableName | None = None
) -> list[TableCommitEntry]:
    """Every replicator commit of the live tables (or of `table`), oldest first per table."""
    import json

    from delta.tables import DeltaTable

    state = GroupJournal(spark, target, app_id=APP_ID).read()
    mirror = RelationalMirror(spark, target, app_id=APP_ID)
    names = [table] if table is not None else sorted(state.catalog_last)
    entries: list[TableCommitEntry] = []
    for name in names:
        path = mirror.table_path(name)
        if not has_commits(spark, path):
            continue
        history = DeltaTable.forPath(spark, path).history()
        rows = history.select("version", "timestamp", "userMetadata").orderBy("version").collect()
        for row in rows:
            try:
                metadata = json.loads(row["userMetadata"] or "{}")
            except ValueError:
                continue
            if "group" not in metadata:
                continue
            entries.append(TableCommitEntry(
                str(name), int(row["version"]), row["timestamp"], int(metadata["group"]),
                str(metadata.get("kind", "")), tuple(metadata.get("transactions", ())),
            ))
    return entries
