"""The difference a rollback or resync writes, found on row identities (no Spark)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from replicator.planning.replacement import replacement_keys


def rows(*identities: tuple[int, str, int, int], payload: bool = False) -> pa.Table:
    """One vbucket's rows: (collection_id, key, seqno, cas) each."""
    columns = {
        "collection_id": pa.array([i[0] for i in identities], pa.int64()),
        "key": pa.array([i[1] for i in identities], pa.string()),
        "seqno": pa.array([i[2] for i in identities], pa.int64()),
        "cas": pa.array([i[3] for i in identities], pa.int64()),
    }
    if payload:
        columns["doc"] = pa.array(['{"x": 1}'] * len(identities), pa.string())
    return pa.table(columns)


def restored(keys: pa.Table) -> set[tuple[int, str, int]]:
    return set(zip(*(keys.column(n).to_pylist() for n in keys.column_names), strict=True))


def test_only_the_difference_is_restored_and_deleted() -> None:
    current = rows((0, "same", 3, 30), (0, "newer", 9, 90), (0, "gone", 8, 80), (8, "same", 4, 40))
    wanted = rows((0, "same", 3, 30), (0, "newer", 5, 50), (0, "back", 2, 20), (8, "same", 4, 40))

    keys = replacement_keys(current, wanted)

    assert restored(keys.restore) == {(0, "newer", 5), (0, "back", 2)}
    assert keys.restore.column_names == ["collection_id", "key", "seqno"]
    assert restored(keys.delete) == {(0, "gone")}
    assert keys.delete.column_names == ["collection_id", "key"]


def test_a_key_in_another_collection_is_another_document() -> None:
    current = rows((0, "k", 3, 30))
    wanted = rows((8, "k", 3, 30))

    keys = replacement_keys(current, wanted)

    assert restored(keys.restore) == {(8, "k", 3)}
    assert restored(keys.delete) == {(0, "k")}


def test_the_same_seqno_on_another_branch_is_restored() -> None:
    # After a failover the new branch reuses seqnos: only the cas tells the changes apart.
    keys = replacement_keys(rows((0, "k", 7, 700)), rows((0, "k", 7, 701)))

    assert restored(keys.restore) == {(0, "k", 7)}
    assert keys.delete.num_rows == 0


def test_equal_sides_need_nothing() -> None:
    same = rows((0, "a", 1, 10), (0, "b", 2, 20))

    keys = replacement_keys(same, rows((0, "b", 2, 20), (0, "a", 1, 10), payload=True))

    assert keys.is_empty


def test_an_empty_side_restores_or_deletes_everything() -> None:
    some = rows((0, "a", 1, 10), (0, "b", 2, 20))

    assert restored(replacement_keys(rows(), some).restore) == {(0, "a", 1), (0, "b", 2)}
    assert restored(replacement_keys(some, rows()).delete) == {(0, "a"), (0, "b")}


def test_a_side_without_identities_is_refused() -> None:
    with pytest.raises(ValueError, match=r"wanted rows lack the columns \['cas'\]"):
        replacement_keys(rows(), rows().drop_columns(["cas"]))
