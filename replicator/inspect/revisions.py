"""Every revision of a document, from the history table a `--history` run keeps.

The mirror's change data feed shows a document as each commit left it; change streams show
every revision the source made, and the history table (replicator.delta.history) keeps them
beyond the time-travel retention. A row counts only once the mirror committed its batch; a
rollback marker makes the revisions of its vbucket above its seqno, committed before it, the
rolled-back branch: kept and marked, not dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from replicator.delta.reader import table_reader
from replicator.delta.schema import ROLLBACK_OP, MirrorLayout
from replicator.errors import ConfigError
from replicator.staging.rows import UPSERT

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from replicator.delta.reader import TableReader

CommitKey = tuple[str, int, int]
"""(owner_id, batch_id, part): which replicator commit a history row belongs to."""

_COLUMNS = (
    "owner_id", "batch_id", "part", "vbucket", "scope", "collection", "key", "seqno",
    "rev_seqno", "cas", "op", "expiry", "is_json", "doc", "value", "xattrs",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Revision:
    """One revision of a document as the source made it.

    `operation` is "upsert" or "delete". `table_version` is the mirror version whose commit
    applied it (the batch's last one when the mirror's log no longer holds the commit).
    `rolled_back_at` is the version of the rollback that discarded it, None while it stands.
    """

    key: str
    scope: str
    collection: str
    vbucket: int
    seqno: int
    rev_seqno: int
    cas: int
    operation: str
    value: str | bytes | None
    expiry: datetime | None
    xattrs: str | None
    table_version: int
    committed_at: datetime
    rolled_back_at: int | None = None

    @property
    def collection_path(self) -> str:
        return f"{self.scope}.{self.collection}"

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (binary values as hex)."""
        value: Any = self.value.hex() if isinstance(self.value, bytes) else self.value
        return {
            "key": self.key,
            "collection": self.collection_path,
            "vbucket": self.vbucket,
            "seqno": self.seqno,
            "rev_seqno": self.rev_seqno,
            "cas": self.cas,
            "operation": self.operation,
            "table_version": self.table_version,
            "committed_at": self.committed_at.isoformat(),
            "rolled_back_at": self.rolled_back_at,
            "expiry": self.expiry.isoformat() if self.expiry is not None else None,
            "value": value,
            "xattrs": self.xattrs,
        }


def has_history(target: str, *, engine: str | None = None,
                spark: SparkSession | None = None) -> bool:
    """Whether the mirror at `target` has a history table (it was run with `--history`)."""
    return table_reader(engine, spark).is_table(MirrorLayout(target).history)


def revision_history(
    spark: SparkSession | None, target: str, key: str, *, collection: str | None = None,
    engine: str | None = None,
) -> list[Revision] | None:
    """Every committed revision of one document, oldest first; None without a history table.

    `collection` (`scope.collection`) is needed when the key exists in several collections.

    >>> revisions = revision_history(None, "/data/mirror", "order::7")  # doctest: +SKIP
    >>> [(r.seqno, r.operation, r.rolled_back_at) for r in revisions]  # doctest: +SKIP
    [(12, 'upsert', None), (13, 'upsert', 9), (13, 'upsert', None), (14, 'delete', None)]
    """
    if not key:
        raise ConfigError("revision_history needs a document key")
    reader = table_reader(engine, spark)
    layout = MirrorLayout(target)
    if not reader.is_table(layout.history):
        return None
    literal = reader.literal
    condition = f"key = {literal(key)} AND op <> {literal(ROLLBACK_OP)}"
    if collection is not None:
        from replicator.inspect.documents import split_collection

        scope, name = split_collection(collection)
        condition += f" AND scope = {literal(scope)} AND collection = {literal(name)}"
    found = reader.read(layout.history, _COLUMNS, where=condition).to_pylist()
    collections = sorted({f"{row['scope']}.{row['collection']}" for row in found})
    if len(collections) > 1:
        raise ConfigError(
            f"key {key!r} exists in several collections ({', '.join(collections)}); pass "
            "collection= (--collection) to pick one"
        )
    if not found:
        return []
    markers = reader.read(
        layout.history, ("owner_id", "batch_id", "part", "vbucket", "seqno"),
        where=f"op = {literal(ROLLBACK_OP)}",
    ).to_pylist()
    batches = {int(row["batch_id"]) for row in (*found, *markers)}
    commits = committed_commits(reader, layout, batches)
    return assemble_revisions(found, markers, commits)


def committed_commits(
    reader: TableReader, layout: MirrorLayout, batches: Iterable[int]
) -> dict[CommitKey, tuple[int, datetime]]:
    """(owner, batch, part) -> (version, commit time) of the replicator's commits of `batches`.

    From the log where it still holds the commit; older commits from the checkpoints table,
    which knows batches but not parts (every part of the batch gets its last version).
    """
    commits: dict[CommitKey, tuple[int, datetime]] = {}
    wanted = sorted(set(batches))
    if wanted and reader.is_table(layout.checkpoints):
        rows = reader.read(
            layout.checkpoints, ("owner_id", "batch_id", "table_version", "committed_at"),
            where=f"batch_id IN ({', '.join(str(b) for b in wanted)})",
        ).to_pylist()
        newest: dict[tuple[str, int], tuple[int, datetime]] = {}
        for row in rows:
            batch = (row["owner_id"], int(row["batch_id"]))
            seen = newest.get(batch)
            if seen is None or int(row["table_version"]) > seen[0]:
                newest[batch] = (int(row["table_version"]), row["committed_at"])
        for (owner, batch_id), found in newest.items():
            commits[(owner, batch_id, 0)] = found
            commits[(owner, batch_id, 1)] = found
    for entry in reader.history(layout.data):
        header = entry.commit_header
        if header is not None:
            commits[(header.owner_id, header.batch_id, header.part)] = (
                entry.version, entry.timestamp,
            )
    return commits


def assemble_revisions(
    rows: Iterable[Mapping[str, Any]],
    markers: Iterable[Mapping[str, Any]],
    commits: Mapping[CommitKey, tuple[int, datetime]],
) -> list[Revision]:
    """Revisions of committed history rows, marked when a later committed rollback of their
    vbucket went below them (pure; `rows` and `markers` as read from the history table)."""
    rollbacks: dict[int, list[tuple[int, int]]] = {}
    for marker in markers:
        landed = commits.get(_commit_key(marker))
        if landed is not None:
            rollbacks.setdefault(int(marker["vbucket"]), []).append(
                (landed[0], int(marker["seqno"]))
            )
    revisions = []
    for row in rows:
        landed = commits.get(_commit_key(row))
        if landed is None:
            continue  # its batch never committed
        version, committed_at = landed
        seqno, vbucket = int(row["seqno"]), int(row["vbucket"])
        undone = [
            at for at, to_seqno in rollbacks.get(vbucket, ()) if at > version and to_seqno < seqno
        ]
        is_delete = row["op"] != UPSERT
        revisions.append(
            Revision(
                key=row["key"], scope=row["scope"], collection=row["collection"],
                vbucket=vbucket, seqno=seqno, rev_seqno=int(row["rev_seqno"]),
                cas=int(row["cas"]), operation=row["op"],
                value=None if is_delete else (row["doc"] if row["is_json"] else row["value"]),
                expiry=row["expiry"], xattrs=row["xattrs"], table_version=version,
                committed_at=committed_at, rolled_back_at=min(undone) if undone else None,
            )
        )  # fmt: skip
    # Several rows of one revision can exist: re-streamed after a rollback, each its own
    # commit. Order by commit, then vbucket and seqno: the order the mirror saw them in.
    return sorted(revisions, key=lambda r: (r.table_version, r.vbucket, r.seqno))


def _commit_key(row: Mapping[str, Any]) -> CommitKey:
    return (str(row["owner_id"]), int(row["batch_id"]), int(row["part"]))
