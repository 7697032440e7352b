"""Data files read back a few row groups a call: every row once, in order, in as few calls as
the byte and row limits allow."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from replicator.delta.file_reads import (
    READ_BATCH_MAX_ROWS,
    group_starts,
    read_parts,
    row_group_batches,
)
from replicator.delta.schema import DATA_COLUMNS
from tests.delta.helpers import change_table, upsert


def _file(tmp_path: Path, count: int, group_rows: int) -> tuple[pa.Table, pq.ParquetFile]:
    rows = change_table([upsert(3, f"k{i}", i + 1) for i in range(count)])
    rows = rows.select(list(DATA_COLUMNS))
    path = str(tmp_path / "f.parquet")
    pq.write_table(rows, path, row_group_size=group_rows)
    return rows, pq.ParquetFile(path)


def _group_bytes(parquet: pq.ParquetFile) -> int:
    return max(
        int(parquet.metadata.row_group(group).total_byte_size)
        for group in range(parquet.metadata.num_row_groups)
    )


def test_consecutive_row_groups_within_the_bytes_come_in_one_call(tmp_path: Path) -> None:
    rows, parquet = _file(tmp_path, 50, 10)  # five row groups
    two_groups = 2 * _group_bytes(parquet)

    parts = list(read_parts(parquet, DATA_COLUMNS, two_groups))

    assert [(part.first_row, part.rows.num_rows) for part in parts] == [(0, 20), (20, 20), (40, 10)]
    assert pa.concat_tables(part.rows for part in parts).equals(rows)
    whole = list(read_parts(parquet, DATA_COLUMNS, 10**9))
    assert [(part.first_row, part.rows.num_rows) for part in whole] == [(0, 50)]


def test_a_group_left_out_splits_the_call_and_its_rows_are_not_read(tmp_path: Path) -> None:
    rows, parquet = _file(tmp_path, 50, 10)

    parts = list(read_parts(parquet, DATA_COLUMNS, 10**9, [0, 1, 3, 4]))

    assert [(part.first_row, part.end_row) for part in parts] == [(0, 20), (30, 50)]
    assert parts[1].rows.equals(rows.slice(30, 20))


def test_a_group_larger_than_the_bytes_comes_in_batches_of_about_them(tmp_path: Path) -> None:
    rows, parquet = _file(tmp_path, 60, 20)
    quarter = -(-parquet.metadata.row_group(1).total_byte_size // 4)  # rounded up

    parts = list(read_parts(parquet, DATA_COLUMNS, quarter, [0, 1]))

    assert [(part.first_row, part.rows.num_rows) for part in parts] == [
        (0, 5), (5, 5), (10, 5), (15, 5), (20, 5), (25, 5), (30, 5), (35, 5)
    ]
    assert pa.concat_tables(part.rows for part in parts).equals(rows.slice(0, 40))


@pytest.mark.parametrize("group_rows", [10, 25])
def test_group_starts_end_with_the_files_rows(tmp_path: Path, group_rows: int) -> None:
    _, parquet = _file(tmp_path, 50, group_rows)

    assert group_starts(parquet).tolist() == [*range(0, 50, group_rows), 50]


def test_row_group_batches_hold_about_the_bytes_asked_for(tmp_path: Path) -> None:
    rows, parquet = _file(tmp_path, 40, 20)
    group_bytes = parquet.metadata.row_group(1).total_byte_size

    def sizes(batch_bytes: int) -> list[int]:
        batches = row_group_batches(parquet, 1, DATA_COLUMNS, batch_bytes)
        return [batch.num_rows for batch in batches]

    assert sizes(group_bytes) == [20]  # a row group the writers wrote: one call
    assert sizes(-(-group_bytes // 4)) == [5, 5, 5, 5]  # a quarter of its size (rounded up)
    assert sizes(1) == [1] * 20  # never an empty batch
    second = pa.Table.from_batches(list(row_group_batches(parquet, 1, DATA_COLUMNS, 1)))
    assert second.equals(rows.slice(20, 20))


def test_reads_hold_at_most_the_row_cap(tmp_path: Path) -> None:
    # One document repeated: dictionary-encoded, its size in the footer is far below its
    # size decoded, so the footer alone would read whole groups at once.
    count = READ_BATCH_MAX_ROWS + 10
    same = change_table([upsert(3, "k", 1)]).select(list(DATA_COLUMNS))
    rows = same.take(pa.array([0] * count))
    path = str(tmp_path / "f.parquet")
    pq.write_table(rows, path, row_group_size=count)
    parquet = pq.ParquetFile(path)
    budget = 64 * 1024 * 1024

    batches = list(row_group_batches(parquet, 0, DATA_COLUMNS, budget))
    parts = list(read_parts(parquet, DATA_COLUMNS, budget))

    assert [batch.num_rows for batch in batches] == [READ_BATCH_MAX_ROWS, 10]
    assert [part.rows.num_rows for part in parts] == [READ_BATCH_MAX_ROWS, 10]
    small = str(tmp_path / "small.parquet")
    first = count // 2 + 5
    pq.write_table(rows, small, row_group_size=first)  # two groups, together over the cap
    assert [part.rows.num_rows for part in read_parts(pq.ParquetFile(small), DATA_COLUMNS)] == [
        first, count - first
    ]
