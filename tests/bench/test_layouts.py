"""The layout comparison behind the README's layout decision runs, and checks its own rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from replicator.bench.layouts.runs import measure_candidate
from replicator.bench.layouts.workload import LAYOUTS

pytestmark = pytest.mark.spark


def test_the_grouped_candidate_merges_compacts_and_rolls_back_with_every_row_accounted(
    spark: Any, tmp_path: Path
) -> None:
    result = measure_candidate(
        spark, LAYOUTS["groups16"], str(tmp_path / "groups16"), docs=1_024, changes=100,
        batches=1, progress=lambda _message: None,
    )  # fmt: skip
    assert result.error is None
    assert [m.metrics["numTargetRowsCopied"] for m in result.merges] == [0]
    # One new file per partition at most: 16 partitions over 1024 vbuckets.
    assert all(m.metrics["numTargetFilesAdded"] <= 16 for m in result.merges)
    assert result.row_checks and all(c.rows == c.expected_rows for c in result.row_checks)
    assert result.generated_checks
    assert all(c.null_groups == c.wrong_groups == 0 for c in result.generated_checks)
    assert result.compactions and all(
        c.after.files <= c.before.files for c in result.compactions
    )
    assert result.rollback is not None and result.rollback.metrics["numTargetRowsCopied"] == 0


def test_layout_predicates_name_partitions_before_vbuckets() -> None:
    assert LAYOUTS["groups16"].prune([341]) == "t.vbucket_group = 5 AND t.vbucket = 341"
    assert LAYOUTS["vbucket"].prune([1, 2]) == "t.vbucket IN (1, 2)"
