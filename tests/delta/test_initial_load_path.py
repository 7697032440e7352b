"""The first-load path: rows of one unique-key snapshot, spilled or not, load without a
deduplication pass."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from replicator.delta.executor import CommitExecutor
from replicator.delta.ownership import OwnersTable
from replicator.delta.schema import MirrorConfig
from replicator.delta.table import open_or_create
from tests.delta.helpers import batch, change_table, documents, upsert, vbucket_commit

pytestmark = pytest.mark.spark


@pytest.fixture
def executor(spark: Any, tmp_path: Path) -> Iterator[CommitExecutor]:
    # 64 vbuckets: partitions of 4 consecutive vbuckets.
    mirror = open_or_create(spark, str(tmp_path / "m"), MirrorConfig("travel", num_vbuckets=64))
    owners = OwnersTable.of(mirror)
    claim = owners.claim(range(64), "loader")
    yield CommitExecutor(mirror, claim, owners)
    owners.release(claim)


def first_load(vbucket: int, rows: int, **kw: Any) -> Any:
    changes = [upsert(vbucket, f"k{i}", i + 1) for i in range(rows)]
    return dataclasses.replace(
        vbucket_commit(vbucket, changes, seqno=rows, first_load=True, **kw), unique_keys=True
    )


def test_unique_key_rows_spilled_or_not_load_whole(
    executor: CommitExecutor, tmp_path: Path
) -> None:
    spill = tmp_path / "vb0009-00000001.parquet"
    pq.write_table(change_table([upsert(9, f"s{i}", i + 1) for i in range(30)]), spill)
    spilled = dataclasses.replace(
        vbucket_commit(9, [upsert(9, "m", 31)], seqno=31, first_load=True,
                       spill_files=[str(spill)]),
        unique_keys=True,
    )  # fmt: skip
    executor.execute(batch(1, first_load(2, 40), spilled))
    assert len(documents(executor.mirror, [2])) == 40
    assert {row[1] for row in documents(executor.mirror, [9])} == {
        *(f"s{i}" for i in range(30)), "m"
    }


def plan_of(frame: Any) -> str:
    return str(frame._jdf.queryExecution().optimizedPlan())


def test_only_rows_whose_keys_may_repeat_go_through_the_window(
    executor: CommitExecutor, tmp_path: Path
) -> None:
    spill = tmp_path / "vb0003-00000001.parquet"
    pq.write_table(change_table([upsert(3, "a", 1), upsert(3, "a", 2)]), spill)
    spilled = vbucket_commit(3, [], seqno=2, first_load=True, spill_files=[str(spill)])
    assert "Window" in plan_of(executor.change_rows([spilled]))
    assert [r["seqno"] for r in executor.change_rows([spilled]).collect()] == [2]
    unique = dataclasses.replace(spilled, unique_keys=True)
    assert "Window" not in plan_of(executor.change_rows([unique]))
