"""Data files read back by the writers (preimages, compaction), a few row groups a call.

Each read is a call into Arrow that gives up the GIL, and taking it back behind a thread that
runs Python (on two cores, the replication thread) waits for that thread's switch interval: the
wait, not the decoding, was most of a read (README, "The GIL, handed over in small calls").
Consecutive row groups are therefore read together, up to about `batch_bytes` decoded a call;
a row group larger than that is read in batches of about that size.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

READ_BATCH_BYTES = 256 * 1024 * 1024
"""Rows decoded at a time when the writers read data files back (preimages, compaction), by
their size in the file's footer: eight row groups the writers wrote (ROW_GROUP_BYTES) in one
call, a larger group in parts of about this size. A quarter of it read 100,000 preimages from
a 3.1-million-row table in 3.4 to 4.2 s beside a busy Python thread, this in 2.5 to 2.8 s
(README, "Fewer, larger calls on both hot threads")."""

READ_BATCH_MAX_ROWS = 262_144
"""At most this many rows a read: a dictionary-encoded column's size in the footer says little
of its size decoded."""


@dataclass(frozen=True, slots=True)
class FilePart:
    """Consecutive rows of a Parquet file, read in one call: `rows` starts at the file's row
    `first_row`."""

    first_row: int
    rows: pa.Table

    @property
    def end_row(self) -> int:
        return self.first_row + int(self.rows.num_rows)


def group_starts(parquet: pq.ParquetFile) -> np.ndarray:
    """The file row each row group starts at, and the file's row count last."""
    metadata = parquet.metadata
    counts = [metadata.row_group(group).num_rows for group in range(metadata.num_row_groups)]
    return np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])


def read_parts(
    parquet: pq.ParquetFile,
    columns: Sequence[str],
    batch_bytes: int = READ_BATCH_BYTES,
    groups: Iterable[int] | None = None,
) -> Iterator[FilePart]:
    """The `columns` of row groups `groups` (ascending, every group by default), in order.

    Consecutive groups come together while they hold at most `batch_bytes` (by the footer) and
    `READ_BATCH_MAX_ROWS` rows; a group holding more comes in batches of about that much.
    """
    metadata = parquet.metadata
    starts = group_starts(parquet)
    wanted = range(metadata.num_row_groups) if groups is None else groups
    run: list[int] = []
    run_bytes = run_rows = 0
    for group in wanted:
        info = metadata.row_group(group)
        if run and (
            group != run[-1] + 1
            or run_bytes + info.total_byte_size > batch_bytes
            or run_rows + info.num_rows > READ_BATCH_MAX_ROWS
        ):
            yield FilePart(int(starts[run[0]]), parquet.read_row_groups(run, columns=columns))
            run, run_bytes, run_rows = [], 0, 0
        if info.total_byte_size > batch_bytes or info.num_rows > READ_BATCH_MAX_ROWS:
            first = int(starts[group])
            for batch in row_group_batches(parquet, group, columns, batch_bytes):
                yield FilePart(first, pa.Table.from_batches([batch]))
                first += batch.num_rows
            continue
        run.append(group)
        run_bytes += info.total_byte_size
        run_rows += info.num_rows
    if run:
        yield FilePart(int(starts[run[0]]), parquet.read_row_groups(run, columns=columns))


def row_group_batches(
    parquet: pq.ParquetFile, group: int, columns: Sequence[str], batch_bytes: int
) -> Iterator[pa.RecordBatch]:
    """The `columns` of row group `group`, about `batch_bytes` of decoded rows a batch (by the
    footer) and at most `READ_BATCH_MAX_ROWS`."""
    metadata = parquet.metadata.row_group(group)
    rows = batch_bytes * metadata.num_rows // max(metadata.total_byte_size, 1)
    rows = min(max(1, rows), READ_BATCH_MAX_ROWS)
    batches: Iterator[pa.RecordBatch] = parquet.iter_batches(
        rows, row_groups=[group], columns=list(columns)
    )
    return batches
