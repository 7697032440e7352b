"""The progress display in both renderings."""

from __future__ import annotations

import io

from replicator.pipeline.progress import ProgressReporter, ProgressSnapshot
from tests.clocks import ManualClock


def snapshot(done: int, target: int = 1000) -> ProgressSnapshot:
    return ProgressSnapshot(
        items_committed=done, seqnos_committed=done, seqnos_target=target, commits=3,
        rollbacks=1, vbuckets_caught_up=2, vbuckets_total=4, lag_seqnos=target - done,
    )


def test_lines_mode_throttles_and_reports_rate_and_lag() -> None:
    out, clock = io.StringIO(), ManualClock()
    reporter = ProgressReporter("lines", stream=out, interval_s=10, clock=clock)
    clock.now = 10
    reporter.update(snapshot(500))
    clock.now = 15
    reporter.update(snapshot(600))  # within the interval: nothing printed
    clock.now = 20
    reporter.update(snapshot(1000))
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert "items=500" in lines[0] and "rate=50/s" in lines[0] and "lag_seqnos=500" in lines[0]
    assert "items=1000" in lines[1] and "rate=50/s" in lines[1]


def test_due_says_when_an_update_would_show_so_snapshots_are_built_only_then() -> None:
    out, clock = io.StringIO(), ManualClock()
    reporter = ProgressReporter("lines", stream=out, interval_s=10, clock=clock)
    clock.now = 10
    assert reporter.due()
    reporter.update(snapshot(500))
    clock.now = 15
    assert not reporter.due()
    clock.now = 20
    assert reporter.due()
    assert not ProgressReporter("off", stream=out, clock=clock).due()


def test_bar_shows_fraction_and_eta() -> None:
    out, clock = io.StringIO(), ManualClock()
    reporter = ProgressReporter("bar", stream=out, clock=clock)
    clock.now = 10
    reporter.update(snapshot(250))
    text = out.getvalue()
    assert text.startswith("\r[")
    assert "25.0%" in text
    assert "ETA 0m30s" in text
    reporter.finish(snapshot(1000))
    assert out.getvalue().endswith("\n")
    assert "100.0%" in out.getvalue()


def test_auto_picks_lines_when_not_a_terminal() -> None:
    assert ProgressReporter("auto", stream=io.StringIO()).mode == "lines"
