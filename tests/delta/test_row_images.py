"""Row images: a data file's rows again, taken by position; whole or absent, never wrong."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from replicator.delta.dv_merge import rows_at
from replicator.delta.row_images import RowImages, take_rows
from replicator.delta.schema import DATA_COLUMNS
from tests.delta.helpers import change_table, upsert

DATA_PATH = "vbucket_group=3/part-00000-a%20b.c000.snappy.parquet"


def _rows(count: int) -> pa.Table:
    return change_table([upsert(3, f"k{i}", i + 1) for i in range(count)]).select(
        list(DATA_COLUMNS)
    )


def _image(images: RowImages, rows: pa.Table, batch_rows: int) -> None:
    writer = images.writer(DATA_PATH)
    assert writer is not None
    for start in range(0, rows.num_rows, batch_rows):
        writer.write(rows.slice(start, batch_rows))
    writer.publish()


def test_rows_are_taken_by_position_across_the_images_batches(tmp_path: Path) -> None:
    images = RowImages(str(tmp_path))
    rows = _rows(50)
    _image(images, rows, 7)  # eight record batches

    image = images.read(DATA_PATH, 50)

    assert image is not None
    positions = np.array([0, 6, 7, 8, 20, 41, 49])
    assert take_rows(image, positions).equals(rows.take(positions))
    assert take_rows(image, np.array([], np.int64)).num_rows == 0
    assert images.image_path(DATA_PATH) == str(
        tmp_path / "_replicator" / "row_images" / "vbucket_group=3"
        / "part-00000-a b.c000.snappy.parquet.arrow"
    )  # fmt: skip


def test_an_image_is_absent_until_published_and_after_a_discard(tmp_path: Path) -> None:
    images = RowImages(str(tmp_path))
    writer = images.writer(DATA_PATH)
    assert writer is not None
    writer.write(_rows(5))

    assert images.read(DATA_PATH, 5) is None
    writer.discard()
    assert images.read(DATA_PATH, 5) is None
    assert not [name for _, _, names in os.walk(images.directory) for name in names]


def test_an_image_that_does_not_match_its_file_is_removed(tmp_path: Path) -> None:
    images = RowImages(str(tmp_path))
    _image(images, _rows(5), 5)
    path = images.image_path(DATA_PATH)
    assert path is not None

    assert images.read(DATA_PATH, 6) is None
    assert not os.path.exists(path)

    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as torn:
        torn.write(b"ARROW1\0\0 not whole")
    assert images.read(DATA_PATH, 5) is None
    assert not os.path.exists(path)


def test_files_outside_the_table_get_no_image(tmp_path: Path) -> None:
    images = RowImages(str(tmp_path))

    assert images.writer("s3://bucket/table/part-0.parquet") is None
    assert images.read("/elsewhere/part-0.parquet", 1) is None


def test_a_sweep_removes_old_images_of_no_live_file_only(tmp_path: Path) -> None:
    images = RowImages(str(tmp_path))
    _image(images, _rows(3), 3)
    other = "vbucket_group=4/part-00000-gone.c000.snappy.parquet"
    young = "vbucket_group=4/part-00000-young.c000.snappy.parquet"
    for name in (other, young):
        writer = images.writer(name)
        assert writer is not None
        writer.write(_rows(2))
        writer.publish()
    hour_ago = time.time() - 7200
    for name in (DATA_PATH, other):
        path = images.image_path(name)
        assert path is not None
        os.utime(path, (hour_ago, hour_ago))

    removed = images.sweep([DATA_PATH])

    assert removed == 1
    assert images.read(DATA_PATH, 3) is not None
    assert images.read(young, 2) is not None  # another writer's commit may not have landed yet
    assert images.read(other, 2) is None


def test_reading_a_file_back_writes_its_whole_image(tmp_path: Path) -> None:
    rows = _rows(40)
    path = str(tmp_path / "f.parquet")
    pq.write_table(rows, path, row_group_size=10)
    images = RowImages(str(tmp_path))
    writer = images.writer(DATA_PATH)
    assert writer is not None

    positions = np.array([3, 4, 35])
    taken = rows_at(path, positions, image=writer)
    writer.publish()

    assert taken.equals(rows.take(positions))
    image = images.read(DATA_PATH, 40)
    assert image is not None
    assert image.equals(rows)  # every row group, not only those holding a position


@pytest.mark.parametrize("batch_rows", [1, 4, 40])
def test_take_rows_keeps_the_order_of_positions(tmp_path: Path, batch_rows: int) -> None:
    images = RowImages(str(tmp_path))
    rows = _rows(40)
    _image(images, rows, batch_rows)
    image = images.read(DATA_PATH, 40)
    assert image is not None

    positions = np.arange(0, 40, 3)
    assert take_rows(image, positions)["key"].to_pylist() == rows.take(positions)["key"].to_pylist()
