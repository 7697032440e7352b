"""Checks a mirror version by version against the embedded producer's history.

After each killed run the audit reads the change data feed of the versions that run added and
replays it on its own copy of the table. Each version must
- change only the vbuckets its commit names (the others stay as they were),
- leave each vbucket it names exactly as the producer held it at the committed seqno (a whole
  snapshot: nothing lost, nothing half applied; a document already past its expiry may be
  missing, as the replicator deletes those),
- and, for steady commits, write no change (key, seqno, cas) that an earlier commit wrote,
  unless a rollback or resync undid it since.
The replayed copy must then equal the newest version as Spark reads it, so the feed and the
table cannot disagree unnoticed.

The producer's history must still hold every position the new versions name: run the audit
before a failover truncates a vbucket, as the crash loop does.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replicator.delta.commit_metadata import COMMIT, RESYNC, ROLLBACK
from replicator.delta.schema import DATA_COLUMNS
from replicator.errors import ReplicatorError
from replicator.model.aliases import DocumentKey
from replicator.sim.bucket import DocumentRecord, SimBucket
from replicator.soak.table_log import TableCommit, read_commit, table_versions

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MirrorRow = tuple[Any, ...]
"""A data table row: the values of DATA_COLUMNS, in order."""

_REMOVALS = ("delete", "update_preimage")
_WRITES = ("insert", "update_postimage")
_SHOWN = 5


class MirrorViolation(ReplicatorError):
    """A mirror version lost, duplicated or half applied a change; the message says where."""


@dataclass(frozen=True, slots=True)
class AuditProgress:
    """What the audit has checked so far."""

    versions_checked: int
    changes_applied: int
    rollbacks_seen: int
    resyncs_seen: int
    rolled_back_vbuckets: int
    """Vbuckets the rollback commits named (a failover's rollbacks share one commit)."""
    resynced_vbuckets: int


def expected_row(record: DocumentRecord) -> MirrorRow:
    """The row the mirror must hold for a live document of the producer."""
    scope, _, collection = record.collection.partition(".")
    xattrs = None
    if record.xattrs:
        xattrs = "{" + ",".join(f"{json.dumps(n)}:{v}" for n, v in record.xattrs) + "}"
    expiry = (
        datetime.fromtimestamp(record.expiry, UTC).replace(tzinfo=None) if record.expiry else None
    )
    return (
        record.vbucket, scope, collection, record.collection_id, record.key.decode(),
        record.seqno, record.rev_seqno, record.cas, record.flags, expiry, record.is_json,
        record.value.decode() if record.is_json else None,
        None if record.is_json else bytes(record.value),
        xattrs,
    )


def mirror_row(row: Any) -> MirrorRow:
    """A Spark row of the data table as a comparable tuple (binary values as bytes)."""
    values = [row[name] for name in DATA_COLUMNS]
    value_index = DATA_COLUMNS.index("value")
    if values[value_index] is not None:
        values[value_index] = bytes(values[value_index])
    return tuple(values)


def _identity(row: MirrorRow) -> tuple[int, DocumentKey]:
    return int(row[0]), (int(row[3]), str(row[4]))


class MirrorAudit:
    """Incremental audit of the mirror at `target` against `bucket` (see the module doc)."""

    def __init__(self, spark: SparkSession, target: Path, bucket: SimBucket) -> None:
        self._spark = spark
        self._target = target
        self._bucket = bucket
        self._state: dict[int, dict[DocumentKey, MirrorRow]] = {}
        self._applied: set[tuple[int, int, str, int, int]] = set()
        self._last_version = -1
        self._committed: dict[int, list[int]] = {}
        """Per vbucket, the seqnos its commits reached on the producer's current branch."""
        self._kinds: Counter[str] = Counter()
        self._vbuckets_by_kind: Counter[str] = Counter()
        self._versions_checked = 0
        self._changes_applied = 0

    @property
    def progress(self) -> AuditProgress:
        return AuditProgress(
            self._versions_checked, self._changes_applied, self._kinds[ROLLBACK],
            self._kinds[RESYNC], self._vbuckets_by_kind[ROLLBACK], self._vbuckets_by_kind[RESYNC],
        )

    def committed_seqnos(self) -> dict[int, int]:
        """Each vbucket's committed seqno as of the newest checked version."""
        return {vb: seqnos[-1] for vb, seqnos in self._committed.items() if seqnos}

    def committed_history(self, vbucket: int) -> list[int]:
        """The seqnos `vbucket`'s commits reached, oldest first, since its last rollback."""
        return list(self._committed.get(vbucket, []))

    def check_new_versions(self) -> int:
        """Check every version added since the last call; returns how many were checked."""
        versions = [v for v in table_versions(self._target) if v > self._last_version]
        if not versions:
            return 0
        first, last = versions[0], versions[-1]
        if versions != list(range(first, last + 1)) or first != self._last_version + 1:
            raise MirrorViolation(f"table versions are not contiguous: {versions}")
        changes = self._change_feed(first, last)
        for version in versions:
            self._check_version(read_commit(self._target, version), changes.get(version, []))
        self._compare_with_table(last)
        self._last_version = last
        return len(versions)

    def check_equals_producer(self) -> None:
        """The newest checked version holds exactly the producer's live documents."""
        expected: dict[int, dict[DocumentKey, MirrorRow]] = {}
        for record in self._bucket.documents():
            row = expected_row(record)
            vbucket, identity = _identity(row)
            expected.setdefault(vbucket, {})[identity] = row
        for vbucket in sorted(set(expected) | set(self._state)):
            _compare(
                self._state.get(vbucket, {}), expected.get(vbucket, {}),
                f"the final mirror, vbucket {vbucket}, against the producer",
            )

    # -- one version ------------------------------------------------------------------------

    def _check_version(self, commit: TableCommit, changes: list[tuple[str, MirrorRow]]) -> None:
        metadata = commit.metadata
        named = set(metadata.positions) if metadata is not None else set()
        where = f"version {commit.version} ({commit.operation}"
        where += f", {metadata.kind} batch {metadata.batch_id})" if metadata else ")"
        strays = sorted({int(row[0]) for _, row in changes} - named)
        if strays:
            raise MirrorViolation(f"{where} changed vbuckets {strays} its commit does not name")
        for change, row in changes:
            if change in _REMOVALS:
                vbucket, identity = _identity(row)
                held = self._state.get(vbucket, {}).pop(identity, None)
                if held != row:
                    raise MirrorViolation(
                        f"{where} removed a row the previous version did not hold: {row[:6]} "
                        f"(held: {None if held is None else held[:6]})"
                    )
        steady = metadata is not None and metadata.kind == COMMIT
        for change, row in changes:
            if change not in _WRITES:
                continue
            vbucket, identity = _identity(row)
            rows = self._state.setdefault(vbucket, {})
            if identity in rows:
                raise MirrorViolation(f"{where} holds two rows for {vbucket}/{identity}")
            rows[identity] = row
            if steady:
                applied = (vbucket, identity[0], identity[1], int(row[5]), int(row[7]))
                if applied in self._applied:
                    raise MirrorViolation(f"{where} applied change {applied} a second time")
                self._applied.add(applied)
        if steady:
            self._changes_applied += len(changes) - sum(
                1 for change, _ in changes if change == "update_preimage"
            )
        if metadata is not None and not steady:
            # A rollback or resync to seqno B undoes what was applied above B: those items
            # may (and, where the failover kept them, must) be applied again.
            for vbucket, position in metadata.positions.items():
                self._applied = {
                    a for a in self._applied if a[0] != vbucket or a[3] <= position.seqno
                }
        if metadata is not None:
            self._kinds[metadata.kind] += 1
            self._vbuckets_by_kind[metadata.kind] += len(metadata.positions)
            for vbucket, position in sorted(metadata.positions.items()):
                self._check_vbucket(where, vbucket, position.vbucket_uuid, position.seqno)
                history = self._committed.setdefault(vbucket, [])
                while history and history[-1] >= position.seqno:
                    history.pop()  # a rollback or resync rewinds: commits above it are gone
                history.append(position.seqno)
        self._versions_checked += 1

    def _check_vbucket(self, where: str, vbucket: int, vbucket_uuid: int, seqno: int) -> None:
        log = self._bucket.failover_log(vbucket)
        high = self._bucket.high_seqnos()[vbucket]
        branch_end = high
        for newer, entry in zip((None, *log.entries), log.entries, strict=False):
            if entry.vbucket_uuid == vbucket_uuid:
                branch_end = high if newer is None else newer.seqno
                break
        if seqno > branch_end:
            raise MirrorViolation(
                f"{where}: vbucket {vbucket} at seqno {seqno} is past its branch end "
                f"{branch_end}: the producer's history changed before the audit ran"
            )
        actual = self._state.get(vbucket, {})
        now = time.time()
        expected = {}
        for record in self._bucket.state_at(vbucket, seqno):
            row = expected_row(record)
            identity = _identity(row)[1]
            # The replicator turns a mutation already past its expiry into a delete (the
            # producer would expire it on the next read): absent is right for those too.
            if identity in actual or not record.expiry or record.expiry > now:
                expected[identity] = row
        _compare(
            actual, expected,
            f"{where}, vbucket {vbucket} at seqno {seqno}, against the producer",
        )

    # -- Spark reads ------------------------------------------------------------------------

    def _change_feed(self, first: int, last: int) -> dict[int, list[tuple[str, MirrorRow]]]:
        rows = (
            self._spark.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", first)
            .option("endingVersion", last)
            .load(str(self._target))
            .select(*DATA_COLUMNS, "_change_type", "_commit_version")
            .collect()
        )
        by_version: dict[int, list[tuple[str, MirrorRow]]] = {}
        for row in rows:
            change = (str(row["_change_type"]), mirror_row(row))
            by_version.setdefault(int(row["_commit_version"]), []).append(change)
        return by_version

    def _compare_with_table(self, version: int) -> None:
        rows = (
            self._spark.read.format("delta")
            .option("versionAsOf", version)
            .load(str(self._target))
            .select(*DATA_COLUMNS)
            .collect()
        )
        table: dict[int, dict[DocumentKey, MirrorRow]] = {}
        for row in rows:
            values = mirror_row(row)
            vbucket, identity = _identity(values)
            table.setdefault(vbucket, {})[identity] = values
        for vbucket in sorted(set(table) | set(self._state)):
            _compare(
                table.get(vbucket, {}), self._state.get(vbucket, {}),
                f"version {version} as read, vbucket {vbucket}, against its replayed feed",
            )


def _compare(
    actual: Mapping[DocumentKey, MirrorRow], expected: Mapping[DocumentKey, MirrorRow], what: str
) -> None:
    if actual == expected:
        return
    missing = sorted(set(expected) - set(actual))
    extra = sorted(set(actual) - set(expected))
    differing = sorted(k for k in set(actual) & set(expected) if actual[k] != expected[k])
    details = [
        _listing("missing", missing),
        _listing("unexpected", extra),
        _listing("different", differing),
    ]
    for identity in differing[:2]:
        details.append(f"{identity}: mirror {actual[identity][5:9]} vs {expected[identity][5:9]}")
    raise MirrorViolation(f"{what}: " + "; ".join(d for d in details if d))


def _listing(label: str, identities: Iterable[DocumentKey]) -> str:
    shown = list(identities)
    if not shown:
        return ""
    return f"{len(shown)} {label} ({', '.join(f'{c}/{k}' for c, k in shown[:_SHOWN])})"
