"""Row images: each data file's rows again, uncompressed Arrow, read by position.

A steady batch at 20,000 changes/s on a 1,000,000-document mirror replaces rows in nearly every
row group of the table, and the change data feed needs each replaced row whole (its preimage).
From Parquet that means decoding the whole table at every commit: a cost that follows the
table, not the batch (README, "Preimages by position"). An image holds a data file's rows in
the file's order in Arrow's IPC file format, uncompressed: memory-mapped, taking a row costs
what copying it costs, and a compaction reads live rows the same way.

Images are a cache beside the table (`<table>/_replicator/row_images/`, which Delta and VACUUM
leave alone), never the truth:
- named after the data file's path (a Delta data file never changes once written);
- published by a rename, so an image is whole or absent; one that does not match its data
  file's row count, or cannot be opened, is removed and treated as absent;
- written as the replicator writes a file (steady commits, compactions), or from the Parquet
  file the first time its rows are read back (first loads, files Spark wrote);
- removed when their file leaves the table; a crash may leave some behind, which the next
  writer's sweep removes.
Several writers (shards) share the directory: a missing image only means reading Parquet.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from collections.abc import Iterable
from urllib.parse import unquote, urlparse

import numpy as np
import pyarrow as pa

_log = logging.getLogger(__name__)

IMAGES_DIRECTORY = os.path.join("_replicator", "row_images")
"""Where a table's images are, under its root."""

SUFFIX = ".arrow"

SWEEP_AGE_S = 3600.0
"""An image of no live file is swept once this old: a younger one may belong to another
writer's commit that has not landed yet."""


class RowImages:
    """The row images of one table on the local filesystem."""

    def __init__(self, table_root: str) -> None:
        self.table_root = table_root
        self.directory = os.path.join(table_root, IMAGES_DIRECTORY)
        self.hits = 0
        self.misses = 0
        """Files whose rows came from an image, and those read from Parquet (for the bench)."""

    def image_path(self, data_path: str) -> str | None:
        """Where the image of the data file named `data_path` (as the log names it) goes;
        None for a file outside the table's directory (a URI), which gets none."""
        if urlparse(data_path).scheme or data_path.startswith("/"):
            return None
        return os.path.join(self.directory, unquote(data_path) + SUFFIX)

    def read(self, data_path: str, rows: int) -> pa.Table | None:
        """The image of `data_path`, memory-mapped (nothing is copied until rows are taken);
        None when there is none or it does not hold the file's `rows` rows."""
        path = self.image_path(data_path)
        if path is None:
            return None
        try:
            with pa.memory_map(path, "r") as source:
                table = pa.ipc.open_file(source).read_all()
        except FileNotFoundError:
            self.misses += 1
            return None
        except (OSError, pa.ArrowInvalid) as exc:  # not an image we wrote: rebuilt from Parquet
            _log.warning("row image %s is unreadable (%s); it is removed", path, exc)
            self._remove(path)
            self.misses += 1
            return None
        if table.num_rows != rows:
            _log.warning("row image %s holds %d rows, its file %d; it is removed",
                         path, table.num_rows, rows)  # fmt: skip
            self._remove(path)
            self.misses += 1
            return None
        self.hits += 1
        return table

    def writer(self, data_path: str) -> ImageWriter | None:
        """A writer of the image of `data_path` (None where it gets none): rows in the file's
        order, then `publish` once the data file is whole, or `discard`."""
        path = self.image_path(data_path)
        if path is None:
            return None
        return ImageWriter(path)

    def drop(self, data_paths: Iterable[str]) -> None:
        """Remove the images of files that left the table."""
        for data_path in data_paths:
            path = self.image_path(data_path)
            if path is not None:
                self._remove(path)

    def sweep(self, live: Iterable[str], *, older_than_s: float = SWEEP_AGE_S) -> int:
        """Remove images of files not in `live` (as the log names them) last written over
        `older_than_s` ago, and temporary files as old; returns how many were removed."""
        keep = {path for path in map(self.image_path, live) if path is not None}
        cutoff = time.time() - older_than_s
        removed = 0
        for folder, _, names in os.walk(self.directory):
            for name in names:
                path = os.path.join(folder, name)
                if path in keep:
                    continue
                with contextlib.suppress(FileNotFoundError):
                    if os.stat(path).st_mtime < cutoff:
                        os.remove(path)
                        removed += 1
        return removed

    @staticmethod
    def _remove(path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def take_rows(image: pa.Table, positions: np.ndarray) -> pa.Table:
    """The rows of `image` at ascending `positions`, one take per record batch: a take across
    the batches of a chunked table first joins them, copying the whole image."""
    parts = []
    first = 0
    for batch in image.to_batches():
        low, high = np.searchsorted(positions, [first, first + batch.num_rows])
        if high > low:
            parts.append(batch.take(pa.array(positions[low:high] - first)))
        first += batch.num_rows
    return pa.Table.from_batches(parts, schema=image.schema)


class ImageWriter:
    """One image being written: under a temporary name until `publish`. Each write is one
    record batch (a flushed row group, a read part), so takes stay within few batches."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.rows = 0
        self._temporary = f"{path}.{uuid.uuid4()}.tmp"
        self._sink: pa.NativeFile | None = None
        self._writer: pa.ipc.RecordBatchFileWriter | None = None

    def write(self, rows: pa.Table) -> None:
        if self._writer is None:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self._sink = pa.OSFile(self._temporary, "wb")
            self._writer = pa.ipc.new_file(self._sink, rows.schema)
        for batch in rows.combine_chunks().to_batches():
            self._writer.write_batch(batch)
        self.rows += rows.num_rows

    def publish(self) -> None:
        """Give the image its name: readers see it whole from now on (an image of no rows is
        not kept: reading its file is as cheap)."""
        if self._writer is None:
            return
        self._close()
        os.replace(self._temporary, self.path)

    def discard(self) -> None:
        """Leave nothing behind (the data file did not come to be, or not whole)."""
        with contextlib.suppress(Exception):
            self._close()
        with contextlib.suppress(FileNotFoundError):
            os.remove(self._temporary)

    def _close(self) -> None:
        sink, writer, self._sink, self._writer = self._sink, self._writer, None, None
        if sink is None or writer is None:
            return
        try:
            writer.close()
        finally:
            sink.close()
