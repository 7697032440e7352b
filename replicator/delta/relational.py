"""Delta tables mirroring a relational source: one table per source table, one commit per plan.

Layout under the mirror's root: `<schema>/<table>/` holds each live source table;
`_retired/<schema>/<table>-txn<id>/` each dropped one, moved there whole by the DROP (kept,
never deleted; a table of the same name created later starts fresh at the live path);
`_replicator/drizzle_progress/` the group journal (`replicator.delta.progress`).

A `TablePlan` (`replicator.drizzle.planning`) becomes exactly one data commit:

- create: the table does not exist yet; its first commit writes its rows and its properties;
- merge: the steady case; one MERGE on the primary key (upserts, patches that keep the columns
  an UPDATE did not send, deletes; after a TRUNCATE, also a delete of every other row);
- rewrite: the schema changed (ALTER TABLE added or dropped columns); the table is overwritten
  with its new schema in one commit (added columns filled with their default, as at the source);
  earlier versions keep the old rows and schema for time travel.

Every commit carries Delta's idempotent-write ids (app id, group number): a plan applied again
after a crash is skipped by Delta itself, so each group lands once per table. Columns are all
nullable in Delta: the source enforces its constraints, and an ALTER adding a NOT NULL column
to a table with rows would otherwise fail where the source succeeded.
"""

from __future__ import annotations

import base64
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from replicator.delta.table import (
    _hadoop_path,
    delta_snapshot,
    delta_write_confs,
    has_commits,
    last_commit_version,
    reset_last_commit_version,
)
from replicator.drizzle.planning import Delete, Key, Patch, TablePlan, Upsert
from replicator.drizzle.proto.table_pb2 import Table
from replicator.drizzle.schema import (
    TableDefinition,
    TableName,
    Value,
    definition_from_message,
    definition_to_message,
)
from replicator.errors import ReplicatorError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger(__name__)

FORMAT = "drizzle/1"
"""`replicator` in every commit's userMetadata: which writer made it, in which format."""
OP_COLUMN = "_replicator_op"
SET_COLUMN = "_replicator_set"
TABLE_PROPERTIES = {
    "delta.enableDeletionVectors": "true",
    "delta.enableChangeDataFeed": "true",
}
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_$][A-Za-z0-9_$.-]*$")


class RelationalMirrorError(ReplicatorError):
    """A source table's Delta table is not as the journal says it should be."""


@dataclass(frozen=True, slots=True)
class TableCommit:
    """What one plan's commit did: `version` -1 when nothing needed writing."""

    table: TableName
    kind: str
    version: int
    rows: int
    already_committed: bool = False
    retired_to: str | None = None


def encode_definition(definition: TableDefinition) -> str:
    """A table definition as compact text: its Drizzle Table message, base64."""
    return base64.b64encode(definition_to_message(definition).SerializeToString()).decode()


def decode_definition(text: str) -> TableDefinition:
    return definition_from_message(Table.FromString(base64.b64decode(text)))


def _path_part(name: str) -> str:
    if _SAFE_NAME.match(name) and name not in (".", ".."):
        return name
    # Anything else (a slash, a space, non-ASCII) is escaped, so every name has one directory.
    return "%" + name.encode("utf-8").hex()


def spark_schema(definition: TableDefinition) -> str:
    """The Spark DDL schema of a source table's Delta table."""
    return ", ".join(f"`{c.name}` {c.delta_type()}" for c in definition.columns)


class RelationalMirror:
    """The Delta tables of one relational source under `root`, written through `spark`.

    `app_id` names the writer in Delta's idempotent-write ids; every commit of a group uses
    the group number as its version.
    """

    def __init__(self, spark: SparkSession, root: str, *, app_id: str) -> None:
        self.spark = spark
        self.root = root.rstrip("/")
        self.app_id = app_id

    def table_path(self, name: TableName) -> str:
        return f"{self.root}/{_path_part(name.schema)}/{_path_part(name.table)}"

    def retired_path(self, name: TableName, transaction_id: int) -> str:
        return (
            f"{self.root}/_retired/{_path_part(name.schema)}/"
            f"{_path_part(name.table)}-txn{transaction_id}"
        )

    def exists(self, name: TableName) -> bool:
        return has_commits(self.spark, self.table_path(name))

    def committed_group(self, path: str) -> int:
        """The highest group this writer committed to the table at `path`; -1 if none."""
        if not has_commits(self.spark, path):
            return -1
        transactions = delta_snapshot(self.spark, path).transactions()
        value = transactions.get(self.app_id)
        return int(value.get()) if value.isDefined() else -1

    def read(self, name: TableName) -> DataFrame:
        return self.spark.read.format("delta").load(self.table_path(name))

    def group_landed(
        self, tables: Sequence[tuple[TableName, int | None]], group: int
    ) -> bool:
        """Whether every commit of `group` landed: each (table, dropped_by) the group planned
        has its commit, or for a DROP its retired copy."""
        for name, dropped_by in tables:
            if dropped_by is not None:
                if not has_commits(self.spark, self.retired_path(name, dropped_by)):
                    return False
            elif self.committed_group(self.table_path(name)) < group:
                return False
        return True

    def commit(
        self,
        plan: TablePlan,
        group: int,
        *,
        redo: bool = False,
    ) -> TableCommit:
        """Apply `plan` as one commit of `group`. `redo`: the group may have landed in part
        before (a restart finishing it); what landed is found and skipped. Otherwise no look
        is taken (it costs a Spark job per table): Delta's idempotent-write ids would skip a
        repeated write anyway."""
        path = self.table_path(plan.table)
        if plan.dropped_by is not None:
            retired = self.retired_path(plan.table, plan.dropped_by)
            if has_commits(self.spark, retired):
                return TableCommit(plan.table, "retire", -1, 0, True, retired)
        kind = "create" if plan.creates else "rewrite" if plan.schema_changed else "merge"
        committed = self.committed_group(path) if redo else -1
        if committed >= group:
            commit = TableCommit(plan.table, kind, -1, len(plan.entries), already_committed=True)
        elif plan.creates and committed >= 0:
            raise RelationalMirrorError(
                f"table {plan.table}: the journal says group {group} creates it, but {path} "
                f"already holds a table written by group {committed}"
            )
        elif plan.creates and has_commits(self.spark, path):
            raise RelationalMirrorError(
                f"table {plan.table}: the journal says group {group} creates it, but {path} "
                "already holds a Delta table (not one of this group); move it away and run again"
            )
        elif not plan.creates and not has_commits(self.spark, path):
            raise RelationalMirrorError(
                f"table {plan.table}: its Delta table at {path} is missing; the mirror lost a "
                "table it had (restore it from a backup, or mirror the source again)"
            )
        elif not plan.entries and plan.keep_base and not plan.schema_changed and not plan.creates:
            commit = TableCommit(plan.table, "none", -1, 0)
        else:
            commit = self._write(plan, group, kind, path)
        if plan.dropped_by is not None:
            return self._retire(plan, path, commit)
        return commit

    def _write(self, plan: TablePlan, group: int, kind: str, path: str) -> TableCommit:
        if plan.moved_from:
            plan = plan.resolve_moves(self._rows_at(plan, plan.moved_from))
        metadata: dict[str, Any] = {
            "replicator": FORMAT,
            "group": group,
            "table": str(plan.table),
            "kind": kind,
            "transactions": list(plan.transaction_ids),
        }
        if plan.creates or plan.schema_changed:
            metadata["definition"] = encode_definition(plan.definition)
        with delta_write_confs(
            self.spark,
            user_metadata=json.dumps(metadata, separators=(",", ":")),
            app_id=self.app_id,
            version=group,
        ):
            reset_last_commit_version(self.spark)
            if kind == "create":
                self._create(plan, path)
            elif kind == "rewrite":
                self._rewrite(plan, path)
            else:
                self._merge(plan, path)
            version = last_commit_version(self.spark)
        return TableCommit(plan.table, kind, -1 if version is None else version, len(plan.entries))

    def _retire(self, plan: TablePlan, path: str, commit: TableCommit) -> TableCommit:
        assert plan.dropped_by is not None
        retired = self.retired_path(plan.table, plan.dropped_by)
        source, filesystem = _hadoop_path(self.spark, path)
        target, _ = _hadoop_path(self.spark, retired)
        filesystem.mkdirs(target.getParent())
        if not filesystem.rename(source, target):
            raise RelationalMirrorError(
                f"DROP TABLE {plan.table} (transaction {plan.dropped_by}): could not move "
                f"{path} to {retired}; check the mirror's storage and permissions"
            )
        log.info("table %s dropped by transaction %d: retired to %s", plan.table,
                 plan.dropped_by, retired)
        return TableCommit(plan.table, commit.kind, commit.version, commit.rows,
                           commit.already_committed, retired)

    # The three writes.

    def _create(self, plan: TablePlan, path: str) -> None:
        writer = self._upserts(plan).write.format("delta").mode("append")
        for key, value in TABLE_PROPERTIES.items():
            writer = writer.option(key, value)
        writer.save(path)

    def _merge(self, plan: TablePlan, path: str) -> None:
        from delta.tables import DeltaTable

        definition = plan.definition
        keys = definition.primary_key
        others = [c.name for c in definition.columns if c.name not in keys]
        on = " AND ".join(f"t.`{k}` = s.`{k}`" for k in keys)
        every: dict[str, str | Column] = {f"`{c}`": f"s.`{c}`" for c in definition.column_names}
        patched: dict[str, str | Column] = {f"`{c}`": _patched(c) for c in others}
        merge = (
            DeltaTable.forPath(self.spark, path).alias("t")
            .merge(self._source(plan).alias("s"), on)
            .whenMatchedDelete(f"s.{OP_COLUMN} = 'delete'")
            .whenMatchedUpdate(f"s.{OP_COLUMN} = 'upsert'", set=every)
        )
        if patched:
            merge = merge.whenMatchedUpdate(f"s.{OP_COLUMN} = 'patch'", set=patched)
        merge = merge.whenNotMatchedInsert(f"s.{OP_COLUMN} = 'upsert'", values=every)
        if not plan.keep_base:
            merge = merge.whenNotMatchedBySourceDelete()
        merge.execute()

    def _rewrite(self, plan: TablePlan, path: str) -> None:
        from pyspark.sql import functions as F

        definition = plan.definition
        base_definition = plan.base_definition
        assert base_definition is not None
        keys = list(definition.primary_key)
        upserts = self._upserts(plan)
        if plan.keep_base:
            base = self.spark.read.format("delta").load(path)
            kept = set(base_definition.column_names)
            base = base.select(*(
                F.col(f"`{c.name}`") if c.name in kept
                else F.lit(c.delta_value(plan.fills.get(c.name))).cast(c.delta_type())
                .alias(c.name)
                for c in definition.columns
            ))
            source = self._source(plan)
            touched = source.select(*(f"`{k}`" for k in keys))
            patches = source.where(F.col(OP_COLUMN) == "patch")
            patched = base.alias("t").join(patches.alias("s"), keys).select(*(
                F.col(f"`{c}`") if c in keys else F.expr(_patched(c)).alias(c)
                for c in definition.column_names
            ))
            rows = (
                base.join(touched, keys, "left_anti")
                .unionByName(patched)
                .unionByName(upserts)
            )
        else:
            rows = upserts
        rows.write.format("delta").mode("overwrite").option("overwriteSchema", "true").save(path)

    # Frames.

    def _upserts(self, plan: TablePlan) -> DataFrame:
        definition = plan.definition
        columns = definition.columns
        data = [
            tuple(c.delta_value(entry.row.get(c.name)) for c in columns)
            for entry in plan.entries.values()
            if isinstance(entry, Upsert)
        ]
        return self.spark.createDataFrame(data, schema=spark_schema(definition))

    def _source(self, plan: TablePlan) -> DataFrame:
        """The MERGE source: every entry, its operation, and for a patch the columns it sets."""
        definition = plan.definition
        columns = definition.columns
        names = set(definition.column_names)
        data: list[tuple[Value | list[str], ...]] = []
        for key, entry in plan.entries.items():
            if isinstance(entry, Upsert):
                values = [c.delta_value(entry.row.get(c.name)) for c in columns]
                data.append((*values, "upsert", []))
            elif isinstance(entry, Patch):
                key_values = dict(zip(definition.primary_key, key, strict=True))
                given = {**key_values, **entry.values}
                values = [c.delta_value(given.get(c.name)) for c in columns]
                data.append((*values, "patch", sorted(n for n in entry.values if n in names)))
            elif isinstance(entry, Delete):
                key_values = dict(zip(definition.primary_key, key, strict=True))
                values = [c.delta_value(key_values.get(c.name)) for c in columns]
                data.append((*values, "delete", []))
            else:  # Move: resolved before any frame is built
                raise AssertionError(f"unresolved move to {key}")
        schema = f"{spark_schema(definition)}, {OP_COLUMN} string, {SET_COLUMN} array<string>"
        return self.spark.createDataFrame(data, schema=schema)

    def _rows_at(self, plan: TablePlan, keys: Sequence[Key]) -> dict[Key, dict[str, Value]]:
        """The mirror's rows at `keys` (few: the sources of primary-key updates)."""
        from pyspark.sql import functions as F

        assert plan.base_definition is not None
        key_names = plan.base_definition.primary_key
        frame = self.spark.createDataFrame(
            [tuple(key) for key in keys],
            schema=", ".join(
                f"`{k}` {plan.base_definition.column(k).delta_type()}" for k in key_names
            ),
        )
        base = self.spark.read.format("delta").load(self.table_path(plan.table))
        found = base.join(F.broadcast(frame), list(key_names)).collect()
        rows: dict[Key, dict[str, Value]] = {}
        for row in found:
            values = row.asDict()
            rows[tuple(values[k] for k in key_names)] = values
        return rows


def _patched(column: str) -> str:
    """A patched row's value of `column` (target `t`, source `s`): the patch's value when the
    UPDATE set the column, the mirror's otherwise."""
    quoted = column.replace("\\", "\\\\").replace("'", "\\'")
    return (
        f"CASE WHEN array_contains(s.{SET_COLUMN}, '{quoted}') "
        f"THEN s.`{column}` ELSE t.`{column}` END"
    )
