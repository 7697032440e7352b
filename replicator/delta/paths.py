"""Table locations as the replicator is given them (a path or a `file:` URI) on local disk."""

from __future__ import annotations

from urllib.parse import unquote, urlparse


def on_local_filesystem(location: str) -> bool:
    """Whether delta-rs may commit to the table at `location`: a plain path or a `file:` URI.
    Elsewhere the storage credentials are Hadoop's, which delta-rs does not read."""
    return urlparse(location).scheme in ("", "file")


def local_path(location: str) -> str:
    """The local filesystem path of `location`: a plain path as it is, a `file:` URI decoded."""
    parsed = urlparse(location)
    return unquote(parsed.path) if parsed.scheme == "file" else location
