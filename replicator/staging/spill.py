"""Spill files: the Parquet files a Stager writes when its rows go over the memory budget.

Parquet with CHANGE_SCHEMA, mode 0600, never overwritten; a Stager owns the directory they are
in and removes only files named as it names them.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from collections.abc import Callable, Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from replicator.staging.rows import CHANGE_SCHEMA

_log = logging.getLogger(__name__)

SpillWriter = Callable[[pa.Table, str], int]
"""Writes a table to a new file at a path (owner-only mode) and returns the file's size."""

SPILL_FILE_NAME = re.compile(r"vb\d{4,}-\d{8,}\.parquet")
"""Names the Stager gives its spill files (vb0007-00000001.parquet); nothing else is removed."""

SPILL_FAULT_STEPS = ("before_spill_write", "after_spill_write")
"""Where a spill-file write calls the fault hook: an OSError raised at the first is handled
exactly like a failed write (ENOSPC reads as a full disk); at the second the file exists."""


def write_spill_file(table: pa.Table, path: str) -> int:
    """Write `table` as a new Parquet file at `path`, mode 0600; return its size in bytes.

    Fails if `path` exists: a spill file is never overwritten.
    """
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(descriptor, "wb") as sink:
        # The umask can only narrow 0600; set it anyway so the mode never depends on it.
        os.fchmod(descriptor, 0o600)
        # Read back whole and unfiltered: a dictionary and statistics only cost the write
        # (a 200-row file took 1.2 ms beside a busy Python thread without them, 1.9 with).
        pq.write_table(table, sink, use_dictionary=False, write_statistics=False)
        sink.flush()
        return sink.tell()


def read_spill_file(path: str) -> pa.Table:
    """The rows of one spill file, with CHANGE_SCHEMA."""
    return pq.read_table(path, schema=CHANGE_SCHEMA)


def read_rows(tables: Iterable[pa.Table], spill_files: Iterable[str]) -> pa.Table:
    """Concatenate in-memory tables and spill files into one CHANGE_SCHEMA table."""
    parts = [*tables, *(read_spill_file(path) for path in spill_files)]
    if not parts:
        return CHANGE_SCHEMA.empty_table()
    return pa.concat_tables(parts)


def free_space(directory: str) -> str:
    """The free space of the directory's filesystem for an operator: "12.5 MiB free"."""
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        return "free space unknown"
    return f"{free / 2**20:.1f} MiB free"


def remove_spill_file(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        # A leftover spill file wastes space but loses nothing; the run's directory is temporary.
        _log.warning("could not delete spill file %s: %s", path, exc.strerror)
