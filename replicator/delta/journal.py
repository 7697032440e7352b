"""The group journal of a relational mirror: what each group applies, written before it does.

Delta commits one table at a time, and a group of transactions may touch several tables. So
before a group's first table commit, one row goes to `_replicator/drizzle_progress`: the
group's number, its transactions in order, the tables it commits (and which of them a DROP
retires), where the source resumes after it, the finished transaction ids after it, and, when
the group changed a table's definition, every live table's definition.

Recovery reads the last two rows. If every table of the last group has its commit (Delta's
idempotent-write version per table, or the retired copy for a DROP), the mirror resumes after
it; otherwise the group is redone from where the one before it left the source: the same
transactions, in the same order, under the same number, so tables that already have it skip
it and the others get it. A group's transactions are acknowledged to the source only after
all its tables committed, so the source can always give them again.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from replicator.delta.relational import decode_definition, encode_definition
from replicator.delta.table import delta_write_confs, has_commits, now_utc
from replicator.drizzle.assembly import CompletedIds
from replicator.drizzle.schema import TableDefinition, TableName

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

JOURNAL_SCHEMA = (
    "group bigint, written_at timestamp, source string, transactions string, tables string, "
    "resume_from bigint, completed string, catalog string"
)


@dataclass(frozen=True, slots=True)
class PlannedTable:
    """A table a group commits: `dropped_by` set when the group retires it."""

    table: TableName
    dropped_by: int | None = None


@dataclass(frozen=True, slots=True)
class GroupRecord:
    """One journal row."""

    group: int
    source: str
    transaction_ids: tuple[int, ...]
    tables: tuple[PlannedTable, ...]
    resume_from: int | None
    completed: CompletedIds
    catalog: Mapping[TableName, TableDefinition] | None = None


@dataclass(frozen=True, slots=True)
class JournalState:
    """Where a restart starts: the last group that must land, and what came before it.

    `last` is the journal's newest group (None: empty journal), `before` the one before it.
    `catalog_before` / `catalog_last` are the live tables' definitions as of those groups.
    """

    last: GroupRecord | None
    before: GroupRecord | None
    catalog_before: Mapping[TableName, TableDefinition]
    catalog_last: Mapping[TableName, TableDefinition]


def _encode_completed(completed: CompletedIds) -> str:
    return json.dumps(
        {"high": completed.high, "floor": completed.floor, "recent": list(completed.recent)},
        separators=(",", ":"),
    )


def _decode_completed(text: str | None) -> CompletedIds:
    if not text:
        return CompletedIds()
    data = json.loads(text)
    return CompletedIds(data.get("high"), data.get("floor"), tuple(data.get("recent", ())))


def _encode_catalog(catalog: Mapping[TableName, TableDefinition]) -> str:
    return json.dumps(
        [[name.schema, name.table, encode_definition(d)] for name, d in sorted(catalog.items())],
        separators=(",", ":"),
    )


def _decode_catalog(text: str) -> dict[TableName, TableDefinition]:
    return {TableName(s, t): decode_definition(d) for s, t, d in json.loads(text)}


class GroupJournal:
    """The journal table at `<root>/_replicator/drizzle_progress`."""

    def __init__(self, spark: SparkSession, root: str, *, app_id: str) -> None:
        self.spark = spark
        self.path = f"{root.rstrip('/')}/_replicator/drizzle_progress"
        self.app_id = f"{app_id}:journal"

    def exists(self) -> bool:
        return has_commits(self.spark, self.path)

    def write(self, record: GroupRecord) -> None:
        """Append `record` (idempotent: a group written twice is one row)."""
        tables = [
            [planned.table.schema, planned.table.table, planned.dropped_by]
            for planned in record.tables
        ]
        row = (
            record.group,
            now_utc(),
            record.source,
            json.dumps(list(record.transaction_ids), separators=(",", ":")),
            json.dumps(tables, separators=(",", ":")),
            record.resume_from,
            _encode_completed(record.completed),
            None if record.catalog is None else _encode_catalog(record.catalog),
        )
        frame = self.spark.createDataFrame([row], schema=JOURNAL_SCHEMA)
        metadata = json.dumps({"replicator": "drizzle/1", "group": record.group})
        with delta_write_confs(
            self.spark, user_metadata=metadata, app_id=self.app_id, version=record.group
        ):
            frame.write.format("delta").mode("append").save(self.path)

    def read(self) -> JournalState:
        if not self.exists():
            return JournalState(None, None, {}, {})
        from pyspark.sql import functions as F

        table = self.spark.read.format("delta").load(self.path)
        newest = table.orderBy(F.col("group").desc()).limit(2).collect()
        records = [self._record(row) for row in newest]
        last = records[0] if records else None
        before = records[1] if len(records) > 1 else None
        catalogs = (
            table.where(F.col("catalog").isNotNull())
            .orderBy(F.col("group").desc())
            .select("group", "catalog")
            .limit(2)
            .collect()
        )

        def catalog_as_of(group: int | None) -> dict[TableName, TableDefinition]:
            if group is None:
                return {}
            for row in catalogs:
                if row["group"] <= group:
                    return _decode_catalog(row["catalog"])
            if len(catalogs) < 2:
                return {}
            # More than two catalogs newer than `group`: read further back.
            older = (
                table.where(F.col("catalog").isNotNull() & (F.col("group") <= group))
                .orderBy(F.col("group").desc())
                .select("catalog")
                .limit(1)
                .collect()
            )
            return _decode_catalog(older[0]["catalog"]) if older else {}

        return JournalState(
            last,
            before,
            catalog_as_of(before.group if before else None),
            catalog_as_of(last.group if last else None),
        )

    @staticmethod
    def _record(row: object) -> GroupRecord:
        data = row.asDict()  # type: ignore[attr-defined]
        tables: Sequence[list[object]] = json.loads(data["tables"])
        return GroupRecord(
            group=int(data["group"]),
            source=data["source"],
            transaction_ids=tuple(json.loads(data["transactions"])),
            tables=tuple(
                PlannedTable(TableName(str(s), str(t)), None if d is None else int(str(d)))
                for s, t, d in tables
            ),
            resume_from=data["resume_from"],
            completed=_decode_completed(data["completed"]),
            catalog=None if data["catalog"] is None else _decode_catalog(data["catalog"]),
        )
