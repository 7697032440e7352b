"""Which versions of a mirror's data table can still be read, and which version a time names.

Pure logic over the table's history, no engine: every VACUUM in it moves the oldest readable
snapshot and change data forward (`readable_versions`), and a timestamp argument names the newest
version committed at or before it (`version_at`). `MirrorHistory` applies these checks to the
history it read (`replicator.inspect.mirror_history`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from replicator.errors import ConfigError

if TYPE_CHECKING:
    from replicator.delta.reader import HistoryEntry

VACUUM_START = "VACUUM START"


@dataclass(frozen=True, slots=True)
class TableVersion:
    """One commit of the data table: its version and commit time."""

    version: int
    committed_at: datetime


def readable_versions(entries: Sequence[HistoryEntry]) -> tuple[int, int]:
    """(oldest version readable as a snapshot, oldest version whose change data is readable).

    Every VACUUM START in the history deletes files removed before its time minus the retention
    it ran with: versions before the newest commit older than that cutoff may miss files, and
    that commit's own removed files and change data are gone too.
    """
    if not entries:
        raise ValueError("a Delta table has at least one version")
    oldest = min(entry.version for entry in entries)
    snapshots = changes = oldest
    for vacuum in (e for e in entries if e.operation == VACUUM_START):
        retention_ms = vacuum.parameters.get("specifiedRetentionMillis") or vacuum.parameters.get(
            "defaultRetentionMillis"
        )
        if retention_ms is None:
            continue
        cutoff = vacuum.timestamp - timedelta(milliseconds=int(retention_ms))
        expired = [
            e.version for e in entries if e.version < vacuum.version and e.timestamp < cutoff
        ]
        if expired:
            snapshots = max(snapshots, max(expired))
            changes = max(changes, max(expired) + 1)
    return snapshots, changes


def version_at(versions: Sequence[TableVersion], moment: datetime) -> int | None:
    """The newest version committed at or before `moment`; None when `moment` precedes them all."""
    eligible = [v.version for v in versions if v.committed_at <= moment]
    return max(eligible) if eligible else None


def first_version_from(versions: Sequence[TableVersion], moment: datetime) -> int | None:
    """The oldest version committed at or after `moment`; None when none is."""
    eligible = [v.version for v in versions if v.committed_at >= moment]
    return min(eligible) if eligible else None


def parse_moment(value: datetime | str) -> datetime:
    """A timestamp argument as an aware datetime; naive values and ISO strings are UTC."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError(
                f"invalid timestamp {value!r}: use ISO 8601, e.g. 2026-01-31T12:00:00Z"
            ) from None
    if not isinstance(value, datetime):
        raise ConfigError(f"a timestamp must be a datetime or ISO 8601 text, got {value!r}")
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value
