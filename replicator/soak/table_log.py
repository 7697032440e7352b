"""The data table's commits as its `_delta_log` records them, read without Spark.

The crash loop polls this between and during runs (has a new version landed?) and takes each
commit's replicator metadata from it: which vbuckets the commit moved, to which positions, and
whether it was a steady commit, a rollback or a resync.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from replicator.delta.commit_metadata import CommitMetadata

_COMMIT_FILE = re.compile(r"^(\d{20})\.json$")


@dataclass(frozen=True, slots=True)
class TableCommit:
    """One version of the data table: the Delta operation and, if the replicator made it, its
    metadata (None for the table's creation and for commits of other writers)."""

    version: int
    operation: str
    metadata: CommitMetadata | None


def table_versions(table_path: Path) -> list[int]:
    """Every committed version of the Delta table at `table_path`, oldest first."""
    log_dir = table_path / "_delta_log"
    if not log_dir.is_dir():
        return []
    found = (_COMMIT_FILE.match(entry.name) for entry in log_dir.iterdir())
    return sorted(int(match.group(1)) for match in found if match)


def newest_version(table_path: Path) -> int | None:
    """The newest committed version, None before the table exists."""
    versions = table_versions(table_path)
    return versions[-1] if versions else None


def read_commit(table_path: Path, version: int) -> TableCommit:
    """The commit of one version, from its log file."""
    path = table_path / "_delta_log" / f"{version:020d}.json"
    operation = "UNKNOWN"
    metadata = None
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            action = json.loads(line)
            info = action.get("commitInfo")
            if info is not None:
                operation = str(info.get("operation", "UNKNOWN"))
                metadata = CommitMetadata.from_json(info.get("userMetadata"))
                break
    return TableCommit(version, operation, metadata)


def commits_after(table_path: Path, version: int) -> list[TableCommit]:
    """The commits of every version newer than `version` (-1: all), oldest first."""
    return [read_commit(table_path, v) for v in table_versions(table_path) if v > version]
