"""Which rows a rollback or a full resync rewrites: the difference between two row sets (pure).

A rollback makes one vbucket's rows those of an older table version; a full resync makes them
a complete stream from 0. Either way most rows are usually the same on both sides, and only the
difference is written. It is found here on the rows' identities alone (collection id, key,
seqno, cas: tens of bytes a row), in Arrow, so the Delta side reads document bodies only for the
rows it restores: Spark's own join of the two sides cost a rollback about 2 s more, most of it
in the shuffles of a join on one vbucket's rows (README, Performance).

>>> import pyarrow as pa
>>> def rows(keys, seqnos):
...     cas = [s * 10 for s in seqnos]
...     return pa.table({"collection_id": [0, 0], "key": keys, "seqno": seqnos, "cas": cas})
>>> current, wanted = rows(["a", "b"], [7, 4]), rows(["a", "c"], [5, 3])
>>> keys = replacement_keys(current, wanted)
>>> sorted(keys.restore.column("key").to_pylist()), sorted(keys.delete.column("key").to_pylist())
(['a', 'c'], ['b'])
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

DOCUMENT = ("collection_id", "key")
"""What names one document within a vbucket."""

IDENTITY = (*DOCUMENT, "seqno", "cas")
"""The columns `replacement_keys` reads of each side: a document and which change of it."""

RESTORE_KEY = (*DOCUMENT, "seqno")
"""The columns of `ReplacementKeys.restore`: a wanted row, by its document and change."""


@dataclass(frozen=True, slots=True)
class ReplacementKeys:
    """The difference that turns one vbucket's current rows into the wanted ones.

    `restore` names the wanted rows to write (RESTORE_KEY columns): documents the current rows
    lack, or hold at another change (seqno or cas differs). `delete` names the current
    documents (DOCUMENT columns) the wanted rows lack.
    """

    restore: pa.Table
    delete: pa.Table

    @property
    def is_empty(self) -> bool:
        return not (self.restore.num_rows or self.delete.num_rows)


def replacement_keys(current: pa.Table, wanted: pa.Table) -> ReplacementKeys:
    """The rows to restore and the documents to delete so `current` becomes `wanted`.

    Both sides hold one vbucket's rows with at least the IDENTITY columns, one row per
    document. A seqno names one change of a vbucket's history, and the cas tells two branches'
    changes of the same seqno apart.
    """
    for side, table in (("current", current), ("wanted", wanted)):
        missing = [name for name in IDENTITY if name not in table.column_names]
        if missing:
            raise ValueError(f"the {side} rows lack the columns {missing}")
    stored = current.select(list(IDENTITY)).rename_columns([*DOCUMENT, "_seqno", "_cas"])
    joined = wanted.select(list(IDENTITY)).join(stored, list(DOCUMENT), join_type="left outer")
    absent = pc.is_null(joined.column("_seqno"))
    differs = pc.or_(
        pc.not_equal(joined.column("_seqno"), joined.column("seqno")),
        pc.not_equal(joined.column("_cas"), joined.column("cas")),
    )
    restore = joined.filter(pc.or_(absent, pc.fill_null(differs, False)))
    present = wanted.select(list(DOCUMENT)).append_column(
        "_present", pa.repeat(pa.scalar(True), wanted.num_rows)
    )
    gone = current.select(list(DOCUMENT)).join(present, list(DOCUMENT), join_type="left outer")
    delete = gone.filter(pc.is_null(gone.column("_present")))
    return ReplacementKeys(
        restore=restore.select(list(RESTORE_KEY)).combine_chunks(),
        delete=delete.select(list(DOCUMENT)).combine_chunks(),
    )
