"""`replicator status --plot`: the commit-rate series, the per-vbucket lag, and the PNG."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from replicator.errors import ConfigError
from replicator.inspect.commits import CommitActivity
from replicator.inspect.lag_plot import changes_per_minute, plot_status, vbucket_lag
from replicator.inspect.status import MirrorStatus, VbucketStatus
from replicator.model.positions import VbucketPosition

NOW = datetime(2026, 3, 1, 12, 0, 30, tzinfo=UTC)


def activity(at: datetime, changes: int | None) -> CommitActivity:
    return CommitActivity(
        table_version=1, committed_at=at, operation="MERGE", kind="commit", vbuckets=(0,),
        rows_inserted=0, rows_updated=0, rows_deleted=0, source_changes=changes,
    )  # fmt: skip


def mirror(*, with_source: bool) -> MirrorStatus:
    vbuckets = tuple(
        VbucketStatus(
            vb, VbucketPosition.at_boundary(vb, 5, 10),
            committed_at=NOW - timedelta(minutes=vb), source_high_seqno=10 + vb,
        )
        for vb in range(4)
    )
    return MirrorStatus("/lake/m", "b", 7, NOW, vbuckets, with_source=with_source)


def test_changes_per_minute_sums_each_minute_and_shows_quiet_minutes_as_zero() -> None:
    start = datetime(2026, 3, 1, 11, 0, 10, tzinfo=UTC)
    series = changes_per_minute([
        activity(start, 5), activity(start + timedelta(seconds=20), 7),
        activity(start + timedelta(minutes=3), 2), activity(start, None),  # not the replicator's
    ])  # fmt: skip
    assert [(m.minute, n) for m, n in series] == [(0, 12), (1, 0), (2, 0), (3, 2)]
    assert changes_per_minute([]) == []


def test_lag_is_seqnos_with_a_source_and_minutes_since_the_last_commit_without() -> None:
    assert vbucket_lag(mirror(with_source=True)) == (
        [0, 1, 2, 3], [0.0, 1.0, 2.0, 3.0], "seqnos behind the source"
    )
    vbuckets, minutes, meaning = vbucket_lag(mirror(with_source=False))
    assert (vbuckets, meaning) == ([0, 1, 2, 3], "minutes since the last commit")
    assert minutes == pytest.approx([0.0, 1.0, 2.0, 3.0])


def test_the_plot_is_a_png_file(tmp_path: Path) -> None:
    start = datetime(2026, 3, 1, 11, 0, tzinfo=UTC)
    written = plot_status(
        mirror(with_source=True), [activity(start + timedelta(minutes=i), i) for i in range(5)],
        tmp_path / "lag.png",
    )  # fmt: skip
    assert written.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ConfigError, match="is not a directory"):
        plot_status(mirror(with_source=False), [], tmp_path / "missing" / "lag.png")
