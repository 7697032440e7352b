"""A Delta table's live data files and transaction ids, read from its log without Spark.

What a writer committing its own log entries needs to know about the table: which files are
live, with their deletion vectors (delta-rs lists the files but not their vectors), and which
txn version each application committed last. Read from the newest checkpoint (classic, single
or multi-part Parquet) and the JSON commits after it; brought up to date by reading only the
commits after the version it holds.

A file's identity is its path and its deletion vector: a commit that changes a file's vector
removes the (path, old vector) entry and adds (path, new vector), in either order.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow.parquet as pq

from replicator.delta.deletion_vectors import DeletionVectorDescriptor
from replicator.delta.paths import local_path

_COMMIT = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10}))?\.parquet$")


class LogSnapshotError(ValueError):
    """A log this reader cannot replay (a format it does not know, or a gap)."""


@dataclass(frozen=True, slots=True)
class DataFile:
    """One live data file of the table, as its add action describes it."""

    path: str
    """As the log writes it: relative to the table's root and URL-encoded, or a URI."""
    partition_values: Mapping[str, str | None]
    size: int
    modification_time: int
    stats: str | None
    deletion_vector: DeletionVectorDescriptor | None

    @property
    def key(self) -> tuple[str, str | None]:
        """The file's identity in the log: its path and its deletion vector."""
        vector = self.deletion_vector
        return self.path, None if vector is None else vector.unique_id

    def local_path(self, table_root: str) -> str:
        """Where the file is on the local filesystem."""
        if urlparse(self.path).scheme:
            return local_path(self.path)
        return os.path.join(local_path(table_root), unquote(self.path))

    @property
    def num_records(self) -> int | None:
        """Rows in the file (deleted ones included), from its statistics when it has them."""
        if not self.stats:
            return None
        value = json.loads(self.stats).get("numRecords")
        return None if value is None else int(value)

    def to_add_json(self) -> dict[str, Any]:
        """The add action that names this file (dataChange set by the caller)."""
        document: dict[str, Any] = {
            "path": self.path,
            "partitionValues": dict(self.partition_values),
            "size": self.size,
            "modificationTime": self.modification_time,
        }
        if self.stats is not None:
            document["stats"] = self.stats
        if self.deletion_vector is not None:
            document["deletionVector"] = self.deletion_vector.to_json()
        return document


@dataclass(frozen=True, slots=True)
class LogSnapshot:
    """The table at one version: its live files (by identity) and its txn versions."""

    version: int
    files: Mapping[tuple[str, str | None], DataFile] = field(default_factory=dict)
    txn_versions: Mapping[str, int] = field(default_factory=dict)


def read_snapshot(table_root: str, since: LogSnapshot | None = None) -> LogSnapshot:
    """The table's newest state; from `since` onwards when given (only later commits read)."""
    log = os.path.join(local_path(table_root), "_delta_log")
    if since is not None:
        return _read_after(log, since)
    names = os.listdir(log)
    version, files, txns = _newest_checkpoint(log, names)
    for commit in sorted(int(m[1]) for m in map(_COMMIT.match, names) if m):
        if commit <= version:
            continue
        if commit != version + 1:
            raise LogSnapshotError(f"{log}: commit {version + 1} is missing before {commit}")
        for action in _actions(os.path.join(log, f"{commit:020d}.json")):
            _apply(action, files, txns)
        version = commit
    if version < 0:
        raise LogSnapshotError(f"{log} holds no commit")
    return LogSnapshot(version, files, txns)


def _read_after(log: str, since: LogSnapshot) -> LogSnapshot:
    """`since` brought up to date by the commits after it, found by name.

    Not by listing the log: a log keeps a month of versions (log retention), half a million
    names when a batch commits every few seconds, 0.6 s a listing, on every batch. A commit
    after `since` that log retention removed shows as a checkpoint newer than what was read.
    """
    files = dict(since.files)
    txns = dict(since.txn_versions)
    version = since.version
    while True:
        try:
            actions = list(_actions(os.path.join(log, f"{version + 1:020d}.json")))
        except FileNotFoundError:
            break
        for action in actions:
            _apply(action, files, txns)
        version += 1
    newest = _newest_checkpoint_version(log)
    if newest is not None and newest > version:
        raise LogSnapshotError(f"{log}: commit {version + 1} is missing before {newest}")
    return LogSnapshot(version, files, txns)


def _newest_checkpoint_version(log: str) -> int | None:
    """The newest checkpoint's version, from `_last_checkpoint` (Delta's pointer to it), or
    from the log's names when there is no readable pointer."""
    try:
        with open(os.path.join(log, "_last_checkpoint")) as pointer:
            return int(json.load(pointer)["version"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        found = [int(m[1]) for m in map(_CHECKPOINT.match, os.listdir(log)) if m]
        return max(found, default=None)


def carries_txn(log_file: str, app_id: str, txn_version: int) -> bool:
    """Whether the log entry `log_file` exists and carries `app_id`'s txn `txn_version` (a
    writer's way to learn whether its commit landed)."""
    try:
        for action in _actions(log_file):
            txn = action.get("txn")
            if txn and txn.get("appId") == app_id and txn.get("version") == txn_version:
                return True
    except FileNotFoundError:
        pass
    return False


def _newest_checkpoint(
    log: str, names: list[str]
) -> tuple[int, dict[tuple[str, str | None], DataFile], dict[str, int]]:
    parts: dict[int, list[tuple[int, str]]] = {}
    totals: dict[int, int] = {}
    for name in names:
        match = _CHECKPOINT.match(name)
        if match is None:
            if ".checkpoint." in name and name[:20].isdigit():
                raise LogSnapshotError(f"{log}/{name}: a checkpoint format not read here")
            continue
        version = int(match[1])
        parts.setdefault(version, []).append((int(match[2] or 1), name))
        totals[version] = int(match[3] or 1)
    complete = [v for v, found in parts.items() if len(found) == totals[v]]
    files: dict[tuple[str, str | None], DataFile] = {}
    txns: dict[str, int] = {}
    if not complete:
        return -1, files, txns
    version = max(complete)
    for _, name in sorted(parts[version]):
        table = pq.read_table(os.path.join(log, name), columns=["add", "txn"])
        for add, txn in zip(table["add"].to_pylist(), table["txn"].to_pylist(), strict=True):
            if add is not None:
                _apply({"add": add}, files, txns)
            if txn is not None:
                _apply({"txn": txn}, files, txns)
    return version, files, txns


def _actions(path: str) -> Iterator[dict[str, Any]]:
    with open(path) as commit:
        for line in commit:
            if line.strip():
                yield json.loads(line)


def _apply(
    action: Mapping[str, Any],
    files: dict[tuple[str, str | None], DataFile],
    txns: dict[str, int],
) -> None:
    if (add := action.get("add")) is not None:
        data_file = _data_file(add)
        files[data_file.key] = data_file
    elif (remove := action.get("remove")) is not None:
        vector = remove.get("deletionVector")
        unique = None if vector is None else DeletionVectorDescriptor.from_json(vector).unique_id
        files.pop((remove["path"], unique), None)
    elif (txn := action.get("txn")) is not None:
        txns[txn["appId"]] = int(txn["version"])


def _data_file(add: Mapping[str, Any]) -> DataFile:
    vector = add.get("deletionVector")
    return DataFile(
        add["path"],
        dict(add.get("partitionValues") or {}),
        int(add["size"]),
        int(add.get("modificationTime") or 0),
        add.get("stats"),
        None if vector is None else DeletionVectorDescriptor.from_json(vector),
    )

