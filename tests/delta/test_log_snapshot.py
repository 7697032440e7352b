"""Reading a table's log without Spark: brought up to date by name, gaps still found."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from replicator.delta.log_snapshot import LogSnapshotError, read_snapshot


def _commit(table: Path, version: int, *actions: dict[str, Any]) -> None:
    log = table / "_delta_log"
    log.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(action) for action in actions]
    (log / f"{version:020d}.json").write_text("\n".join(lines) + "\n")


def _add(path: str) -> dict[str, Any]:
    return {"add": {"path": path, "partitionValues": {}, "size": 10, "modificationTime": 1,
                    "dataChange": True}}  # fmt: skip


def _remove(path: str) -> dict[str, Any]:
    return {"remove": {"path": path, "deletionTimestamp": 2, "dataChange": True}}


def test_an_up_to_date_read_finds_the_later_commits_by_name_without_listing_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _commit(tmp_path, 0, {"txn": {"appId": "a", "version": 1}}, _add("f0"), _add("f1"))
    before = read_snapshot(str(tmp_path))
    _commit(tmp_path, 1, _remove("f0"), _add("f2"))
    _commit(tmp_path, 2, {"txn": {"appId": "a", "version": 2}}, _add("f3"))
    (tmp_path / "_delta_log" / "_last_checkpoint").write_text('{"version": 0, "size": 2}')
    listed: list[str] = []
    real_listdir = os.listdir

    def listdir(path: str) -> list[str]:
        listed.append(path)
        return real_listdir(path)

    monkeypatch.setattr(os, "listdir", listdir)

    after = read_snapshot(str(tmp_path), since=before)

    assert listed == []
    assert after.version == 2 and after.txn_versions == {"a": 2}
    assert {f.path for f in after.files.values()} == {"f1", "f2", "f3"}
    monkeypatch.undo()
    assert after == read_snapshot(str(tmp_path))  # as a read from the start finds it
    assert read_snapshot(str(tmp_path), since=after) == after  # nothing new: unchanged


@pytest.mark.parametrize("pointer", [True, False], ids=["last_checkpoint", "checkpoint_names"])
def test_commits_removed_after_an_up_to_date_read_are_a_gap_not_the_newest_version(
    tmp_path: Path, pointer: bool
) -> None:
    for version in range(4):
        _commit(tmp_path, version, _add(f"f{version}"))
    stale = read_snapshot(str(tmp_path))
    for version in range(4, 13):
        _commit(tmp_path, version, _add(f"f{version}"))
    log = tmp_path / "_delta_log"
    (log / f"{10:020d}.checkpoint.parquet").write_bytes(b"")  # only its name is read here
    if pointer:
        (log / "_last_checkpoint").write_text('{"version": 10, "size": 11}')
    for version in range(4, 10):  # log retention: commits older than the checkpoint go
        (log / f"{version:020d}.json").unlink()

    with pytest.raises(LogSnapshotError, match="commit 4 is missing before 10"):
        read_snapshot(str(tmp_path), since=stale)
