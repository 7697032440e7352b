"""How history rows become revisions: committed batches only, rolled-back branches marked."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from replicator.inspect.revisions import assemble_revisions
from replicator.staging.collections import collections_with_history

T0 = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


def row(seqno: int, batch: int, *, part: int = 1, vbucket: int = 3, op: str = "upsert",
        owner: str = "o1") -> dict[str, Any]:
    return {
        "owner_id": owner, "batch_id": batch, "part": part, "vbucket": vbucket, "scope": "app",
        "collection": "orders", "key": "k", "seqno": seqno, "rev_seqno": seqno, "cas": seqno * 10,
        "op": op, "expiry": None, "is_json": True, "doc": f'{{"n":{seqno}}}', "value": None,
        "xattrs": None,
    }  # fmt: skip


def marker(seqno: int, batch: int, *, vbucket: int = 3) -> dict[str, Any]:
    return {"owner_id": "o1", "batch_id": batch, "part": 0, "vbucket": vbucket, "seqno": seqno}


def test_rows_of_commits_that_never_landed_are_left_out() -> None:
    commits = {("o1", 1, 1): (5, T0)}
    revisions = assemble_revisions(
        [row(10, 1), row(11, 2), row(12, 1, part=0), row(13, 1, owner="o2")], [], commits
    )
    assert [(r.seqno, r.table_version) for r in revisions] == [(10, 5)]


def test_a_later_rollback_below_a_revision_marks_it_and_keeps_the_rest() -> None:
    commits = {
        ("o1", 1, 1): (5, T0),
        ("o1", 2, 0): (6, T0),  # rollback of vbucket 3 to seqno 11
        ("o1", 3, 1): (7, T0),
    }
    rows = [row(10, 1), row(11, 1), row(12, 1), row(13, 1, op="delete"), row(12, 3),
            row(12, 1, vbucket=4)]  # fmt: skip
    revisions = assemble_revisions(rows, [marker(11, 2), marker(0, 9)], commits)
    assert [(r.vbucket, r.seqno, r.table_version, r.rolled_back_at) for r in revisions] == [
        (3, 10, 5, None), (3, 11, 5, None), (3, 12, 5, 6), (3, 13, 5, 6), (4, 12, 5, None),
        (3, 12, 7, None),
    ]  # fmt: skip
    deleted = next(r for r in revisions if r.operation == "delete")
    assert deleted.value is None
    assert revisions[0].value == '{"n":10}'


def test_collections_with_history_reads_the_manifest_flag() -> None:
    manifest = {"uid": "3", "scopes": [
        {"name": "_default", "uid": "0", "collections": [
            {"name": "_default", "uid": "0", "history": False}]},
        {"name": "app", "uid": "8", "collections": [
            {"name": "orders", "uid": "9", "history": True}, {"name": "carts", "uid": "a"}]},
    ]}  # fmt: skip
    assert collections_with_history(manifest) == ["app.orders"]
    assert collections_with_history({"uid": "0", "scopes": "nonsense"}) == []
