"""Where each live row of the data table is: its document key, file and position in the file.

A steady commit that marks replaced rows in deletion vectors must know which file holds each
document it changes, and at which row; Delta keeps no such index (Hudi's record-level index is
the anchor). This one is built from the files' key columns, read once per file (files never
change; a new deletion vector only hides more of their rows), and kept current from the log:
files no longer live are dropped, new ones read, changed vectors applied.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyroaring import BitMap64

from replicator.delta.deletion_vectors import position_array, read_positions
from replicator.delta.log_snapshot import DataFile, LogSnapshot

KEY_COLUMNS = ("vbucket", "collection_id", "key")
"""A document's identity in the mirror (the MERGE's condition)."""

INDEX_SCHEMA = pa.schema([
    pa.field("vbucket", pa.int32()), pa.field("collection_id", pa.int64()),
    pa.field("key", pa.string()), pa.field("file", pa.int32()), pa.field("position", pa.int64()),
])  # fmt: skip
"""One indexed row (writers differ in the key columns' nullability: one schema for all)."""


class KeyIndex:
    """The live rows of one table by document key, as of the snapshot last refreshed from.

    Files are numbered once, in the order first seen; `locate` answers with those numbers.
    """

    def __init__(self, table_root: str) -> None:
        self.table_root = table_root
        self._raw: dict[str, pa.Table] = {}
        """Per file path, every row's key, file number and position, deleted rows included."""
        self._live: dict[tuple[str, str | None], pa.Table] = {}
        """Per live file (path and vector), its rows not deleted."""
        self._numbers: dict[str, int] = {}
        self._next_number = 0
        """Numbers are never reused: a file gone since may still be named in an old answer."""
        self._files: dict[int, DataFile] = {}
        """Per live file's number, its add action as of the last refresh."""
        self._deleted: dict[int, BitMap64] = {}
        """Per live file's number, the positions its vector hides (read once per vector)."""
        self._joined: pa.Table | None = None

    def refresh(self, snapshot: LogSnapshot) -> list[str]:
        """Bring the index to `snapshot`: only files or vectors new since the last refresh are
        read. Returns the paths of the files that left the table since (as the log names
        them)."""
        live = dict(snapshot.files)
        for replaced in set(self._live) - set(live):
            del self._live[replaced]
        for key, data_file in live.items():
            if key not in self._live:
                self._live[key] = self._rows_of(data_file)
        paths = {path for path, _ in self._live}
        gone = sorted(set(self._raw) - paths)
        for path in gone:
            del self._raw[path]
            number = self._numbers.pop(path)
            del self._files[number], self._deleted[number]
        self._joined = None
        return gone

    def data_file(self, number: int) -> DataFile:
        """The live file numbered `number` in `locate`'s answers, with its current vector."""
        return self._files[number]

    def deleted(self, number: int) -> BitMap64:
        """The positions the current vector of file `number` hides (empty without one)."""
        return self._deleted[number]

    def locate(self, keys: pa.Table) -> pa.Table:
        """`keys` (KEY_COLUMNS and any others) joined with the live rows holding them: the
        same columns plus `file` (see `data_file`) and `position`; keys in no live row are
        left out."""
        # Acero hashes the right side: the batch, not the whole index (0.016 s against
        # 0.11 s for 40,000 keys in 1,000,000 rows).
        return self.live_rows().join(keys, list(KEY_COLUMNS), join_type="inner")

    def live_rows(self) -> pa.Table:
        """Every live row (INDEX_SCHEMA)."""
        if self._joined is None:
            tables = list(self._live.values())
            self._joined = pa.concat_tables(tables) if tables else INDEX_SCHEMA.empty_table()
        return self._joined

    def file_rows(self, number: int) -> int:
        """Rows the file numbered `number` holds, deleted ones included."""
        return int(self._raw[self._files[number].path].num_rows)

    @property
    def rows(self) -> int:
        """Live rows indexed."""
        return sum(table.num_rows for table in self._live.values())

    def _rows_of(self, data_file: DataFile) -> pa.Table:
        number = self._numbers.get(data_file.path)
        if number is None:
            number = self._numbers[data_file.path] = self._next_number
            self._next_number += 1
        rows = self._raw.get(data_file.path)
        if rows is None:
            columns = pq.read_table(
                data_file.local_path(self.table_root), columns=list(KEY_COLUMNS)
            )
            rows = self._raw[data_file.path] = _keys_of(columns, number)
        self._files[number] = data_file
        if data_file.deletion_vector is None:
            self._deleted[number] = BitMap64()
            return rows
        deleted = self._deleted[number] = read_positions(
            self.table_root, data_file.deletion_vector
        )
        hidden = pa.array(position_array(deleted))
        return rows.filter(pc.invert(pc.is_in(rows["position"], value_set=hidden)))


def _keys_of(columns: pa.Table, number: int) -> pa.Table:
    rows = columns.append_column(
        "file", pa.array(np.full(columns.num_rows, number, np.int32))
    ).append_column("position", pa.array(np.arange(columns.num_rows, dtype=np.int64)))
    return rows.cast(INDEX_SCHEMA)
