"""Table locations as the replicator is given them (a path or a `file:` URI) on local disk."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

if TYPE_CHECKING:
    from deltalake import DeltaTable


def on_local_filesystem(location: str) -> bool:
    """Whether delta-rs may commit to the table at `location`: a plain path or a `file:` URI.
    Elsewhere the storage credentials are Hadoop's, which delta-rs does not read."""
    return urlparse(location).scheme in ("", "file")


def newest_table(table: DeltaTable | None, location: str) -> DeltaTable:
    """delta-rs's handle on the table at `location`, at its newest version: `table` brought up
    to date (only the log entries since it was read), or opened when there is none yet."""
    if table is None:
        from deltalake import DeltaTable

        return DeltaTable(local_path(location))
    table.update_incremental()
    return table


def local_path(location: str) -> str:
    """The local filesystem path of `location`: a plain path as it is, a `file:` URI decoded."""
    parsed = urlparse(location)
    return unquote(parsed.path) if parsed.scheme == "file" else location
