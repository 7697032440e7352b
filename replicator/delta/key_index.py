"""Where each live row of the data table is: its document key, file and position in the file.

A steady commit that marks replaced rows in deletion vectors must know which file holds each
document it changes, and at which row; Delta keeps no such index (Hudi's record-level index is
the anchor). This one is built from the files' key columns, read once per file (files never
change; a new deletion vector only hides more of their rows), and kept current from the log:
files no longer live are dropped, new ones read, changed vectors applied.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from replicator.delta.deletion_vectors import read_positions
from replicator.delta.log_snapshot import DataFile, LogSnapshot

KEY_COLUMNS = ("vbucket", "collection_id", "key")
"""A document's identity in the mirror (the MERGE's condition)."""

INDEX_SCHEMA = pa.schema([
    pa.field("vbucket", pa.int32()), pa.field("collection_id", pa.int64()),
    pa.field("key", pa.string()), pa.field("file", pa.int32()), pa.field("position", pa.int64()),
])  # fmt: skip
"""One indexed row (writers differ in the key columns' nullability: one schema for all)."""


class KeyIndex:
    """The live rows of one table by document key, as of the snapshot last refreshed from."""

    def __init__(self, table_root: str) -> None:
        self.table_root = table_root
        self._raw: dict[str, pa.Table] = {}
        """Per file path, every row's key and position, deleted rows included."""
        self._live: dict[tuple[str, str | None], pa.Table] = {}
        """Per live file (path and vector), its rows not deleted, with the file's number."""
        self._numbers: dict[str, int] = {}
        self._paths: list[str] = []
        self._joined: pa.Table | None = None

    def refresh(self, snapshot: LogSnapshot) -> None:
        """Bring the index to `snapshot`: only files or vectors new since the last refresh are
        read."""
        live = dict(snapshot.files)
        for gone in set(self._live) - set(live):
            del self._live[gone]
        for key, data_file in live.items():
            if key not in self._live:
                self._live[key] = self._rows_of(data_file)
        paths = {path for path, _ in self._live}
        for path in set(self._raw) - paths:
            del self._raw[path]
        self._joined = None

    def path(self, number: int) -> str:
        """The log path of the file numbered `number` in `locate`'s answers."""
        return self._paths[number]

    def locate(self, keys: pa.Table) -> pa.Table:
        """`keys` (KEY_COLUMNS and any others) joined with the live rows holding them: the
        same columns plus `file` (see `path`) and `position`; keys in no live row are left
        out."""
        if self._joined is None:
            tables = list(self._live.values())
            self._joined = pa.concat_tables(tables) if tables else INDEX_SCHEMA.empty_table()
        return keys.join(self._joined, list(KEY_COLUMNS), join_type="inner")

    def file_rows(self, number: int) -> int:
        """Rows the file numbered `number` holds, deleted ones included."""
        return int(self._raw[self._paths[number]].num_rows)

    @property
    def rows(self) -> int:
        """Live rows indexed."""
        return sum(table.num_rows for table in self._live.values())

    def _rows_of(self, data_file: DataFile) -> pa.Table:
        raw = self._raw.get(data_file.path)
        if raw is None:
            columns = pq.read_table(
                data_file.local_path(self.table_root), columns=list(KEY_COLUMNS)
            )
            raw = self._raw[data_file.path] = columns
        number = self._numbers.get(data_file.path)
        if number is None:
            number = self._numbers[data_file.path] = len(self._paths)
            self._paths.append(data_file.path)
        rows = _keys_of(raw, number)
        if data_file.deletion_vector is not None:
            vector = read_positions(self.table_root, data_file.deletion_vector)
            deleted = pa.array(list(vector), pa.int64())
            keep = pc.invert(pc.is_in(rows["position"], value_set=deleted))
            rows = rows.filter(keep)
        return rows


def _keys_of(columns: pa.Table, number: int) -> pa.Table:
    rows = columns.append_column(
        "file", pa.array([number] * columns.num_rows, pa.int32())
    ).append_column("position", pa.array(range(columns.num_rows), pa.int64()))
    return rows.cast(INDEX_SCHEMA)


def positions_by_file(located: pa.Table) -> Mapping[int, list[int]]:
    """`locate`'s answer as each file's positions, ascending."""
    grouped = located.group_by("file").aggregate([("position", "list")])
    return {
        number: sorted(positions)
        for number, positions in zip(
            grouped["file"].to_pylist(), grouped["position_list"].to_pylist(), strict=True
        )
    }
