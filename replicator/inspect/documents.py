"""One document through the mirror's history: every version its commits left, and what changed
between two of them.

`document_history` reads the change data feed of the whole readable history (a BASELINE stands
for the document as the oldest readable version held it, when older changes are gone);
`collapse_changes` turns feed rows into versions and `diff_documents` compares two versions field
by field, both pure.

>>> from replicator.inspect.documents import document_history
>>> history = document_history(spark, "/data/mirror", "order::7")  # doctest: +SKIP
>>> [(v.table_version, str(v.operation), v.value) for v in history]  # doctest: +SKIP
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from replicator.delta.schema import DATA_COLUMNS
from replicator.delta.table import as_utc
from replicator.errors import ConfigError
from replicator.inspect.mirror_history import MirrorHistory, guarded

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_CONTENT_COLUMNS = (
    "vbucket", "seqno", "rev_seqno", "cas", "flags", "expiry", "is_json", "doc", "value", "xattrs"
)
"""What makes two rows of one document the same version of it."""


class ChangeOperation(enum.StrEnum):
    """What a table version did to one document."""

    INSERT = "insert"
    UPDATE = "update"
    DELETE = "delete"
    BASELINE = "baseline"
    """Present at the oldest version still in the log: earlier changes are no longer known."""


@dataclass(frozen=True, slots=True)
class DocumentVersion:
    """One document as a table version left it.

    `value` is the JSON text (or the raw bytes of a binary document); for a delete it is None,
    as are `seqno` and `cas` (the mirror keeps no tombstones). `commit_kind` is the replicator
    commit's kind (commit, rollback, resync), None when the commit is not the replicator's.
    """

    table_version: int
    committed_at: datetime
    operation: ChangeOperation
    key: str
    scope: str
    collection: str
    vbucket: int
    seqno: int | None
    cas: int | None
    value: str | bytes | None
    expiry: datetime | None = None
    xattrs: str | None = None
    commit_kind: str | None = None

    @property
    def collection_path(self) -> str:
        """`scope.collection`."""
        return f"{self.scope}.{self.collection}"

    def json_value(self) -> Any:
        """The document parsed from JSON; None for a delete or a binary document."""
        if not isinstance(self.value, str):
            return None
        return json.loads(self.value)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (binary values as hex)."""
        value: Any = self.value.hex() if isinstance(self.value, bytes) else self.value
        return {
            "table_version": self.table_version,
            "committed_at": self.committed_at.isoformat(),
            "operation": str(self.operation),
            "key": self.key,
            "collection": self.collection_path,
            "vbucket": self.vbucket,
            "seqno": self.seqno,
            "cas": self.cas,
            "expiry": self.expiry.isoformat() if self.expiry is not None else None,
            "commit_kind": self.commit_kind,
            "value": value,
            "xattrs": self.xattrs,
        }


class FieldChangeKind(enum.StrEnum):
    """How one field differs between two versions of a document."""

    ADDED = "added"
    REMOVED = "removed"
    CHANGED = "changed"


@dataclass(frozen=True, slots=True)
class FieldChange:
    """One field that differs: its path (`address.city`, `items[0]`), old and new value.

    `before` is None for an added field, `after` for a removed one; `kind` tells those apart
    from a JSON null.
    """

    path: str
    kind: FieldChangeKind
    before: Any = None
    after: Any = None


def split_collection(path: str) -> tuple[str, str]:
    """`scope.collection` -> (scope, collection), ConfigError when it is not of that form."""
    scope, dot, collection = path.partition(".")
    if not dot or not scope or not collection or "." in collection:
        raise ConfigError(
            f"collection {path!r} is not of the form scope.collection (e.g. app.orders, "
            "_default._default)"
        )
    return scope, collection


def document_history(
    spark: SparkSession | None, target: str, key: str, *, collection: str | None = None,
    engine: str | None = None,
) -> list[DocumentVersion]:
    """Every version of one document the mirror committed, oldest first.

    Read from the change data feed over the whole history still in the log; a table version
    that rewrote the document unchanged (a rollback of its vbucket that did not touch it) is
    left out. When older changes were cleaned up or vacuumed, the first entry is a BASELINE:
    the document as the oldest fully readable version held it. `collection`
    (`scope.collection`) is needed when the key exists in several collections. Empty when the
    mirror never held the key. Read with delta-rs unless a SparkSession is given or `engine`
    is "spark"; with Spark anyway where delta-rs would misread the feed (old rollbacks).

    >>> history = document_history(spark, "/data/mirror", "order::7",  # doctest: +SKIP
    ...                            collection="app.orders")
    >>> [(v.table_version, str(v.operation), v.seqno) for v in history]  # doctest: +SKIP
    [(1, 'insert', 12), (4, 'update', 57), (9, 'delete', None)]
    """
    from replicator.delta.reader import table_reader

    if not key:
        raise ConfigError("document_history needs a document key")
    history = MirrorHistory.open(table_reader(engine, spark), target)
    # Changes before the log's oldest version, or vacuumed ones, are gone: start from the
    # document as the oldest fully readable version held it.
    base = None
    if history.oldest > 0 or history.change_horizon > history.oldest:
        base = max(history.oldest, history.change_horizon - 1)
    start = history.oldest if base is None else base + 1
    if start <= history.latest:
        history = history.for_changes(start, history.latest, engine=engine, spark=spark)
    literal = history.reader.literal
    condition = f"key = {literal(key)}"
    if collection is not None:
        scope, name = split_collection(collection)
        condition += f" AND scope = {literal(scope)} AND collection = {literal(name)}"

    def rows() -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        if base is not None:
            history.check_readable(base)
            baseline = history.reader.read(
                history.target, DATA_COLUMNS, version=base, where=condition
            )
            found += [
                {**row, "_change_type": "baseline", "_commit_version": base,
                 "_commit_timestamp": history.commit_time(base)}
                for row in baseline.to_pylist()
            ]
        if start <= history.latest:
            found += history.change_rows(start, history.latest, where=condition)[1].to_pylist()
        return found

    changes = guarded(rows, f"the history of {key!r} in {target}")
    collections = sorted({f"{row['scope']}.{row['collection']}" for row in changes})
    if len(collections) > 1:
        raise ConfigError(
            f"key {key!r} exists in several collections ({', '.join(collections)}); pass "
            "collection= (--collection) to pick one"
        )
    return collapse_changes(changes, history.commit_kinds())


def collapse_changes(
    changes: Iterable[Mapping[str, Any]], commit_kinds: Mapping[int, str] | None = None
) -> list[DocumentVersion]:
    """Change data feed rows of ONE document -> its versions, oldest first (pure).

    Each table version's rows give the state after it: an insert or update_postimage row, or
    nothing (deleted). The operation compares that with the state before, so a rewrite that
    leaves the document as it was (a rollback or resync rewriting its whole vbucket shows as
    delete + insert of the same row) is no version at all. A row whose `_change_type` is
    `baseline` is the document as found at the start of the readable history.
    """
    by_version: dict[int, list[Mapping[str, Any]]] = {}
    for row in changes:
        by_version.setdefault(int(row["_commit_version"]), []).append(row)
    kinds = commit_kinds or {}
    versions: list[DocumentVersion] = []
    current: Mapping[str, Any] | None = None
    for version in sorted(by_version):
        rows = by_version[version]
        after = [r for r in rows if r["_change_type"] in ("insert", "update_postimage", "baseline")]
        state = max(after, key=lambda r: int(r["seqno"])) if after else None
        if state is None and current is None:
            continue
        if state is not None and current is not None and _content(state) == _content(current):
            continue
        if state is None:
            assert current is not None
            versions.append(_document_version(current, rows[0], ChangeOperation.DELETE, kinds,
                                              deleted=True))
        else:
            if state["_change_type"] == "baseline":
                operation = ChangeOperation.BASELINE
            elif current is None:
                operation = ChangeOperation.INSERT
            else:
                operation = ChangeOperation.UPDATE
            versions.append(_document_version(state, state, operation, kinds))
        current = state
    return versions


def _content(row: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(row[name] for name in _CONTENT_COLUMNS)


def _document_version(
    row: Mapping[str, Any],
    commit: Mapping[str, Any],
    operation: ChangeOperation,
    kinds: Mapping[int, str],
    *,
    deleted: bool = False,
) -> DocumentVersion:
    version = int(commit["_commit_version"])
    value: str | bytes | None = None
    if not deleted:
        raw = row["value"]
        value = row["doc"] if row["is_json"] else (bytes(raw) if raw is not None else None)
    return DocumentVersion(
        table_version=version,
        committed_at=as_utc(commit["_commit_timestamp"]),
        operation=operation,
        key=str(row["key"]),
        scope=str(row["scope"]),
        collection=str(row["collection"]),
        vbucket=int(row["vbucket"]),
        seqno=None if deleted else int(row["seqno"]),
        cas=None if deleted else int(row["cas"]),
        value=value,
        expiry=None if deleted or row["expiry"] is None else as_utc(row["expiry"]),
        xattrs=None if deleted else row["xattrs"],
        commit_kind=kinds.get(version),
    )


def diff_documents(
    before: DocumentVersion | None, after: DocumentVersion | None
) -> list[FieldChange]:
    """The fields that differ between two versions of a document, by path (pure).

    Nested objects are walked (`address.city`), arrays by index (`items[0]`). A missing side
    (None, or a delete) counts as no fields; a binary document is one field with path `""`.

    >>> from datetime import UTC
    >>> def order(version, text):
    ...     return DocumentVersion(version, datetime(2026, 1, 31, tzinfo=UTC),
    ...                            ChangeOperation.UPDATE, "order::7", "app", "orders",
    ...                            vbucket=5, seqno=50 + version, cas=version, value=text)
    >>> old = order(3, '{"status": "paid", "items": [{"sku": "a1"}]}')
    >>> new = order(4, '{"status": "shipped", "items": [{"sku": "a1"}], "carrier": "DHL"}')
    >>> [(c.path, str(c.kind), c.before, c.after) for c in diff_documents(old, new)]
    [('carrier', 'added', None, 'DHL'), ('status', 'changed', 'paid', 'shipped')]
    """
    return _diff_fields(_flatten(before), _flatten(after))


def _flatten(version: DocumentVersion | None) -> dict[str, Any]:
    if version is None or version.value is None:
        return {}
    if isinstance(version.value, bytes):
        return {"": version.value}
    fields: dict[str, Any] = {}
    _walk(json.loads(version.value), "", fields)
    return fields


def _walk(node: Any, path: str, fields: dict[str, Any]) -> None:
    if isinstance(node, dict) and node:
        for name, child in node.items():
            _walk(child, f"{path}.{name}" if path else str(name), fields)
    elif isinstance(node, list) and node:
        for index, child in enumerate(node):
            _walk(child, f"{path}[{index}]", fields)
    else:
        fields[path] = node


def _diff_fields(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[FieldChange]:
    changes = []
    for path in sorted(old.keys() | new.keys()):
        if path not in new:
            changes.append(FieldChange(path, FieldChangeKind.REMOVED, before=old[path]))
        elif path not in old:
            changes.append(FieldChange(path, FieldChangeKind.ADDED, after=new[path]))
        elif old[path] != new[path] or type(old[path]) is not type(new[path]):
            changes.append(FieldChange(path, FieldChangeKind.CHANGED, old[path], new[path]))
    return changes
